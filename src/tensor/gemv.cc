#include "gemv.h"

#include <algorithm>

#include "shardflow/tensor/parallel.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace shardflow::detail {
namespace {

// One SIMD register of floats. The lane sums are deterministic for a given
// build; builds for different instruction sets differ in the last bits.
#if defined(__AVX512F__)
struct Vec {
  using T = __m512;
  static constexpr int64_t kLanes = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T broadcast(float x) { return _mm512_set1_ps(x); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  // GCC 12 flags the intrinsic's deliberately undefined register as
  // maybe-uninitialized where it is inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
  static float sum(T v) { return _mm512_reduce_add_ps(v); }
#pragma GCC diagnostic pop
};
#elif defined(__AVX2__) && defined(__FMA__)
struct Vec {
  using T = __m256;
  static constexpr int64_t kLanes = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T broadcast(float x) { return _mm256_set1_ps(x); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
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
  static float sum(T v) { return v; }
};
#endif

// Below this many matrix elements per thread, waking a helper costs more
// than it saves.
constexpr int64_t kMinElementsPerPart = 16384;

// out[j] = row j of the `kRows` rows at w, dotted with x. Eight rows share
// each load of x and keep eight loads from memory in flight: on short rows
// (k of a few hundred) that reads 10-25% faster than four. `ahead`, if not
// null, is the next block of rows: it is prefetched line by line in the same
// pattern, which the hardware prefetcher does not do for rows this short
// (another 10-20%).
template <int kRows>
void dot_rows(const float* w, int64_t k, const float* x, const float* ahead, float out[kRows]) {
  Vec::T acc[kRows];
#pragma GCC unroll 8
  for (int j = 0; j < kRows; ++j) acc[j] = Vec::zero();
  int64_t i = 0;
  for (; i + Vec::kLanes <= k; i += Vec::kLanes) {
    const Vec::T xv = Vec::load(x + i);
#pragma GCC unroll 8
    for (int j = 0; j < kRows; ++j) {
      // One prefetch per 64-byte line of the next block.
      if (ahead != nullptr && (i * 4) % 64 < Vec::kLanes * 4) __builtin_prefetch(ahead + j * k + i, 0, 3);
      acc[j] = Vec::fma(Vec::load(w + j * k + i), xv, acc[j]);
    }
  }
  for (int j = 0; j < kRows; ++j) {
    float sum = Vec::sum(acc[j]);
    for (int64_t t = i; t < k; ++t) sum += w[j * k + t] * x[t];
    out[j] = sum;
  }
}

float dot1(const float* w, int64_t k, const float* x) {
  Vec::T a = Vec::zero();
  int64_t i = 0;
  for (; i + Vec::kLanes <= k; i += Vec::kLanes) a = Vec::fma(Vec::load(w + i), Vec::load(x + i), a);
  float s = Vec::sum(a);
  for (; i < k; ++i) s += w[i] * x[i];
  return s;
}

void gemv_rows(int64_t begin, int64_t end, int64_t k, const float* b, const float* x, float* y, bool accumulate) {
  const auto store = [&](int64_t r, const float* sums, int count) {
    for (int j = 0; j < count; ++j) y[r + j] = accumulate ? y[r + j] + sums[j] : sums[j];
  };
  int64_t r = begin;
  for (; r + 8 <= end; r += 8) {
    float sums[8];
    dot_rows<8>(b + r * k, k, x, r + 16 <= end ? b + (r + 8) * k : nullptr, sums);
    store(r, sums, 8);
  }
  for (; r + 4 <= end; r += 4) {
    float sums[4];
    dot_rows<4>(b + r * k, k, x, nullptr, sums);
    store(r, sums, 4);
  }
  for (; r < end; ++r) {
    const float s = dot1(b + r * k, k, x);
    store(r, &s, 1);
  }
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

void gemv_f32(int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate) {
  const int64_t min_rows = std::max<int64_t>(8, kMinElementsPerPart / std::max<int64_t>(k, 1));
  parallel_for(n, min_rows, 8, [&](int64_t begin, int64_t end) { gemv_rows(begin, end, k, b, x, y, accumulate); });
}

void gemv_transposed_f32(int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate) {
  const int64_t min_columns = std::max<int64_t>(Vec::kLanes, kMinElementsPerPart / std::max<int64_t>(k, 1));
  parallel_for(n, min_columns, Vec::kLanes,
               [&](int64_t begin, int64_t end) { gemv_columns(begin, end, n, k, b, x, y, accumulate); });
}

}  // namespace shardflow::detail
