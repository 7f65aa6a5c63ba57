"""The package as installed or built: type stubs, names, and the tool beside it."""

from __future__ import annotations

import ast
import os
import pathlib

import shardflow as sf
from shardflow import llama


def stub(name: str) -> ast.Module:
    path = pathlib.Path(sf.__file__).with_name(name)
    assert path.exists(), f"{name} missing beside {sf.__file__}"
    return ast.parse(path.read_text())


def names_in(module: ast.Module) -> set[str]:
    return {node.name for node in ast.walk(module) if isinstance(node, (ast.ClassDef, ast.FunctionDef))}


def test_type_stubs_ship_and_describe_the_api():
    core = names_in(stub("_core.pyi"))
    assert {"Mesh", "PartitionSpec", "Sharding", "HloSharding", "ShardLayout", "Graph", "Program", "Runtime",
            "Tensor", "compile", "mark_sharding", "partition", "run", "from_dlpack", "from_spec", "v1"} <= core
    assert {"Config", "Model", "ShardingPlan", "generate", "load_llama2c", "load_hf"} <= names_in(stub("llama.pyi"))
    assert pathlib.Path(sf.__file__).with_name("py.typed").exists()


def test_public_names_are_exported():
    for name in ["Mesh", "PartitionSpec", "Sharding", "Tensor", "compile", "mark_sharding", "Error",
                 "InvalidShardingError", "float32", "bfloat16", "tensor"]:
        assert name in sf.__all__, name
    assert llama.generate is sf._core.llama.generate
    assert issubclass(sf.Error, RuntimeError)
    assert issubclass(sf.InvalidShardingError, (ValueError)) and issubclass(sf.InvalidShardingError, sf.Error)


def test_narrow_matrix_kernels_are_named_once_at_import():
    """ONEDNN_MAX_CPU_ISA limiting oneDNN to SSE on a CPU with AVX2 or wider:
    one RuntimeWarning at import that says what to unset; unlimited, none."""
    import subprocess
    import sys

    kernel_isa, cpu_isa, _ = sf._core._matrix_kernel_check()
    assert kernel_isa and cpu_isa
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "SSE41", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-W", "always", "-c", "import shardflow"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    if cpu_isa in ("AVX2", "AVX-512"):
        assert result.stderr.count("RuntimeWarning: ONEDNN_MAX_CPU_ISA=SSE41 limits oneDNN to its SSE kernels on "
                                   f"this {cpu_isa} CPU") == 1, result.stderr
        assert "Unset ONEDNN_MAX_CPU_ISA." in result.stderr
    del env["ONEDNN_MAX_CPU_ISA"]
    env.pop("DNNL_MAX_CPU_ISA", None)
    result = subprocess.run([sys.executable, "-W", "always", "-c", "import shardflow"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0 and "RuntimeWarning" not in result.stderr, result.stderr
