"""compiled == eager: random small PyTorch modules on random meshes.

Each case draws a mesh (1-8 devices, 1-3 axes), a module of random layers
(linear with and without bias, activations, an RMSNorm written in torch ops,
softmax, residual adds, transposes and reshapes, reductions) with uneven
sizes, eager annotations of random parameters, and random annotations of
activations inside forward (the mesh built there from a list or
torch.arange). torch.compile(backend="shardflow") must give eager PyTorch's
result on one device.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn as nn

import shardflow.torch  # noqa: F401  (the backend)
import shardflow.torch.runtime as xr
import shardflow.torch.spmd as xs

MESHES = [(1,), (2,), (4,), (8,), (2, 2), (2, 4), (4, 2), (1, 8), (2, 1, 2), (4, 1, 2), (2, 2, 2)]


def random_spec(rng: random.Random, rank: int, num_axes: int):
    axes = list(range(num_axes))
    rng.shuffle(axes)
    spec = []
    for _ in range(rank):
        if axes and rng.random() < 0.5:
            spec.append(axes.pop())
        else:
            spec.append(None)
    return tuple(spec)


class RmsNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class RandomNet(nn.Module):
    """A chain of random layers on [batch, seq, width] activations."""

    def __init__(self, rng: random.Random, mesh_shape: tuple[int, ...], width: int):
        super().__init__()
        self.rng_steps = []
        self.layers = nn.ModuleList()
        self.mesh_shape = mesh_shape
        self.devices = int(np.prod(mesh_shape))
        self.ids_from_arange = rng.random() < 0.5
        current = width
        for _ in range(rng.randint(2, 6)):
            kind = rng.choice(["linear", "linear", "act", "norm", "softmax", "residual", "transpose", "scale",
                               "reshape"])
            if kind == "linear":
                out = rng.choice([3, 5, 8, 12, 16])
                self.layers.append(nn.Linear(current, out, bias=rng.random() < 0.5))
                current = out
            elif kind == "residual":
                self.layers.append(nn.Linear(current, current, bias=False))
            elif kind == "norm":
                self.layers.append(RmsNorm(current))
            else:
                self.layers.append(nn.Identity())
            annotate = random_spec(rng, 3, len(mesh_shape)) if rng.random() < 0.4 else None
            self.rng_steps.append((kind, rng.choice(["relu", "gelu", "silu", "tanh", "sigmoid"]), annotate))

    def forward(self, x):
        ids = torch.arange(self.devices) if self.ids_from_arange else list(range(self.devices))
        mesh = xs.Mesh(ids, self.mesh_shape)
        for layer, (kind, act, annotate) in zip(self.layers, self.rng_steps):
            if kind in ("linear", "norm"):
                x = layer(x)
            elif kind == "residual":
                x = x + layer(x)
            elif kind == "act":
                x = getattr(torch, act)(x) if act in ("relu", "tanh", "sigmoid") else getattr(
                    torch.nn.functional, act)(x)
            elif kind == "softmax":
                x = torch.softmax(x, dim=-1)
            elif kind == "transpose":
                x = x.transpose(0, 1).contiguous().transpose(0, 1)
            elif kind == "scale":
                x = x * 0.5 - 1
            elif kind == "reshape":
                b, s, w = x.shape
                x = x.reshape(b * s, w).reshape(b, s, w)
            if annotate is not None:
                xs.mark_sharding(x, mesh, annotate)
        return x.sum(-1) if self.rng_steps[-1][0] == "scale" else x


@pytest.mark.parametrize("case", range(200))
def test_compiled_equals_eager(case):
    rng = random.Random(1000 + case)
    torch.manual_seed(case)
    mesh_shape = rng.choice(MESHES)
    devices = int(np.prod(mesh_shape))
    xr.shutdown()
    torch._dynamo.reset()
    xr.use_spmd(devices=devices)
    try:
        width = rng.choice([4, 6, 7, 16])
        net = RandomNet(rng, mesh_shape, width).eval()
        names = tuple("abc"[: len(mesh_shape)])
        outer = xs.Mesh(list(range(devices)), mesh_shape, names)
        for parameter in net.parameters():
            if rng.random() < 0.5:
                spec = random_spec(rng, parameter.dim(), len(mesh_shape))
                xs.mark_sharding(parameter, outer, tuple(names[a] if a is not None else None for a in spec))
        x = torch.randn(rng.choice([1, 2, 3, 5, 8]), rng.choice([1, 3, 4]), width)
        if rng.random() < 0.3:
            xs.mark_sharding(x, outer, random_spec(rng, 3, len(mesh_shape)))
        with torch.no_grad():
            expected = net(x)
            got = torch.compile(net, backend="shardflow")(x)
        scale = 1 + expected.abs().max().item()
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * scale)
    finally:
        xr.shutdown()
        torch._dynamo.reset()
