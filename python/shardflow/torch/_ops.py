"""The sharding annotation as PyTorch custom ops.

``xla::dynamo_mark_sharding`` is PyTorch/XLA's op, registered here when nothing
has defined it yet (torch_xla not loaded), with the seed's schema as the
default overload and PyTorch/XLA >= 2.5's ``int[] mesh_shape`` form as the
overload ``int_mesh``. ``shardflow::mark_sharding_by_tensor_ids`` carries device
ids that are a tensor while Dynamo traces (``torch.arange(n)`` in ``forward``):
the bridge computes them when it lowers the graph, so no graph break is needed.

All three are the identity on values. Each has a fake implementation (Dynamo
and AOTAutograd trace them without a graph break), an eager one that lays the
tensor out as shards, and is marked as having a side effect so that a call
whose result is ignored survives dead-code elimination: as in PyTorch/XLA, the
annotation applies to the value passed in.
"""

from __future__ import annotations

import ast

import torch
import torch.fx

SEED_SCHEMA = ("dynamo_mark_sharding(Tensor t, int[] device_ids, str mesh_shape, str axis_names, "
               "str partition_spec) -> Tensor")
INT_MESH_SCHEMA = ("dynamo_mark_sharding.int_mesh(Tensor input, int[] device_ids, int[] mesh_shape, "
                   "str axis_names, str partition_spec) -> Tensor")
TENSOR_IDS_SCHEMA = ("mark_sharding_by_tensor_ids(Tensor t, Tensor device_ids, str mesh_shape, str axis_names, "
                     "str partition_spec) -> Tensor")

_libraries: list[torch.library.Library] = []  # kept alive: a Library deregisters when collected


def _defined(qualified: str) -> bool:
    namespace, name = qualified.split("::")
    return hasattr(getattr(torch.ops, namespace), name)


def _eager(t: torch.Tensor, device_ids, mesh_shape, axis_names: str, partition_spec: str) -> torch.Tensor:
    from . import spmd  # the same code as xs.mark_sharding

    if isinstance(device_ids, torch.Tensor):
        device_ids = device_ids.tolist()
    shape = _literal(mesh_shape) if isinstance(mesh_shape, str) else tuple(mesh_shape)
    mesh = spmd.Mesh(list(device_ids), shape, _literal(axis_names))
    spec = _literal(partition_spec)
    spmd.mark_sharding(t, mesh, spec)
    result = t.clone()  # a custom op's result may not alias its input
    spmd.mark_sharding(result, mesh, spec)
    return result


def _literal(text: str):
    """The op's string arguments are Python literals ("(4, 2)", "('x', 'y')", "None")."""
    return ast.literal_eval(text)


def _fake(t: torch.Tensor, *args) -> torch.Tensor:
    return torch.empty_like(t)


def _register(namespace: str, schemas: list[str]) -> None:
    library = torch.library.Library(namespace, "FRAGMENT")
    _libraries.append(library)
    for schema in schemas:
        library.define(schema)
        name = schema.split("(", 1)[0]
        qualified = f"{namespace}::{name}"
        torch.library.impl(qualified, "CompositeExplicitAutograd", lib=library)(_eager)
        torch.library.register_fake(qualified, lib=library)(_fake)
        overload = name.split(".")[1] if "." in name else "default"
        op = getattr(getattr(torch.ops, namespace), name.split(".")[0])
        torch.fx.node.has_side_effect(getattr(op, overload))


def register() -> None:
    """Defines the ops once per process (the xla ones only if torch_xla has not)."""
    if not _defined("xla::dynamo_mark_sharding"):
        _register("xla", [SEED_SCHEMA, INT_MESH_SCHEMA])
    if not _defined("shardflow::mark_sharding_by_tensor_ids"):
        _register("shardflow", [TENSOR_IDS_SCHEMA])


register()

ANNOTATIONS = {
    torch.ops.xla.dynamo_mark_sharding.default,
    torch.ops.shardflow.mark_sharding_by_tensor_ids.default,
}
if hasattr(torch.ops.xla.dynamo_mark_sharding, "int_mesh"):
    ANNOTATIONS.add(torch.ops.xla.dynamo_mark_sharding.int_mesh)
