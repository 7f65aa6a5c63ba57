"""aten ops shardflow has no kernel for, written in ops it has.

AOTAutograd applies this table while it traces a graph, so the lowering only
sees what the functions below emit. PyTorch's own decompositions mostly produce
prims (prims::var, prims::rev, copy_to, ...) that shardflow lacks too; these
produce ops it has, each with its sharding rule, so a sharded input stays
sharded through them. Each is checked against eager PyTorch on sharded inputs
(tests/python/test_torch_decompositions.py). An op neither here nor in
shardflow's op set is still a LoweringError naming it and the source line.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
from torch._decomp import get_decompositions

import shardflow as sf

from ._lowering import _ir_name

aten = torch.ops.aten

DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {}

# The few ops whose PyTorch decompositions produce ops shardflow has.
TORCH_DECOMPOSED = [aten.addcmul.default, aten.leaky_relu.default, aten.glu.default, aten.linalg_vector_norm.default,
                    aten.repeat.default, aten.index_add.default]


def table() -> dict[torch._ops.OpOverload, Callable]:
    """What AOTAutograd decomposes for the backend: the ops above and those
    below, except any shardflow has a kernel (and sharding rule) for."""
    have = sf.op_schemas()
    both = {**get_decompositions(TORCH_DECOMPOSED), **DECOMPOSITIONS}
    return {op: fn for op, fn in both.items() if isinstance(op, torch._ops.OpOverload) and _ir_name(op) not in have}


def _decomposes(*ops: torch._ops.OpOverload):
    """Registers fn for ops. Its tensor results are made contiguous, as the
    kernels it stands for return them: a later .view() in the user's code
    sees the strides it would eagerly (in shardflow the copy is free: clone
    lowers to nothing, its tensors have no strides)."""
    def register(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def contiguous_results(*args, **kwargs):
            return _contiguous(fn(*args, **kwargs))
        for op in ops:
            DECOMPOSITIONS[op] = contiguous_results
        return fn
    return register


def _contiguous(result):
    if isinstance(result, torch.Tensor):
        channels_last = result.dim() == 4 and result.is_contiguous(memory_format=torch.channels_last)
        return result if channels_last else result.contiguous()  # channels_last: see _in_layout_of
    if isinstance(result, (tuple, list)):
        return type(result)(_contiguous(r) for r in result)
    return result  # NotImplemented: the op stays


def _in_layout_of(x: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """result in x's memory format, as PyTorch's convolution and pooling
    kernels return it: channels_last for a channels_last 4-D input (which a
    transposed [N, L, C] input of a 1-D pool becomes), else contiguous."""
    if x.dim() == 4 and result.dim() == 4 and not x.is_contiguous() \
            and x.is_contiguous(memory_format=torch.channels_last):
        return result.contiguous(memory_format=torch.channels_last)
    return result.contiguous()


def _dims(x: torch.Tensor, dim) -> list[int]:
    """The reduced dims, each in [0, rank); None or [] reduce them all (as var/std do)."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % max(x.dim(), 1) for d in dims]


def _scalar(value, like: torch.Tensor) -> torch.Tensor:
    return aten.full.default([], value, dtype=torch.result_type(like, value))


# Variance: mean, squared deviations, sum, divided by N - correction (as
# PyTorch, a non-positive divisor gives inf or nan).
def _var(x: torch.Tensor, dim, correction, keepdim: bool) -> torch.Tensor:
    dims = _dims(x, dim)
    count = math.prod(x.shape[d] for d in dims)
    deviation = x - aten.mean.dim(x, dims, True)
    squares = aten.sum.dim_IntList(deviation * deviation, dims, keepdim)
    return squares / (count - (1 if correction is None else correction))


@_decomposes(aten.var.correction)
def _var_correction(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)


@_decomposes(aten.std.correction)
def _std_correction(x, dim=None, *, correction=None, keepdim=False):
    return aten.sqrt.default(_var(x, dim, correction, keepdim))


@_decomposes(aten.var_mean.correction)
def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim), aten.mean.dim(x, _dims(x, dim), keepdim)


@_decomposes(aten.std_mean.correction)
def _std_mean(x, dim=None, *, correction=None, keepdim=False):
    return aten.sqrt.default(_var(x, dim, correction, keepdim)), aten.mean.dim(x, _dims(x, dim), keepdim)


# Clamps, by numbers or tensors: maximum and minimum, which keep a NaN as clamp does.
def _bound(value, like: torch.Tensor) -> torch.Tensor:
    return value if torch.is_tensor(value) else _scalar(value, like)


@_decomposes(aten.clamp.default, aten.clamp.Tensor)
def _clamp(x, min=None, max=None):
    if min is not None:
        x = aten.maximum.default(x, _bound(min, x))
    if max is not None:
        x = aten.minimum.default(x, _bound(max, x))
    return x


@_decomposes(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(x, min):
    return _clamp(x, min, None)


@_decomposes(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(x, max):
    return _clamp(x, None, max)


@_decomposes(aten.hardtanh.default)
def _hardtanh(x, min_val=-1, max_val=1):
    return _clamp(x, min_val, max_val)


@_decomposes(aten.hardsigmoid.default)
def _hardsigmoid(x):
    return _clamp(x + 3, 0, 6) / 6


@_decomposes(aten.hardswish.default)
def _hardswish(x):
    return x * _clamp(x + 3, 0, 6) / 6


@_decomposes(aten.elu.default)
def _elu(x, alpha=1, scale=1, input_scale=1):
    return aten.where.self(x > 0, x * scale, (aten.exp.default(x * input_scale) - 1) * (alpha * scale))


@_decomposes(aten.softplus.default)
def _softplus(x, beta=1, threshold=20):
    scaled = x * beta
    return aten.where.self(scaled > threshold, x, aten.log.default(aten.exp.default(scaled) + 1) / beta)


@_decomposes(aten.mish.default)
def _mish(x):
    return x * aten.tanh.default(_softplus(x))


@_decomposes(aten.sign.default)
def _sign(x):
    # A NaN's sign is 0 in PyTorch: neither comparison holds for it.
    if x.dtype == torch.bool:
        return x
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


@_decomposes(aten.nan_to_num.default)
def _nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not x.is_floating_point():
        return x
    info = torch.finfo(x.dtype)
    x = aten.where.self(x != x, _scalar(0.0 if nan is None else nan, x), x)
    x = aten.where.self(x == math.inf, _scalar(info.max if posinf is None else posinf, x), x)
    return aten.where.self(x == -math.inf, _scalar(info.min if neginf is None else neginf, x), x)


@_decomposes(aten.logsumexp.default)
def _logsumexp(x, dim, keepdim=False):
    dims = _dims(x, dim)
    top = aten.amax.default(x, dims, True)
    # An all -inf (or +inf) row: subtracting its max would give nan.
    top = aten.where.self(aten.abs.default(top) == math.inf, _scalar(0.0, top), top)
    total = aten.log.default(aten.sum.dim_IntList(aten.exp.default(x - top), dims, True)) + top
    return total if keepdim else aten.reshape.default(total, [n for d, n in enumerate(x.shape) if d not in dims])


# max/min along a dim: the values reduce, the indices are argmax's (the
# first extreme, as PyTorch's; a NaN counts as the extreme in both).
@_decomposes(aten.max.dim)
def _max_dim(x, dim, keepdim=False):
    return aten.amax.default(x, [dim], keepdim), aten.argmax.default(x, dim, keepdim)


@_decomposes(aten.min.dim)
def _min_dim(x, dim, keepdim=False):
    return aten.amin.default(x, [dim], keepdim), aten.argmax.default(-x, dim, keepdim)


@_decomposes(aten.max.default)
def _max(x):
    return aten.amax.default(x, list(range(x.dim())), False)


@_decomposes(aten.min.default)
def _min(x):
    return aten.amin.default(x, list(range(x.dim())), False)


@_decomposes(aten.flip.default)
def _flip(x, dims):
    for d in [] if len(dims) == 0 else _dims(x, dims):
        reversed_positions = aten.arange.start_step(x.shape[d] - 1, -1, -1, dtype=torch.int64)
        x = aten.index_select.default(x, d, reversed_positions)
    return x


@_decomposes(aten.roll.default)
def _roll(x, shifts, dims=()):
    if len(dims) == 0:  # the flattened tensor, rolled, in the original shape
        return aten.reshape.default(_roll(aten.reshape.default(x, [-1]), shifts, [0]), list(x.shape))
    for shift, d in zip(shifts, _dims(x, dims)):
        size = x.shape[d]
        shift = shift % size if size else 0
        if shift:
            tail, head = aten.slice.Tensor(x, d, size - shift, size), aten.slice.Tensor(x, d, 0, size - shift)
            x = aten.cat.default([tail, head], d)
    return x


@_decomposes(aten.constant_pad_nd.default)
def _constant_pad_nd(x, pad, value=0):
    # pad: (before, after) pairs from the last dim backwards; negative cuts.
    for pair in range(len(pad) // 2):
        d = x.dim() - 1 - pair
        before, after = pad[2 * pair], pad[2 * pair + 1]
        size = x.shape[d]
        x = aten.slice.Tensor(x, d, max(-before, 0), size - max(-after, 0))
        parts = []
        for width in (max(before, 0), None, max(after, 0)):
            if width is None:
                parts.append(x)
            elif width:
                shape = list(x.shape)
                shape[d] = width
                parts.append(aten.full.default(shape, value, dtype=x.dtype))
        x = aten.cat.default(parts, d) if len(parts) > 1 else x
    return x


@_decomposes(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    # Channels are dim 1: the statistics broadcast over the others.
    shape = [1, -1] + [1] * (x.dim() - 2)
    out = (x - aten.reshape.default(running_mean, shape)) * aten.reshape.default(
        aten.rsqrt.default(running_var + eps), shape)
    if weight is not None:
        out = out * aten.reshape.default(weight, shape)
    if bias is not None:
        out = out + aten.reshape.default(bias, shape)
    empty = aten.zeros.default([0], dtype=x.dtype)
    return out, empty, empty


@_decomposes(aten.native_group_norm.default)
def _group_norm(x, weight, bias, batch, channels, spatial, groups, eps):
    grouped = aten.reshape.default(x, [batch, groups, -1])
    mean = aten.mean.dim(grouped, [2], True)
    deviation = grouped - mean
    variance = aten.mean.dim(deviation * deviation, [2], True)
    rstd = aten.rsqrt.default(variance + eps)
    out = aten.reshape.default(deviation * rstd, list(x.shape))
    shape = [1, -1] + [1] * (x.dim() - 2)
    if weight is not None:
        out = out * aten.reshape.default(weight, shape)
    if bias is not None:
        out = out + aten.reshape.default(bias, shape)
    return out, aten.reshape.default(mean, [batch, groups]), aten.reshape.default(rstd, [batch, groups])


@_decomposes(aten.lerp.Scalar)
def _lerp(start, end, weight):
    # PyTorch's two forms, each exact at its end of [0, 1].
    if abs(weight) < 0.5:
        return start + (end - start) * weight
    return end - (end - start) * (1 - weight)


def _running(x, dim, dtype, combine, identity):
    """The running sums or products along dim (integers and bools in int64,
    as PyTorch's) in log2(n) shifted steps: each position combines the one
    1, 2, 4, ... before it. Exact for integers; for floats the terms group
    in another order than a sequential scan, within rounding of it."""
    if dtype is not None:
        x = x.to(dtype)
    elif not x.is_floating_point():
        x = x.to(torch.int64)
    d = dim % max(x.dim(), 1)
    size = x.shape[d] if x.dim() else 1
    shift = 1
    while shift < size:
        shape = list(x.shape)
        shape[d] = shift
        padding = aten.full.default(shape, identity, dtype=x.dtype)
        x = combine(x, aten.cat.default([padding, aten.slice.Tensor(x, d, 0, size - shift)], d))
        shift *= 2
    return x


@_decomposes(aten.cumsum.default)
def _cumsum(x, dim, *, dtype=None):
    return _running(x, dim, dtype, torch.add, 0)


@_decomposes(aten.cumprod.default)
def _cumprod(x, dim, *, dtype=None):
    return _running(x, dim, dtype, torch.mul, 1)


@_decomposes(aten.frac.default)
def _frac(x):
    return x - aten.trunc.default(x)


@_decomposes(aten.logaddexp.default)
def _logaddexp(a, b):
    top = aten.maximum.default(a, b)
    out = top + aten.log1p.default(aten.exp.default(-aten.abs.default(a - b)))
    # Equal infinities: a - b is nan, and the sum is that infinity.
    return aten.where.self(a == b, aten.where.self(aten.abs.default(a) == math.inf, a, out), out)


@_decomposes(aten.round.decimals)
def _round_decimals(x, *, decimals=0):
    # As PyTorch's kernel: scaled by 10^|decimals| up (or down), rounded, scaled back.
    scale = 10.0 ** abs(decimals)
    if decimals == 0:
        return aten.round.default(x)
    if decimals > 0:
        return aten.round.default(x * scale) / scale
    return aten.round.default(x / scale) * scale


# Sorting is topk of every element: stable (among equal values the earlier
# position first) and NaN as the largest value, as PyTorch's sort on CPU.
@_decomposes(aten.sort.default)
def _sort(x, dim=-1, descending=False):
    size = x.shape[dim] if x.dim() else 1
    return aten.topk.default(x, size, dim, descending, True)


@_decomposes(aten.sort.stable)
def _sort_stable(x, *, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)


@_decomposes(aten.argsort.default)
def _argsort(x, dim=-1, descending=False):
    return _sort(x, dim, descending)[1]


@_decomposes(aten.argsort.stable)
def _argsort_stable(x, *, stable=False, dim=-1, descending=False):
    return _sort(x, dim, descending)[1]


# Order statistics: the element at a position of the sorted dim (NaN sorts
# last). median is the lower middle, NaN when the dim holds one (with the
# first NaN's index, as PyTorch); nanmedian the lower middle of the values
# that are not NaN. Among equal values (and NaNs) the index is the stable
# sort's, which PyTorch leaves unspecified (its CPU kernel may name another
# position of the same value).
def _at_sorted_position(x, position, dim: int, keepdim: bool):
    """(values, indices) at `position` (an int, or a tensor with x's shape
    but 1 at dim) of x sorted along dim."""
    values, indices = _sort(x, dim)
    if isinstance(position, int):
        position = aten.full.default([*x.shape[:dim], 1, *x.shape[dim + 1:]], position, dtype=torch.int64)
    picked = aten.gather.default(values, dim, position), aten.gather.default(indices, dim, position)
    return picked if keepdim else tuple(aten.squeeze.dim(t, dim) for t in picked)


def _as_rows(x, dim):
    """x with at least one dim, and dim in [0, rank)."""
    return (x.reshape(1), 0) if x.dim() == 0 else (x, dim % x.dim())


def _restore_rank(results, x):
    """Results of a 0-dim x's one row (see _as_rows) back to 0 dims."""
    return tuple(t.reshape([]) for t in results) if x.dim() == 0 else results


@_decomposes(aten.kthvalue.default)
def _kthvalue(x, k, dim=-1, keepdim=False):
    rows, d = _as_rows(x, dim)
    return _restore_rank(_at_sorted_position(rows, k - 1, d, keepdim), x)


def _nan_counts(x, dim: int):
    return aten.sum.dim_IntList((x != x).to(torch.int64), [dim], True)


@_decomposes(aten.median.dim)
def _median_dim(x, dim=-1, keepdim=False):
    rows, d = _as_rows(x, dim)
    size = rows.shape[d]
    nans = _nan_counts(rows, d)
    # With NaNs: the first NaN, the first of them in the stable sort.
    position = aten.where.self(nans > 0, size - nans, aten.full_like.default(nans, (size - 1) // 2))
    return _restore_rank(_at_sorted_position(rows, position, d, keepdim), x)


def _of_all_elements(by_dim, x):
    """The value of an order statistic over every element (NaN for none)."""
    if x.numel() == 0:
        return aten.full.default([], math.nan, dtype=x.dtype)
    return by_dim(x.reshape(-1), 0)[0]


@_decomposes(aten.median.default)
def _median(x):
    return _of_all_elements(_median_dim, x)


@_decomposes(aten.nanmedian.dim)
def _nanmedian_dim(x, dim=-1, keepdim=False):
    rows, d = _as_rows(x, dim)
    numbers = rows.shape[d] - _nan_counts(rows, d)
    # All NaN: position 0, a NaN.
    position = aten.clamp_min.default(aten.floor_divide.default(numbers - 1, 2), 0)
    return _restore_rank(_at_sorted_position(rows, position, d, keepdim), x)


@_decomposes(aten.nanmedian.default)
def _nanmedian(x):
    return _of_all_elements(_nanmedian_dim, x)


# Logical ops: the bitwise ones on truth values (x != 0 for non-bools).
def _truth(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.bool else x != 0


@_decomposes(aten.logical_and.default)
def _logical_and(a, b):
    return aten.bitwise_and.Tensor(_truth(a), _truth(b))


@_decomposes(aten.logical_or.default)
def _logical_or(a, b):
    return aten.bitwise_or.Tensor(_truth(a), _truth(b))


@_decomposes(aten.logical_xor.default)
def _logical_xor(a, b):
    return aten.bitwise_xor.Tensor(_truth(a), _truth(b))


@_decomposes(aten.logical_not.default)
def _logical_not(x):
    return aten.bitwise_not.default(_truth(x))


@_decomposes(aten.isnan.default)
def _isnan(x):
    return x != x


@_decomposes(aten.isinf.default)
def _isinf(x):
    return aten.abs.default(x) == math.inf


@_decomposes(aten.any.dim, aten.any.dims, aten.any.default)
def _any(x, dim=None, keepdim=False):
    return aten.amax.default(_truth(x).to(torch.int32), _dims(x, dim), keepdim) > 0


@_decomposes(aten.all.dim, aten.all.dims, aten.all.default)
def _all(x, dim=None, keepdim=False):
    return aten.amin.default(_truth(x).to(torch.int32), _dims(x, dim), keepdim) > 0


@_decomposes(aten.argmin.default)
def _argmin(x, dim=None, keepdim=False):
    # The first smallest, NaN first, as PyTorch's: argmax of the negation.
    return aten.argmax.default(-x, dim, keepdim) if x.dtype != torch.bool else NotImplemented


# nll_loss (cross_entropy after log_softmax): -x[target] along the class
# dim (1, or 0 for one unbatched sample), weighted; targets equal to
# ignore_index weigh 0. A target outside [0, C) is gather's index error.
# Reductions 0, 1, 2: none, weighted mean, sum.
@_decomposes(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _nll_loss(x, target, weight, reduction, ignore_index):
    class_dim = 1 if x.dim() > 1 else 0
    ignored = target == ignore_index
    safe = aten.where.self(ignored, aten.full.default([], 0, dtype=target.dtype), target)
    picked = aten.squeeze.dim(aten.gather.default(x, class_dim, aten.unsqueeze.default(safe, class_dim)), class_dim)
    if weight is None:
        weights = aten.where.self(ignored, _scalar(0, x), _scalar(1, x))
    else:
        chosen = aten.reshape.default(aten.index_select.default(weight, 0, aten.reshape.default(safe, [-1])),
                                      list(safe.shape))
        weights = aten.where.self(ignored, _scalar(0, x), chosen)
    losses = -picked * weights
    total = aten.sum.default(weights)
    if reduction == 0:
        return losses, total
    if reduction == 2:
        return aten.sum.default(losses), total
    return aten.sum.default(losses) / total, total


# Binary search as counting: the position of x among sorted boundaries is
# how many boundaries b are not at or above x (right: not above x), the
# predicate PyTorch's search tests, so a NaN value goes past them all. Equal
# to PyTorch's wherever the boundaries hold no NaN (with a NaN among them
# the predicate is not monotone and PyTorch's answer follows its search
# path). Every value meets every boundary: meant for short boundary lists.
def _positions_among(values, boundaries, right: bool, out_int32: bool) -> torch.Tensor:
    stops = (values < boundaries) if right else (values <= boundaries)
    count = aten.sum.dim_IntList(aten.bitwise_not.default(stops), [-1])
    return count.to(torch.int32) if out_int32 else count


@_decomposes(aten.bucketize.Tensor)
def _bucketize(x, boundaries, *, out_int32=False, right=False):
    return _positions_among(aten.unsqueeze.default(x, -1), boundaries, right, out_int32)


@_decomposes(aten.searchsorted.Tensor)
def _searchsorted(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        return NotImplemented
    right = right or side == "right"
    # Rows of an N-D sequence pair with the rows of x: [..., n, 1] against [..., 1, m].
    sequence = sorted_sequence if sorted_sequence.dim() == 1 else aten.unsqueeze.default(sorted_sequence, -2)
    return _positions_among(aten.unsqueeze.default(x, -1), sequence, right, out_int32)


# histc: `bins` equal bins over [min, max] (the input's own range when
# min == max, widened by 1 each way when that is one value), the last bin
# closed. An element's bin is (x - min) * bins / (max - min) truncated, in
# the input's dtype as PyTorch computes it; elements outside the range, NaN
# among them, count nowhere. The counts are a scatter_add, so a sharded
# input leaves partial counts summed across its devices.
@_decomposes(aten.histc.default)
def _histc(x, bins=100, min=0, max=0):  # noqa: A002  (aten's argument names)
    if x.numel() == 0:
        return aten.full.default([bins], 0, dtype=x.dtype)
    flat = x.reshape(-1)
    low, high = aten.full.default([], min, dtype=x.dtype), aten.full.default([], max, dtype=x.dtype)
    if min == max:
        low, high = aten.amin.default(flat, [0]), aten.amax.default(flat, [0])
        finite = aten.logical_and.default(low.abs() < math.inf, high.abs() < math.inf)
        aten._assert_async.msg(finite, "torch.histc: range of [min, max] is not finite (the input's own range, "
                                       "as min == max was given)")
        one_value = low == high
        low, high = aten.where.self(one_value, low - 1, low), aten.where.self(one_value, high + 1, high)
    inside = aten.logical_and.default(flat >= low, flat <= high)
    scaled = (aten.where.self(inside, flat, low) - low) * bins / (high - low)
    # x == max is in the last bin. A range that is not finite (an error once
    # the run ends) or too wide for the dtype gives NaN here: it must not
    # reach the integer conversion.
    position = aten.clamp.default(aten.nan_to_num.default(scaled, 0.0), 0, bins - 1).to(torch.int64)
    counts = aten.full.default([bins], 0, dtype=x.dtype)
    return aten.scatter_add.default(counts, 0, position, inside.to(x.dtype))


# linspace as PyTorch computes it: the first half of the points stepped
# from start, the second half back from end (so both ends are exact).
@_decomposes(aten.linspace.default)
def _linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    if not dtype.is_floating_point or steps < 2:
        return NotImplemented
    step = (end - start) / (steps - 1)
    i = aten.arange.default(steps, dtype=dtype)
    from_start = i * step + start
    from_end = end - (steps - 1 - i) * step
    return aten.where.self(i < steps // 2, from_start, from_end)


# Convolution (1-, 2- or 3-D, strided, dilated, padded, grouped; not
# transposed) as patches and a matmul: index tensors pick every window of
# the padded input ([N, C, *out, *kernel]), and each group's patches times
# its filters give the output channels.
def _windows(x: torch.Tensor, kernel: list[int], stride: list[int], dilation: list[int]) -> torch.Tensor:
    """x [..., *spatial] (the last len(kernel) dims) -> [..., *out, *kernel]:
    element (o, i) of spatial dim k is x at o * stride + i * dilation."""
    spatial = len(kernel)
    lead = x.dim() - spatial
    out = [(x.shape[lead + k] - dilation[k] * (kernel[k] - 1) - 1) // stride[k] + 1 for k in range(spatial)]
    indices = []
    for k in range(spatial):
        at = (aten.arange.default(out[k], dtype=torch.int64) * stride[k])[:, None] \
            + aten.arange.default(kernel[k], dtype=torch.int64)[None, :] * dilation[k]
        shape = [1] * (2 * spatial)
        shape[k], shape[spatial + k] = out[k], kernel[k]
        indices.append(aten.reshape.default(at, shape))
    return aten.index.Tensor(x, [None] * lead + indices)


@_decomposes(aten.convolution.default)
def _convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return _transposed_convolution(x, weight, bias, stride, padding, dilation, output_padding, groups)
    spatial = weight.dim() - 2
    kernel = list(weight.shape[2:])
    pads = [p for k in reversed(range(spatial)) for p in (padding[k], padding[k])]
    if any(pads):
        x = aten.constant_pad_nd.default(x, pads, 0.0)
    patches = _windows(x, kernel, list(stride), list(dilation))  # [N, C, *out, *kernel]
    batch, channels, out = x.shape[0], x.shape[1], list(patches.shape[2:2 + spatial])
    per_group, filters = channels // groups, weight.shape[0]
    positions, taps = math.prod(out), per_group * math.prod(kernel)
    # [N, G, Cg, *out, *kernel] -> [N, G, *out, Cg, *kernel] -> [N, G, P, Cg*K]
    grouped = aten.reshape.default(patches, [batch, groups, per_group, *out, *kernel])
    order = [0, 1, *range(3, 3 + spatial), 2, *range(3 + spatial, 3 + 2 * spatial)]
    rows = aten.reshape.default(aten.permute.default(grouped, order), [batch, groups, positions, taps])
    columns = aten.permute.default(aten.reshape.default(weight, [groups, filters // groups, taps]), [0, 2, 1])
    y = aten.matmul.default(rows, columns)  # [N, G, P, O/G]
    y = aten.reshape.default(aten.permute.default(y, [0, 1, 3, 2]), [batch, filters, *out])
    if bias is not None:
        y = y + aten.reshape.default(bias, [1, filters] + [1] * spatial)
    return _in_layout_of(x, y)


# A transposed convolution is the convolution of the input spread out by
# its stride (stride - 1 zeros between neighbours), padded by each kernel's
# dilated extent less the padding (cropped where that is negative; the
# output padding added after), with each group's filters flipped and their
# in and out channels swapped.
def _spread(x: torch.Tensor, dim: int, stride: int) -> torch.Tensor:
    """x with stride - 1 zeros after each element of `dim` but the last."""
    if stride == 1:
        return x
    shape = list(x.shape)
    zeros = aten.full.default(shape[:dim + 1] + [stride - 1] + shape[dim + 1:], 0, dtype=x.dtype)
    spread = aten.cat.default([aten.unsqueeze.default(x, dim + 1), zeros], dim + 1)
    spread = aten.reshape.default(spread, shape[:dim] + [shape[dim] * stride] + shape[dim + 1:])
    return aten.slice.Tensor(spread, dim, 0, (shape[dim] - 1) * stride + 1)


def _transposed_convolution(inputs, weight, bias, stride, padding, dilation, output_padding, groups):
    spatial = weight.dim() - 2
    kernel = list(weight.shape[2:])
    x = inputs
    for k in range(spatial):
        x = _spread(x, 2 + k, stride[k])
    pads = []
    for k in reversed(range(spatial)):
        before = dilation[k] * (kernel[k] - 1) - padding[k]
        pads += [before, before + output_padding[k]]
    if any(pads):
        x = aten.constant_pad_nd.default(x, pads, 0.0)
    # [Cin, Cout/G, *k] -> [G, Cout/G, Cin/G, *k] -> [Cout, Cin/G, *k], flipped.
    in_channels, out_per_group = weight.shape[0], weight.shape[1]
    grouped = aten.reshape.default(weight, [groups, in_channels // groups, out_per_group, *kernel])
    swapped = aten.permute.default(grouped, [0, 2, 1, *range(3, 3 + spatial)])
    filters = aten.reshape.default(swapped, [groups * out_per_group, in_channels // groups, *kernel])
    filters = aten.flip.default(filters, list(range(2, 2 + spatial)))
    ones, zeros = [1] * spatial, [0] * spatial
    return _in_layout_of(inputs, _convolution(x, filters, bias, ones, zeros, list(dilation), False, zeros, groups))


# Pooling over the last two dims, as windows (see _windows) reduced.
def _pairs(value, default=None) -> list[int]:
    """A pooling argument as [height, width]: one int for both, or default when empty."""
    if isinstance(value, int):
        return [value, value]
    value = list(value)
    if not value:
        return list(default)
    return value * 2 if len(value) == 1 else value


def _overhang(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """How far past the padded input the last window reaches: with ceil_mode
    a partial window at the end counts if it starts inside the input or its
    left padding (PyTorch's output size rule), else none does."""
    span = dilation * (kernel - 1) + 1
    if not ceil_mode:
        return 0
    out = (size + 2 * padding - span + stride - 1) // stride + 1
    if (out - 1) * stride >= size + padding:
        out -= 1
    return max(0, (out - 1) * stride + span - (size + 2 * padding))


def _padded_last_two(x: torch.Tensor, before: list[int], after: list[int], value: float) -> torch.Tensor:
    if not any(before) and not any(after):
        return x
    return aten.constant_pad_nd.default(x, [before[1], after[1], before[0], after[0]], value)


def _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode):
    """kernel, stride, dilation, and the padding before and after the last two dims."""
    kernel, padding, dilation = _pairs(kernel_size), _pairs(padding), _pairs(dilation)
    stride = _pairs(stride, kernel)
    after = [padding[i] + _overhang(x.shape[-2 + i], kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
             for i in range(2)]
    return kernel, stride, dilation, padding, after


@_decomposes(aten.avg_pool2d.default)
def _avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    kernel, stride, dilation, before, after = _pool_geometry(x, kernel_size, stride, padding, 1, ceil_mode)
    sums = aten.sum.dim_IntList(_windows(_padded_last_two(x, before, after, 0.0), kernel, stride, dilation),
                                [-2, -1])
    if divisor_override is not None:
        return _in_layout_of(x, sums / divisor_override)
    if before == after and (count_include_pad or not any(before)):
        return _in_layout_of(x, sums / (kernel[0] * kernel[1]))
    # Each window's divisor: its elements inside the input (with the
    # padding, if counted; never past it), as windows of a padded ones.
    height, width = x.shape[-2:]
    if count_include_pad:
        ones = aten.full.default([height + 2 * before[0], width + 2 * before[1]], 1.0, dtype=x.dtype)
        ones = _padded_last_two(ones, [0, 0], [a - b for a, b in zip(after, before)], 0.0)
    else:
        ones = _padded_last_two(aten.full.default([height, width], 1.0, dtype=x.dtype), before, after, 0.0)
    counts = aten.sum.dim_IntList(_windows(ones, kernel, stride, dilation), [-2, -1])
    return _in_layout_of(x, sums / counts)


def _max_pool_choice(windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The maximum of each window (the last dim) and its position there, as
    PyTorch's max-pooling kernels choose it: the first maximum, or the last
    NaN where there is one (its running maximum takes every NaN it meets)."""
    values = aten.amax.default(windows, [-1], True)
    first_maximum = aten.argmax.default(windows, -1, True)
    nans_from_the_end = aten.flip.default(aten.isnan.default(windows), [-1]).to(torch.int32)
    last_nan = (windows.shape[-1] - 1) - aten.argmax.default(nans_from_the_end, -1, True)
    chosen = aten.where.self(aten.isnan.default(values), last_nan, first_maximum)
    return aten.squeeze.dim(values, -1), aten.squeeze.dim(chosen, -1)


@_decomposes(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    kernel, stride, dilation, before, after = _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode)
    height, width = x.shape[-2:]
    windows = _windows(_padded_last_two(x, before, after, -math.inf), kernel, stride, dilation)
    flat = aten.reshape.default(windows, [*windows.shape[:-2], kernel[0] * kernel[1]])
    values, chosen = _max_pool_choice(flat)
    # Indices into each input plane (h * width + w), as PyTorch's: the
    # flat positions, windowed alike, picked where the maximum is.
    positions = aten.reshape.default(aten.arange.default(height * width, dtype=torch.int64), [height, width])
    position_windows = _windows(_padded_last_two(positions, before, after, -1), kernel, stride, dilation)
    position_flat = aten.reshape.default(position_windows, [*position_windows.shape[:-2], kernel[0] * kernel[1]])
    indices = aten.gather.default(aten.expand.default(position_flat, list(flat.shape)), -1,
                                  aten.unsqueeze.default(chosen, -1))
    if any(before) or any(after):
        # A window whose maximum is -inf may have picked its padding (-1):
        # PyTorch's kernels report the window's first element in the input.
        first_inside = aten.gather.default(position_flat, -1,
                                           aten.argmax.default((position_flat >= 0).to(torch.int32), -1, True))
        indices = aten.where.self(indices < 0, first_inside, indices)
    return _in_layout_of(x, values), _in_layout_of(x, aten.squeeze.dim(indices, -1))


def _adaptive_windows(size: int, out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, 1] each: adaptive pooling's window o over `size` elements is
    [floor(o * size / out), ceil((o + 1) * size / out))."""
    o = aten.unsqueeze.default(aten.arange.default(out, dtype=torch.int64), 1)
    return (o * size) // out, ((o + 1) * size + out - 1) // out


def _adaptive_weights(size: int, out: int, dtype: torch.dtype) -> torch.Tensor:
    """[out, size]: row o averages window o (see _adaptive_windows)."""
    start, end = _adaptive_windows(size, out)
    i = aten.unsqueeze.default(aten.arange.default(size, dtype=torch.int64), 0)
    inside = aten.bitwise_and.Tensor(i >= start, i < end)
    return inside.to(dtype) / (end - start).to(dtype)


@_decomposes(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(x, output_size):
    rows = _adaptive_weights(x.shape[-2], output_size[0], x.dtype)  # [OH, H]
    columns = _adaptive_weights(x.shape[-1], output_size[1], x.dtype)  # [OW, W]
    return _in_layout_of(x, aten.matmul.default(aten.matmul.default(rows, x), aten.permute.default(columns, [1, 0])))


def _adaptive_window_positions(size: int, out: int) -> torch.Tensor:
    """[out, longest window]: the positions of window o (see
    _adaptive_windows), its last repeated to fill the row (a repeat never
    changes a window's maximum nor which element is first)."""
    longest = max(-(-(o + 1) * size // out) - o * size // out for o in range(out))
    start, end = _adaptive_windows(size, out)
    return aten.minimum.default(start + aten.unsqueeze.default(aten.arange.default(longest, dtype=torch.int64), 0),
                                end - 1)


@_decomposes(aten.adaptive_max_pool2d.default)
def _adaptive_max_pool2d(x, output_size):
    """Each window's maximum along its rows, then along the column of row
    maxima: the first maximum in row-major order, or its last NaN, which is
    the element PyTorch's kernel reports."""
    height, width = x.shape[-2:]
    rows = _adaptive_window_positions(height, output_size[0])  # [OH, KH]
    columns = _adaptive_window_positions(width, output_size[1])  # [OW, KW]
    lead = x.dim() - 2
    in_rows = aten.index.Tensor(x, [None] * (lead + 1) + [columns])  # [..., H, OW, KW]
    row_values, row_choice = _max_pool_choice(in_rows)  # [..., H, OW]
    row_column = aten.gather.default(aten.expand.default(columns, list(in_rows.shape)), -1,
                                     aten.unsqueeze.default(row_choice, -1))[..., 0]  # [..., H, OW]
    in_columns = aten.index.Tensor(row_values, [None] * lead + [rows])  # [..., OH, KH, OW]
    in_columns = aten.transpose.int(in_columns, -1, -2)  # [..., OH, OW, KH]
    values, choice = _max_pool_choice(in_columns)  # [..., OH, OW]
    row = aten.gather.default(aten.expand.default(aten.unsqueeze.default(rows, 1), list(in_columns.shape)), -1,
                              aten.unsqueeze.default(choice, -1))[..., 0]  # [..., OH, OW]
    column = aten.gather.default(row_column, -2, row)
    return _in_layout_of(x, values), _in_layout_of(x, row * width + column)


@_decomposes(aten.adaptive_max_pool1d.default)
def _adaptive_max_pool1d(x, output_size):
    values, indices = _adaptive_max_pool2d(aten.unsqueeze.default(x, -2), [1, output_size[0]])
    return aten.squeeze.dim(values, -2), aten.squeeze.dim(indices, -2)


# The deprecated scatter(..., reduce=): scatter_reduce including self.
_SCATTER_REDUCTIONS = {"add": "sum", "multiply": "prod"}


@_decomposes(aten.scatter.reduce)
def _scatter_reduce_deprecated(x, dim, index, src, *, reduce):
    return aten.scatter_reduce.two(x, dim, index, src, _SCATTER_REDUCTIONS[reduce], include_self=True)


@_decomposes(aten.scatter.value_reduce)
def _scatter_value_reduce_deprecated(x, dim, index, value, *, reduce):
    src = aten.full.default(list(index.shape), value, dtype=x.dtype)
    return aten.scatter_reduce.two(x, dim, index, src, _SCATTER_REDUCTIONS[reduce], include_self=True)


@_decomposes(aten.new_full.default)
def _new_full(x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), fill_value, dtype=x.dtype if dtype is None else dtype)


@_decomposes(aten.new_zeros.default)
def _new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _new_full(x, size, 0, dtype=dtype)


@_decomposes(aten.new_ones.default)
def _new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _new_full(x, size, 1, dtype=dtype)


# An empty tensor's values are unspecified (written before they are read:
# torch.empty_like(x).copy_(x), out= buffers): zeros are as good as any.
@_decomposes(aten.empty.memory_format)
def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return aten.full.default(list(size), 0, dtype=torch.get_default_dtype() if dtype is None else dtype)


@_decomposes(aten.empty_strided.default)
def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _empty(size, dtype=dtype)


@_decomposes(aten.empty_like.default)
def _empty_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _empty(x.shape, dtype=x.dtype if dtype is None else dtype)


@_decomposes(aten.new_empty.default)
def _new_empty(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _new_full(x, size, 0, dtype=dtype)


@_decomposes(aten.fill.Scalar)
def _fill(x, value):
    return aten.full.default(list(x.shape), value, dtype=x.dtype)


@_decomposes(aten.fill.Tensor)
def _fill_tensor(x, value):
    return aten.expand.default(value.to(x.dtype), list(x.shape))


@_decomposes(aten.zero.default)
def _zero(x):
    return _fill(x, 0)


@_decomposes(aten.masked_fill.Tensor)
def _masked_fill_tensor(x, mask, value):
    return aten.where.self(mask, value.to(x.dtype), x)


# t[mask] = v with a boolean mask and one value for every element it
# selects (Meta's top-p sampling zeroes probabilities so): where(mask, v, t),
# no data-dependent shape. Other boolean writes stay index_put, which names
# what it supports.
@_decomposes(aten.index_put.default)
def _index_put_by_mask(x, indices, values, accumulate=False):
    given = [(d, index) for d, index in enumerate(indices) if index is not None]
    if len(given) != 1 or given[0][1].dtype != torch.bool:
        return NotImplemented
    start, mask = given[0]
    end = start + mask.dim()
    trailing = list(x.shape[end:])
    if list(mask.shape) != list(x.shape[start:end]) or values.dim() > len(trailing) \
            or list(torch.broadcast_shapes(values.shape, trailing)) != trailing:
        return NotImplemented  # values per selected element: a data-dependent count
    selected = mask.reshape([1] * start + list(mask.shape) + [1] * len(trailing))
    values = values.to(x.dtype)
    return aten.where.self(selected, x + values if accumulate else values, x)


def _plus_scaled(x, product, beta, alpha):
    """beta * x + alpha * product, as torch's add*mm family computes it: with
    beta 0, x is not read (its nan and inf do not reach the result)."""
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    return (x if beta == 1 else x * beta) + product


@_decomposes(aten.mv.default)
def _mv(matrix, vector):
    return aten.squeeze.dim(aten.mm.default(matrix, aten.unsqueeze.default(vector, 1)), 1)


@_decomposes(aten.dot.default)
def _dot(a, b):
    return aten.reshape.default(aten.mm.default(aten.unsqueeze.default(a, 0), aten.unsqueeze.default(b, 1)), [])


@_decomposes(aten.baddbmm.default)
def _baddbmm(x, batch1, batch2, *, beta=1, alpha=1):
    return _plus_scaled(x, aten.bmm.default(batch1, batch2), beta, alpha)


@_decomposes(aten.addbmm.default)
def _addbmm(x, batch1, batch2, *, beta=1, alpha=1):
    return _plus_scaled(x, aten.sum.dim_IntList(aten.bmm.default(batch1, batch2), [0]), beta, alpha)


@_decomposes(aten.addmv.default)
def _addmv(x, matrix, vector, *, beta=1, alpha=1):
    return _plus_scaled(x, _mv(matrix, vector), beta, alpha)


@_decomposes(aten.addr.default)
def _addr(x, vector1, vector2, *, beta=1, alpha=1):
    if x.dtype == torch.bool:
        return NotImplemented  # torch's boolean addr is logical and/or: left to name itself
    outer = aten.unsqueeze.default(vector1, 1) * aten.unsqueeze.default(vector2, 0)
    return _plus_scaled(x, outer, beta, alpha)


@_decomposes(aten._prelu_kernel.default)
def _prelu(x, weight):
    # torch.prelu has already shaped the weight to broadcast over x's channels.
    return aten.where.self(x > 0, x, weight * x)


def _padding_or_attention_mask(mask, mask_type, batch: int, length: int):
    """The mask nn.TransformerEncoderLayer's fast path takes (see
    MultiheadAttention.merge_masks) as scaled_dot_product_attention's: type 1
    masks keys per batch row [B, L], type 2 is [B, H or 1, L, L] (type 0, [L, L],
    broadcasts as it is). A boolean mask is True where a query must not look,
    the opposite of attention's; a float mask is added as it is."""
    if mask is None:
        return None
    if mask_type == 1:
        mask = aten.reshape.default(mask, [batch, 1, 1, length])
    return aten.logical_not.default(mask) if mask.dtype == torch.bool else mask


@_decomposes(aten._transformer_encoder_layer_fwd.default)
def _transformer_encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                               norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                               ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    # nn.TransformerEncoderLayer's fused inference path (taken in eval mode
    # without grad), in the ops of its unfused one: the same layer.
    if src.dim() != 3:
        return NotImplemented  # a nested (padded) batch: left to name itself
    batch, length, _ = src.shape
    head_dim = embed_dim // num_heads

    def heads(x):
        return x.reshape(batch, length, num_heads, head_dim).transpose(1, 2)

    def self_attention(x):
        q, k, v = torch.nn.functional.linear(x, qkv_weight, qkv_bias).chunk(3, -1)
        attn_mask = _padding_or_attention_mask(mask, mask_type, batch, length)
        out = torch.nn.functional.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=attn_mask)
        return torch.nn.functional.linear(out.transpose(1, 2).reshape(batch, length, embed_dim), proj_weight,
                                          proj_bias)

    def feed_forward(x):
        hidden = torch.nn.functional.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = torch.nn.functional.gelu(hidden) if use_gelu else torch.nn.functional.relu(hidden)
        return torch.nn.functional.linear(hidden, ffn_weight_2, ffn_bias_2)

    def norm(x, weight, bias):
        return torch.nn.functional.layer_norm(x, [embed_dim], weight, bias, eps)

    if norm_first:
        x = src + self_attention(norm(src, norm_weight_1, norm_bias_1))
        return x + feed_forward(norm(x, norm_weight_2, norm_bias_2))
    x = norm(src + self_attention(src), norm_weight_1, norm_bias_1)
    return norm(x + feed_forward(x), norm_weight_2, norm_bias_2)


def _float_work(x: torch.Tensor) -> torch.Tensor:
    """x as the float tensor a transcendental function is worked out in:
    float32 for 16-bit floats (rounded once at the end, as PyTorch's kernels
    do) and for integers (whose results are floats)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)


def _result(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return value.to(like.dtype) if like.is_floating_point() else value.to(torch.get_default_dtype())


def _is_negative(x: torch.Tensor) -> torch.Tensor:
    """x < 0, and -0.0 too (its reciprocal is -inf), as atan2's quadrants see it."""
    return (x < 0) | ((x == 0) & (1 / x < 0))


_LN2 = math.log(2)


@_decomposes(aten.sinh.default)
def _sinh(x):
    # Near 0 from expm1 (no cancellation); beyond, halves taken inside the
    # exponentials, so it overflows where sinh itself does, not where exp does.
    w = _float_work(x)
    magnitude = aten.abs.default(w)
    near_zero = (aten.expm1.default(w) - aten.expm1.default(-w)) / 2
    far = aten.exp.default(magnitude - _LN2) - aten.exp.default(-magnitude - _LN2)
    return _result(aten.where.self(magnitude < 1, near_zero, aten.where.self(w < 0, -far, far)), x)


@_decomposes(aten.cosh.default)
def _cosh(x):
    magnitude = aten.abs.default(_float_work(x))
    return _result(aten.exp.default(magnitude - _LN2) + aten.exp.default(-magnitude - _LN2), x)


@_decomposes(aten.asin.default)
def _asin(x):
    # asin x = 2 atan(x / (1 + sqrt(1 - x^2))), with 1 - x^2 as (1 - x)(1 + x):
    # no cancellation near |x| = 1; NaN beyond.
    w = _float_work(x)
    return _result(2 * aten.atan.default(w / (1 + aten.sqrt.default((1 - w) * (1 + w)))), x)


@_decomposes(aten.acos.default)
def _acos(x):
    w = _float_work(x)
    return _result(2 * aten.atan.default(aten.sqrt.default((1 - w) / (1 + w))), x)


@_decomposes(aten.atan2.default)
def _atan2(y, x):
    # The angle of the smaller magnitude over the larger (atan's argument in
    # [0, 1], no overflow), reflected into the quadrant of (x, y), signed
    # zeros included; both infinite: an odd multiple of pi/4.
    like = y if y.is_floating_point() else x
    y, x = _float_work(y), _float_work(x)
    ay, ax = aten.abs.default(y), aten.abs.default(x)
    larger, smaller = aten.maximum.default(ay, ax), aten.minimum.default(ay, ax)
    angle = aten.atan.default(smaller / larger)
    angle = aten.where.self(larger == 0, _scalar(0.0, angle), angle)
    angle = aten.where.self((ay == math.inf) & (ax == math.inf), _scalar(math.pi / 4, angle), angle)
    angle = aten.where.self(ay > ax, math.pi / 2 - angle, angle)
    angle = aten.where.self(_is_negative(x), math.pi - angle, angle)
    return _result(aten.where.self(_is_negative(y), -angle, angle), like)


@_decomposes(aten.hypot.default)
def _hypot(a, b):
    # The larger magnitude times sqrt(1 + ratio^2): no overflow or underflow
    # in the squares; inf if either is infinite, even against NaN.
    like = a
    a, b = aten.abs.default(_float_work(a)), aten.abs.default(_float_work(b))
    larger, smaller = aten.maximum.default(a, b), aten.minimum.default(a, b)
    ratio = smaller / larger
    out = larger * aten.sqrt.default(1 + ratio * ratio)
    out = aten.where.self(larger == 0, _scalar(0.0, out), out)
    return _result(aten.where.self((a == math.inf) | (b == math.inf), _scalar(math.inf, out), out), like)


@_decomposes(aten.log_sigmoid_forward.default)
def _log_sigmoid(x):
    # log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)); the second output is
    # backward's buffer, which inference never reads.
    out = aten.minimum.default(x, _scalar(0, x)) - aten.log1p.default(aten.exp.default(-aten.abs.default(x)))
    return out, aten.full.default([0], 0, dtype=x.dtype)


@_decomposes(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def _count_nonzero(x, dim=None):
    return aten.sum.dim_IntList(_truth(x), _dims(x, dim))


@_decomposes(aten.linalg_cross.default)
def _cross(a, b, *, dim=-1):
    shape = list(torch.broadcast_shapes(a.shape, b.shape))
    a, b = aten.expand.default(a, shape), aten.expand.default(b, shape)
    d = dim % len(shape)
    next_one = (aten.arange.default(3, dtype=torch.int64) + 1) % 3  # [1, 2, 0]
    next_two = (next_one + 1) % 3  # [2, 0, 1]

    def rotated(t, order):
        return aten.index_select.default(t, d, order)

    return rotated(a, next_one) * rotated(b, next_two) - rotated(a, next_two) * rotated(b, next_one)


def _diagonal_positions(rows: int, columns: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, column) index tensors of a diagonal `offset` above the main one."""
    length = max(0, min(rows, columns - offset) if offset >= 0 else min(rows + offset, columns))
    steps = aten.arange.default(length, dtype=torch.int64)
    return (steps, steps + offset) if offset >= 0 else (steps - offset, steps)


@_decomposes(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(x, offset=0, dim1=0, dim2=1):
    # The two dims moved last and indexed together: the diagonal is the last dim, as PyTorch's.
    d1, d2 = dim1 % x.dim(), dim2 % x.dim()
    rest = [d for d in range(x.dim()) if d not in (d1, d2)]
    rows, columns = _diagonal_positions(x.shape[d1], x.shape[d2], offset)
    return aten.index.Tensor(aten.permute.default(x, rest + [d1, d2]), [None] * len(rest) + [rows, columns])


@_decomposes(aten.diag_embed.default)
def _diag_embed(x, offset=0, dim1=-2, dim2=-1):
    # x's last dim on a diagonal of zeros (a where: NaN stays on it), its
    # two dims then moved to dim1 and dim2 of the result.
    size = x.shape[-1] + abs(offset)
    padded = aten.constant_pad_nd.default(x, [0, abs(offset)], 0)
    steps = aten.arange.default(size, dtype=torch.int64)
    on_diagonal = aten.unsqueeze.default(steps, 0) - aten.unsqueeze.default(steps, 1) == offset
    # The row's value above the main diagonal, the column's below it.
    values = aten.unsqueeze.default(padded, -1 if offset >= 0 else -2)
    out = aten.where.self(on_diagonal, values, aten.full.default([], 0, dtype=x.dtype))
    rank = out.dim()
    d1, d2 = dim1 % rank, dim2 % rank
    batch = iter(range(rank - 2))
    order = [rank - 2 if p == d1 else rank - 1 if p == d2 else next(batch) for p in range(rank)]
    return aten.permute.default(out, order)


@_decomposes(aten.trace.default)
def _trace(x):
    return aten.sum.default(_diagonal(x))  # integers and bools sum in int64, as torch.trace's


@_decomposes(aten.unbind.int)
def _unbind(x, dim=0):
    return [aten.select.int(x, dim, i) for i in range(x.shape[dim])]


from . import _random  # noqa: E402,F401  (registers the random ops, written with _decomposes)
