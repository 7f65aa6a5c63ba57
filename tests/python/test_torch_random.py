"""Random ops inside compiled functions (shardflow.torch._random): one graph
with no break; sharded draws == unsharded draws; each call draws anew and
torch.manual_seed repeats a run; each op's law checked on large samples
(its values are not eager PyTorch's, which come from another generator);
PyTorch's errors for bad probabilities."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import shardflow.torch  # the backend, explain
import shardflow.torch.spmd as xs

ROWS, COLUMNS = 6, 40

# name -> f(x) for x [6, 40] in (0, 1), each using the op the name says.
OPS = {
    "rand": lambda x: x + torch.rand(x.shape),
    "rand_like_bf16": lambda x: torch.rand_like(x, dtype=torch.bfloat16),
    "randn": lambda x: torch.randn(ROWS, COLUMNS) * x,
    "randn_like": lambda x: torch.randn_like(x),
    "uniform_": lambda x: torch.empty_like(x).uniform_(-2, 3),
    "normal_": lambda x: torch.empty_like(x).normal_(1, 2),
    "normal_mean_tensor": lambda x: torch.normal(x, 0.5),
    "normal_both_tensors": lambda x: torch.normal(x, x),
    "normal_sized": lambda x: torch.normal(1.0, 2.0, (ROWS, COLUMNS)),
    "exponential_": lambda x: torch.empty_like(x).exponential_(2.0),
    "bernoulli": lambda x: torch.bernoulli(x),
    "bernoulli_p": lambda x: x.bernoulli(0.3),
    "dropout": lambda x: F.dropout(x, 0.25, training=True),
    "dropout_module": lambda x: torch.nn.Dropout(0.5)(x),
    "randint": lambda x: torch.randint(3, 9, x.shape),
    "randint_like": lambda x: torch.randint_like(x, 10),
    "randperm": lambda x: torch.randperm(COLUMNS) + x.argmax(-1, keepdim=True),
    "multinomial": lambda x: torch.multinomial(x, 5),
    "multinomial_one_row": lambda x: torch.multinomial(x[0], 1),
    "multinomial_replacement": lambda x: torch.multinomial(x, 50, replacement=True),
    "two_draws": lambda x: torch.stack([torch.rand_like(x), torch.rand_like(x)]),
}


def compiled(op, devices: int, spec=None):
    def f(x):
        if spec is not None:
            xs.mark_sharding(x, xs.Mesh(torch.arange(devices), (devices,)), spec)
        return op(x)
    return torch.compile(f, backend="shardflow", dynamic=False)


def draw(fn, x: torch.Tensor, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    with torch.no_grad():
        return fn(x)


def probabilities() -> torch.Tensor:
    return torch.rand(ROWS, COLUMNS, generator=torch.Generator().manual_seed(0)) * 0.98 + 0.01


@pytest.mark.parametrize("name", sorted(OPS))
def test_sharded_draws_are_the_unsharded_draws(spmd, name):
    x = probabilities()
    spmd(1)
    whole = draw(compiled(OPS[name], 1), x, seed=5)
    eager = OPS[name](x)
    assert whole.shape == eager.shape and whole.dtype == eager.dtype
    for spec in ((0, None), (None, 0)):
        spmd(4)
        torch.testing.assert_close(draw(compiled(OPS[name], 4, spec), x, seed=5), whole, rtol=0, atol=0)


def test_each_call_draws_anew_and_manual_seed_repeats(spmd):
    spmd(2)
    fn = compiled(OPS["two_draws"], 2, (0, None))
    x = probabilities()
    first = draw(fn, x, seed=11)
    with torch.no_grad():
        second = fn(x)
    again = draw(fn, x, seed=11)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    for a, b in ((first, second), (first[0], first[1])):  # calls differ, and two ops of one call
        assert (a == b).float().mean() < 0.01


def test_random_ops_compile_to_one_graph(spmd):
    spmd(2)

    def f(x):
        xs.mark_sharding(x, xs.Mesh(torch.arange(2), (2,)), (0, None))
        h = F.dropout(x, 0.1, training=True) + torch.randn_like(x)
        return torch.multinomial(h.softmax(-1), 1)

    explanation = torch._dynamo.explain(f)(probabilities())
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)


def test_each_device_draws_only_its_tile(spmd):
    """A dropout of rows split 4 ways (6 rows: tiles of 2, the last empty)
    draws each device's 2 x 40 tile, not the whole 6 x 40 mask."""
    spmd(4)

    def f(x):
        xs.mark_sharding(x, xs.Mesh(torch.arange(4), (4,)), (0, None))
        return F.dropout(x, 0.25, training=True)

    (report,) = shardflow.torch.explain(f, probabilities()).graphs
    draws = [line for line in report.program_text.splitlines() if "shardflow::rand.seed_tensor(" in line]
    assert len(draws) == 2, report.program_text  # the IR's line and the per-device program's
    assert ": f32[2,40] = shardflow::rand.seed_tensor([6, 40]," in draws[1]
    assert "this device's tile of [6,40] (dim 0 over '0')" in draws[1]
    assert "local-slice" not in report.program_text


# -- laws -----------------------------------------------------------------------

def sample(op, shape=(256, 256), seed=1) -> torch.Tensor:
    """op(x) compiled, x of `shape` filled with 0.3, the rows sharded over 2 devices."""
    return draw(compiled(op, 2, (0, None)), torch.full(shape, 0.3), seed)


def test_uniform_draws(spmd):
    spmd(2)
    u = sample(lambda x: torch.rand_like(x))
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    for digit in range(10):  # each tenth of [0, 1) holds a tenth (binomial sd ~ 0.0012)
        assert abs(((u * 10).floor() == digit).float().mean() - 0.1) < 0.006
    v = sample(lambda x: torch.empty_like(x).uniform_(-2, 3))
    assert -2 <= v.min() and v.max() < 3 and abs(v.mean() - 0.5) < 0.03
    h = sample(lambda x: torch.rand_like(x, dtype=torch.float16))
    assert h.dtype == torch.float16 and 0 <= h.min() and h.max() < 1


@pytest.mark.parametrize("dtype, low, high", [
    (torch.bfloat16, 100, 101), (torch.bfloat16, -101, -100), (torch.bfloat16, 0.1, 0.2),
    (torch.float16, 0.1, 0.2), (torch.float32, 1e6, 1e6 + 1)])
def test_uniform_into_a_coarse_dtype_has_eager_law(spmd, dtype, low, high):
    """uniform_ rounded to a dtype whose steps are coarse against the range:
    never `high` (in eager, bf16 uniform_(100, 101) is 100 or 100.5, half
    the time each), and every value as frequent as in eager PyTorch."""
    spmd(1)
    x = torch.zeros(1 << 20, dtype=dtype)
    ours = draw(compiled(lambda t: t.clone().uniform_(low, high), 1), x, seed=3)
    eager = x.clone().uniform_(low, high)
    assert not (ours >= high).any()
    values, counts = torch.unique(ours, return_counts=True)
    eager_values, eager_counts = torch.unique(eager, return_counts=True)
    assert torch.equal(values, eager_values)
    # Binomial counts: apart by more than 6 sd of their difference by chance about never.
    assert ((counts - eager_counts).abs() <= 6 * (counts + eager_counts).sqrt()).all()


def test_normal_draws(spmd):
    spmd(2)
    z = sample(lambda x: torch.randn_like(x))
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert abs((z.abs() < 1).float().mean() - 0.6827) < 0.006
    w = sample(lambda x: torch.normal(x, 2.0) - x)
    assert abs(w.mean()) < 0.02 and abs(w.std() - 2) < 0.02
    n = sample(lambda x: torch.empty_like(x).normal_(1, 0.5))
    assert abs(n.mean() - 1) < 0.005 and abs(n.std() - 0.5) < 0.005


def test_exponential_draws(spmd):
    spmd(2)
    e = sample(lambda x: torch.empty_like(x).exponential_(2.0))
    assert e.min() > 0 and abs(e.mean() - 0.5) < 0.005
    assert abs((e > 1).float().mean() - torch.exp(torch.tensor(-2.0))) < 0.005


def test_bernoulli_and_dropout(spmd):
    spmd(2)
    b = sample(lambda x: torch.bernoulli(x))
    assert set(b.unique().tolist()) == {0.0, 1.0} and abs(b.mean() - 0.3) < 0.006
    c = sample(lambda x: x.bernoulli(0.8))
    assert abs(c.mean() - 0.8) < 0.005
    kept = sample(lambda x: F.dropout(x, 0.25, training=True))
    values = kept.unique()
    assert values.numel() == 2 and values[0] == 0 and values[1].item() == pytest.approx(0.3 / 0.75)
    assert abs((kept != 0).float().mean() - 0.75) < 0.006
    assert (sample(lambda x: F.dropout(x, 1.0, training=True)) == 0).all()
    assert (sample(lambda x: F.dropout(x, 0.5, training=False)) == 0.3).all()


def test_randint_and_randperm(spmd):
    spmd(2)
    r = sample(lambda x: torch.randint(3, 9, x.shape))
    assert r.dtype == torch.int64 and r.min() == 3 and r.max() == 8
    counts = torch.bincount(r.flatten() - 3).float() / r.numel()
    assert (counts - 1 / 6).abs().max() < 0.006
    big = sample(lambda x: torch.randint(-(1 << 39), 1 << 39, x.shape))
    assert big.min() < -(1 << 38) and big.max() > 1 << 38
    p = sample(lambda x: torch.randperm(1000) + x[0, 0].long(), shape=(2, 2))
    assert torch.equal(p.sort().values, torch.arange(1000)) and not torch.equal(p, torch.arange(1000))


def test_multinomial_without_replacement(spmd):
    spmd(2)
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0])

    def first_and_all(x):
        p = weights.expand(x.shape[0], 5) * x[:, :1] / 0.3
        return torch.multinomial(p, 4)

    drawn = sample(first_and_all, shape=(20000, 2))
    # Four distinct categories per row, never the one of weight 0 while others remain.
    assert (drawn.sort(-1).values == torch.arange(4)).all()
    frequencies = torch.bincount(drawn[:, 0], minlength=5).float() / drawn.shape[0]
    torch.testing.assert_close(frequencies, weights / 10, rtol=0, atol=0.012)
    # Second draw given the first is 3 (weight 4): the rest renormalized.
    after_three = drawn[drawn[:, 0] == 3][:, 1]
    torch.testing.assert_close(torch.bincount(after_three, minlength=5).float() / after_three.numel(),
                               torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0]) / 6, rtol=0, atol=0.02)
    everything = sample(lambda x: torch.multinomial(weights * x[0, 0], 5), shape=(2, 2))
    assert everything[-1] == 4  # the category of weight 0 comes last


def test_multinomial_with_replacement(spmd):
    spmd(2)
    weights = torch.tensor([0.0, 1.0, 0.0, 3.0, 0.0])
    drawn = sample(lambda x: torch.multinomial(weights * x[:, :1] / 0.3, 20, replacement=True), shape=(2000, 1))
    frequencies = torch.bincount(drawn.flatten(), minlength=5).float() / drawn.numel()
    torch.testing.assert_close(frequencies, weights / 4, rtol=0, atol=0.01)


@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial_raises_pytorchs_errors_after_the_run(spmd, replacement):
    spmd(2)
    fn = compiled(lambda p: torch.multinomial(p, 2, replacement=replacement), 2, (0, None))
    negative = "element < 0" if not replacement else r"encountering probability entry < 0"
    infinite = "`inf`" if not replacement else "encountering probability entry = infinity or NaN"
    for p, message in (([[1.0, -1.0, 2.0], [1.0, 1.0, 1.0]], negative),
                       ([[1.0, 1.0, 2.0], [float("inf"), 1.0, 1.0]], infinite),
                       ([[1.0, 1.0, 2.0], [0.0, 0.0, 0.0]], r"sum of probabilities <= 0")):
        with pytest.raises(RuntimeError, match=message):
            torch.multinomial(torch.tensor(p), 2, replacement=replacement)
        with pytest.raises(RuntimeError, match=message + r".*test_torch_random.py"):
            with torch.no_grad():
                fn(torch.tensor(p))


def test_bernoulli_probabilities_out_of_range_raise(spmd):
    spmd(2)
    fn = compiled(torch.bernoulli, 2, (0,))
    with pytest.raises(RuntimeError, match=r"Expected p_in >= 0 && p_in <= 1"):
        torch.bernoulli(torch.tensor([0.5, 1.5]))
    with pytest.raises(RuntimeError, match=r"Expected p_in >= 0 && p_in <= 1"):
        with torch.no_grad():
            fn(torch.tensor([0.5, 1.5]))


def test_an_explicit_generator_draws_eagerly_outside_the_graph(spmd):
    spmd(1)

    def f(x, generator):
        return x + torch.rand(x.shape, generator=generator)

    expected = torch.rand(3, generator=torch.Generator().manual_seed(4))
    got = torch.compile(f, backend="shardflow")(torch.zeros(3), torch.Generator().manual_seed(4))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_randint_range_past_two_to_the_forty_is_an_error_naming_the_line(spmd):
    spmd(1)

    def f(x):
        return x + torch.randint(0, 1 << 50, x.shape)

    with pytest.raises(Exception, match=r"randint draws 48 random bits.*ranges up to 2\^40(.|\n)*test_torch_random.py"):
        torch.compile(f, backend="shardflow")(torch.zeros(3, dtype=torch.int64))
