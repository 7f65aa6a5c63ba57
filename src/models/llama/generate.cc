// Generation: prefill the prompt, then decode one token at a time, sampling
// on the host from the gathered logits.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "shardflow/base/error.h"
#include "shardflow/models/llama.h"

namespace shardflow::llama {

namespace {

// The index of the first largest logit, NaN aside (0 when all are NaN). Two
// passes: a maximum over independent lanes, which vectorises, then the first
// index that holds it. std::max_element's one branchy pass was 2-3% of a
// stories15M decode step (32000 logits); this is several times faster.
int64_t first_maximum(std::span<const float> logits) {
  constexpr std::size_t kLanes = 16;
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, -std::numeric_limits<float>::infinity());
  std::size_t i = 0;
  for (; i + kLanes <= logits.size(); i += kLanes) {
    for (std::size_t j = 0; j < kLanes; ++j) lanes[j] = logits[i + j] > lanes[j] ? logits[i + j] : lanes[j];
  }
  float top = *std::max_element(lanes, lanes + kLanes);
  for (; i < logits.size(); ++i) top = logits[i] > top ? logits[i] : top;
  const auto at = std::find(logits.begin(), logits.end(), top);
  return at == logits.end() ? 0 : at - logits.begin();
}

}  // namespace

int64_t sample_token(std::span<const float> logits, double temperature, double top_p, double coin) {
  if (logits.empty()) throw Error("cannot sample from empty logits");
  if (temperature <= 0) return first_maximum(logits);
  const float peak = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs(logits.size());
  double total = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    probs[i] = std::exp((static_cast<double>(logits[i]) - peak) / temperature);
    total += probs[i];
  }
  for (double& p : probs) p /= total;
  // Nucleus: the smallest set of most likely tokens whose mass reaches top_p.
  std::vector<int64_t> order(probs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return probs[static_cast<std::size_t>(a)] > probs[static_cast<std::size_t>(b)];
  });
  std::size_t kept = order.size();
  if (top_p > 0 && top_p < 1) {
    double mass = 0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      mass += probs[static_cast<std::size_t>(order[i])];
      if (mass >= top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  double kept_mass = 0;
  for (std::size_t i = 0; i < kept; ++i) kept_mass += probs[static_cast<std::size_t>(order[i])];
  double target = coin * kept_mass, running = 0;
  for (std::size_t i = 0; i < kept; ++i) {
    running += probs[static_cast<std::size_t>(order[i])];
    if (target < running) return order[i];
  }
  return order[kept - 1];  // rounding left target at the very end
}

Generation generate(Model& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& options) {
  const Config& c = model.config();
  if (prompts.empty() || prompts[0].empty()) throw Error("generate: the prompt must hold at least one token");
  const int64_t batch = static_cast<int64_t>(prompts.size());
  const int64_t length = static_cast<int64_t>(prompts[0].size());
  std::vector<int64_t> flat;
  for (const auto& row : prompts) {
    if (static_cast<int64_t>(row.size()) != length) {
      throw Error(fmt::format("generate: prompts must have the same length ({} and {} tokens)", length, row.size()));
    }
    for (int64_t token : row) {
      if (token < 0 || token >= c.vocab_size) {
        throw Error(fmt::format("generate: prompt token {} is outside the vocabulary 0..{}", token, c.vocab_size - 1));
      }
      flat.push_back(token);
    }
  }
  // The last token generated is not fed back, so it needs no position.
  // (Compared without forming length + steps, which may overflow.)
  if (options.steps < 0) throw Error(fmt::format("generate: steps must be 0 or more, got {}", options.steps));
  if (options.steps > c.seq_len + 1 - length) {
    const std::string needed = options.steps <= c.seq_len + 1 ? std::to_string(length + options.steps - 1)
                                                              : "more than " + std::to_string(c.seq_len);
    throw Error(fmt::format("generate: {} prompt tokens + {} steps need {} positions, but the model has seq_len {}",
                            length, options.steps, needed, c.seq_len));
  }
  Generation out;
  out.prompt_tokens = length;
  out.tokens.assign(static_cast<std::size_t>(batch), {});
  if (options.steps == 0) return out;
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> coin(0, 1);
  KVCache cache = model.new_cache(batch);

  auto sample_all = [&](const Tensor& logits) {
    const std::vector<float> values = logits.to_floats();
    std::vector<int64_t> next;
    for (int64_t b = 0; b < batch; ++b) {
      std::span<const float> row(values.data() + b * c.vocab_size, static_cast<std::size_t>(c.vocab_size));
      next.push_back(sample_token(row, options.temperature, options.top_p, coin(rng)));
      out.tokens[static_cast<std::size_t>(b)].push_back(next.back());
    }
    if (options.keep_logits) out.logits.push_back(values);
    if (options.on_token) options.on_token(static_cast<int64_t>(out.tokens[0].size()), options.steps);
    return next;
  };

  using Clock = std::chrono::steady_clock;
  auto started = Clock::now();
  std::vector<int64_t> next = sample_all(model.forward(Tensor::from_ints(flat, {batch, length}), 0, cache));
  out.prefill_seconds = std::chrono::duration<double>(Clock::now() - started).count();
  started = Clock::now();
  for (int64_t step = 1; step < options.steps; ++step) {
    next = sample_all(model.forward(Tensor::from_ints(next, {batch, 1}), length + step - 1, cache));
  }
  out.decode_seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return out;
}

}  // namespace shardflow::llama
