// Reductions (sum, mean, amax, amin, argmax) and softmax / log_softmax
// against straightforward reference loops. To cover a new case, add a row to
// a table.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>

#include "op_test_util.h"
#include "shardflow/base/error.h"

namespace sf = shardflow;
using namespace shardflow::testing_util;

namespace {

using Dims = std::optional<std::vector<int64_t>>;

// Which dims a dim list reduces (every dim for None or []), wrapped.
std::vector<bool> reduced_mask(const Dims& dims, std::size_t rank) {
  std::vector<bool> mask(rank, !dims || dims->empty());
  if (dims) {
    for (int64_t d : *dims) {
      if (rank > 0) mask[static_cast<std::size_t>(d < 0 ? d + static_cast<int64_t>(rank) : d)] = true;
    }
  }
  return mask;
}

sf::Shape result_shape(const sf::Shape& shape, const std::vector<bool>& mask, bool keepdim) {
  sf::Shape out;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d]) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

// The input values that land in each output element, in input order.
std::vector<std::vector<double>> groups(const std::vector<double>& values, const sf::Shape& shape,
                                        const std::vector<bool>& mask) {
  int64_t out_count = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d]) out_count *= shape[d];
  }
  std::vector<std::vector<double>> out(static_cast<std::size_t>(out_count));
  for (std::size_t flat = 0; flat < values.size(); ++flat) {
    // Row-major index of the kept dims only.
    int64_t rest = static_cast<int64_t>(flat), out_index = 0, out_stride = 1;
    for (std::size_t k = shape.size(); k-- > 0;) {
      const int64_t index = rest % shape[k];
      rest /= shape[k];
      if (!mask[k]) {
        out_index += index * out_stride;
        out_stride *= shape[k];
      }
    }
    out[static_cast<std::size_t>(out_index)].push_back(values[flat]);
  }
  return out;
}

double sum_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
double max_of(const std::vector<double>& v) {
  double m = -INFINITY;
  for (double x : v) m = std::isnan(x) || std::isnan(m) ? NAN : std::max(m, x);
  return m;
}
double min_of(const std::vector<double>& v) {
  double m = INFINITY;
  for (double x : v) m = std::isnan(x) || std::isnan(m) ? NAN : std::min(m, x);
  return m;
}

// Floats are compared after the result's rounding (computed in f32 or
// better, then rounded once to the 16-bit types).
double rtol_for(sf::DType dtype) {
  switch (dtype) {
    case sf::DType::kBF16: return 1e-2;
    case sf::DType::kF16: return 2e-3;
    case sf::DType::kF32: return 2e-6;
    default: return 0;
  }
}
double atol_for(sf::DType dtype) { return sf::is_floating(dtype) ? rtol_for(dtype) : 0; }

struct ReduceRow {
  sf::Shape shape;
  Dims dims;  // nullopt: dim=None
};

Dims list(std::vector<int64_t> dims) { return dims; }

const ReduceRow kReduceRows[] = {
    {{}, std::nullopt},         {{}, list({0})},          {{}, list({-1})},
    {{7}, std::nullopt},        {{7}, list({})},          {{7}, list({0})},
    {{3, 5}, list({1})},        {{3, 5}, list({0})},      {{3, 5}, list({-1})},
    {{3, 5}, list({-2, 1})},    {{2, 3, 4}, list({0, 2})}, {{2, 3, 4}, list({1})},
    {{2, 3, 4}, list({-1, 0})}, {{2, 3, 4, 5}, list({1, 3})}, {{2, 3, 4, 5}, list({0, 1})},
    {{2, 3, 4, 5}, list({2, 3})}, {{1, 4, 1}, list({0, 2})}, {{4, 1, 3}, list({1, 2})},
    {{3, 19}, list({1})},       {{19, 33}, list({0})},    {{5, 70}, std::nullopt},
    {{3, 0}, list({1})},        {{3, 0}, list({0})},      {{0}, std::nullopt},
    {{0, 4}, list({0})},        {{2, 0, 3}, list({0, 2})},
};

struct ReduceOpRow {
  const char* op;
  double (*reference)(const std::vector<double>&);
  bool has_dtype;  // sum and mean: dim is required and dtype exists
};

const ReduceOpRow kReduceOps[] = {
    {"aten::amax", max_of, false},
    {"aten::amin", min_of, false},
    {"aten::mean", [](const std::vector<double>& v) { return v.empty() ? NAN : sum_of(v) / double(v.size()); }, true},
    {"aten::sum", sum_of, true},
};

TEST(ReductionOps, MatchReferenceForEveryDtype) {
  std::mt19937 rng(11);
  for (const ReduceOpRow& op : kReduceOps) {
    const std::string name = op.op;
    for (const ReduceRow& row : kReduceRows) {
      for (sf::DType dtype : sf::kAllDTypes) {
        for (bool keepdim : {false, true}) {
          const sf::DenseTensor x = random_tensor(dtype, row.shape, rng);
          const sf::Constant dims = row.dims ? sf::Constant(*row.dims) : sf::Constant();
          const std::string what = name + " " + sf::shape_to_string(row.shape) + " dims " +
                                   dims.to_string() + " " + std::string(sf::dtype_name(dtype)) +
                                   (keepdim ? " keepdim" : "");
          const std::vector<bool> mask = reduced_mask(row.dims, row.shape.size());
          bool reduces_empty = false;
          for (std::size_t d = 0; d < row.shape.size(); ++d) reduces_empty |= mask[d] && row.shape[d] == 0;
          // amax and amin take no None: their default [] reduces every dim.
          const std::vector<TestArg> args = op.has_dtype || row.dims
                                                ? std::vector<TestArg>{x, dims, keepdim}
                                                : std::vector<TestArg>{x, kw("keepdim", keepdim)};
          if ((!op.has_dtype && reduces_empty) || (name == "aten::mean" && !sf::is_floating(dtype))) {
            EXPECT_THROW(call(name, args), sf::Error) << what;
            continue;
          }
          const sf::DenseTensor y = call(name, args);
          const sf::DType expected_dtype =
              name == "aten::sum" && !sf::is_floating(dtype) ? sf::DType::kI64 : dtype;
          EXPECT_EQ(y.dtype(), expected_dtype) << what;
          EXPECT_EQ(y.shape(), result_shape(row.shape, mask, keepdim)) << what;
          std::vector<double> expected;
          for (const auto& group : groups(to_doubles(x), row.shape, mask)) {
            double value = op.reference(group);
            if (expected_dtype == sf::DType::kBool) value = value != 0;
            expected.push_back(value);
          }
          EXPECT_TRUE(all_close(to_doubles(y), expected, rtol_for(expected_dtype), atol_for(expected_dtype)))
              << what;
        }
      }
    }
  }
}

TEST(ReductionOps, DtypeArgumentAndPromotion) {
  const auto ints = from_ints({1, 2, 3, 4}, {2, 2}, sf::DType::kI32);
  const sf::Constant none;
  EXPECT_EQ(call("aten::sum", {ints, none}).dtype(), sf::DType::kI64);
  EXPECT_EQ(call("aten::sum", {from_ints({1, 0, 1}, {3}, sf::DType::kBool), none}).dtype(), sf::DType::kI64);
  EXPECT_EQ(to_doubles(call("aten::sum", {from_ints({1, 0, 1}, {3}, sf::DType::kBool), none})),
            (std::vector<double>{2}));
  const auto as_float = call("aten::sum", {ints, std::vector<int64_t>{1}, kw("dtype", sf::DType::kF32)});
  EXPECT_EQ(as_float.dtype(), sf::DType::kF32);
  EXPECT_EQ(to_doubles(as_float), (std::vector<double>{3, 7}));
  // A dtype converts the input first: 1.5 + 2.5 - 1.5 as i64 is 1 + 2 - 1.
  const auto truncated = call("aten::sum", {from_floats({1.5f, 2.5f, -1.5f}, {3}), none, kw("dtype", sf::DType::kI64)});
  EXPECT_EQ(truncated.dtype(), sf::DType::kI64);
  EXPECT_EQ(to_doubles(truncated), (std::vector<double>{2}));
  EXPECT_EQ(call("aten::sum", {ints, none, kw("dtype", sf::DType::kI32)}).dtype(), sf::DType::kI32);
  const auto mean = call("aten::mean", {ints, std::vector<int64_t>{0}, kw("dtype", sf::DType::kF32)});
  EXPECT_EQ(to_doubles(mean), (std::vector<double>{2, 3}));
  EXPECT_EQ(call("aten::mean", {call("aten::to.dtype", {ints, sf::DType::kBF16}), none, kw("dtype", sf::DType::kF32)}).dtype(),
            sf::DType::kF32);
  // Integer sums wrap around, as PyTorch's do.
  const auto big = from_ints({std::numeric_limits<int64_t>::max(), 1}, {2});
  EXPECT_EQ(sf::testing_util::element(call("aten::sum", {big, none}), 0),
            static_cast<double>(std::numeric_limits<int64_t>::min()));
}

// aten::sum(x) and aten::mean(x) without a dim pick the full reductions, as
// PyTorch's dispatcher does (sum(Tensor self, *, ScalarType? dtype)).
TEST(ReductionOps, FullReductionOverloadsAreChosenWithoutADim) {
  const auto x = from_floats({1, 2, 3, 4, 5, 6}, {2, 3});
  const auto total = call("aten::sum", {x});
  EXPECT_EQ(total.shape(), sf::Shape{});
  EXPECT_EQ(to_doubles(total), (std::vector<double>{21}));
  EXPECT_EQ(to_doubles(call("aten::mean", {x})), (std::vector<double>{3.5}));
  EXPECT_EQ(call("aten::sum", {from_ints({1, 2}, {2}, sf::DType::kI32)}).dtype(), sf::DType::kI64);
  EXPECT_EQ(call("aten::sum", {x, kw("dtype", sf::DType::kBF16)}).dtype(), sf::DType::kBF16);
  // With a dim the dim_IntList overload is still the one.
  EXPECT_EQ(to_doubles(call("aten::sum", {x, std::vector<int64_t>{1}})), (std::vector<double>{6, 15}));
}

// prod over one dim or all of them: integers and bools multiply to i64
// (wrapping), floats in their dtype; an empty product is 1.
TEST(ReductionOps, ProdOverOneDimOrAll) {
  std::mt19937 rng(16);
  for (const ReduceRow& row : kReduceRows) {
    if (row.dims && row.dims->size() > 1) continue;  // prod takes one dim
    for (sf::DType dtype : sf::kAllDTypes) {
      for (bool keepdim : {false, true}) {
        const bool all = !row.dims || row.dims->empty();
        const std::vector<bool> mask = reduced_mask(all ? std::nullopt : row.dims, row.shape.size());
        int64_t reduced = 1;
        for (std::size_t d = 0; d < row.shape.size(); ++d) reduced *= mask[d] ? row.shape[d] : 1;
        if (reduced > 40) continue;
        // Signs and a few factors of 2: products are powers of two, exact in
        // every dtype and inside f16's range.
        std::vector<int64_t> values;
        for (int64_t i = 0; i < sf::numel(row.shape); ++i) {
          const int64_t pick = static_cast<int64_t>(rng() % 16);
          values.push_back(pick == 0 ? 2 : pick == 1 ? -2 : pick % 2 == 0 ? 1 : -1);
        }
        const sf::DenseTensor x = call("aten::to.dtype", {from_ints(values, row.shape), dtype});
        const std::vector<TestArg> args = all ? std::vector<TestArg>{x} : std::vector<TestArg>{x, (*row.dims)[0], keepdim};
        const std::string what = sf::shape_to_string(row.shape) + " " + std::string(sf::dtype_name(dtype));
        const sf::DenseTensor y = call("aten::prod", args);
        const sf::DType expected_dtype = sf::is_floating(dtype) ? dtype : sf::DType::kI64;
        EXPECT_EQ(y.dtype(), expected_dtype) << what;
        EXPECT_EQ(y.shape(), result_shape(row.shape, mask, keepdim && !all)) << what;
        std::vector<double> expected;
        for (const auto& group : groups(to_doubles(x), row.shape, mask)) {
          double product = 1;
          for (double v : group) product *= v;
          expected.push_back(product);
        }
        EXPECT_TRUE(all_close(to_doubles(y), expected, rtol_for(expected_dtype), atol_for(expected_dtype))) << what;
      }
    }
  }
  const auto big = from_ints({std::numeric_limits<int64_t>::max(), 2}, {2});
  EXPECT_EQ(sf::testing_util::element(call("aten::prod", {big}), 0), -2.0);  // wraps, as in PyTorch
  EXPECT_EQ(call("aten::prod", {big, 0, kw("dtype", sf::DType::kF32)}).dtype(), sf::DType::kF32);
}

// topk against sorting each row: largest or smallest first, ties by position,
// NaN the largest, along any dim.
TEST(ReductionOps, TopkMatchesSortingEachRow) {
  const std::vector<float> data{3, 1, NAN, 3, -2, 7, 0, 7, 5, 1, 2, 2};
  const auto x = from_floats(data, {3, 4});
  const auto largest = run_op("aten::topk", {x, 2}).outputs;
  ASSERT_EQ(largest.size(), 2u);
  EXPECT_EQ(largest[0].shape(), (sf::Shape{3, 2}));
  EXPECT_EQ(to_doubles(largest[1]), (std::vector<double>{2, 0, 1, 3, 0, 2}));  // NaN first; 7 at 1 before 7 at 3
  const auto values = to_doubles(largest[0]);
  EXPECT_TRUE(std::isnan(values[0]));
  EXPECT_EQ(std::vector<double>(values.begin() + 1, values.end()), (std::vector<double>{3, 7, 7, 5, 2}));
  const auto smallest = run_op("aten::topk", {x, 3, 0, kw("largest", false)}).outputs;
  EXPECT_EQ(smallest[1].shape(), (sf::Shape{3, 4}));
  EXPECT_EQ(to_doubles(smallest[1]), (std::vector<double>{1, 0, 1, 2, 0, 2, 2, 0, 2, 1, 0, 1}));  // NaN last
  EXPECT_THROW(run_op("aten::topk", {x, 5}), sf::Error);
}

TEST(ReductionOps, LowPrecisionSumsAccumulateWide) {
  // 4096 ones in bf16: a bf16 accumulator would stop at 256.
  const auto ones = call("aten::to.dtype", {from_floats(std::vector<float>(4096, 1.0f), {4096}), sf::DType::kBF16});
  EXPECT_EQ(to_doubles(call("aten::sum", {ones, sf::Constant()})), (std::vector<double>{4096}));
  EXPECT_EQ(to_doubles(call("aten::mean", {ones, sf::Constant()})), (std::vector<double>{1}));
}

TEST(ReductionOps, NanPropagatesThroughAmaxAmin) {
  const auto x = from_floats({1, NAN, 3, 4, 5, 6}, {2, 3});
  const auto max = to_doubles(call("aten::amax", {x, std::vector<int64_t>{1}}));
  const auto min = to_doubles(call("aten::amin", {x, std::vector<int64_t>{0}}));
  EXPECT_TRUE(std::isnan(max[0]));
  EXPECT_EQ(max[1], 6);
  EXPECT_EQ(min[0], 1);
  EXPECT_TRUE(std::isnan(min[1]));
  EXPECT_TRUE(std::isnan(to_doubles(call("aten::sum", {x, sf::Constant()}))[0]));
}

// --------------------------------------------------------------- argmax

struct ArgmaxRow {
  sf::Shape shape;
  std::optional<int64_t> dim;
};

const ArgmaxRow kArgmaxRows[] = {
    {{}, std::nullopt}, {{}, 0},      {{}, -1},       {{7}, std::nullopt}, {{7}, 0},
    {{3, 5}, 1},        {{3, 5}, 0},  {{3, 5}, -2},   {{2, 3, 4}, 1},      {{2, 3, 4}, std::nullopt},
    {{2, 3, 4}, -1},    {{4, 37}, 1}, {{37, 4}, 0},   {{3, 0}, 0},         {{0, 3}, 1},
};

TEST(ReductionOps, ArgmaxMatchesReference) {
  std::mt19937 rng(12);
  for (const ArgmaxRow& row : kArgmaxRows) {
    for (sf::DType dtype : {sf::DType::kF32, sf::DType::kBF16, sf::DType::kF16, sf::DType::kI64, sf::DType::kI32}) {
      for (bool keepdim : {false, true}) {
        // Few distinct values, so ties (first index wins) are common.
        const auto x = call("aten::to.dtype", {random_tensor(sf::DType::kI64, row.shape, rng, -3, 3), dtype});
        const sf::Constant dim = row.dim ? sf::Constant(*row.dim) : sf::Constant();
        const std::string what = sf::shape_to_string(row.shape) + " dim " + dim.to_string() + " " +
                                 std::string(sf::dtype_name(dtype)) + (keepdim ? " keepdim" : "");
        const sf::DenseTensor y = call("aten::argmax", {x, dim, keepdim});
        EXPECT_EQ(y.dtype(), sf::DType::kI64) << what;
        const std::vector<bool> mask =
            reduced_mask(row.dim ? Dims(std::vector<int64_t>{*row.dim}) : std::nullopt, row.shape.size());
        EXPECT_EQ(y.shape(), result_shape(row.shape, mask, keepdim)) << what;
        std::vector<double> expected;
        for (const auto& group : groups(to_doubles(x), row.shape, mask)) {
          std::size_t best = 0;
          for (std::size_t i = 1; i < group.size(); ++i) {
            if (group[i] > group[best]) best = i;
          }
          expected.push_back(static_cast<double>(best));
        }
        EXPECT_EQ(to_doubles(y), expected) << what;
      }
    }
  }
}

TEST(ReductionOps, ArgmaxTakesTheFirstNan) {
  const auto x = from_floats({1, NAN, 5, NAN, 2, 2, 9, 9}, {2, 4});
  EXPECT_EQ(to_doubles(call("aten::argmax", {x, 1})), (std::vector<double>{1, 2}));
  EXPECT_EQ(to_doubles(call("aten::argmax", {x})), (std::vector<double>{1}));
  const auto columns = from_floats({1, 7, NAN, 7, NAN, 7}, {3, 2});
  EXPECT_EQ(to_doubles(call("aten::argmax", {columns, 0})), (std::vector<double>{1, 0}));
  EXPECT_EQ(call("aten::argmax", {columns, kw("keepdim", true)}).shape(), (sf::Shape{1, 1}));
}

// --------------------------------------------------------------- errors

TEST(ReductionOps, ErrorsUsePyTorchMessages) {
  std::mt19937 rng(13);
  const auto x = random_tensor(sf::DType::kF32, {2, 3}, rng);
  const auto empty = random_tensor(sf::DType::kF32, {0, 3}, rng);
  const auto ints = random_tensor(sf::DType::kI32, {2, 3}, rng);
  const std::vector<ErrorRow> rows = {
      {"aten::sum", {x, std::vector<int64_t>{1, -1}}, "dim 1 appears multiple times in the list of dims"},
      {"aten::amax", {x, std::vector<int64_t>{0, 0}}, "dim 0 appears multiple times in the list of dims"},
      {"aten::sum", {x, std::vector<int64_t>{2}},
       "Dimension out of range (expected to be in range of [-2, 1], but got 2)"},
      {"aten::mean", {x, -3}, "Dimension out of range"},
      {"aten::mean", {ints, std::vector<int64_t>{0}},
       "mean(): could not infer output dtype. Input dtype must be either a floating point or complex "
       "dtype. Got: Int"},
      {"aten::mean", {x, sf::Constant(), kw("dtype", sf::DType::kI64)},
       "mean(): could not infer output dtype. Optional dtype must be either a floating point or complex "
       "dtype. Got: Long"},
      {"aten::amax", {empty, std::vector<int64_t>{0}}, "amax(): Expected reduction dim 0 to have non-zero size."},
      {"aten::amin", {empty, std::vector<int64_t>{-2}}, "amin(): Expected reduction dim -2 to have non-zero size."},
      {"aten::amax", {empty}, "amax(): Expected reduction dim to be specified for input.numel() == 0."},
      {"aten::argmax", {empty, 0}, "argmax(): Expected reduction dim 0 to have non-zero size."},
      {"aten::argmax", {empty, -2}, "argmax(): Expected reduction dim 0 to have non-zero size."},
      {"aten::argmax", {empty}, "argmax(): Expected reduction dim to be specified for input.numel() == 0."},
      {"aten::argmax", {random_tensor(sf::DType::kBool, {3}, rng)}, "\"argmax_cpu\" not implemented for 'Bool'"},
      {"aten::argmax", {x, 2}, "Dimension out of range"},
      {"aten::softmax", {ints, -1}, "\"softmax_lastdim_kernel_impl\" not implemented for 'Int'"},
      {"aten::softmax", {ints, 0}, "\"softmax_kernel_impl\" not implemented for 'Int'"},
      {"aten::log_softmax", {ints, 1}, "\"log_softmax_lastdim_kernel_impl\" not implemented for 'Int'"},
      {"aten::log_softmax", {x, 0, kw("dtype", sf::DType::kI64)},
       "\"log_softmax_kernel_impl\" not implemented for 'Long'"},
      {"aten::softmax", {x, 2}, "Dimension out of range"},
  };
  expect_errors(rows);
}

// --------------------------------------------------------------- rules

TEST(ReductionOps, ShardingRules) {
  std::mt19937 rng(14);
  const auto x = random_tensor(sf::DType::kF32, {8, 16}, rng);
  const auto x3 = random_tensor(sf::DType::kF32, {2, 3, 4}, rng);
  const std::vector<int64_t> dim1 = {1};
  const std::vector<std::pair<OpRun, std::string>> rows = {
      {run_op("aten::sum", {x, dim1}), "([i, j])->([i]) {i=8, j=16} reduction={j}"},
      {run_op("aten::sum", {x, dim1, true}), "([i, j])->([i, k]) {i=8, j=16, k=1} reduction={j}"},
      {run_op("aten::mean", {x, sf::Constant()}), "([i, j])->([]) {i=8, j=16} reduction={i, j}"},
      {run_op("aten::amax", {x3, std::vector<int64_t>{0, -1}}),
       "([i, j, k])->([j]) {i=2, j=3, k=4} reduction={i:max, k:max}"},
      {run_op("aten::amin", {x, std::vector<int64_t>{0}, true}),
       "([i, j])->([k, j]) {i=8, j=16, k=1} reduction={i:min}"},
      {run_op("aten::argmax", {x, 1}), "([i, j])->([i]) {i=8, j=16} need_replication={j}"},
      {run_op("aten::prod", {x, 1}), "([i, j])->([i]) {i=8, j=16} need_replication={j}"},
      {run_op("aten::prod", {x}), "([i, j])->([]) {i=8, j=16} need_replication={i, j}"},
      {run_op("aten::argmax", {x}), "([i, j])->([]) {i=8, j=16} need_replication={i, j}"},
      {run_op("aten::softmax", {x, -1}), "([i, j])->([i, j]) {i=8, j=16} need_replication={j}"},
      {run_op("aten::log_softmax", {x3, 0}), "([i, j, k])->([i, j, k]) {i=2, j=3, k=4} need_replication={i}"},
  };
  for (const auto& [run, expected] : rows) {
    EXPECT_EQ(run.rule.to_string(), expected) << run.op->full_name();
  }
}

// --------------------------------------------------------------- softmax

// softmax (or log_softmax) along `dim` in double, row by row.
std::vector<double> reference_softmax(const std::vector<double>& x, const sf::Shape& shape, int64_t dim, bool log) {
  int64_t outer = 1, count = 1, inner = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const int64_t extent = shape[static_cast<std::size_t>(d)];
    if (d < dim) outer *= extent;
    if (d == dim) count = extent;
    if (d > dim) inner *= extent;
  }
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const auto at = [&](int64_t r) { return static_cast<std::size_t>((o * count + r) * inner + i); };
      double top = -INFINITY;
      for (int64_t r = 0; r < count; ++r) top = std::max(top, x[at(r)]);
      double sum = 0;
      for (int64_t r = 0; r < count; ++r) sum += std::exp(x[at(r)] - top);
      for (int64_t r = 0; r < count; ++r) {
        y[at(r)] = log ? x[at(r)] - top - std::log(sum) : std::exp(x[at(r)] - top) / sum;
      }
    }
  }
  return y;
}

struct SoftmaxRow {
  sf::Shape shape;
  int64_t dim;
};

const SoftmaxRow kSoftmaxRows[] = {
    {{}, 0},      {{}, -1},      {{5}, 0},     {{3, 7}, 1},   {{3, 7}, 0},     {{3, 7}, -1},
    {{2, 3, 4}, 1}, {{2, 3, 4}, -3}, {{2, 3, 4}, 2}, {{2, 37}, 1}, {{37, 2}, -2}, {{4, 0}, 1},
    {{0, 3}, 1},  {{1, 1}, 0},
};

TEST(SoftmaxOps, MatchReference) {
  std::mt19937 rng(15);
  for (const char* op : {"aten::softmax", "aten::log_softmax"}) {
    const bool log = std::string(op) == "aten::log_softmax";
    for (const SoftmaxRow& row : kSoftmaxRows) {
      for (sf::DType dtype : {sf::DType::kF32, sf::DType::kBF16, sf::DType::kF16}) {
        // Values in [-8, 8) so that exp spans a useful range.
        const auto x = call("aten::mul", {random_tensor(dtype, row.shape, rng), 4});
        const sf::DenseTensor y = call(op, {x, row.dim});
        const std::string what = std::string(op) + " " + sf::shape_to_string(row.shape) + " dim " +
                                 std::to_string(row.dim) + " " + std::string(sf::dtype_name(dtype));
        EXPECT_EQ(y.dtype(), dtype) << what;
        EXPECT_EQ(y.shape(), row.shape) << what;
        const int64_t dim = row.shape.empty() ? 0 : (row.dim + static_cast<int64_t>(row.shape.size())) %
                                                        static_cast<int64_t>(row.shape.size());
        const double tol = dtype == sf::DType::kF32 ? 1e-5 : (dtype == sf::DType::kF16 ? 2e-3 : 1e-2);
        EXPECT_TRUE(all_close(to_doubles(y), reference_softmax(to_doubles(x), row.shape, dim, log), tol, tol))
            << what;
      }
    }
  }
}

TEST(SoftmaxOps, DtypeArgumentCastsFirst) {
  const auto ints = from_ints({1, 2, 3}, {3});
  const auto y = call("aten::softmax", {ints, 0, kw("dtype", sf::DType::kF32)});
  EXPECT_EQ(y.dtype(), sf::DType::kF32);
  EXPECT_TRUE(all_close(to_doubles(y), reference_softmax({1, 2, 3}, {3}, 0, false), 1e-6, 1e-7));
  const auto halfs = call("aten::to.dtype", {from_floats({0.5f, -1.0f}, {2}), sf::DType::kBF16});
  EXPECT_EQ(call("aten::log_softmax", {halfs, -1, kw("dtype", sf::DType::kF32)}).dtype(), sf::DType::kF32);
}

TEST(SoftmaxOps, StableForLargeValuesAndMasks) {
  const auto big = from_floats({1000, 1001, 1002, -1000, -1001, -1002}, {2, 3});
  EXPECT_TRUE(all_close(to_doubles(call("aten::softmax", {big, 1})),
                        reference_softmax(to_doubles(big), {2, 3}, 1, false), 1e-6, 1e-7));
  EXPECT_TRUE(all_close(to_doubles(call("aten::log_softmax", {big, 1})),
                        reference_softmax(to_doubles(big), {2, 3}, 1, true), 1e-6, 1e-5));
  // -inf (a mask) gives exactly 0, or -inf for log_softmax.
  const auto masked = from_floats({0, -INFINITY, 0}, {3});
  EXPECT_EQ(to_doubles(call("aten::softmax", {masked, 0})), (std::vector<double>{0.5, 0, 0.5}));
  EXPECT_EQ(to_doubles(call("aten::log_softmax", {masked, 0}))[1], -INFINITY);
  // A NaN, or a row of only -inf, makes its row NaN, as in PyTorch.
  const auto bad = from_floats({1, NAN, 2, -INFINITY, -INFINITY, -INFINITY, 1, 2, 3}, {3, 3});
  const auto y = to_doubles(call("aten::softmax", {bad, 1}));
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(std::isnan(y[static_cast<std::size_t>(i)])) << i;
  EXPECT_NEAR(y[6] + y[7] + y[8], 1.0, 1e-6);
}

}  // namespace
