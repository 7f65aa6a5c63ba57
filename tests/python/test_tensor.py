"""Tensors, eager ops, mark_sharding and compile() from Python."""

from __future__ import annotations

import numpy as np
import pytest

import shardflow as sf

RNG = np.random.default_rng(0)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("trial", range(20))
def test_eager_ops_match_numpy(trial):
    rng = np.random.default_rng(trial)
    m, k, n = rng.integers(1, 9, size=3)
    a, b = randn(m, k), randn(k, n)
    x, y = sf.tensor(a), sf.tensor(b)
    np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose((x * 2 + 1).numpy(), a * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose((1 - x).numpy(), 1 - a, rtol=1e-6)
    np.testing.assert_allclose(sf.sum(x, 1).numpy(), a.sum(1), rtol=1e-5, atol=1e-5)
    e = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(x.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.transpose(0, 1).numpy(), a.T)
    np.testing.assert_array_equal(x.argmax(-1).numpy(), a.argmax(-1))


def test_ops_by_name_are_checked_like_pytorch():
    x = sf.tensor(randn(2, 3))
    np.testing.assert_allclose(sf.call("aten::add", x, x, alpha=2).numpy(), 3 * x.numpy(), rtol=1e-6)
    with pytest.raises(sf.Error, match="Expected a value of type"):
        sf.call("aten::add", x, "not a tensor")


def test_eager_mark_sharding_lays_out_shards():
    with sf.Runtime.local(8):
        mesh = sf.Mesh(np.arange(8), (4, 2), ("data", "model"))
        data = randn(17, 6)
        t = sf.mark_sharding(sf.tensor(data), mesh, ("data", None))
        assert t.sharding_spec == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
        assert t.sharding_type == "PARTIAL"
        for shard in t.local_shards:
            piece = data[shard.indices]
            np.testing.assert_array_equal(shard.data[: piece.shape[0]], piece)
            assert shard.data.shape == (5, 6)
        assert [s.replica_id for s in t.local_shards] == [0, 1, 0, 1, 0, 1, 0, 1]
        np.testing.assert_array_equal(t.numpy(), data)  # gathered
        with pytest.raises(sf.Error, match="Existing annotation must be cleared first"):
            sf.mark_sharding(t, mesh, ("model", None))
        np.testing.assert_array_equal(sf.clear_sharding(t).numpy(), data)


@pytest.mark.parametrize("trial", range(12))
def test_compiled_sharded_mlp_equals_eager_one_device(trial):
    rng = np.random.default_rng(100 + trial)
    mesh_shape = [(2, 4), (4, 2), (1, 8), (8, 1), (2, 2), (4, 1)][trial % 6]
    size = int(np.prod(mesh_shape))
    batch, hidden = int(rng.integers(1, 11)), int(rng.integers(1, 13))
    x, w1, w2 = randn(batch, 16), randn(16, hidden), randn(hidden, 16)
    expected = np.maximum(x @ w1, 0) @ w2
    with sf.Runtime.local(size):
        mesh = sf.Mesh(range(size), mesh_shape, ("data", "model"))
        w1_t, w2_t = sf.tensor(w1), sf.tensor(w2)
        sf.mark_sharding(w1_t, mesh, (None, "model"))
        sf.mark_sharding(w2_t, mesh, ("model", None))

        def mlp(x):
            x = sf.mark_sharding(x, mesh, ("data", None))
            return sf.matmul(sf.relu(sf.matmul(x, w1_t)), w2_t)

        step = sf.compile(mlp)
        for _ in range(2):
            got = step(sf.tensor(x)).numpy()
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * (1 + np.abs(expected).max()))
        assert step.stats == {"traces": 1, "cache_hits": 1, "guard_failures": 0}
        assert 'xla::dynamo_mark_sharding' in step.graph_text
        assert all(c.reason for c in step.collectives)


def test_compile_returns_the_structure_the_function_returned():
    step = sf.compile(lambda x: (x + 1, [x * 2][0]))
    a, b = step(sf.tensor(np.ones(3, np.float32)))
    assert a.numpy().tolist() == [2, 2, 2] and b.numpy().tolist() == [2, 2, 2]
    as_list = sf.compile(lambda x: [x, x])
    assert isinstance(as_list(sf.tensor([1.0])), list)


def test_a_mesh_from_arange_inside_compile_is_concrete():
    with sf.Runtime.local(4):
        def f(x):
            mesh = sf.Mesh(sf.arange(4).numpy(), (2, 2), ("a", "b"))
            return sf.mark_sharding(x * 3, mesh, ("a", "b"))

        step = sf.compile(f)
        data = randn(4, 4)
        np.testing.assert_allclose(step(sf.tensor(data)).numpy(), data * 3, rtol=1e-6)


def test_errors_inside_the_traced_function_reach_python():
    def bad(x):
        raise KeyError("from user code")

    with pytest.raises(KeyError, match="from user code"):
        sf.compile(bad)(sf.tensor([1.0]))
    with pytest.raises(sf.Error, match="must return a shardflow Tensor"):
        sf.compile(lambda x: 3)(sf.tensor([1.0]))
    with pytest.raises(sf.Error, match="takes shardflow Tensors"):
        sf.compile(lambda x: x)(np.ones(3))


def test_meta_tensors_trace_without_running():
    step = sf.compile(lambda x: sf.gelu(x @ x))
    step.trace(sf.Tensor.meta("float32", (64, 64)))
    assert "aten::gelu" in step.graph_text
    with pytest.raises(sf.Error):
        sf.Tensor.meta("float32", (2, 2)).numpy()


@pytest.mark.parametrize("call, error", [
    (lambda: sf.zeros((2**40, 2**40)), sf.Error),
    (lambda: sf.zeros((2**31, 2**31, 4)), sf.Error),
    (lambda: sf.randn((-1, 3), 0), sf.Error),
    (lambda: sf.zeros((3,), "float64"), sf.Error),
    (lambda: sf.tensor([1.0]).reshape(5), sf.Error),
    (lambda: sf.full((2**20, 2**20), 1.0), sf.Error),
    (lambda: sf.call("aten::nope", 1), sf.Error),
    (lambda: sf.tensor([1.0]) + "a", TypeError),
    (lambda: sf.tensor([1.0]).to(object()), sf.Error),
    (lambda: sf.reshape(sf.tensor([1.0]), [2**62, 2**62]), sf.Error),
    (lambda: sf.Tensor.meta("float32", (2**62, 4)).numpy(), sf.Error),
])
def test_bad_tensor_input_is_an_exception_not_a_crash(call, error):
    with pytest.raises(error):
        call()
