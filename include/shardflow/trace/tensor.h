// The user-facing tensor: a handle with value semantics for reading (copies
// share the same tensor) whose ops run immediately (eager) or are recorded
// when called inside a function being compiled (see compile.h).
//
//   sf::Tensor x = sf::randn({4, 8}, /*seed=*/0);
//   sf::Tensor y = sf::silu(x.matmul(w) + b);
//   std::vector<float> values = y.to_floats();
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "shardflow/ir/constant.h"
#include "shardflow/ir/types.h"
#include "shardflow/sharding/shard_layout.h"
#include "shardflow/sharding/sharding.h"
#include "shardflow/tensor/dense_tensor.h"

namespace shardflow {

struct TensorImpl;

// One device's piece of an eagerly sharded tensor (sharding-semantics §3):
// its global slices, replica id, and the padded data it holds.
struct LocalShard {
  int64_t device = 0;
  int64_t replica_id = 0;
  std::vector<DimSlice> slices;  // unpadded, global coordinates
  bool whole = false;            // the device holds the whole tensor
  DenseTensor data;              // padded to the shard shape
};

class Tensor {
 public:
  Tensor() = default;  // undefined
  // Wraps a concrete value.
  explicit Tensor(DenseTensor value);
  // A shape-only tensor (like PyTorch's meta device): ops on it infer shapes
  // and dtypes but compute nothing; compile() can trace with it.
  static Tensor meta(DType dtype, Shape shape);
  static Tensor from_floats(std::span<const float> values, Shape shape);
  static Tensor from_ints(std::span<const int64_t> values, Shape shape, DType dtype = DType::kI64);
  static Tensor scalar(double value, DType dtype = DType::kF32);
  // A tensor laid out across devices: one padded shard per device of
  // shard_layout(sharding, shape), in that order (as the SPMD runtime
  // returns results).
  static Tensor from_shards(DType dtype, Shape shape, const Sharding& sharding, std::vector<DenseTensor> shards);

  bool defined() const { return impl_ != nullptr; }
  const TensorType& type() const;
  DType dtype() const { return type().dtype; }
  const Shape& shape() const { return type().shape; }
  int64_t rank() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t dim) const;
  int64_t numel() const;
  bool is_meta() const;
  // True while tracing for a tensor whose values depend on the traced inputs.
  bool is_traced() const;

  // The value (gathered from the devices when sharded). Errors for meta and
  // traced tensors say why there is no value.
  DenseTensor value() const;
  std::vector<float> to_floats() const;
  std::vector<int64_t> to_ints() const;  // Python's tolist() for integer tensors
  double item() const;                   // one element
  // Readable: "Tensor(f32[2,3], [[1, 2, 3], [4, 5, 6]])" (values abbreviated).
  std::string to_string() const;

  // The eager sharding laid out by mark_sharding, if any.
  std::optional<Sharding> sharding() const;
  // The XLA V1 string of the sharding ("" when not sharded), like
  // torch_xla._XLAC._get_xla_sharding_spec.
  std::string sharding_spec() const;
  // One entry per device, ordered by device id (replicated: every device
  // holds the whole tensor and its replica id is its device id).
  std::vector<LocalShard> local_shards() const;
  // Whether the values lie in the row-major memory starting at `memory`:
  // held whole there, or each device's shard at its run of it (see
  // contiguous_shard_offsets). The torch bridge checks with it that a
  // program fed views of a cache's memory wrote the cache there.
  bool lies_in(const std::byte* memory) const;

  // Common ops as methods (the free functions in ops.h are the same ops).
  Tensor matmul(const Tensor& other) const;
  Tensor reshape(Shape shape) const;
  Tensor view(Shape shape) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor permute(std::vector<int64_t> dims) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor expand(Shape size) const;
  Tensor slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor sum(std::vector<int64_t> dims, bool keepdim = false) const;
  Tensor mean(std::vector<int64_t> dims, bool keepdim = false) const;
  Tensor amax(std::vector<int64_t> dims, bool keepdim = false) const;
  Tensor argmax(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor softmax(int64_t dim) const;
  Tensor to(DType dtype) const;
  Tensor pow(double exponent) const;

  // The implementation object (for the tracer and runtime; not user API).
  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<TensorImpl> impl_;
};

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);

// Tensor with a number: the scalar forms of the ops (aten::add.Scalar, ...).
// Integers stay integers (int tensor * 2 is an int tensor), as in PyTorch.
Tensor scalar_op(const char* op, const Tensor& a, const Constant& b);
template <class N>
requires std::is_arithmetic_v<N> Constant number_constant(N value) {
  if constexpr (std::is_same_v<N, bool>)
    return Constant(value);
  else if constexpr (std::is_integral_v<N>)
    return Constant(static_cast<int64_t>(value));
  else
    return Constant(static_cast<double>(value));
}
template <class N>
requires std::is_arithmetic_v<N> Tensor operator+(const Tensor& a, N b) {
  return scalar_op("aten::add.Scalar", a, number_constant(b));
}
template <class N>
requires std::is_arithmetic_v<N> Tensor operator-(const Tensor& a, N b) {
  return scalar_op("aten::sub.Scalar", a, number_constant(b));
}
template <class N>
requires std::is_arithmetic_v<N> Tensor operator*(const Tensor& a, N b) {
  return scalar_op("aten::mul.Scalar", a, number_constant(b));
}
template <class N>
requires std::is_arithmetic_v<N> Tensor operator/(const Tensor& a, N b) {
  return scalar_op("aten::div.Scalar", a, number_constant(b));
}

}  // namespace shardflow
