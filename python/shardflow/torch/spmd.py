"""PyTorch/XLA's ``torch_xla.distributed.spmd`` API (``xs``) on shardflow.

    import shardflow.torch.spmd as xs
    mesh = xs.Mesh(np.arange(8), (4, 1, 2), ("data", "fsdp", "model"))
    xs.mark_sharding(model.wq.weight, mesh, ("model", "fsdp"))   # eager: laid out as device shards
    ...
    def forward(self, x):                                          # inside torch.compile(backend="shardflow")
        mesh = xs.Mesh(torch.arange(xr.global_runtime_device_count()), (4, 1, 2))
        xs.mark_sharding(out, mesh, (0, 1, 2))                    # recorded as xla::dynamo_mark_sharding

``mark_sharding`` is one function for eager and compiled code. Meshes and
specs are checked with PyTorch/XLA's rules and messages (errors are
``shardflow.InvalidShardingError``, a ``ValueError`` and ``AssertionError``).
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

import numpy as np
import torch

import shardflow as sf

from . import _ops, _state
from . import runtime as xr

PartitionSpecLike = Sequence[Any]
_MAX_MESH_AXES = 64  # the most axes a mesh has


class Mesh:
    """A logical device mesh: ``Mesh(device_ids, mesh_shape, axis_names=None)``.

    ``device_ids`` may be a list, tuple, range, NumPy array or torch tensor
    (``torch.arange(n)`` inside a compiled ``forward`` is fine: the ids are
    computed when the graph is lowered). Outside compiled code the mesh is
    validated at once, as PyTorch/XLA does.
    """

    def __init__(self, device_ids: Any, mesh_shape: Sequence[int], axis_names: Sequence[str] | None = None):
        self.mesh_shape = tuple(mesh_shape)
        self.axis_names = None if axis_names is None else tuple(axis_names)
        if torch.compiler.is_compiling():
            # Plain attribute stores only: Dynamo traces this without a break.
            self._ids = device_ids
            return
        core = sf.Mesh(device_ids, self.mesh_shape, self.axis_names)
        self._ids = core.device_ids

    @property
    def device_ids(self) -> np.ndarray:
        """The device ids, flat, as a NumPy array (as PyTorch/XLA keeps them)."""
        return np.asarray(self._ids if not isinstance(self._ids, torch.Tensor) else self._ids.tolist())

    def _core(self) -> sf.Mesh:
        ids = self._ids.tolist() if isinstance(self._ids, torch.Tensor) else self._ids
        return sf.Mesh(ids, self.mesh_shape, self.axis_names)

    def size(self) -> int:
        return int(np.prod(self.mesh_shape))

    def shape(self) -> collections.OrderedDict:
        names = self.axis_names if self.axis_names is not None else range(len(self.mesh_shape))
        return collections.OrderedDict(zip(names, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> int | None:
        if self.axis_names is None:
            raise sf.InvalidShardingError("argument of type 'NoneType' is not iterable")
        return self.axis_names.index(name) if name in self.axis_names else None

    @classmethod
    def from_str(cls, text: str) -> "Mesh | None":
        core = sf.Mesh.from_str(text)
        return cls(core.device_ids, core.mesh_shape, core.axis_names)

    def __str__(self) -> str:
        return str(self._core())

    def __repr__(self) -> str:
        return f"Mesh({list(self.device_ids)}, {self.mesh_shape}, {self.axis_names})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))


_global_mesh: Mesh | None = None


def set_global_mesh(mesh: Mesh) -> None:
    global _global_mesh
    _global_mesh = mesh


def get_global_mesh() -> Mesh | None:
    return _global_mesh


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """All devices on one axis: mesh (N,) with ids 0..N-1."""
    count = xr.global_runtime_device_count()
    return Mesh(np.arange(count), (count,), None if axis_name is None else (axis_name,))


def _entry_text(entry: Any) -> str:
    if entry is None:
        return "None"
    if isinstance(entry, str):
        return repr(entry)
    if isinstance(entry, (tuple, list)):
        items = [_entry_text(e) for e in entry]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return str(_static_int(entry))


def _static_int(value: Any) -> int:
    """An axis index as a plain int. Dynamo turns an int that changed between
    calls into a symbolic one, which str() cannot print without a graph break;
    comparing it with constants specialises it again (under a guard)."""
    if not torch.compiler.is_compiling():
        return int(value)
    for candidate in range(-_MAX_MESH_AXES, _MAX_MESH_AXES):
        if value == candidate:
            return candidate
    return int(value)



def _spec_text(partition_spec: PartitionSpecLike) -> str:
    """str(tuple(partition_spec)), as PyTorch/XLA serialises it for the op."""
    return _entry_text(tuple(partition_spec))


def mark_sharding(t: torch.Tensor, mesh: Mesh, partition_spec: PartitionSpecLike) -> torch.Tensor:
    """Annotates ``t``: eagerly its data is laid out as device shards; inside
    ``torch.compile`` the annotation is recorded as ``xla::dynamo_mark_sharding``.
    Returns the tensor (inside compiled code: the annotated value; using ``t``
    afterwards is the same, the annotation applies to ``t``)."""
    if torch.compiler.is_compiling():
        ids = mesh._ids
        names = str(mesh.axis_names)
        shape_text = str(mesh.mesh_shape)
        if isinstance(ids, (torch.Tensor, np.ndarray)):
            return torch.ops.shardflow.mark_sharding_by_tensor_ids(t, torch.as_tensor(ids), shape_text, names,
                                                                   _spec_text(partition_spec))
        return torch.ops.xla.dynamo_mark_sharding(t, [int(i) for i in ids], shape_text, names,
                                                  _spec_text(partition_spec))
    core = mesh._core()
    if len(tuple(partition_spec)) != t.dim():
        raise sf.InvalidShardingError(f"Partition spec length ({len(tuple(partition_spec))}) should be equal to "
                                      f"the input rank ({t.dim()}).")
    laid_out = _state.sharded(t)
    if laid_out is None:
        laid_out = _state.to_shardflow(t)
    laid_out = sf.mark_sharding(laid_out, core, tuple(partition_spec))
    _state.set_sharded(t, laid_out)
    return t


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Forgets the eager layout of ``t`` (its values are the torch tensor's)."""
    _state.clear(t)
    return t


def get_sharding(t: torch.Tensor) -> sf.Sharding | None:
    """The sharding ``t`` was laid out with eagerly, or None."""
    return _state.sharding_of(t)


def visualize_tensor_sharding(t: torch.Tensor, use_color: bool = False) -> str:
    """Prints (and returns) which device holds which block of ``t``, for any rank."""
    del use_color  # text only
    sharding = get_sharding(t)
    if sharding is None:
        text = f"tensor of shape {tuple(t.shape)} is not sharded: every device holds all of it"
    else:
        text = f"{sharding.v1}\n{sharding.draw(tuple(t.shape))}"
    print(text)
    return text


__all__ = ["Mesh", "mark_sharding", "clear_sharding", "get_1d_mesh", "set_global_mesh", "get_global_mesh",
           "visualize_tensor_sharding", "get_sharding"]
assert _ops.ANNOTATIONS  # the custom ops are registered with this module
