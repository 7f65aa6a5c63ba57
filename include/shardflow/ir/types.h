// The type of an IR value: a dtype and a static shape, written "f32[8,512]"
// ("f32[]" for a scalar).
#pragma once

#include <string>

#include "shardflow/tensor/dtype.h"
#include "shardflow/tensor/shape.h"

namespace shardflow {

struct TensorType {
  DType dtype = DType::kF32;
  Shape shape;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  // An error when the count does not fit in int64.
  int64_t nbytes() const;
  std::string to_string() const;
  friend bool operator==(const TensorType&, const TensorType&) = default;
};

}  // namespace shardflow
