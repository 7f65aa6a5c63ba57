// Matrix-vector products for decode steps (one or two rows of activations
// against a weight matrix). They stream the matrix once at close to memory
// bandwidth, split over the kernel threads, and give the same bits for any
// thread count: each output element is summed in one fixed order.
#pragma once

#include <cstdint>

namespace shardflow::detail {

// y[n] = B x (+ y when accumulate), B stored n x k row-major.
void gemv_f32(int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate);

// y[n] = B^T x (+ y when accumulate), B stored k x n row-major.
void gemv_transposed_f32(int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate);

}  // namespace shardflow::detail
