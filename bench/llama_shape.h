// A LLaMA-7B-shaped forward pass on shape-only (meta) tensors, for tracing
// and partitioning benchmarks: 32 layers, dim 4096, 32 heads, ffn 11008,
// vocab 32000. With a mesh, the weights carry Megatron annotations (q, k, v,
// w1, w3 split by output features over 'model'; o and w2 by input features).
#pragma once

#include <cmath>
#include <optional>
#include <vector>

#include "shardflow/shardflow.h"

namespace bench {

namespace sf = shardflow;

struct Llama7B {
  int64_t dim = 4096, heads = 32, ffn = 11008, vocab = 32000, layers = 32, tokens = 16;

  struct Layer {
    sf::Tensor attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3;
  };
  std::vector<Layer> weights;
  sf::Tensor embedding, final_norm, cos, sin;

  Llama7B() {
    const auto meta = [](sf::Shape shape) { return sf::Tensor::meta(sf::DType::kF32, std::move(shape)); };
    for (int64_t l = 0; l < layers; ++l) {
      weights.push_back({meta({dim}), meta({dim, dim}), meta({dim, dim}), meta({dim, dim}), meta({dim, dim}),
                         meta({dim}), meta({ffn, dim}), meta({dim, ffn}), meta({ffn, dim})});
    }
    embedding = meta({vocab, dim});
    final_norm = meta({dim});
    cos = meta({tokens, dim / heads / 2});
    sin = meta({tokens, dim / heads / 2});
  }

  static sf::Tensor rms_norm(const sf::Tensor& x, const sf::Tensor& weight) {
    return x * sf::rsqrt(sf::mean(x * x, {-1}, true) + 1e-5) * weight;
  }

  // Rotary embedding on [B, T, H, hd] with interleaved pairs.
  sf::Tensor rotary(const sf::Tensor& x) const {
    const sf::Shape shape = x.shape();
    const sf::Tensor pairs = x.reshape({shape[0], shape[1], shape[2], shape[3] / 2, 2});
    const sf::Tensor even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
    const sf::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
    return sf::stack({even * c - odd * s, even * s + odd * c}, -1).reshape(shape);
  }

  // tokens: i64[B, T]. `mesh`: annotate the weights for tensor parallelism.
  sf::Tensor forward(const sf::Tensor& token_ids, const std::optional<sf::Mesh>& mesh) const {
    const auto split = [&](const sf::Tensor& w, int dim_index) {
      if (!mesh) return w;
      std::vector<sf::SpecEntry> spec(2, sf::none);
      spec[static_cast<std::size_t>(dim_index)] = "model";
      return sf::mark_sharding(w * 1, *mesh, sf::PartitionSpec(spec));
    };
    const int64_t b = token_ids.size(0), t = token_ids.size(1), head_dim = dim / heads;
    sf::Tensor x = sf::embedding(embedding, token_ids);
    const sf::Tensor mask = sf::triu(sf::full({t, t}, -INFINITY), 1);
    for (const Layer& w : weights) {
      const sf::Tensor h = rms_norm(x, w.attention_norm);
      const sf::Tensor q = rotary(sf::linear(h, split(w.wq, 0)).reshape({b, t, heads, head_dim}));
      const sf::Tensor k = rotary(sf::linear(h, split(w.wk, 0)).reshape({b, t, heads, head_dim}));
      const sf::Tensor v = sf::linear(h, split(w.wv, 0)).reshape({b, t, heads, head_dim});
      const sf::Tensor scores = sf::matmul(q.transpose(1, 2), k.transpose(1, 2).transpose(-2, -1)) *
                                    (1.0 / std::sqrt(static_cast<double>(head_dim))) +
                                mask;
      const sf::Tensor attention = sf::matmul(sf::softmax(scores, -1), v.transpose(1, 2));
      x = x + sf::linear(attention.transpose(1, 2).reshape({b, t, dim}), split(w.wo, 1));
      const sf::Tensor g = rms_norm(x, w.ffn_norm);
      x = x + sf::linear(sf::silu(sf::linear(g, split(w.w1, 0))) * sf::linear(g, split(w.w3, 0)), split(w.w2, 1));
    }
    return sf::linear(rms_norm(x, final_norm), embedding);
  }
};

}  // namespace bench
