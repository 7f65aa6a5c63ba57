// scaled_dot_product_attention: softmax(q k^T * scale + mask) v, as one op.
//
//   sdpa f32[B,H,L,E], f32[B,H,S,E], f32[B,H,S,Ev], mask bool[L,S] -> f32[B,H,L,Ev]
//
// (bf16 and f16 too: computed in f32, see attention_kernel.)
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
    throw Error(
        fmt::format("{}: query, key and value need the same rank, at least 2 ([..., L, E], [..., S, E], "
                    "[..., S, Ev]), got {}, {} and {}",
                    kName, q.to_string(), k.to_string(), v.to_string()));
  }
  if (k.dtype != q.dtype || v.dtype != q.dtype) {
    throw Error(
        fmt::format("{}: Expected query, key, and value to have the same dtype, but got query.dtype: {} "
                    "key.dtype: {} and value.dtype: {} instead.",
                    kName, scalar_type_name(q.dtype), scalar_type_name(k.dtype), scalar_type_name(v.dtype)));
  }
  if (!is_floating(q.dtype)) {
    throw Error(fmt::format("{}: query, key and value must be float32, bfloat16 or float16, got {}", kName,
                            scalar_type_name(q.dtype)));
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
    throw Error(fmt::format("{}: key and value need the same number of rows (S), got {} and {}", kName, k.to_string(),
                            v.to_string()));
  }
  return s;
}

// The mask's dims, right-aligned with [batch..., L, S]; each is 1 or equal.
void check_mask(const TensorType& mask, const AttentionShapes& s, const TensorType& q) {
  if (mask.dtype != DType::kBool && mask.dtype != DType::kF32 && mask.dtype != q.dtype) {
    throw Error(fmt::format("{}: attn_mask must be bool, float32 or the query's dtype ({}), got {}", kName,
                            scalar_type_name(q.dtype), scalar_type_name(mask.dtype)));
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
    throw Error(
        fmt::format("{}: enable_gqa=True is not implemented; give key and value as many heads as the "
                    "query, or fold each group of query heads into the query rows",
                    kName));
  }
}

// The shapes of a call, after every argument check.
AttentionShapes checked_shapes(const OpArgs& args, std::span<const TensorType> in) {
  const int mask = args.tensor("attn_mask");
  // Options first: enable_gqa's head counts would fail the shape checks
  // with a message that hides the option.
  check_options(args, mask >= 0);
  const AttentionShapes s = attention_shapes(in[0], in[1], in[2]);
  if (mask >= 0) check_mask(in[static_cast<std::size_t>(mask)], s, in[0]);
  return s;
}

Shape result_shape(const AttentionShapes& s) {
  Shape out = s.batch;
  out.push_back(s.queries);
  out.push_back(s.value_depth);
  return out;
}

// Eight floats in one vector (GCC's vector extension, compiled to the
// machine's SIMD): a query row's partial sums stay in registers.
using Floats8 = float __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

// Without AVX GCC notes that passing such vectors by value has another ABI;
// every function that does is internal to this file (up to the end of
// attention_kernel), so no caller can disagree.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

Floats8 load8(const float* p) {
  Floats8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store8(float* p, Floats8 v) { std::memcpy(p, &v, sizeof v); }
float lane_sum(Floats8 v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

// Lanes 2i and 2i + 1 of a summed, then of b, within each 128-bit half (as
// AVX's hadd pairs them).
Floats8 pair_sums(Floats8 a, Floats8 b) {
  return __builtin_shufflevector(a, b, 0, 2, 8, 10, 4, 6, 12, 14) +
         __builtin_shufflevector(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
}

// {lane_sum(v[0]), ..., lane_sum(v[7])}: the same additions in the same
// order, in a few shuffles rather than each vector's lanes one by one.
Floats8 lane_sums(const Floats8* v) {
  const Floats8 first = pair_sums(pair_sums(v[0], v[1]), pair_sums(v[2], v[3]));  // both halves' sums of v[0..3]
  const Floats8 last = pair_sums(pair_sums(v[4], v[5]), pair_sums(v[6], v[7]));
  return __builtin_shufflevector(first, last, 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(first, last, 4, 5, 6, 7, 12, 13, 14, 15);
}

// Keys are scored this many at a time, and the next block's key rows are
// requested meanwhile: a decode step finds the KV cache outside L1 and L2
// (the weights streamed through since), and a dot this short leaves too few
// loads in flight on its own. The value rows are left to the hardware's
// prefetcher, which follows the weighted sum's sequential reads: requesting
// them beside the keys read slower (AMD EPYC Zen 3, stories110M, one thread).
constexpr int64_t kKeyBlock = 8;

// Each query row reads two streams, its keys and then its values, each a
// head's few KiB to few hundred KiB. The next row's first lines are
// requested before this row is read, so they are on their way when it
// starts (README, decode kernels, for the numbers).
constexpr int64_t kNextRowLines = 32;

void prefetch_row(const float* row, int64_t length) {
  for (int64_t i = 0; i < length; i += 16) __builtin_prefetch(row + i, 0, 3);  // one per 64-byte line
}

// scores[j] = q . rows[j] for kRows key rows read side by side, so the
// independent sums keep the loads in flight; each sum is the same bits
// whatever block it is in.
template <int kRows>
void dot_rows(const float* q, const float* const* rows, int64_t depth, float* scores) {
  Floats8 acc[kRows] = {};
  int64_t e = 0;
  for (; e + kLanes <= depth; e += kLanes) {
    const Floats8 qv = load8(q + e);
    for (int j = 0; j < kRows; ++j) acc[j] += qv * load8(rows[j] + e);
  }
  if constexpr (kRows == kLanes) {
    store8(scores, lane_sums(acc));
  } else {
    for (int j = 0; j < kRows; ++j) scores[j] = lane_sum(acc[j]);
  }
  for (int j = 0; j < kRows; ++j) {
    for (int64_t t = e; t < depth; ++t) scores[j] += q[t] * rows[j][t];
  }
}

// out[offset, offset + 8 kVectors) = sum_i p[i] * value row keys[i] over
// the same columns, the sums held in registers across all keys.
template <int kVectors>
void weighted_rows(const float* p, const int64_t* keys, int64_t count, const float* values, int64_t value_depth,
                   int64_t offset, float* out) {
  Floats8 acc[kVectors] = {};
  for (int64_t i = 0; i < count; ++i) {
    const Floats8 weight = Floats8{} + p[i];
    const float* row = values + keys[i] * value_depth + offset;
    for (int v = 0; v < kVectors; ++v) acc[v] += weight * load8(row + v * kLanes);
  }
  for (int v = 0; v < kVectors; ++v) store8(out + offset + v * kLanes, acc[v]);
}

// Eight bool mask bytes as one word: 0 when all hide their keys, kEightShown when all show them.
uint64_t eight_bools(const bool* row) {
  uint64_t eight = 0;
  std::memcpy(&eight, row, sizeof eight);
  return eight;
}
constexpr uint64_t kEightShown = 0x0101010101010101;

// Whether a mask hides all eight keys from `row` on (false, or -inf).
bool eight_hidden(const bool* row) { return eight_bools(row) == 0; }
bool eight_hidden(const float* row) {
  bool hidden = true;
  for (int i = 0; i < 8; ++i) hidden &= row[i] == -std::numeric_limits<float>::infinity();
  return hidden;
}

// out = sum_i p[i] * value row keys[i], 64 columns at a time, then the
// whole vectors left, then the last columns one by one.
void weighted_sum(const float* p, const int64_t* keys, int64_t count, const float* values, int64_t value_depth,
                  float* out) {
  int64_t e = 0;
  for (; e + 8 * kLanes <= value_depth; e += 8 * kLanes) weighted_rows<8>(p, keys, count, values, value_depth, e, out);
  switch ((value_depth - e) / kLanes) {
    case 7:
      weighted_rows<7>(p, keys, count, values, value_depth, e, out);
      break;
    case 6:
      weighted_rows<6>(p, keys, count, values, value_depth, e, out);
      break;
    case 5:
      weighted_rows<5>(p, keys, count, values, value_depth, e, out);
      break;
    case 4:
      weighted_rows<4>(p, keys, count, values, value_depth, e, out);
      break;
    case 3:
      weighted_rows<3>(p, keys, count, values, value_depth, e, out);
      break;
    case 2:
      weighted_rows<2>(p, keys, count, values, value_depth, e, out);
      break;
    case 1:
      weighted_rows<1>(p, keys, count, values, value_depth, e, out);
      break;
    default:
      break;
  }
  e += (value_depth - e) / kLanes * kLanes;
  for (; e < value_depth; ++e) {
    float sum = 0;
    for (int64_t i = 0; i < count; ++i) sum += p[i] * values[keys[i] * value_depth + e];
    out[e] = sum;
  }
}

DenseTensor attention_f32(const OpArgs& args, std::span<const DenseTensor> in) {
  const std::vector<TensorType> types = types_of(in);
  const AttentionShapes s = checked_shapes(args, types);
  const int mask_index = args.tensor("attn_mask");
  const DenseTensor* mask = mask_index < 0 ? nullptr : &in[static_cast<std::size_t>(mask_index)];
  const bool causal = args.get_bool("is_causal");
  const Constant& scale_arg = args.constant("scale");
  const double scale = scale_arg.is_none() ? 1.0 / std::sqrt(static_cast<double>(s.depth)) : args.get_number("scale");

  // Strides of the mask over [batch..., L, S]; 0 where it broadcasts.
  Dims mask_strides(s.batch.size() + 2, 0);
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
    // Per visible key: its score, then exp(score - top), then its softmax weight.
    std::vector<float> p(static_cast<std::size_t>(s.keys)), biases;
    if (mask != nullptr && mask->dtype() == DType::kF32) biases.resize(static_cast<std::size_t>(s.keys));
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
      if (row + 1 < row_end && (row + 1) % s.queries == 0) {  // the next row reads another batch entry's cache
        prefetch_row(kb + s.keys * s.depth, std::min(16 * kNextRowLines, s.keys * s.depth));
        prefetch_row(vb + s.keys * s.value_depth, std::min(16 * kNextRowLines, s.keys * s.value_depth));
      }
      float* orow = o + row * s.value_depth;
      // The visible keys (and their float-mask biases) first.
      int64_t count = 0;
      const int64_t key_end = causal ? std::min(s.keys, l + 1) : s.keys;
      // A mask along contiguous keys is skipped eight hidden keys at a time:
      // a decode step's mask hides the whole unwritten cache.
      const bool contiguous = mask != nullptr && key_stride == 1;
      const bool* bool_row = contiguous && mask->dtype() == DType::kBool ? mask->data_as<bool>() + mask_row : nullptr;
      const float* float_row = contiguous && mask->dtype() == DType::kF32 ? mask->data_as<float>() + mask_row : nullptr;
      for (int64_t key = 0; key < key_end; ++key) {
        if (bool_row != nullptr && key + 8 <= key_end && eight_bools(bool_row + key) == kEightShown) {
          for (int64_t j = 0; j < 8; ++j) seen[static_cast<std::size_t>(count++)] = key + j;
          key += 7;
          continue;
        }
        if (key + 8 <= key_end && ((bool_row != nullptr && eight_hidden(bool_row + key)) ||
                                   (float_row != nullptr && eight_hidden(float_row + key)))) {
          key += 7;
          continue;
        }
        if (mask != nullptr) {
          const int64_t at = mask_row + key * key_stride;
          if (mask->dtype() == DType::kBool) {
            if (!mask->data_as<bool>()[at]) continue;
          } else {
            const float bias = mask->data_as<float>()[at];
            if (bias == -std::numeric_limits<float>::infinity()) continue;
            biases[static_cast<std::size_t>(count)] = bias;
          }
        }
        seen[static_cast<std::size_t>(count++)] = key;
      }
      if (count == 0) {  // every key hidden: softmax over nothing, as in PyTorch
        std::fill(orow, orow + s.value_depth, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      // Scores, a block of keys at a time; the value rows are requested
      // here too, for the weighted sum after.
      const auto key_row = [&](int64_t i) { return kb + seen[static_cast<std::size_t>(i)] * s.depth; };
      for (int64_t j = 0; j < std::min(kKeyBlock, count); ++j) prefetch_row(key_row(j), s.depth);
      int64_t i = 0;
      for (; i + kKeyBlock <= count; i += kKeyBlock) {
        const float* rows[kKeyBlock];
        for (int64_t j = 0; j < kKeyBlock; ++j) {
          rows[j] = key_row(i + j);
          if (i + kKeyBlock + j < count) prefetch_row(key_row(i + kKeyBlock + j), s.depth);
        }
        dot_rows<kKeyBlock>(qrow, rows, s.depth, p.data() + i);
      }
      for (; i < count; ++i) {
        const float* key = key_row(i);
        dot_rows<1>(qrow, &key, s.depth, p.data() + i);
      }
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < count; ++j) {
        float& score = p[static_cast<std::size_t>(j)];
        score = static_cast<float>(score * scale) + (biases.empty() ? 0.0f : biases[static_cast<std::size_t>(j)]);
        top = std::max(top, score);
      }
      // Softmax: exp_approx vectorises; the sum runs as eight lanes, then
      // the lanes and the last few, in a fixed order.
      for (int64_t j = 0; j < count; ++j) {
        p[static_cast<std::size_t>(j)] = exp_approx(p[static_cast<std::size_t>(j)] - top);
      }
      Floats8 lanes{};
      int64_t j = 0;
      for (; j + kLanes <= count; j += kLanes) lanes += load8(p.data() + j);
      float total = lane_sum(lanes);
      for (; j < count; ++j) total += p[static_cast<std::size_t>(j)];
      for (j = 0; j < count; ++j) p[static_cast<std::size_t>(j)] /= total;
      weighted_sum(p.data(), seen.data(), count, vb, s.value_depth, orow);
    }
  };
  // A part should read some tens of KiB of keys and values to pay for a thread.
  const int64_t row_bytes = 4 * std::max<int64_t>(s.keys * (s.depth + s.value_depth), 1);
  parallel_for(batches * s.queries, std::max<int64_t>(1, (64 << 10) / row_bytes), 1, attend_rows);
  return out;
}
#pragma GCC diagnostic pop

// Batch dims and the query rows pass through; the keys (S) and the depth
// (E) are needed whole: softmax normalises over all keys, so partial sums
// over either would not combine. Ev passes from the value to the result.
OpShardingRule attention_rule(const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
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
  for (int d = 0; d < rank - 2; ++d)
    builder.add_factor(dims(d, d, d, d), {d}, in[0].shape[static_cast<std::size_t>(d)]);
  // Query rows may be split, except under is_causal: the kernel cuts a row's
  // keys off at its index within the shard, not in the whole sequence. (An
  // explicit mask is split with the rows and stays right.)
  builder.add_factor(dims(rank - 2, -1, -1, rank - 2), {rank - 2}, in[0].shape[static_cast<std::size_t>(rank - 2)],
                     args.get_bool("is_causal") ? FactorKind::kNeedReplication : FactorKind::kPassThrough);
  builder.add_factor(dims(-1, rank - 2, rank - 2, rank - 1), {-1}, in[1].shape[static_cast<std::size_t>(rank - 2)],
                     FactorKind::kNeedReplication);
  builder.add_factor(dims(rank - 1, rank - 1, -1, -1), {-1}, in[0].shape.back(), FactorKind::kNeedReplication);
  builder.add_factor(dims(-1, -1, rank - 1, -1), {rank - 1}, in[2].shape.back());
  return builder.build();
}

// bf16 and f16 attend in f32 (scores, softmax and sums), rounded to the
// query's dtype once at the end, as PyTorch's CPU kernels accumulate in
// float. Every input is converted whole first, hidden keys included.
DenseTensor attention_kernel(const OpArgs& args, std::span<const DenseTensor> in) {
  const DType dtype = in[0].dtype();
  if (dtype == DType::kF32) return attention_f32(args, in);
  std::vector<DenseTensor> widened(in.begin(), in.end());
  for (DenseTensor& t : widened) {
    if (t.dtype() == dtype) t = cast(t, DType::kF32);
  }
  return cast(attention_f32(args, widened), dtype);
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
  registry.add(
      "aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
      "float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor",
      std::move(def));
}

}  // namespace shardflow::ops
