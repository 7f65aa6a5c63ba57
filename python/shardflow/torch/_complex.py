"""Complex tensors lowered to pairs of real ones.

shardflow has no complex dtype. Meta's LLaMA rotary embedding uses
``view_as_complex``, ``polar``, a complex product and ``view_as_real``; each
complex value becomes its real and imaginary parts (two f32 IR values of the
complex tensor's shape), and each op on it the same op on both parts (moves)
or its formula in real arithmetic (products, ``polar``). A complex graph
input is fed as ``view_as_real`` of it (one f32 input with a trailing 2,
without a copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

if TYPE_CHECKING:
    from ._lowering import Lowering, Ref


@dataclass(frozen=True)
class ComplexPair:
    real: "Ref"
    imag: "Ref"


def part_type(value: torch.Tensor) -> str:
    """The IR type of each part of a complex64 tensor."""
    from ._lowering import LoweringError

    if value.dtype != torch.complex64:
        raise LoweringError(f"complex dtype {value.dtype} is not supported (complex64 is)")
    return "f32[" + ",".join(str(int(d)) for d in value.shape) + "]"


def split_input(lowering: "Lowering", ref: "Ref", node: torch.fx.Node) -> ComplexPair:
    """A complex input, fed as view_as_real(input): its two parts."""
    kind = part_type(node.meta["val"])
    return ComplexPair(*(lowering.emit_op(node, "aten::select.int", [ref, -1, i], type_text=kind,
                                          hint=f"{node.name}_{part}") for i, part in enumerate(("re", "im"))))


def is_complex(lowering: "Lowering", node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor) and value.is_complex():
        return True
    return any(isinstance(lowering.values.get(a), ComplexPair) for a in node.all_input_nodes)


# Ops that move elements (the same on both parts), by their IR name.
_MOVES = {
    torch.ops.aten.view.default: "aten::reshape",
    torch.ops.aten._unsafe_view.default: "aten::reshape",
    torch.ops.aten.reshape.default: "aten::reshape",
    torch.ops.aten.slice.Tensor: "aten::slice.Tensor",
    torch.ops.aten.select.int: "aten::select.int",
    torch.ops.aten.unsqueeze.default: "aten::unsqueeze",
    torch.ops.aten.squeeze.dim: "aten::squeeze.dim",
    torch.ops.aten.permute.default: "aten::permute",
    torch.ops.aten.transpose.int: "aten::transpose.int",
    torch.ops.aten.expand.default: "aten::expand",
    torch.ops.aten.index_select.default: "aten::index_select",
}
_IDENTITIES = {torch.ops.aten.clone.default, torch.ops.aten.alias.default, torch.ops.aten._to_copy.default}


def lower(lowering: "Lowering", node: torch.fx.Node) -> Any:
    from ._lowering import LoweringError, source_line

    target, args = node.target, node.args
    value = node.meta.get("val")
    if target is torch.ops.aten.view_as_complex.default:
        real = lowering.values[args[0]]
        kind = part_type(value)
        return ComplexPair(*(lowering.emit_op(node, "aten::select.int", [real, -1, i], type_text=kind,
                                              hint=f"{node.name}_{part}") for i, part in enumerate(("re", "im"))))
    if target is torch.ops.aten.view_as_real.default:
        pair = lowering.values[args[0]]
        return lowering.emit_op(node, "aten::stack", [[pair.real, pair.imag], -1])
    if target is torch.ops.aten.polar.default:
        magnitude, angle = lowering.values[args[0]], lowering.values[args[1]]
        kind = part_type(value)
        cos = lowering.emit_op(node, "aten::cos", [angle], type_text=kind, hint="cos")
        sin = lowering.emit_op(node, "aten::sin", [angle], type_text=kind, hint="sin")
        return ComplexPair(lowering.emit_op(node, "aten::mul.Tensor", [magnitude, cos], type_text=kind, hint="re"),
                           lowering.emit_op(node, "aten::mul.Tensor", [magnitude, sin], type_text=kind, hint="im"))
    if target in _IDENTITIES and value.dtype == torch.complex64:
        return lowering.values[args[0]]
    if target in _MOVES:
        pair = lowering.values[args[0]]
        kind = part_type(value)
        rest = lowering._arg(list(args[1:]))
        return ComplexPair(*(lowering.emit_op(node, _MOVES[target], [part, *rest], type_text=kind, hint=name)
                             for part, name in ((pair.real, "re"), (pair.imag, "im"))))
    if target is torch.ops.aten.mul.Tensor:
        return _product(lowering, node, lowering.values.get(args[0], args[0]), lowering.values.get(args[1], args[1]))
    if target in (torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor) and len(args) == 2 and not node.kwargs:
        a, b = (lowering.values[a] for a in args)
        if isinstance(a, ComplexPair) and isinstance(b, ComplexPair):
            op, kind = "aten::add.Tensor" if target is torch.ops.aten.add.Tensor else "aten::sub.Tensor", part_type(value)
            return ComplexPair(lowering.emit_op(node, op, [a.real, b.real], type_text=kind, hint="re"),
                               lowering.emit_op(node, op, [a.imag, b.imag], type_text=kind, hint="im"))
    raise LoweringError(f"{node.target} on complex tensors has no lowering to real ops (at {source_line(node)})")


def _product(lowering: "Lowering", node: torch.fx.Node, a: Any, b: Any) -> ComplexPair:
    kind = part_type(node.meta["val"])

    def mul(x: Any, y: Any, hint: str) -> "Ref":
        if isinstance(y, (int, float)):
            return lowering.emit_op(node, "aten::mul.Scalar", [x, y], type_text=kind, hint=hint)
        return lowering.emit_op(node, "aten::mul.Tensor", [x, y], type_text=kind, hint=hint)

    if not isinstance(a, ComplexPair):
        a, b = b, a
    if not isinstance(b, ComplexPair):  # complex times real
        return ComplexPair(mul(a.real, b, "re"), mul(a.imag, b, "im"))
    # (ar + i ai)(br + i bi) = (ar br - ai bi) + i (ar bi + ai br)
    real = lowering.emit_op(node, "aten::sub.Tensor", [mul(a.real, b.real, "rr"), mul(a.imag, b.imag, "ii")],
                            type_text=kind, hint="re")
    imag = lowering.emit_op(node, "aten::add.Tensor", [mul(a.real, b.imag, "ri"), mul(a.imag, b.real, "ir")],
                            type_text=kind, hint="im")
    return ComplexPair(real, imag)
