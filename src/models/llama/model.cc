// The LLaMA 2 forward step, traced into one program for prefill and one for
// decode. Everything here is public API: tensors, ops, mark_sharding and
// compile.
#include <fmt/format.h>

#include <cmath>
#include <numeric>

#include "shardflow/base/error.h"
#include "shardflow/models/llama.h"
#include "shardflow/trace/mark_sharding.h"
#include "shardflow/trace/ops.h"

namespace shardflow::llama {

namespace {

// One fused op over the model dim: it needs that dim whole, so a residual
// sharded over 'model' is gathered once here rather than after the norm's
// six ops and a 4-byte all-reduce of the mean.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return shardflow::rms_norm(x, {x.shape().back()}, weight, eps);
}

// Rotates the interleaved pairs (x[2i], x[2i+1]) of the last dim of
// x [B,T,H,hd] by angle a_i: (x0 c - x1 s, x1 c + x0 s). With the tables
// laid out per element, cos = (c0, c0, c1, c1, ...) and sin = (-s0, s0, -s1,
// s1, ...) [T,1,hd], that is x * cos + swap(x) * sin, where swap exchanges
// the two of each pair: four ops, each over all of x.
Tensor rotary(const Tensor& x, const Tensor& cos_t, const Tensor& sin_t, const Tensor& pair_swap) {
  return x * cos_t + index_select(x, 3, pair_swap) * sin_t;
}

void lay_out(Tensor& t, const ShardingPlan& plan, const std::string& role) {
  t = mark_sharding(t, *plan.mesh, plan.param(role));
}

}  // namespace

Model::Model(Weights weights, std::optional<ShardingPlan> plan) : weights_(std::move(weights)), plan_(std::move(plan)) {
  const Config& c = weights_.config;
  c.validate();
  if (static_cast<int64_t>(weights_.layers.size()) != c.n_layers) {
    throw Error(fmt::format("LLaMA weights have {} layers but the config says {}", weights_.layers.size(), c.n_layers));
  }
  if (plan_) {
    plan_->check();
    ShardingPlan& p = *plan_;
    // A tied head shares the embedding's values but not its layout.
    if (weights_.output.impl() == weights_.tok_embeddings.impl() && p.param("output") != p.param("tok_embeddings")) {
      weights_.output = Tensor(weights_.tok_embeddings.value());
    }
    lay_out(weights_.tok_embeddings, p, "tok_embeddings");
    lay_out(weights_.norm, p, "norm");
    lay_out(weights_.output, p, "output");
    for (LayerWeights& l : weights_.layers) {
      lay_out(l.attention_norm, p, "attention_norm");
      lay_out(l.wq, p, "wq");
      lay_out(l.wk, p, "wk");
      lay_out(l.wv, p, "wv");
      lay_out(l.wo, p, "wo");
      lay_out(l.ffn_norm, p, "ffn_norm");
      lay_out(l.w1, p, "w1");
      lay_out(l.w2, p, "w2");
      lay_out(l.w3, p, "w3");
    }
  }
  // Rotary tables, angle(pos, i) = pos * theta^(-2i/hd), in double so that
  // long positions keep their precision; one entry per element of a head.
  const int64_t hd = c.head_dim();
  std::vector<float> cos_values(static_cast<std::size_t>(c.seq_len * hd));
  std::vector<float> sin_values(cos_values.size());
  for (int64_t pos = 0; pos < c.seq_len; ++pos) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double freq = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double angle = static_cast<double>(pos) * freq;
      const auto at = static_cast<std::size_t>(pos * hd + 2 * i);
      cos_values[at] = cos_values[at + 1] = static_cast<float>(std::cos(angle));
      sin_values[at] = -static_cast<float>(std::sin(angle));
      sin_values[at + 1] = static_cast<float>(std::sin(angle));
    }
  }
  rope_cos_ = Tensor::from_floats(cos_values, {c.seq_len, hd});
  rope_sin_ = Tensor::from_floats(sin_values, {c.seq_len, hd});
  std::vector<int64_t> swap(static_cast<std::size_t>(hd));
  for (int64_t i = 0; i < hd; ++i) swap[static_cast<std::size_t>(i)] = i ^ 1;
  rope_pair_swap_ = Tensor::from_ints(swap, {hd});
  auto body = [this](const std::vector<Tensor>& inputs) { return step(inputs); };
  // The step's ops depend only on its inputs' types and the model, so a
  // signature guard suffices (no symbolic re-run of the step per token).
  prefill_ = std::make_shared<CompiledFunction>(body, "llama_prefill", GuardMode::kSignature);
  decode_ = std::make_shared<CompiledFunction>(body, "llama_decode", GuardMode::kSignature);
  std::vector<std::size_t> caches(static_cast<std::size_t>(2 * c.n_layers));
  std::iota(caches.begin(), caches.end(), std::size_t{2});  // after tokens and positions
  prefill_->donate_inputs(caches);
  decode_->donate_inputs(caches);
}

Tensor Model::annotate(const Tensor& t, const std::string& role) const {
  if (!plan_) return t;
  const PartitionSpec* spec = plan_->activation(role);
  return spec ? mark_sharding(t, *plan_->mesh, *spec) : t;
}

KVCache Model::new_cache(int64_t batch) const {
  const Config& c = config();
  KVCache cache;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    cache.keys.push_back(annotate(zeros({batch, c.n_kv_heads, c.seq_len, c.head_dim()}), "kv_cache"));
    cache.values.push_back(annotate(zeros({batch, c.n_kv_heads, c.seq_len, c.head_dim()}), "kv_cache"));
  }
  return cache;
}

// inputs: tokens [B,T] i64, positions [T] i64, then each layer's key and
// value cache. outputs: logits of the last position [B,vocab], then the
// updated caches in the same order.
std::vector<Tensor> Model::step(const std::vector<Tensor>& inputs) const {
  const Config& c = config();
  const Tensor tokens = annotate(inputs.at(0), "tokens");
  const Tensor& positions = inputs.at(1);
  const int64_t batch = tokens.size(0), length = tokens.size(1), hd = c.head_dim();
  const int64_t group = c.n_heads / c.n_kv_heads;  // query heads per key/value head

  const Tensor cos_t = index_select(rope_cos_, 0, positions).unsqueeze(1);  // [T,1,hd]
  const Tensor sin_t = index_select(rope_sin_, 0, positions).unsqueeze(1);
  // Query t sees cache slot s when s <= positions[t]; the same mask serves
  // prefill (causal) and decode (everything written so far).
  Tensor visible = le(arange(c.seq_len).unsqueeze(0), positions.unsqueeze(1));  // [T,S]
  if (group > 1) visible = visible.unsqueeze(0).expand({group, length, c.seq_len}).reshape({group * length, c.seq_len});
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));

  std::vector<Tensor> outputs(1);
  Tensor x = embedding(weights_.tok_embeddings, tokens);  // [B,T,dim]
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = weights_.layers[static_cast<std::size_t>(l)];
    const Tensor h = rms_norm(x, w.attention_norm, c.norm_eps);
    Tensor q = rotary(linear(h, w.wq).reshape({batch, length, c.n_heads, hd}), cos_t, sin_t, rope_pair_swap_);
    Tensor k = rotary(linear(h, w.wk).reshape({batch, length, c.n_kv_heads, hd}), cos_t, sin_t, rope_pair_swap_);
    Tensor v = linear(h, w.wv).reshape({batch, length, c.n_kv_heads, hd});
    const std::size_t slot = 2 + 2 * static_cast<std::size_t>(l);
    const Tensor keys = annotate(index_copy(inputs.at(slot), 2, positions, k.transpose(1, 2)), "kv_cache");
    const Tensor values = annotate(index_copy(inputs.at(slot + 1), 2, positions, v.transpose(1, 2)), "kv_cache");
    // The queries of a key/value head's group become rows of one matrix, so
    // grouped-query attention reads each cached key once; the fused op reads
    // only the cache slots the mask shows (up to the position), not all
    // seq_len of them.
    q = q.transpose(1, 2).reshape({batch, c.n_kv_heads, group * length, hd});
    Tensor attention = scaled_dot_product_attention(q, keys, values, visible, false, scale);  // [B,KVH,G*T,hd]
    attention = attention.reshape({batch, c.n_heads, length, hd}).transpose(1, 2).reshape({batch, length, c.dim});
    x = x + linear(attention, w.wo);
    const Tensor g = rms_norm(x, w.ffn_norm, c.norm_eps);
    x = x + linear(silu(linear(g, w.w1)) * linear(g, w.w3), w.w2);
    x = annotate(x, "block_output");
    outputs.push_back(keys);
    outputs.push_back(values);
  }
  const Tensor last = rms_norm(x.select(1, length - 1), weights_.norm, c.norm_eps);  // [B,dim]
  outputs[0] = annotate(linear(last, weights_.output), "logits");
  return outputs;
}

Tensor Model::forward(const Tensor& tokens, int64_t start, KVCache& cache) {
  const Config& c = config();
  if (tokens.rank() != 2 || tokens.dtype() != DType::kI64) {
    throw Error(fmt::format("LLaMA forward: tokens must be i64[B,T], got {}", tokens.to_string()));
  }
  const int64_t length = tokens.size(1);
  if (length < 1 || start < 0 || start + length > c.seq_len) {
    throw Error(fmt::format("LLaMA forward: positions {}..{} do not fit the cache of {} positions (seq_len)", start,
                            start + length - 1, c.seq_len));
  }
  if (cache.keys.size() != static_cast<std::size_t>(c.n_layers) || cache.values.size() != cache.keys.size()) {
    throw Error("LLaMA forward: the KV cache was not made by this model's new_cache()");
  }
  std::vector<Tensor> inputs{tokens,
                             arange(static_cast<double>(start), static_cast<double>(start + length), 1, DType::kI64)};
  for (int64_t l = 0; l < c.n_layers; ++l) {  // moved: the step updates the caches in place (donated)
    inputs.push_back(std::move(cache.keys[static_cast<std::size_t>(l)]));
    inputs.push_back(std::move(cache.values[static_cast<std::size_t>(l)]));
  }
  std::vector<Tensor> outputs = (length == 1 ? decode_ : prefill_)->call(inputs);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    cache.keys[static_cast<std::size_t>(l)] = outputs[2 * static_cast<std::size_t>(l) + 1];
    cache.values[static_cast<std::size_t>(l)] = outputs[2 * static_cast<std::size_t>(l) + 2];
  }
  return outputs[0];
}

void Model::trace(int64_t batch, int64_t prompt_length) {
  const Config& c = config();
  std::vector<int64_t> lengths{prompt_length};
  if (prompt_length != 1) lengths.push_back(1);  // a one-token prompt runs the decode program
  for (int64_t length : lengths) {
    std::vector<Tensor> inputs{Tensor::meta(DType::kI64, {batch, length}), Tensor::meta(DType::kI64, {length})};
    const KVCache cache = new_cache(batch);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      inputs.push_back(cache.keys[static_cast<std::size_t>(l)]);
      inputs.push_back(cache.values[static_cast<std::size_t>(l)]);
    }
    (length == 1 ? decode_ : prefill_)->trace(inputs);
  }
}

CompileStats Model::prefill_stats() const { return prefill_->stats(); }
CompileStats Model::decode_stats() const { return decode_->stats(); }
std::string Model::decode_program_text() const { return decode_->program_text(); }
std::vector<ProgramCollective> Model::decode_collectives() const { return decode_->collectives(); }

void Model::set_profiles(std::shared_ptr<OpProfile> prefill, std::shared_ptr<OpProfile> decode) {
  prefill_->set_profile(std::move(prefill));
  decode_->set_profile(std::move(decode));
}

}  // namespace shardflow::llama
