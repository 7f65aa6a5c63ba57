// Creation ops (arange, full, zeros, ones, triu, tril) and the seeded random
// ops (shardflow::rand, shardflow::randn) against reference loops, their
// errors and their sharding rules.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <optional>

#include "op_test_util.h"
#include "shardflow/base/error.h"

namespace sf = shardflow;
using namespace shardflow::testing_util;

namespace {

using sf::DType;
using sf::Shape;

const std::vector<Shape> kShapes = {{}, {0}, {3}, {2, 0, 4}, {2, 3}, {1, 2, 3, 2}};

// ------------------------------------------------------------------- arange

struct ArangeRow {
  std::string op;
  std::vector<TestArg> args;
  DType dtype;
  double start, step;  // element i is start + i * step
  int64_t length;
};

TEST(CreationOps, ArangeMatchesReference) {
  const std::vector<ArangeRow> rows = {
      {"aten::arange", {5}, DType::kI64, 0, 1, 5},
      {"aten::arange", {0}, DType::kI64, 0, 1, 0},
      {"aten::arange", {2.5}, DType::kF32, 0, 1, 3},
      {"aten::arange", {5, kw("dtype", DType::kF32)}, DType::kF32, 0, 1, 5},
      {"aten::arange", {5, kw("dtype", DType::kI32)}, DType::kI32, 0, 1, 5},
      {"aten::arange", {4, kw("dtype", DType::kF16)}, DType::kF16, 0, 1, 4},
      {"aten::arange.start", {2, 7}, DType::kI64, 2, 1, 5},
      {"aten::arange.start", {-3, 0}, DType::kI64, -3, 1, 3},
      {"aten::arange.start", {5, 5}, DType::kI64, 5, 1, 0},
      {"aten::arange.start", {0.5, 3}, DType::kF32, 0.5, 1, 3},
      {"aten::arange.start", {0.5, 4, kw("dtype", DType::kI64)}, DType::kI64, 0, 1, 4},  // start truncated
      {"aten::arange.start_step", {0, 10, 3}, DType::kI64, 0, 3, 4},
      {"aten::arange.start_step", {10, 0, -3}, DType::kI64, 10, -3, 4},
      {"aten::arange.start_step", {-5, 5, 5}, DType::kI64, -5, 5, 2},
      {"aten::arange.start_step", {0, 1, 0.25}, DType::kF32, 0, 0.25, 4},
      {"aten::arange.start_step", {1, -1, -0.5}, DType::kF32, 1, -0.5, 4},
      {"aten::arange.start_step", {0, 1, 0.1}, DType::kF32, 0, 0.1, 10},
      {"aten::arange.start_step", {0, 2, 0.5, kw("dtype", DType::kBF16)}, DType::kBF16, 0, 0.5, 4},
      {"aten::arange.start_step", {0, 7, 2, kw("dtype", DType::kI32)}, DType::kI32, 0, 2, 4},
      {"aten::arange.start_step", {3, 4, 2}, DType::kI64, 3, 2, 1},
  };
  for (const ArangeRow& row : rows) {
    const auto out = call(row.op, row.args);
    EXPECT_EQ(out.dtype(), row.dtype) << row.op;
    ASSERT_EQ(out.shape(), Shape{row.length}) << row.op;
    std::vector<double> expected;
    for (int64_t i = 0; i < row.length; ++i) expected.push_back(row.start + static_cast<double>(i) * row.step);
    EXPECT_TRUE(all_close(to_doubles(out), expected, 1e-7, 1e-7)) << row.op;
  }
}

TEST(CreationOps, ArangeRandomIntegerAndFloatRanges) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int64_t> bound(-50, 50), stride(1, 7);
  for (int trial = 0; trial < 200; ++trial) {
    int64_t start = bound(rng), end = bound(rng);
    const int64_t step = end >= start ? stride(rng) : -stride(rng);
    const auto out = call("aten::arange.start_step", {start, end, step});
    std::vector<double> expected;
    for (int64_t v = start; step > 0 ? v < end : v > end; v += step) expected.push_back(static_cast<double>(v));
    EXPECT_EQ(to_doubles(out), expected) << start << " " << end << " " << step;

    const double fstart = static_cast<double>(start) / 4, fend = static_cast<double>(end) / 3;
    const double fstep = (fend >= fstart ? 1 : -1) * static_cast<double>(stride(rng)) / 8;
    const auto fout = call("aten::arange.start_step", {fstart, fend, fstep});
    std::vector<double> fexpected;
    for (int64_t i = 0; i < static_cast<int64_t>(std::ceil((fend - fstart) / fstep)); ++i) {
      fexpected.push_back(static_cast<float>(fstart + static_cast<double>(i) * fstep));
    }
    EXPECT_TRUE(all_close(to_doubles(fout), fexpected, 1e-6, 1e-6)) << fstart << " " << fend << " " << fstep;
  }
}

TEST(CreationOps, ArangeErrors) {
  const double inf = std::numeric_limits<double>::infinity();
  expect_errors({
      {"aten::arange.start_step", {0, 5, 0}, "step must be nonzero"},
      {"aten::arange.start_step", {0.0, 5.0, 0.0}, "step must be nonzero"},
      {"aten::arange.start_step", {0, 5, 0.5, kw("dtype", DType::kI64)}, "step must be nonzero"},  // truncated
      {"aten::arange.start_step", {0, 5, -1}, "upper bound and larger bound inconsistent with step sign"},
      {"aten::arange.start_step", {5, 0, 1}, "upper bound and larger bound inconsistent with step sign"},
      {"aten::arange.start_step", {5.0, 0.0, 0.5}, "upper bound and larger bound inconsistent with step sign"},
      {"aten::arange", {-1}, "upper bound and larger bound inconsistent with step sign"},
      {"aten::arange.start", {0, inf}, "unsupported range: 0 -> inf"},
      {"aten::arange", {5, kw("dtype", DType::kBool)}, "\"arange_cpu\" not implemented for 'Bool'"},
      {"aten::arange", {1e30, kw("dtype", DType::kI64)}, "value cannot be converted to type int64_t without overflow"},
      {"aten::arange.start_step",
       {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 1}, "invalid size, possible overflow?"},
      {"aten::arange.start", {-1e300, 1e300}, "invalid size, possible overflow?"},
  });
}

// ------------------------------------------------------- full, zeros, ones

TEST(CreationOps, ZerosOnesFullMatchReference) {
  for (const Shape& shape : kShapes) {
    for (const char* op : {"aten::zeros", "aten::ones"}) {
      const double value = std::string(op) == "aten::ones" ? 1 : 0;
      const auto plain = call(op, {shape});
      EXPECT_EQ(plain.dtype(), DType::kF32);
      EXPECT_EQ(plain.shape(), shape);
      EXPECT_EQ(to_doubles(plain), std::vector<double>(static_cast<std::size_t>(sf::numel(shape)), value));
      for (DType dtype : sf::kAllDTypes) {
        const auto typed = call(op, {shape, kw("dtype", dtype)});
        EXPECT_EQ(typed.dtype(), dtype);
        EXPECT_EQ(to_doubles(typed), std::vector<double>(static_cast<std::size_t>(sf::numel(shape)), value));
      }
    }
    // full: the dtype follows the value unless given.
    const struct {
      TestArg value;
      std::optional<DType> dtype;
      DType expected_dtype;
      double expected;
    } fills[] = {{true, {}, DType::kBool, 1},           {3, {}, DType::kI64, 3},
                 {-2.5, {}, DType::kF32, -2.5},         {7, DType::kI32, DType::kI32, 7},
                 {1.5, DType::kBF16, DType::kBF16, 1.5}, {-1.75, DType::kI64, DType::kI64, -1},
                 {0.0, DType::kBool, DType::kBool, 0},  {0.25, DType::kBool, DType::kBool, 1},
                 {false, DType::kF16, DType::kF16, 0},  {65504, DType::kF16, DType::kF16, 65504}};
    for (const auto& fill : fills) {
      std::vector<TestArg> args = {shape, fill.value};
      if (fill.dtype) args.push_back(kw("dtype", *fill.dtype));
      const auto out = call("aten::full", args);
      EXPECT_EQ(out.dtype(), fill.expected_dtype);
      EXPECT_EQ(out.shape(), shape);
      EXPECT_EQ(to_doubles(out), std::vector<double>(static_cast<std::size_t>(sf::numel(shape)), fill.expected));
    }
  }
}

TEST(CreationOps, FillErrors) {
  expect_errors({
      {"aten::zeros", {std::vector<int64_t>{2, -1}}, "Trying to create tensor with negative dimension -1: [2, -1]"},
      {"aten::ones", {std::vector<int64_t>{-3}}, "Trying to create tensor with negative dimension -3: [-3]"},
      {"aten::full", {std::vector<int64_t>{-1, 2}, 1.0}, "negative dimension -1"},
      {"aten::full", {std::vector<int64_t>{2}, 1e20, kw("dtype", DType::kI32)},
       "value cannot be converted to type int without overflow"},
      {"aten::full", {std::vector<int64_t>{2}, int64_t{1} << 40, kw("dtype", DType::kI32)},
       "value cannot be converted to type int without overflow"},
      {"aten::full", {std::vector<int64_t>{1}, 1e300}, "value cannot be converted to type float without overflow"},
      {"aten::full", {std::vector<int64_t>{1}, 70000, kw("dtype", DType::kF16)},
       "value cannot be converted to type at::Half without overflow"},
      {"aten::full", {std::vector<int64_t>{1}, std::nan(""), kw("dtype", DType::kI64)},
       "value cannot be converted to type int64_t without overflow"},
  });
  // Infinities and NaN are fine in float dtypes.
  EXPECT_TRUE(std::isinf(to_doubles(call("aten::full", {std::vector<int64_t>{1}, HUGE_VAL, kw("dtype", DType::kF16)}))[0]));
  EXPECT_TRUE(std::isnan(to_doubles(call("aten::full", {std::vector<int64_t>{1}, std::nan("")}))[0]));
}

// --------------------------------------------------------------- triu, tril

TEST(CreationOps, TriuTrilMatchReference) {
  std::mt19937 rng(2);
  const std::vector<Shape> shapes = {{3, 4}, {4, 3}, {2, 3, 5}, {0, 3}, {2, 2, 0}, {1, 1}, {2, 1, 3, 3}};
  const int64_t diagonals[] = {std::numeric_limits<int64_t>::min(), -5, -1, 0, 1, 2, 10,
                               std::numeric_limits<int64_t>::max()};
  int case_number = 0;
  for (const Shape& shape : shapes) {
    for (int64_t diagonal : diagonals) {
      const DType dtype = sf::kAllDTypes[case_number++ % 6];
      const auto x = random_tensor(dtype, shape, rng, 1, 9);  // nonzero ints, so zeros come from the mask
      for (const bool upper : {true, false}) {
        const auto out = call(upper ? "aten::triu" : "aten::tril", {x, diagonal});
        EXPECT_EQ(out.dtype(), dtype);
        ASSERT_EQ(out.shape(), shape);
        std::vector<double> expected;
        const int64_t cols = shape.back(), rows = shape[shape.size() - 2];
        for (int64_t flat = 0; flat < x.numel(); ++flat) {
          const int64_t j = flat % cols, i = flat / cols % rows;
          const bool keep = upper ? j - i >= diagonal : j - i <= diagonal;
          expected.push_back(keep ? element(x, flat) : 0.0);
        }
        EXPECT_EQ(to_doubles(out), expected) << (upper ? "triu " : "tril ") << sf::shape_to_string(shape)
                                             << " diagonal " << diagonal;
      }
    }
  }
  // The default diagonal is 0.
  const auto m = from_floats({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(to_doubles(call("aten::triu", {m})), (std::vector<double>{1, 2, 0, 4}));
  EXPECT_EQ(to_doubles(call("aten::tril", {m})), (std::vector<double>{1, 0, 3, 4}));
}

TEST(CreationOps, TriuTrilErrors) {
  expect_errors({
      {"aten::triu", {from_floats({1, 2}, {2})}, "triu: input tensor must have at least 2 dimensions"},
      {"aten::tril", {from_floats({1}, {})}, "tril: input tensor must have at least 2 dimensions"},
  });
}

TEST(CreationOps, ShardingRules) {
  EXPECT_EQ(run_op("aten::zeros", {std::vector<int64_t>{4, 8}}).rule.to_string(), "()->([i, j]) {i=4, j=8}");
  EXPECT_EQ(run_op("aten::full", {std::vector<int64_t>{}, 1.0}).rule.to_string(), "()->([]) {}");
  EXPECT_EQ(run_op("aten::arange", {6}).rule.to_string(), "()->([i]) {i=6}");
  std::mt19937 rng(3);
  EXPECT_EQ(run_op("aten::triu", {random_tensor(DType::kF32, {2, 4, 5}, rng)}).rule.to_string(),
            "([i, j, k])->([i, j, k]) {i=2, j=4, k=5} need_replication={j, k}");
  EXPECT_EQ(run_op("aten::tril", {random_tensor(DType::kF32, {4, 5}, rng), -1}).rule.to_string(),
            "([i, j])->([i, j]) {i=4, j=5} need_replication={i, j}");
}

// ------------------------------------------------------------ rand, randn

// The generator as creation.cc documents it, written out again: element i
// of a tensor drawn with `seed` from (seed, i) alone.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t bits(int64_t seed, uint64_t counter) {
  return mix(mix(static_cast<uint64_t>(seed)) + (counter + 1) * 0x9E3779B97F4A7C15ULL);
}

double reference_uniform(int64_t seed, int64_t i, int significand = 24) {
  return std::ldexp(static_cast<double>(bits(seed, static_cast<uint64_t>(i)) >> (64 - significand)), -significand);
}

double reference_normal(int64_t seed, int64_t i) {
  const auto c = static_cast<uint64_t>(i);
  const double u1 = (static_cast<double>(bits(seed, 2 * c) >> 11) + 1) * 0x1p-53;
  const double u2 = static_cast<double>(bits(seed, 2 * c + 1) >> 11) * 0x1p-53;
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
}

sf::DenseTensor uniform_draw(Shape shape, int64_t seed, DType dtype = DType::kF32) {
  return call("shardflow::rand", {std::vector<int64_t>(shape), seed, kw("dtype", dtype)});
}

sf::DenseTensor normal_draw(Shape shape, int64_t seed, DType dtype = DType::kF32) {
  return call("shardflow::randn", {std::vector<int64_t>(shape), seed, kw("dtype", dtype)});
}

TEST(RandomOps, WholeTensorIsItsElementsDrawnOneByOne) {
  for (int64_t seed : {int64_t{0}, int64_t{1}, int64_t{-7}, int64_t{123456789}}) {
    for (const Shape& shape : kShapes) {
      const auto u = uniform_draw(shape, seed);
      const auto z = normal_draw(shape, seed);
      ASSERT_EQ(u.shape(), shape);
      ASSERT_EQ(z.shape(), shape);
      std::vector<double> uniform, normal;
      for (int64_t i = 0; i < sf::numel(shape); ++i) {
        uniform.push_back(static_cast<float>(reference_uniform(seed, i)));
        normal.push_back(static_cast<float>(reference_normal(seed, i)));
      }
      EXPECT_EQ(to_doubles(u), uniform) << seed << " " << sf::shape_to_string(shape);
      EXPECT_TRUE(all_close(to_doubles(z), normal, 1e-6, 1e-7)) << seed << " " << sf::shape_to_string(shape);
    }
  }
}

TEST(RandomOps, ElementsDependOnTheFlatIndexNotTheShape) {
  for (const char* op : {"shardflow::rand", "shardflow::randn"}) {
    const auto flat = to_doubles(call(op, {std::vector<int64_t>{24}, 5}));
    EXPECT_EQ(to_doubles(call(op, {std::vector<int64_t>{2, 3, 4}, 5})), flat) << op;
    EXPECT_EQ(to_doubles(call(op, {std::vector<int64_t>{4, 6}, 5})), flat) << op;
    auto longer = to_doubles(call(op, {std::vector<int64_t>{100}, 5}));
    longer.resize(24);
    EXPECT_EQ(longer, flat) << op;
    // The default dtype is f32, and the same call gives the same tensor.
    EXPECT_EQ(to_doubles(call(op, {std::vector<int64_t>{24}, 5})), flat) << op;
    EXPECT_EQ(call(op, {std::vector<int64_t>{24}, 5}).dtype(), DType::kF32);
  }
}

TEST(RandomOps, DifferentSeedsDiffer) {
  for (const char* op : {"shardflow::rand", "shardflow::randn"}) {
    std::vector<std::vector<double>> draws;
    for (int64_t seed : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{-1}, int64_t{1} << 40}) {
      draws.push_back(to_doubles(call(op, {std::vector<int64_t>{1000}, seed})));
    }
    for (std::size_t a = 0; a < draws.size(); ++a) {
      for (std::size_t b = a + 1; b < draws.size(); ++b) {
        int equal = 0;
        for (std::size_t i = 0; i < 1000; ++i) equal += draws[a][i] == draws[b][i];
        EXPECT_LT(equal, 5) << op << " seeds #" << a << " and #" << b;
      }
    }
  }
}

// Mean, variance and lag-1 correlation of a sample.
struct Moments {
  double mean = 0, variance = 0, lag1 = 0;
};

Moments moments(const std::vector<double>& x) {
  Moments m;
  const auto n = static_cast<double>(x.size());
  for (double v : x) m.mean += v / n;
  for (double v : x) m.variance += (v - m.mean) * (v - m.mean) / n;
  for (std::size_t i = 0; i + 1 < x.size(); ++i) m.lag1 += (x[i] - m.mean) * (x[i + 1] - m.mean) / (n - 1);
  m.lag1 /= m.variance;
  return m;
}

// Tolerances: about 5 standard errors for n = 100k.
TEST(RandomOps, UniformStatistics) {
  const auto x = to_doubles(uniform_draw({100000}, 42));
  const Moments m = moments(x);
  EXPECT_NEAR(m.mean, 0.5, 0.005);
  EXPECT_NEAR(m.variance, 1.0 / 12, 0.0012);
  EXPECT_NEAR(m.lag1, 0, 0.016);
  EXPECT_GE(*std::min_element(x.begin(), x.end()), 0.0);
  EXPECT_LT(*std::max_element(x.begin(), x.end()), 1.0);
  // Each tenth of [0, 1) holds about a tenth of the samples (binomial sd ~95).
  std::vector<int> bins(10, 0);
  for (double v : x) ++bins[static_cast<std::size_t>(v * 10)];
  for (int count : bins) EXPECT_NEAR(count, 10000, 500);
}

TEST(RandomOps, NormalStatistics) {
  const auto x = to_doubles(normal_draw({100000}, 42));
  const Moments m = moments(x);
  EXPECT_NEAR(m.mean, 0, 0.016);
  EXPECT_NEAR(m.variance, 1, 0.023);
  EXPECT_NEAR(m.lag1, 0, 0.016);
  const auto within_one = std::count_if(x.begin(), x.end(), [](double v) { return std::abs(v) < 1; });
  EXPECT_NEAR(static_cast<double>(within_one) / 1e5, 0.6827, 0.0075);
}

TEST(RandomOps, SixteenBitDtypes) {
  const auto full = uniform_draw({5000}, 9);
  for (const auto& [dtype, significand] : std::vector<std::pair<DType, int>>{{DType::kBF16, 8}, {DType::kF16, 11}}) {
    const auto u = uniform_draw({5000}, 9, dtype);
    EXPECT_EQ(u.dtype(), dtype);
    // The f32 value rounded down to the dtype's significand: in [0, 1), never 1.
    std::vector<double> expected;
    for (int64_t i = 0; i < 5000; ++i) {
      expected.push_back(std::floor(std::ldexp(element(full, i), significand)) * std::ldexp(1.0, -significand));
      EXPECT_EQ(element(u, i), reference_uniform(9, i, significand));
    }
    EXPECT_EQ(to_doubles(u), expected);
    const auto z = normal_draw({5000}, 9, dtype);
    EXPECT_EQ(z.dtype(), dtype);
    EXPECT_TRUE(all_close(to_doubles(z), to_doubles(normal_draw({5000}, 9)), std::ldexp(1.0, -significand), 1e-7));
  }
}

// The .seed_tensor overloads read their seed from a 0-dim i64 tensor at run
// time and draw what the constant-seeded form draws with that seed.
TEST(RandomOps, SeedTensorDrawsAsTheConstantSeed) {
  for (int64_t seed : {int64_t{0}, int64_t{-7}, int64_t{1} << 61}) {
    for (const Shape& shape : kShapes) {
      const auto seed_tensor = from_ints({seed}, {});
      EXPECT_EQ(to_doubles(call("shardflow::rand.seed_tensor", {std::vector<int64_t>(shape), seed_tensor})),
                to_doubles(uniform_draw(shape, seed)));
      EXPECT_EQ(to_doubles(call("shardflow::randn.seed_tensor",
                                {std::vector<int64_t>(shape), seed_tensor, kw("dtype", DType::kBF16)})),
                to_doubles(normal_draw(shape, seed, DType::kBF16)));
    }
  }
  EXPECT_EQ(run_op("shardflow::rand.seed_tensor", {std::vector<int64_t>{4, 8}, from_ints({1}, {})}).rule.to_string(),
            "([])->([i, j]) {i=4, j=8}");
}

TEST(RandomOps, ErrorsAndRule) {
  expect_errors({
      {"shardflow::rand", {std::vector<int64_t>{2}, 0, kw("dtype", DType::kI64)},
       "\"check_uniform_bounds\" not implemented for 'Long'"},
      {"shardflow::randn", {std::vector<int64_t>{2}, 0, kw("dtype", DType::kBool)},
       "\"normal_kernel_cpu\" not implemented for 'Bool'"},
      {"shardflow::rand", {std::vector<int64_t>{2, -2}, 0}, "Trying to create tensor with negative dimension -2: [2, -2]"},
      {"shardflow::randn", {std::vector<int64_t>{2}}, "missing value for argument 'seed'"},
      {"shardflow::rand.seed_tensor", {std::vector<int64_t>{2}, from_ints({1, 2}, {2})},
       "the seed must be a 0-dim i64 tensor, got i64[2]"},
      {"shardflow::randn.seed_tensor", {std::vector<int64_t>{2}, from_floats({1}, {})},
       "the seed must be a 0-dim i64 tensor, got f32[]"},
  });
  EXPECT_EQ(run_op("shardflow::randn", {std::vector<int64_t>{4, 8}, 0}).rule.to_string(), "()->([i, j]) {i=4, j=8}");
}

}  // namespace
