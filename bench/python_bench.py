#!/usr/bin/env python3
"""Python-side costs of the package, each against a baseline measured in the same run.

1. Call overhead: Sharding.from_spec(mesh, ("data", None)).v1 from Python against
   the same call in C++ (sharding_bench's FromSpecV1). Target: under 2 us more.
2. Zero copy: NumPy -> shardflow -> NumPy for 1 KiB and 1 GiB. Without copies
   both take the same time (a copy of 1 GiB takes ~100 ms).

    PYTHONPATH=build/release/python python3 bench/python_bench.py [--bench-dir build/release/bench]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import subprocess
import timeit

import numpy as np

import shardflow as sf


def cpu_model() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def best_seconds(stmt, number: int, repeat: int = 7) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number


def cpp_from_spec_seconds(bench_dir: pathlib.Path) -> float:
    out = subprocess.run([str(bench_dir / "sharding_bench"), "--benchmark_filter=FromSpecV1",
                          "--benchmark_format=json", "--benchmark_repetitions=5",
                          "--benchmark_report_aggregates_only=true"],
                         check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)["benchmarks"]
    (median,) = [r for r in rows if r.get("aggregate_name") == "median"]
    return median["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3}[median["time_unit"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench-dir", default=str(pathlib.Path(__file__).resolve().parents[1] / "build/release/bench"))
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}")

    mesh = sf.Mesh(list(range(8)), (4, 2), ("data", "model"))
    python_s = best_seconds(lambda: sf.Sharding.from_spec(mesh, ("data", None)).v1, number=20000)
    cpp_s = cpp_from_spec_seconds(pathlib.Path(args.bench_dir))
    print(f"from_spec(...).v1: Python {python_s * 1e6:.2f} us, C++ {cpp_s * 1e6:.2f} us, "
          f"overhead {(python_s - cpp_s) * 1e6:.2f} us per call (target < 2 us)")

    small = np.ones(256, dtype=np.float32)                  # 1 KiB
    large = np.ones(256 * 1024 * 1024, dtype=np.float32)    # 1 GiB
    small_s = best_seconds(lambda: sf.from_dlpack(small).numpy(), number=2000)
    large_s = best_seconds(lambda: sf.from_dlpack(large).numpy(), number=2000)
    copy_s = best_seconds(lambda: large.copy(), number=1, repeat=3)
    assert sf.from_dlpack(large).numpy().ctypes.data == large.ctypes.data
    print(f"round trip NumPy -> shardflow -> NumPy: 1 KiB {small_s * 1e6:.2f} us, 1 GiB {large_s * 1e6:.2f} us "
          f"(ratio {large_s / small_s:.2f}; one copy of 1 GiB: {copy_s * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
