"""LLaMA 2 from Python: the plan as data, generation sharded == one device, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

import shardflow as sf
from shardflow import llama

PROMPT = [1, 45, 99, 31]


def one_device_tokens(config, steps):
    return llama.generate(llama.Model(llama.random_weights(config, seed=0)), [PROMPT], steps=steps).tokens[0]


@pytest.mark.parametrize("mesh_shape", [(4, 1, 2), (1, 1, 8), (2, 1, 2), (2, 2, 1)])
def test_sharded_generation_gives_the_one_device_tokens(mesh_shape):
    config = llama.Config.named("tiny")
    size = int(np.prod(mesh_shape))
    with sf.Runtime.local(size):
        mesh = sf.Mesh(range(size), mesh_shape, ("data", "fsdp", "model"))
        plan = llama.ShardingPlan.megatron(mesh)
        model = llama.Model(llama.random_weights(config, seed=0, plan=plan), plan)
        generation = llama.generate(model, [PROMPT] * mesh_shape[0], steps=6)
        assert model.decode_stats["traces"] == 1  # one decode program for every token
        collectives = model.decode_collectives()
    expected = one_device_tokens(config, 6)
    assert all(row == expected for row in generation.tokens)
    if mesh_shape[2] > 1:
        assert collectives and all(c.reason and c.axes for c in collectives)


def test_the_plan_is_data_users_edit():
    mesh = sf.Mesh(range(8), (4, 1, 2), ("data", "fsdp", "model"))
    plan = llama.ShardingPlan.megatron(mesh)
    assert set(plan.params) >= {"wq", "wk", "wv", "wo", "w1", "w2", "w3", "tok_embeddings", "output"}
    replicated_embedding = plan.with_param("tok_embeddings", (None, None))
    assert str(replicated_embedding.params["tok_embeddings"]) == "(None, None)"
    assert "block_output" not in plan.with_activation("block_output", None).activations
    with pytest.raises(sf.Error, match="Axis name nope is not defined in the given mesh"):
        plan.with_param("wq", ("nope", None))


def test_llama2c_checkpoints_round_trip(tmp_path):
    config = llama.Config(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300, seq_len=32,
                          shared_classifier=False)
    weights = llama.random_weights(config, seed=3)
    path = tmp_path / "model.bin"
    llama.write_llama2c(path, weights)
    assert llama.read_llama2c_config(path).dim == 32
    loaded = llama.load_llama2c(path)
    np.testing.assert_array_equal(loaded.layers[1].wq.numpy(), weights.layers[1].wq.numpy())
    a = llama.generate(llama.Model(loaded), [[1, 2, 3]], steps=4, keep_logits=True)
    b = llama.generate(llama.Model(weights), [[1, 2, 3]], steps=4, keep_logits=True)
    assert a.tokens == b.tokens
    np.testing.assert_array_equal(a.logits[0], b.logits[0])


def test_bad_configs_and_files_are_clear_errors(tmp_path):
    with pytest.raises(sf.Error, match="tiny"):
        llama.Config.named("huge")
    with pytest.raises(sf.Error):
        llama.Config(dim=30, hidden_dim=64, n_layers=1, n_heads=4, vocab_size=300, seq_len=8)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x01\x02")
    with pytest.raises(sf.Error):
        llama.load_llama2c(bad)
    with pytest.raises(sf.Error):
        llama.load_hf(tmp_path / "missing")
