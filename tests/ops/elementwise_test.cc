// Elementwise ops against straightforward reference loops. To add an op, add
// a row to the unary or binary table (rows in alphabetical order).
#include <gtest/gtest.h>

#include <cmath>

#include "op_test_util.h"
#include "shardflow/base/error.h"

namespace sf = shardflow;
using namespace shardflow::testing_util;

namespace {

// Shapes pairs that broadcast, including rank 0 and size-0 dims.
const std::vector<std::pair<sf::Shape, sf::Shape>> kBroadcastShapes = {
    {{}, {}}, {{5}, {5}}, {{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{2, 1}, {1, 4}}, {{4, 1, 3}, {1, 5, 1}},
    {{}, {2, 2}}, {{3, 1}, {}}, {{0, 3}, {3}}, {{2, 0}, {1, 1}}, {{1, 7}, {6, 1}},
    {{2, 3, 4, 5}, {3, 1, 5}},
    // Rows merge across dims both operands step through alike (rotary pairs).
    {{1, 1, 12, 32, 2}, {1, 1, 1, 32, 2}}, {{3, 1, 4, 2}, {3, 5, 1, 1}}, {{6, 1, 2, 2}, {6, 4, 2, 2}},
    {{1, 1}, {1}}, {{2, 1, 3}, {1, 1, 3}}};

// Random broadcasting pairs: rank up to 5, each operand dim the output's or 1,
// leading dims sometimes dropped.
std::vector<std::pair<sf::Shape, sf::Shape>> random_broadcast_shapes(int count, std::mt19937& rng) {
  std::vector<std::pair<sf::Shape, sf::Shape>> pairs;
  for (int k = 0; k < count; ++k) {
    sf::Shape out(static_cast<std::size_t>(rng() % 6));
    for (int64_t& d : out) d = 1 + static_cast<int64_t>(rng() % 3);
    const auto operand = [&] {
      sf::Shape shape(out.begin() + static_cast<std::ptrdiff_t>(rng() % (out.size() + 1) / 2), out.end());
      for (int64_t& d : shape) d = rng() % 3 == 0 ? 1 : d;
      return shape;
    };
    pairs.emplace_back(operand(), operand());
  }
  return pairs;
}

// The flat index of operand element for output element `flat`, with NumPy
// broadcasting (the reference, written independently of the kernels).
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

struct UnaryRow {
  const char* op;
  double (*reference)(double);
  double lo, hi;  // input range
};

const UnaryRow kUnary[] = {
    {"aten::abs", [](double x) { return std::abs(x); }, -3, 3},
    {"aten::atan", [](double x) { return std::atan(x); }, -5, 5},
    {"aten::ceil", [](double x) { return std::ceil(x); }, -3, 3},
    {"aten::cos", [](double x) { return std::cos(x); }, -3, 3},
    {"aten::erf", [](double x) { return std::erf(x); }, -4, 4},
    {"aten::exp", [](double x) { return std::exp(x); }, -20, 20},
    {"aten::exp2", [](double x) { return std::exp2(x); }, -10, 10},
    {"aten::expm1", [](double x) { return std::expm1(x); }, -1e-3, 1e-3},
    {"aten::floor", [](double x) { return std::floor(x); }, -3, 3},
    {"aten::log", [](double x) { return std::log(x); }, 0.01, 5},
    {"aten::log10", [](double x) { return std::log10(x); }, 0.01, 5},
    {"aten::log1p", [](double x) { return std::log1p(x); }, -1e-3, 1e-3},
    {"aten::log2", [](double x) { return std::log2(x); }, 0.01, 5},
    {"aten::neg", [](double x) { return -x; }, -3, 3},
    {"aten::relu", [](double x) { return x > 0 ? x : 0.0; }, -3, 3},
    {"aten::round", [](double x) { return std::nearbyint(x); }, -3, 3},
    {"aten::rsqrt", [](double x) { return 1 / std::sqrt(x); }, 0.01, 5},
    {"aten::sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, -20, 20},
    {"aten::silu", [](double x) { return x / (1 + std::exp(-x)); }, -20, 20},
    {"aten::sin", [](double x) { return std::sin(x); }, -3, 3},
    {"aten::sqrt", [](double x) { return std::sqrt(x); }, 0, 5},
    {"aten::tanh", [](double x) { return std::tanh(x); }, -5, 5},
    {"aten::trunc", [](double x) { return std::trunc(x); }, -3, 3},
};

sf::DenseTensor uniform(sf::Shape shape, double lo, double hi, std::mt19937& rng) {
  std::uniform_real_distribution<double> dist(lo, hi);
  sf::DenseTensor t = sf::DenseTensor::empty(sf::DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = static_cast<float>(dist(rng));
  return t;
}

TEST(ElementwiseOps, UnaryMatchesReference) {
  std::mt19937 rng(1);
  for (const UnaryRow& row : kUnary) {
    for (const sf::Shape& shape : {sf::Shape{}, sf::Shape{0}, sf::Shape{7}, sf::Shape{3, 33}}) {
      const sf::DenseTensor x = uniform(shape, row.lo, row.hi, rng);
      const sf::DenseTensor y = call(row.op, {x});
      std::vector<double> expected;
      for (double v : to_doubles(x)) expected.push_back(row.reference(v));
      EXPECT_TRUE(all_close(to_doubles(y), expected, 2e-6, 1e-6)) << row.op;
    }
  }
}

// PyTorch rounds halves to even, and rounding an integer tensor keeps it.
TEST(ElementwiseOps, RoundingHalvesGoToEvenAndIntegersStayIntegers) {
  const sf::DenseTensor halves = from_floats({-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f}, {6});
  EXPECT_EQ(to_doubles(call("aten::round", {halves})), (std::vector<double>{-2, -2, 0, 0, 2, 2}));
  const sf::DenseTensor ints = from_ints({-3, 0, 7}, {3});
  for (const char* op : {"aten::round", "aten::floor", "aten::ceil", "aten::trunc"}) {
    const sf::DenseTensor y = call(op, {ints});
    EXPECT_EQ(y.dtype(), sf::DType::kI64) << op;
    EXPECT_EQ(to_doubles(y), (std::vector<double>{-3, 0, 7})) << op;
  }
}

TEST(ElementwiseOps, GeluBothApproximations) {
  std::mt19937 rng(2);
  const sf::DenseTensor x = uniform({64}, -5, 5, rng);
  std::vector<double> exact, tanh_form;
  for (double v : to_doubles(x)) {
    exact.push_back(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
    tanh_form.push_back(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
  }
  EXPECT_TRUE(all_close(to_doubles(call("aten::gelu", {x})), exact, 1e-5, 1e-6));
  EXPECT_TRUE(all_close(to_doubles(call("aten::gelu", {x, kw("approximate", "tanh")})), tanh_form, 1e-5, 1e-6));
  EXPECT_THROW(call("aten::gelu", {x, kw("approximate", "fast")}), sf::Error);
}

TEST(ElementwiseOps, UnaryDtypes) {
  std::mt19937 rng(3);
  const sf::DenseTensor ints = random_tensor(sf::DType::kI32, {6}, rng);
  EXPECT_EQ(call("aten::exp", {ints}).dtype(), sf::DType::kF32);  // int -> float
  EXPECT_EQ(call("aten::neg", {ints}).dtype(), sf::DType::kI32);
  EXPECT_EQ(call("aten::abs", {ints}).dtype(), sf::DType::kI32);
  const sf::DenseTensor halfs = random_tensor(sf::DType::kBF16, {6}, rng);
  EXPECT_EQ(call("aten::silu", {halfs}).dtype(), sf::DType::kBF16);
  EXPECT_THROW(call("aten::neg", {random_tensor(sf::DType::kBool, {2}, rng)}), sf::Error);
}

struct BinaryRow {
  const char* op;
  double (*reference)(double, double);
  bool to_bool;
};

const BinaryRow kBinary[] = {
    {"aten::add", [](double a, double b) { return a + b; }, false},
    {"aten::div", [](double a, double b) { return a / b; }, false},
    {"aten::eq", [](double a, double b) { return double(a == b); }, true},
    {"aten::floor_divide", [](double a, double b) { return std::floor(a / b); }, false},
    {"aten::fmod", [](double a, double b) { return std::fmod(a, b); }, false},
    {"aten::ge", [](double a, double b) { return double(a >= b); }, true},
    {"aten::gt", [](double a, double b) { return double(a > b); }, true},
    {"aten::le", [](double a, double b) { return double(a <= b); }, true},
    {"aten::lt", [](double a, double b) { return double(a < b); }, true},
    {"aten::maximum", [](double a, double b) { return std::max(a, b); }, false},
    {"aten::minimum", [](double a, double b) { return std::min(a, b); }, false},
    {"aten::mul", [](double a, double b) { return a * b; }, false},
    {"aten::ne", [](double a, double b) { return double(a != b); }, true},
    {"aten::pow", [](double a, double b) { return std::pow(std::abs(a), b); }, false},
    {"aten::remainder", [](double a, double b) { return a - b * std::floor(a / b); }, false},
    {"aten::sub", [](double a, double b) { return a - b; }, false},
};

TEST(ElementwiseOps, BinaryBroadcastMatchesReference) {
  std::mt19937 rng(4);
  std::vector<std::pair<sf::Shape, sf::Shape>> shapes = kBroadcastShapes;
  for (const auto& pair : random_broadcast_shapes(40, rng)) shapes.push_back(pair);
  for (const BinaryRow& row : kBinary) {
    const bool is_pow = std::string(row.op) == "aten::pow";
    for (const auto& [sa, sb] : shapes) {
      // Small integers make equal values (for the comparisons) common.
      const sf::DenseTensor a = is_pow ? uniform(sa, 0.1, 3, rng)
                                       : call("aten::to.dtype", {random_tensor(sf::DType::kI64, sa, rng, -3, 3), sf::DType::kF32});
      const sf::DenseTensor b = is_pow ? uniform(sb, -2, 2, rng)
                                       : call("aten::to.dtype", {random_tensor(sf::DType::kI64, sb, rng, 1, 4), sf::DType::kF32});
      const sf::DenseTensor out = call(row.op, {a, b});
      const sf::Shape shape = sf::broadcast_shapes(sa, sb);
      ASSERT_EQ(out.shape(), shape) << row.op;
      EXPECT_EQ(out.dtype(), row.to_bool ? sf::DType::kBool : sf::DType::kF32) << row.op;
      std::vector<double> expected;
      for (int64_t i = 0; i < sf::numel(shape); ++i) {
        expected.push_back(row.reference(sf::testing_util::element(a, broadcast_source(shape, sa, i)),
                                         sf::testing_util::element(b, broadcast_source(shape, sb, i))));
      }
      EXPECT_TRUE(all_close(to_doubles(out), expected, 1e-6, 1e-6))
          << row.op << " " << sf::shape_to_string(sa) << " " << sf::shape_to_string(sb);
    }
  }
}

TEST(ElementwiseOps, ScalarFormsAndAlpha) {
  const sf::DenseTensor a = from_floats({1, 2, 3}, {3});
  const sf::DenseTensor b = from_floats({10, 20, 30}, {3});
  EXPECT_EQ(to_doubles(call("aten::add", {a, b, kw("alpha", 2)})), (std::vector<double>{21, 42, 63}));
  EXPECT_EQ(to_doubles(call("aten::sub", {a, b, kw("alpha", 0.5)})), (std::vector<double>{-4, -8, -12}));
  EXPECT_EQ(to_doubles(call("aten::add", {a, 1.5})), (std::vector<double>{2.5, 3.5, 4.5}));
  EXPECT_EQ(to_doubles(call("aten::mul", {a, 2})), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(to_doubles(call("aten::div", {a, 2})), (std::vector<double>{0.5, 1, 1.5}));
  EXPECT_EQ(to_doubles(call("aten::pow", {a, 2})), (std::vector<double>{1, 4, 9}));
  EXPECT_EQ(to_doubles(call("aten::lt", {a, 2})), (std::vector<double>{1, 0, 0}));
}

TEST(ElementwiseOps, TypePromotion) {
  std::mt19937 rng(5);
  const auto i32 = random_tensor(sf::DType::kI32, {4}, rng);
  const auto i64 = random_tensor(sf::DType::kI64, {4}, rng);
  const auto f16 = random_tensor(sf::DType::kF16, {4}, rng);
  const auto bf16 = random_tensor(sf::DType::kBF16, {4}, rng);
  const auto f32_scalar = random_tensor(sf::DType::kF32, {}, rng);
  EXPECT_EQ(call("aten::add", {i32, i64}).dtype(), sf::DType::kI64);
  EXPECT_EQ(call("aten::add", {f16, bf16}).dtype(), sf::DType::kF32);
  EXPECT_EQ(call("aten::add", {f16, f32_scalar}).dtype(), sf::DType::kF16);  // 0-dim does not promote
  EXPECT_EQ(call("aten::add", {i32, f32_scalar}).dtype(), sf::DType::kF32);  // unless of a higher kind
  EXPECT_EQ(call("aten::add", {i32, 1.5}).dtype(), sf::DType::kF32);
  EXPECT_EQ(call("aten::add", {i32, 2}).dtype(), sf::DType::kI32);
  EXPECT_EQ(call("aten::div", {i32, i32}).dtype(), sf::DType::kF32);  // true division
  EXPECT_EQ(to_doubles(call("aten::div", {from_ints({1, 3}, {2}), 2})), (std::vector<double>{0.5, 1.5}));
  EXPECT_THROW(call("aten::add", {i32, i32, kw("alpha", 0.5)}), sf::Error);
  EXPECT_THROW(call("aten::pow", {i64, -1}), sf::Error);
  EXPECT_EQ(to_doubles(call("aten::pow", {from_ints({2, 3}, {2}), from_ints({10, 3}, {2})})),
            (std::vector<double>{1024, 27}));
}

// Integer //, %, fmod and div's rounding modes against Python's rules
// (quotients floored or truncated, remainders with the divisor's or the
// dividend's sign), for every sign of both operands.
TEST(ElementwiseOps, IntegerDivisionRoundsAsPython) {
  std::vector<int64_t> a_values, b_values;
  for (int64_t a = -9; a <= 9; ++a) {
    for (int64_t b = -4; b <= 4; ++b) {
      if (b == 0) continue;
      a_values.push_back(a);
      b_values.push_back(b);
    }
  }
  const auto n = static_cast<int64_t>(a_values.size());
  std::vector<double> floors, remainders, truncs, fmods;
  for (int64_t i = 0; i < n; ++i) {
    const double a = static_cast<double>(a_values[static_cast<std::size_t>(i)]);
    const double b = static_cast<double>(b_values[static_cast<std::size_t>(i)]);
    floors.push_back(std::floor(a / b));
    remainders.push_back(a - b * std::floor(a / b));
    truncs.push_back(std::trunc(a / b));
    fmods.push_back(a - b * std::trunc(a / b));
  }
  for (sf::DType dtype : {sf::DType::kI32, sf::DType::kI64}) {
    const auto a = from_ints(a_values, {n}, dtype);
    const auto b = from_ints(b_values, {n}, dtype);
    const auto floor = call("aten::floor_divide", {a, b});
    EXPECT_EQ(floor.dtype(), dtype);
    EXPECT_EQ(to_doubles(floor), floors);
    EXPECT_EQ(to_doubles(call("aten::div", {a, b, kw("rounding_mode", "floor")})), floors);
    EXPECT_EQ(to_doubles(call("aten::remainder", {a, b})), remainders);
    EXPECT_EQ(to_doubles(call("aten::div", {a, b, kw("rounding_mode", "trunc")})), truncs);
    EXPECT_EQ(to_doubles(call("aten::fmod", {a, b})), fmods);
    // Without a rounding mode, div is true division.
    EXPECT_EQ(call("aten::div", {a, b, kw("rounding_mode", sf::Constant())}).dtype(), sf::DType::kF32);
  }
  // The smallest integer by -1 wraps (x86 would trap), remainders are 0.
  const int64_t smallest = std::numeric_limits<int64_t>::min();
  const auto min = from_ints({smallest}, {1});
  EXPECT_EQ(sf::testing_util::element(call("aten::floor_divide", {min, -1}), 0), static_cast<double>(smallest));
  EXPECT_EQ(sf::testing_util::element(call("aten::div", {min, -1, kw("rounding_mode", "trunc")}), 0),
            static_cast<double>(smallest));
  EXPECT_EQ(to_doubles(call("aten::remainder", {min, -1})), (std::vector<double>{0}));
  EXPECT_EQ(to_doubles(call("aten::fmod", {min, -1})), (std::vector<double>{0}));
}

// Float // and %: PyTorch's values (checked against torch 2.13) where the
// rounded quotient, signed zeros, infinities and NaN matter.
TEST(ElementwiseOps, FloatFloorDivisionAndRemainderAtTheEdges) {
  const auto a = from_floats({5.5f, -5.5f, 0.0f, -0.0f, INFINITY, NAN, 1.0f, 7.5f, -7.5f, 0.3f}, {10});
  const auto b = from_floats({2.0f, 2.0f, -3.0f, 3.0f, 2.0f, 1.0f, 0.0f, INFINITY, INFINITY, 0.1f}, {10});
  const std::vector<double> floor = to_doubles(call("aten::floor_divide", {a, b}));
  const std::vector<double> want_floor = {2, -3, -0.0, -0.0, NAN, NAN, INFINITY, 0, -1, 3};
  EXPECT_TRUE(all_close(floor, want_floor, 0, 0));
  EXPECT_TRUE(std::signbit(floor[2]) && std::signbit(floor[3]));
  const std::vector<double> rem = to_doubles(call("aten::remainder", {a, b}));
  const std::vector<double> want_rem = {1.5, 0.5, 0, -0.0, NAN, NAN, NAN, 7.5, INFINITY, 7.450580596923828e-09};
  EXPECT_TRUE(all_close(rem, want_rem, 1e-6, 0));
  EXPECT_FALSE(std::signbit(rem[2]));
  EXPECT_TRUE(std::signbit(rem[3]));
  EXPECT_TRUE(all_close(to_doubles(call("aten::div", {a, b, kw("rounding_mode", "trunc")})),
                        {2, -2, -0.0, -0.0, INFINITY, NAN, INFINITY, 0, -0.0, 3}, 0, 0));
  // An integer tensor by a float number computes in float.
  const auto ints = from_ints({7, -7}, {2}, sf::DType::kI32);
  const auto mixed = call("aten::remainder", {ints, 2.5});
  EXPECT_EQ(mixed.dtype(), sf::DType::kF32);
  EXPECT_EQ(to_doubles(mixed), (std::vector<double>{2, 0.5}));
}

TEST(ElementwiseOps, DivisionAndBitwiseErrorsUsePyTorchMessages) {
  const auto ints = from_ints({4, 5}, {2});
  const auto zeros = from_ints({1, 0}, {2});
  const auto bools = from_ints({1, 0}, {2}, sf::DType::kBool);
  const auto floats = from_floats({1, 2}, {2});
  expect_errors({
      {"aten::floor_divide", {ints, zeros}, "ZeroDivisionError"},
      {"aten::floor_divide", {ints, 0}, "ZeroDivisionError"},
      {"aten::remainder", {ints, zeros}, "ZeroDivisionError"},
      {"aten::fmod", {ints, zeros}, "ZeroDivisionError"},
      {"aten::div", {ints, zeros, kw("rounding_mode", "floor")}, "ZeroDivisionError"},
      {"aten::div", {ints, zeros, kw("rounding_mode", "trunc")}, "ZeroDivisionError"},
      {"aten::div", {ints, zeros, kw("rounding_mode", "round")},
       "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found 'round'"},
      {"aten::floor_divide", {bools, bools}, "\"div_floor_cpu\" not implemented for 'Bool'"},
      {"aten::remainder", {bools, bools}, "\"remainder_cpu\" not implemented for 'Bool'"},
      {"aten::bitwise_and", {floats, ints}, "\"bitwise_and_cpu\" not implemented for 'Float'"},
      {"aten::bitwise_or", {ints, 1.5}, "\"bitwise_or_cpu\" not implemented for 'Float'"},
      {"aten::bitwise_not", {floats}, "\"bitwise_not_cpu\" not implemented for 'Float'"},
      {"aten::__lshift__", {bools, bools}, "\"lshift_cpu\" not implemented for 'Bool'"},
      {"aten::__rshift__", {floats, 1}, "\"rshift_cpu\" not implemented for 'Float'"},
  });
}

TEST(ElementwiseOps, BitwiseOpsAndShifts) {
  for (sf::DType dtype : {sf::DType::kI32, sf::DType::kI64}) {
    const auto a = from_ints({5, -5, 12, 0}, {4}, dtype);
    const auto b = from_ints({3, 3, -6, 7}, {4}, dtype);
    EXPECT_EQ(to_doubles(call("aten::bitwise_and", {a, b})), (std::vector<double>{1, 3, 8, 0}));
    EXPECT_EQ(to_doubles(call("aten::bitwise_or", {a, b})), (std::vector<double>{7, -5, -2, 7}));
    EXPECT_EQ(to_doubles(call("aten::bitwise_xor", {a, 6})), (std::vector<double>{3, -3, 10, 6}));
    EXPECT_EQ(to_doubles(call("aten::bitwise_not", {a})), (std::vector<double>{-6, 4, -13, -1}));
    // Counts past the width or below zero: 0 to the left, the sign to the right.
    const double bits = dtype == sf::DType::kI32 ? 32 : 64;
    const auto counts = from_ints({1, 2, static_cast<int64_t>(bits), -1}, {4}, dtype);
    EXPECT_EQ(to_doubles(call("aten::__lshift__", {a, counts})), (std::vector<double>{10, -20, 0, 0}));
    EXPECT_EQ(to_doubles(call("aten::__rshift__", {a, counts})), (std::vector<double>{2, -2, 0, 0}));
    EXPECT_EQ(to_doubles(call("aten::bitwise_right_shift", {from_ints({-8}, {1}, dtype), static_cast<int64_t>(bits)})),
              (std::vector<double>{-1}));
    EXPECT_EQ(to_doubles(call("aten::bitwise_left_shift", {a, b})), (std::vector<double>{40, -40, 0, 0}));
  }
  // Bools stay bools: and, or, xor, not are the logical ones.
  const auto p = from_ints({1, 1, 0, 0}, {4}, sf::DType::kBool);
  const auto q = from_ints({1, 0, 1, 0}, {4}, sf::DType::kBool);
  const auto both = call("aten::bitwise_and", {p, q});
  EXPECT_EQ(both.dtype(), sf::DType::kBool);
  EXPECT_EQ(to_doubles(both), (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(to_doubles(call("aten::bitwise_or", {p, q})), (std::vector<double>{1, 1, 1, 0}));
  EXPECT_EQ(to_doubles(call("aten::bitwise_xor", {p, q})), (std::vector<double>{0, 1, 1, 0}));
  const auto inverted = call("aten::bitwise_not", {p});
  EXPECT_EQ(inverted.dtype(), sf::DType::kBool);
  EXPECT_EQ(to_doubles(inverted), (std::vector<double>{0, 0, 1, 1}));
}

TEST(ElementwiseOps, NanPropagatesThroughMaximum) {
  const auto a = from_floats({NAN, 1, 5}, {3});
  const auto b = from_floats({0, NAN, 4}, {3});
  const auto out = to_doubles(call("aten::maximum", {a, b}));
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 5);
}


TEST(ElementwiseOps, WhereBroadcastsAndNeedsBool) {
  const auto cond = from_ints({1, 0}, {2, 1}, sf::DType::kBool);
  const auto a = from_floats({1, 2, 3}, {3});
  const auto b = from_ints({-1}, {}, sf::DType::kI64);
  const auto out = call("aten::where", {cond, a, b});
  EXPECT_EQ(out.dtype(), sf::DType::kF32);
  EXPECT_EQ(out.shape(), (sf::Shape{2, 3}));
  EXPECT_EQ(to_doubles(out), (std::vector<double>{1, 2, 3, -1, -1, -1}));
  EXPECT_THROW(call("aten::where", {a, a, a}), sf::Error);
}

TEST(ElementwiseOps, WhereOverThreeBroadcastOperandsMatchesReference) {
  std::mt19937 rng(9);
  const auto pairs = random_broadcast_shapes(60, rng);
  for (std::size_t k = 0; k + 1 < pairs.size(); k += 2) {
    const sf::Shape sc = pairs[k].first, sa = pairs[k].second, sb = pairs[k + 1].first;
    const sf::DenseTensor c = random_tensor(sf::DType::kBool, sc, rng, 0, 1);
    const sf::DenseTensor a = uniform(sa, -1, 1, rng), b = uniform(sb, -1, 1, rng);
    sf::Shape shape;
    try {
      shape = sf::broadcast_shapes(sf::broadcast_shapes(sc, sa), sb);
    } catch (const sf::Error&) {
      continue;  // the pairs come from different outputs
    }
    const sf::DenseTensor out = call("aten::where", {c, a, b});
    ASSERT_EQ(out.shape(), shape);
    for (int64_t i = 0; i < sf::numel(shape); ++i) {
      const bool take_a = element(c, broadcast_source(shape, sc, i)) != 0;
      EXPECT_EQ(element(out, i), take_a ? element(a, broadcast_source(shape, sa, i))
                                        : element(b, broadcast_source(shape, sb, i)))
          << sf::shape_to_string(sc) << " " << sf::shape_to_string(sa) << " " << sf::shape_to_string(sb);
    }
  }
}

TEST(ElementwiseOps, CastsBetweenAllDtypes) {
  const auto x = from_floats({-1.5f, 0.0f, 2.75f, 65504.0f}, {4});
  for (sf::DType dtype : sf::kAllDTypes) {
    const auto y = call("aten::to.dtype", {x, dtype});
    EXPECT_EQ(y.dtype(), dtype);
    const auto back = to_doubles(call("aten::to.dtype", {y, sf::DType::kF32}));
    if (dtype == sf::DType::kF32 || dtype == sf::DType::kF16) {
      EXPECT_EQ(back, (std::vector<double>{-1.5, 0, 2.75, 65504}));
    } else if (dtype == sf::DType::kBool) {
      EXPECT_EQ(back, (std::vector<double>{1, 0, 1, 1}));
    } else if (dtype == sf::DType::kBF16) {
      EXPECT_EQ(back, (std::vector<double>{-1.5, 0, 2.75, 65536}));  // 8-bit mantissa
    } else {
      EXPECT_EQ(back, (std::vector<double>{-1, 0, 2, 65504}));  // truncation toward zero
    }
  }
}

TEST(ElementwiseOps, ShardingRuleIsPointwiseWithBroadcast) {
  std::mt19937 rng(6);
  const auto run = run_op("aten::add", {random_tensor(sf::DType::kF32, {8, 1}, rng),
                                        random_tensor(sf::DType::kF32, {8, 16}, rng)});
  EXPECT_EQ(run.rule.to_string(), "([i, k], [i, j])->([i, j]) {i=8, j=16, k=1}");
}

}  // namespace
