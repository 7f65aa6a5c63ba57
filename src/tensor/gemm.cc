#include "shardflow/tensor/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "gemv.h"

namespace shardflow {

void gemm_f32(const GemmShape& s, const float* a, const float* b, float* c, bool accumulate) {
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    // An empty contraction sums nothing; BLAS rejects the zero leading dims.
    if (!accumulate) std::memset(c, 0, static_cast<std::size_t>(s.m * s.n) * sizeof(float));
    return;
  }
  // A few rows (decode steps): sgemm would first pack all of B, a full extra
  // pass over the weights; these kernels stream B once.
  if (!s.transpose_a && s.transpose_b && s.m <= detail::kMaxGemvRows) {
    detail::gemv_f32(s.m, s.n, s.k, b, a, c, accumulate);
    return;
  }
  if (!s.transpose_a && !s.transpose_b && s.m <= 2) {
    for (int64_t i = 0; i < s.m; ++i) detail::gemv_transposed_f32(s.n, s.k, b, a + i * s.k, c + i * s.n, accumulate);
    return;
  }
  const auto lda = static_cast<int>(s.transpose_a ? s.m : s.k);
  const auto ldb = static_cast<int>(s.transpose_b ? s.k : s.n);
  cblas_sgemm(CblasRowMajor, s.transpose_a ? CblasTrans : CblasNoTrans,
              s.transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(s.m),
              static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a, lda, b, ldb,
              accumulate ? 1.0f : 0.0f, c, static_cast<int>(s.n));
}

void set_kernel_threads(int threads) { openblas_set_num_threads(std::max(threads, 1)); }

int kernel_threads() { return std::max(openblas_get_num_threads(), 1); }

}  // namespace shardflow
