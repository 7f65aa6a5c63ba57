"""State a compiled function writes in place (a KV cache): the torch tensor
holds the same values as under eager PyTorch after every call, while a
marked tensor's shards stay laid out on the devices and are updated there."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn as nn

import shardflow as sf
import shardflow.torch as sft
import shardflow.torch.runtime as xr
import shardflow.torch.spmd as xs
from shardflow.torch import _mutation, _state


# Each writes rows `x` [B, 1, D] at position `pos` (a 1-element i64 tensor)
# into `cache` [B, S, D], as people write a cache update.
WRITES = {
    "index_copy_": lambda cache, x, pos: cache.index_copy_(1, pos, x),
    "setitem_tensor_position": lambda cache, x, pos: cache.__setitem__((slice(None), pos), x),
    "setitem_int_position": lambda cache, x, pos: cache.__setitem__((slice(None), 2), x[:, 0] * 2),
    "setitem_nested_slices": lambda cache, x, pos: cache[:1].__setitem__((slice(None), slice(3, 5)), x[:1] + 1),
    "setitem_strided_slice": lambda cache, x, pos: cache.__setitem__((slice(None), slice(0, 6, 3)), x - 1),
    "negative_tensor_position": lambda cache, x, pos: cache.__setitem__((slice(None), pos - 6), x),
    "scaled_whole": lambda cache, x, pos: cache.mul_(0.5),
    "copied_whole": lambda cache, x, pos: cache.copy_(cache + x),
}


class CacheStep(nn.Module):
    def __init__(self, writes: list[str], shape=(2, 6, 4)):
        super().__init__()
        self.register_buffer("cache", torch.zeros(shape))
        self.writes = writes

    def forward(self, x, pos):
        for name in self.writes:
            WRITES[name](self.cache, x, pos)
        return self.cache.sum(1) * x[:, 0]


def run_steps(model: CacheStep, step, positions) -> list[torch.Tensor]:
    """Outputs of `step` at each position, each followed by a snapshot of the cache."""
    outputs = []
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in positions:
            x = torch.randn(model.cache.shape[0], 1, model.cache.shape[2], generator=generator)
            outputs += [step(x, torch.tensor([p])), model.cache.clone()]
    return outputs


def compare(writes: list[str], spec, devices: int, mesh_shape, positions=(1, 4, 0, 5)) -> CacheStep:
    eager = CacheStep(writes)
    expected = run_steps(eager, eager, positions)
    model = CacheStep(writes)
    if spec is not None:
        xs.mark_sharding(model.cache, xs.Mesh(range(devices), mesh_shape, ("x", "y")[:len(mesh_shape)]), spec)
    got = run_steps(model, torch.compile(model, backend="shardflow"), positions)
    for i, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=lambda m: f"output {i}: {m}")
    return model


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("spec", [None, (None, "x", "y"), ("x", None, "y"), ("y", "x", None)])
def test_writes_to_a_cache_match_eager_pytorch(spmd, write, spec):
    spmd(4)
    compare([write], spec, 4, (2, 2))


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("devices,mesh_shape,spec", [
    (1, (1, 1), (None, "x", "y")),
    (1, (1, 1), None),
    (2, (1, 1), None),  # no annotation: the graph runs on device 0
    (2, (2,), ("x", None, None)),  # each device's shard: one batch row
    (4, (2, 2), ("y", "x", None)),  # one batch row, half the positions
])
def test_a_cache_is_written_in_its_own_memory(spmd, monkeypatch, write, devices, mesh_shape, spec):
    """A graph that writes a cache held on one device (a one-device runtime,
    or no annotation on several devices, where it runs on device 0), or
    split so that each device's shard is one run of its memory, is fed the
    cache's torch memory: row writes land there (nothing copied back, the
    cache held once), and the next call is fed that result again (no new
    view per call). A new value the run may compute elsewhere (a product, a
    copy of a sum) is copied in whole: `compare` checks the values after
    every call."""
    spmd(devices)
    views = []
    real_view = _state.writable_view
    monkeypatch.setattr(_state, "writable_view", lambda t, s: views.append(t) or real_view(t, s))
    model = compare([write], spec, devices, mesh_shape)
    if write in ("scaled_whole", "copied_whole"):
        assert len(views) == 4  # a new view on each of the 4 calls
    else:
        assert len(views) == 1  # the first call's
        assert sf._core._lies_in(_state.sharded(model.cache), model.cache.data_ptr())


def test_which_layouts_let_shards_view_runs_of_the_tensor(spmd):
    spmd(4)
    mesh = xs.Mesh(range(4), (2, 2), ("x", "y"))._core()
    runs = lambda spec, shape: sf._core._shards_are_runs(sf.Sharding.from_spec(mesh, spec), shape)  # noqa: E731
    assert runs(("x", "y", None), [2, 6, 4])  # one row, half the positions: a run
    assert not runs((None, "x", "y"), [2, 6, 4])  # every row's slice: not a run
    assert not runs(("x", None, None), [2, 6, 4])  # each tile on two devices ('y' replicates)
    assert not runs(("x", "y", None), [2, 5, 4])  # padded
    assert not runs(("x", "y", None), [2, 0, 4])  # empty: nothing to view


def test_a_cache_split_into_runs_of_its_memory_sees_a_zeroing_without_a_copy(spmd, monkeypatch):
    """`cache.zero_()` between generations (Hugging Face's StaticCache.reset):
    the next call is fed new views of the cache's memory, which hold the
    zeros already; nothing is laid out again."""
    spmd(2)
    model = CacheStep(["index_copy_"])
    xs.mark_sharding(model.cache, xs.Mesh(range(2), (2,), ("x",)), ("x", None, None))
    step = torch.compile(model, backend="shardflow")
    x = torch.ones(2, 1, 4)
    with torch.no_grad():
        step(x, torch.tensor([1]))
        layouts = []
        real_layout = sf.mark_sharding
        monkeypatch.setattr(_state.sf, "mark_sharding", lambda *a, **k: layouts.append(a) or real_layout(*a, **k))
        model.cache.zero_()
        out = step(x, torch.tensor([3]))
    assert layouts == []
    expected = torch.zeros(2, 6, 4)
    expected[:, 3] = 1
    torch.testing.assert_close(model.cache, expected)
    torch.testing.assert_close(out, expected.sum(1) * x[:, 0])
    assert sf._core._lies_in(_state.sharded(model.cache), model.cache.data_ptr())


def test_several_writes_in_one_call_on_an_uneven_sharded_dim(spmd):
    spmd(4)  # 6 positions over 4 devices: the last shard is padded
    compare(["index_copy_", "setitem_nested_slices", "setitem_int_position", "negative_tensor_position"],
            (None, "x", None), 4, (4,))


def test_random_write_sequences_on_random_meshes_match_eager(spmd):
    rng = random.Random(7)
    for devices in (1, 2, 3, 6, 8):
        spmd(devices)
        for _ in range(4):
            shape = rng.choice([(devices,), (1, devices), (2, devices // 2) if devices % 2 == 0 else (devices, 1)])
            names = ("x", "y")[:len(shape)]
            spec = tuple(rng.choice([None, *names]) for _ in range(3))
            if len({a for a in spec if a}) != len([a for a in spec if a]):
                spec = (None, names[0], None)
            writes = rng.sample(sorted(WRITES), rng.randint(1, 3))
            torch._dynamo.reset()
            compare(writes, spec, devices, shape, positions=[rng.randrange(6) for _ in range(3)])


def test_a_marked_cache_stays_laid_out_and_is_updated_in_place(spmd, monkeypatch):
    spmd(4)
    model = CacheStep(["index_copy_"])
    mesh = xs.Mesh(range(4), (2, 2), ("x", "y"))
    xs.mark_sharding(model.cache, mesh, ("x", "y", None))
    layouts = []
    real = _state.sf.mark_sharding
    monkeypatch.setattr(_state.sf, "mark_sharding", lambda *a, **k: layouts.append(a) or real(*a, **k))
    step = torch.compile(model, backend="shardflow")
    with torch.no_grad():
        step(torch.ones(2, 1, 4), torch.tensor([0]))
        for p in range(1, 5):
            before = _state.sharded(model.cache)
            step(torch.full((2, 1, 4), float(p)), torch.tensor([p]))
            with pytest.raises(sf.Error, match="donated"):
                before.numpy()  # its shards moved into the run, which wrote them in place
    assert layouts == []  # never laid out again from the torch tensor
    shards = _state.sharded(model.cache)
    assert shards.sharding.v1 == xs.get_sharding(model.cache).v1 == "{devices=[2,2,1]0,1,2,3}"
    torch.testing.assert_close(torch.from_dlpack(shards), model.cache)
    assert model.cache[0, :5, 0].tolist() == [1.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("devices, spec", [(4, ("x", "y", None)), (1, (None, None, None))])
def test_a_marked_cache_written_outside_is_laid_out_again_by_the_run(spmd, monkeypatch, devices, spec):
    """``cache.zero_()`` between generations (as Hugging Face's StaticCache.reset
    does): the next call feeds the tensor whole and its devices copy their own
    tiles in the run (in parallel), instead of an eager split before it; the
    run's shards become the cache's."""
    spmd(devices)
    eager, model = CacheStep(["index_copy_"]), CacheStep(["index_copy_"])
    xs.mark_sharding(model.cache, xs.Mesh(range(devices), (2, 2) if devices == 4 else (1, 1), ("x", "y")), spec)
    marked = xs.get_sharding(model.cache).v1
    layouts = []
    real = _state.sf.mark_sharding
    monkeypatch.setattr(_state.sf, "mark_sharding", lambda *a, **k: layouts.append(a) or real(*a, **k))
    step = torch.compile(model, backend="shardflow")
    with torch.no_grad():
        for reset in (lambda c: c.zero_(), lambda c: c.fill_(3.0), lambda c: None):
            for m in (eager, model):
                reset(m.cache)
            for p in (2, 0):
                x = torch.randn(2, 1, 4)
                torch.testing.assert_close(step(x, torch.tensor([p])), eager(x, torch.tensor([p])))
                torch.testing.assert_close(model.cache, eager.cache)
    assert layouts == []
    assert xs.get_sharding(model.cache).v1 == marked
    torch.testing.assert_close(torch.from_dlpack(_state.sharded(model.cache)), eager.cache)


class AnnotatedRowsStep(CacheStep):
    """A cache the user never marks, written with rows annotated inside forward."""

    def __init__(self, mesh):
        super().__init__(["index_copy_"])
        self.mesh = mesh

    def forward(self, x, pos):
        if self.mesh is not None:
            xs.mark_sharding(x, self.mesh, ("x", None, "y"))
        return super().forward(x, pos)


@pytest.mark.parametrize("devices", [1, 4])
def test_an_unmarked_cache_keeps_the_layout_propagation_chose(spmd, monkeypatch, devices):
    """As PyTorch/XLA keeps device data between calls: after the first call an
    unmarked cache the graph writes is held laid out as propagation chose, its
    shards updated in place, not copied (nor laid out again) per call."""
    spmd(devices)
    mesh = xs.Mesh(range(4), (2, 2), ("x", "y")) if devices == 4 else None
    model, eager = AnnotatedRowsStep(mesh), CacheStep(["index_copy_"])
    assert xs.get_sharding(model.cache) is None
    expected = run_steps(eager, eager, range(1)) + run_steps(eager, eager, range(1, 5))
    layouts = []
    real = _state.sf.mark_sharding
    monkeypatch.setattr(_state.sf, "mark_sharding", lambda *a, **k: layouts.append(a) or real(*a, **k))
    step = torch.compile(model, backend="shardflow")
    got = run_steps(model, step, range(1))
    kept = xs.get_sharding(model.cache)
    assert kept is not None
    assert len(layouts) == (1 if devices == 4 else 0)  # laid out once, in the first call; on one device never
    assert kept.v1 == ("{devices=[2,1,2]0,1,2,3}" if devices == 4 else "{replicated}")
    before = _state.sharded(model.cache)
    got += run_steps(model, step, range(1, 5))
    if devices == 4:
        assert len(layouts) == 1  # not laid out again
        with pytest.raises(sf.Error, match="donated"):
            before.numpy()  # its shards moved into the next run, which wrote them in place
    else:
        assert layouts == []  # one device: the graph writes the torch tensor's own memory
        assert sf._core._lies_in(_state.sharded(model.cache), model.cache.data_ptr())
    for i, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=lambda m: f"output {i}: {m}")


def test_an_eager_write_between_calls_is_seen_by_the_next_call(spmd):
    spmd(2)
    model = CacheStep(["index_copy_"])
    xs.mark_sharding(model.cache, xs.Mesh(range(2), (2,), ("x",)), (None, "x", None))
    step = torch.compile(model, backend="shardflow")
    with torch.no_grad():
        step(torch.ones(2, 1, 4), torch.tensor([1]))
        model.cache.fill_(3.0)
        out = step(torch.ones(2, 1, 4), torch.tensor([2]))
    assert model.cache[:, :, 0].tolist() == [[3, 3, 1, 3, 3, 3]] * 2
    torch.testing.assert_close(out, torch.full((2, 4), 16.0))


@pytest.mark.parametrize("devices", [2, 1])
def test_a_failed_call_leaves_the_cache_as_it_was(spmd, devices):
    """Also on one device, where the failed run was fed the cache's own
    memory kept from the call before."""
    spmd(devices)
    model = CacheStep(["index_copy_"])
    xs.mark_sharding(model.cache, xs.Mesh(range(devices), (devices,), ("x",)), ("x", None, None))
    step = torch.compile(model, backend="shardflow")
    with torch.no_grad():
        step(torch.ones(2, 1, 4), torch.tensor([1]))
        step(torch.ones(2, 1, 4), torch.tensor([2]))
        with pytest.raises(sf.Error, match="index 9 is out of bounds for dimension 1 with size 6"):
            step(torch.ones(2, 1, 4), torch.tensor([9]))
        step(torch.full((2, 1, 4), 2.0), torch.tensor([3]))
    assert model.cache[:, :, 0].tolist() == [[0, 1, 1, 2, 0, 0]] * 2
    assert xs.get_sharding(model.cache).v1 == ("{devices=[2,1,1]0,1}" if devices == 2 else "{replicated}")


def test_writes_that_are_not_supported_name_the_line(spmd):
    spmd(1)

    def masked(cache, x):  # one value into every selected element: a where, written into the input
        cache[cache > 0] = 1.0
        return x

    cache = torch.randn(3, 4)
    expected = cache.clone()
    masked(expected, None)
    with torch.no_grad():
        torch.compile(masked, backend="shardflow")(cache, torch.randn(3))
    assert torch.equal(cache, expected)

    def masked_with_an_index(cache, x):
        cache[cache[:, 0] > 0, torch.tensor([1])] = 5.0
        return x

    with pytest.raises(Exception, match=r"integer index tensors \(at .*test_torch_state.py.*a boolean mask is "
                                        r"supported only to write one value"):
        with torch.no_grad():
            torch.compile(masked_with_an_index, backend="shardflow")(torch.randn(3, 4), torch.randn(3))

    def values_of_the_wrong_shape(cache, x):
        cache[torch.tensor([0, 2]), torch.tensor([1, 3])] = x
        return x

    with pytest.raises(Exception, match=r"shape mismatch: value tensor of shape \[3\] cannot be broadcast to "
                                        r"indexing result of shape \[2, 5\] \(at .*test_torch_state.py"):
        with torch.no_grad():
            torch.compile(values_of_the_wrong_shape, backend="shardflow")(torch.randn(3, 4, 5), torch.randn(3))


@pytest.mark.parametrize("marked", [False, True])
def test_writes_through_several_index_tensors_and_accumulating_writes_update_the_input(spmd, marked):
    spmd(4)

    def write(cache, values, rows, columns):
        cache[rows, :, columns] = values
        cache.index_put_((rows,), torch.ones(5, 6), accumulate=True)  # rows may repeat: both add
        return cache.sum()

    cache, reference = torch.zeros(4, 5, 6), torch.zeros(4, 5, 6)
    if marked:
        xs.mark_sharding(cache, xs.Mesh(torch.arange(4), (4,)), (None, 0, None))
    compiled = torch.compile(write, backend="shardflow", dynamic=False)
    for step in range(3):
        rows, columns = torch.tensor([step, 3, step]), torch.tensor([1, step + 2, 1])
        values = torch.arange(15.0).reshape(3, 5) + step
        with torch.no_grad():
            got = compiled(cache, values, rows, columns)
            expected = write(reference, values, rows, columns)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(cache, reference)


def test_the_decode_graph_writes_each_cache_in_place(spmd):
    """The graph returns only the written rows for the torch tensor, not the whole cache."""
    spmd(1)
    model = CacheStep(["index_copy_"], shape=(1, 64, 8))
    xs.mark_sharding(model.cache, xs.Mesh([0], (1,), ("x",)), (None, "x", None))
    with torch.no_grad():
        torch.compile(model, backend="shardflow")(torch.ones(1, 1, 8), torch.tensor([3]))
    (graph,) = [g for g in sft.compiled_graphs if g.last is not None][-1:]
    returned = graph.last.ir.split("-> (")[1].split(")")[0]
    assert returned == "f32[1,8], f32[1,64,8], i64[1], f32[1,1,8]"  # output, new shards, index, rows


@pytest.mark.parametrize("write", ["index_copy_", "setitem_tensor_position", "negative_tensor_position"])
def test_row_writes_reach_the_torch_tensor_without_torch_ops(spmd, monkeypatch, write):
    """A cache update (whole rows at tensor positions) is written into the
    torch tensor's memory by shardflow in one call per graph run, not replayed
    with torch ops, and the tensor still matches eager PyTorch."""
    spmd(4)
    calls = []
    real = sf._core._put_rows_into
    monkeypatch.setattr(sf._core, "_put_rows_into", lambda writes: calls.append(len(writes)) or real(writes))
    monkeypatch.setattr(_mutation.Mutation, "apply", lambda *a: pytest.fail("replayed with torch ops"))
    compare([write], (None, "x", "y"), 4, (2, 2))
    assert calls == [1] * 4  # one write per call, at each of the 4 positions


def test_a_cache_that_is_not_contiguous_is_written_with_torch_ops(spmd, monkeypatch):
    """Its memory is not one row-major block shardflow could write: the rows
    are replayed with torch ops, and the values still match eager PyTorch."""
    spmd(2)
    monkeypatch.setattr(sf._core, "_put_rows_into", lambda writes: pytest.fail("written by shardflow"))

    class Transposed(CacheStep):
        def __init__(self, writes):
            super().__init__(writes)
            self.cache = torch.zeros(6, 2, 4).transpose(0, 1)  # [2, 6, 4], not contiguous

    for cls_writes in (["index_copy_"], ["setitem_tensor_position", "negative_tensor_position"]):
        eager, model = Transposed(cls_writes), Transposed(cls_writes)
        xs.mark_sharding(model.cache, xs.Mesh(range(2), (2,), ("x",)), (None, "x", None))
        expected = run_steps(eager, eager, (1, 4, 0))
        torch._dynamo.reset()
        got = run_steps(model, torch.compile(model, backend="shardflow"), (1, 4, 0))
        assert _state.memory_view(model.cache) is None
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e)


def test_row_writes_go_only_into_memory_another_library_owns():
    """Kernels never write shardflow's own (possibly shared) buffers in place."""
    rows = (sf.from_dlpack(torch.tensor([1])), sf.from_dlpack(torch.ones(1, 4)))
    target = torch.zeros(3, 4)
    sf._core._put_rows_into([(sf.from_dlpack(target), 0, *rows)])
    assert target[:, 0].tolist() == [0, 1, 0]
    with pytest.raises(sf.Error, match="writes only into memory viewed with from_dlpack"):
        sf._core._put_rows_into([(sf.zeros([3, 4]), 0, *rows)])


INDEX_READS = {
    "rows": lambda t, idx: t[idx],
    "inner_dim": lambda t, idx: t[:, idx],
    "negative": lambda t, idx: t[:, idx - 7],
    "matrix_of_positions": lambda t, idx: t[torch.stack([idx, idx - 1])],
    "int32_positions": lambda t, idx: t[:, :, (idx - 3).to(torch.int32)],
}


@pytest.mark.parametrize("read", sorted(INDEX_READS))
@pytest.mark.parametrize("spec", [None, ("x", None, None), (None, "x", None)])
def test_reads_at_tensor_positions_match_eager(spmd, read, spec):
    spmd(2)
    t = torch.randn(6, 7, 3)
    if spec is not None:
        xs.mark_sharding(t, xs.Mesh(range(2), (2,), ("x",)), spec)
    idx = torch.tensor([4, 0, 5, 5])
    fn = lambda idx: INDEX_READS[read](t, idx) * 2  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(fn, backend="shardflow")(idx), fn(idx))
