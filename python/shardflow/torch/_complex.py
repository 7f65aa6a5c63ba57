"""Complex tensors lowered to real ones, in PyTorch's own layout.

shardflow has no complex dtype. Meta's LLaMA rotary embedding uses
``view_as_complex``, ``polar``, a complex product and ``view_as_real``. A
complex64 value of shape S is kept as the f32 value of shape S + [2] that
``view_as_real`` shows (real and imaginary parts interleaved), so
``view_as_complex``, ``view_as_real`` and a complex graph input (fed as
``view_as_real`` of it) cost no op, and each move (view, slice, permute, ...)
is one op on the pairs. A complex product is the form ``shardflow llama``'s
rotary has, four ops over the data:

    a * b = a * (br, br) + swap(a) * (-bi, bi)

where swap exchanges the two parts of each pair; the two tables of b are
built once per b (a rotary table serves both q and k).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.fx

if TYPE_CHECKING:
    from ._lowering import Lowering, Ref


@dataclass(frozen=True)
class Interleaved:
    """A complex value: `ref` is its view_as_real (f32, a trailing dim of 2)."""

    ref: "Ref"


def f32_type(shape: Sequence[int]) -> str:
    return "f32[" + ",".join(str(int(d)) for d in shape) + "]"


def pairs_type(shape: Sequence[int]) -> str:
    """The IR type of a complex value of `shape`, as pairs."""
    return f32_type((*shape, 2))


def check_dtype(value: torch.Tensor) -> None:
    from ._lowering import LoweringError

    if value.dtype != torch.complex64:
        raise LoweringError(f"complex dtype {value.dtype} is not supported (complex64 is)")


def input_value(ref: "Ref", node: torch.fx.Node) -> tuple[str, Interleaved]:
    """A complex graph input, fed as view_as_real(input): its IR type and value."""
    check_dtype(node.meta["val"])
    return pairs_type(node.meta["val"].shape), Interleaved(ref)


def is_complex(lowering: "Lowering", node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor) and value.is_complex():
        return True
    return any(isinstance(lowering.values.get(a), Interleaved) for a in node.all_input_nodes)


def _dim(d: int, rank: int) -> int:
    """A dim of a complex value of `rank` dims, as a dim of its pairs (a
    negative dim counts from the complex value's end, not the pairs')."""
    return d + rank if d < 0 else d


# Moves: the same op on the pairs, with the arguments that name dims or
# sizes rewritten for the trailing pair dim. f(args after self, rank) -> args.
_MOVES = {
    torch.ops.aten.view.default: ("aten::reshape", lambda a, r: [[*a[0], 2]]),
    torch.ops.aten._unsafe_view.default: ("aten::reshape", lambda a, r: [[*a[0], 2]]),
    torch.ops.aten.reshape.default: ("aten::reshape", lambda a, r: [[*a[0], 2]]),
    torch.ops.aten.expand.default: ("aten::expand", lambda a, r: [[*a[0], 2], *a[1:]]),
    torch.ops.aten.slice.Tensor: ("aten::slice.Tensor", lambda a, r: [_dim(a[0], r), *a[1:]] if a else a),
    torch.ops.aten.select.int: ("aten::select.int", lambda a, r: [_dim(a[0], r), *a[1:]]),
    torch.ops.aten.squeeze.dim: ("aten::squeeze.dim", lambda a, r: [_dim(a[0], r)]),
    torch.ops.aten.unsqueeze.default: ("aten::unsqueeze", lambda a, r: [_dim(a[0], r + 1)]),
    torch.ops.aten.transpose.int: ("aten::transpose.int", lambda a, r: [_dim(a[0], r), _dim(a[1], r)]),
    torch.ops.aten.permute.default: ("aten::permute", lambda a, r: [[*(_dim(d, r) for d in a[0]), r]]),
    torch.ops.aten.index_select.default: ("aten::index_select", lambda a, r: [_dim(a[0], r), *a[1:]]),
}
_IDENTITIES = {torch.ops.aten.clone.default, torch.ops.aten.alias.default, torch.ops.aten._to_copy.default}


def lower(lowering: "Lowering", node: torch.fx.Node) -> Any:
    from ._lowering import LoweringError, source_line

    target, args = node.target, node.args
    value = node.meta.get("val")
    if target is torch.ops.aten.view_as_complex.default:
        check_dtype(value)
        return Interleaved(lowering.values[args[0]])
    if target is torch.ops.aten.view_as_real.default:
        return lowering.values[args[0]].ref
    if target is torch.ops.aten.polar.default:
        return _polar(lowering, node)
    if target in _IDENTITIES and value.dtype == torch.complex64:
        return lowering.values[args[0]]
    if target in _MOVES and isinstance(lowering.values.get(args[0]), Interleaved):
        check_dtype(value)
        op, rewrite = _MOVES[target]
        source = lowering.values[args[0]].ref
        rest = rewrite(lowering._arg(list(args[1:])), args[0].meta["val"].dim())
        # Each layer views the rotary table the same way: one view serves all
        # (and so do the factors built from it).
        key = ("move", op, source.name, repr(rest))
        if key not in lowering.complex_tables:
            lowering.complex_tables[key] = Interleaved(lowering.emit_op(node, op, [source, *rest],
                                                                        type_text=pairs_type(value.shape)))
        return lowering.complex_tables[key]
    if target is torch.ops.aten.mul.Tensor and not node.kwargs:
        check_dtype(value)
        return _product(lowering, node, *args)
    if target in (torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor) and len(args) == 2 and not node.kwargs:
        a, b = (lowering.values.get(x) for x in args)
        if isinstance(a, Interleaved) and isinstance(b, Interleaved):
            check_dtype(value)
            op = "aten::add.Tensor" if target is torch.ops.aten.add.Tensor else "aten::sub.Tensor"
            return Interleaved(lowering.emit_op(node, op, [a.ref, b.ref], type_text=pairs_type(value.shape)))
    raise LoweringError(f"{node.target} on complex tensors has no lowering to real ops (at {source_line(node)})")


def _polar(lowering: "Lowering", node: torch.fx.Node) -> Interleaved:
    """polar(abs, angle) = (abs cos(angle), abs sin(angle))."""
    magnitude, angle = (lowering.values[a] for a in node.args[:2])
    shape = node.meta["val"].shape
    part = f32_type(shape)
    parts = []
    for function, name in (("cos", "re"), ("sin", "im")):
        factor = lowering.emit_op(node, f"aten::{function}", [angle], type_text=part, hint=function)
        parts.append(lowering.emit_op(node, "aten::mul.Tensor", [magnitude, factor], type_text=part, hint=name))
    return Interleaved(lowering.emit_op(node, "aten::stack", [parts, -1], type_text=pairs_type(shape)))


def _product(lowering: "Lowering", node: torch.fx.Node, x: Any, y: Any) -> Interleaved:
    from ._lowering import DTYPES, LoweringError, _tensor_type, source_line

    shape = node.meta["val"].shape
    a, b = (lowering.values.get(v, v) if isinstance(v, torch.fx.Node) else v for v in (x, y))
    if not isinstance(a, Interleaved):
        (a, x), (b, y) = (b, y), (a, x)
    if isinstance(b, complex):
        raise LoweringError(f"a complex tensor times the complex number {b} has no lowering to real ops "
                            f"(at {source_line(node)}); multiply by a complex tensor instead")
    if isinstance(b, (int, float)):  # complex times a real number
        return Interleaved(lowering.emit_op(node, "aten::mul.Scalar", [a.ref, b], type_text=pairs_type(shape)))
    if not isinstance(b, Interleaved):  # complex times a real tensor (of any real dtype): each part times it
        real = y.meta["val"]
        column = lowering.emit_op(node, "aten::unsqueeze", [b, -1],
                                  type_text=_tensor_type(DTYPES[real.dtype], (*real.shape, 1)), hint="column")
        return Interleaved(lowering.emit_op(node, "aten::mul.Tensor", [a.ref, column], type_text=pairs_type(shape)))
    if x.meta["val"].numel() < y.meta["val"].numel():  # b: the smaller, the table a rotary broadcasts
        (a, x), (b, y) = (b, y), (a, x)
    b_real, b_signed = _tables(lowering, node, b, y.meta["val"].shape)
    a_shape = x.meta["val"].shape
    swapped = lowering.emit_op(node, "aten::index_select", [a.ref, -1, _swap_index(lowering, node)],
                               type_text=pairs_type(a_shape), hint="swapped")
    return Interleaved(lowering.emit_op(node, "aten::add.Tensor", [
        lowering.emit_op(node, "aten::mul.Tensor", [a.ref, b_real], type_text=pairs_type(shape), hint="by_re"),
        lowering.emit_op(node, "aten::mul.Tensor", [swapped, b_signed], type_text=pairs_type(shape), hint="by_im"),
    ], type_text=pairs_type(shape)))


def _tables(lowering: "Lowering", node: torch.fx.Node, b: Interleaved, shape: Sequence[int]) -> tuple["Ref", "Ref"]:
    """(br, br) and (-bi, bi): b's factors in a product, built once per b
    (whole pairs: a factor broadcast along the pairs would make the product
    a loop over rows of two)."""
    key = ("factors", b.ref.name)
    if key not in lowering.complex_tables:
        column, pairs = f32_type((*shape, 1)), pairs_type(shape)
        real = lowering.emit_op(node, "aten::slice.Tensor", [b.ref, -1, 0, 1], type_text=column, hint="re")
        imag = lowering.emit_op(node, "aten::slice.Tensor", [b.ref, -1, 1, 2], type_text=column, hint="im")
        negated = lowering.emit_op(node, "aten::neg", [imag], type_text=column, hint="neg_im")
        lowering.complex_tables[key] = (
            lowering.emit_op(node, "aten::cat", [[real, real], -1], type_text=pairs, hint="real_pairs"),
            lowering.emit_op(node, "aten::cat", [[negated, imag], -1], type_text=pairs, hint="signed_im"))
    return lowering.complex_tables[key]


def _swap_index(lowering: "Lowering", node: torch.fx.Node) -> "Ref":
    """[1, 0]: index_select with it swaps the parts of each pair (one per graph)."""
    if "swap" not in lowering.complex_tables:
        lowering.complex_tables["swap"] = lowering.emit_op(node, "aten::arange.start_step", [1, -1, -1],
                                                           type_text="i64[2]", hint="pair_swap")
    return lowering.complex_tables["swap"]
