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


def test_kernel_threads_start_from_the_environment_and_follow_set_num_threads():
    """Like torch.get_num_threads/set_num_threads: OMP_NUM_THREADS first, then
    OPENBLAS_NUM_THREADS; a product gives the same bits for any count."""
    import subprocess
    import sys

    import numpy as np

    def threads_at_start(**variables: str) -> int:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        env.update(variables, PYTHONPATH=os.pathsep.join(sys.path))
        result = subprocess.run([sys.executable, "-c", "import shardflow; print(shardflow.get_num_threads())"],
                                capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        return int(result.stdout)

    assert threads_at_start(OMP_NUM_THREADS="3", OPENBLAS_NUM_THREADS="1") == 3
    assert threads_at_start(OPENBLAS_NUM_THREADS="5") == 5

    before = sf.get_num_threads()
    rng = np.random.default_rng(0)
    a = sf.tensor(rng.standard_normal((300, 700), dtype=np.float32))
    b = sf.tensor(rng.standard_normal((700, 1100), dtype=np.float32))
    try:
        sf.set_num_threads(1)
        assert sf.get_num_threads() == 1
        one = np.asarray(sf.matmul(a, b).numpy())
        sf.set_num_threads(2)
        assert sf.get_num_threads() == 2
        assert np.array_equal(np.asarray(sf.matmul(a, b).numpy()), one)
        import pytest

        with pytest.raises(ValueError, match="set_num_threads: expected a positive number of threads, got 0"):
            sf.set_num_threads(0)
    finally:
        sf.set_num_threads(before)
