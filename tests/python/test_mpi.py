"""Runtime.mpi() from Python under mpirun: the in-process results on every rank."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import numpy as np, shardflow as sf
    g = sf.Graph.parse('''func @f(%x: f32[8,6], %w: f32[6,4]) -> (f32[8,4]) {
      %a = xla::dynamo_mark_sharding(%x, [0, 1], "(2,)", "('m',)", "(None, 'm')") : f32[8,6]
      %y = aten::matmul(%a, %w) : f32[8,4]
      return %y
    }''')
    with sf.Runtime.mpi() as rt:
        rank = rt.process_index
        result = sf.run(g, seed=5, check=True)
        if rank == 0:
            print("rank0", rt.process_count, float(np.abs(result.outputs[0]).sum()))
    local = sf.run(g, seed=5)
    if rank == 0:
        print("local", float(np.abs(local.outputs[0]).sum()))
""")


def run_on_two_ranks(script_text: str, tmp_path: pathlib.Path) -> str:
    """Runs the script under `mpirun -n 2` (its argument: tmp_path) and returns its stdout."""
    script = tmp_path / "job.py"
    script.write_text(script_text)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(["mpirun", "-n", "2", "--oversubscribe", sys.executable, str(script), str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI is not installed")
def test_a_graph_runs_on_mpi_ranks_as_in_process(tmp_path):
    stdout = run_on_two_ranks(SCRIPT, tmp_path)
    lines = dict(line.split(" ", 1) for line in stdout.strip().splitlines())
    count, mpi_sum = lines["rank0"].split()
    assert count == "2"
    assert float(mpi_sum) == float(lines["local"])


@pytest.mark.parametrize("variable", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"])
def test_each_launchers_variable_means_one_device_per_rank(monkeypatch, variable):
    import shardflow as sf

    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not sf.Runtime.started_by_mpi_launcher()
    monkeypatch.setenv(variable, "2")
    assert sf.Runtime.started_by_mpi_launcher()


USE_SPMD_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import shardflow.torch.runtime as xr
    import shardflow.torch.spmd as xs

    runtime = xr.use_spmd()

    def f(x, w):
        xs.mark_sharding(x, xs.Mesh(torch.arange(2), (2,)), (0, None))
        return torch.relu(x @ w)

    torch.manual_seed(0)
    x, w = torch.randn(8, 6), torch.randn(6, 4)
    got = torch.compile(f, backend="shardflow")(x, w)
    error = float((got - torch.relu(x @ w)).abs().max())
    # One file per rank: mpirun interleaves the ranks' stdout mid-line.
    with open(f"{sys.argv[1]}/rank{runtime.process_index}", "w") as out:
        out.write(f"{runtime.process_index} {runtime.process_count} {xr.global_runtime_device_count()} "
                  f"{runtime.devices_on_this_host} {error}")
""")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI is not installed")
def test_use_spmd_under_mpirun_makes_the_ranks_the_devices(tmp_path):
    run_on_two_ranks(USE_SPMD_SCRIPT, tmp_path)
    rows = [(tmp_path / f"rank{rank}").read_text().split() for rank in (0, 1)]
    # rank, ranks, devices, devices on this host (both ranks run here)
    assert [row[:4] for row in rows] == [["0", "2", "2", "2"], ["1", "2", "2", "2"]]
    assert all(float(row[4]) <= 1e-5 for row in rows)
