// Matrix-vector products for decode steps (a few rows of activations against
// a weight matrix). They stream the matrix once at close to memory
// bandwidth, split over the kernel threads, and give the same bits for any
// thread count: each output element is summed in one fixed order.
#pragma once

#include <cstdint>

#include "shardflow/tensor/dtype.h"

namespace shardflow::detail {

// The most rows of x that one pass over B serves.
constexpr int64_t kMaxGemvRows = 8;

// y[m x n] = x[m x k] B^T (+ y when accumulate), B stored n x k row-major:
// B is read once per kMaxGemvRows rows of x, and each row of y gets the same
// bits as when its row of x is multiplied alone.
void gemv_f32(int64_t m, int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate);
// The same with B of 16-bit floats, widened as it is read: the bits of
// gemv_f32 on B converted to float, reading half the bytes.
void gemv_f32(int64_t m, int64_t n, int64_t k, const BFloat16* b, const float* x, float* y, bool accumulate);
void gemv_f32(int64_t m, int64_t n, int64_t k, const Float16* b, const float* x, float* y, bool accumulate);

// y[n] = B^T x (+ y when accumulate), B stored k x n row-major.
void gemv_transposed_f32(int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate);

}  // namespace shardflow::detail
