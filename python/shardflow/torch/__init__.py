"""shardflow as a PyTorch front end.

    import shardflow.torch.spmd as xs          # torch_xla.distributed.spmd's names
    import shardflow.torch.runtime as xr       # torch_xla.runtime's names
    xr.use_spmd(devices=8)
    step = torch.compile(model, backend="shardflow")

Importing this package registers the custom op ``xla::dynamo_mark_sharding``
(unless torch_xla did) and the ``torch.compile`` backend ``"shardflow"`` (also
an entry point of the installed package).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from . import _ops, runtime, spmd  # noqa: F401  (registers the custom ops)
from . import _backend
from ._backend import Profile, backend, compiled_graphs

if "shardflow" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(name="shardflow")(backend)


@dataclass
class GraphReport:
    """One compiled graph: its IR, the per-device program and the collectives."""

    ir: str
    program_text: str
    collectives: list

    def __str__(self) -> str:
        lines = [self.ir, self.program_text]
        lines += [str(c) for c in self.collectives] or ["no collectives"]
        return "\n".join(lines)


@dataclass
class Explanation:
    graphs: list[GraphReport]
    graph_breaks: int

    def __str__(self) -> str:
        head = f"{len(self.graphs)} graph(s), {self.graph_breaks} graph break(s)"
        return "\n\n".join([head, *(str(g) for g in self.graphs)])


def explain(fn: Callable, *args: Any, **kwargs: Any) -> Explanation:
    """Compiles ``fn`` with the shardflow backend, runs it on the arguments,
    and reports each graph: the IR, the per-device program, and every
    collective with its kind, axes, bytes and reason. ``fn`` runs twice:
    under ``torch._dynamo.explain`` (which counts graphs and breaks) and
    compiled, so state it updates in place is updated twice."""
    torch._dynamo.reset()
    breaks = torch._dynamo.explain(fn)(*args, **kwargs).graph_break_count
    torch._dynamo.reset()
    first = len(compiled_graphs)
    with torch.no_grad():
        torch.compile(fn, backend="shardflow")(*args, **kwargs)
    reports = []
    for graph in compiled_graphs.since(first):
        if graph.last is not None:
            prepared = graph.last
            reports.append(GraphReport(prepared.ir, prepared.executable.program_text,
                                       list(prepared.executable.collectives)))
    return Explanation(reports, breaks)


@contextlib.contextmanager
def profile() -> Iterator[Profile]:
    """Times every compiled graph call inside the block: the partitioned
    program's runs per device and op kind, and each call whole (see
    ``Profile``):

        with shardflow.torch.profile() as p:
            step(tokens, pos)
        for op, calls, seconds in p.entries(0): ...
        bridge_seconds = p.graph_seconds - p.function_seconds
    """
    previous, _backend.active_profile = _backend.active_profile, Profile()
    try:
        yield _backend.active_profile
    finally:
        _backend.active_profile = previous


__all__ = ["backend", "explain", "profile", "Profile", "spmd", "runtime", "Explanation", "GraphReport"]
