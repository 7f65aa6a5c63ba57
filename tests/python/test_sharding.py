"""The sharding core from Python: the same strings, layouts and errors as C++."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

import shardflow as sf


def random_cases(count: int, seed: int = 7):
    """Random meshes (1-3 axes, up to 8 devices, named or not, custom orders) and specs."""
    rng = random.Random(seed)
    shapes = [(8,), (2, 4), (4, 2), (1, 8), (2, 2, 2), (4, 1, 2), (2, 1), (1,), (3, 2)]
    for _ in range(count):
        mesh_shape = rng.choice(shapes)
        size = int(np.prod(mesh_shape))
        ids = list(range(size))
        if rng.random() < 0.3:
            rng.shuffle(ids)
        names = tuple("abc"[: len(mesh_shape)]) if rng.random() < 0.5 else None
        axes = [names[i] if names else i for i in range(len(mesh_shape))]
        rank = rng.randint(1, 4)
        rng.shuffle(axes)
        spec = []
        for _dim in range(rank):
            roll = rng.random()
            if roll < 0.35 or not axes:
                spec.append(None)
            elif roll < 0.8 or len(axes) < 2:
                spec.append(axes.pop())
            else:
                spec.append((axes.pop(), axes.pop()))
        shape = [rng.randint(1, 20) for _ in range(rank)]
        yield ids, mesh_shape, names, tuple(spec), shape


def spec_text(spec) -> str:
    return repr(tuple(spec))


@pytest.mark.parametrize("case", list(random_cases(60)), ids=lambda c: f"{c[1]}-{c[3]}")
def test_strings_and_layout_match_the_cli(case, cli):
    ids, mesh_shape, names, spec, shape = case
    mesh = sf.Mesh(ids, mesh_shape, names)
    sharding = sf.Sharding.from_spec(mesh, spec)
    args = ["sharding", "--mesh-shape", ",".join(map(str, mesh_shape)), "--device-ids", ",".join(map(str, ids)),
            "--spec", spec_text(spec), "--shape", ",".join(map(str, shape))]
    if names:
        args += ["--axis-names", ",".join(names)]
    expected = cli(*args)
    assert sharding.v1 == expected["v1"]
    assert sharding.v2 == expected["v2"]
    assert sharding.type == expected["type"]
    assert sharding.readable_for(shape) == expected["readable"]
    layout = sharding.shard_layout(shape)
    assert list(layout.shard_shape) == expected["shard_shape"]
    for shard, want in zip(layout.shards, expected["shards"]):
        assert shard.device == want["device"]
        assert shard.replica_id == want["replica_id"]
        assert [list(s) for s in shard.slices] == want["slices"]


def test_the_readme_example_strings():
    mesh = sf.Mesh(list(range(8)), (4, 1, 2), ("data", "fsdp", "model"))
    s = sf.Sharding.from_spec(mesh, ("data", None, "model"))
    assert s.readable == "[{data},{},{model}]"
    assert s.v1 == "{devices=[4,1,2]0,1,2,3,4,5,6,7}"
    assert s.v2 == "{devices=[4,1,2]<=[8]}"
    assert s.type == "TILED"
    grouped = sf.Sharding.from_spec(mesh, "(('data', 'fsdp'), None, None)")
    assert grouped == sf.Sharding.from_spec(mesh, sf.PartitionSpec(("data", "fsdp"), None, None))


@pytest.mark.parametrize("device_ids", [
    [0, 1, 2, 3], (0, 1, 2, 3), range(4), np.arange(4), torch.arange(4), np.array([[0, 1], [2, 3]]),
])
def test_mesh_accepts_lists_tuples_and_arrays(device_ids):
    mesh = sf.Mesh(device_ids, (2, 2), ("x", "y"))
    assert mesh.device_ids == [0, 1, 2, 3]
    assert mesh.mesh_shape == (2, 2)
    assert mesh.axis_names == ("x", "y")
    assert mesh.size() == 4
    assert mesh.shape() == {"x": 2, "y": 2}
    assert mesh.get_logical_mesh().tolist() == [[0, 1], [2, 3]]
    assert str(mesh) == "{'device_ids': [0, 1, 2, 3], 'mesh_shape': (2, 2), 'axis_names': ('x', 'y')}"
    assert sf.Mesh.from_str(str(mesh)) == mesh


# PyTorch/XLA's messages (sharding-semantics §1.2, §2.1, §7.3); it raises
# AssertionError or ValueError for these, and shardflow's error is both.
@pytest.mark.parametrize("make, message", [
    (lambda: sf.Mesh(range(8), (1, 8), ("data", "model", "extra")),
     "Number of axis names (3) must match mesh dimensions (2)"),
    (lambda: sf.Mesh(range(4), (2, 2), ("x", "x")), "Axis names must be unique, got: ('x', 'x')"),
    (lambda: sf.Mesh([0, 0, 1, 2], (2, 2)), "Device IDs must be unique, got: [0 0 1 2]"),
    (lambda: sf.Mesh(range(4), (2, 4)), "Number of device IDs (4) must match mesh size (8)"),
    (lambda: sf.Mesh([0, 1, 2, 9], (2, 2)), "Device IDs must be less than mesh size (4), got: [0 1 2 9]"),
    (lambda: sf.Sharding.from_spec(sf.Mesh(range(8), (2, 4)), (0, 2)),
     "partition_spec ((0, 2)) contains out of bound index into mesh_shape."),
    (lambda: sf.Sharding.from_spec(sf.Mesh(range(8), (2, 4)), (0, 0)),
     "Each device mesh dimension should appear at most once in partition_spec (0, 0)."),
    (lambda: sf.Sharding.from_spec(sf.Mesh(range(8), (2, 4), ("x", "y")), ("z", None)),
     "Axis name z is not defined in the given mesh"),
    (lambda: sf.Sharding.from_spec(sf.Mesh(range(8), (2, 4)), ("x", None)), "argument of type 'NoneType' is not iterable"),
    (lambda: sf.Sharding.from_spec(sf.Mesh(range(8), (2, 4)), ((0, (1,)),)), "Partition spec cannot contain nested tuples"),
    (lambda: sf.Sharding.from_spec(sf.Mesh(range(8), (2, 4)), (0.5, None)),
     "Spec type <class 'float'> is not supported in partition spec"),
])
def test_invalid_meshes_and_specs_raise_value_errors_with_pytorch_xla_messages(make, message):
    with pytest.raises(ValueError) as error:
        make()
    assert str(error.value) == message
    assert isinstance(error.value, AssertionError)
    assert isinstance(error.value, sf.Error)


@pytest.mark.parametrize("mesh_shape, spec, spec_type, sharding_type, v1", [
    ((2, 1), (None, 1), "PARTIAL", "REPLICATED", "{replicated}"),
    ((1,), (0,), "MAXIMAL", "REPLICATED", "{replicated}"),
    ((2, 4), (None, 0, 1), "PARTIAL", "TILED", "{devices=[1,2,4]0,1,2,3,4,5,6,7}"),
    ((2, 4), (0, None), "PARTIAL", "PARTIAL", "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
])
def test_type_is_what_pytorch_xla_reports(mesh_shape, spec, spec_type, sharding_type, v1):
    mesh = sf.Mesh(range(int(np.prod(mesh_shape))), mesh_shape)
    s = sf.Sharding.from_spec(mesh, spec)
    assert (s.v1, s.type, s.spec_type) == (v1, sharding_type, spec_type)
    assert sf.HloSharding.parse(s.v1).type == sharding_type


def test_partition_spec_reads_like_python():
    spec = sf.PartitionSpec("data", None, ("x", "y"))
    assert str(spec) == "('data', None, ('x', 'y'))"
    assert repr(spec) == "PartitionSpec('data', None, ('x', 'y'))"
    assert list(spec) == ["data", None, ("x", "y")]
    assert len(spec) == 3 and spec[-1] == ("x", "y")
    assert sf.PartitionSpec.parse("('data', None, ('x', 'y'))") == spec
    assert str(sf.PartitionSpec("x")) == "('x',)"


def test_hlo_sharding_parses_and_normalises_like_xla():
    h = sf.HloSharding.parse("{devices=[2,2]1,0,3,2 last_tile_dim_replicate}")
    assert str(h) == "{devices=[2,2]0,1,2,3 last_tile_dim_replicate}"
    assert h.kind == "tiled" and h.type == "PARTIAL" and h.tile_shape == (2, 2)
    assert sf.HloSharding.parse("{maximal device=3}").maximal_device == 3
    with pytest.raises(sf.Error, match="column"):
        sf.HloSharding.parse("{devices=[2,2]0,1,2")


def test_draw_and_layout_agree():
    mesh = sf.Mesh(range(8), (2, 4))
    s = sf.Sharding.from_spec(mesh, (None, 1))
    drawing = s.draw((10, 20))
    assert "0,4" in drawing and "[15:20]" in drawing
    layout = s.shard_layout((10, 20))
    data = np.arange(200, dtype=np.float32).reshape(10, 20)
    shards = layout.split(data)
    for shard, piece in zip(layout.shards, shards):
        np.testing.assert_array_equal(piece, data[shard.indices])
        assert not piece.flags.writeable


@pytest.mark.parametrize("call", [
    lambda: sf.Mesh("0123", (2, 2)),
    lambda: sf.Mesh([0, 1], "x"),
    lambda: sf.Mesh([0, 1.5], (2,)),
    lambda: sf.Mesh([True, False], (2,)),
    lambda: sf.Mesh([0, 2**70], (2,)),
    lambda: sf.Mesh([0, 1], (2,), "xy"),
    lambda: sf.Sharding.from_spec(sf.Mesh([0, 1], (2,)), object()),
    lambda: sf.Sharding.from_spec(sf.Mesh([0, 1], (2,)), "(0,"),
    lambda: sf.Sharding.from_spec(sf.Mesh([0, 1], (2,)), "(" * 10000),
    lambda: sf.HloSharding.parse("\x00\xff{devices=["),
    lambda: sf.Sharding.from_spec(sf.Mesh([0, 1], (2,)), (0,)).shard_layout([-1]),
    lambda: sf.Mesh(range(4), (2**40, 2**40)),
])
def test_bad_input_is_an_exception_not_a_crash(call):
    with pytest.raises((sf.Error, TypeError, ValueError, OverflowError)):
        call()


def test_huge_shapes_lay_out_without_allocating():
    mesh = sf.Mesh(range(8), (8,))
    layout = sf.Sharding.from_spec(mesh, (0, None)).shard_layout([2**62, 2**40])
    assert layout.shard_shape == (2**59, 2**40)
    assert layout.shards[7].slices[0] == (7 * 2**59, 2**62)


def test_every_combination_of_a_small_mesh_round_trips_through_v1():
    mesh = sf.Mesh(range(4), (2, 2), ("x", "y"))
    entries = [None, "x", "y", ("x", "y"), ("y", "x")]
    for spec in itertools.product(entries, repeat=2):
        flat = [a for e in spec if e for a in (e if isinstance(e, tuple) else (e,))]
        if len(flat) != len(set(flat)):
            continue
        s = sf.Sharding.from_spec(mesh, spec)
        assert str(sf.HloSharding.parse(s.v1)) == s.v1
