// LLaMA weight files.
//
// llama2.c checkpoints (`.bin`, the legacy "version 0" export): seven int32
// header fields `dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
// seq_len` (a negative vocab_size means the classifier is not shared with the
// embedding), then f32 tensors, each stacked over the layers where it has
// one per layer: token embedding [vocab,dim], attention norms [L,dim], wq
// [L,dim,dim], wk [L,kv_dim,dim], wv [L,kv_dim,dim], wo [L,dim,dim], FFN
// norms [L,dim], w1 [L,hidden,dim], w2 [L,dim,hidden], w3 [L,hidden,dim],
// final norm [dim], two legacy rotary tables [seq_len, head_dim/2] (skipped),
// and the classifier [vocab,dim] when not shared. Matrices are [out, in];
// the rotary convention is Meta's interleaved pairs, as the model's.
//
// Hugging Face checkpoints (a directory): config.json (LlamaConfig's fields)
// and the tensors in model.safetensors, or in the files that
// model.safetensors.index.json's "weight_map" names for each tensor (the
// single file wins when both exist). Tensors
// are F32, F16 or BF16 (read as f32) under the names of LlamaForCausalLM
// (model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight, ...,
// mlp.gate_proj = w1, mlp.up_proj = w3, mlp.down_proj = w2, model.norm.weight,
// lm_head.weight unless tied). Their rotary convention rotates the halves of
// each head (pairs (i, i + head_dim/2)), which comes from permuting the rows
// of Meta's wq and wk; loading undoes that permutation, so Meta's row
// h*hd + 2i + p is the file's row h*hd + p*hd/2 + i.
#pragma once

#include <cstdint>
#include <filesystem>

#include "shardflow/models/llama.h"

namespace shardflow::llama {

// The header alone; errors name the file and the field.
Config read_llama2c_config(const std::filesystem::path& path);

// Loads every tensor straight into its device shards as `plan` says (no
// whole host copy of a sharded tensor); without a plan, onto one device.
// Errors: missing file, a header that breaks the config rules, a file shorter
// or longer than the header implies (naming the tensor where it ends, with
// expected and found sizes).
Weights load_llama2c(const std::filesystem::path& path, const ShardingPlan* plan = nullptr);

// Writes weights in the same format (for tests, and to export random weights).
void write_llama2c(const std::filesystem::path& path, const Weights& weights);

// dir/config.json: hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads (default: the heads), vocab_size,
// max_position_embeddings (the seq_len), rms_norm_eps, rope_theta (default
// 10000), tie_word_embeddings (default false). Errors name the file and the
// field that is missing or of the wrong type, a model_type other than
// "llama", and settings the model cannot run (rope_scaling, biases, an
// activation other than silu, a head_dim other than hidden_size/heads).
Config read_hf_config(const std::filesystem::path& dir);

// Loads every tensor straight into its device shards as `plan` says, reading
// only each shard's elements from the files (opened once per load); q_proj
// and k_proj are converted to Meta's rotary layout. A tied head is the
// embedding, read again with the head's own layout. Errors: a missing
// directory, config or file (also one the index names), a malformed
// safetensors header or one whose length exceeds the file, a missing tensor,
// a wrong shape, an unsupported dtype, data_offsets outside the data or not
// spanning the tensor's bytes.
Weights load_hf(const std::filesystem::path& dir, const ShardingPlan* plan = nullptr);

// Writes a Hugging Face checkpoint of weights that are ALREADY in Hugging
// Face's layout (nothing is permuted): config.json and model.safetensors
// when num_files is 1, else num_files safetensors files and the index.
// Tensors are stored as `dtype` (f32, f16 or bf16, rounded to nearest even).
// For tests: a model's own (Meta-layout) weights written this way would load
// with q and k permuted twice.
void write_hf(const std::filesystem::path& dir, const Weights& hf_layout_weights, DType dtype, int64_t num_files);

}  // namespace shardflow::llama
