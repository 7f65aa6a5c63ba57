#!/usr/bin/env python3
"""LLaMA 2 in plain PyTorch, generated through torch.compile(backend="shardflow").

The model is written like Meta's ``llama/model.py``: RMSNorm in torch ops,
complex rotary embeddings (``polar``, ``view_as_complex``), grouped-query
attention by ``repeat_kv``, SwiGLU, a KV cache in module buffers. As
``torch.compile`` users write it (PyTorch's gpt-fast, Hugging Face), it
compiles once per shape instead of once per token: the position is a tensor
(``input_pos``) and the cache is written at it (``cache[:, :, input_pos] =
xk``); the cache holds heads before positions, and attention is
``F.scaled_dot_product_attention`` over the whole cache with a mask. Meta's
own ``matmul``/``softmax`` attention over a ``[B, S, heads, hd]`` cache
compiles too, but transposes (copies) the cache on every step.

Sharding is PyTorch/XLA's: parameters and caches are laid out eagerly with
``xs.mark_sharding`` following shardflow's Megatron plan (the same
``ShardingPlan`` data ``shardflow llama`` uses), and inside ``forward`` the
output of every decoder block is annotated ``(0, 1, 2)`` on a ``(4, 1, 2)``
mesh built from ``torch.arange``, exactly the seed's diff.

    python3 examples/llama2_torch.py --config stories15M --mesh 4,1,2 --steps 32 --check
    python3 examples/llama2_torch.py --weights stories15M.bin --mesh 1,1,2 --prompt-ids 1,450,4996

``--check`` generates again with eager PyTorch on one device and compares the
greedy tokens and every step's logits.

``--temperature T --top-p P`` samples instead, as Meta's ``generate`` does
(softmax of logits / T, the smallest set of tokens holding P of the mass,
``torch.multinomial``), with the sampling compiled too. Its draws are
shardflow's counter-based ones seeded from torch's generator
(``--seed``): the same on every mesh, but not eager PyTorch's, so
``--check`` then replays the sampled tokens through eager PyTorch,
compares the logits and checks every token was inside eager's top-p set.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import shardflow as sf
import shardflow.torch
import shardflow.torch.runtime as xr
import shardflow.torch.spmd as xs
from shardflow import llama as sfl


@dataclass
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    hidden_dim: int
    norm_eps: float
    max_seq_len: int
    max_batch_size: int
    mesh_shape: tuple[int, ...] = (1, 1, 1)
    annotate: bool = True  # annotate each block's output (False: plain PyTorch, for a peer benchmark)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64 [end, dim / 2]


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    shape = [d if i == 1 or i == x.ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, n_kv_heads, S, hd] -> [B, n_kv_heads * n_rep, S, hd]"""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads = args.n_heads, args.n_kv_heads
        self.n_rep = args.n_heads // args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        # Heads before positions, as attention reads them (Meta's cache is
        # [B, S, heads, hd] and transposes every step: a copy of the cache).
        cache_shape = (args.max_batch_size, self.n_kv_heads, args.max_seq_len, self.head_dim)
        self.register_buffer("cache_k", torch.zeros(cache_shape), persistent=False)
        self.register_buffer("cache_v", torch.zeros(cache_shape), persistent=False)

    def forward(self, x, input_pos, freqs_cis, mask):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        # Meta: self.cache_k[:bsz, start_pos:start_pos + seqlen] = xk
        self.cache_k[:, :, input_pos] = xk.transpose(1, 2)
        self.cache_v[:, :, input_pos] = xv.transpose(1, 2)
        keys = repeat_kv(self.cache_k, self.n_rep)                       # [B, heads, S, hd]
        values = repeat_kv(self.cache_v, self.n_rep)
        output = F.scaled_dot_product_attention(xq.transpose(1, 2), keys, values, attn_mask=mask)
        return self.wo(output.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.mesh_shape = args.mesh_shape
        self.annotate = args.annotate

    def forward(self, x, input_pos, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), input_pos, freqs_cis, mask)
        out = h + self.feed_forward(self.ffn_norm(h))
        if self.annotate:
            # The seed's diff: a mesh built inside forward, every block's output
            # annotated over all three axes (the result of mark_sharding ignored).
            device_ids = torch.arange(xr.global_runtime_device_count())
            mesh = xs.Mesh(device_ids, self.mesh_shape)
            xs.mark_sharding(out, mesh, (0, 1, 2))
        return out


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len),
                             persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] at positions input_pos [T]; the logits of the last position [B, vocab]."""
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis.index_select(0, input_pos)
        positions = torch.arange(self.args.max_seq_len, device=tokens.device)
        mask = torch.zeros(tokens.shape[1], self.args.max_seq_len, device=tokens.device).masked_fill(
            positions[None, :] > input_pos[:, None], float("-inf"))
        for layer in self.layers:
            h = layer(h, input_pos, freqs_cis, mask)
        return self.output(self.norm(h)[:, -1, :]).float()


# ---------------------------------------------------------------- weights


def torch_tensor(t: sf.Tensor) -> torch.Tensor:
    return torch.from_dlpack(t).clone()  # a writable copy owned by torch


def load_into(model: Transformer, weights: sfl.Weights) -> None:
    """Copies shardflow-loaded weights (random, llama2.c or Hugging Face) into the model."""
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(torch_tensor(weights.tok_embeddings))
        model.norm.weight.copy_(torch_tensor(weights.norm))
        model.output.weight.copy_(torch_tensor(weights.output))
        for block, layer in zip(model.layers, weights.layers):
            block.attention_norm.weight.copy_(torch_tensor(layer.attention_norm))
            block.ffn_norm.weight.copy_(torch_tensor(layer.ffn_norm))
            for name in ("wq", "wk", "wv", "wo"):
                getattr(block.attention, name).weight.copy_(torch_tensor(getattr(layer, name)))
            for name in ("w1", "w2", "w3"):
                getattr(block.feed_forward, name).weight.copy_(torch_tensor(getattr(layer, name)))


def shard(model: Transformer, mesh: xs.Mesh, plan: sfl.ShardingPlan) -> None:
    """Lays parameters and caches out as the plan says (xs.mark_sharding, eagerly)."""
    params = {role: tuple(spec) for role, spec in plan.params.items()}
    xs.mark_sharding(model.tok_embeddings.weight, mesh, params["tok_embeddings"])
    xs.mark_sharding(model.output.weight, mesh, params["output"])
    xs.mark_sharding(model.norm.weight, mesh, params["norm"])
    cache = tuple(plan.activations["kv_cache"])  # [B, n_kv_heads, S, hd], as the model's
    for block in model.layers:
        xs.mark_sharding(block.attention_norm.weight, mesh, params["attention_norm"])
        xs.mark_sharding(block.ffn_norm.weight, mesh, params["ffn_norm"])
        for name in ("wq", "wk", "wv", "wo"):
            xs.mark_sharding(getattr(block.attention, name).weight, mesh, params[name])
        for name in ("w1", "w2", "w3"):
            xs.mark_sharding(getattr(block.feed_forward, name).weight, mesh, params[name])
        xs.mark_sharding(block.attention.cache_k, mesh, cache)
        xs.mark_sharding(block.attention.cache_v, mesh, cache)


# ------------------------------------------------------------- generation


@dataclass
class Generation:
    tokens: list[list[int]]
    logits: list[torch.Tensor]
    prefill_seconds: float   # with compiling the prefill graph
    first_decode_seconds: float  # with compiling the decode graph
    decode_seconds: float    # the later decode steps
    decode_steps: int        # how many those are


def sample_top_p(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """LLaMA 2's sampling: one token per row of logits [B, V], drawn from
    the probabilities at `temperature` kept to the most likely tokens whose
    mass before them is at most `top_p`. Returns [B, 1]."""
    probs = torch.softmax(logits / temperature, dim=-1)
    ranked, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(ranked, dim=-1) - ranked
    ranked[mass_before > top_p] = 0.0
    ranked.div_(ranked.sum(dim=-1, keepdim=True))
    return torch.gather(order, -1, torch.multinomial(ranked, num_samples=1))


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)


def generate(step, model: Transformer, prompt: torch.Tensor, steps: int, choose=greedy) -> Generation:
    """A prefill of the prompt, then one token per step; `choose` picks each
    step's tokens [B] from its logits [B, V] (greedy by default)."""
    for block in model.layers:
        block.attention.cache_k.zero_()
        block.attention.cache_v.zero_()
    tokens, logits, times = [], [], []
    with torch.no_grad():
        started = time.perf_counter()
        out = step(prompt, torch.arange(prompt.shape[1]))
        times.append(time.perf_counter() - started)
        for pos in range(prompt.shape[1], prompt.shape[1] + steps):
            logits.append(out)
            next_token = choose(out)
            tokens.append(next_token.tolist())
            if pos == prompt.shape[1] + steps - 1:
                break
            started = time.perf_counter()
            out = step(next_token[:, None], torch.tensor([pos]))
            times.append(time.perf_counter() - started)
    rows = [list(row) for row in zip(*tokens)]
    first_decode = times[1] if len(times) > 1 else 0.0
    return Generation(rows, logits, times[0], first_decode, sum(times[2:]), max(len(times) - 2, 0))


def tokens_per_second(g: Generation, batch: int) -> float:
    return batch * g.decode_steps / g.decode_seconds if g.decode_seconds > 0 else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="stories15M", help="random weights of this shape: " +
                        ", ".join(sfl.Config.names()))
    parser.add_argument("--weights", help="a llama2.c .bin file or a Hugging Face directory")
    parser.add_argument("--mesh", default="4,1,2", help="data,fsdp,model")
    parser.add_argument("--prompt-ids", default="1,450,4996,310")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--seq-len", type=int, help="cache positions (default: the config's, at most 1024)")
    parser.add_argument("--check", action="store_true", help="compare with eager PyTorch on one device")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); above 0: sampling")
    parser.add_argument("--top-p", type=float, default=0.9, help="nucleus threshold when sampling")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed before sampling")
    args = parser.parse_args(argv)
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        parser.error("--temperature must be >= 0 and --top-p in (0, 1]")

    mesh_shape = tuple(int(v) for v in args.mesh.split(","))
    if len(mesh_shape) != 3:
        parser.error("--mesh takes three sizes: data,fsdp,model")
    devices = int(np.prod(mesh_shape))
    xr.use_spmd(devices=devices)
    mesh = xs.Mesh(np.arange(devices), mesh_shape, ("data", "fsdp", "model"))
    plan = sfl.ShardingPlan.megatron(mesh._core())

    if args.weights:
        path = args.weights
        import os
        weights = sfl.load_hf(path) if os.path.isdir(path) else sfl.load_llama2c(path)
    else:
        weights = sfl.random_weights(sfl.Config.named(args.config), seed=0)
    config = weights.config
    prompt_ids = [int(t) for t in args.prompt_ids.split(",")]
    seq_len = args.seq_len or min(config.seq_len, 1024)
    if len(prompt_ids) + args.steps > seq_len:
        parser.error(f"the prompt ({len(prompt_ids)}) and --steps ({args.steps}) exceed the {seq_len} cache positions")
    batch = mesh_shape[0]
    model_args = ModelArgs(config.dim, config.n_layers, config.n_heads, config.n_kv_heads, config.vocab_size,
                           config.hidden_dim, config.norm_eps, seq_len, batch, mesh_shape)
    model = Transformer(model_args).eval()
    load_into(model, weights)
    prompt = torch.tensor([prompt_ids] * batch)

    sampling = args.temperature > 0
    reference = None
    if args.check and not sampling:
        reference = generate(model, model, prompt, args.steps)
    shard(model, mesh, plan)
    step = torch.compile(model, backend="shardflow", dynamic=False)
    choose = greedy
    if sampling:
        torch.manual_seed(args.seed)
        sampler = torch.compile(sample_top_p, backend="shardflow", dynamic=False)
        choose = lambda logits: sampler(logits, args.temperature, args.top_p)[:, 0]  # noqa: E731
    result = generate(step, model, prompt, args.steps, choose)
    print(f"{config.name}: mesh {mesh_shape} on {devices} device(s), batch {batch}")
    print(f"tokens: {result.tokens[0]}")
    print(f"prefill {result.prefill_seconds:.3f} s and first decode step {result.first_decode_seconds:.3f} s "
          f"(each compiles its graph); decode {tokens_per_second(result, batch):.1f} tok/s after that")
    print(f"graphs compiled: {len(shardflow.torch.compiled_graphs)} (one prefill, one decode"
          f"{', one sampler' if sampling else ''})")
    model_graphs = [g for g in shardflow.torch.compiled_graphs if g.last is not None and not g.last.draws_random]
    decode = model_graphs[-1].last if model_graphs else None
    if decode is not None:
        collectives = list(decode.executable.collectives)
        print(f"decode step: {len(collectives)} collective(s)")
        for c in collectives:
            print(f"  {c}")
    # Before shutdown: eagerly, the blocks' annotations still lay activations out on the devices.
    failed = check_sampled(model, prompt, result, args.temperature, args.top_p) if args.check and sampling else 0
    xr.shutdown()
    if sampling or reference is None:
        return failed
    worst = max(float((a - b).abs().max() / (1 + b.abs().max())) for a, b in zip(result.logits, reference.logits))
    same = result.tokens == reference.tokens
    print(f"check against eager PyTorch on one device: tokens {'identical' if same else 'DIFFER'}, "
          f"largest logit difference {worst:.2e} of the logits' scale; eager PyTorch decoded "
          f"{tokens_per_second(reference, batch):.1f} tok/s ({torch.get_num_threads()} thread(s))")
    if not same or worst > 1e-4:
        print(f"error: eager PyTorch generated {reference.tokens[0]}", file=sys.stderr)
        return 1
    return 0


def check_sampled(model: Transformer, prompt: torch.Tensor, result: Generation, temperature: float,
                  top_p: float) -> int:
    """Replays the sampled tokens through eager PyTorch on one device: the
    same logits at every step, and every token inside eager's top-p set."""
    chosen = iter([torch.tensor([row[i] for row in result.tokens]) for i in range(len(result.logits))])
    reference = generate(model, model, prompt, len(result.logits), lambda logits: next(chosen))
    worst = max(float((a - b).abs().max() / (1 + b.abs().max())) for a, b in zip(result.logits, reference.logits))
    outside = 0
    for i, logits in enumerate(reference.logits):
        probs = torch.softmax(logits / temperature, dim=-1)
        for b, row in enumerate(result.tokens):
            mass_before = float(probs[b][probs[b] > probs[b][row[i]]].sum())
            outside += mass_before > top_p + 1e-4
    print(f"check against eager PyTorch on one device, replaying the sampled tokens: largest logit difference "
          f"{worst:.2e} of the logits' scale; sampled tokens outside eager PyTorch's top-{top_p} set: {outside}")
    return 0 if worst <= 1e-4 and outside == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
