"""Torch tensors laid out as shardflow shards.

An eager ``xs.mark_sharding(t, mesh, spec)`` keeps the tensor's data as device
shards (a sharded ``shardflow.Tensor``) here, keyed by the torch tensor. A
compiled graph takes that sharded tensor as its input as it is, so weights are
not split again on every call. The sharding stays with the tensor, as in
PyTorch/XLA: once the tensor was written in place outside shardflow (its
``_version`` moved on: ``load_state_dict``, ``cache.zero_()``) its new values
are laid out again with the same sharding. A compiled graph that writes the
tensor (a KV cache) updates its shards in place and writes the same values
into the torch tensor (``_mutation``), so its shards stay current without
being laid out again. An entry is dropped when the torch tensor is collected.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

import shardflow as sf


@dataclass
class _Entry:
    tensor: weakref.ref
    version: int  # the torch tensor's _version when `sharded` held its values
    sharded: sf.Tensor
    sharding: sf.Sharding  # kept apart: `sharded` may be used up (donated to a run that failed)


_entries: dict[int, _Entry] = {}


def to_shardflow(t: torch.Tensor) -> sf.Tensor:
    """A torch CPU tensor as a shardflow tensor, without a copy (contiguous tensors)."""
    if t.device.type != "cpu":
        raise sf.Error(f"shardflow runs on CPU tensors; got a tensor on {t.device}")
    return sf.from_dlpack(t.detach())


def set_sharded(t: torch.Tensor, sharded: sf.Tensor, sharding: sf.Sharding | None = None) -> None:
    """`sharded` holds t's current values, laid out as t is to be from now on
    (with `sharding`: a one-device run returns a tensor that is not laid out)."""
    sharding = sharding if sharding is not None else sharded.sharding
    key = id(t)
    entry = _entries.get(key)
    if entry is not None and entry.tensor() is t:
        entry.version, entry.sharded, entry.sharding = t._version, sharded, sharding
        return
    _entries[key] = _Entry(weakref.ref(t, lambda _: _entries.pop(key, None)), t._version, sharded, sharding)


def sharded(t: torch.Tensor, expected_writes: int = 0) -> sf.Tensor | None:
    """The tensor's shards, if it was marked; laid out again if it was
    written more often than the `expected_writes` already counted in its
    version (AOTAutograd counts a graph's write to an input before the graph runs)."""
    entry = _entries.get(id(t))
    if entry is None or entry.tensor() is not t:
        return None
    if entry.version + expected_writes != t._version:
        entry.sharded = sf.mark_sharding(to_shardflow(t), entry.sharding.mesh, entry.sharding.spec)
        entry.version = t._version
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


def as_input(t: torch.Tensor, written: bool = False) -> tuple[sf.Tensor, sf.Sharding | None]:
    """What a compiled graph is fed for a torch tensor, and its sharding: its
    shards if marked. `written`: the graph writes t in place."""
    laid_out = sharded(t, expected_writes=1 if written else 0)
    if laid_out is not None:
        return laid_out, _entries[id(t)].sharding
    # A complex input is fed as its real view (the graph splits the parts).
    return to_shardflow(torch.view_as_real(t) if t.is_complex() else t), None
