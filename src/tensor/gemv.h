// Matrix-vector products for decode steps (a few rows of activations against
// a weight matrix). They stream the matrix once at close to memory
// bandwidth, split over the kernel threads, and give the same bits for any
// thread count: each output element is summed in one fixed order.
#pragma once

#include <cstdint>

namespace shardflow::detail {

// The most rows of x that one pass over B serves.
constexpr int64_t kMaxGemvRows = 8;

// y[m x n] = x[m x k] B^T (+ y when accumulate), B stored n x k row-major:
// B is read once per kMaxGemvRows rows of x, and each row of y gets the same
// bits as when its row of x is multiplied alone.
void gemv_f32(int64_t m, int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate);

// y[n] = B^T x (+ y when accumulate), B stored k x n row-major.
void gemv_transposed_f32(int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate);

}  // namespace shardflow::detail
