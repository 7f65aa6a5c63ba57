"""Inputs a compiled graph writes in place (a KV cache), kept in step on both sides.

AOTAutograd (with ``keep_inference_input_mutations``) ends the graph with
``copy_(input, new_value)`` for every input the function wrote. shardflow
computes ``new_value`` on the devices; the torch tensor the user holds must
then hold it too. Rather than gather the whole new value every call, the
writes that made it (``index_copy_``, ``index_put_``, ``t[..., i] = x``: a
chain of scatters into the input) are found in the graph and replayed on the
torch tensor with their small operands, which the graph returns as extra
outputs. Any other new value is returned whole and copied.

An input laid out by ``xs.mark_sharding`` is donated to the run: its shards
are updated in place on the devices, and the new value, laid out as before,
becomes the tensor's shards for the next call (see ``_state``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx

from . import _state

aten = torch.ops.aten

# A scatter op -> the view op whose region it writes.
_SCATTER_VIEWS = {aten.select_scatter.default: aten.select.int, aten.slice_scatter.default: aten.slice.Tensor}
# Scatters that write a region of their first argument.
_SCATTERS = {aten.index_copy.default, aten.index_put.default, *_SCATTER_VIEWS}


def _view_params(op, args: tuple, size_of_dim) -> tuple:
    """(dim, ...) of a select/slice or of the matching scatter, with PyTorch's defaults filled in."""
    if op in (aten.select.int, aten.select_scatter.default):
        dim, index = args
        return (dim, index + size_of_dim(dim) if index < 0 else index)
    dim = args[0] if len(args) > 0 else 0
    start = args[1] if len(args) > 1 and args[1] is not None else 0
    end = args[2] if len(args) > 2 and args[2] is not None else size_of_dim(dim)
    step = args[3] if len(args) > 3 else 1
    return (dim, start, end, step)


@dataclass(frozen=True)
class View:
    """A region of a tensor: ('select', dim, index) or ('slice', dim, start, end, step)."""

    kind: str
    params: tuple

    def of(self, t: torch.Tensor) -> torch.Tensor:
        if self.kind == "select":
            return t.select(*self.params)
        dim, start, end, step = self.params
        return aten.slice.Tensor(t, dim, start, end, step)


@dataclass(frozen=True)
class HostWrite:
    """One in-place write, replayed on the torch tensor: inside `views`,
    `op` ('index_copy', 'index_put' or 'copy') with the graph values
    `operands` (FX nodes, returned by the graph) and constant `params`."""

    views: tuple[View, ...]
    op: str
    operands: tuple[Any, ...]  # FX nodes or None (an index_put index that is absent)
    params: tuple
    # (dim, index node, source node) when the write is whole rows of the
    # tensor itself, source of their shape but for leading 1s (a KV-cache update):
    # shardflow writes those into the torch tensor's memory directly.
    rows: tuple[int, torch.fx.Node, torch.fx.Node] | None = None

    def apply(self, target: torch.Tensor, value_of) -> None:
        region = target
        for view in self.views:
            region = view.of(region)
        operands = [None if n is None else value_of(n) for n in self.operands]
        if self.op == "index_copy":
            region.index_copy_(self.params[0], operands[0], operands[1])
        elif self.op == "index_put" and self.rows is not None:
            # One 1-D index tensor writing whole rows: index_copy_, which is
            # several times faster.
            dim = self.rows[0]
            rows = list(region.shape)
            rows[dim] = operands[dim].shape[0]
            region.index_copy_(dim, operands[dim].remainder(region.shape[dim]), operands[-1].expand(rows))
        elif self.op == "index_put":
            aten.index_put_.default(region, operands[:-1], operands[-1], self.params[0])
        else:
            region.copy_(operands[0])


def _dim_size(node: torch.fx.Node):
    return lambda dim: node.meta["val"].shape[dim]


def _chain_root(node: Any) -> Any:
    while isinstance(node, torch.fx.Node) and node.target in _SCATTERS:
        node = node.args[0]
    return node


def _put_rows(base: torch.fx.Node, indices: list, values: Any) -> tuple[int, torch.fx.Node, torch.fx.Node] | None:
    """(dim, index, values) when index_put writes whole rows at one integer
    index along dim with values of their shape (or lacking leading 1s)."""
    given = [(dim, index) for dim, index in enumerate(indices) if index is not None]
    if len(given) != 1 or not isinstance(values, torch.fx.Node):
        return None
    dim, index = given[0]
    index_val, values_val, base_val = index.meta.get("val"), values.meta.get("val"), base.meta.get("val")
    if index_val is None or values_val is None or base_val is None:
        return None
    if index_val.dtype not in (torch.int64, torch.int32) or index_val.dim() != 1 or values_val.dtype != base_val.dtype:
        return None
    rows = list(base_val.shape)
    rows[dim] = index_val.shape[0]
    # index_put_ broadcasts values; leading dims of size 1 are the same bytes.
    lead = len(rows) - values_val.dim()
    fits = lead >= 0 and list(values_val.shape) == rows[lead:] and all(r == 1 for r in rows[:lead])
    return (dim, index, values) if fits else None


def host_writes(value: Any, base: torch.fx.Node) -> list[HostWrite] | None:
    """The in-place writes that turn `base` into `value`, in order; None when
    `value` is not a chain of scatters into `base`."""
    if value is base:
        return []
    if not isinstance(value, torch.fx.Node) or value.target not in _SCATTERS:
        return None
    prior = host_writes(value.args[0], base)
    if prior is None:
        return None
    if value.target is aten.index_copy.default:
        _, dim, index, source = value.args
        return prior + [HostWrite((), "index_copy", (index, source), (dim,), (dim, index, source))]
    if value.target is aten.index_put.default:
        indices, values = value.args[1], value.args[2]
        accumulate = value.args[3] if len(value.args) > 3 else value.kwargs.get("accumulate", False)
        return prior + [HostWrite((), "index_put", (*indices, values), (accumulate,),
                                  None if accumulate else _put_rows(base, indices, values))]
    # select_scatter / slice_scatter: `src` goes into a view of self. When src
    # is itself a chain of writes into that same view of self (t[a][b] = x),
    # those writes are replayed inside the view instead of copying it whole.
    self_node, src = value.args[:2]
    view_op = _SCATTER_VIEWS[value.target]
    params = _view_params(value.target, value.args[2:], _dim_size(self_node))
    view = View("select" if view_op is aten.select.int else "slice", params)
    root = _chain_root(src)
    if (isinstance(root, torch.fx.Node) and root is not src and root.target is view_op and root.args[0] is self_node
            and _view_params(view_op, root.args[1:], _dim_size(self_node)) == params):
        inner = host_writes(src, root)
        if inner is not None:
            return prior + [HostWrite((view, *w.views), w.op, w.operands, w.params) for w in inner]
    return prior + [HostWrite((view,), "copy", (src,), ())]


@dataclass
class Mutation:
    """What a graph returns for one input it writes, and how the caller applies it."""

    input_index: int
    placeholder: torch.fx.Node
    new_value: torch.fx.Node
    writes: list[HostWrite] | None  # None: copy the whole new value into the tensor
    state_output: int | None = None  # the new value laid out as the input was (kept as its shards)
    whole_output: int | None = None  # the new value, when it is copied whole
    operand_outputs: dict[torch.fx.Node, int] | None = None  # the writes' operands, by node

    def rows_into(self, target: torch.Tensor, outputs: Sequence[Any]) -> list[tuple] | None:
        """The writes as (memory, dim, index, source) for shardflow's
        _put_rows_into, `outputs` being the graph's; None unless every write
        is whole rows and the tensor's memory can be written directly."""
        if self.writes is None or any(w.rows is None for w in self.writes):
            return None
        memory = _state.memory_view(target)
        if memory is None:
            return None
        assert self.operand_outputs is not None
        return [(memory, w.rows[0], outputs[self.operand_outputs[w.rows[1]]], outputs[self.operand_outputs[w.rows[2]]])
                for w in self.writes if w.rows is not None]

    def apply(self, target: torch.Tensor, output: Callable[[int], torch.Tensor]) -> None:
        """Writes the new value into the caller's torch tensor; output(i) is the graph's output i."""
        if self.writes is None:
            target.copy_(output(self.whole_output if self.whole_output is not None else self.state_output))
            return
        assert self.operand_outputs is not None
        operands = {node: output(i) for node, i in self.operand_outputs.items()}
        for write in self.writes:
            write.apply(target, operands.__getitem__)
