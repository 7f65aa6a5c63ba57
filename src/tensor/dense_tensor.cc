#include "shardflow/tensor/dense_tensor.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "shardflow/base/error.h"

namespace shardflow {

static std::shared_ptr<std::byte> allocate(std::size_t bytes) {
  constexpr std::size_t kAlignment = 64;
  const std::size_t rounded = std::max<std::size_t>((bytes + kAlignment - 1) / kAlignment, 1) * kAlignment;
  void* memory = std::aligned_alloc(kAlignment, rounded);
  if (memory == nullptr) throw Error(fmt::format("out of memory allocating {} bytes", bytes));
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(memory), [](std::byte* p) { std::free(p); });
}

DenseTensor DenseTensor::empty(DType dtype, Shape shape) {
  for (int64_t d : shape) {
    if (d < 0) throw Error("tensor shape " + shape_to_string(shape) + " has a negative dimension");
  }
  DenseTensor tensor;
  tensor.dtype_ = dtype;
  tensor.numel_ = shardflow::numel(shape);
  tensor.shape_ = std::move(shape);
  tensor.buffer_ = allocate(tensor.nbytes());
  return tensor;
}

DenseTensor DenseTensor::zeros(DType dtype, Shape shape) {
  DenseTensor tensor = empty(dtype, std::move(shape));
  std::memset(tensor.data(), 0, tensor.nbytes());
  return tensor;
}

DenseTensor DenseTensor::reshaped(Shape shape) const {
  if (shardflow::numel(shape) != numel_) {
    throw Error(fmt::format("shape '{}' is invalid for input of size {}", shape_to_string(shape),
                            numel_));
  }
  DenseTensor view = *this;
  view.shape_ = std::move(shape);
  return view;
}

}  // namespace shardflow
