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


def test_narrow_blas_kernels_are_named_once_at_import():
    """OPENBLAS_CORETYPE forcing SSE3 kernels on a CPU with AVX2 or wider: one
    RuntimeWarning at import that says which variable to set."""
    import subprocess
    import sys

    corename, isa, _ = sf._core._blas_kernel_check()
    assert corename and isa
    env = {**os.environ, "OPENBLAS_CORETYPE": "Prescott", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-W", "always", "-c", "import shardflow"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    if isa in ("AVX2", "AVX-512"):
        assert result.stderr.count("RuntimeWarning: OPENBLAS_CORETYPE=Prescott makes OpenBLAS use its Prescott "
                                   "kernels on this") == 1, result.stderr
        assert "OPENBLAS_CORETYPE=SkylakeX" in result.stderr or "OPENBLAS_CORETYPE=Haswell" in result.stderr
