// The small LLaMA checkpoint the safetensors fuzzers load against, written
// with the project's own writer (write_hf), so that the fuzzers and the
// seeds of corpus/ (seed_writer.cc) agree on config.json and tensor shapes.
#pragma once

#include <cstdint>
#include <filesystem>

#include "shardflow/models/checkpoint.h"
#include "shardflow/models/llama.h"
#include "shardflow/tensor/dtype.h"

namespace shardflow_fuzz {

// dim 4, two query heads on one key/value head (head_dim 2), one layer,
// hidden 6, vocabulary 5, seq_len 4; the head tied to the embedding unless
// `tied` is false.
inline shardflow::llama::Config fixture_config(bool tied = true) {
  shardflow::llama::Config c;
  c.name = "fuzz";
  c.dim = 4;
  c.hidden_dim = 6;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.vocab_size = 5;
  c.seq_len = 4;
  c.shared_classifier = tied;
  return c;
}

// config.json and model.safetensors (num_files 1), or config.json, the index
// and model-0000k-of-0000n.safetensors.
inline void write_fixture(const std::filesystem::path& dir, int64_t num_files,
                          shardflow::DType dtype = shardflow::DType::kF32, bool tied = true) {
  const shardflow::llama::Weights weights = shardflow::llama::random_weights(fixture_config(tied), /*seed=*/7);
  shardflow::llama::write_hf(dir, weights, dtype, num_files);
}

}  // namespace shardflow_fuzz
