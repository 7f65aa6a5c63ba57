// Tracing + verification time of a 32-layer LLaMA-7B-shaped forward (dim
// 4096, 32 heads, ffn 11008, vocab 32000), traced on shape-only (meta)
// tensors so no weight memory is allocated. Target: < 200 ms. The counter
// `nodes` is the graph size.
#include <benchmark/benchmark.h>

#include <cmath>

#include "shardflow/shardflow.h"

namespace sf = shardflow;

namespace {

struct Shape7B {
  int64_t dim = 4096, heads = 32, ffn = 11008, vocab = 32000, layers = 32, tokens = 16;
};

struct LayerWeights {
  sf::Tensor attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3;
};

sf::Tensor rms_norm(const sf::Tensor& x, const sf::Tensor& weight) {
  const sf::Tensor scale = sf::rsqrt(sf::mean(x * x, {-1}, true) + 1e-5);
  return x * scale * weight;
}

// Rotary embedding on [B, T, H, hd] with cos/sin of [T, hd/2] (interleaved pairs).
sf::Tensor rotary(const sf::Tensor& x, const sf::Tensor& cos, const sf::Tensor& sin) {
  const sf::Shape shape = x.shape();
  const sf::Tensor pairs = x.reshape({shape[0], shape[1], shape[2], shape[3] / 2, 2});
  const sf::Tensor even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
  const sf::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  return sf::stack({even * c - odd * s, even * s + odd * c}, -1).reshape(shape);
}

}  // namespace

static void TraceLlama7B(benchmark::State& state) {
  const Shape7B s;
  const int64_t head_dim = s.dim / s.heads;
  const auto meta = [](sf::Shape shape) { return sf::Tensor::meta(sf::DType::kF32, std::move(shape)); };
  std::vector<LayerWeights> layers;
  for (int64_t l = 0; l < s.layers; ++l) {
    layers.push_back({meta({s.dim}), meta({s.dim, s.dim}), meta({s.dim, s.dim}), meta({s.dim, s.dim}),
                      meta({s.dim, s.dim}), meta({s.dim}), meta({s.ffn, s.dim}), meta({s.dim, s.ffn}),
                      meta({s.ffn, s.dim})});
  }
  const sf::Tensor embedding = meta({s.vocab, s.dim});
  const sf::Tensor final_norm = meta({s.dim});
  const sf::Tensor cos = meta({s.tokens, head_dim / 2}), sin = meta({s.tokens, head_dim / 2});
  const auto forward = [&](sf::Tensor tokens) {
    const int64_t b = tokens.size(0), t = tokens.size(1);
    sf::Tensor x = sf::embedding(embedding, tokens);
    const sf::Tensor mask = sf::triu(sf::full({t, t}, -INFINITY), 1);
    for (const LayerWeights& w : layers) {
      const sf::Tensor h = rms_norm(x, w.attention_norm);
      const sf::Tensor q = rotary(sf::linear(h, w.wq).reshape({b, t, s.heads, head_dim}), cos, sin);
      const sf::Tensor k = rotary(sf::linear(h, w.wk).reshape({b, t, s.heads, head_dim}), cos, sin);
      const sf::Tensor v = sf::linear(h, w.wv).reshape({b, t, s.heads, head_dim});
      const sf::Tensor scores = sf::matmul(q.transpose(1, 2), k.transpose(1, 2).transpose(-2, -1)) *
                                    (1.0 / std::sqrt(static_cast<double>(head_dim))) + mask;
      const sf::Tensor attention = sf::matmul(sf::softmax(scores, -1), v.transpose(1, 2));
      x = x + sf::linear(attention.transpose(1, 2).reshape({b, t, s.dim}), w.wo);
      const sf::Tensor g = rms_norm(x, w.ffn_norm);
      x = x + sf::linear(sf::silu(sf::linear(g, w.w1)) * sf::linear(g, w.w3), w.w2);
    }
    return sf::linear(rms_norm(x, final_norm), embedding);
  };
  const sf::Tensor tokens = sf::Tensor::meta(sf::DType::kI64, {1, s.tokens});
  std::size_t nodes = 0;
  for (auto _ : state) {
    auto step = sf::compile(forward);  // a fresh cache: every iteration traces
    nodes = step.trace(tokens).nodes().size();
  }
  state.counters["nodes"] = static_cast<double>(nodes);
}
BENCHMARK(TraceLlama7B)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
