"""The ``torch.compile`` backend ``"shardflow"``.

Dynamo's FX graph goes through AOTAutograd (a functional aten graph; input
mutations become outputs that AOTAutograd writes back), is lowered to
shardflow IR (``_lowering``), and runs on the current runtime's devices:
propagated, partitioned and executed by shardflow. Inputs laid out eagerly by
``xs.mark_sharding`` are fed as their shards; other inputs are viewed without
a copy. Outputs come back as torch tensors.

``SHARDFLOW_DUMP_DIR=DIR`` writes each graph's IR to DIR (replay it with
``shardflow partition FILE`` and ``shardflow run FILE --check``).
"""

from __future__ import annotations

import collections
import itertools
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd

import shardflow as sf

from . import _lowering, _state

_graph_ids = itertools.count()
class CompiledGraphs:
    """The graphs this backend compiled, newest last: len() counts all of
    them; indexing and iteration see the most recent ones only, so that
    recompiling does not keep every old graph (and its constants) alive."""

    def __init__(self, keep: int = 64):
        self._recent: collections.deque = collections.deque(maxlen=keep)
        self._count = 0

    def append(self, graph: "CompiledGraph") -> None:
        self._recent.append(graph)
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        return iter(list(self._recent))

    def __getitem__(self, index: int) -> "CompiledGraph":
        return list(self._recent)[index]

    def since(self, count: int) -> list["CompiledGraph"]:
        """The graphs compiled after the first `count` (those still kept)."""
        newer = min(self._count - count, len(self._recent))
        return list(self._recent)[len(self._recent) - newer:] if newer > 0 else []


# Every graph compiled in this process (explain() reads them).
compiled_graphs = CompiledGraphs()
# When set (shardflow.torch.profile()), every graph run adds its op times here.
active_profile: sf.OpProfile | None = None


@dataclass
class Prepared:
    ir: str
    executable: sf.Executable
    constants: list[sf.Tensor]  # the graph's tensor constants, fed after its inputs


@dataclass
class CompiledGraph:
    """One AOTAutograd forward graph, lowered and prepared per input layout."""

    gm: torch.fx.GraphModule
    name: str
    prepared: dict[tuple, Prepared] = field(default_factory=dict)
    last: Prepared | None = None
    _boxed_call = True  # AOTAutograd passes the inputs as one list

    def prepare(self, inputs: list[sf.Tensor]) -> Prepared:
        shardings = [t.sharding for t in inputs]
        key = (sf._core._runner_id(), tuple(None if s is None else (s.v1, str(s.mesh)) for s in shardings))
        entry = self.prepared.get(key)
        if entry is None:
            ir, constants = _lowering.lower(self.gm, shardings, self.name)
            _dump(self.name, ir)
            graph = sf.Graph.parse(ir)
            constant_inputs = [_state.to_shardflow(c) for c in constants]
            entry = self.prepared[key] = Prepared(ir, sf.Executable(graph, shardings + [None] * len(constants)),
                                                  constant_inputs)
        self.last = entry
        return entry

    def __call__(self, args: list[Any]) -> list[torch.Tensor]:
        inputs = [_state.as_input(a) if isinstance(a, torch.Tensor) else _refuse_non_tensor(a) for a in args]
        args.clear()  # the boxed convention: the callee lets go of the inputs
        prepared = self.prepare(inputs)
        outputs = prepared.executable(inputs + prepared.constants, active_profile)
        return [torch.from_dlpack(out) for out in outputs]


def _refuse_non_tensor(value: Any) -> sf.Tensor:
    raise sf.Error(f"a compiled graph got the input {value!r} ({type(value).__name__}); shardflow graphs take "
                   "tensors (Python numbers inside forward are constants; dynamic shapes are not supported)")


def _dump(name: str, ir: str) -> None:
    folder = os.environ.get("SHARDFLOW_DUMP_DIR")
    if folder:
        path = pathlib.Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{name}.ir").write_text(ir)


def _forward_compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> CompiledGraph:
    del example_inputs  # shapes come from the graph's metadata; layouts from the first call
    graph = CompiledGraph(gm, f"graph_{next(_graph_ids)}")
    compiled_graphs.append(graph)
    return graph


def _backward_compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]):
    raise sf.Error("shardflow compiles inference graphs only: run the compiled model under torch.no_grad() or "
                   "torch.inference_mode() (training is not supported)")


backend = aot_autograd(fw_compiler=_forward_compiler, bw_compiler=_backward_compiler)
