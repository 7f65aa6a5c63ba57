"""shardflow.torch: the custom op, PyTorch/XLA's xs/xr API and torch.compile(backend="shardflow")."""

from __future__ import annotations

import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shardflow as sf
import shardflow.torch as sft
import shardflow.torch.runtime as xr
import shardflow.torch.spmd as xs


def compiled(fn):
    return torch.compile(fn, backend="shardflow")


def test_the_custom_op_has_both_schemas():
    assert str(torch.ops.xla.dynamo_mark_sharding.default._schema) == (
        "xla::dynamo_mark_sharding(Tensor t, int[] device_ids, str mesh_shape, str axis_names, "
        "str partition_spec) -> Tensor")
    assert str(torch.ops.xla.dynamo_mark_sharding.int_mesh._schema) == (
        "xla::dynamo_mark_sharding.int_mesh(Tensor input, int[] device_ids, int[] mesh_shape, str axis_names, "
        "str partition_spec) -> Tensor")


def test_wrong_annotation_arguments_give_pytorchs_schema_error():
    with pytest.raises(RuntimeError, match="Expected a value of type 'List\\[int\\]' for argument 'device_ids' but "
                                           "instead found type 'str'"):
        torch.ops.xla.dynamo_mark_sharding(torch.zeros(2), "0,1", "(2,)", "None", "(0,)")


def test_eager_op_annotates_the_value_passed_in(spmd):
    spmd(4)
    x = torch.randn(4, 6)
    y = torch.ops.xla.dynamo_mark_sharding(x, [0, 1, 2, 3], "(2, 2)", "None", "(1, 0)")
    assert xs.get_sharding(x).v1 == "{devices=[2,2]0,2,1,3}"
    assert xs.get_sharding(y).v1 == "{devices=[2,2]0,2,1,3}"
    assert torch.equal(x, y)


class SeedBlock(nn.Module):
    """The seed's pattern: the mesh built in forward from torch.arange, the
    annotation's result ignored."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(16, 24)
        self.w2 = nn.Linear(24, 16, bias=False)

    def forward(self, x):
        device_ids = torch.arange(xr.global_runtime_device_count())
        mesh = xs.Mesh(device_ids, (4, 1, 2))
        h = x + self.w2(torch.relu(self.w1(x)))
        xs.mark_sharding(h, mesh, (0, 1, 2))
        return h * 2


def test_seed_pattern_is_one_graph_without_breaks(spmd):
    spmd(8)
    explanation = torch._dynamo.explain(SeedBlock())(torch.randn(4, 3, 16))
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)


def test_seed_pattern_runs_sharded_and_equals_eager(spmd):
    spmd(8)
    torch.manual_seed(0)
    block = SeedBlock().eval()
    mesh = xs.Mesh(np.arange(8), (4, 1, 2), ("data", "fsdp", "model"))
    xs.mark_sharding(block.w1.weight, mesh, ("model", "fsdp"))
    xs.mark_sharding(block.w2.weight, mesh, ("fsdp", "model"))
    x = torch.randn(4, 3, 16)
    with torch.no_grad():
        expected = block(x)
        step = compiled(block)
        for _ in range(3):
            torch.testing.assert_close(step(x), expected, rtol=1e-5, atol=1e-5)
    report = sft.explain(block, x)
    assert (len(report.graphs), report.graph_breaks) == (1, 0)
    (graph,) = report.graphs
    assert "xla::dynamo_mark_sharding" in graph.ir and '"(0, 1, 2)"' in graph.ir
    assert graph.collectives and all(c.reason and c.axes for c in graph.collectives)
    assert {c.kind for c in graph.collectives} <= {"all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                                                  "collective-permute"}


@pytest.mark.parametrize("mesh_shape_arg", ["(2, 2)", [2, 2]], ids=["str", "int_list"])
def test_pytorch_xla_style_op_calls_compile(spmd, mesh_shape_arg):
    spmd(4)

    def f(x):
        y = torch.ops.xla.dynamo_mark_sharding(x, [0, 1, 2, 3], mesh_shape_arg, "None", "(1, 0)")
        return torch.tanh(y) * 3

    x = torch.randn(6, 5)
    with torch.no_grad():
        torch.testing.assert_close(compiled(f)(x), torch.tanh(x) * 3)


@pytest.mark.parametrize("ids", [[0, 1, 2, 3], (0, 1, 2, 3), "np", "torch", "range"])
def test_meshes_from_lists_tuples_and_arrays_compile_without_breaks(spmd, ids):
    spmd(4)

    def f(x):
        device_ids = {"np": np.arange(4), "torch": torch.arange(4), "range": range(4)}.get(ids, ids)
        mesh = xs.Mesh(device_ids, (2, 2), ("a", "b"))
        xs.mark_sharding(x, mesh, ("b", None))
        return x.sum(0) + 1

    x = torch.randn(5, 3)
    explanation = torch._dynamo.explain(f)(x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(compiled(f)(x), x.sum(0) + 1, rtol=1e-5, atol=1e-5)


def test_device_ids_from_input_data_are_an_error_naming_the_line(spmd):
    spmd(4)

    def f(x, ids):
        xs.mark_sharding(x, xs.Mesh(ids * 1, (2, 2)), (0, 1))  # the line the error names
        return x + 1

    with pytest.raises(Exception, match=r"depend on the compiled function's input.*test_torch_frontend.py.*"
                                        r"xs.mark_sharding\(x, xs.Mesh\(ids \* 1"):
        with torch.no_grad():
            compiled(f)(torch.randn(4, 4), torch.arange(4))


def test_an_op_shardflow_lacks_is_an_error_naming_op_schema_and_line(spmd):
    spmd(2)

    def f(x):
        return torch.linalg.det(x)  # not in shardflow's op set

    with pytest.raises(Exception, match=r"shardflow has no op aten::_linalg_det \(aten::_linalg_det\(Tensor A\) -> "
                                        r"\(Tensor result, Tensor LU, Tensor pivots\)\).*test_torch_frontend.py.*"
                                        r"torch.linalg.det\(x\)"):
        with torch.no_grad():
            compiled(f)(torch.randn(4, 4))


def test_an_error_on_a_lowered_node_names_the_users_line(spmd, monkeypatch):
    """shardflow's own checks of the IR (types, shapes, shardings) name the
    line of the user's code that made the failing node, not only the IR's."""
    from shardflow.torch import _lowering

    spmd(2)

    def wrong_type(lowering, node):  # as a lowering with a bug would: a type the op does not infer
        return lowering.emit_op(node, "aten::pow.Tensor_Scalar", [lowering.values[node.args[0]], -1.0],
                                type_text="f32[1]", hint="wrong")

    monkeypatch.setitem(_lowering.REWRITES, torch.ops.aten.reciprocal.default, wrong_type)

    def f(x):
        y = torch.sin(x)
        return torch.reciprocal(y) + 1

    with pytest.raises(sf.Error, match=r"at line \d+: .*declared f32\[1\].* \(lowering aten.reciprocal.default at "
                                       r".*test_torch_frontend.py.*torch.reciprocal\(y\) \+ 1\)"):
        with torch.no_grad():
            compiled(f)(torch.randn(3))


def test_the_same_mesh_reuses_the_graph_and_another_spec_recompiles(spmd):
    spmd(4)
    specs = [(0, 1)]

    def f(x):
        xs.mark_sharding(x, xs.Mesh([0, 1, 2, 3], (2, 2)), specs[0])
        return x * 2

    graphs = sft.compiled_graphs  # every graph the backend compiled
    start = len(graphs)
    step = compiled(f)
    with torch.no_grad():
        for _ in range(4):
            step(torch.randn(4, 4))
        assert len(graphs) == start + 1  # the same mesh and spec: compiled once
        specs[0] = (1, 0)
        torch.testing.assert_close(step(torch.ones(4, 4)), torch.full((4, 4), 2.0))
        step(torch.ones(4, 4))
        assert len(graphs) == start + 2
        assert '"(1, 0)"' in graphs[-1].last.ir


def test_dumped_graphs_replay_with_the_cli(spmd, tmp_path, monkeypatch):
    spmd(8)
    monkeypatch.setenv("SHARDFLOW_DUMP_DIR", str(tmp_path))
    torch.manual_seed(1)
    block = SeedBlock().eval()
    mesh = xs.Mesh(np.arange(8), (4, 1, 2), ("data", "fsdp", "model"))
    xs.mark_sharding(block.w1.weight, mesh, ("model", None))
    with torch.no_grad():
        compiled(block)(torch.randn(4, 3, 16))
    (dump,) = list(pathlib.Path(tmp_path).glob("*.ir"))
    cli = pathlib.Path(__file__).resolve().parents[2] / "build" / "release" / "tools" / "shardflow"
    if not cli.exists():
        pytest.skip("the shardflow tool is not built")
    result = subprocess.run([str(cli), "run", str(dump), "--check"], capture_output=True, text=True,
                            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "within tolerance" in result.stdout


def test_mesh_validation_is_pytorch_xlas(spmd):
    spmd(4)
    with pytest.raises(AssertionError, match=r"Number of device IDs \(4\) must match mesh size \(8\)"):
        xs.Mesh(range(4), (2, 4))
    mesh = xs.Mesh(range(4), (2, 2), ("x", "y"))
    assert mesh.get_logical_mesh().tolist() == [[0, 1], [2, 3]]
    assert mesh.shape() == {"x": 2, "y": 2} and mesh.size() == 4
    assert xs.get_1d_mesh("data").shape() == {"data": 4}
    with pytest.raises(ValueError, match="Partition spec length \\(1\\) should be equal to the input rank \\(2\\)."):
        xs.mark_sharding(torch.zeros(2, 2), mesh, ("x",))
    t = torch.zeros(4, 4)
    xs.mark_sharding(t, mesh, ("x", None))
    with pytest.raises(sf.Error, match="Existing annotation must be cleared first"):
        xs.mark_sharding(t, mesh, ("y", None))
    xs.clear_sharding(t)
    xs.mark_sharding(t, mesh, ("y", None))
    assert xs.get_sharding(t).v1 == "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}"


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class AttentionBlock(nn.Module):
    """The ops of a LLaMA block as people write them: nn.Embedding,
    Hugging Face rotary (rotate_half), grouped-query attention through
    repeat_interleave, a causal mask from triu + masked_fill,
    F.scaled_dot_product_attention, RMSNorm in torch ops, SwiGLU, a tied
    output head, and argmax / topk sampling."""

    def __init__(self, vocab=40, dim=16, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.embed = nn.Embedding(vocab, dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1, self.w3 = nn.Linear(dim, 24, bias=False), nn.Linear(dim, 24, bias=False)
        self.w2 = nn.Linear(24, dim, bias=False)
        self.norm = nn.Parameter(torch.rand(dim) + 0.5)

    def rms(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.norm

    def forward(self, tokens, cos, sin):
        mesh = xs.Mesh(torch.arange(xr.global_runtime_device_count()), (xr.global_runtime_device_count(),))
        x = self.embed(tokens)
        b, t, _ = x.shape
        h = self.rms(x)
        q = self.wq(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
        v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = (q @ k.transpose(2, 3)) / self.head_dim ** 0.5
        manual = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo((manual + fused).transpose(1, 2).reshape(b, t, -1))
        xs.mark_sharding(x, mesh, (0, None, None))
        h = self.rms(x)
        x = x + self.w2(F.silu(self.w1(h)) * self.w3(h))
        logits = self.rms(x) @ self.embed.weight.t()
        return logits, logits.argmax(-1), torch.topk(logits, 3, dim=-1).indices


@pytest.mark.parametrize("devices", [1, 2, 4])
def test_llama_style_ops_compile_and_equal_eager(spmd, devices):
    spmd(devices)
    torch.manual_seed(devices)
    block = AttentionBlock().eval()
    mesh = xs.Mesh(np.arange(devices), (devices,), ("model",))
    for weight in (block.wq.weight, block.wk.weight, block.wv.weight, block.w1.weight, block.w3.weight):
        xs.mark_sharding(weight, mesh, ("model", None))
    for weight in (block.wo.weight, block.w2.weight):
        xs.mark_sharding(weight, mesh, (None, "model"))
    tokens = torch.randint(0, 40, (4, 5))
    cos, sin = torch.randn(5, 4), torch.randn(5, 4)
    with torch.no_grad():
        expected = block(tokens, cos, sin)
        got = compiled(block)(tokens, cos, sin)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-4 * (1 + expected[0].abs().max().item()))
    assert torch.equal(got[1], expected[1])
    assert torch.equal(got[2], expected[2])


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """Meta's LLaMA 2 rotary table (complex64), as in its model.py."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    return torch.polar(torch.ones_like(freqs), torch.outer(t, freqs).float())


def apply_rotary_emb(xq, xk, freqs_cis):
    """Meta's complex rotary: view_as_complex, a complex product, view_as_real."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    shape = [d if i == 1 or i == xq_.ndim - 1 else 1 for i, d in enumerate(xq_.shape)]
    freqs_cis = freqs_cis.view(*shape)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


@pytest.mark.parametrize("table", ["input", "computed_in_forward"])
def test_metas_complex_rotary_is_lowered_to_real_ops(spmd, table):
    spmd(2)
    freqs = precompute_freqs_cis(8, 32)

    def rotate(xq, xk, freqs_cis):
        if table == "computed_in_forward":
            freqs_cis = precompute_freqs_cis(8, 32)
        mesh = xs.Mesh([0, 1], (2,))
        xs.mark_sharding(xq, mesh, (0, None, None, None))
        return apply_rotary_emb(xq, xk, freqs_cis[3:7])

    xq, xk = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8)
    with torch.no_grad():
        expected = rotate(xq, xk, freqs)
        got = compiled(rotate)(xq, xk, freqs)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


class SixteenBitAttention(nn.Module):
    """Meta's attention in a 16-bit model: the rotary in complex64 (x.float()
    in, type_as(x) out), F.scaled_dot_product_attention in the model's dtype."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x, freqs_cis, mask, scale):
        b, s, d = x.shape
        q, k, v = (w(x).view(b, s, self.heads, d // self.heads) for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary_emb(q, k, freqs_cis[:s])
        # A complex64 value times a real tensor of the model's dtype.
        k = torch.view_as_real(torch.view_as_complex(k.float().reshape(b, s, self.heads, -1, 2)) * scale).flatten(3)
        q, k, v = q.transpose(1, 2), k.to(x.dtype).transpose(1, 2), v.transpose(1, 2)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo((causal + masked).transpose(1, 2).reshape(b, s, d))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("devices", [1, 2])
def test_sixteen_bit_attention_and_rotary_equal_eager(spmd, devices, dtype):
    spmd(devices)
    torch.manual_seed(7)
    block = SixteenBitAttention().eval().to(dtype)
    mesh = xs.Mesh(np.arange(devices), (devices,), ("model",))
    for weight in (block.wq.weight, block.wk.weight, block.wv.weight):
        xs.mark_sharding(weight, mesh, ("model", None))
    xs.mark_sharding(block.wo.weight, mesh, (None, "model"))
    x = torch.randn(2, 6, 32, dtype=dtype)
    freqs = precompute_freqs_cis(8, 16)
    for mask in (torch.rand(6, 6) > 0.3, torch.randn(1, 4, 6, 6, dtype=dtype)):
        scale = torch.rand(6, 1, 4, dtype=dtype) + 0.5
        with torch.no_grad():
            expected = block(x, freqs, mask, scale)
            got = compiled(block)(x, freqs, mask, scale)
        assert got.dtype == dtype
        # PyTorch's 16-bit CPU attention rounds its probabilities to the
        # dtype before the product with v; shardflow keeps them in float.
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())


# Complex moves and arithmetic, each f(c, table, real) -> a value of c's
# shape (negative dims count from the complex value's end, which the
# lowering's pairs dim must not shift).
_COMPLEX_STEPS = [
    lambda c, t, r: c.transpose(-1, 1).transpose(1, 3),
    lambda c, t, r: c.permute(2, 0, -1, 1).permute(1, -1, 0, 2),
    lambda c, t, r: c.unsqueeze(-1).squeeze(-1),
    lambda c, t, r: c.unsqueeze(-2)[..., 0, :],
    lambda c, t, r: c.narrow(-1, 1, 1).expand(2, 4, 3, 4) - c[:, 1:3].expand(2, 2, 2, 3, 4).reshape(2, 4, 3, 4),
    lambda c, t, r: c.select(-2, 1).unsqueeze(-2).expand(2, 4, 3, 4),
    lambda c, t, r: c * t,
    lambda c, t, r: t * c,
    lambda c, t, r: c * c.transpose(0, 0),
    lambda c, t, r: c * r,
    lambda c, t, r: r * c - c * 2.5,
    lambda c, t, r: c + t,
    lambda c, t, r: c.reshape(2, 4, -1).view(2, 4, 3, 4),
    lambda c, t, r: c.index_select(-1, torch.tensor([3, 0, 0, 1])),
]


@pytest.mark.parametrize("seed", range(10))
def test_random_complex_op_chains_match_eager(spmd, seed):
    spmd(2)
    rng = np.random.default_rng(seed)
    steps = [_COMPLEX_STEPS[i] for i in rng.choice(len(_COMPLEX_STEPS), size=4)]
    table_in_forward = bool(seed % 2)

    def f(x, table, real):
        if table_in_forward:
            table = torch.polar(real + 1.0, real * 3.0)
        xs.mark_sharding(x, xs.Mesh([0, 1], (2,)), (0, None, None, None))
        c = torch.view_as_complex(x.reshape(2, 4, 3, 4, 2))
        for step in steps:
            c = step(c, table, real)
        return torch.view_as_real(c).flatten(-2)

    x = torch.randn(2, 4, 3, 8)
    real = torch.randn(4)
    table = torch.polar(torch.rand(3, 4) + 0.5, torch.randn(3, 4))
    with torch.no_grad():
        expected = f(x, table, real)
        got = compiled(f)(x, table, real)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_complex_product_is_four_ops_over_the_data(spmd):
    """view_as_complex/view_as_real cost nothing and a rotary table's factors
    are built once for q and k: 2 x (index_select, 2 mul, add) + 5 table ops + 1 swap index."""
    spmd(1)
    freqs = precompute_freqs_cis(8, 32)
    xq, xk = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8)
    with torch.no_grad():
        torch._dynamo.reset()
        compiled(apply_rotary_emb)(xq, xk, freqs[:4])
    ir = sft.compiled_graphs[-1].last.ir
    arithmetic = [op for op in ir_ops(ir) if op not in ("aten::view", "aten::reshape", "aten::expand")]
    assert sorted(arithmetic) == sorted(["aten::index_select", "aten::mul.Tensor", "aten::mul.Tensor",
                                         "aten::add.Tensor"] * 2 + ["aten::slice.Tensor", "aten::slice.Tensor",
                                                                    "aten::neg", "aten::cat", "aten::cat",
                                                                    "aten::arange.start_step"])


def test_a_marked_tensor_keeps_its_sharding_when_written_in_place(spmd):
    spmd(4)
    mesh = xs.Mesh(range(4), (2, 2), ("x", "y"))
    weight = torch.zeros(4, 6)
    xs.mark_sharding(weight, mesh, ("x", "y"))
    with torch.no_grad():
        weight.copy_(torch.arange(24.0).reshape(4, 6))  # as load_state_dict does
    assert xs.get_sharding(weight).v1 == "{devices=[2,2]0,1,2,3}"
    step = compiled(lambda x: x @ weight.t())
    with torch.no_grad():
        torch.testing.assert_close(step(torch.ones(3, 6)), torch.ones(3, 6) @ weight.t())
    (graph,) = [g for g in sft.compiled_graphs if g.last is not None][-1:]
    assert "\"('x', 'y')\"" in graph.last.ir  # fed as its shards, annotated in the IR


def test_linear_layers_read_their_weights_as_stored(spmd):
    spmd(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4, bias=False)).eval()
    x = torch.randn(3, 5, 8)
    (graph,) = sft.explain(model, x).graphs
    assert graph.ir.count("aten::linear") == 2
    assert "aten::transpose" not in graph.ir  # no copy of a transposed weight per call
    with sft.profile() as profile, torch.no_grad():
        step = compiled(model)
        torch.testing.assert_close(step(x), model(x), rtol=1e-5, atol=1e-5)
        step(x)
    ops = {op: calls for op, calls, _ in profile.entries(0)}
    assert ops["aten::linear"] == 4 and profile.function_calls == 2


def test_a_profile_splits_each_call_into_the_run_and_the_bridge(spmd):
    spmd(2)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        step = compiled(model)
        step(x)  # compiles outside the profile
        with sft.profile() as outer:
            step(x)
            with sft.profile() as inner:
                step(x)
                step(x)
            step(x)
    assert (outer.graph_calls, outer.function_calls) == (2, 2)
    assert (inner.graph_calls, inner.function_calls) == (2, 2)
    for p in (outer, inner):
        # The run is part of the call, and the bridge's own work takes time.
        assert 0 < p.function_seconds < p.graph_seconds
        assert {op for op, _, _ in p.entries(0)} >= {"aten::linear"}
    with torch.no_grad():
        step(x)  # after the blocks: counted nowhere
    assert (outer.graph_calls, inner.graph_calls) == (2, 2)


def ir_ops(ir: str) -> list[str]:
    return [line.split(" = ")[1].split("(")[0] for line in ir.splitlines() if " = " in line]


@pytest.mark.parametrize("shape", [(5, 8), (3, 5, 8), (2, 3, 5, 8)])
def test_linear_layers_on_any_rank_are_one_op_each(spmd, shape):
    """AOTAutograd spells nn.Linear on [..., k] as view -> mm/addmm -> view:
    the IR has one aten::linear on the [..., k] value and no reshapes."""
    spmd(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4, bias=False)).eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(model)(x), model(x), rtol=1e-5, atol=1e-5)
    assert ir_ops(sft.compiled_graphs[-1].last.ir) == ["aten::linear", "aten::relu", "aten::linear"]


def test_a_chain_of_reshapes_is_one_and_a_reshape_back_is_none(spmd):
    spmd(1)

    def f(x, w):
        chained = x.view(6, 4).view(2, 12).reshape(3, 8) * 2  # one reshape of x
        back = x.view(24).view(2, 3, 4) + 1  # x's own shape again: x itself
        flat = x.view(2, 12)
        read_twice = flat @ w + flat.sum()  # the 2-D value is read: the product is not rewritten
        return chained, back, read_twice

    x, w = torch.randn(2, 3, 4), torch.randn(12, 5)
    with torch.no_grad():
        torch._dynamo.reset()
        for got, expected in zip(compiled(f)(x, w), f(x, w)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    ops = ir_ops(sft.compiled_graphs[-1].last.ir)
    reshapes = [op for op in ops if op in ("aten::view", "aten::reshape")]
    assert len(reshapes) == 2, ops  # x -> (3, 8) and x -> (2, 12)


def test_unmarked_weights_split_by_propagation_are_laid_out_once(spmd, monkeypatch):
    """The seed's pattern annotates activations only: the weights propagation
    splits are laid out on the first call and fed as shards from then on (as
    PyTorch/XLA keeps device data), while those read whole are kept as views
    of their own memory, not copied."""
    spmd(4)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8, bias=False)
            self.scale = nn.Parameter(torch.rand(8) + 0.5)

        def forward(self, x):
            mesh = xs.Mesh(torch.arange(4), (1, 4), ("data", "model"))
            h = self.up(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.scale)
            xs.mark_sharding(h, mesh, (None, None, "model"))
            return self.down(torch.relu(h))

    model = Block().eval()
    inputs = [torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(seed)) for seed in range(3)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]  # eager (its mark_sharding lays h out)
    layouts = []
    real = sft._state.sf.mark_sharding
    monkeypatch.setattr(sft._state.sf, "mark_sharding", lambda *a, **k: layouts.append(a) or real(*a, **k))
    step = compiled(model)
    with torch.no_grad():
        for i, x in enumerate(inputs):
            torch.testing.assert_close(step(x), expected[i], rtol=1e-5, atol=1e-5)
            if i == 0:
                first = len(layouts)
    split = {name for name, p in model.named_parameters() if any(xs.get_sharding(p).dim_axes)}
    assert {"up.weight", "up.bias", "down.weight"} <= split  # split on 'model' by the annotation
    assert first == len(split) and len(layouts) == first  # once, in the first call
    assert xs.get_sharding(model.up.weight).v1 == "{devices=[4,1]0,1,2,3}"
    # Read whole by every device: kept as a view of its own memory, not laid out.
    assert "scale" not in split and xs.get_sharding(model.scale).v1 == "{replicated}"
    assert sf._core._lies_in(sft._state.sharded(model.scale), model.scale.data_ptr())


class TwoLinears(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.up, self.down = nn.Linear(8, width), nn.Linear(width, 8, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@pytest.mark.parametrize("devices", [1, 2])
def test_unmarked_weights_on_one_device_are_read_where_they_lie(spmd, monkeypatch, devices):
    """On one device (also a graph without annotations on several, which
    runs on device 0) the weights are kept as views of their own memory from
    the first call on: no copy, no conversion per call, one compiled graph."""
    spmd(devices)
    model = TwoLinears().eval()
    inputs = [torch.randn(3, 8, generator=torch.Generator().manual_seed(seed)) for seed in range(3)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    layouts, views = [], []
    real_layout, real_view = sft._state.sf.mark_sharding, sft._state.to_shardflow
    monkeypatch.setattr(sft._state.sf, "mark_sharding", lambda *a, **k: layouts.append(a) or real_layout(*a, **k))
    monkeypatch.setattr(sft._state, "to_shardflow", lambda t: views.append(t.shape) or real_view(t))
    step, compiled_before = compiled(model), len(sft.compiled_graphs)
    with torch.no_grad():
        for i, x in enumerate(inputs):
            torch.testing.assert_close(step(x), expected[i], rtol=1e-5, atol=1e-5)
            if i == 0:
                first_views = len(views)
    assert layouts == []  # never copied
    assert first_views == 4 + 3  # the first call views each input, then each weight once to keep it
    assert views[first_views:] == [torch.Size([3, 8])] * 2  # later calls view only x
    for p in model.parameters():
        assert sf._core._lies_in(sft._state.sharded(p), p.data_ptr())
    assert len(sft.compiled_graphs) == compiled_before + 1
    assert len({id(p.executable) for p in sft.compiled_graphs[-1].prepared.values()}) == 1  # compiled once


@pytest.mark.parametrize("devices,marked", [(1, False), (2, True), (2, False)])
@pytest.mark.parametrize("change", ["mul_", "data"])
def test_a_weight_changed_between_calls_is_read_anew(spmd, devices, marked, change):
    """A weight kept between calls (marked, or kept as propagation chose) is
    read again once it changed: written in place (its _version moves on) or
    given other memory by `p.data = new` (which leaves _version as it was)."""
    spmd(devices)
    model = TwoLinears().eval()
    if marked:
        xs.mark_sharding(model.up.weight, xs.Mesh(range(devices), (devices,), ("model",)), ("model", None))
    x = torch.randn(3, 8)
    step = compiled(model)
    with torch.no_grad():
        torch.testing.assert_close(step(x), model(x), rtol=1e-5, atol=1e-5)
        for round in range(2):
            for p in (model.up.weight, model.down.weight):
                if change == "mul_":
                    p.mul_(-2.0)
                else:
                    p.data = torch.randn(p.shape)
            torch.testing.assert_close(step(x), model(x), rtol=1e-5, atol=1e-5, msg=lambda m: f"round {round}: {m}")


def huge_page_kib_around(address: int) -> int:
    """The kB of huge pages backing the mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(" ", 1)[0]
        if "-" in first and not line.endswith(":") and ":" not in first:
            begin, end = (int(v, 16) for v in first.split("-"))
            inside = begin <= address < end
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


def test_weights_read_where_they_lie_are_moved_onto_huge_pages(spmd):
    """torch places a large weight on 4 KiB pages; one read in place on every
    call is moved onto 2 MiB pages (a decode step streams it faster), in place."""
    spmd(1)
    model = TwoLinears(width=1 << 18).eval()  # up.weight: 8 MiB
    weight = model.up.weight
    huge = 2 << 20
    first, end = -(-weight.data_ptr() // huge) * huge, (weight.data_ptr() + weight.nbytes) // huge * huge
    whole_pages, values = (end - first) // huge, weight.detach().clone()
    if huge_page_kib_around(weight.data_ptr()) < 0:
        pytest.skip("/proc/self/smaps is not readable here")
    probe = sf.from_dlpack(torch.ones(1 << 20).numpy())
    if not sf._core._collapse_into_huge_pages(probe):
        pytest.skip("this kernel does not collapse memory into huge pages (Linux 6.1+ with huge pages on)")
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(model)(x), model(x), rtol=1e-4, atol=1e-4)
    assert whole_pages >= 3 and huge_page_kib_around(weight.data_ptr()) >= whole_pages * 2048
    assert torch.equal(weight.detach(), values)


@pytest.mark.parametrize("devices", [1, 4])
@pytest.mark.parametrize("shape,affine,bias", [((12,), True, True), ((12,), False, False), ((12,), True, False),
                                               ((3, 12), True, True)])
def test_layer_norm_matches_eager(spmd, devices, shape, affine, bias):
    """nn.LayerNorm (aten::native_layer_norm) as mean and variance over the
    normalized dims, also when an annotation splits the last one."""
    spmd(devices)
    norm = nn.LayerNorm(shape, elementwise_affine=affine, bias=bias).eval()
    if affine:
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            if bias:
                norm.bias.uniform_(-1, 1)

    def f(x):
        if devices > 1:
            xs.mark_sharding(x, xs.Mesh(torch.arange(devices), (1, devices), ("data", "model")),
                             (None,) * (x.dim() - 1) + ("model",))
        return norm(x) * 2

    x = torch.randn(2, 5, 3, 12) * 3 + 1
    with torch.no_grad():
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(f)(x), norm(x) * 2, rtol=1e-5, atol=1e-5)


def test_the_history_of_compiled_graphs_is_bounded():
    from shardflow.torch._backend import CompiledGraphs

    history = CompiledGraphs(keep=3)
    for name in "abcde":
        history.append(name)
    assert len(history) == 5  # every compile counts
    assert list(history) == ["c", "d", "e"] and history[-1] == "e"  # only the newest are kept
    assert history.since(3) == ["d", "e"] and history.since(0) == ["c", "d", "e"] and history.since(5) == []


def test_the_backend_runs_without_use_spmd_on_one_device():
    xr.shutdown()
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(6, 4), nn.GELU()).eval()
    x = torch.randn(3, 6)
    with torch.no_grad():
        torch.testing.assert_close(compiled(model)(x), model(x), rtol=1e-5, atol=1e-5)
    g = sf.Graph.parse("func @f(%x: f32[3]) -> (f32[3]) {\n  %y = aten::relu(%x) : f32[3]\n  return %y\n}")
    executable = sf.Executable(g, [None])
    (y,) = executable([sf.tensor([-1.0, 0.5, 2.0])])
    assert y.numpy().tolist() == [0.0, 0.5, 2.0] and executable.collectives == []
    torch._dynamo.reset()


def test_several_devices_take_torchs_threads_down_to_one_until_shutdown(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    xr.shutdown()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.warns(RuntimeWarning, match="torch's own ops now run on 1 thread \\(was 2\\).*OMP_WAIT_POLICY"):
            xr.use_spmd(devices=2)
        assert torch.get_num_threads() == 1
        xr.shutdown()
        assert torch.get_num_threads() == 2  # given back

        with pytest.warns(RuntimeWarning):
            xr.use_spmd(devices=2)
        torch.set_num_threads(3)  # the user's own choice after use_spmd is kept
        xr.shutdown()
        assert torch.get_num_threads() == 3
    finally:
        xr.shutdown()
        torch.set_num_threads(before)


def test_one_device_on_several_kernel_threads_takes_torchs_threads_down_too(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    xr.shutdown()
    before, kernels_before = torch.get_num_threads(), sf.get_num_threads()
    try:
        torch.set_num_threads(2)
        sf.set_num_threads(2)
        with pytest.warns(RuntimeWarning, match="runs one device's kernels on 2 threads here: torch's own ops now "
                                                "run on 1 thread \\(was 2\\)"):
            xr.use_spmd(devices=1)
        assert torch.get_num_threads() == 1
        xr.shutdown()
        assert torch.get_num_threads() == 2
    finally:
        xr.shutdown()
        torch.set_num_threads(before)
        sf.set_num_threads(kernels_before)


@pytest.mark.parametrize("devices, kernel_threads, policy", [(1, 1, None), (2, 1, "PASSIVE"), (1, 2, "passive")])
def test_torchs_threads_stay_for_a_single_thread_or_passive_openmp_workers(monkeypatch, recwarn, devices,
                                                                           kernel_threads, policy):
    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    xr.shutdown()
    before, kernels_before = torch.get_num_threads(), sf.get_num_threads()
    try:
        torch.set_num_threads(2)
        sf.set_num_threads(kernel_threads)
        xr.use_spmd(devices=devices)
        assert torch.get_num_threads() == 2
        assert not [w for w in recwarn if "torch's own ops" in str(w.message)]
    finally:
        xr.shutdown()
        torch.set_num_threads(before)
        sf.set_num_threads(kernels_before)


class TorchOpsRmsNorm(nn.Module):
    """RMSNorm written in torch ops, Meta's order (x * rsqrt(...) * w) or Hugging Face's (w * (x * rsqrt(...)))."""

    def __init__(self, dim: int, weight_first: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.weight_first = weight_first

    def forward(self, x):
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        return self.weight * normed if self.weight_first else normed * self.weight


@pytest.mark.parametrize("weight_first", [False, True])
def test_rms_norm_in_torch_ops_is_one_op(spmd, weight_first):
    spmd(2)
    model = nn.Sequential(TorchOpsRmsNorm(8, weight_first), nn.Linear(8, 6, bias=False)).eval()
    mesh = xs.Mesh([0, 1], (2,), ("model",))
    xs.mark_sharding(model[1].weight, mesh, ("model", None))
    x = torch.randn(4, 8)
    xs.mark_sharding(x, mesh, (None, "model"))
    (graph,) = sft.explain(model, x).graphs
    assert graph.ir.count("aten::rms_norm") == 1
    assert "aten::rsqrt" not in graph.ir and "aten::mean" not in graph.ir
    assert [c.kind for c in graph.collectives] == ["all-gather"]  # x gathered once for the norm
    with torch.no_grad():
        torch.testing.assert_close(compiled(model)(x), model(x), rtol=1e-5, atol=1e-5)


def test_dynamic_shapes_are_an_error_that_says_dynamic_false(spmd):
    spmd(1)
    step = torch.compile(lambda x: x * 2 + 1, backend="shardflow", dynamic=True)
    with pytest.raises(sf.Error, match=r"dynamic shapes .*dynamic=False\), which compiles once per shape"):
        step(torch.randn(3, 4))
    static = torch.compile(lambda x: x * 2 + 1, backend="shardflow", dynamic=False)
    for rows in (3, 5, 7):  # a new shape recompiles instead
        x = torch.randn(rows, 4)
        torch.testing.assert_close(static(x), x * 2 + 1)


def test_training_is_an_error_at_backward(spmd):
    spmd(1)
    model = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    out = torch.compile(model, backend="shardflow")(x)
    torch.testing.assert_close(out, model(x))  # the forward runs
    with pytest.raises(Exception, match="shardflow compiles inference graphs only: run the compiled model under "
                                        r"torch.no_grad\(\)"):
        out.sum().backward()
