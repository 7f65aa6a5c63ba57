// scaled_dot_product_attention: softmax(q k^T * scale + mask) v, as one op.
//
//   sdpa f32[B,H,L,E], f32[B,H,S,E], f32[B,H,S,Ev], mask bool[L,S] -> f32[B,H,L,Ev]
//
// Each query row looks only at the keys its mask lets it see: a key the mask
// hides (false, or -inf in a float mask) is never read. A decode step with a
// fixed-size KV cache then reads the cache up to the current position, not
// all of it.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "families.h"
#include "kernel_util.h"
#include "shardflow/base/error.h"
#include "shardflow/tensor/parallel.h"

namespace shardflow::ops {
namespace {

constexpr const char* kName = "scaled_dot_product_attention";

struct AttentionShapes {
  Shape batch;  // leading dims, shared by query, key, value and the result
  int64_t queries = 0, keys = 0, depth = 0, value_depth = 0;
};

AttentionShapes attention_shapes(const TensorType& q, const TensorType& k, const TensorType& v) {
  if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank()) {
    throw Error(fmt::format("{}: query, key and value need the same rank, at least 2 ([..., L, E], [..., S, E], "
                            "[..., S, Ev]), got {}, {} and {}",
                            kName, q.to_string(), k.to_string(), v.to_string()));
  }
  if (q.dtype != DType::kF32 || k.dtype != DType::kF32 || v.dtype != DType::kF32) {
    throw Error(fmt::format("{}: only float32 query, key and value are implemented, got {}, {} and {}", kName,
                            scalar_type_name(q.dtype), scalar_type_name(k.dtype), scalar_type_name(v.dtype)));
  }
  AttentionShapes s;
  s.batch = Shape(q.shape.begin(), q.shape.end() - 2);
  const Shape k_batch(k.shape.begin(), k.shape.end() - 2), v_batch(v.shape.begin(), v.shape.end() - 2);
  if (k_batch != s.batch || v_batch != s.batch) {
    throw Error(fmt::format("{}: query, key and value need the same batch dims, got {}, {} and {}", kName,
                            q.to_string(), k.to_string(), v.to_string()));
  }
  s.queries = q.shape[q.shape.size() - 2];
  s.depth = q.shape.back();
  s.keys = k.shape[k.shape.size() - 2];
  s.value_depth = v.shape.back();
  if (k.shape.back() != s.depth) {
    throw Error(fmt::format("{}: query and key need the same last dim (E), got {} and {}", kName, q.to_string(),
                            k.to_string()));
  }
  if (v.shape[v.shape.size() - 2] != s.keys) {
    throw Error(fmt::format("{}: key and value need the same number of rows (S), got {} and {}", kName,
                            k.to_string(), v.to_string()));
  }
  return s;
}

// The mask's dims, right-aligned with [batch..., L, S]; each is 1 or equal.
void check_mask(const TensorType& mask, const AttentionShapes& s, const TensorType& q) {
  if (mask.dtype != DType::kBool && mask.dtype != DType::kF32) {
    throw Error(fmt::format("{}: attn_mask must be bool or float32, got {}", kName, scalar_type_name(mask.dtype)));
  }
  Shape full = s.batch;
  full.push_back(s.queries);
  full.push_back(s.keys);
  bool fits = mask.rank() <= static_cast<int64_t>(full.size());
  for (std::size_t d = 0; fits && d < mask.shape.size(); ++d) {
    const int64_t want = full[full.size() - mask.shape.size() + d];
    fits = mask.shape[d] == 1 || mask.shape[d] == want;
  }
  if (!fits) {
    throw Error(fmt::format("{}: attn_mask {} does not broadcast to the attention weights {} (query {})", kName,
                            mask.to_string(), shape_to_string(full), q.to_string()));
  }
}

void check_options(const OpArgs& args, bool has_mask) {
  if (args.get_number("dropout_p") != 0) {
    throw Error(fmt::format("{}: dropout_p must be 0 (shardflow runs attention for inference), got {}", kName,
                            args.get_number("dropout_p")));
  }
  if (args.get_bool("is_causal") && has_mask) {
    throw Error(fmt::format("{}: an explicit attn_mask cannot be given with is_causal=True", kName));
  }
  if (args.get_bool("enable_gqa")) {
    throw Error(fmt::format("{}: enable_gqa=True is not implemented; give key and value as many heads as the "
                            "query, or fold each group of query heads into the query rows",
                            kName));
  }
}

// The shapes of a call, after every argument check.
AttentionShapes checked_shapes(const OpArgs& args, std::span<const TensorType> in) {
  const AttentionShapes s = attention_shapes(in[0], in[1], in[2]);
  const int mask = args.tensor("attn_mask");
  if (mask >= 0) check_mask(in[static_cast<std::size_t>(mask)], s, in[0]);
  check_options(args, mask >= 0);
  return s;
}

Shape result_shape(const AttentionShapes& s) {
  Shape out = s.batch;
  out.push_back(s.queries);
  out.push_back(s.value_depth);
  return out;
}

float dot(const float* a, const float* b, int64_t n) {
  float partial[8] = {};  // eight independent sums: the loop vectorises without reassociation
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int64_t j = 0; j < 8; ++j) partial[j] += a[i + j] * b[i + j];
  }
  float sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Rows this far ahead are requested while the current one is summed.
constexpr int64_t kPrefetchRows = 8;

void prefetch_row(const float* row, int64_t length) {
  for (int64_t i = 0; i < length; i += 16) __builtin_prefetch(row + i, 0, 3);  // one per 64-byte line
}

DenseTensor attention_kernel(const OpArgs& args, std::span<const DenseTensor> in) {
  const std::vector<TensorType> types = types_of(in);
  const AttentionShapes s = checked_shapes(args, types);
  const int mask_index = args.tensor("attn_mask");
  const DenseTensor* mask = mask_index < 0 ? nullptr : &in[static_cast<std::size_t>(mask_index)];
  const bool causal = args.get_bool("is_causal");
  const Constant& scale_arg = args.constant("scale");
  const double scale = scale_arg.is_none() ? 1.0 / std::sqrt(static_cast<double>(s.depth)) : args.get_number("scale");

  // Strides of the mask over [batch..., L, S]; 0 where it broadcasts.
  std::vector<int64_t> mask_strides(s.batch.size() + 2, 0);
  if (mask != nullptr) {
    const Shape& own = mask->shape();
    int64_t stride = 1;
    for (std::size_t d = own.size(); d-- > 0;) {
      if (own[d] != 1) mask_strides[mask_strides.size() - own.size() + d] = stride;
      stride *= own[d];
    }
  }
  const int64_t batches = numel(s.batch);
  DenseTensor out = DenseTensor::empty(DType::kF32, result_shape(s));
  const float* q = in[0].data_as<float>();
  const float* k = in[1].data_as<float>();
  const float* v = in[2].data_as<float>();
  float* o = out.data_as<float>();
  const int64_t key_stride = mask_strides.back();
  // One query row of one batch entry; rows are independent, so they split
  // over the kernel threads with the same bits for any split.
  const auto attend_rows = [&](int64_t row_begin, int64_t row_end) {
    std::vector<float> weights(static_cast<std::size_t>(s.keys));
    std::vector<int64_t> seen(static_cast<std::size_t>(s.keys));
    for (int64_t row = row_begin; row < row_end; ++row) {
      const int64_t b = row / s.queries, l = row % s.queries;
      int64_t mask_row = l * mask_strides[mask_strides.size() - 2];
      for (int64_t rest = b, d = static_cast<int64_t>(s.batch.size()); d-- > 0;) {
        mask_row += (rest % s.batch[static_cast<std::size_t>(d)]) * mask_strides[static_cast<std::size_t>(d)];
        rest /= s.batch[static_cast<std::size_t>(d)];
      }
      const float* kb = k + b * s.keys * s.depth;
      const float* vb = v + b * s.keys * s.value_depth;
      const float* qrow = q + row * s.depth;
      float* orow = o + row * s.value_depth;
      // Scores of the visible keys only.
      int64_t count = 0;
      float top = -std::numeric_limits<float>::infinity();
      const int64_t key_end = causal ? std::min(s.keys, l + 1) : s.keys;
      // A bool mask along contiguous keys is skipped eight hidden keys at a
      // time: a decode step's mask hides the whole unwritten cache.
      const bool* bool_row =
          mask != nullptr && mask->dtype() == DType::kBool && key_stride == 1 ? mask->data_as<bool>() + mask_row : nullptr;
      for (int64_t key = 0; key < key_end; ++key) {
        if (bool_row != nullptr && key + 8 <= key_end) {
          uint64_t eight = 0;
          std::memcpy(&eight, bool_row + key, sizeof eight);
          if (eight == 0) {
            key += 7;
            continue;
          }
        }
        float bias = 0;
        if (mask != nullptr) {
          const int64_t at = mask_row + key * key_stride;
          if (mask->dtype() == DType::kBool) {
            if (!mask->data_as<bool>()[at]) continue;
          } else {
            bias = mask->data_as<float>()[at];
            if (bias == -std::numeric_limits<float>::infinity()) continue;
          }
        }
        // The cache is cold in a decode step (the weights streamed through
        // since), and the dot below is too short a dependent chain to keep
        // loads in flight: fetch the key rows a few ahead, and this key's
        // value row for the pass after.
        if (key + kPrefetchRows < key_end) prefetch_row(kb + (key + kPrefetchRows) * s.depth, s.depth);
        prefetch_row(vb + key * s.value_depth, s.value_depth);
        const float score = static_cast<float>(dot(qrow, kb + key * s.depth, s.depth) * scale) + bias;
        seen[static_cast<std::size_t>(count)] = key;
        weights[static_cast<std::size_t>(count)] = score;
        top = std::max(top, score);
        ++count;
      }
      if (count == 0) {  // every key hidden: softmax over nothing, as in PyTorch
        std::fill(orow, orow + s.value_depth, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      float total = 0;
      for (int64_t i = 0; i < count; ++i) {
        weights[static_cast<std::size_t>(i)] = std::exp(weights[static_cast<std::size_t>(i)] - top);
        total += weights[static_cast<std::size_t>(i)];
      }
      std::fill(orow, orow + s.value_depth, 0.0f);
      for (int64_t i = 0; i < count; ++i) {
        const float p = weights[static_cast<std::size_t>(i)] / total;
        const float* vrow = vb + seen[static_cast<std::size_t>(i)] * s.value_depth;
        for (int64_t e = 0; e < s.value_depth; ++e) orow[e] += p * vrow[e];
      }
    }
  };
  // A part should read some tens of KiB of keys and values to pay for a thread.
  const int64_t row_bytes = 4 * std::max<int64_t>(s.keys * (s.depth + s.value_depth), 1);
  parallel_for(batches * s.queries, std::max<int64_t>(1, (64 << 10) / row_bytes), 1, attend_rows);
  return out;
}

// Batch dims and the query rows pass through; the keys (S) and the depth
// (E) are needed whole: softmax normalises over all keys, so partial sums
// over either would not combine. Ev passes from the value to the result.
OpShardingRule attention_rule(const OpArgs& args, std::span<const TensorType> in,
                              std::span<const TensorType> out) {
  RuleBuilder builder(in, out);
  const int mask = args.tensor("attn_mask");
  const int rank = static_cast<int>(in[0].rank());
  // The mask dim aligned with dim d of [batch..., L, S], unless absent or broadcast.
  const auto mask_dim = [&](int d) {
    if (mask < 0) return -1;
    const Shape& own = in[static_cast<std::size_t>(mask)].shape;
    const int dim = d - (rank - static_cast<int>(own.size()));
    return dim >= 0 && own[static_cast<std::size_t>(dim)] != 1 ? dim : -1;
  };
  const auto dims = [&](int q, int k, int v, int full_dim) {
    std::vector<int> operand_dims = {q, k, v};
    if (mask >= 0) operand_dims.push_back(full_dim < 0 ? -1 : mask_dim(full_dim));
    return operand_dims;
  };
  for (int d = 0; d < rank - 2; ++d) builder.add_factor(dims(d, d, d, d), {d}, in[0].shape[static_cast<std::size_t>(d)]);
  builder.add_factor(dims(rank - 2, -1, -1, rank - 2), {rank - 2}, in[0].shape[static_cast<std::size_t>(rank - 2)]);
  builder.add_factor(dims(-1, rank - 2, rank - 2, rank - 1), {-1}, in[1].shape[static_cast<std::size_t>(rank - 2)],
                     FactorKind::kNeedReplication);
  builder.add_factor(dims(rank - 1, rank - 1, -1, -1), {-1}, in[0].shape.back(), FactorKind::kNeedReplication);
  builder.add_factor(dims(-1, -1, rank - 1, -1), {rank - 1}, in[2].shape.back());
  return builder.build();
}

}  // namespace

void register_attention_ops(OpRegistry& registry) {
  OpDef def;
  def.family = OpFamily::kContraction;
  def.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    return std::vector<TensorType>{TensorType{in[0].dtype, result_shape(checked_shapes(args, in))}};
  };
  def.sharding_rule = attention_rule;
  def.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    return std::vector<DenseTensor>{attention_kernel(args, in)};
  };
  registry.add("aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
               "float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor",
               std::move(def));
}

}  // namespace shardflow::ops
