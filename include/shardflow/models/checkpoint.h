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
#pragma once

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

}  // namespace shardflow::llama
