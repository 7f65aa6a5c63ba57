"""Torch tensors laid out as shardflow shards.

An eager ``xs.mark_sharding(t, mesh, spec)`` keeps the tensor's data as device
shards (a sharded ``shardflow.Tensor``) here, keyed by the torch tensor. A
compiled graph takes that sharded tensor as its input as it is, so weights are
not split again on every call. The sharding stays with the tensor, as in
PyTorch/XLA: once the tensor was written in place (its ``_version`` moved on:
``load_state_dict``, a KV cache that AOTAutograd writes back) its new values
are laid out again with the same sharding. An entry is dropped when the torch
tensor is collected.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

import shardflow as sf


@dataclass
class _Entry:
    tensor: weakref.ref
    version: int
    sharded: sf.Tensor


_entries: dict[int, _Entry] = {}


def to_shardflow(t: torch.Tensor) -> sf.Tensor:
    """A torch CPU tensor as a shardflow tensor, without a copy (contiguous tensors)."""
    if t.device.type != "cpu":
        raise sf.Error(f"shardflow runs on CPU tensors; got a tensor on {t.device}")
    return sf.from_dlpack(t.detach())


def set_sharded(t: torch.Tensor, sharded: sf.Tensor) -> None:
    key = id(t)
    _entries[key] = _Entry(weakref.ref(t, lambda _: _entries.pop(key, None)), t._version, sharded)


def sharded(t: torch.Tensor) -> sf.Tensor | None:
    """The tensor's shards, if it was marked and not written since."""
    entry = _entries.get(id(t))
    if entry is None or entry.tensor() is not t:
        return None
    if entry.version != t._version:
        sharding = entry.sharded.sharding
        entry.sharded = sf.mark_sharding(to_shardflow(t), sharding.mesh, sharding.spec)
        entry.version = t._version
    return entry.sharded


def clear(t: torch.Tensor) -> None:
    _entries.pop(id(t), None)


def as_input(t: torch.Tensor) -> sf.Tensor:
    """What a compiled graph is fed for a torch tensor: its shards if marked."""
    laid_out = sharded(t)
    if laid_out is not None:
        return laid_out
    # A complex input is fed as its real view (the graph splits the parts).
    return to_shardflow(torch.view_as_real(t) if t.is_complex() else t)
