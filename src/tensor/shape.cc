#include "shardflow/tensor/shape.h"

#include <fmt/format.h>

#include "shardflow/base/error.h"
#include "shardflow/base/text.h"

namespace shardflow {

Dims::size_type Dims::checked(size_type i) const {
  if (i >= size_) throw Error(fmt::format("dim {} of a rank-{} shape", i, size_));
  return i;
}

Dims::iterator Dims::insert(const_iterator position, size_type count, int64_t value) {
  const auto at = static_cast<size_type>(position - data_);
  make_gap(at, count);
  std::fill_n(data_ + at, count, value);
  return data_ + at;
}

void Dims::grow(size_type wanted) {
  const size_type capacity = std::max(wanted, 2 * capacity_);
  auto* heap = new int64_t[capacity];
  std::copy(data_, data_ + size_, heap);
  release();
  data_ = heap;
  capacity_ = capacity;
}

// Opens `count` slots at `at`, moving the extents after it back.
void Dims::make_gap(size_type at, size_type count) {
  if (count == 0) return;
  reserve(size_ + count);
  std::copy_backward(data_ + at, data_ + size_, data_ + size_ + count);
  size_ += count;
}

int64_t numel(std::span<const int64_t> shape) {
  int64_t count = 1;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    overflow = __builtin_mul_overflow(count, d, &count) || overflow;
  }
  if (overflow) {
    throw Error(fmt::format("shape {} has more elements than a 64-bit count holds", shape_to_string(shape)));
  }
  return count;
}

Dims row_major_strides(std::span<const int64_t> shape) {
  Dims strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

std::string shape_to_string(std::span<const int64_t> shape) { return "[" + join_ints(shape, ",") + "]"; }

Shape broadcast_shapes(std::span<const int64_t> a, std::span<const int64_t> b) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape result(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    // Align from the right.
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw Error(
          fmt::format("The size of tensor a ({}) must match the size of tensor b ({}) "
                      "at non-singleton dimension {}",
                      da, db, i));
    }
    result[i] = da == 1 ? db : da;
  }
  return result;
}

int64_t wrap_dim(int64_t dim, int64_t rank) {
  const int64_t extent = std::max<int64_t>(rank, 1);
  if (dim < -extent || dim >= extent) {
    throw Error(
        fmt::format("Dimension out of range (expected to be in range of [{}, {}], but "
                    "got {})",
                    -extent, extent - 1, dim));
  }
  return dim < 0 ? dim + extent : dim;
}

}  // namespace shardflow
