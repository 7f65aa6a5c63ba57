#include "gemv.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "shardflow/tensor/dense_tensor.h"
#include "shardflow/tensor/gemm.h"
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
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  // 16-bit weights, widened exactly: a bf16 is the high half of a float.
  static T load(const BFloat16* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static T load(const Float16* p) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    alignas(32) float wide[kLanes];
    to_floats(p, kLanes, wide);
    return _mm256_load_ps(wide);
#endif
  }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T broadcast(float x) { return _mm256_set1_ps(x); }
  static T zero() { return _mm256_setzero_ps(); }
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
  static T load(const float* p) { return *p; }
  static T load(const BFloat16* p) { return to_float(*p); }
  static T load(const Float16* p) { return to_float(*p); }
  static void store(float* p, T v) { *p = v; }
  static T broadcast(float x) { return x; }
  static T zero() { return 0.0f; }
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
// load: all their accumulators must stay in the vector registers beside
// the loads, 32 with AVX-512 and 16 with AVX2 (a round's chains each, up
// to kMaxAccumulators; beyond, one each, summed one register's chains at
// a time: see add_rounds_by_register). With AVX-512 the eight rows of a
// batch share one read of a short weight row and four a long one. Intel
// Xeon family 6 model 207, 8 rows of x, 1 and 2 threads, against a
// streaming read of a 1 GiB weight of 768 columns: 0.42 and 0.30 with four
// rows per read and 256-bit registers, 0.66-0.70 and 0.60-0.65 with eight;
// against weights in L2 (32 x 8192), 9-11 GB/s with one row of x per read
// of four weight rows and 14 with four.
#if defined(__AVX512F__)
constexpr int kLongRowTile = 4;
constexpr int kRowsPerRead = 8;
constexpr int kRowsPerLongRead = 4;
constexpr int kMaxAccumulators = 24;  // of 32 vector registers
#else
constexpr int kLongRowTile = 2;
constexpr int kRowsPerRead = 2;
constexpr int kRowsPerLongRead = 1;
constexpr int kMaxAccumulators = 12;  // of 16: kStreams rows' chains below
#endif
// AVX2 keeps these. On AMD EPYC family 25 model 1 (Zen 3: two 256-bit FMAs
// a cycle at 3.07 GHz, 98 GFLOPS), 8 rows of x against 1 GiB of weights,
// one thread, 2 alternating rounds against a streaming read, 8192, 2048 and
// 768 columns: 0.28-0.37, 0.34-0.45 and 0.31-0.36 with these; pairs of
// weight rows against four rows of x by register (long rows and short)
// 0.38-0.41, 0.36-0.39 and 0.26-0.30, though up to 1.5x faster on weights
// in the caches; those with their prefetches spread over a round's passes
// 0.31-0.35, 0.35-0.37 and 0.32-0.34, and 1024 floats ahead instead of 4096
// 0.33-0.37 at 8192 columns, where 4 rows of x fell from 0.46-0.59 (two
// runs) to 0.41 (long rows by register). What bounds them there is the two
// costs added, not overlapped: a standalone loop of pairs or singles of
// weight rows by register reached 61-69 GFLOPS on weights in L1 (15-17
// GB/s of weights at 4 flops a byte), the stream 17-19 GB/s, and from
// memory it read 8-9, about 1 / (1/16 + 1/18).
// Short weight rows read against all the rows of x at once (a batch of up
// to kRowsPerRead, summed over the whole row) need those rows in L1 beside
// the weight stream: beyond this many floats (32 KiB) they are read as
// long rows are, kLongRowTile weight rows side by side over blocks of k.
// Xeon model 207, one thread, 8 rows of x against 1.2 GiB of weights of
// 2048 columns (stories110M's w2), medians against a streaming read:
// 0.35-0.43 -> 0.50-0.59 (ops_bench), 0.41-0.43 -> 0.57 (15 rounds); at
// 768 columns (24 KiB of x) reading one weight row at a time stays ahead
// (0.59-0.62 against 0.53-0.59).
constexpr int64_t kShortRowsInL1 = 8192;
// With several rows of x and 512-bit registers (four rows of x sharing a
// weight load), rows of kLongRow floats are read as long rows too. AMD
// EPYC family 25 model 17 (Zen 4), one thread, 1 GiB of weights of 2048
// columns, medians of 5 rounds against a streaming read: 2 rows of x
// 0.59-0.64 one weight row at a time, 0.75 as long rows; 4 rows 0.31-0.37
// and 0.63.
#if defined(__AVX512F__)
constexpr int64_t kLongRowOfSeveral = kLongRow;
constexpr int kMostRowsInRuns = 2;
#else
constexpr int64_t kLongRowOfSeveral = kLongRow + 1;
constexpr int kMostRowsInRuns = 1;
#endif
// Short rows against one row of x are read from kStreams far-apart runs of
// a part at once, a row of each side by side: some cores fetch more with
// several sequential streams in flight. AMD EPYC Zen 2, 32000 x 768 from
// memory, 1 and 2 threads: one stream 16-17 and 24-32 GB/s, two 19-21 and
// 25-38, four 20-22 and 30-43; stories110M decode 66 -> 79-84 tokens/s.
// With several rows of x, short rows are read one at a time, each part one
// sequential stream, except that two rows of x read runs as one does where
// it reads them unprefetched with 512-bit registers: AMD EPYC family 25
// model 17 (Zen 4), 1 GiB of weights of 768 columns, medians of 5 rounds
// against a streaming read, 1 and 2 threads: 0.64-0.65 and 0.87 a row at
// a time, 0.79-0.90 and 0.93 in runs (long rows stay long: 2048 and 8192
// columns, one thread, 0.73-0.77 against 0.65-0.67 in runs).
// AVX2 builds, and AVX-512 ones on AMD, read three runs, long rows (one
// row of x) too, and do not prefetch them: the cores' own prefetchers
// follow three sequential streams best. AMD EPYC family 25 model 1 (Zen 3), one thread, 1 GiB of
// weights, medians of 11-15 passes each against a plain loop reading three
// streams in the same run (the fastest read loop there: two read 0.8-0.9
// of it, four less): 768, 2048 and 8192 columns 0.91, 0.91 and 0.95 this
// way, 0.67, 0.70 and 0.70 with two runs prefetched 16 KiB ahead (long
// rows as pairs of adjacent rows).
// AVX-512 builds choose at run time, by vendor, since both kinds of cores
// have AVX-512: on Intel Xeon family 6 model 207 four runs prefetched
// (below) measured best; three were not tried there. AMD EPYC family 25
// model 17 (Zen 4), one row of x against 1 GiB, one run each against the
// same probe, 8192, 2048 and 768 columns, 1 thread: 0.78, 0.68, 0.69 with
// four prefetched runs (long rows in tiles), 0.85, 0.83, 0.95 with three
// unprefetched (long rows as runs); 2 threads 0.94, 0.92, 0.91 and 0.97,
// 0.99, 0.96.
constexpr int kStreams = 3;
constexpr int kPrefetchedStreams = 4;

// Whether one row of x reads kPrefetchedStreams prefetched runs and long
// rows in tiles (Intel cores with AVX-512), not kStreams runs without
// prefetching, long rows included.
std::atomic<SingleRowReading>& single_row_reading() {
  static std::atomic<SingleRowReading> reading{SingleRowReading::kByCpu};
  return reading;
}

// Whether this AVX-512 build runs on an Intel core: AVX-512 choices that
// differ by vendor (single-row reading, prefetch distance) ask this.
bool avx512_on_intel() {
#if defined(__AVX512F__)
  static const bool intel = __builtin_cpu_is("intel");
  return intel;
#else
  return false;
#endif
}

bool reads_prefetched_runs() {
  switch (single_row_reading().load(std::memory_order_relaxed)) {
    case SingleRowReading::kThreeRuns:
      return false;
    case SingleRowReading::kFourPrefetchedRuns:
      return true;
    case SingleRowReading::kByCpu:
      break;
  }
  return avx512_on_intel();
}

// How far ahead of the FMAs each weight row is prefetched, in floats (4 or
// 16 KiB; past the matrix's end is harmless, a prefetch never faults), into L2.
// Intel Xeon family 6 model 207, 1 GiB weights, against a streaming read at
// 1 and 2 threads: one row of x, 8192 columns 0.73-0.78 and 0.75-0.80
// without, 0.88 and 0.79 with; 768 columns 0.75-0.83 and 0.81-0.86 without,
// 0.90 and 0.92 with. A non-temporal prefetch (into L1 only) did worse
// for several rows than none (8 rows, 8192 columns, from memory: 0.25 of
// the stream against 0.49) and than this one (8 x 4096 x 768 in L3: 2.9
// GB/s against 14), as groups of rows after the first missed the weight
// rows L1 had dropped. On AMD EPYC family 25 model 1 (Zen 3, AVX2, 32 MiB
// L3), one row of x from 1 GiB of 768 and 2048 columns, 1 and 2 threads,
// 2 alternating rounds: 0.33-0.61 of the stream without, 0.43-0.74 with.
// That machine wants the lines further ahead: llama_bench
// stories110M_1dev, one thread, 3 alternating rounds each, decode
// 14.6-16.9 tokens/s (bw_fraction 0.43) with 4 streams and 1024 floats
// ahead, 22.0-25.9 (0.66-0.71) with 2 streams and 2048,
// 29.7-30.1 (0.72-0.74) with 2 streams and 4096; one stream 0.52-0.64.
// Four streams at 4096 and 8192 floats ahead read 0.41-0.47 and 0.35-0.45
// there (3 alternating rounds, against 0.67-0.73 for two at 4096). Three
// streams without prefetching did better still (see kStreams): AVX2 builds
// read one row of x that way, and prefetch 4096 ahead for several.
// AVX-512 builds choose by vendor: Intel keeps what the Xeon measured;
// AMD EPYC family 25 model 17 (Zen 4) reads one row of x as Zen 3 does
// and wants several 4096 ahead too (one thread, 1 GiB of weights, medians
// of 5 rounds against a streaming read: 4 rows of 768 columns 0.58 at
// 1024 floats ahead, 0.78 at 4096, 0.79 at 16384, 0.34 at 256; 8 rows
// 0.40, 0.49, 0.50, 0.25).
int64_t prefetch_ahead() { return avx512_on_intel() ? 1024 : 4096; }

// The floats one round of the chains covers: one vector for each.
constexpr int64_t kStep = kChains * Vec::kLanes;

#if defined(__AVX512F__)
// Two adjacent vectors of a row in one 512-bit register. A round's vectors
// 0 and 1 (or 2 and 3) share one, so its low and high halves continue
// chains 0 and 1 (2 and 3): the same FMAs on the same lanes as Vec, the
// same bits, with half the instructions and loads. Several rows of x cost
// that many FMAs per weight float, which 256-bit FMAs cannot do at the
// stream rate on every core.
struct PairVec {
  using T = __m512;
  static constexpr int64_t kLanes = 16;
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  // The zero-masked forms: GCC 12 falsely warns that the plain ones'
  // undefined pass-through register may be read uninitialized.
  static constexpr __mmask16 kAllLanes = 0xFFFF;
  static T load(const BFloat16* p) {
    const __m512i wide = _mm512_maskz_cvtepu16_epi32(kAllLanes, load_halves(p));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAllLanes, wide, 16));
  }
  static T load(const Float16* p) { return _mm512_maskz_cvtph_ps(kAllLanes, load_halves(p)); }
  static __m256i load_halves(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static T zero() { return _mm512_setzero_ps(); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
};
#else
using PairVec = Vec;
#endif

// Keeps a loaded vector in a register for the several FMAs that share it
// (kShared of them). GCC otherwise folds the load into each FMA as a memory
// operand, so a weight vector shared by eight rows of x was loaded eight
// times and the loads, not the FMAs, bounded several rows of x. AMD EPYC
// family 25 model 17 (Zen 4), one thread, 8192 columns in L2 and L3 (512
// KiB, 8 MiB): 4 rows of x 23 and 27 -> 29 and 35 GB/s, 8 rows 12.5 and 15
// -> 15 and 19.
template <int kShared, class T>
[[gnu::always_inline]] inline void keep_in_register(T& v) {
  if constexpr (kShared > 1) {
#if defined(__AVX512F__)
    asm("" : "+v"(v));
#elif defined(__x86_64__)
    asm("" : "+x"(v));
#endif
  }
}

// Several rows of x against a weight row are summed over blocks of this
// many floats of k in turn: each group of rows of x reads the block's
// weight rows again from L1 (rows of 8192 floats otherwise came from L2,
// eight times), and the chains' partial sums wait in memory between
// blocks, which keeps each sum's order. The first group prefetches the
// next block. Spreading those prefetches over every pass of the block (each
// register's chains, each group) measured no better on Xeon model 207 (8
// rows from memory, 3 alternating rounds: 0.45-0.70 of the stream against
// 0.46-0.66), so it was left out.
constexpr int64_t kRoundsBlock = 1024;

// Long weight rows against four or more rows of x: kLongRowTiles tiles of
// adjacent weight rows take turns over blocks of kTiledBlock floats, so
// that each block of the rows of x (8 x 128 floats: 4 KiB) is read from L1
// by all of them, where one tile at a time read the rows of x again from
// L2 for every tile (they outgrow L1 from 2048 floats on). Xeon model 207,
// one thread, a standalone copy alternating with one tile at a time over
// blocks of 1024 (same bits): 8 rows of 2048 and 8192 columns 1.16-1.23x
// in L3 and 1.17-1.24x from memory, 4 rows of 8192 1.13-1.17x, 2 and 3
// rows 0.96-1.02x (so they keep single tiles); blocks of 64 floats did
// as well, of 256 or 512, or 2, 3 or 8 tiles, less. Not measured on AVX2
// machines, which keep one tile.
#if defined(__AVX512F__)
constexpr int kLongRowTiles = 4;
#else
constexpr int kLongRowTiles = 1;
#endif
constexpr int64_t kTiledBlock = 128;

// Where the weight rows read prefetch_ahead() floats after the current round
// lie. Inside the row while that is short of its end; past it, in the row
// read next: the following row in memory when each tile row is a run of
// rows of its own (one row, or far-apart runs), and the same row of the
// next tile when the tile's rows are adjacent (the rows after them in
// memory belong to the tile itself), at most a row ahead there. Before, a
// tile of adjacent rows prefetched its own next row there, so each tile
// started on demand misses; with short rows (k <= prefetch_ahead()) nearly
// every prefetch of such a tile fell inside it.
struct PrefetchPlan {
  int64_t ahead;    // floats
  int64_t row_end;  // k
  int64_t spill;    // added once the target passes the row's end

  PrefetchPlan(int64_t k, int64_t spacing, int weight_rows) : ahead(prefetch_ahead()), row_end(k), spill(0) {
    if (spacing == 1 && weight_rows > 1) {
      ahead = std::min(ahead, k);
      spill = (weight_rows - 1) * k;
    }
  }

  int64_t offset(int64_t i) const { return i + ahead + (i + ahead >= row_end ? spill : 0); }
};

// Prefetches, into L2, the lines `plan` puts after the round at i of each
// of kWeightRows weight rows (ldw apart).
template <int kWeightRows, class W>
void prefetch_round(const W* w, int64_t ldw, int64_t i, const PrefetchPlan& plan) {
  constexpr int64_t kLine = 64 / sizeof(W);
  const W* ahead = w + plan.offset(i);
#pragma GCC unroll 4
  for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 4
    for (int64_t line = 0; line < kStep; line += kLine) __builtin_prefetch(ahead + r * ldw + line, 0, 2);
  }
}

// Adds the rounds of [begin, end) of k (whole rounds) to the chains of a
// tile: kWeightRows weight rows (ldw apart) against kBatch rows of x, packed
// at xp (see pack_rows: a row's consecutive vectors kXStride floats apart).
// sums holds each output's kChains chains side by side (kStep floats;
// outputs of one weight row sums_ld apart), so a V register holds
// consecutive chains.
template <class V, int kWeightRows, int kBatch, int64_t kXStride, bool kPrefetch, class W>
void add_rounds(const W* w, int64_t ldw, const float* xp, int64_t begin, int64_t end, float* sums, int64_t sums_ld,
                const PrefetchPlan& plan) {
  constexpr int kRegs = static_cast<int>(kStep / V::kLanes);
  typename V::T acc[kWeightRows][kBatch][kRegs];
#pragma GCC unroll 4
  for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 8
    for (int b = 0; b < kBatch; ++b) {
#pragma GCC unroll 4
      for (int c = 0; c < kRegs; ++c) {
        acc[r][b][c] = begin == 0 ? V::zero() : V::load(sums + r * sums_ld + b * kStep + c * V::kLanes);
      }
    }
  }
  const float* round_x = xp + begin / V::kLanes * kXStride;
  for (int64_t i = begin; i < end; i += kStep, round_x += kRegs * kXStride) {
    if constexpr (kPrefetch) prefetch_round<kWeightRows>(w, ldw, i, plan);
#pragma GCC unroll 4
    for (int c = 0; c < kRegs; ++c) {
      typename V::T xv[kBatch];
#pragma GCC unroll 8
      for (int b = 0; b < kBatch; ++b) {
        xv[b] = V::load(round_x + c * kXStride + b * V::kLanes);
        keep_in_register<kWeightRows>(xv[b]);
      }
#pragma GCC unroll 4
      for (int r = 0; r < kWeightRows; ++r) {
        typename V::T wv = V::load(w + r * ldw + i + c * V::kLanes);
        keep_in_register<kBatch>(wv);
#pragma GCC unroll 8
        for (int b = 0; b < kBatch; ++b) acc[r][b][c] = V::fma(wv, xv[b], acc[r][b][c]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 8
    for (int b = 0; b < kBatch; ++b) {
#pragma GCC unroll 4
      for (int c = 0; c < kRegs; ++c) V::store(sums + r * sums_ld + b * kStep + c * V::kLanes, acc[r][b][c]);
    }
  }
}

// add_rounds for several rows of x, one register's chains at a time over
// the whole block: only kWeightRows x kBatch accumulators live at once, so
// the tile can hold each weight and x vector in a register and load it
// once (kWeightRows + kBatch loads for kWeightRows * kBatch FMAs), where a
// core does fewer loads per second than FMAs. Each chain still adds its
// vectors in order: the same bits.
template <class V, int kWeightRows, int kBatch, int64_t kXStride, bool kPrefetch, class W>
void add_rounds_by_register(const W* w, int64_t ldw, const float* xp, int64_t begin, int64_t end, float* sums,
                            int64_t sums_ld, const PrefetchPlan& plan) {
  constexpr int kRegs = static_cast<int>(kStep / V::kLanes);
  for (int c = 0; c < kRegs; ++c) {
    typename V::T acc[kWeightRows][kBatch];
#pragma GCC unroll 4
    for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 8
      for (int b = 0; b < kBatch; ++b) {
        acc[r][b] = begin == 0 ? V::zero() : V::load(sums + r * sums_ld + b * kStep + c * V::kLanes);
      }
    }
    const float* round_x = xp + (begin / V::kLanes + c) * kXStride;
    for (int64_t i = begin; i < end; i += kStep, round_x += kRegs * kXStride) {
      if (kPrefetch && c == 0) prefetch_round<kWeightRows>(w, ldw, i, plan);
      typename V::T xv[kBatch];
      typename V::T wv[kWeightRows];
#pragma GCC unroll 8
      for (int b = 0; b < kBatch; ++b) {
        xv[b] = V::load(round_x + b * V::kLanes);
        keep_in_register<kWeightRows>(xv[b]);
      }
#pragma GCC unroll 4
      for (int r = 0; r < kWeightRows; ++r) {
        wv[r] = V::load(w + r * ldw + i + c * V::kLanes);
        keep_in_register<kBatch>(wv[r]);
      }
#pragma GCC unroll 4
      for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 8
        for (int b = 0; b < kBatch; ++b) acc[r][b] = V::fma(wv[r], xv[b], acc[r][b]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 8
      for (int b = 0; b < kBatch; ++b) V::store(sums + r * sums_ld + b * kStep + c * V::kLanes, acc[r][b]);
    }
  }
}

// add_rounds for kBatch rows of x, kPerRead at a time; only the first
// group prefetches, the others find the weight block in L1.
template <class V, int kWeightRows, int kBatch, int kPerRead, int64_t kXStride, bool kPrefetch, class W>
void add_rounds_in_groups(const W* w, int64_t ldw, const float* xp, int64_t begin, int64_t end, float* sums,
                          int64_t sums_ld, const PrefetchPlan& plan) {
  constexpr int kFirst = kBatch < kPerRead ? kBatch : kPerRead;
  // All of a round's vectors at once while their accumulators fit the
  // registers beside the loads, so that each weight line is used whole
  // when it arrives (a loop of one weight row against 8 rows of x read
  // weights from L3 1.3x faster that way than by register, Xeon model
  // 207); by register beyond.
  if constexpr (kWeightRows * kFirst * (kStep / V::kLanes) > kMaxAccumulators) {
    add_rounds_by_register<V, kWeightRows, kFirst, kXStride, kPrefetch>(w, ldw, xp, begin, end, sums, sums_ld, plan);
  } else {
    add_rounds<V, kWeightRows, kFirst, kXStride, kPrefetch>(w, ldw, xp, begin, end, sums, sums_ld, plan);
  }
  if constexpr (kBatch > kFirst) {
    add_rounds_in_groups<V, kWeightRows, kBatch - kFirst, kPerRead, kXStride, false>(
        w, ldw, xp + kFirst * V::kLanes, begin, end, sums + kFirst * kStep, sums_ld, plan);
  }
}

// Rows of x for the kernels: as given, k floats each one after another
// (for what is left past the whole rounds), and packed for the rounds (see
// pack_rows).
struct XRows {
  const float* rows;
  const float* packed;
};

// The dot product of a weight row and a row of x from its chains after the
// whole rounds (from `whole` on): the whole vectors left over continue the
// chains in order, then the chains add pairwise, the lanes, and the scalar
// tail. The same order for any tile, so a row of x gets the same bits
// alone or in a batch, from any weight row of a tile.
template <class W>
[[gnu::always_inline]] inline float finish_dot(const float* chains, const W* w, const float* x, int64_t whole,
                                               int64_t k) {
  Vec::T acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = Vec::load(chains + c * Vec::kLanes);
  int64_t i = whole;
  for (int c = 0; c < kChains - 1 && i + Vec::kLanes <= k; ++c, i += Vec::kLanes) {
    acc[c] = Vec::fma(Vec::load(w + i), Vec::load(x + i), acc[c]);
  }
  static_assert(kChains == 4, "the sum below adds four chains pairwise");
  float sum = Vec::sum(Vec::add(Vec::add(acc[0], acc[1]), Vec::add(acc[2], acc[3])));
  // Fused, as compilers contract `sum += w[i] * x[i]` for float weights:
  // spelled out so that widened 16-bit weights get those bits too (load:
  // dtype.h's, the weight as a float).
  for (; i < k; ++i) sum = std::fma(shardflow::load(w[i]), x[i], sum);
  return sum;
}

// y[b][r] (+)= weight row r dotted with row b of x, for kWeightRows weight
// rows `spacing` rows apart (1: adjacent) and kBatch rows of x, read
// kPerRead rows of x at a time with registers of V.
// kTiles tiles of adjacent weight rows (spacing 1) take turns block by
// block (see kLongRowTiles).
template <class V, int kWeightRows, int kBatch, int kPerRead, int kTiles = 1, bool kPrefetch = true, class W>
void dot_rows(const W* w, int64_t spacing, int64_t k, const XRows& x, float* y, int64_t ldy, bool accumulate) {
  // Each whole round's first block starts its chains at zero.
  alignas(64) float sums[kTiles][kWeightRows][kBatch][kStep];
  const int64_t ldw = spacing * k;
  const int64_t whole = k / kStep * kStep;
  if (whole == 0) std::fill(&sums[0][0][0][0], &sums[0][0][0][0] + kTiles * kWeightRows * kBatch * kStep, 0.0f);
  constexpr bool kGroups = kBatch > kPerRead;
  const int64_t block = kTiles > 1 ? kTiledBlock : kGroups ? kRoundsBlock : whole;
  const PrefetchPlan plan(k, spacing, kWeightRows * kTiles);
  for (int64_t begin = 0; begin < whole; begin += block) {
    const int64_t end = std::min(whole, begin + block);
    for (int t = 0; t < kTiles; ++t) {
      add_rounds_in_groups<V, kWeightRows, kBatch, kPerRead, kBatch * V::kLanes, kPrefetch>(
          w + t * kWeightRows * ldw, ldw, x.packed, begin, end, &sums[t][0][0][0], kBatch * kStep, plan);
    }
  }
  for (int t = 0; t < kTiles; ++t) {
    for (int r = 0; r < kWeightRows; ++r) {
      const int64_t row = t * kWeightRows + r;
      for (int b = 0; b < kBatch; ++b) {
        const float dot = finish_dot(sums[t][r][b], w + row * ldw, x.rows + b * k, whole, k);
        float& out = y[b * ldy + row * spacing];
        out = accumulate ? out + dot : dot;
      }
    }
  }
}

// The registers for kBatch rows of x: 256-bit for one row (see Vec),
// pairs of vectors for more.
template <int kBatch>
using RowsVec = std::conditional_t<kBatch == 1, Vec, PairVec>;

// kBatch rows of x against rows [begin, end) in kRunCount equal runs, a
// row of each read side by side; returns the first row left over.
template <int kRunCount, bool kPrefetch, int kBatch = 1, class W>
int64_t read_runs(int64_t begin, int64_t end, int64_t k, const W* w, const XRows& x, float* y, int64_t ldy,
                  bool accumulate) {
  const int64_t run = (end - begin) / kRunCount;
  for (int64_t i = 0; i < run; ++i) {
    dot_rows<RowsVec<kBatch>, kRunCount, kBatch, kBatch, 1, kPrefetch>(w + (begin + i) * k, run, k, x, y + begin + i,
                                                                       ldy, accumulate);
  }
  return begin + run * kRunCount;
}

// Rows [begin, end) of y = x B^T for kBatch rows of x.
template <int kBatch, class W>
void gemv_rows(int64_t begin, int64_t end, int64_t k, const W* w, const XRows& x, float* y, int64_t ldy,
               bool accumulate) {
  int64_t r = begin;
  // Short rows in runs (see kStreams): prefetched for one row of x on
  // Intel, unprefetched for one (two with AVX-512) elsewhere.
  const bool prefetching = reads_prefetched_runs();
  const bool prefetched_runs = kBatch == 1 && prefetching;
  const bool unprefetched_runs = kBatch <= kMostRowsInRuns && !prefetching;
  if (kBatch == 1 ? prefetched_runs && k > kLongRow
                  : k >= kLongRowOfSeveral || (kBatch <= kRowsPerRead && kBatch * k > kShortRowsInL1)) {
    constexpr int kTiles = kBatch >= 4 ? kLongRowTiles : 1;
    for (; r + kLongRowTile * kTiles <= end; r += kLongRowTile * kTiles) {
      dot_rows<RowsVec<kBatch>, kLongRowTile, kBatch, kRowsPerLongRead, kTiles>(w + r * k, 1, k, x, y + r, ldy,
                                                                                accumulate);
    }
    for (; r + kLongRowTile <= end; r += kLongRowTile) {
      dot_rows<RowsVec<kBatch>, kLongRowTile, kBatch, kRowsPerLongRead>(w + r * k, 1, k, x, y + r, ldy, accumulate);
    }
  } else if (prefetched_runs) {
    r = read_runs<kPrefetchedStreams, true>(r, end, k, w, x, y, ldy, accumulate);
  } else if (unprefetched_runs) {
    r = read_runs<kStreams, false, kBatch>(r, end, k, w, x, y, ldy, accumulate);
  }
  for (; r < end; ++r) {
    dot_rows<RowsVec<kBatch>, 1, kBatch, kRowsPerRead>(w + r * k, 1, k, x, y + r, ldy, accumulate);
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

// kBatch rows of x (k floats each, one after another) packed for the
// rounds: vector v (kLanes floats) of every row side by side, [whole /
// kLanes][kBatch][kLanes], so that the kernels load a round's vectors at
// constant offsets from one pointer. With a pointer per row, eight rows ran
// out of general registers and reloaded their pointers inside the loop.
// The copy goes into `buffer` (a tensor buffer: 64-byte aligned, cached
// per thread); one row is its own packing and needs none.
template <int64_t kLanes, int kBatch>
const float* pack_rows(const float* x, int64_t k, DenseTensor& buffer) {
  if constexpr (kBatch == 1) {
    return x;
  } else {
    const int64_t whole = k / kStep * kStep;
    buffer = DenseTensor::empty(DType::kF32, {whole * kBatch});
    float* packed = buffer.data_as<float>();
    for (int64_t v = 0; v < whole / kLanes; ++v) {
      for (int b = 0; b < kBatch; ++b) std::copy_n(x + b * k + v * kLanes, kLanes, packed + (v * kBatch + b) * kLanes);
    }
    return packed;
  }
}

}  // namespace

// gemv_f32 for weights of float, BFloat16 or Float16 (widened as loaded).
template <class W>
void gemv_any(int64_t m, int64_t n, int64_t k, const W* b, const float* x, float* y, bool accumulate) {
  const int64_t min_rows = std::max<int64_t>(8, kMinElementsPerPart / std::max<int64_t>(k, 1));
  // The first rows of x: one template per count, so each keeps its
  // accumulators in registers.
  const auto rows_of = [&]<int kBatch>(const float* x_rows, float* y_rows) {
    DenseTensor packed;
    const XRows rows{x_rows, pack_rows<RowsVec<kBatch>::kLanes, kBatch>(x_rows, k, packed)};
    parallel_for(n, min_rows, 8,
                 [&](int64_t begin, int64_t end) { gemv_rows<kBatch>(begin, end, k, b, rows, y_rows, n, accumulate); });
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

void gemv_f32(int64_t m, int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate) {
  gemv_any(m, n, k, b, x, y, accumulate);
}

void gemv_f32(int64_t m, int64_t n, int64_t k, const BFloat16* b, const float* x, float* y, bool accumulate) {
  gemv_any(m, n, k, b, x, y, accumulate);
}

void gemv_f32(int64_t m, int64_t n, int64_t k, const Float16* b, const float* x, float* y, bool accumulate) {
  gemv_any(m, n, k, b, x, y, accumulate);
}

void gemv_transposed_f32(int64_t n, int64_t k, const float* b, const float* x, float* y, bool accumulate) {
  const int64_t min_columns = std::max<int64_t>(Vec::kLanes, kMinElementsPerPart / std::max<int64_t>(k, 1));
  parallel_for(n, min_columns, Vec::kLanes,
               [&](int64_t begin, int64_t end) { gemv_columns(begin, end, n, k, b, x, y, accumulate); });
}

}  // namespace shardflow::detail

namespace shardflow {

void set_single_row_reading(SingleRowReading reading) {
  detail::single_row_reading().store(reading, std::memory_order_relaxed);
}

}  // namespace shardflow
