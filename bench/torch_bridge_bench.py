#!/usr/bin/env python3
"""LLaMA decode and prefill through torch.compile(backend="shardflow"), against
baselines measured in the same run, in alternating rounds (this machine's
memory speed moves between minutes; alternating keeps the ratios honest):

- shardflow native: ``shardflow.llama`` on the same weights, mesh and plan
  (what ``shardflow llama`` runs). bridge / native is the bridge's cost.
- the bridge with the weights unmarked (the blocks' annotations only, the
  seed's pattern): what a model gets that nobody laid out by hand.
- eager PyTorch 2.13 on one device with 1 and 2 threads, the same model
  without annotations: the peer (native / eager is shardflow against
  PyTorch on the same shapes and weights).

Weights are random of a named shape (llama2.c's stories15M/110M). The cache
holds --seq-len positions (default: the config's, at most 1024).

    PYTHONPATH=build/release/python python3 bench/torch_bridge_bench.py \
        --config stories15M stories110M --mesh 1,1,1 1,1,2 [--rounds 5 --steps 16]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

import llama2_torch as showcase  # noqa: E402

import shardflow  # noqa: E402
import shardflow.torch  # noqa: E402,F401  (registers the backend)
import shardflow.torch.runtime as xr  # noqa: E402
import shardflow.torch.spmd as xs  # noqa: E402
from shardflow import llama as sfl  # noqa: E402


def cpu_model() -> str:
    fields = {}
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def torch_model(weights: sfl.Weights, seq_len: int, batch: int, mesh_shape, annotate: bool):
    c = weights.config
    args = showcase.ModelArgs(c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.hidden_dim, c.norm_eps,
                              seq_len, batch, mesh_shape, annotate)
    model = showcase.Transformer(args).eval()
    showcase.load_into(model, weights)
    return model


# Prefills timed after each generation's own: a run's prefill rate is the
# median of the three (see rates).
EXTRA_PREFILLS = 2


def rates(g: showcase.Generation, batch: int, prompt_length: int,
          prefill: Callable[[], object]) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of a generation whose graphs were
    compiled before. The prefill rate is the median of the generation's and
    of EXTRA_PREFILLS calls of `prefill()` right after it: one prefill is a
    single call of tens of milliseconds, and the first of a run took up to
    1.6 times as long as the two after it (stories110M on (1,1,2), AMD Zen
    3: bridge / native prefill 0.59 in a run that timed one prefill per
    round, 0.99 in the next, which took the median)."""
    decode_seconds = g.first_decode_seconds + g.decode_seconds
    prefill_seconds = statistics.median([g.prefill_seconds, *seconds_of(prefill, EXTRA_PREFILLS)])
    return batch * prompt_length / prefill_seconds, batch * (g.decode_steps + 1) / decode_seconds


def seconds_of(call: Callable[[], object], times: int) -> list[float]:
    """The seconds of `times` calls of `call()`."""
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return seconds


def decode_split(step, model: showcase.Transformer, prompt: torch.Tensor, steps: int) -> tuple[float, float, float]:
    """A bridge decode step's milliseconds, medians over `steps` steps: the
    partitioned program's run, the bridge's own work around it (feeding
    inputs, writing state back), and Dynamo's and AOTAutograd's (the rest of
    the call: guards, wrappers), from ``shardflow.torch.profile()``."""
    runs, bridge, dynamo = [], [], []
    out = step(prompt, torch.arange(prompt.shape[1]))
    for pos in range(prompt.shape[1], prompt.shape[1] + steps):
        token, position = out.argmax(-1)[:, None], torch.tensor([pos])
        with shardflow.torch.profile() as p:
            started = time.perf_counter()
            out = step(token, position)
            seconds = time.perf_counter() - started
        runs.append(p.function_seconds)
        bridge.append(p.graph_seconds - p.function_seconds)
        dynamo.append(seconds - p.graph_seconds)
    return tuple(1e3 * statistics.median(v) for v in (runs, bridge, dynamo))


def bench(config: str, mesh_shape: tuple[int, ...], rounds: int, steps: int, seq_len: int | None) -> dict:
    devices = int(np.prod(mesh_shape))
    batch = mesh_shape[0]
    xr.use_spmd(devices=devices)
    mesh = xs.Mesh(np.arange(devices), mesh_shape, ("data", "fsdp", "model"))
    plan = sfl.ShardingPlan.megatron(mesh._core())
    weights = sfl.random_weights(sfl.Config.named(config), seed=0)
    seq_len = seq_len or min(weights.config.seq_len, 1024)
    prompt_ids = [1, 450, 4996, 310, 17354, 1701, 29916, 432]
    prompt = torch.tensor([prompt_ids] * batch)

    bridge_model = torch_model(weights, seq_len, batch, mesh_shape, annotate=True)
    showcase.shard(bridge_model, mesh, plan)
    step = torch.compile(bridge_model, backend="shardflow", dynamic=False)
    unmarked_model = torch_model(weights, seq_len, batch, mesh_shape, annotate=True)
    unmarked_step = torch.compile(unmarked_model, backend="shardflow", dynamic=False)
    config_at_len = sfl.Config.named(config)
    config_at_len.seq_len = seq_len
    native = sfl.Model(sfl.random_weights(config_at_len, seed=0, plan=plan), plan)
    eager = torch_model(weights, seq_len, batch, (1, 1, 1), annotate=False)
    threads = torch.get_num_threads()

    splits: list[tuple[float, float, float]] = []
    results: dict[str, list[tuple[float, float]]] = {"bridge": [], "bridge, unmarked": [], "native": [],
                                                     "eager 1 thread": [], "eager 2 threads": []}
    with torch.no_grad():
        showcase.generate(step, bridge_model, prompt, 2)  # compiles prefill and decode
        showcase.generate(unmarked_step, unmarked_model, prompt, 2)
        sfl.generate(native, [prompt_ids] * batch, steps=2)
        positions = torch.arange(len(prompt_ids))

        def run_bridge(name, step, model):
            g = showcase.generate(step, model, prompt, steps)
            results[name].append(rates(g, batch, len(prompt_ids), lambda: step(prompt, positions)))

        def run_native():
            n = sfl.generate(native, [prompt_ids] * batch, steps=steps)
            prefills = [n.prefill_seconds] + [sfl.generate(native, [prompt_ids] * batch, steps=1).prefill_seconds
                                              for _ in range(EXTRA_PREFILLS)]
            results["native"].append((batch * len(prompt_ids) / statistics.median(prefills),
                                      batch * (steps - 1) / n.decode_seconds))

        runs = [lambda: run_bridge("bridge", step, bridge_model),
                lambda: splits.append(decode_split(step, bridge_model, prompt, steps)),
                lambda: run_bridge("bridge, unmarked", unmarked_step, unmarked_model), run_native]
        for round_index in range(rounds):
            # Every other round in reverse: the first run after the eager
            # rounds read 20% slower prefills here (stories15M), whichever it was.
            for run in (runs if round_index % 2 == 0 else runs[::-1]):
                run()
            for count, name in ((1, "eager 1 thread"), (2, "eager 2 threads")):
                torch.set_num_threads(count)
                g = showcase.generate(eager, eager, prompt, steps)
                results[name].append(rates(g, batch, len(prompt_ids), lambda: eager(prompt, positions)))
            torch.set_num_threads(threads)
            # torch's OpenMP workers spin on the cores for a while after their
            # last op; the next round's first run (the bridge's prefill) would
            # share the cores with them: 790 instead of 1460 tok/s (stories15M, Zen 2).
            time.sleep(0.5)
    xr.shutdown()
    torch._dynamo.reset()
    rates_by_run = {name: (statistics.median(p for p, _ in rs), statistics.median(d for _, d in rs),
                           min(d for _, d in rs), max(d for _, d in rs)) for name, rs in results.items()}
    split = tuple(statistics.median(s[i] for s in splits) for i in range(3))
    return rates_by_run, split


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", nargs="+", default=["stories15M", "stories110M"])
    parser.add_argument("--mesh", nargs="+", default=["1,1,1", "1,1,2"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seq-len", type=int)
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; torch {torch.__version__}; shardflow kernel threads on one device: "
          f"{shardflow.get_num_threads()} (OMP_NUM_THREADS, else OPENBLAS_NUM_THREADS, else the cores); "
          f"{args.rounds} alternating rounds of {args.steps} steps, medians (decode min-max)")
    for config in args.config:
        for mesh_text in args.mesh:
            mesh_shape = tuple(int(v) for v in mesh_text.split(","))
            r, (run_ms, bridge_ms, dynamo_ms) = bench(config, mesh_shape, args.rounds, args.steps, args.seq_len)
            print(f"\n{config}, mesh {mesh_shape}, batch {mesh_shape[0]}:")
            print(f"  {'':18s} {'prefill tok/s':>14s} {'decode tok/s':>13s}   {'decode range':>15s}")
            for name, (prefill, decode, low, high) in r.items():
                print(f"  {name:18s} {prefill:14.1f} {decode:13.1f}   {low:7.1f}-{high:<7.1f}")
            bridge, unmarked, native = r["bridge"], r["bridge, unmarked"], r["native"]
            eager1, eager2 = r["eager 1 thread"], r["eager 2 threads"]
            print(f"  bridge / native: prefill {bridge[0] / native[0]:.2f}, decode {bridge[1] / native[1]:.2f} "
                  f"(weights unmarked: {unmarked[0] / native[0]:.2f}, {unmarked[1] / native[1]:.2f}); "
                  f"bridge / eager (1, 2 threads) decode {bridge[1] / eager1[1]:.2f}, {bridge[1] / eager2[1]:.2f}")
            native_ms = 1e3 * mesh_shape[0] / native[1]
            print(f"  bridge decode step (medians): run {run_ms:.3f} ms + bridge {bridge_ms:.3f} ms + Dynamo and "
                  f"AOTAutograd {dynamo_ms:.3f} ms; native step {native_ms:.3f} ms, so Dynamo's and AOTAutograd's "
                  f"share alone caps bridge / native decode at {native_ms / (native_ms + dynamo_ms):.2f}")
            print(f"  native / eager (1, 2 threads): prefill {native[0] / eager1[0]:.2f}, {native[0] / eager2[0]:.2f}; "
                  f"decode {native[1] / eager1[1]:.2f}, {native[1] / eager2[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
