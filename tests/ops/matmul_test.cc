// matmul and linear against straightforward reference loops. To cover a new
// case, add a row to a table.
#include <gtest/gtest.h>

#include "op_test_util.h"
#include "shardflow/base/error.h"

namespace sf = shardflow;
using namespace shardflow::testing_util;

namespace {

// The flat index of the operand element that broadcasts to output element
// `flat` (NumPy broadcasting, right-aligned).
int64_t broadcast_source(const sf::Shape& out, const sf::Shape& in, int64_t flat) {
  int64_t source = 0, stride = 1;
  for (std::size_t k = 0; k < out.size(); ++k) {
    const std::size_t d = out.size() - 1 - k;
    const int64_t index = flat % out[d];
    flat /= out[d];
    if (k < in.size()) {
      const std::size_t e = in.size() - 1 - k;
      if (in[e] != 1) source += index * stride;
      stride *= in[e];
    }
  }
  return source;
}

sf::Shape drop_last(const sf::Shape& shape, std::size_t count) {
  return sf::Shape(shape.begin(), shape.end() - static_cast<std::ptrdiff_t>(count));
}

struct Reference {
  sf::Shape shape;
  std::vector<double> values;
};

// torch.matmul by its definition: a 1-D lhs is a row, a 1-D rhs a column
// (their unit dims dropped afterwards), batch dims broadcast.
Reference reference_matmul(const sf::DenseTensor& a, const sf::DenseTensor& b) {
  sf::Shape as = a.shape(), bs = b.shape();
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  const sf::Shape a_batch = drop_last(as, 2), b_batch = drop_last(bs, 2);
  const sf::Shape batch = sf::broadcast_shapes(a_batch, b_batch);
  const std::vector<double> x = to_doubles(a), y = to_doubles(b);
  Reference out;
  out.shape = batch;
  if (a.rank() > 1) out.shape.push_back(m);
  if (b.rank() > 1) out.shape.push_back(n);
  for (int64_t p = 0; p < sf::numel(batch); ++p) {
    const int64_t a_at = broadcast_source(batch, a_batch, p) * m * k;
    const int64_t b_at = broadcast_source(batch, b_batch, p) * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t q = 0; q < k; ++q) {
          sum += x[static_cast<std::size_t>(a_at + i * k + q)] * y[static_cast<std::size_t>(b_at + q * n + j)];
        }
        out.values.push_back(sum);
      }
    }
  }
  return out;
}

// The output's rounding: f32 accumulates in f32; bf16 and f16 compute in f32
// and round once.
double tolerance(sf::DType dtype) {
  switch (dtype) {
    case sf::DType::kF32: return 1e-5;
    case sf::DType::kBF16: return 1e-2;
    case sf::DType::kF16: return 2e-3;
    default: return 0;
  }
}

const sf::DType kMatmulDtypes[] = {sf::DType::kF32, sf::DType::kBF16, sf::DType::kF16, sf::DType::kI64,
                                   sf::DType::kI32};

sf::DenseTensor operand(sf::DType dtype, sf::Shape shape, std::mt19937& rng) {
  return random_tensor(dtype, std::move(shape), rng, -4, 5);
}

const std::pair<sf::Shape, sf::Shape> kMatmulShapes[] = {
    {{3}, {3}},                 // dot
    {{1}, {1}},
    {{2, 3}, {3}},              // mv
    {{3}, {3, 4}},              // row vector times matrix
    {{2, 3}, {3, 4}},           // mm
    {{7, 33}, {33, 17}},
    {{2, 2, 3}, {3, 4}},        // batched lhs, shared rhs (one tall GEMM)
    {{2, 2, 3}, {3}},
    {{3}, {2, 3, 4}},           // vector lhs, batched rhs
    {{3}, {2, 3, 1}},
    {{2, 3}, {2, 3, 4}},        // shared lhs, batched rhs
    {{2, 1, 2, 3}, {3, 3, 4}},  // broadcast batch dims
    {{4, 1, 2, 3}, {1, 5, 3, 2}},
    {{1, 2, 3}, {4, 3, 5}},
    {{5, 2, 3}, {1, 3, 4}},
    {{3, 64, 65}, {65, 70}},
    {{0, 3}, {3, 4}},           // empty
    {{2, 0}, {0, 4}},           // k = 0: zeros
    {{2, 3}, {3, 0}},
    {{0, 2, 3}, {3, 4}},
    {{2, 0, 3}, {2, 3, 4}},
    {{0}, {0}},
    {{3}, {0, 3, 2}},
};

TEST(MatmulOps, MatchesReferenceForEveryDtype) {
  std::mt19937 rng(21);
  for (const auto& [sa, sb] : kMatmulShapes) {
    for (sf::DType dtype : kMatmulDtypes) {
      const auto a = operand(dtype, sa, rng);
      const auto b = operand(dtype, sb, rng);
      const std::string what = sf::shape_to_string(sa) + " x " + sf::shape_to_string(sb) + " " +
                               std::string(sf::dtype_name(dtype));
      const sf::DenseTensor y = call("aten::matmul", {a, b});
      const Reference expected = reference_matmul(a, b);
      EXPECT_EQ(y.dtype(), dtype) << what;
      EXPECT_EQ(y.shape(), expected.shape) << what;
      EXPECT_TRUE(all_close(to_doubles(y), expected.values, tolerance(dtype), tolerance(dtype))) << what;
    }
  }
}

TEST(MatmulOps, FloatInputsOfEveryMagnitude) {
  std::mt19937 rng(22);
  // Values in [-2, 2) rather than small integers, so rounding shows.
  const auto a = random_tensor(sf::DType::kF32, {3, 5, 40}, rng);
  const auto b = random_tensor(sf::DType::kF32, {3, 40, 6}, rng);
  EXPECT_TRUE(all_close(to_doubles(call("aten::matmul", {a, b})), reference_matmul(a, b).values, 1e-5, 1e-5));
  const auto a16 = call("aten::to.dtype", {a, sf::DType::kBF16});
  const auto b16 = call("aten::to.dtype", {b, sf::DType::kBF16});
  EXPECT_TRUE(all_close(to_doubles(call("aten::matmul", {a16, b16})), reference_matmul(a16, b16).values, 1e-2, 2e-2));
}

// --------------------------------------------------------------- linear

struct LinearRow {
  sf::Shape input, weight;
  std::optional<sf::Shape> bias;
};

const LinearRow kLinearRows[] = {
    {{4, 3}, {5, 3}, sf::Shape{5}},
    {{4, 3}, {5, 3}, std::nullopt},
    {{3}, {5, 3}, sf::Shape{5}},
    {{3}, {5, 3}, std::nullopt},
    {{2, 3, 4}, {6, 4}, sf::Shape{6}},
    {{2, 3, 4}, {6, 4}, sf::Shape{1}},
    {{2, 2, 3, 4}, {5, 4}, sf::Shape{}},
    {{2, 2, 3, 4}, {5, 4}, sf::Shape{3, 5}},
    {{2, 2, 3, 4}, {5, 4}, sf::Shape{2, 1, 1, 5}},
    {{4}, {4}, std::nullopt},
    {{2, 3, 4}, {4}, std::nullopt},
    {{2, 0}, {3, 0}, sf::Shape{3}},
    {{0, 3}, {2, 3}, sf::Shape{2}},
    {{5, 33}, {17, 33}, sf::Shape{17}},
};

// y[..., o] = sum_i x[..., i] W[o, i] + b, b broadcast to y.
std::vector<double> reference_linear(const sf::DenseTensor& x, const sf::DenseTensor& w,
                                     const sf::DenseTensor* b, const sf::Shape& out_shape) {
  const int64_t in = x.shape().back();
  const int64_t out = w.rank() == 2 ? w.shape()[0] : 1;
  const int64_t rows = sf::numel(drop_last(x.shape(), 1));
  const std::vector<double> xs = to_doubles(x), ws = to_doubles(w);
  std::vector<double> y;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0;
      for (int64_t i = 0; i < in; ++i) sum += xs[static_cast<std::size_t>(r * in + i)] * ws[static_cast<std::size_t>(o * in + i)];
      if (b != nullptr) {
        const int64_t flat = static_cast<int64_t>(y.size());
        sum += sf::testing_util::element(*b, broadcast_source(out_shape, b->shape(), flat));
      }
      y.push_back(sum);
    }
  }
  return y;
}

TEST(MatmulOps, LinearMatchesReference) {
  std::mt19937 rng(23);
  for (const LinearRow& row : kLinearRows) {
    for (sf::DType dtype : {sf::DType::kF32, sf::DType::kBF16, sf::DType::kF16, sf::DType::kI64, sf::DType::kI32}) {
      const auto x = operand(dtype, row.input, rng);
      const auto w = operand(dtype, row.weight, rng);
      const std::string what = sf::shape_to_string(row.input) + " " + sf::shape_to_string(row.weight) +
                               (row.bias ? " bias " + sf::shape_to_string(*row.bias) : "") + " " +
                               std::string(sf::dtype_name(dtype));
      sf::DenseTensor y;
      std::vector<double> expected;
      sf::Shape shape = drop_last(row.input, 1);
      if (row.weight.size() == 2) shape.push_back(row.weight[0]);
      if (row.bias) {
        const auto b = operand(dtype, *row.bias, rng);
        y = call("aten::linear", {x, w, b});
        expected = reference_linear(x, w, &b, shape);
      } else {
        y = call("aten::linear", {x, w});
        expected = reference_linear(x, w, nullptr, shape);
      }
      EXPECT_EQ(y.dtype(), dtype) << what;
      EXPECT_EQ(y.shape(), shape) << what;
      EXPECT_TRUE(all_close(to_doubles(y), expected, tolerance(dtype), tolerance(dtype))) << what;
    }
  }
}

// A 16-bit linear computes in float and rounds once: the bits of the float
// op on the same values, rounded. Its weight is read as stored (decode rows)
// or converted (more rows), never rounded on the way.
TEST(MatmulOps, SixteenBitLinearHasTheBitsOfFloat32RoundedOnce) {
  std::mt19937 rng(24);
  const LinearRow rows[] = {
      {{1, 768}, {300, 768}, sf::Shape{300}},  // a decode step
      {{1, 5, 37}, {17, 37}, std::nullopt},    // five rows, a scalar tail
      {{8, 40}, {20, 40}, sf::Shape{20}},
      {{9, 40}, {20, 40}, std::nullopt},       // past the matrix-vector kernels
      {{3}, {2053, 3}, std::nullopt},
  };
  const auto to = [](const sf::DenseTensor& t, sf::DType dtype) { return call("aten::to.dtype", {t, dtype}); };
  for (const sf::DType dtype : {sf::DType::kBF16, sf::DType::kF16}) {
    for (const LinearRow& row : rows) {
      const auto x = random_tensor(dtype, row.input, rng);
      const auto w = random_tensor(dtype, row.weight, rng);
      std::vector<TestArg> narrow{x, w}, wide{to(x, sf::DType::kF32), to(w, sf::DType::kF32)};
      if (row.bias) {
        const auto b = random_tensor(dtype, *row.bias, rng);
        narrow.push_back(b);
        wide.push_back(to(b, sf::DType::kF32));
      }
      const sf::DenseTensor y = call("aten::linear", narrow);
      EXPECT_EQ(y.dtype(), dtype);
      EXPECT_EQ(to_doubles(y), to_doubles(to(call("aten::linear", wide), dtype)))
          << sf::shape_to_string(row.input) << " x " << sf::shape_to_string(row.weight) << " "
          << sf::dtype_name(dtype);
    }
  }
}

// --------------------------------------------------------------- errors

TEST(MatmulOps, ErrorsUsePyTorchMessages) {
  std::mt19937 rng(24);
  const auto f32 = [&](sf::Shape shape) { return random_tensor(sf::DType::kF32, std::move(shape), rng); };
  const auto bf16 = [&](sf::Shape shape) { return random_tensor(sf::DType::kBF16, std::move(shape), rng); };
  const std::vector<ErrorRow> rows = {
      {"aten::matmul", {f32({}), f32({2, 3})}, "both arguments to matmul need to be at least 1D, but they are 0D and 2D"},
      {"aten::matmul", {f32({2, 3}), f32({4, 5})}, "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"},
      {"aten::matmul", {f32({3}), f32({4, 5})}, "mat1 and mat2 shapes cannot be multiplied (1x3 and 4x5)"},
      {"aten::matmul", {f32({2, 3}), f32({4})}, "size mismatch, got input (2), mat (2x3), vec (4)"},
      {"aten::matmul", {f32({3}), f32({4})},
       "inconsistent tensor size, expected tensor [3] and src [4] to have the same number of elements, but got 3 "
       "and 4 elements respectively"},
      {"aten::matmul", {f32({2, 2, 3}), f32({4, 5})}, "mat1 and mat2 shapes cannot be multiplied (4x3 and 4x5)"},
      {"aten::matmul", {f32({2, 2, 3}), f32({4})}, "size mismatch, got input (4), mat (4x3), vec (4)"},
      {"aten::matmul", {f32({2, 2, 3}), f32({2, 4, 5})},
       "Expected size for first two dimensions of batch2 tensor to be: [2, 3] but got: [2, 4]."},
      {"aten::matmul", {f32({2, 3}), f32({3, 4, 5})},
       "Expected size for first two dimensions of batch2 tensor to be: [3, 3] but got: [3, 4]."},
      {"aten::matmul", {f32({2, 2, 3}), f32({3, 3, 5})},
       "The size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0"},
      {"aten::matmul", {f32({3}), f32({2, 1, 5})}, "size mismatch, got input (10), mat (10x1), vec (3)"},
      {"aten::matmul", {f32({2, 3}), bf16({3, 4})},
       "expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16"},
      {"aten::matmul", {f32({3}), bf16({3})}, "dot : expected both vectors to have same dtype, but found Float and BFloat16"},
      {"aten::matmul", {random_tensor(sf::DType::kBool, {2, 2}, rng), random_tensor(sf::DType::kBool, {2, 2}, rng)},
       "\"addmm_impl_cpu_\" not implemented for 'Bool'"},
      {"aten::linear", {f32({}), f32({5, 3})}, "both arguments to linear need to be at least 1D, but they are 0D and 2D"},
      {"aten::linear", {f32({4, 3}), f32({5, 4})}, "mat1 and mat2 shapes cannot be multiplied (4x3 and 4x5)"},
      {"aten::linear", {f32({2, 4, 3}), f32({5, 4}), f32({5})}, "mat1 and mat2 shapes cannot be multiplied (8x3 and 4x5)"},
      {"aten::linear", {f32({4, 3}), f32({5, 3}), f32({3})},
       "The expanded size of the tensor (5) must match the existing size (3) at non-singleton dimension 1.  "
       "Target sizes: [4, 5].  Tensor sizes: [3]"},
      {"aten::linear", {f32({4, 3}), f32({5, 3}), f32({2, 4, 5})},
       "the number of sizes provided (2) must be greater or equal to the number of dimensions in the tensor (3)"},
      {"aten::linear", {f32({4, 3}), f32({5, 3}), bf16({5})}, "self and mat2 must have the same dtype, but got BFloat16 and Float"},
      {"aten::linear", {bf16({4, 3}), f32({5, 3}), f32({5})}, "mat1 and mat2 must have the same dtype, but got BFloat16 and Float"},
      {"aten::linear", {bf16({4, 3}), f32({5, 3})}, "expected m1 and m2 to have the same dtype, but got: c10::BFloat16 != float"},
      {"aten::linear", {f32({4, 3}), f32({3}), f32({1})}, "mat2 must be a matrix, got 1-D tensor"},
      {"aten::linear", {f32({4, 3}), f32({2, 5, 3})}, "t() expects a tensor with <= 2 dimensions, but self is 3D"},
  };
  expect_errors(rows);
}

// --------------------------------------------------------------- rules

TEST(MatmulOps, ShardingRules) {
  std::mt19937 rng(25);
  const auto t = [&](sf::Shape shape) { return random_tensor(sf::DType::kF32, std::move(shape), rng); };
  const std::vector<std::pair<OpRun, std::string>> rows = {
      {run_op("aten::matmul", {t({8, 32}), t({32, 16})}), "([i, k], [k, j])->([i, j]) {i=8, j=16, k=32} reduction={k}"},
      {run_op("aten::matmul", {t({4, 8, 32}), t({32, 16})}),
       "([i, j, l], [l, k])->([i, j, k]) {i=4, j=8, k=16, l=32} reduction={l}"},
      {run_op("aten::matmul", {t({4, 1, 8, 32}), t({5, 32, 16})}),
       "([i, n, k, m], [j, m, l])->([i, j, k, l]) {i=4, j=5, k=8, l=16, m=32, n=1} reduction={m}"},
      {run_op("aten::matmul", {t({32}), t({32, 16})}), "([j], [j, i])->([i]) {i=16, j=32} reduction={j}"},
      {run_op("aten::matmul", {t({8, 32}), t({32})}), "([i, j], [j])->([i]) {i=8, j=32} reduction={j}"},
      {run_op("aten::matmul", {t({32}), t({32})}), "([i], [i])->([]) {i=32} reduction={i}"},
      {run_op("aten::linear", {t({8, 32}), t({16, 32}), t({16})}),
       "([i, k], [j, k], [j])->([i, j]) {i=8, j=16, k=32} reduction={k}"},
      {run_op("aten::linear", {t({2, 8, 32}), t({16, 32})}),
       "([i, j, l], [k, l])->([i, j, k]) {i=2, j=8, k=16, l=32} reduction={l}"},
      {run_op("aten::linear", {t({3, 2, 8, 32}), t({16, 32}), t({8, 1})}),
       "([i, j, k, m], [l, m], [k, n])->([i, j, k, l]) {i=3, j=2, k=8, l=16, m=32, n=1} reduction={m}"},
  };
  for (const auto& [run, expected] : rows) {
    EXPECT_EQ(run.rule.to_string(), expected) << run.op->full_name();
  }
}

}  // namespace
