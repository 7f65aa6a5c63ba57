// The GEMM paths. A few rows of A (decode steps): our matrix-vector kernels
// against a double-precision reference, the same bits for any number of
// kernel threads, and for a row alone or in a batch. More rows: oneDNN on
// fixed blocks, the same bits for any number of threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "op_test_util.h"
#include "shardflow/tensor/gemm.h"

extern "C" {  // libgomp's, under oneDNN
int omp_get_max_threads();
void omp_set_num_threads(int threads);
}

namespace sf = shardflow;
using shardflow::testing_util::KernelThreads;

namespace {

std::vector<float> random_floats(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& v : values) v = dist(rng);
  return values;
}

struct Case {
  int64_t m, n, k;
  bool transpose_b, accumulate;
};

std::string name(const Case& c) {
  return "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         (c.transpose_b ? " B n x k" : " B k x n") + (c.accumulate ? " accumulate" : "");
}

std::vector<float> run(const Case& c, const std::vector<float>& a, const std::vector<float>& b,
                       const std::vector<float>& c_in) {
  std::vector<float> out = c_in;
  sf::gemm_f32({c.m, c.n, c.k, false, c.transpose_b}, a.data(), b.data(), out.data(), c.accumulate);
  return out;
}

void expect_matches_reference(const Case& c) {
  const auto a = random_floats(c.m * c.k, 1);
  const auto b = random_floats(c.n * c.k, 2);
  const auto c_in = random_floats(c.m * c.n, 3);
  const std::vector<float> out = run(c, a, b, c_in);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t t = 0; t < c.k; ++t) {
        const double bv = c.transpose_b ? b[static_cast<std::size_t>(j * c.k + t)] : b[static_cast<std::size_t>(t * c.n + j)];
        sum += a[static_cast<std::size_t>(i * c.k + t)] * bv;
        magnitude += std::abs(a[static_cast<std::size_t>(i * c.k + t)] * bv);
      }
      const std::size_t at = static_cast<std::size_t>(i * c.n + j);
      if (c.accumulate) sum += c_in[at];
      const double tolerance = 1e-6 * (magnitude + 1) * std::sqrt(static_cast<double>(c.k) + 1);
      ASSERT_NEAR(out[at], sum, tolerance) << name(c) << " at (" << i << ", " << j << ")";
    }
  }
}

const std::vector<Case> kShapes = {
    {1, 1, 1, true, false},     {1, 3, 5, true, false},     {2, 5, 17, true, true},   {1, 4, 16, false, false},
    {1, 37, 100, false, true},  {2, 300, 288, true, false}, {1, 1000, 33, false, false},
    {1, 4099, 64, true, true},  {2, 257, 129, false, true}, {1, 768, 288, true, false},
    {1, 0, 7, true, false},     {1, 5, 0, false, false},    {1, 6, 0, true, true},
    {3, 100, 70, true, false},  {4, 515, 288, true, true},  {5, 33, 17, true, false}, {8, 260, 96, true, true},
    {7, 9, 300, true, false},   {9, 64, 40, true, false},   {3, 40, 50, false, false},
    // Rows of x past L1: weight rows read side by side, then the rows left over.
    {1, 7, 2049, true, false},  {1, 9, 4101, true, true},   {2, 6, 2080, true, false}, {3, 13, 3000, true, true},
    {8, 10, 2333, true, false}, {5, 4, 8192, true, true},
    // Four or more rows of x against long rows: tiles take turns over short
    // blocks, 16 weight rows at a time, then the tiles and rows left over.
    {6, 37, 2100, true, true},  {4, 70, 4096, true, false},
};

TEST(Gemv, MatchesADoublePrecisionReferenceOnOneThread) {
  const KernelThreads one(1);
  for (const Case& c : kShapes) expect_matches_reference(c);
}

TEST(Gemv, MatchesADoublePrecisionReferenceOnThreeThreads) {
  const KernelThreads three(3);
  for (const Case& c : kShapes) expect_matches_reference(c);
}

// Each output element is summed in one order whatever the split, so a
// decode step gives the same bits on any core count.
TEST(Gemv, GivesTheSameBitsForAnyThreadCount) {
  for (const Case& c : {Case{1, 2053, 300, true, false}, Case{2, 4096, 96, true, true},
                        Case{1, 3001, 160, false, false}, Case{2, 1500, 400, false, true},
                        Case{4, 1030, 288, true, false}, Case{7, 600, 130, true, true},
                        Case{1, 1030, 2500, true, false}, Case{6, 203, 4100, true, true}}) {
    const auto a = random_floats(c.m * c.k, 4);
    const auto b = random_floats(c.n * c.k, 5);
    const auto c_in = random_floats(c.m * c.n, 6);
    std::vector<float> single;
    {
      const KernelThreads one(1);
      single = run(c, a, b, c_in);
    }
    for (int threads : {2, 3, 5}) {
      const KernelThreads many(threads);
      const int64_t split_before = sf::parallel_kernel_calls();
      EXPECT_EQ(run(c, a, b, c_in), single) << name(c) << " on " << threads << " threads";
      EXPECT_GT(sf::parallel_kernel_calls(), split_before) << name(c) << ": the call was not split";
    }
  }
}

TEST(Gemv, SmallProductsStayOnTheCallingThread) {
  const KernelThreads two(2);
  const int64_t split_before = sf::parallel_kernel_calls();
  expect_matches_reference({1, 64, 64, true, false});
  EXPECT_EQ(sf::parallel_kernel_calls(), split_before);
}

// A batch of up to 8 decode rows reads the weights once, and each row gets
// the bits it gets alone: such a batch does not change a sequence's tokens.
TEST(Gemv, EachRowOfABatchGetsTheBitsItGetsAlone) {
  for (const int threads : {1, 3}) {
    const KernelThreads scope(threads);
    // k = 291, 311: two rows of x read far-apart runs of weight rows
    // (AVX-512 on AMD), more one weight row at a time; k = 5: only the
    // scalar tail; k = 2048: the longest rows read one at a time with AVX2
    // (two blocks where the rows of x come in groups), side by side as long
    // rows are with AVX-512; k = 2333:
    // weight rows read side by side (three blocks and a tail where the rows
    // of x come in groups: beyond 4 with AVX-512).
    for (const auto& [n, k] :
         {std::pair<int64_t, int64_t>{517, 291}, {129, 311}, {300, 5}, {37, 2048}, {23, 2333}}) {
      const auto b = random_floats(n * k, 8);
      for (int64_t m = 2; m <= 8; ++m) {
        const auto a = random_floats(m * k, 9 + static_cast<uint32_t>(m));
        const auto c_in = random_floats(m * n, 20 + static_cast<uint32_t>(m));
        const std::vector<float> batch = run({m, n, k, true, true}, a, b, c_in);
        for (int64_t i = 0; i < m; ++i) {
          const std::vector<float> row(a.begin() + i * k, a.begin() + (i + 1) * k);
          const std::vector<float> row_in(c_in.begin() + i * n, c_in.begin() + (i + 1) * n);
          const std::vector<float> alone = run({1, n, k, true, true}, row, b, row_in);
          EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batch.begin() + i * n))
              << "row " << i << " of " << m << ", k " << k << ", " << threads << " threads";
        }
      }
    }
  }
}

// 16-bit weights (bf16, f16) are read as stored and widened in registers:
// every path (one row from far-apart runs, long rows side by side, batches
// of x, scalar tails; GEMM beyond 8 rows) gives the bits of the float
// kernels on the same weights converted to float, on any thread count.
template <class W>
void expect_bits_of_widened_weights(W (*narrow)(float)) {
  for (const int threads : {1, 3}) {
    const KernelThreads scope(threads);
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{2053, 300}, {517, 291}, {300, 5}, {37, 2048},
                               {23, 2333}, {1030, 2500}}) {
      const auto values = random_floats(n * k, 31);
      std::vector<W> b(values.size());
      std::vector<float> widened(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) {
        b[i] = narrow(values[i]);
        widened[i] = sf::to_float(b[i]);
      }
      for (const int64_t m : {1, 2, 5, 8, 9}) {
        const auto a = random_floats(m * k, 40 + static_cast<uint32_t>(m));
        const auto c_in = random_floats(m * n, 50 + static_cast<uint32_t>(m));
        for (const bool accumulate : {false, true}) {
          std::vector<float> got = c_in, want = c_in;
          sf::gemm_f32({m, n, k, false, true}, a.data(), b.data(), got.data(), accumulate);
          sf::gemm_f32({m, n, k, false, true}, a.data(), widened.data(), want.data(), accumulate);
          EXPECT_EQ(got, want) << "m " << m << " n " << n << " k " << k << ", " << threads << " threads"
                               << (accumulate ? ", accumulating" : "");
        }
      }
    }
  }
}

TEST(Gemv, SixteenBitWeightsGiveTheBitsOfTheirFloatValues) {
  expect_bits_of_widened_weights<sf::BFloat16>(sf::to_bfloat16);
  expect_bits_of_widened_weights<sf::Float16>(sf::to_float16);
}

// Long weight rows are read several side by side (short ones too where
// the rows of x they meet at once pass 32 KiB; against four or more rows of
// x, four such tiles take turns), short ones against one row of x (two
// with AVX-512 on AMD) from several far-apart runs at once, and the rows
// left over one at a time: a row gets the same bits wherever it falls.
TEST(Gemv, EachWeightRowGetsTheSameBitsWhereverItFallsInATile) {
  const KernelThreads one(1);
  for (const auto& [n, k, m] : {std::tuple<int64_t, int64_t, int64_t>{11, 4099, 1}, {11, 4099, 3}, {11, 4099, 8},
                                {23, 300, 1}, {23, 300, 2}, {11, 2048, 5}, {11, 2048, 8},
                                {37, 2048, 4}, {37, 4099, 8}, {23, 300, 8}}) {
    const auto b = random_floats(n * k, 30);
    const auto a = random_floats(m * k, 31);
    const std::vector<float> c_in(static_cast<std::size_t>(m * n), 0.0f);
    const std::vector<float> all = run({m, n, k, true, false}, a, b, c_in);
    for (int64_t skip = 1; skip < 5; ++skip) {  // rows skip..n-1 alone: each moves to another place in a tile
      const std::vector<float> rest_b(b.begin() + skip * k, b.end());
      const std::vector<float> rest_in(static_cast<std::size_t>(m * (n - skip)), 0.0f);
      const std::vector<float> rest = run({m, n - skip, k, true, false}, a, rest_b, rest_in);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = skip; j < n; ++j) {
          ASSERT_EQ(rest[static_cast<std::size_t>(i * (n - skip) + j - skip)], all[static_cast<std::size_t>(i * n + j)])
              << "row " << i << " of x, weight row " << j << " (k " << k << "), first " << skip
              << " weight rows left out";
        }
      }
    }
  }
}

// One row of x reads three unprefetched runs (AMD, AVX2) or four
// prefetched runs with long rows in tiles (Intel with AVX-512), two rows
// three runs (AMD with AVX-512) or a weight row at a time: the same bits
// either way, so a model gives the same tokens on both kinds of CPU.
TEST(Gemv, SingleRowsGetTheSameBitsReadEitherWay) {
  struct Reading {
    explicit Reading(sf::SingleRowReading r) { sf::set_single_row_reading(r); }
    ~Reading() { sf::set_single_row_reading(sf::SingleRowReading::kByCpu); }
  };
  for (const int threads : {1, 2}) {
    const KernelThreads use(threads);
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{37, 300}, {64, 768}, {11, 2048}, {23, 4099}, {5, 9000}}) {
      const auto b = random_floats(n * k, 40);
      for (const int64_t m : {1, 2}) {
        const auto a = random_floats(m * k, 41);
        const std::vector<float> c_in(static_cast<std::size_t>(m * n), 0.0f);
        std::vector<float> three, four;
        {
          const Reading r(sf::SingleRowReading::kThreeRuns);
          three = run({m, n, k, true, false}, a, b, c_in);
        }
        {
          const Reading r(sf::SingleRowReading::kFourPrefetchedRuns);
          four = run({m, n, k, true, false}, a, b, c_in);
        }
        for (int64_t j = 0; j < m * n; ++j) {
          ASSERT_EQ(three[static_cast<std::size_t>(j)], four[static_cast<std::size_t>(j)])
              << "output " << j << " of " << m << " x " << n << ", k " << k << ", " << threads << " thread(s)";
        }
      }
    }
  }
}

// Threads that multiply at the same time share one pool: whoever finds it
// busy computes on its own thread, and every result is right.
TEST(Gemv, ConcurrentCallersGetTheirOwnResults) {
  const KernelThreads two(2);
  const Case c{1, 1024, 256, true, false};
  const auto b = random_floats(c.n * c.k, 7);
  std::vector<std::vector<float>> inputs, expected;
  for (uint32_t t = 0; t < 4; ++t) {
    inputs.push_back(random_floats(c.k, 10 + t));
    expected.push_back(run(c, inputs.back(), b, std::vector<float>(static_cast<std::size_t>(c.n))));
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> callers;
  for (std::size_t t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        if (run(c, inputs[t], b, std::vector<float>(static_cast<std::size_t>(c.n))) != expected[t]) ++mismatches[t];
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// Products of more rows go to oneDNN, single-threaded, on blocks of C
// split over the kernel threads: by columns, or by rows when C has more
// rows. The bits must not depend on the split, and the result is a GEMM.
TEST(Gemm, BlocksSplitOverThreadsGiveTheBitsOfOneThread) {
  struct Shape {
    int64_t m, n, k;
    bool transpose_a, transpose_b, accumulate;
  };
  // Column splits, then row splits, each with all four transpose combinations;
  // then one of each whose blocks are widened to keep oneDNN packing; then
  // two cut both ways (2x2 tiles: squarer than 4 blocks along one side).
  for (const Shape& s : {Shape{128, 768, 288, false, true, false}, Shape{64, 2000, 200, false, false, true},
                         Shape{96, 1500, 160, true, true, false}, Shape{80, 1700, 150, true, false, false},
                         Shape{3000, 40, 256, false, true, false}, Shape{4000, 48, 128, true, false, true},
                         Shape{3000, 40, 256, false, false, false}, Shape{2500, 56, 160, true, true, true},
                         Shape{1024, 800, 32, false, false, false}, Shape{1600, 600, 24, true, true, true},
                         Shape{2200, 2200, 32, false, true, false}, Shape{2100, 1900, 24, true, true, true}}) {
    const std::string label = "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                              (s.transpose_a ? " A^T" : "") + (s.transpose_b ? " B^T" : "");
    const auto a = random_floats(s.m * s.k, 7);
    const auto b = random_floats(s.n * s.k, 8);
    const auto c_in = random_floats(s.m * s.n, 9);
    const auto product = [&] {
      std::vector<float> out = c_in;
      sf::gemm_f32({s.m, s.n, s.k, s.transpose_a, s.transpose_b}, a.data(), b.data(), out.data(), s.accumulate);
      return out;
    };
    std::vector<float> single;
    {
      const KernelThreads one(1);
      single = product();
    }
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = s.accumulate ? c_in[static_cast<std::size_t>(i * s.n + j)] : 0.0;
        for (int64_t t = 0; t < s.k; ++t) {
          const float av = s.transpose_a ? a[static_cast<std::size_t>(t * s.m + i)] : a[static_cast<std::size_t>(i * s.k + t)];
          const float bv = s.transpose_b ? b[static_cast<std::size_t>(j * s.k + t)] : b[static_cast<std::size_t>(t * s.n + j)];
          sum += static_cast<double>(av) * bv;
        }
        ASSERT_NEAR(single[static_cast<std::size_t>(i * s.n + j)], sum, 1e-4) << label << " at (" << i << ", " << j << ")";
      }
    }
    for (int threads : {2, 3}) {
      const KernelThreads many(threads);
      const int64_t split_before = sf::parallel_kernel_calls();
      EXPECT_EQ(product(), single) << label << " on " << threads << " threads";
      EXPECT_GT(sf::parallel_kernel_calls(), split_before) << label << ": the call was not split";
    }
  }
}

}  // namespace

// oneDNN picks its kernels by the CPU's instruction sets: as wide as the
// CPU's, and nothing to say, unless the environment limits them (the CLI
// and Python tests set ONEDNN_MAX_CPU_ISA).
TEST(MatrixKernels, AsWideAsTheCpuWhenNothingLimitsThem) {
  if (std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr || std::getenv("DNNL_MAX_CPU_ISA") != nullptr) {
    GTEST_SKIP() << "the environment limits oneDNN's kernels";
  }
  const sf::MatrixKernelCheck here = sf::check_matrix_kernels();
  EXPECT_EQ(here.kernel_isa, here.cpu_isa);
  EXPECT_EQ(here.note, "");
}

// oneDNN's GEMM runs on OpenMP; each block asks for one thread and gives
// the caller's setting back (PyTorch, in the same process, sets its own).
TEST(Gemm, LeavesTheCallersOpenMpSettingAlone) {
  const int original = omp_get_max_threads();
  omp_set_num_threads(3);
  const auto a = random_floats(64 * 96, 1);
  const auto b = random_floats(96 * 80, 2);
  std::vector<float> c(64 * 80);
  sf::gemm_f32({64, 80, 96, false, false}, a.data(), b.data(), c.data());
  EXPECT_EQ(omp_get_max_threads(), 3);
  omp_set_num_threads(original);
}
