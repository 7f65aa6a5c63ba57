"""Graphs from Python: parse, propagate, partition and run, as the CLI does."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import shardflow as sf

MLP = """func @mlp(%x: f32[8,512], %w1: f32[512,2048], %w2: f32[2048,512]) -> (f32[8,512]) {
  %0 = xla::dynamo_mark_sharding(%x, [0, 1, 2, 3, 4, 5, 6, 7], "(4, 2)", "('data', 'model')", "('data', None)") : f32[8,512]
  %1 = xla::dynamo_mark_sharding(%w1, [0, 1, 2, 3, 4, 5, 6, 7], "(4, 2)", "('data', 'model')", "(None, 'model')") : f32[512,2048]
  %2 = aten::matmul(%0, %1) : f32[8,2048]
  %3 = aten::gelu(%2) : f32[8,2048]
  %4 = aten::matmul(%3, %w2) : f32[8,512]
  return %4
}
"""

# Graphs with uneven dims, reductions, movement and lookups, each run sharded
# and checked against one device.
GRAPHS = [
    MLP,
    """func @f(%x: f32[17,6]) -> (f32[6]) {
  %a = xla::dynamo_mark_sharding(%x, [0, 1, 2, 3], "(4,)", "('x',)", "('x', None)") : f32[17,6]
  %s = aten::sum.dim_IntList(%a, [0]) : f32[6]
  return %s
}""",
    """func @f(%x: f32[4,6,10]) -> (f32[10,4,6]) {
  %a = xla::dynamo_mark_sharding(%x, [0, 1, 2, 3], "(2, 2)", "('a', 'b')", "(None, 'a', 'b')") : f32[4,6,10]
  %t = aten::permute(%a, [2, 0, 1]) : f32[10,4,6]
  %b = xla::dynamo_mark_sharding(%t, [0, 1, 2, 3], "(2, 2)", "('a', 'b')", "('b', None, 'a')") : f32[10,4,6]
  return %b
}""",
    """func @f(%w: f32[50,8], %i: i64[3,5]) -> (f32[3,5,8]) {
  %a = xla::dynamo_mark_sharding(%w, [0, 1], "(2,)", "('m',)", "('m', None)") : f32[50,8]
  %e = aten::embedding(%a, %i) : f32[3,5,8]
  return %e
}""",
]


def test_parse_verify_print_round_trip():
    g = sf.Graph.parse(MLP)
    assert g.name == "mlp" and g.inputs == ["%x", "%w1", "%w2"] and g.outputs == ["%4"]
    assert sf.Graph.parse(g.text).text == g.text
    assert g.type_of("%2") == "f32[8,2048]"


def test_partition_reports_collectives_like_the_cli(tmp_path, cli):
    path = pathlib.Path(tmp_path) / "mlp.ir"
    path.write_text(MLP)
    expected = cli("partition", str(path))
    program = sf.partition(sf.Graph.parse(MLP))
    got = [{"kind": c.kind, "axes": c.axes, "bytes_per_device": c.bytes_per_device, "value": c.value,
            "reason": c.reason} for c in program.collectives]
    assert got == expected["collectives"]
    assert program.warnings == expected["warnings"]
    shardings = program.shardings
    for name, value in expected["values"].items():
        assert shardings.sharding(name).v1 == value["sharding"]
        assert shardings.readable(name) == value["readable"]
    (all_reduce,) = program.collectives
    assert all_reduce.groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert "all-reduce over 'model'" in program.text


def chain_of_adds(ops: int, zigzag: bool) -> str:
    """An annotation on %x0 carried along `ops` adds: in graph order, or
    zig-zagging so that every round of propagation moves it two adds."""
    text = "func @chain(%x0: f32[8]" + "".join(f", %x{k}: f32[8]" for k in range(1, ops + 1)) + ") -> (f32[8]) {\n"
    text += '  %a = xla::dynamo_mark_sharding(%x0, [0, 1], "(2,)", "(\'d\',)", "(\'d\',)") : f32[8]\n'
    for n in range(ops):
        k = n ^ 1 if zigzag else n
        lhs = "a" if k == 0 else f"x{k}"
        text += f"  %y{k} = aten::add.Tensor(%{lhs}, %x{k + 1}) : f32[8]\n"
    return text + "  return %y0\n}\n"


def test_propagation_that_stops_at_its_round_limit_says_so():
    settled = sf.propagate(sf.Graph.parse(chain_of_adds(300, zigzag=False)))
    assert settled.readable("%x300") == "f32[8@d]" and settled.warnings == []
    stopped = sf.propagate(sf.Graph.parse(chain_of_adds(300, zigzag=True)))
    assert stopped.readable("%x257") == "f32[8]"
    assert len(stopped.warnings) == 2
    assert stopped.warnings[0].startswith("sharding propagation over pass-through ops stopped after 64 rounds while "
                                          "still changing (%y127 changed in the last round)")
    assert sf.partition(sf.Graph.parse(chain_of_adds(300, zigzag=True))).warnings[:2] == stopped.warnings


@pytest.mark.parametrize("text", GRAPHS, ids=range(len(GRAPHS)))
def test_sharded_runs_match_one_device(text):
    g = sf.Graph.parse(text)
    program = sf.partition(g)
    result = sf.run(program, seed=3, check=True)
    assert result.check.within_tolerance
    reference = g.run_one_device(g.random_inputs(3))
    for got, want in zip(result.outputs, reference):
        # The check's tolerance: sharded sums add in another order.
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * (1 + np.abs(want).max()))


def test_run_takes_numpy_inputs_and_checks_them():
    g = sf.Graph.parse(GRAPHS[1])
    x = np.random.default_rng(0).standard_normal((17, 6)).astype(np.float32)
    (out,) = sf.run(g, [x]).outputs
    np.testing.assert_allclose(out, x.sum(axis=0), rtol=1e-5, atol=1e-5)
    with pytest.raises(sf.Error, match=r"input 0 \(%x\) must be f32\[17,6\], got f32\[6,17\]"):
        sf.run(g, [x.T.copy()])


def test_a_runtime_is_used_while_open_and_ends_in_order():
    g = sf.Graph.parse(GRAPHS[2])
    with sf.Runtime.local(4) as rt:
        assert rt.num_devices == 4 and rt.process_count == 1 and rt.devices_on_this_host == 4
        sf.run(g, check=True, runtime=rt)
        inner = sf.Runtime.local(2)
        with pytest.raises(sf.Error, match="reverse order"):
            rt.close()
        inner.close()
    assert rt.closed
    with pytest.raises(sf.Error, match="closed"):
        rt.num_devices


@pytest.mark.parametrize("text, message", [
    ("func @f(%x: f32[2]) -> (f32[2]) {\n  %y = aten::nosuchop(%x) : f32[2]\n  return %y\n}", "line 2"),
    ("func @f(%x: f32[2]) -> (f32[3]) {\n  %y = aten::relu(%x) : f32[3]\n  return %y\n}", "aten::relu"),
    ("\x00\xff garbage", "invalid IR at line 1"),
    ("func @f(" * 5000, "invalid IR"),
])
def test_bad_ir_is_a_clear_error(text, message):
    with pytest.raises(sf.Error, match=message):
        sf.Graph.parse(text)
