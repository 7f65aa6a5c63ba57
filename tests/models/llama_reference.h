// A straightforward LLaMA 2 forward pass in plain loops over floats, written
// without the tracer, ops or runtime: the reference the model is tested
// against.
#pragma once

#include <cstdint>
#include <vector>

#include "shardflow/models/llama.h"

namespace shardflow::llama::testing {

struct ReferenceWeights {
  Config config;
  std::vector<float> tok_embeddings, norm, output;
  struct Layer {
    std::vector<float> attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3;
  };
  std::vector<Layer> layers;
};

// Gathers the values of (possibly sharded) model weights.
ReferenceWeights reference_weights(const Weights& weights);

// Logits [T][vocab] of every position of one sequence, attention causal;
// `rotate_half` selects Hugging Face's rotary convention instead of Meta's
// interleaved pairs.
std::vector<std::vector<float>> reference_logits(const ReferenceWeights& w, const std::vector<int64_t>& tokens,
                                                 bool rotate_half = false);

// Runs `sequences` (one row each, equal lengths) through the model: a
// prefill of the first `prompt` tokens, then one decode step per token.
// Asserts that each step's logits are within 1e-4 * (1 + max |expected|) of
// expected[row][position].
void expect_steps_match(Model& model, const std::vector<std::vector<int64_t>>& sequences, int64_t prompt,
                        const std::vector<std::vector<std::vector<float>>>& expected);

}  // namespace shardflow::llama::testing
