"""LLaMA 2 on shardflow: configs, weights, the sharding plan as data, the model and generation.

>>> from shardflow import llama
>>> config = llama.Config.named("tiny")
>>> model = llama.Model(llama.random_weights(config, seed=0))
>>> len(llama.generate(model, [[1, 2, 3]], steps=4).tokens[0])
4
"""

from ._core.llama import (  # noqa: F401  (re-exported)
    Config,
    Generation,
    LayerWeights,
    Model,
    ShardingPlan,
    Tokenizer,
    Weights,
    generate,
    load_hf,
    load_llama2c,
    random_weights,
    read_hf_config,
    read_llama2c_config,
    write_llama2c,
)

__all__ = [name for name in dir() if not name.startswith("_")]
