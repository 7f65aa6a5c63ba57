#!/usr/bin/env python3
"""Compile time of a 7B-shaped LLaMA 2 (meta tensors: no weights in memory)
through the shardflow bridge, next to PyTorch's own tracing in the same run:

- Dynamo: torch.compile(backend="eager"), the first call's time (Dynamo's
  trace; the call itself runs on meta tensors, which costs nothing).
- Dynamo + AOTAutograd: backend "aot_eager" (adds the functional aten graph).
- shardflow: Dynamo + AOTAutograd + lowering to shardflow IR + parsing +
  propagating + partitioning for the (4,1,2) mesh of the showcase, whose
  blocks annotate their outputs. The weights come in unannotated (meta tensors
  cannot be laid out), so their shardings are propagated from the blocks'.

Each for the prefill graph (--prompt tokens) and the decode graph (1 token).

    PYTHONPATH=build/release/python python3 bench/torch_compile_time_bench.py [--config 7B --layers 32]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch
from torch._dynamo.backends.common import aot_autograd

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

import llama2_torch as showcase  # noqa: E402

import shardflow as sf  # noqa: E402
import shardflow.torch.runtime as xr  # noqa: E402
from shardflow import llama as sfl  # noqa: E402
from shardflow.torch import _lowering  # noqa: E402
from torch_bridge_bench import cpu_model  # noqa: E402


def meta_model(config: sfl.Config, seq_len: int, mesh_shape) -> showcase.Transformer:
    args = showcase.ModelArgs(config.dim, config.n_layers, config.n_heads, config.n_kv_heads, config.vocab_size,
                              config.hidden_dim, config.norm_eps, seq_len, mesh_shape[0], mesh_shape)
    with torch.device("meta"):
        return showcase.Transformer(args).eval()


class ShardflowCompileOnly:
    """The bridge up to a prepared program: lowers, parses, propagates and
    partitions each graph AOTAutograd gives it, and records how long that took."""

    def __init__(self):
        self.seconds = 0.0
        self.nodes = 0
        self.collectives = 0

    def forward_compiler(self, gm: torch.fx.GraphModule, example_inputs):
        started = time.perf_counter()
        on_meta = [n for n in gm.graph.nodes if n.kwargs.get("device") == torch.device("meta")]
        for node in on_meta:  # the tensors forward creates are on meta here, on the CPU in a real run
            node.kwargs = {**node.kwargs, "device": torch.device("cpu")}
        inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        lowering = _lowering.lower(gm, [None] * len(inputs), "bench")
        for node in on_meta:
            node.kwargs = {**node.kwargs, "device": torch.device("meta")}
        graph = sf.Graph.parse(lowering.ir)
        executable = sf.Executable(graph, [None] * (len(inputs) + len(lowering.constants)))
        self.seconds += time.perf_counter() - started
        self.nodes += len(lowering.ir.splitlines()) - 3
        self.collectives += len(executable.collectives)
        return gm  # meta tensors: nothing to run


def first_call_seconds(backend, model, tokens, pos) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False, fullgraph=True)
    started = time.perf_counter()
    with torch.no_grad():
        compiled(tokens, pos)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="7B")
    parser.add_argument("--layers", type=int, help="override the number of layers")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--mesh", default="4,1,2")
    args = parser.parse_args()
    config = sfl.Config.named(args.config)
    if args.layers:
        config.n_layers = args.layers
    mesh_shape = tuple(int(v) for v in args.mesh.split(","))
    devices = mesh_shape[0] * mesh_shape[1] * mesh_shape[2]
    xr.use_spmd(devices=devices)
    model = meta_model(config, args.seq_len, mesh_shape)
    print(f"CPU: {cpu_model()}; torch {torch.__version__}; {config.name} shape, {config.n_layers} layers, "
          f"dim {config.dim}, mesh {mesh_shape}, meta tensors")
    batch = mesh_shape[0]
    for name, length in (("prefill", args.prompt), ("decode", 1)):
        tokens = torch.zeros(batch, length, dtype=torch.long, device="meta")
        pos = torch.arange(length, device="meta")
        dynamo = first_call_seconds("eager", model, tokens, pos)
        aot = first_call_seconds("aot_eager", model, tokens, pos)
        bridge = ShardflowCompileOnly()
        total = first_call_seconds(aot_autograd(fw_compiler=bridge.forward_compiler,
                                                keep_inference_input_mutations=True), model, tokens, pos)
        print(f"{name} ({length} token(s)): Dynamo {dynamo:.2f} s; Dynamo + AOTAutograd {aot:.2f} s; "
              f"through shardflow {total:.2f} s, of which lowering + propagation + partitioning "
              f"{bridge.seconds:.2f} s ({bridge.nodes} IR nodes, {bridge.collectives} collectives)")
    xr.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
