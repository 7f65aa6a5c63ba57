// Tensor shapes: a list of non-negative extents, rank 0 upward.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace shardflow {

using Shape = std::vector<int64_t>;

int64_t numel(std::span<const int64_t> shape);
// Row-major strides in elements.
std::vector<int64_t> row_major_strides(std::span<const int64_t> shape);
// "[8,512]"; a scalar is "[]".
std::string shape_to_string(std::span<const int64_t> shape);

// NumPy/PyTorch broadcasting of two shapes; throws PyTorch's message
// ("The size of tensor a (3) must match the size of tensor b (4) at
// non-singleton dimension 1") when they do not broadcast.
Shape broadcast_shapes(std::span<const int64_t> a, std::span<const int64_t> b);

// Wraps a possibly negative dim into [0, rank); PyTorch's error otherwise:
// "Dimension out of range (expected to be in range of [-2, 1], but got 2)".
// A scalar accepts dims -1 and 0, as PyTorch does.
int64_t wrap_dim(int64_t dim, int64_t rank);

}  // namespace shardflow
