#include "models/llama_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace shardflow::llama::testing {

namespace {

using Vec = std::vector<float>;

// y[o] = sum_i w[o*in + i] * x[i]
Vec matvec(const Vec& w, const Vec& x, int64_t out) {
  const std::size_t in = x.size();
  Vec y(static_cast<std::size_t>(out));
  for (std::size_t o = 0; o < y.size(); ++o) {
    double acc = 0;
    for (std::size_t i = 0; i < in; ++i) acc += static_cast<double>(w[o * in + i]) * x[i];
    y[o] = static_cast<float>(acc);
  }
  return y;
}

Vec rms_norm(const Vec& x, const Vec& weight, double eps) {
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i] * scale * weight[i]);
  return y;
}

// Rotates each head of v (heads of size hd) for position pos.
void rotate(Vec& v, int64_t hd, int64_t pos, double theta, bool rotate_half) {
  const int64_t half = hd / 2;
  for (std::size_t head = 0; head < v.size() / static_cast<std::size_t>(hd); ++head) {
    float* h = v.data() + head * static_cast<std::size_t>(hd);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double c = std::cos(angle), s = std::sin(angle);
      // Meta pairs (2i, 2i+1); Hugging Face pairs (i, i + hd/2).
      float& a = rotate_half ? h[i] : h[2 * i];
      float& b = rotate_half ? h[i + half] : h[2 * i + 1];
      const double x0 = a, x1 = b;
      a = static_cast<float>(x0 * c - x1 * s);
      b = static_cast<float>(x0 * s + x1 * c);
    }
  }
}

}  // namespace

ReferenceWeights reference_weights(const Weights& weights) {
  ReferenceWeights r;
  r.config = weights.config;
  r.tok_embeddings = weights.tok_embeddings.to_floats();
  r.norm = weights.norm.to_floats();
  r.output = weights.output.to_floats();
  for (const LayerWeights& l : weights.layers) {
    r.layers.push_back({l.attention_norm.to_floats(), l.wq.to_floats(), l.wk.to_floats(), l.wv.to_floats(),
                        l.wo.to_floats(), l.ffn_norm.to_floats(), l.w1.to_floats(), l.w2.to_floats(),
                        l.w3.to_floats()});
  }
  return r;
}

std::vector<std::vector<float>> reference_logits(const ReferenceWeights& w, const std::vector<int64_t>& tokens,
                                                 bool rotate_half) {
  const Config& c = w.config;
  const int64_t hd = c.head_dim(), kv_dim = c.n_kv_heads * hd, group = c.n_heads / c.n_kv_heads;
  const std::size_t dim = static_cast<std::size_t>(c.dim);
  std::vector<Vec> x;
  for (int64_t t : tokens) {
    x.emplace_back(w.tok_embeddings.begin() + t * c.dim, w.tok_embeddings.begin() + (t + 1) * c.dim);
  }
  const std::size_t length = tokens.size();
  for (const ReferenceWeights::Layer& l : w.layers) {
    std::vector<Vec> q(length), k(length), v(length);
    for (std::size_t t = 0; t < length; ++t) {
      const Vec h = rms_norm(x[t], l.attention_norm, c.norm_eps);
      q[t] = matvec(l.wq, h, c.n_heads * hd);
      k[t] = matvec(l.wk, h, kv_dim);
      v[t] = matvec(l.wv, h, kv_dim);
      rotate(q[t], hd, static_cast<int64_t>(t), c.rope_theta, rotate_half);
      rotate(k[t], hd, static_cast<int64_t>(t), c.rope_theta, rotate_half);
    }
    for (std::size_t t = 0; t < length; ++t) {
      Vec attention(static_cast<std::size_t>(c.n_heads * hd), 0.0f);
      for (int64_t head = 0; head < c.n_heads; ++head) {
        const int64_t kv = head / group;
        std::vector<double> scores(t + 1);
        for (std::size_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += static_cast<double>(q[t][head * hd + i]) * k[s][kv * hd + i];
          scores[s] = dot / std::sqrt(static_cast<double>(hd));
        }
        const double peak = *std::max_element(scores.begin(), scores.end());
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - peak));
        for (int64_t i = 0; i < hd; ++i) {
          double acc = 0;
          for (std::size_t s = 0; s <= t; ++s) acc += scores[s] / total * v[s][kv * hd + i];
          attention[head * hd + i] = static_cast<float>(acc);
        }
      }
      const Vec projected = matvec(l.wo, attention, c.dim);
      for (std::size_t i = 0; i < dim; ++i) x[t][i] += projected[i];
      const Vec g = rms_norm(x[t], l.ffn_norm, c.norm_eps);
      Vec a = matvec(l.w1, g, c.hidden_dim);
      const Vec b = matvec(l.w3, g, c.hidden_dim);
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(a[i] / (1 + std::exp(-a[i])) * b[i]);
      const Vec down = matvec(l.w2, a, c.dim);
      for (std::size_t i = 0; i < dim; ++i) x[t][i] += down[i];
    }
  }
  std::vector<std::vector<float>> logits;
  for (std::size_t t = 0; t < length; ++t) logits.push_back(matvec(w.output, rms_norm(x[t], w.norm, c.norm_eps), c.vocab_size));
  return logits;
}

void expect_steps_match(Model& model, const std::vector<std::vector<int64_t>>& sequences, int64_t prompt,
                        const std::vector<std::vector<std::vector<float>>>& expected) {
  const int64_t batch = static_cast<int64_t>(sequences.size()), vocab = model.config().vocab_size;
  KVCache cache = model.new_cache(batch);
  for (int64_t pos = prompt - 1; pos < static_cast<int64_t>(sequences[0].size()); ++pos) {
    const bool prefill = pos == prompt - 1;
    std::vector<int64_t> tokens;
    for (const auto& seq : sequences) {
      if (prefill) tokens.insert(tokens.end(), seq.begin(), seq.begin() + prompt);
      else tokens.push_back(seq[static_cast<std::size_t>(pos)]);
    }
    const int64_t length = prefill ? prompt : 1;
    const Tensor logits = model.forward(Tensor::from_ints(tokens, {batch, length}), prefill ? 0 : pos, cache);
    ASSERT_EQ(logits.shape(), (Shape{batch, vocab}));
    const std::vector<float> got = logits.to_floats();
    for (int64_t b = 0; b < batch; ++b) {
      const std::vector<float>& want = expected[static_cast<std::size_t>(b)][static_cast<std::size_t>(pos)];
      double scale = 0;
      for (float x : want) scale = std::max(scale, std::abs(static_cast<double>(x)));
      const double tolerance = 1e-4 * (1 + scale);
      for (int64_t v = 0; v < vocab; ++v) {
        ASSERT_NEAR(got[static_cast<std::size_t>(b * vocab + v)], want[static_cast<std::size_t>(v)], tolerance)
            << "row " << b << " position " << pos << " token " << v;
      }
    }
  }
}

}  // namespace shardflow::llama::testing
