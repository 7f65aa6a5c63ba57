// rms_norm: x / sqrt(mean(x^2 over the normalised dims) + eps) * weight, as
// one op (torch.nn.functional.rms_norm).
//
//   rms_norm f32[..., N...], normalized_shape [N...], weight f32[N...] -> f32[..., N...]
//
// Written as mul, mean, add, rsqrt, mul, mul it is six ops per norm; a decode
// step of a small model spends much of its time per op, not per element.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "families.h"
#include "kernel_util.h"
#include "shardflow/base/error.h"

namespace shardflow::ops {
namespace {

constexpr const char* kName = "rms_norm";

struct NormShape {
  int64_t rows = 1, width = 1;  // rows of the leading dims, elements of the normalised ones
  int64_t normalized_rank = 0;
  double eps = 0;
};

NormShape checked_shape(const OpArgs& args, std::span<const TensorType> in) {
  const TensorType& x = in[0];
  if (x.dtype != DType::kF32) {
    throw Error(fmt::format("{}: only float32 input is implemented, got {}", kName, scalar_type_name(x.dtype)));
  }
  const std::vector<int64_t> normalized = args.get_int_list("normalized_shape");
  const auto rank = static_cast<int64_t>(normalized.size());
  bool fits = rank <= x.rank();
  for (int64_t d = 0; fits && d < rank; ++d) {
    fits = normalized[static_cast<std::size_t>(d)] == x.shape[static_cast<std::size_t>(x.rank() - rank + d)];
  }
  if (!fits) {
    throw Error(fmt::format("{}: normalized_shape {} must be the last dims of the input {}", kName,
                            shape_to_string(normalized), x.to_string()));
  }
  const int weight = args.tensor("weight");
  if (weight >= 0) {
    const TensorType& w = in[static_cast<std::size_t>(weight)];
    if (w.shape != Shape(normalized.begin(), normalized.end()) || w.dtype != DType::kF32) {
      throw Error(fmt::format("{}: weight must be f32{}, the normalized_shape, got {}", kName,
                              shape_to_string(normalized), w.to_string()));
    }
  }
  NormShape s;
  s.normalized_rank = rank;
  for (int64_t d = 0; d < x.rank(); ++d)
    (d < x.rank() - rank ? s.rows : s.width) *= x.shape[static_cast<std::size_t>(d)];
  // As PyTorch: eps defaults to the dtype's machine epsilon.
  const Constant& eps = args.constant("eps");
  s.eps = eps.is_none() ? std::numeric_limits<float>::epsilon() : args.get_number("eps");
  return s;
}

DenseTensor rms_norm_kernel(const OpArgs& args, std::span<const DenseTensor> in) {
  const std::vector<TensorType> types = types_of(in);
  const NormShape s = checked_shape(args, types);
  const int weight_index = args.tensor("weight");
  const float* w = weight_index < 0 ? nullptr : in[static_cast<std::size_t>(weight_index)].data_as<float>();
  DenseTensor out = DenseTensor::empty(DType::kF32, in[0].shape());
  const float* x = in[0].data_as<float>();
  float* y = out.data_as<float>();
  for (int64_t r = 0; r < s.rows; ++r) {
    const float* row = x + r * s.width;
    float* result = y + r * s.width;
    double squares = 0;  // summed in double, as the mean op sums
    for (int64_t i = 0; i < s.width; ++i) squares += static_cast<double>(row[i]) * row[i];
    const auto mean_square = static_cast<float>(squares / static_cast<double>(s.width));
    const float scale = 1.0f / std::sqrt(mean_square + static_cast<float>(s.eps));
    for (int64_t i = 0; i < s.width; ++i) result[i] = w ? row[i] * scale * w[i] : row[i] * scale;
  }
  return out;
}

// The leading dims pass through; each normalised dim is needed whole (the
// mean runs over all of it) and is shared with the weight.
OpShardingRule rms_norm_rule(const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
  const NormShape s = checked_shape(args, in);
  RuleBuilder builder(in, out);
  const int rank = static_cast<int>(in[0].rank());
  const int weight = args.tensor("weight");
  for (int d = 0; d < rank; ++d) {
    const bool normalized = d >= rank - s.normalized_rank;
    std::vector<int> operand_dims{d};
    if (weight >= 0) operand_dims.push_back(normalized ? d - (rank - static_cast<int>(s.normalized_rank)) : -1);
    builder.add_factor(operand_dims, {d}, in[0].shape[static_cast<std::size_t>(d)],
                       normalized ? FactorKind::kNeedReplication : FactorKind::kPassThrough);
  }
  return builder.build();
}

}  // namespace

void register_normalization_ops(OpRegistry& registry) {
  OpDef def;
  def.family = OpFamily::kReduction;
  def.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    checked_shape(args, in);
    return std::vector<TensorType>{in[0]};
  };
  def.sharding_rule = rms_norm_rule;
  def.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    return std::vector<DenseTensor>{rms_norm_kernel(args, in)};
  };
  registry.add("aten::rms_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor",
               std::move(def));
}

}  // namespace shardflow::ops
