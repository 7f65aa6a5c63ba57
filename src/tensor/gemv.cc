#include "gemv.h"

#include <algorithm>

#include "shardflow/tensor/parallel.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace shardflow::detail {
namespace {

// One SIMD register of floats: 256 bits also where AVX-512 is there. The
// kernels here wait on memory, not on arithmetic, and on the 2-core dev VM
// (AMD EPYC, AVX-512) rows read with 256-bit loads streamed from memory at
// a median 46-52 GB/s against 43-45 with 512-bit ones. The lane sums are
// deterministic for a given build; AVX2 and plain builds differ in the last
// bits.
#if defined(__AVX2__) && defined(__FMA__)
struct Vec {
  using T = __m256;
  static constexpr int64_t kLanes = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T broadcast(float x) { return _mm256_set1_ps(x); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static float sum(T v) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
  }
};
#else
struct Vec {
  using T = float;
  static constexpr int64_t kLanes = 1;
  static T zero() { return 0.0f; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T v) { *p = v; }
  static T broadcast(float x) { return x; }
  static T fma(T a, T b, T c) { return a * b + c; }
  static T add(T a, T b) { return a + b; }
  static float sum(T v) { return v; }
};
#endif

// Below this many matrix elements per thread, waking a helper costs more
// than it saves.
constexpr int64_t kMinElementsPerPart = 16384;

// Each output element is the sum of kChains interleaved FMA chains (vector
// v of the weight row feeds chain v % kChains), so one row alone keeps
// enough FMAs in flight to read at memory speed.
constexpr int kChains = 4;

// Rows of x longer than this many floats (8 KiB) no longer stay in L1 beside
// the weight stream. Their loads are then shared by kLongRowTile adjacent
// weight rows read side by side, which also gives the memory several
// streams at once. On the dev VM (AMD EPYC Zen 4), one row of x against a
// 1 GiB weight of 8192 columns, medians of 7 rounds against a streaming
// read, 1 and 2 threads: 0.60-0.62 one weight row at a time, 0.81-0.82 four
// side by side. Four adjacent short rows (768 columns) read slower than one
// at a time there (0.58-0.81 against 0.95-0.97).
constexpr int64_t kLongRow = 2048;
// The weight rows read side by side, and the rows of x sharing each weight
// load: all their accumulators (kChains each) must stay in the vector
// registers beside the loads, 32 with AVX-512 and 16 with AVX2.
#if defined(__AVX512F__)
constexpr int kLongRowTile = 4;
constexpr int kRowsPerRead = 4;
#else
constexpr int kLongRowTile = 2;
constexpr int kRowsPerRead = 2;
#endif
constexpr int kRowsPerLongRead = 1;  // 4 x 2 tiles, every register an accumulator, were within 6%
// Short rows against one row of x are read from kStreams far-apart runs of
// a part at once, a row of each side by side: some cores fetch more with
// several sequential streams in flight. AMD EPYC Zen 2, 32000 x 768 from
// memory, 1 and 2 threads: one stream 16-17 and 24-32 GB/s, two 19-21 and
// 25-38, four 20-22 and 30-43; stories110M decode 66 -> 79-84 tokens/s.
// With several rows of x, short rows are read one at a time, each part one
// sequential stream.
constexpr int kStreams = 4;

// How far ahead of the FMAs a weight row is prefetched, in floats (4 KiB;
// past the matrix's end is harmless, a prefetch never faults), when several
// rows of x share a short weight row: their FMAs are slow enough for the
// hardware prefetcher to fall behind. Non-temporal: a weight is read once
// per step, and keeping it out of the outer caches leaves them to the
// activations and the KV cache. A single row of x reads faster without it:
// from memory 0.95-0.96 of a streaming read against 0.88 (768 and 2048
// columns, 1 and 2 threads), and from the caches 1.04-1.37x as fast, as the
// non-temporal hint evicted weights the next step reads again.
constexpr int64_t kPrefetchAhead = 1024;

// out[r][b] = weight row r (ldw apart, kWeightRows of them from w) dotted
// with row b of the `kBatch` rows of x (ldx apart). Each element's chains,
// their pairwise sum, the lane sum and the scalar tail come in the same
// order for any tile, so a row of x gets the same bits alone or in a batch,
// from any weight row of a tile.
template <int kWeightRows, int kBatch>
void dot_tile(const float* w, int64_t ldw, int64_t k, const float* x, int64_t ldx, float out[kWeightRows][kBatch]) {
  Vec::T acc[kWeightRows][kBatch][kChains];
#pragma GCC unroll 4
  for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 4
    for (int b = 0; b < kBatch; ++b) {
#pragma GCC unroll 4
      for (int c = 0; c < kChains; ++c) acc[r][b][c] = Vec::zero();
    }
  }
  constexpr bool kPrefetch = kWeightRows == 1 && kBatch > 1;
  constexpr int64_t kStep = kChains * Vec::kLanes;
  constexpr int64_t kLine = 64 / sizeof(float);
  int64_t i = 0;
  for (; i + kStep <= k; i += kStep) {
    if constexpr (kPrefetch) {
#pragma GCC unroll 4
      for (int64_t line = 0; line < kStep; line += kLine) __builtin_prefetch(w + i + line + kPrefetchAhead, 0, 0);
    }
#pragma GCC unroll 4
    for (int c = 0; c < kChains; ++c) {
      Vec::T xv[kBatch];
#pragma GCC unroll 4
      for (int b = 0; b < kBatch; ++b) xv[b] = Vec::load(x + b * ldx + i + c * Vec::kLanes);
#pragma GCC unroll 4
      for (int r = 0; r < kWeightRows; ++r) {
        const Vec::T wv = Vec::load(w + r * ldw + i + c * Vec::kLanes);
#pragma GCC unroll 4
        for (int b = 0; b < kBatch; ++b) acc[r][b][c] = Vec::fma(wv, xv[b], acc[r][b][c]);
      }
    }
  }
  // The whole vectors left over continue the chains in order.
#pragma GCC unroll 4
  for (int c = 0; c < kChains - 1; ++c) {
    if (i + Vec::kLanes > k) break;
#pragma GCC unroll 4
    for (int r = 0; r < kWeightRows; ++r) {
      const Vec::T wv = Vec::load(w + r * ldw + i);
#pragma GCC unroll 4
      for (int b = 0; b < kBatch; ++b) acc[r][b][c] = Vec::fma(wv, Vec::load(x + b * ldx + i), acc[r][b][c]);
    }
    i += Vec::kLanes;
  }
  static_assert(kChains == 4, "the sum below adds four chains pairwise");
  for (int r = 0; r < kWeightRows; ++r) {
    for (int b = 0; b < kBatch; ++b) {
      float sum = Vec::sum(Vec::add(Vec::add(acc[r][b][0], acc[r][b][1]), Vec::add(acc[r][b][2], acc[r][b][3])));
      for (int64_t t = i; t < k; ++t) sum += w[r * ldw + t] * x[b * ldx + t];
      out[r][b] = sum;
    }
  }
}

// dot_tile for kWeightRows weight rows and kBatch rows of x, kPerRead rows
// of x at a time (each further group reads the weight rows again, from L1).
// The weight rows are `spacing` rows apart (1: adjacent).
template <int kWeightRows, int kBatch, int kPerRead>
void dot_rows(const float* w, int64_t spacing, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy,
              bool accumulate) {
  constexpr int kFirst = kBatch < kPerRead ? kBatch : kPerRead;
  float sums[kWeightRows][kFirst];
  dot_tile<kWeightRows, kFirst>(w, spacing * k, k, x, ldx, sums);
  for (int r = 0; r < kWeightRows; ++r) {
    for (int b = 0; b < kFirst; ++b) {
      float& out = y[b * ldy + r * spacing];
      out = accumulate ? out + sums[r][b] : sums[r][b];
    }
  }
  if constexpr (kBatch > kFirst) {
    dot_rows<kWeightRows, kBatch - kFirst, kPerRead>(w, spacing, k, x + kFirst * ldx, ldx, y + kFirst * ldy, ldy,
                                                     accumulate);
  }
}

// Rows [begin, end) of y = x B^T for kBatch rows of x.
template <int kBatch>
void gemv_rows(int64_t begin, int64_t end, int64_t k, const float* w, const float* x, int64_t ldx, float* y,
               int64_t ldy, bool accumulate) {
  int64_t r = begin;
  if (k > kLongRow) {
    for (; r + kLongRowTile <= end; r += kLongRowTile) {
      dot_rows<kLongRowTile, kBatch, kRowsPerLongRead>(w + r * k, 1, k, x, ldx, y + r, ldy, accumulate);
    }
  } else if (kBatch == 1) {
    // The range in kStreams equal runs, read side by side.
    const int64_t run = (end - r) / kStreams;
    for (int64_t i = 0; i < run; ++i) {
      dot_rows<kStreams, 1, 1>(w + (r + i) * k, run, k, x, ldx, y + r + i, ldy, accumulate);
    }
    r += run * kStreams;
  }
  for (; r < end; ++r) dot_rows<1, kBatch, kRowsPerRead>(w + r * k, 1, k, x, ldx, y + r, ldy, accumulate);
}

// Columns [begin, end) of y = B^T x, in blocks that stay in registers'
// reach of L1 while all k rows of B stream past.
void gemv_columns(int64_t begin, int64_t end, int64_t n, int64_t k, const float* b, const float* x, float* y,
                  bool accumulate) {
  constexpr int64_t kBlock = 256;
  float acc[kBlock];
  for (int64_t c0 = begin; c0 < end; c0 += kBlock) {
    const int64_t width = std::min(kBlock, end - c0);
    const int64_t vector_width = width / Vec::kLanes * Vec::kLanes;
    std::fill(acc, acc + width, 0.0f);
    for (int64_t i = 0; i < k; ++i) {
      const float* row = b + i * n + c0;
      const Vec::T xi = Vec::broadcast(x[i]);
      for (int64_t j = 0; j < vector_width; j += Vec::kLanes) {
        Vec::store(acc + j, Vec::fma(xi, Vec::load(row + j), Vec::load(acc + j)));
      }
      for (int64_t j = vector_width; j < width; ++j) acc[j] += x[i] * row[j];
    }
    for (int64_t j = 0; j < width; ++j) y[c0 + j] = accumulate ? y[c0 + j] + acc[j] : acc[j];
  }
}

}  // namespace

void gemv_f32(int64_t m, int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate) {
  const int64_t min_rows = std::max<int64_t>(8, kMinElementsPerPart / std::max<int64_t>(k, 1));
  // The first rows of x: one template per count, so each keeps its
  // accumulators in registers.
  const auto rows_of = [&]<int kBatch>(const float* x_rows, float* y_rows) {
    parallel_for(n, min_rows, 8, [&](int64_t begin, int64_t end) {
      gemv_rows<kBatch>(begin, end, k, b, x_rows, k, y_rows, n, accumulate);
    });
  };
  for (int64_t done = 0; done < m;) {
    const float* x_rows = x + done * k;
    float* y_rows = y + done * n;
    const int64_t rows = std::min(m - done, kMaxGemvRows);
    switch (rows) {
      case 1:
        rows_of.template operator()<1>(x_rows, y_rows);
        break;
      case 2:
        rows_of.template operator()<2>(x_rows, y_rows);
        break;
      case 3:
        rows_of.template operator()<3>(x_rows, y_rows);
        break;
      case 4:
        rows_of.template operator()<4>(x_rows, y_rows);
        break;
      case 5:
        rows_of.template operator()<5>(x_rows, y_rows);
        break;
      case 6:
        rows_of.template operator()<6>(x_rows, y_rows);
        break;
      case 7:
        rows_of.template operator()<7>(x_rows, y_rows);
        break;
      default:
        rows_of.template operator()<8>(x_rows, y_rows);
        break;
    }
    done += rows;
  }
}

void gemv_transposed_f32(int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate) {
  const int64_t min_columns = std::max<int64_t>(Vec::kLanes, kMinElementsPerPart / std::max<int64_t>(k, 1));
  parallel_for(n, min_columns, Vec::kLanes,
               [&](int64_t begin, int64_t end) { gemv_columns(begin, end, n, k, b, x, y, accumulate); });
}

}  // namespace shardflow::detail
