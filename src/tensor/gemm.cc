#include "shardflow/tensor/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

namespace shardflow {

void gemm_f32(const GemmShape& s, const float* a, const float* b, float* c, bool accumulate) {
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    // An empty contraction sums nothing; BLAS rejects the zero leading dims.
    if (!accumulate) std::memset(c, 0, static_cast<std::size_t>(s.m * s.n) * sizeof(float));
    return;
  }
  if (s.m <= 2 && !s.transpose_a) {
    // A row or two (decode steps): sgemm would first pack all of B, a full
    // extra pass over the weights; matrix-vector products stream B once.
    for (int64_t i = 0; i < s.m; ++i) {
      const float* x = a + i * s.k;
      float* y = c + i * s.n;
      if (s.transpose_b) {  // B stored n x k: y = B x
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, b,
                    static_cast<int>(s.k), x, 1, accumulate ? 1.0f : 0.0f, y, 1);
      } else {  // B stored k x n: y = B^T x
        cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(s.k), static_cast<int>(s.n), 1.0f, b,
                    static_cast<int>(s.n), x, 1, accumulate ? 1.0f : 0.0f, y, 1);
      }
    }
    return;
  }
  const auto lda = static_cast<int>(s.transpose_a ? s.m : s.k);
  const auto ldb = static_cast<int>(s.transpose_b ? s.k : s.n);
  cblas_sgemm(CblasRowMajor, s.transpose_a ? CblasTrans : CblasNoTrans,
              s.transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(s.m),
              static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a, lda, b, ldb,
              accumulate ? 1.0f : 0.0f, c, static_cast<int>(s.n));
}

void set_blas_threads(int threads) { openblas_set_num_threads(std::max(threads, 1)); }

}  // namespace shardflow
