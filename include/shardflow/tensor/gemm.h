// Single-precision GEMM through OpenBLAS: C = A · B (row-major, with optional
// transposes). Keeping the BLAS header out of this file keeps it cheap to
// include.
#pragma once

#include <cstdint>

namespace shardflow {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false;  // A is stored k x m
  bool transpose_b = false;  // B is stored n x k
};

// c[m x n] = a · b (+ c when accumulate). Leading dims are the row lengths of
// the stored matrices.
void gemm_f32(const GemmShape& shape, const float* a, const float* b, float* c,
              bool accumulate = false);

// Runs OpenBLAS single-threaded in this thread (one thread per device).
void set_blas_threads(int threads);

}  // namespace shardflow
