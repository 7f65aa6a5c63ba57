// The memory a generation needs, before it allocates (see llama.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "shardflow/base/error.h"
#include "shardflow/models/llama.h"

namespace shardflow::llama {

namespace {

// A product of named factors, saturating at UINT64_MAX instead of wrapping.
struct Product {
  uint64_t value = 1;
  std::string formula;

  Product& times(int64_t factor, const std::string& name) {
    const uint64_t f = factor < 0 ? 0 : static_cast<uint64_t>(factor);
    if (value != UINT64_MAX && __builtin_mul_overflow(value, f, &value)) value = UINT64_MAX;
    formula +=
        (formula.empty() ? "" : " x ") + (name.empty() ? std::to_string(factor) : name + " " + std::to_string(factor));
    return *this;
  }
};

uint64_t saturating_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// Sum of products (the weights: several matrices per layer).
uint64_t sum_of(std::initializer_list<uint64_t> terms) {
  uint64_t total = 0;
  for (uint64_t t : terms) total = saturating_add(total, t);
  return total;
}

uint64_t times(uint64_t a, uint64_t b) {
  uint64_t out = 0;
  return __builtin_mul_overflow(a, b, &out) ? UINT64_MAX : out;
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  if (bytes == UINT64_MAX) return "more than 16 EiB";
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double value = static_cast<double>(bytes) / 1024;
  std::size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return value < 10 ? fmt::format("{:.1f} {}", value, kUnits[unit]) : fmt::format("{:.0f} {}", value, kUnits[unit]);
}

std::vector<MemoryNeed> memory_needs(const Config& c, int64_t batch, int64_t prompt_length, int64_t data_parallel) {
  const auto u = [](int64_t v) { return v < 0 ? uint64_t{0} : static_cast<uint64_t>(v); };
  const uint64_t hd = u(c.head_dim()), dim = u(c.dim), hidden = u(c.hidden_dim);
  const uint64_t per_layer =
      sum_of({times(2, dim), times(dim, times(u(c.n_heads), hd)), times(2, times(dim, times(u(c.n_kv_heads), hd))),
              times(times(u(c.n_heads), hd), dim), times(3, times(dim, hidden))});
  uint64_t parameters = sum_of({times(u(c.vocab_size), dim), times(u(c.n_layers), per_layer), dim,
                                c.shared_classifier ? 0 : times(u(c.vocab_size), dim)});
  std::vector<MemoryNeed> needs;
  needs.push_back({"weights", times(times(parameters, 4), u(std::max<int64_t>(data_parallel, 1))),
                   fmt::format("{} parameters x 4 bytes{}", parameters,
                               data_parallel > 1 ? fmt::format(" x {} data-parallel replicas", data_parallel) : "")});
  Product cache;
  cache.times(batch, "batch").times(c.n_layers, "layers").times(c.n_kv_heads, "kv heads").times(c.seq_len, "seq_len");
  cache.times(c.head_dim(), "head_dim").times(2, "").times(4, "");
  needs.push_back({"KV cache", cache.value, cache.formula + " (keys and values, 4 bytes each)"});
  Product rope;
  rope.times(2, "").times(c.seq_len, "seq_len").times(c.head_dim(), "head_dim").times(4, "");
  needs.push_back({"rotary tables", rope.value, rope.formula + " (cos and sin, 4 bytes each)"});
  Product mask;
  mask.times(std::max<int64_t>(c.n_heads / std::max<int64_t>(c.n_kv_heads, 1), 1), "query heads per kv head")
      .times(prompt_length, "prompt tokens")
      .times(c.seq_len, "seq_len");
  needs.push_back({"attention mask", mask.value, mask.formula + " (1 byte each)"});
  // The prefill's largest live activations: the MLP's three hidden-size
  // products, the residual stream and its norm, and the logits.
  Product stream;
  stream.times(batch, "batch").times(prompt_length, "prompt tokens");
  const uint64_t activations = sum_of({times(times(stream.value, sum_of({times(3, hidden), times(4, dim)})), 4),
                                       times(times(u(batch), u(c.vocab_size)), 4)});
  needs.push_back({"activations of the prefill step", activations,
                   stream.formula + " x (3 x hidden_dim " + std::to_string(c.hidden_dim) + " + 4 x dim " +
                       std::to_string(c.dim) + ") x 4 bytes, and the logits"});
  return needs;
}

void check_memory(const std::vector<MemoryNeed>& needs, uint64_t budget_bytes, const std::string& budget_what,
                  const std::string& advice) {
  if (needs.empty()) return;
  const auto largest = std::max_element(needs.begin(), needs.end(),
                                        [](const MemoryNeed& a, const MemoryNeed& b) { return a.bytes < b.bytes; });
  if (largest->bytes > budget_bytes) {
    throw Error(fmt::format("{} of {} ({}) exceeds {}; {}", largest->what, format_bytes(largest->bytes),
                            largest->formula, budget_what, advice));
  }
  uint64_t total = 0;
  std::string parts;
  for (const MemoryNeed& need : needs) {
    total = saturating_add(total, need.bytes);
    parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", need.what, format_bytes(need.bytes));
  }
  if (total > budget_bytes) {
    throw Error(
        fmt::format("the run needs {} ({}), which exceeds {}; {}", format_bytes(total), parts, budget_what, advice));
  }
}

}  // namespace shardflow::llama
