#include "shardflow/tensor/gemm.h"

#include <dnnl.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "gemv.h"
#include "shardflow/tensor/dense_tensor.h"
#include "shardflow/tensor/parallel.h"

// libgomp's, which oneDNN runs on; declared here so that no OpenMP flags are
// needed to build us.
extern "C" {
int omp_get_max_threads();
void omp_set_num_threads(int threads);
}

namespace shardflow {
namespace {

int count_from_environment(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && value > 0 && value <= 4096 ? static_cast<int>(value) : 0;
}

// The kernel thread count: OMP_NUM_THREADS (what PyTorch reads), else
// OPENBLAS_NUM_THREADS (what shardflow read while it used OpenBLAS), else
// the cores this process may run on.
std::atomic<int>& thread_count() {
  static std::atomic<int> count = [] {
    for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
      if (const int threads = count_from_environment(name)) return threads;
    }
    return available_cores();
  }();
  return count;
}

// Each block of a split product is at least this much work (tens of
// microseconds), far more than waking a thread and packing the other
// operand again cost.
constexpr int64_t kMinMultiplyAddsPerBlock = int64_t{2} << 20;

// One block, on the calling thread. oneDNN's GEMM would otherwise start an
// OpenMP team of the default size inside each of our threads; the caller's
// OpenMP setting comes back afterwards.
void sgemm(const GemmShape& s, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
           bool accumulate) {
  const int caller_threads = omp_get_max_threads();
  if (caller_threads != 1) omp_set_num_threads(1);
  const dnnl_status_t status = dnnl_sgemm(s.transpose_a ? 'T' : 'N', s.transpose_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a,
                                          lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
  if (caller_threads != 1) omp_set_num_threads(caller_threads);
  if (status != dnnl_success) {
    throw std::logic_error("oneDNN's sgemm refused m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
                           " k=" + std::to_string(s.k) + " (status " + std::to_string(status) + ")");
  }
}

// oneDNN's AVX2 sgemm multiplies without packing when 1/m + 1/n >= 0.0038
// (its no-copy kernels), which on aligned operands with rows a multiple of
// 4 KiB apart ran at a third of the packing kernels' speed (AMD EPYC Zen 2,
// one thread: 1024^3 in 256-column blocks 34 GFLOPS, in 512-column blocks
// 95; 7B's wq at 512 tokens 0.86 of one oneDNN call, 0.98 in wider blocks).
// Whether oneDNN packs a block of C of `rows` x `columns`: 1/rows +
// 1/columns < 38/10000, in integers.
bool packs(int64_t rows, int64_t columns) { return 10000 * (rows + columns) < 38 * rows * columns; }

// The fewest lines a block needs to stay on the packing side when the other
// side of C has `other` lines (packs(other, lines)), or 0 when no block width does.
int64_t packing_lines(int64_t other) {
  if (38 * other <= 10000) return 0;
  return 10000 * other / (38 * other - 10000) + 1;
}

// Fixed blocks of `length` lines (C's columns or rows), each at least
// `min_lines` long: a power-of-two number of them, so that 2, 4 or 8
// threads get equal shares.
int64_t block_count(int64_t length, int64_t min_lines) {
  const auto wanted = static_cast<uint64_t>(std::max<int64_t>(length / std::max<int64_t>(min_lines, 1), 1));
  return static_cast<int64_t>(std::bit_floor(wanted));
}

// `length` lines cut into `parts` blocks of a multiple of 16 lines; the last may be shorter.
int64_t part_lines(int64_t length, int64_t parts) { return ((length + parts - 1) / parts + 15) / 16 * 16; }

// C cut into tiles of `rows` x `columns` (the last of each may be shorter).
struct Tiles {
  int64_t rows, columns;
  int64_t row_tiles, column_tiles;
};

Tiles tiles_of(const GemmShape& s, int64_t row_parts, int64_t column_parts) {
  const int64_t rows = part_lines(s.m, row_parts), columns = part_lines(s.n, column_parts);
  return {rows, columns, (s.m + rows - 1) / rows, (s.n + columns - 1) / columns};
}

// Each tile's call packs its rows of A and its columns of B: per
// multiply-add, 1/rows + 1/columns elements copied. Of the ways to cut C
// into the same number of tiles, the squarest copies least: 2048x2048x8192
// in 1024x1024 tiles ran at 0.99 of one oneDNN call, in 2048x512 ones at
// 0.93 (AMD EPYC Zen 2, one thread). Tiles too narrow to pack (see
// packing_lines) are never chosen over the cut along one side.
Tiles squarest_tiles(const GemmShape& s, int64_t count, bool by_columns) {
  const auto copied = [](const Tiles& t) {
    return 1.0 / static_cast<double>(t.rows) + 1.0 / static_cast<double>(t.columns);
  };
  Tiles best = by_columns ? tiles_of(s, 1, count) : tiles_of(s, count, 1);
  for (int64_t row_parts = 1; row_parts <= count; row_parts *= 2) {
    const Tiles t = tiles_of(s, row_parts, count / row_parts);
    if (packs(t.rows, t.columns) && copied(t) < copied(best)) best = t;
  }
  return best;
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
  const int64_t lda = s.transpose_a ? s.m : s.k;
  const int64_t ldb = s.transpose_b ? s.k : s.n;
  // Single-threaded sgemm calls on fixed tiles of C, shared out over the
  // kernel threads. oneDNN's sums depend on the shape it is called with (its
  // own threads change the bits too); the tiles depend only on the product,
  // so the bits do not depend on the thread count. Their number comes from
  // blocks of C's columns (or of its rows, when it has more rows), each call
  // of which packs its slice of the operand being split and all of the
  // other; squarer tiles of that number may then copy less (squarest_tiles).
  const bool by_columns = s.n >= s.m;
  const int64_t length = by_columns ? s.n : s.m;
  const int64_t per_line = std::max<int64_t>((by_columns ? s.m : s.n) * s.k, 1);  // multiply-adds per column/row
  // Blocks of at least kMinMultiplyAddsPerBlock. Every block repacks the
  // other operand; once that outgrows the L2 cache (256 Ki floats) it comes
  // from farther away, and blocks of 256 lines keep the copy to one element
  // per 256 multiply-adds; from 4 Mi floats on (16 MiB, past a core's share
  // of the L3) it streams from memory, and blocks of 512 lines halve that.
  const int64_t repack_lines = per_line >= (int64_t{1} << 22) ? 512 : per_line >= (int64_t{1} << 18) ? 256 : 128;
  int64_t min_lines = std::max({kMinMultiplyAddsPerBlock / per_line, repack_lines, int64_t{1}});
  // Wider blocks where that keeps oneDNN packing and leaves two blocks.
  const int64_t packing = packing_lines(by_columns ? s.m : s.n);
  if (packing <= length / 2) min_lines = std::max(min_lines, packing);
  const Tiles tiles = squarest_tiles(s, block_count(length, min_lines), by_columns);
  parallel_for(tiles.row_tiles * tiles.column_tiles, 1, 1, [&](int64_t first, int64_t last) {
    for (int64_t index = first; index < last; ++index) {
      const int64_t row = index / tiles.column_tiles * tiles.rows;
      const int64_t column = index % tiles.column_tiles * tiles.columns;
      GemmShape part = s;
      part.m = std::min(tiles.rows, s.m - row);
      part.n = std::min(tiles.columns, s.n - column);
      sgemm(part, a + (s.transpose_a ? row : row * lda), lda, b + (s.transpose_b ? column * ldb : column), ldb,
            c + row * s.n + column, s.n, accumulate);
    }
  });
}

namespace {

template <class W>
void gemm_f32_widening(const GemmShape& s, const float* a, const W* b, float* c, bool accumulate) {
  if (!s.transpose_a && s.transpose_b && s.m > 0 && s.m <= detail::kMaxGemvRows && s.n > 0 && s.k > 0) {
    detail::gemv_f32(s.m, s.n, s.k, b, a, c, accumulate);
    return;
  }
  DenseTensor wide = DenseTensor::empty(DType::kF32, {s.n * s.k});
  float* to = wide.data_as<float>();
  to_floats(b, s.n * s.k, to);
  gemm_f32(s, a, to, c, accumulate);
}

}  // namespace

void gemm_f32(const GemmShape& shape, const float* a, const BFloat16* b, float* c, bool accumulate) {
  gemm_f32_widening(shape, a, b, c, accumulate);
}

void gemm_f32(const GemmShape& shape, const float* a, const Float16* b, float* c, bool accumulate) {
  gemm_f32_widening(shape, a, b, c, accumulate);
}

void set_kernel_threads(int threads) { thread_count().store(std::max(threads, 1), std::memory_order_relaxed); }

int kernel_threads() { return thread_count().load(std::memory_order_relaxed); }

namespace {

// Vector widths as levels: 0 SSE, 1 AVX, 2 AVX2 with FMA, 3 AVX-512 (the
// F, BW, VL and DQ sets that oneDNN's avx512_core kernels need).
constexpr const char* kIsaNames[] = {"SSE", "AVX", "AVX2", "AVX-512"};

int cpu_level() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
    return 3;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
  return 0;
}

// oneDNN's ISA values are bit sets, each containing the narrower ones.
int kernel_level(dnnl_cpu_isa_t isa) {
  const auto has = [isa](dnnl_cpu_isa_t set) { return (isa & set) == set; };
  if (has(dnnl_cpu_isa_avx512_core)) return 3;
  if (has(dnnl_cpu_isa_avx2)) return 2;
  if (has(dnnl_cpu_isa_avx)) return 1;
  return 0;
}

}  // namespace

MatrixKernelCheck check_matrix_kernels() {
  MatrixKernelCheck check;
  const int kernels = kernel_level(dnnl_get_effective_cpu_isa());
  const int cpu = cpu_level();
  check.kernel_isa = kIsaNames[kernels];
  check.cpu_isa = kIsaNames[cpu];
  if (kernels >= cpu) return check;
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    if (const char* value = std::getenv(name)) {
      check.note = std::string(name) + "=" + value + " limits oneDNN to its " + check.kernel_isa + " kernels on this " +
                   check.cpu_isa + " CPU: matrix products run slower than they could. Unset " + name + ".";
      return check;
    }
  }
  check.note = "oneDNN runs its " + check.kernel_isa + " kernels on this " + check.cpu_isa +
               " CPU: matrix products run slower than they could.";
  return check;
}

}  // namespace shardflow
