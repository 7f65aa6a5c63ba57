"""Torch tensors laid out as shardflow shards.

An eager ``xs.mark_sharding(t, mesh, spec)`` keeps the tensor's data as device
shards (a sharded ``shardflow.Tensor``) here, keyed by the torch tensor. A
compiled graph takes that sharded tensor as its input as it is, so weights are
not split again on every call. The sharding stays with the tensor, as in
PyTorch/XLA: once the tensor was written in place outside shardflow (its
``_version`` moved on: ``load_state_dict``, ``cache.zero_()``) or given other
memory (``t.data = other``, which leaves ``_version``) its new values are laid
out again with the same sharding. A compiled graph that writes the
tensor (a KV cache) updates its shards in place and writes the same values
into the torch tensor (``_mutation``), so its shards stay current without
being laid out again; where its shards can be views of the torch tensor's
own memory (see writes_in_place) the graph writes there and nothing is
copied back. An entry is dropped when the torch tensor is collected.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, NoReturn

import torch

import shardflow as sf


@dataclass(slots=True)  # read for every input of every call: no per-entry __dict__ to miss in the cache
class _Entry:
    tensor: weakref.ref
    version: int  # the torch tensor's _version when `sharded` held its values
    sharded: sf.Tensor
    sharding: sf.Sharding  # kept apart: `sharded` may be used up (donated to a run that failed)
    # A graph that writes it is fed the torch tensor's own memory and
    # updates it there (see as_inputs): one device holds it whole, or each
    # device's shard is one run of that memory (see writes_in_place).
    in_place: bool = False
    # The torch tensor's data_ptr() when `sharded` was taken from it.
    address: int = 0
    # `sharded` views the torch tensor's own memory (see borrow_in_place).
    borrowed: bool = False
    # `sharded` is the torch tensor's own memory, where a run wrote it in
    # place: the next run that writes it is fed it again.
    aliases: bool = False


_entries: dict[int, _Entry] = {}


def to_shardflow(t: torch.Tensor) -> sf.Tensor:
    """A torch CPU tensor as a shardflow tensor, without a copy (contiguous tensors)."""
    return sf.from_dlpack(_array(t))


# dtypes NumPy has: their tensors cross as NumPy views (the buffer protocol),
# which takes 2.7 us where torch's __dlpack__ takes 5.6 (every call feeds
# the token ids and positions, and views each cache it writes).
_NUMPY_DTYPES = frozenset({torch.float32, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16,
                           torch.int8, torch.uint8, torch.bool})


def _array(t: torch.Tensor):
    """t's memory, without a copy, as something from_dlpack views."""
    if not t.is_cpu:
        raise sf.Error(f"shardflow runs on CPU tensors; got a tensor on {t.device}")
    t = t.detach()
    return t.numpy() if t.dtype in _NUMPY_DTYPES else t


def set_sharded(t: torch.Tensor, sharded: sf.Tensor, sharding: sf.Sharding | None = None,
                borrowed: bool = False) -> None:
    """`sharded` holds t's current values, laid out as t is to be from now on
    (with `sharding`: a one-device run returns a tensor that is not laid out).
    `borrowed`: it is a view of t's own memory."""
    sharding = sharding if sharding is not None else sharded.sharding
    key = id(t)
    entry = _entries.get(key)
    if entry is not None and entry.tensor() is t:
        if entry.sharding is not sharding:
            entry.in_place = writes_in_place(t, sharding)
        entry.version, entry.sharded, entry.sharding = t._version, sharded, sharding
        entry.address, entry.borrowed, entry.aliases = t.data_ptr(), borrowed, False
        return
    _entries[key] = _Entry(weakref.ref(t, lambda _: _entries.pop(key, None)), t._version, sharded, sharding,
                           writes_in_place(t, sharding), t.data_ptr(), borrowed)


def on_one_device(sharding: sf.Sharding) -> bool:
    """Whether the sharding's mesh is one device (which then holds the whole tensor)."""
    return len(sharding.mesh.device_ids) == 1


def writes_in_place(t: torch.Tensor, sharding: sf.Sharding) -> bool:
    """Whether a graph that writes t, laid out with `sharding`, can be fed
    t's own memory to write: one device holds t whole, or each device's
    shard is one run of t's memory (a KV cache split over heads, its batch
    rows over another axis), held by that device alone. The cache is then
    held once, runs write it where it lies (no rows copied back into t), and
    a `zero_()` between generations is seen without a copy."""
    if t.is_complex():
        return False
    return on_one_device(sharding) or sf._core._shards_are_runs(sharding, list(t.shape))


def lay_out(t: torch.Tensor, sharding: sf.Sharding) -> sf.Tensor:
    """t's values laid out with `sharding`, which t keeps from now on."""
    laid_out = sf.mark_sharding(to_shardflow(t), sharding.mesh, sharding.spec)
    set_sharded(t, laid_out, sharding)
    return laid_out


def sharded(t: torch.Tensor, expected_writes: int = 0) -> sf.Tensor | None:
    """The tensor's shards, if it was marked; laid out again if it was
    written more often than the `expected_writes` already counted in its
    version (AOTAutograd counts a graph's write to an input before the graph runs)."""
    entry = _entries.get(id(t))
    if entry is None or entry.tensor() is not t:
        return None
    return _current_shards(entry, t, expected_writes)


def _current_shards(entry: _Entry, t: torch.Tensor, expected_writes: int) -> sf.Tensor:
    if entry.version + expected_writes != t._version or entry.address != t.data_ptr():
        if entry.borrowed:
            entry.sharded = _huge_paged_view(t)
        else:
            entry.sharded = sf.mark_sharding(to_shardflow(t), entry.sharding.mesh, entry.sharding.spec)
        entry.version, entry.address, entry.aliases = t._version, t.data_ptr(), False
    return entry.sharded


def invalidate(t: torch.Tensor) -> None:
    """The shards no longer hold the tensor's values (a run that took them
    failed): the next use lays the tensor out again, with its sharding."""
    entry = _entries.get(id(t))
    if entry is not None and entry.tensor() is t:
        entry.version = -1


def clear(t: torch.Tensor) -> None:
    _entries.pop(id(t), None)


def sharding_of(t: torch.Tensor) -> sf.Sharding | None:
    """The sharding t was marked with, or None."""
    entry = _entries.get(id(t))
    return entry.sharding if entry is not None and entry.tensor() is t else None


def as_inputs(args: list, written: frozenset[int], refuse: Callable[[object], NoReturn]
              ) -> tuple[list[sf.Tensor], list[sf.Sharding | None], list[int]]:
    """What a compiled graph is fed for its arguments, and their shardings: a
    marked tensor's shards, laid out again if it changed since (see
    `sharded`; one the graph writes is laid out by the run); any other tensor
    viewed without a copy. `written`: the positions the graph writes in
    place. Third: the written positions fed their torch tensor's own memory
    to write in place (see `writable_view`). `refuse(arg)` raises for an
    argument that is not a tensor. One loop, run on every call: it is kept flat."""
    inputs: list[sf.Tensor] = []
    shardings: list[sf.Sharding | None] = []
    in_place: list[int] = []
    for i, t in enumerate(args):
        entry = _entries.get(id(t))
        if entry is not None and entry.tensor() is t:
            if i not in written:
                inputs.append(_current_shards(entry, t, 0))
            elif entry.in_place:
                # Its own memory: the last run's result, which is that
                # memory while nothing else wrote the tensor since; else a
                # new view of it (after `cache.zero_()`: nothing to copy).
                current = entry.aliases and entry.version + 1 == t._version and entry.address == t.data_ptr()
                inputs.append(entry.sharded if current else writable_view(t, entry.sharding))
                in_place.append(i)
            elif entry.version + 1 != t._version or entry.address != t.data_ptr():
                # Written outside shardflow since (``cache.zero_()``, or new
                # memory): fed whole, so the run's devices copy their own
                # tiles in parallel, and the new shards the run returns
                # become the tensor's.
                inputs.append(to_shardflow(t))
            else:
                inputs.append(entry.sharded)
            shardings.append(entry.sharding)
            continue
        if not isinstance(t, torch.Tensor):
            refuse(t)
        # A complex input is fed as its real view (the graph splits the parts).
        inputs.append(to_shardflow(torch.view_as_real(t) if t.is_complex() else t))
        shardings.append(None)
    return inputs, shardings, in_place


def writable_view(t: torch.Tensor, sharding: sf.Sharding) -> sf.Tensor:
    """t's own memory, for a graph that writes t (see writes_in_place):
    whole on one device, else laid out with `sharding`, each device's shard
    viewing its run of it. Donated to the run, it is updated where it lies,
    so t needs no copy of its new value (nor, after ``t.zero_()``, a new
    layout). A KV cache is then held once, not twice."""
    if on_one_device(sharding):
        return sf._core._from_dlpack_writable(_array(t))
    return sf._core._writable_shards(_array(t), sharding)


def keep_in_place(t: torch.Tensor, sharding: sf.Sharding) -> sf.Tensor:
    """Keeps `sharding` (see writes_in_place) for t, which a graph writes,
    without a copy of it: returns t's writable view for this call."""
    set_sharded(t, _huge_paged_view(t), sharding)
    return writable_view(t, sharding)


def keep_written_in_place(t: torch.Tensor, new_value: sf.Tensor, sharding: sf.Sharding) -> None:
    """After a run that was fed t's own memory to write (see as_inputs):
    `new_value` is t's from now on. Where the run wrote it into that memory,
    t holds it already; else (the run used the memory for a step on the
    way) it is copied in."""
    aliases = sf._core._lies_in(new_value, t.data_ptr())
    if not aliases:
        t.copy_(torch.from_dlpack(new_value))
    set_sharded(t, new_value, sharding)  # after the copy, which moved t's _version on
    _entries[id(t)].aliases = aliases


def borrow_in_place(t: torch.Tensor, sharding: sf.Sharding) -> sf.Tensor:
    """Keeps `sharding` (one that every device reads whole: of one device,
    or replicated) for t, which graphs read, as a view of t's own memory:
    fed as it lies on every call without being converted again (nor
    copied), until t changes (see `sharded`)."""
    view = _huge_paged_view(t)
    set_sharded(t, view, sharding, borrowed=True)
    return view


def _huge_paged_view(t: torch.Tensor) -> sf.Tensor:
    """A view of t's memory, which is moved onto huge pages first: torch
    places large tensors on 4 KiB pages, and shardflow reads a weight kept
    there on every call (a stories110M decode step's weights streamed 4%
    slower from them)."""
    view = to_shardflow(t)
    sf._core._collapse_into_huge_pages(view)
    return view


@dataclass
class _MemoryView:
    tensor: weakref.ref
    data_ptr: int
    shape: torch.Size
    view: sf.Tensor


_memory_views: dict[int, _MemoryView] = {}


def memory_view(t: torch.Tensor) -> sf.Tensor | None:
    """t's own memory as a shardflow tensor, to write into (a from_dlpack
    view, kept while t lives and still has that memory); None when t is not a
    contiguous CPU tensor of a dtype shardflow has."""
    if not t.is_contiguous() or t.is_complex() or t.device.type != "cpu":
        return None
    key = id(t)
    known = _memory_views.get(key)
    if known is not None and known.tensor() is t and known.data_ptr == t.data_ptr() and known.shape == t.shape:
        return known.view
    try:
        view = sf.from_dlpack(t.detach())
    except sf.Error:
        return None  # a dtype shardflow lacks: written with torch ops instead
    _memory_views[key] = _MemoryView(weakref.ref(t, lambda _: _memory_views.pop(key, None)), t.data_ptr(), t.shape,
                                     view)
    return view
