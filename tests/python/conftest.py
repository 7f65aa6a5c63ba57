"""Shared fixtures: the package under test and the `shardflow` tool beside it.

The README's test command builds the module with the release preset and runs
pytest with PYTHONPATH=build/release/python; an installed package (pip install
.) is used when that is not set.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import zlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "release"

try:
    import shardflow  # noqa: F401
except ImportError:  # running from a checkout without PYTHONPATH
    sys.path.insert(0, str(BUILD / "python"))


# Random inputs are seeded per test from its id, so a failure reproduces whichever
# xdist worker runs it and whatever ran before it. SHARDFLOW_TEST_SEED picks
# another family of inputs.
_BASE_SEED = int(os.environ.get("SHARDFLOW_TEST_SEED", "0"))


def pytest_report_header(config):
    return f"shardflow: SHARDFLOW_TEST_SEED={_BASE_SEED} (random inputs are seeded per test from it and the test id)"


@pytest.fixture(autouse=True)
def _seeded_random_inputs(request):
    import numpy
    import torch

    seed = (zlib.crc32(request.node.nodeid.encode()) + _BASE_SEED) % 2**32
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)


def _cli_path() -> str | None:
    built = BUILD / "tools" / "shardflow"
    if built.exists():
        return str(built)
    return shutil.which("shardflow")


@pytest.fixture(scope="session")
def cli():
    """Runs `shardflow ARGS... --format json` and returns the parsed output."""
    path = _cli_path()
    if path is None:
        pytest.skip("the shardflow tool is not built")

    def run(*args: str) -> dict:
        result = subprocess.run([path, *args, "--format", "json"], capture_output=True, text=True,
                                env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}, timeout=120)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    return run


@pytest.fixture
def spmd():
    """Starts `n` in-process devices for one test (spmd(n)), with a fresh Dynamo cache; shuts them down after."""
    import torch

    import shardflow.torch.runtime as xr

    def start(n: int):
        xr.shutdown()
        torch._dynamo.reset()
        return xr.use_spmd(devices=n)

    yield start
    xr.shutdown()
    torch._dynamo.reset()
