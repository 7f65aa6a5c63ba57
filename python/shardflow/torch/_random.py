"""Random ops, written in the two draws the lowering has: aten.rand and
aten.randn, which lower to shardflow's counter-based rand and randn seeded by
the call (see `Lowering.seed`).

Every draw is a function of (the call's seed, the op, the element's flat
index), so a sharded graph draws exactly what the unsharded one draws, and
each call draws new values from a seed taken from torch's default generator:
`torch.manual_seed` makes a compiled function's draws repeat, as it does
eagerly. The values are not eager PyTorch's (its CPU generator is a
Mersenne Twister stepped in kernel order), as with Inductor: the tests compare
distributions and laws (dropout's mask and scale, multinomial's support),
not bits.

PyTorch's checks of its arguments (a dropout probability outside [0, 1],
uniform's from > to, multinomial's ranks and sample counts) run while Dynamo
traces, in PyTorch's meta functions; the checks of values (bernoulli's and
multinomial's probabilities) become `_assert_async` conditions, checked after
the run with PyTorch's messages.
"""

from __future__ import annotations

import torch

from ._decompositions import _decomposes

aten = torch.ops.aten

# A rand value u is a multiple of 2^-24 in [0, 1): its 24 bits as an integer.
_UNIFORM_BITS = 24


def _uniform(shape, dtype=torch.float32) -> torch.Tensor:
    return aten.rand.default(list(shape), dtype=dtype)


def _normal(shape, dtype=torch.float32) -> torch.Tensor:
    return aten.randn.default(list(shape), dtype=dtype)


def _no_generator(generator) -> None:
    # Dynamo runs an op given a torch.Generator eagerly, outside the graph:
    # one should never get here, and is never drawn with another seed.
    if generator is not None:
        raise RuntimeError("a random op with an explicit torch.Generator reached shardflow's graph; shardflow draws "
                           "from each call's seed, taken from torch's default generator")


def _unit_exponential(shape, dtype) -> torch.Tensor:
    """Exp(1) draws, -log(1 - u), never 0: u = 0 gives 2^-25 rather than 0,
    so that p / q stays finite in multinomial (Exp(1) is below 2^-25 with
    probability about 2^-25 anyway)."""
    u = _uniform(shape)
    q = -aten.log.default(1 - u)
    return aten.clamp_min.default(q, 2.0 ** -25).to(dtype)


def _random_integers(shape) -> torch.Tensor:
    """Uniform int64 values in [0, 2^48): two rand draws' 24 bits each."""
    u = _uniform([2, *shape])
    bits = (u * float(1 << _UNIFORM_BITS)).to(torch.int64)
    return bits[0] * (1 << _UNIFORM_BITS) + bits[1]


@_decomposes(aten.rand_like.default)
def _rand_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _uniform(x.shape, x.dtype if dtype is None else dtype)


@_decomposes(aten.randn_like.default)
def _randn_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _normal(x.shape, x.dtype if dtype is None else dtype)


@_decomposes(aten.uniform.default)
def _uniform_fill(x, low=0.0, high=1.0, *, generator=None):
    """low + u (high - low), computed in f32 and rounded to x's dtype; a
    value that rounds to `high` or above (`high` as x's dtype has it) is
    `low` instead, so every value lies in [low, high) with the law of
    PyTorch's CPU kernel: uniform_(100, 101) into bf16 is 100 or 100.5,
    half the time each. (PyTorch computes f32's in double, so values at
    the edge of a rounding step may differ in their last bit.)"""
    _no_generator(generator)
    value = (_uniform(x.shape) * (high - low) + low).to(x.dtype)
    return value.masked_fill(value >= high, low)


@_decomposes(aten.normal_functional.default)
def _normal_fill(x, mean=0.0, std=1.0, *, generator=None):
    _no_generator(generator)
    return (_normal(x.shape) * std + mean).to(x.dtype)


@_decomposes(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def _normal_tensors(mean, std=1.0, *, generator=None):
    _no_generator(generator)
    shape = torch.broadcast_shapes(*(t.shape for t in (mean, std) if torch.is_tensor(t)))
    dtype = mean.dtype if torch.is_tensor(mean) else std.dtype
    return (_normal(shape, dtype) * std + mean).to(dtype)


@_decomposes(aten.normal.float_float)
def _normal_sized(mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    _no_generator(generator)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    return (_normal(size) * std + mean).to(dtype)


@_decomposes(aten.exponential.default)
def _exponential(x, lambd=1.0, *, generator=None):
    _no_generator(generator)
    return _unit_exponential(x.shape, torch.float32).div(lambd).to(x.dtype)


@_decomposes(aten.bernoulli.default)
def _bernoulli(p, *, generator=None):
    _no_generator(generator)
    in_range = aten.logical_and.default(p >= 0, p <= 1)
    aten._assert_async.msg(aten.all.default(in_range),
                           "Expected p_in >= 0 && p_in <= 1 to be true, but got false.")
    return (_uniform(p.shape) < p).to(p.dtype)


@_decomposes(aten.bernoulli.p)
def _bernoulli_scalar(x, p=0.5, *, generator=None):
    _no_generator(generator)
    return (_uniform(x.shape) < p).to(x.dtype)


@_decomposes(aten.native_dropout.default)
def _native_dropout(x, p, train):
    """PyTorch's dropout: each element kept with probability 1 - p and
    scaled by 1 / (1 - p); with p = 1 everything is dropped (zeros, not
    0 * inf). The mask (True = kept) is the second result."""
    if train is False:
        return x.clone(), aten.full.default(list(x.shape), True, dtype=torch.bool)
    keep = _uniform(x.shape) < 1 - p
    scale = 0.0 if p == 1 else 1 / (1 - p)
    return x * keep.to(x.dtype) * scale, keep


def _randint(low, high, size, dtype) -> torch.Tensor:
    """Uniform integers in [low, high): 48 random bits reduced mod the
    range (the bias is below range / 2^48)."""
    span = high - low
    if span > 1 << 40:
        raise RuntimeError(f"shardflow's randint draws 48 random bits: a range of {span} values (from={low}, "
                           f"to={high}) would be visibly biased; ranges up to 2^40 are supported")
    values = aten.remainder.Scalar(_random_integers(size), span) + low
    return values.to(torch.int64 if dtype is None else dtype)


@_decomposes(aten.randint.default)
def _randint_high(high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _randint(0, high, size, dtype)


@_decomposes(aten.randint.low)
def _randint_low(low, high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _randint(low, high, size, dtype)


@_decomposes(aten.randint_like.default)
def _randint_like_high(x, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _randint(0, high, x.shape, x.dtype if dtype is None else dtype)


@_decomposes(aten.randint_like.low_dtype)
def _randint_like_low(x, low, high, *, dtype=None, layout=None, device=None, pin_memory=None,
                      memory_format=None):
    return _randint(low, high, x.shape, x.dtype if dtype is None else dtype)


@_decomposes(aten.randperm.default)
def _randperm(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    """The order of n random 48-bit keys (ties, rare, break by position)."""
    order = aten.sort.stable(_random_integers([n]), stable=True)[1]
    return order.to(torch.int64 if dtype is None else dtype)


# -- multinomial --------------------------------------------------------------

def _check_distribution(p: torch.Tensor, replacement: bool) -> None:
    """PyTorch's checks of the probabilities, as _assert_async conditions.
    Sampling with replacement reads the elements in order: the first bad one
    names the error (NaN counts as negative there)."""
    sums = aten.sum.dim_IntList(p, [-1])
    if replacement:
        flat = p.reshape(-1)
        not_negative = flat >= 0
        bad = aten.logical_or.default(aten.logical_not.default(not_negative), flat.abs() == float("inf"))
        first_bad = aten.argmax.default(bad.to(torch.int32)).reshape(1)
        first_is_negative = aten.logical_and.default(aten.index_select.default(bad, 0, first_bad),
                                                     aten.index_select.default(not_negative.logical_not(), 0, first_bad))
        aten._assert_async.msg(aten.logical_not.default(first_is_negative),
                               "invalid multinomial distribution (encountering probability entry < 0)")
        aten._assert_async.msg(aten.logical_not.default(aten.any.default(bad)),
                               "invalid multinomial distribution (encountering probability entry = infinity or NaN)")
    else:
        valid = aten.logical_and.default(aten.all.default(p >= 0), aten.all.default(p < float("inf")))
        aten._assert_async.msg(valid, "probability tensor contains either `inf`, `nan` or element < 0")
    aten._assert_async.msg(aten.all.default(sums > 0), "invalid multinomial distribution (sum of probabilities <= 0)")


@_decomposes(aten.multinomial.default)
def _multinomial(p, num_samples, replacement=False, *, generator=None):
    """Without replacement, or one sample: the top keys p / q with q ~ Exp(1)
    per category (the exponential race, which draws categories in order
    without replacement with probability proportional to p; PyTorch's CPU
    kernel uses the same law). With replacement: each sample is the first
    category whose running sum of p exceeds u * sum(p); a category of
    probability 0 is never drawn."""
    _no_generator(generator)
    _check_distribution(p, replacement)
    if not replacement or num_samples == 1:
        keys = p.float() / _unit_exponential(p.shape, torch.float32)
        return aten.topk.default(keys, num_samples)[1]
    running = aten.cumsum.default(p.float(), -1)
    target = _uniform([*p.shape[:-1], num_samples]) * running[..., -1:]
    drawn = aten.sum.dim_IntList((running.unsqueeze(-2) <= target.unsqueeze(-1)).to(torch.int64), [-1])
    # Rounding can put u * sum on the sum itself: the last category drawable.
    positions = aten.arange.default(p.shape[-1])
    last_possible = aten.amax.default(aten.where.self(p > 0, positions, aten.full.default([], -1, dtype=torch.int64)), [-1], True)
    return aten.minimum.default(drawn, last_possible)
