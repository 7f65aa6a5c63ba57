// Named LLaMA configurations and their validation.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "shardflow/base/error.h"
#include "shardflow/models/llama.h"

namespace shardflow::llama {

namespace {

Config make(std::string name, int64_t dim, int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
            int64_t vocab, int64_t seq_len) {
  Config c;
  c.name = std::move(name);
  c.dim = dim;
  c.hidden_dim = hidden;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.vocab_size = vocab;
  c.seq_len = seq_len;
  return c;
}

// `tiny` is for tests: two layers, grouped-query attention (6 query heads on
// 3 key/value heads, which divide neither 4 nor 8 devices) and a vocabulary
// that covers the 259 special and byte tokens of a llama2.c tokenizer.
const std::vector<Config>& named_configs() {
  static const std::vector<Config> configs{
      make("tiny", 48, 128, 2, 6, 3, 320, 64),
      make("stories15M", 288, 768, 6, 6, 6, 32000, 256),
      make("stories110M", 768, 2048, 12, 12, 12, 32000, 1024),
      make("7B", 4096, 11008, 32, 32, 32, 32000, 4096),
  };
  return configs;
}

}  // namespace

Config Config::named(const std::string& name) {
  for (const Config& c : named_configs()) {
    if (c.name == name) return c;
  }
  throw Error(fmt::format("unknown LLaMA config '{}'; expected one of: {}", name, fmt::join(names(), ", ")));
}

std::vector<std::string> Config::names() {
  std::vector<std::string> out;
  for (const Config& c : named_configs()) out.push_back(c.name);
  return out;
}

void Config::validate() const {
  auto positive = [&](const char* field, int64_t value, int64_t limit) {
    if (value <= 0 || value > limit) {
      throw Error(fmt::format("LLaMA config '{}': {} is {}, expected 1..{}", name, field, value, limit));
    }
  };
  // Limits far above any real model, so that a corrupt header cannot make us
  // allocate absurd amounts.
  positive("dim", dim, 1 << 16);
  positive("hidden_dim", hidden_dim, 1 << 18);
  positive("n_layers", n_layers, 1024);
  positive("n_heads", n_heads, 1024);
  positive("n_kv_heads", n_kv_heads, 1024);
  positive("vocab_size", vocab_size, 1 << 22);
  positive("seq_len", seq_len, 1 << 20);
  if (dim % n_heads != 0) {
    throw Error(fmt::format("LLaMA config '{}': dim {} is not a multiple of n_heads {}", name, dim, n_heads));
  }
  if (head_dim() % 2 != 0) {
    throw Error(fmt::format("LLaMA config '{}': the head dim {} must be even for rotary embedding", name, head_dim()));
  }
  if (n_heads % n_kv_heads != 0) {
    throw Error(
        fmt::format("LLaMA config '{}': n_heads {} is not a multiple of n_kv_heads {}", name, n_heads, n_kv_heads));
  }
  if (!(norm_eps > 0) || !(rope_theta > 0)) {
    throw Error(fmt::format("LLaMA config '{}': norm_eps and rope_theta must be positive", name));
  }
}

std::string Config::to_string() const {
  return fmt::format(
      "{}: dim {}, hidden_dim {}, n_layers {}, n_heads {}, n_kv_heads {}, vocab_size {}, "
      "seq_len {}, {} classifier",
      name, dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len,
      shared_classifier ? "shared" : "separate");
}

}  // namespace shardflow::llama
