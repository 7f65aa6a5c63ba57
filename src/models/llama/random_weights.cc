// Deterministic random weights: element i of tensor t is a hash of
// (seed, t, i), so any shard can be generated on its own.
#include <cmath>

#include "placement.h"

namespace shardflow::llama {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [center - half_width, center + half_width).
ElementSource uniform(int64_t seed, int64_t tensor_id, double center, double half_width) {
  const uint64_t key = mix(static_cast<uint64_t>(seed) * 0x100000001b3ULL + static_cast<uint64_t>(tensor_id));
  return [=](int64_t offset, int64_t count, float* dst) {
    for (int64_t i = 0; i < count; ++i) {
      const double u = static_cast<double>(mix(key ^ static_cast<uint64_t>(offset + i)) >> 11) * 0x1.0p-53;
      dst[i] = static_cast<float>(center + (2 * u - 1) * half_width);
    }
  };
}

// Half-width of a uniform distribution with standard deviation 1/sqrt(fan_in):
// keeps activations of order one through the layers.
double linear_width(int64_t fan_in) { return std::sqrt(3.0 / static_cast<double>(fan_in)); }

}  // namespace

Weights random_weights(const Config& config, int64_t seed, const ShardingPlan* plan) {
  config.validate();
  if (plan != nullptr) plan->check();
  const int64_t dim = config.dim, hd = config.head_dim();
  const int64_t q_dim = config.n_heads * hd, kv_dim = config.n_kv_heads * hd;
  Weights w;
  w.config = config;
  // Embedding std 2/sqrt(dim): a tied head then gives logits of std ~2, so
  // sampling has choices and greedy decoding does not just repeat its input.
  const double embedding_width = 2 * linear_width(dim);
  w.tok_embeddings =
      place_tensor({config.vocab_size, dim}, uniform(seed, 0, 0, embedding_width), plan, "tok_embeddings");
  w.norm = place_tensor({dim}, uniform(seed, 1, 1, 0.2), plan, "norm");
  // A tied head has the embedding's values; its own copy only where the plan
  // gives it another layout (the vocabulary split over 'model').
  if (config.shared_classifier && tied_head_shares_embedding(plan)) {
    w.output = w.tok_embeddings;
  } else if (config.shared_classifier) {
    w.output = place_tensor({config.vocab_size, dim}, uniform(seed, 0, 0, embedding_width), plan, "output");
  } else {
    w.output = place_tensor({config.vocab_size, dim}, uniform(seed, 2, 0, linear_width(dim)), plan, "output");
  }
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const int64_t id = 16 * (l + 1);
    LayerWeights layer;
    layer.attention_norm = place_tensor({dim}, uniform(seed, id, 1, 0.2), plan, "attention_norm");
    layer.wq = place_tensor({q_dim, dim}, uniform(seed, id + 1, 0, linear_width(dim)), plan, "wq");
    layer.wk = place_tensor({kv_dim, dim}, uniform(seed, id + 2, 0, linear_width(dim)), plan, "wk");
    layer.wv = place_tensor({kv_dim, dim}, uniform(seed, id + 3, 0, linear_width(dim)), plan, "wv");
    layer.wo = place_tensor({dim, q_dim}, uniform(seed, id + 4, 0, linear_width(q_dim)), plan, "wo");
    layer.ffn_norm = place_tensor({dim}, uniform(seed, id + 5, 1, 0.2), plan, "ffn_norm");
    layer.w1 = place_tensor({config.hidden_dim, dim}, uniform(seed, id + 6, 0, linear_width(dim)), plan, "w1");
    layer.w2 =
        place_tensor({dim, config.hidden_dim}, uniform(seed, id + 7, 0, linear_width(config.hidden_dim)), plan, "w2");
    layer.w3 = place_tensor({config.hidden_dim, dim}, uniform(seed, id + 8, 0, linear_width(dim)), plan, "w3");
    w.layers.push_back(std::move(layer));
  }
  return w;
}

}  // namespace shardflow::llama
