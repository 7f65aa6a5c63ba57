#include "kernel_util.h"

namespace shardflow::ops {

static int category(DType dtype) {
  if (dtype == DType::kBool) return 0;
  return is_floating(dtype) ? 2 : 1;
}

std::vector<TensorType> types_of(std::span<const DenseTensor> tensors) {
  std::vector<TensorType> types;
  types.reserve(tensors.size());
  for (const DenseTensor& t : tensors) types.push_back({t.dtype(), t.shape()});
  return types;
}

DType result_type(std::span<const TensorType> operands) {
  std::optional<DType> dimensioned, zero_dim;
  for (const TensorType& type : operands) {
    std::optional<DType>& slot = type.rank() > 0 ? dimensioned : zero_dim;
    slot = slot ? promote_types(*slot, type.dtype) : type.dtype;
  }
  if (!dimensioned) return *zero_dim;
  if (!zero_dim || category(*zero_dim) <= category(*dimensioned)) return *dimensioned;
  return *zero_dim;
}

DType result_type_with_scalar(DType tensor, const Constant& scalar) {
  const bool is_float = scalar.kind() == Constant::Kind::kFloat;
  const bool is_bool = scalar.kind() == Constant::Kind::kBool;
  if (is_float && !is_floating(tensor)) return DType::kF32;
  if (!is_bool && !is_float && tensor == DType::kBool) return DType::kI64;
  return tensor;
}

DenseTensor cast(const DenseTensor& input, DType dtype) {
  if (input.dtype() == dtype) return input;
  DenseTensor out = DenseTensor::empty(dtype, input.shape());
  visit_dtype(input.dtype(), [&](auto in_tag) {
    using In = decltype(in_tag);
    visit_dtype(dtype, [&](auto out_tag) {
      using Out = decltype(out_tag);
      const In* src = input.data_as<In>();
      Out* dst = out.data_as<Out>();
      if constexpr (std::is_same_v<Out, float> && (std::is_same_v<In, BFloat16> || std::is_same_v<In, Float16>)) {
        to_floats(src, input.numel(), dst);
        return;
      }
      for (int64_t i = 0; i < input.numel(); ++i) {
        const auto value = load(src[i]);
        if constexpr (std::is_same_v<Out, bool>) {
          dst[i] = value != 0;
        } else {
          dst[i] = store<Out>(value);
        }
      }
    });
  });
  return out;
}

}  // namespace shardflow::ops
