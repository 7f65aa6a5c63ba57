// Helpers shared by the op kernels (private to ops/): result dtypes, loops
// over broadcast operands, and a vectorisable exp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <span>
#include <vector>

#include "shardflow/ir/op_def.h"
#include "shardflow/tensor/dense_tensor.h"

namespace shardflow::ops {

// PyTorch's result_type for tensor operands: dimensioned tensors decide,
// unless a 0-dim operand is of a higher category (bool < int < float).
DType result_type(std::span<const TensorType> operands);
// Tensor with a Python number (a Scalar argument).
DType result_type_with_scalar(DType tensor, const Constant& scalar);

// The types of a kernel's operands, for the infer/check functions that
// take TensorTypes.
std::vector<TensorType> types_of(std::span<const DenseTensor> tensors);

// The default float dtype, for integer inputs of float-valued ops.
inline DType float_type_for(DType dtype) { return is_floating(dtype) ? dtype : DType::kF32; }

// NaN test for any compute type (integers are never NaN).
template <class A>
bool is_nan(A value) {
  if constexpr (std::is_floating_point_v<A>) {
    return value != value;
  } else {
    return false;
  }
}

// Python's // on integers from C++'s truncating a / b (given as
// `truncated`): one less where the division is inexact and the signs
// differ. b is not 0; b == -1 divides exactly (and a % -1 could overflow).
template <class C>
C floored_from_truncated(C truncated, C a, C b) {
  return (b != -1 && a % b != 0 && (a < 0) != (b < 0)) ? static_cast<C>(truncated - 1) : truncated;
}

// Calls row(n, offsets, inner_strides) for every row of the broadcast
// output: `n` consecutive output elements; `offsets[i]` is the element offset
// of the row's first element in operand i; `inner_strides[i]` is 0 or 1.
// Operands with the output's shape collapse into a single row.
template <class RowFn>
void for_each_broadcast_row(std::span<const int64_t> out_shape, std::span<const Shape* const> operand_shapes,
                            RowFn&& row);

// A cast copy of `input` (the same tensor when the dtype matches).
DenseTensor cast(const DenseTensor& input, DType dtype);

// exp(x) in float with ~1 ulp error, written without library calls or
// branches so that loops over it vectorise.
inline float exp_approx(float input) {
  // Clamp into the range the scaling below handles; NaN computes on 0 and is
  // put back at the end.
  float x = input < -104.0f ? -104.0f : input;
  x = x > 88.7f ? 88.7f : x;
  x = input == input ? x : 0.0f;
  // n = round(x / ln 2): adding 1.5 * 2^23 rounds to an integer (|v| < 2^22).
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = std::fma(n, -0.693359375f, x);  // x - n * ln 2, in two parts
  const float s = std::fma(n, 2.12194440e-4f, r);
  // exp(s) on [-ln2/2, ln2/2]: degree-6 Taylor polynomial.
  float p = 1.0f / 720.0f;
  p = std::fma(p, s, 1.0f / 120.0f);
  p = std::fma(p, s, 1.0f / 24.0f);
  p = std::fma(p, s, 1.0f / 6.0f);
  p = std::fma(p, s, 0.5f);
  p = std::fma(p, s, 1.0f);
  p = std::fma(p, s, 1.0f);
  // Scale by 2^n in two steps so that n < -126 reaches the subnormals.
  const auto n_int = static_cast<int32_t>(n);
  const int32_t half = n_int >> 1;
  const float scale_a = std::bit_cast<float>((half + 127) << 23);
  const float scale_b = std::bit_cast<float>((n_int - half + 127) << 23);
  float result = p * scale_a * scale_b;
  result = input > 88.72f ? std::numeric_limits<float>::infinity() : result;
  return input == input ? result : input;
}

// ------------------------------------------------------------ implementation

template <class RowFn>
void for_each_broadcast_row(std::span<const int64_t> out_shape, std::span<const Shape* const> operand_shapes,
                            RowFn&& row) {
  const std::size_t count = operand_shapes.size();
  const int64_t total = numel(out_shape);
  if (total == 0) return;
  Dims offsets(count, 0);
  Dims inner(count, 1);
  bool all_same = true;
  for (const Shape* shape : operand_shapes) {
    all_same = all_same && std::equal(shape->begin(), shape->end(), out_shape.begin(), out_shape.end());
  }
  if (all_same || out_shape.empty()) {
    for (std::size_t i = 0; i < count; ++i) inner[i] = numel(*operand_shapes[i]) == 1 ? 0 : 1;
    row(total, offsets.data(), inner.data());
    return;
  }
  const std::size_t rank = out_shape.size();
  // Strides of each operand over the output's dims (0 where broadcast):
  // operand i's stride of dim d at strides[i * rank + d]. On the stack for
  // the usual few operands of rank <= 4 (a Dims of 8 or 12 would allocate).
  int64_t local_strides[16];
  Dims heap_strides;
  int64_t* strides = local_strides;
  if (count * rank > std::size(local_strides)) {
    heap_strides.resize(count * rank);
    strides = heap_strides.data();
  }
  std::fill_n(strides, count * rank, int64_t{0});
  for (std::size_t i = 0; i < count; ++i) {
    const Shape& shape = *operand_shapes[i];
    const Dims own = row_major_strides(shape);
    const std::size_t pad = rank - shape.size();
    for (std::size_t d = pad; d < rank; ++d) {
      strides[i * rank + d] = shape[d - pad] == 1 ? 0 : own[d - pad];
    }
  }
  // Merge output dims that every operand steps through as one (contiguous in
  // it, or broadcast over both), dropping dims of size 1, so rows are as long
  // as the layouts allow: [12,32,2] times [1,32,2] is 12 rows of 64, not 384
  // rows of 2. Merged dim k keeps its size in sizes[k] and its strides in
  // place of dim k's.
  Dims sizes(rank, 1);
  std::size_t merged = 0;
  for (std::size_t d = 0; d < rank; ++d) {
    if (out_shape[d] == 1) continue;
    bool joins = merged > 0;
    for (std::size_t i = 0; joins && i < count; ++i) {
      joins = strides[i * rank + merged - 1] == strides[i * rank + d] * out_shape[d];
    }
    const std::size_t k = joins ? merged - 1 : merged++;
    sizes[k] = joins ? sizes[k] * out_shape[d] : out_shape[d];
    for (std::size_t i = 0; i < count; ++i) strides[i * rank + k] = strides[i * rank + d];
  }
  if (merged == 0) {  // a single element
    for (std::size_t i = 0; i < count; ++i) inner[i] = 0;
    row(1, offsets.data(), inner.data());
    return;
  }
  for (std::size_t i = 0; i < count; ++i) inner[i] = strides[i * rank + merged - 1];
  const int64_t n = sizes[merged - 1];
  Dims index(merged, 0);
  for (int64_t done = 0; done < total; done += n) {
    row(n, offsets.data(), inner.data());
    for (std::size_t d = merged - 1; d-- > 0;) {
      ++index[d];
      for (std::size_t i = 0; i < count; ++i) offsets[i] += strides[i * rank + d];
      if (index[d] < sizes[d]) break;
      for (std::size_t i = 0; i < count; ++i) offsets[i] -= strides[i * rank + d] * sizes[d];
      index[d] = 0;
    }
  }
}

}  // namespace shardflow::ops
