#include "shardflow/tensor/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <utility>

#include "gemv.h"
#include "shardflow/tensor/parallel.h"

namespace shardflow {
namespace {

// The kernel thread count. OpenBLAS is switched to one thread the first time
// this is read and stays there: our pool splits its calls instead. Its own
// pool, left to spin after each call, competed with ours for the cores, and
// a decode step right after a prefill ran up to 20% slower for it.
std::atomic<int>& thread_count() {
  static std::atomic<int> count = [] {
    const int initial = std::max(openblas_get_num_threads(), 1);  // OPENBLAS_NUM_THREADS, else the cores
    openblas_set_num_threads(1);
    return initial;
  }();
  return count;
}

// Each block of a split product is at least this much work (tens of
// microseconds), far more than waking a thread and packing the other
// operand again cost.
constexpr int64_t kMinMultiplyAddsPerBlock = int64_t{2} << 20;

void sgemm(const GemmShape& s, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
           bool accumulate) {
  cblas_sgemm(CblasRowMajor, s.transpose_a ? CblasTrans : CblasNoTrans, s.transpose_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), accumulate ? 1.0f : 0.0f, c, static_cast<int>(ldc));
}

}  // namespace

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
  kernel_threads();  // switches OpenBLAS to one thread before our first call into it
  const int64_t lda = s.transpose_a ? s.m : s.k;
  const int64_t ldb = s.transpose_b ? s.k : s.n;
  // Single-threaded sgemm calls on fixed blocks of C's columns (or of its
  // rows, when it has more rows), the blocks shared out over the kernel
  // threads. OpenBLAS's sums depend on the shape it is called with (its own
  // threads change the bits too); the blocks depend only on the product, so
  // the bits do not depend on the thread count. Each call packs its slice of
  // the operand being split and all of the other.
  const bool by_columns = s.n >= s.m;
  const int64_t length = by_columns ? s.n : s.m;
  const int64_t per_line = std::max<int64_t>((by_columns ? s.m : s.n) * s.k, 1);  // multiply-adds per column/row
  // Blocks of at least kMinMultiplyAddsPerBlock. Every block repacks the
  // other operand; once that outgrows the L2 cache (256 Ki floats) it comes
  // from memory, and blocks of 256 lines keep the copy to one element per
  // 256 multiply-adds.
  const int64_t lines =
      std::max({kMinMultiplyAddsPerBlock / per_line, per_line >= (int64_t{1} << 18) ? int64_t{256} : 1, int64_t{1}});
  const int64_t block = (lines + 15) / 16 * 16;
  const int64_t blocks = std::max<int64_t>(length / block, 1);  // the last block takes the remainder
  parallel_for(blocks, 1, 1, [&](int64_t first, int64_t last) {
    for (int64_t index = first; index < last; ++index) {
      const int64_t begin = index * block;
      const int64_t end = index + 1 == blocks ? length : begin + block;
      GemmShape part = s;
      if (by_columns) {
        part.n = end - begin;
        sgemm(part, a, lda, b + (s.transpose_b ? begin * ldb : begin), ldb, c + begin, s.n, accumulate);
      } else {
        part.m = end - begin;
        sgemm(part, a + (s.transpose_a ? begin : begin * lda), lda, b, ldb, c + begin * s.n, s.n, accumulate);
      }
    }
  });
}

void set_kernel_threads(int threads) { thread_count().store(std::max(threads, 1), std::memory_order_relaxed); }

int kernel_threads() { return thread_count().load(std::memory_order_relaxed); }

namespace {

// OpenBLAS core names by the widest vector instructions their kernels use.
int core_level(const std::string& corename) {
  static const std::pair<const char*, int> kCores[] = {
      {"Prescott", 0},    {"Core2", 0},     {"Penryn", 0},     {"Dunnington", 0},   {"Nehalem", 0},
      {"Atom", 0},        {"Barcelona", 0}, {"Opteron", 0},    {"Opteron_SSE3", 0}, {"Bobcat", 0},
      {"Sandybridge", 1}, {"Bulldozer", 1}, {"Piledriver", 1}, {"Steamroller", 1},  {"Excavator", 1},
      {"Haswell", 2},     {"Zen", 2},       {"SkylakeX", 3},   {"Cooperlake", 3},   {"SapphireRapids", 3}};
  for (const auto& [name, level] : kCores) {
    if (corename == name) return level;
  }
  return -1;
}

int cpu_level() {
  if (__builtin_cpu_supports("avx512f")) return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
  return 0;
}

}  // namespace

std::string better_blas_core(const std::string& corename, int level) {
  const int have = core_level(corename);
  if (have < 0 || have >= level) return "";
  static const char* const kBest[] = {"", "Sandybridge", "Haswell", "SkylakeX"};
  return kBest[std::clamp(level, 0, 3)];
}

BlasKernelCheck check_blas_kernels() {
  static const char* const kIsa[] = {"SSE", "AVX", "AVX2", "AVX-512"};
  const char* name = openblas_get_corename();
  BlasKernelCheck check;
  check.corename = name != nullptr ? name : "";
  // OpenBLAS names cores in lower case in some versions ("prescott").
  if (!check.corename.empty()) {
    check.corename[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(check.corename[0])));
  }
  const int level = cpu_level();
  check.cpu_isa = kIsa[level];
  check.better_core = better_blas_core(check.corename, level);
  return check;
}

}  // namespace shardflow
