// Elementwise ops: unary math, binary arithmetic and comparisons with NumPy
// broadcasting, where, and dtype casts.
//
// Sharding rule of every op here: one pass-through factor per output dim,
// shared with each operand dim it aligns with (size-1 broadcast dims get
// their own factor). Example, add f32[8,1] + f32[8,16]:
//   ([i, k], [i, j])->([i, j]) {i=8, j=16, k=1}
#include <fmt/format.h>

#include <cassert>
#include <cmath>
#include <type_traits>

#include "families.h"
#include "kernel_util.h"
#include "shardflow/base/error.h"

namespace shardflow::ops {
namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kSqrt2OverPi = 0.79788456080286535588;

OpShardingRule pointwise_rule(const OpArgs&, std::span<const TensorType> inputs, std::span<const TensorType> outputs) {
  RuleBuilder builder(inputs, outputs);
  builder.add_pointwise();
  return builder.build();
}

// ------------------------------------------------------------------ unary

// How a unary op's result dtype follows its input.
enum class UnaryResult { kSame, kFloat };

template <class F>
DenseTensor map_unary(const DenseTensor& in, DType dtype, F f) {
  const DenseTensor input = cast(in, dtype);
  DenseTensor out = DenseTensor::empty(dtype, input.shape());
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = input.data_as<T>();
    T* y = out.data_as<T>();
    for (int64_t i = 0; i < input.numel(); ++i) y[i] = store<T>(f(load(x[i])));
  });
  return out;
}

OpDef unary_def(UnaryResult result) {
  OpDef def;
  def.family = OpFamily::kElementwise;
  def.infer = [result](const OpArgs&, std::span<const TensorType> in) {
    const DType dtype = result == UnaryResult::kFloat ? float_type_for(in[0].dtype) : in[0].dtype;
    return std::vector<TensorType>{{dtype, in[0].shape}};
  };
  def.sharding_rule = pointwise_rule;
  return def;
}

template <class F>
void add_unary(OpRegistry& registry, std::string_view schema, UnaryResult result, F f,
               Linearity linearity = Linearity::kNone) {
  OpDef def = unary_def(result);
  def.linearity = linearity;
  def.kernel = [result, f](const OpArgs& args, std::span<const DenseTensor> in) {
    const DType dtype = result == UnaryResult::kFloat ? float_type_for(in[0].dtype()) : in[0].dtype();
    if (dtype == DType::kBool && args.schema().name() == "neg") {
      throw Error(
          "Negation, the `-` operator, on a bool tensor is not supported. If you are "
          "trying to invert a mask, use the `~` or `logical_not()` operator instead.");
    }
    return std::vector<DenseTensor>{map_unary(in[0], dtype, f)};
  };
  registry.add(schema, std::move(def));
}

float sigmoid(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

void register_unary_ops(OpRegistry& r) {
  add_unary(r, "aten::abs(Tensor self) -> Tensor", UnaryResult::kSame, [](auto x) { return x < 0 ? -x : x; });
  add_unary(r, "aten::atan(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::atan(x); });
  add_unary(r, "aten::ceil(Tensor self) -> Tensor", UnaryResult::kSame, [](auto x) { return std::ceil(x); });
  add_unary(r, "aten::cos(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::cos(x); });
  add_unary(r, "aten::erf(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::erf(x); });
  add_unary(r, "aten::exp(Tensor self) -> Tensor", UnaryResult::kFloat,
            [](auto x) { return exp_approx(static_cast<float>(x)); });
  add_unary(r, "aten::exp2(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::exp2(x); });
  add_unary(r, "aten::expm1(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::expm1(x); });
  add_unary(r, "aten::floor(Tensor self) -> Tensor", UnaryResult::kSame, [](auto x) { return std::floor(x); });
  add_unary(r, "aten::log(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::log(x); });
  add_unary(r, "aten::log10(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::log10(x); });
  add_unary(r, "aten::log1p(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::log1p(x); });
  add_unary(r, "aten::log2(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::log2(x); });
  add_unary(
      r, "aten::neg(Tensor self) -> Tensor", UnaryResult::kSame, [](auto x) { return -x; }, Linearity::kLinear);
  add_unary(r, "aten::relu(Tensor self) -> Tensor", UnaryResult::kSame,
            [](auto x) { return x > 0 ? x : decltype(x){0}; });
  // Halves to even, as PyTorch (the default rounding mode).
  add_unary(r, "aten::round(Tensor self) -> Tensor", UnaryResult::kSame, [](auto x) { return std::nearbyint(x); });
  add_unary(r, "aten::rsqrt(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return 1.0f / std::sqrt(x); });
  add_unary(r, "aten::sigmoid(Tensor self) -> Tensor", UnaryResult::kFloat,
            [](auto x) { return sigmoid(static_cast<float>(x)); });
  add_unary(r, "aten::silu(Tensor self) -> Tensor", UnaryResult::kFloat,
            [](auto x) { return static_cast<float>(x) / (1.0f + exp_approx(-static_cast<float>(x))); });
  add_unary(r, "aten::sin(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::sin(x); });
  add_unary(r, "aten::sqrt(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::sqrt(x); });
  add_unary(r, "aten::tanh(Tensor self) -> Tensor", UnaryResult::kFloat, [](auto x) { return std::tanh(x); });
  add_unary(r, "aten::trunc(Tensor self) -> Tensor", UnaryResult::kSame, [](auto x) { return std::trunc(x); });

  OpDef gelu = unary_def(UnaryResult::kFloat);
  // PyTorch's check of `approximate`, made when the graph is verified rather
  // than when it first runs.
  const auto check_approximate = [](const OpArgs& args) -> const std::string& {
    const std::string& approximate = args.get_string("approximate");
    if (approximate != "none" && approximate != "tanh") {
      throw Error("approximate argument must be either none or tanh.");  // PyTorch's words
    }
    return approximate;
  };
  gelu.infer = [check_approximate, infer = gelu.infer](const OpArgs& args, std::span<const TensorType> in) {
    check_approximate(args);
    return infer(args, in);
  };
  gelu.kernel = [check_approximate](const OpArgs& args, std::span<const DenseTensor> in) {
    const DType dtype = float_type_for(in[0].dtype());
    const std::string& approximate = check_approximate(args);
    if (approximate == "none") {
      return std::vector<DenseTensor>{map_unary(
          in[0], dtype, [](float x) { return 0.5f * x * (1.0f + std::erf(x * static_cast<float>(kSqrt1_2))); })};
    }
    return std::vector<DenseTensor>{map_unary(in[0], dtype, [](float x) {  // "tanh"
      const float inner = static_cast<float>(kSqrt2OverPi) * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + std::tanh(inner));
    })};
  };
  r.add("aten::gelu(Tensor self, *, str approximate='none') -> Tensor", std::move(gelu));
}

// ----------------------------------------------------------------- binary

// The result dtype of a binary op, given its compute dtype.
enum class BinaryResult { kPromoted, kTrueDivision, kBool };

// z = f(x, y) elementwise over broadcast operands, computed in `compute`
// (the operands are cast to it, and T stores it). The result is bool where
// f gives bool (comparisons), else `compute`. Both are compile-time: the
// caller visits the dtype once, and each op compiles its loops for one
// result type only.
template <class T, class F>
DenseTensor map_binary(const DenseTensor& a_in, const DenseTensor& b_in, DType compute, F f) {
  using C = ComputeType<T>;
  constexpr bool kBoolResult = std::is_same_v<std::invoke_result_t<F&, C, C>, bool>;
  using O = std::conditional_t<kBoolResult, bool, T>;
  const DenseTensor a = cast(a_in, compute);
  const DenseTensor b = cast(b_in, compute);
  const Shape shape = broadcast_shapes(a.shape(), b.shape());
  DenseTensor result = DenseTensor::empty(kBoolResult ? DType::kBool : compute, shape);
  O* z = result.data_as<O>();
  const T* x_base = a.data_as<T>();
  const T* y_base = b.data_as<T>();
  const Shape* shapes[] = {&a.shape(), &b.shape()};
  for_each_broadcast_row(shape, shapes, [&](int64_t n, const int64_t* offset, const int64_t* inner) {
    const T* x = x_base + offset[0];
    const T* y = y_base + offset[1];
    // Separate loops for the stride patterns let each one vectorise.
    if (inner[0] && inner[1]) {
      for (int64_t i = 0; i < n; ++i) z[i] = store<O>(f(load(x[i]), load(y[i])));
    } else if (inner[1]) {
      const auto xv = load(x[0]);
      for (int64_t i = 0; i < n; ++i) z[i] = store<O>(f(xv, load(y[i])));
    } else if (inner[0]) {
      const auto yv = load(y[0]);
      for (int64_t i = 0; i < n; ++i) z[i] = store<O>(f(load(x[i]), yv));
    } else {
      const auto v = store<O>(f(load(x[0]), load(y[0])));
      for (int64_t i = 0; i < n; ++i) z[i] = v;
    }
    z += n;
  });
  return result;
}

DenseTensor scalar_tensor(const Constant& value, DType dtype) {
  DenseTensor tensor = DenseTensor::empty(dtype, {});
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (value.kind() == Constant::Kind::kBool) {
      *tensor.data_as<T>() = store<T>(value.as_bool() ? 1 : 0);
    } else if (value.kind() == Constant::Kind::kInt) {
      *tensor.data_as<T>() = store<T>(value.as_int());
    } else {
      *tensor.data_as<T>() = store<T>(value.as_float());
    }
  });
  return tensor;
}

struct BinaryDtypes {
  DType compute;
  DType out;
};

BinaryDtypes binary_dtypes(DType promoted, BinaryResult result) {
  switch (result) {
    case BinaryResult::kPromoted:
      return {promoted, promoted};
    case BinaryResult::kTrueDivision:
      return {float_type_for(promoted), float_type_for(promoted)};
    case BinaryResult::kBool:
      return {promoted, DType::kBool};
  }
  return {promoted, promoted};
}

// What a binary op needs beyond its element function.
struct BinaryTraits {
  Linearity linearity = Linearity::kNone;
  // PyTorch's CPU kernel name, for its error on a promoted dtype the op
  // refuses ("\"bitwise_and_cpu\" not implemented for 'Float'").
  std::string_view kernel = {};
  bool floats = true;
  bool bools = true;
  // The op divides by `other`: on integers a zero there is PyTorch's
  // ZeroDivisionError, so the partitioner fills its padding with ones.
  bool divides = false;

  void check(DType promoted) const {
    if ((!floats && is_floating(promoted)) || (!bools && promoted == DType::kBool)) {
      throw Error(fmt::format("\"{}\" not implemented for '{}'", kernel, scalar_type_name(promoted)));
    }
  }
};

// `make` builds the element function from the call's arguments (for alpha
// and friends): make(args, dtypes) -> callable(x, y). `scalar_form`: the
// second operand is a Scalar argument, not a tensor.
template <class Make>
OpDef binary_def(bool scalar_form, BinaryResult result, Make make, BinaryTraits traits) {
  const auto promoted = [scalar_form, traits](const OpArgs& args, std::span<const TensorType> in) {
    const DType dtype = scalar_form ? result_type_with_scalar(in[0].dtype, args[1].constant) : result_type(in);
    traits.check(dtype);
    return dtype;
  };
  OpDef def;
  def.family = OpFamily::kElementwise;
  def.linearity = traits.linearity;
  if (traits.divides && !scalar_form) def.divisor_arg = "other";
  def.infer = [=](const OpArgs& args, std::span<const TensorType> in) {
    const Shape shape = scalar_form ? in[0].shape : broadcast_shapes(in[0].shape, in[1].shape);
    return std::vector<TensorType>{{binary_dtypes(promoted(args, in), result).out, shape}};
  };
  def.sharding_rule = pointwise_rule;
  def.kernel = [=](const OpArgs& args, std::span<const DenseTensor> in) {
    const std::vector<TensorType> types = types_of(in);
    const BinaryDtypes dtypes = binary_dtypes(promoted(args, types), result);
    const DenseTensor other = scalar_form ? scalar_tensor(args[1].constant, dtypes.compute) : in[1];
    DenseTensor out;
    visit_dtype(dtypes.compute, [&](auto tag) {
      using T = decltype(tag);
      out = map_binary<T>(in[0], other, dtypes.compute, make(args, ComputeType<T>{}));
    });
    assert(out.dtype() == dtypes.out && "the element function's result type agrees with the inferred dtype");
    return std::vector<DenseTensor>{std::move(out)};
  };
  return def;
}

bool is_scalar_form(std::string_view schema) {
  return schema.find("Scalar other") != std::string_view::npos ||
         schema.find("Scalar exponent") != std::string_view::npos;
}

template <class Make>
void add_binary(OpRegistry& registry, std::string_view schema, BinaryResult result, Make make,
                BinaryTraits traits = {}) {
  registry.add(schema, binary_def(is_scalar_form(schema), result, make, traits));
}

// a + alpha * b (alpha = 1 is the common case and skips the multiply).
template <class C>
auto add_with_alpha(const OpArgs& args, C, double sign) {
  const double alpha = args.get_number("alpha") * sign;
  if (!std::is_floating_point_v<C> && args.constant("alpha").kind() == Constant::Kind::kFloat) {
    throw Error("For integral input tensors, argument alpha must not be a floating point number.");
  }
  return [alpha](C x, C y) -> C {
    if (alpha == 1.0) return static_cast<C>(x + y);
    if (alpha == -1.0) return static_cast<C>(x - y);
    return static_cast<C>(x + static_cast<C>(alpha) * y);
  };
}

template <class C>
C power(C base, C exponent) {
  if constexpr (std::is_floating_point_v<C>) {
    return std::pow(base, exponent);
  } else if constexpr (std::is_same_v<C, bool>) {
    return base || !exponent;
  } else {
    if (exponent < 0) {
      // PyTorch raises before computing; this keeps the kernel total.
      return base == 1 ? 1 : (base == -1 ? (exponent % 2 == 0 ? 1 : -1) : 0);
    }
    C result = 1;
    for (C e = exponent, b = base; e > 0; e >>= 1, b *= b) {
      if (e & 1) result *= b;
    }
    return result;
  }
}

void check_integer_power(const OpArgs& args) {
  const Constant& exponent = args.constant("exponent");
  if (exponent.kind() == Constant::Kind::kInt && exponent.as_int() < 0) {
    throw Error("Integers to negative integer powers are not allowed.");
  }
}

// ------------------------------------------- rounding division and remainders
//
// Integer quotients and remainders as in PyTorch: a zero divisor is its
// ZeroDivisionError, and the smallest integer divided by -1 wraps instead
// of trapping.

template <class C>
C wrapping_negate(C x) {
  using U = std::make_unsigned_t<C>;
  return static_cast<C>(U{0} - static_cast<U>(x));
}

template <class C>
void check_integer_divisor(C divisor) {
  if (divisor == 0) throw Error("ZeroDivisionError");
}

template <class C>
C truncated_quotient(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    return std::trunc(a / b);
  } else {
    check_integer_divisor(b);
    return b == -1 ? wrapping_negate(a) : static_cast<C>(a / b);
  }
}

// fmod: the remainder with the dividend's sign (NaN for a zero float divisor).
template <class C>
C truncated_remainder(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    return std::fmod(a, b);
  } else {
    check_integer_divisor(b);
    return b == -1 ? C{0} : static_cast<C>(a % b);
  }
}

// remainder, Python's %: the remainder with the divisor's sign.
template <class C>
C floored_remainder(C a, C b) {
  const C r = truncated_remainder(a, b);
  return (r != 0 && (r < 0) != (b < 0)) ? static_cast<C>(r + b) : r;
}

// floor_divide, Python's //. Floats go through the exact remainder, as
// Python and PyTorch do: a / b is rounded, and its floor can differ from the
// true quotient's by one. A zero divisor gives a / b (inf or NaN).
template <class C>
C floored_quotient(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (b == 0) return a / b;
    const C r = std::fmod(a, b);
    C q = (a - r) / b;
    if (r != 0 && (b < 0) != (r < 0)) q -= 1;
    if (q == 0) return std::copysign(C{0}, a / b);
    const C whole = std::floor(q);
    return q - whole > C{0.5} ? whole + 1 : whole;
  } else {
    return floored_from_truncated(truncated_quotient(a, b), a, b);
  }
}

// div's rounding_mode: None (true division), "trunc" or "floor".
enum class Rounding { kNone, kTrunc, kFloor };

Rounding rounding_of(const OpArgs& args) {
  const Constant& mode = args.constant("rounding_mode");
  if (mode.is_none()) return Rounding::kNone;
  if (mode.as_string() == "trunc") return Rounding::kTrunc;
  if (mode.as_string() == "floor") return Rounding::kFloor;
  throw Error(fmt::format("div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{}'",
                          mode.as_string()));
}

void register_rounding_division(OpRegistry& r) {
  using R = BinaryResult;
  const auto plain = [](auto f) { return [f](const OpArgs&, auto) { return f; }; };
  const auto floored = plain([](auto x, auto y) { return floored_quotient(x, y); });
  const auto truncated = plain([](auto x, auto y) { return truncated_quotient(x, y); });
  const auto divide = plain([](auto x, auto y) { return x / y; });
  const auto traits = [](std::string_view kernel) {
    return BinaryTraits{.kernel = kernel, .bools = false, .divides = true};
  };
  struct Form {
    std::string_view overload;  // of remainder, fmod and div's modes
    std::string_view floor_divide;
    std::string_view operands;
  };
  for (const Form form : {Form{"Tensor", "floor_divide", "Tensor self, Tensor other"},
                          Form{"Scalar", "floor_divide.Scalar", "Tensor self, Scalar other"}}) {
    const bool scalar = is_scalar_form(form.operands);
    r.add(fmt::format("aten::remainder.{}({}) -> Tensor", form.overload, form.operands),
          binary_def(scalar, R::kPromoted, plain([](auto x, auto y) { return floored_remainder(x, y); }),
                     traits("remainder_cpu")));
    r.add(fmt::format("aten::fmod.{}({}) -> Tensor", form.overload, form.operands),
          binary_def(scalar, R::kPromoted, plain([](auto x, auto y) { return truncated_remainder(x, y); }),
                     traits("fmod_cpu")));
    r.add(fmt::format("aten::{}({}) -> Tensor", form.floor_divide, form.operands),
          binary_def(scalar, R::kPromoted, floored, traits("div_floor_cpu")));

    // div with a rounding_mode: one definition per mode, picked by the
    // call's mode; trunc and floor keep the promoted dtype (integers stay
    // integers).
    const OpDef by_mode[] = {binary_def(scalar, R::kTrueDivision, divide, {}),
                             binary_def(scalar, R::kPromoted, truncated, traits("div_trunc_cpu")),
                             binary_def(scalar, R::kPromoted, floored, traits("div_floor_cpu"))};
    const auto pick = [by_mode](const OpArgs& args) -> const OpDef& {
      return by_mode[static_cast<int>(rounding_of(args))];
    };
    OpDef div = by_mode[static_cast<int>(Rounding::kFloor)];
    div.infer = [pick](const OpArgs& args, std::span<const TensorType> in) { return pick(args).infer(args, in); };
    div.kernel = [pick](const OpArgs& args, std::span<const DenseTensor> in) { return pick(args).kernel(args, in); };
    r.add(fmt::format("aten::div.{}_mode({}, *, str? rounding_mode) -> Tensor", form.overload, form.operands),
          std::move(div));
  }
}

// ------------------------------------------------------------ bitwise ops

// Shifts by a negative count or by the width or more give 0 (left) or the
// sign (right), as in PyTorch, where C++ leaves them undefined.
template <class C>
C shift_left(C a, C b) {
  using U = std::make_unsigned_t<C>;
  constexpr C kBits = sizeof(C) * 8;
  return (b < 0 || b >= kBits) ? C{0} : static_cast<C>(static_cast<U>(a) << b);
}

template <class C>
C shift_right(C a, C b) {
  constexpr C kBits = sizeof(C) * 8;
  return static_cast<C>(a >> ((b < 0 || b >= kBits) ? kBits - 1 : b));
}

void register_bitwise_ops(OpRegistry& r) {
  using R = BinaryResult;
  // The element function on integers; floats never get here (refused by
  // BinaryTraits::check), so they get a placeholder that is never called.
  const auto integral = [](auto f) {
    return [f](const OpArgs&, auto c) {
      using C = decltype(c);
      if constexpr (std::is_integral_v<C>) {
        return [f](C x, C y) { return static_cast<C>(f(x, y)); };
      } else {
        return [](C x, C) { return x; };
      }
    };
  };
  const auto both_forms = [&](std::string_view name, std::string_view kernel, bool bools, auto make) {
    const BinaryTraits traits{.kernel = kernel, .floats = false, .bools = bools};
    add_binary(r, fmt::format("aten::{}.Tensor(Tensor self, Tensor other) -> Tensor", name), R::kPromoted, make,
               traits);
    add_binary(r, fmt::format("aten::{}.Scalar(Tensor self, Scalar other) -> Tensor", name), R::kPromoted, make,
               traits);
  };
  // Bools compute as 0/1 integers, so and, or and xor keep them 0 or 1.
  both_forms("bitwise_and", "bitwise_and_cpu", true, integral([](auto x, auto y) { return x & y; }));
  both_forms("bitwise_or", "bitwise_or_cpu", true, integral([](auto x, auto y) { return x | y; }));
  both_forms("bitwise_xor", "bitwise_xor_cpu", true, integral([](auto x, auto y) { return x ^ y; }));
  // Each shift has Python's operator form and aten's named one.
  const auto shift = [&](std::string_view dunder, std::string_view named, std::string_view kernel, auto make) {
    both_forms(dunder, kernel, false, make);
    const BinaryTraits traits{.kernel = kernel, .floats = false, .bools = false};
    add_binary(r, fmt::format("aten::{}.Tensor(Tensor self, Tensor other) -> Tensor", named), R::kPromoted, make,
               traits);
    add_binary(r, fmt::format("aten::{}.Tensor_Scalar(Tensor self, Scalar other) -> Tensor", named), R::kPromoted, make,
               traits);
  };
  shift("__lshift__", "bitwise_left_shift", "lshift_cpu", integral([](auto x, auto y) { return shift_left(x, y); }));
  shift("__rshift__", "bitwise_right_shift", "rshift_cpu", integral([](auto x, auto y) { return shift_right(x, y); }));

  // bitwise_not: ~ on integers, logical not on bools.
  const BinaryTraits refusing_floats{.kernel = "bitwise_not_cpu", .floats = false};
  OpDef invert = unary_def(UnaryResult::kSame);
  invert.infer = [refusing_floats](const OpArgs&, std::span<const TensorType> in) {
    refusing_floats.check(in[0].dtype);
    return std::vector<TensorType>{in[0]};
  };
  invert.kernel = [refusing_floats](const OpArgs&, std::span<const DenseTensor> in) {
    const DType dtype = in[0].dtype();
    refusing_floats.check(dtype);
    return std::vector<DenseTensor>{map_unary(in[0], dtype, [dtype](auto x) {
      if constexpr (std::is_integral_v<decltype(x)>) {
        return dtype == DType::kBool ? static_cast<decltype(x)>(x == 0) : static_cast<decltype(x)>(~x);
      } else {
        return x;
      }
    })};
  };
  r.add("aten::bitwise_not(Tensor self) -> Tensor", std::move(invert));
}

void register_binary_ops(OpRegistry& r) {
  using R = BinaryResult;
  const auto plain = [](auto f) { return [f](const OpArgs&, auto) { return f; }; };
  for (const char* name : {"add", "sub"}) {
    const double sign = std::string_view(name) == "add" ? 1.0 : -1.0;
    const auto make = [sign](const OpArgs& args, auto c) { return add_with_alpha(args, c, sign); };
    add_binary(r, fmt::format("aten::{}.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", name),
               R::kPromoted, make, {.linearity = Linearity::kAdditive});
    add_binary(r, fmt::format("aten::{}.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor", name),
               R::kPromoted, make);
  }
  const auto multiply = plain([](auto x, auto y) { return x * y; });
  add_binary(r, "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor", R::kPromoted, multiply,
             {.linearity = Linearity::kBilinear});
  add_binary(r, "aten::mul.Scalar(Tensor self, Scalar other) -> Tensor", R::kPromoted, multiply,
             {.linearity = Linearity::kLinear});
  // Division needs the reduced numerator: by a zero, parts of mixed signs
  // give inf + -inf = NaN where their sum gives one infinity. Reducing first
  // moves no more bytes (the quotient is as large as the numerator).
  const auto divide = plain([](auto x, auto y) { return x / y; });
  add_binary(r, "aten::div.Tensor(Tensor self, Tensor other) -> Tensor", R::kTrueDivision, divide);
  add_binary(r, "aten::div.Scalar(Tensor self, Scalar other) -> Tensor", R::kTrueDivision, divide);
  add_binary(r, "aten::pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor", R::kPromoted,
             plain([](auto x, auto y) { return power(x, y); }));
  add_binary(r, "aten::pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor", R::kPromoted,
             [](const OpArgs& args, auto c) {
               using C = decltype(c);
               if constexpr (!std::is_floating_point_v<C>) check_integer_power(args);
               return [](C x, C y) { return power(x, y); };
             });
  // NaN propagates, as in torch.maximum / torch.minimum.
  add_binary(r, "aten::maximum(Tensor self, Tensor other) -> Tensor", R::kPromoted,
             plain([](auto x, auto y) { return (x != x || x > y) ? x : y; }));
  add_binary(r, "aten::minimum(Tensor self, Tensor other) -> Tensor", R::kPromoted,
             plain([](auto x, auto y) { return (x != x || x < y) ? x : y; }));

  // Comparisons compute in the promoted dtype; the lambdas below take it.
  const auto cmp = [&](const char* name, auto f) {
    add_binary(r, fmt::format("aten::{}.Tensor(Tensor self, Tensor other) -> Tensor", name), R::kBool, plain(f));
    add_binary(r, fmt::format("aten::{}.Scalar(Tensor self, Scalar other) -> Tensor", name), R::kBool, plain(f));
  };
  cmp("eq", [](auto x, auto y) { return x == y; });
  cmp("ge", [](auto x, auto y) { return x >= y; });
  cmp("gt", [](auto x, auto y) { return x > y; });
  cmp("le", [](auto x, auto y) { return x <= y; });
  cmp("lt", [](auto x, auto y) { return x < y; });
  cmp("ne", [](auto x, auto y) { return x != y; });
}

// ------------------------------------------------------------ where, cast

void register_where_and_cast(OpRegistry& r) {
  OpDef where;
  where.family = OpFamily::kElementwise;
  where.infer = [](const OpArgs&, std::span<const TensorType> in) {
    if (in[0].dtype != DType::kBool) {
      throw Error(
          fmt::format("where expected condition to be a boolean tensor, but got a tensor "
                      "with dtype {}",
                      scalar_type_name(in[0].dtype)));
    }
    const Shape shape = broadcast_shapes(broadcast_shapes(in[0].shape, in[1].shape), in[2].shape);
    return std::vector<TensorType>{{result_type(in.subspan(1)), shape}};
  };
  where.sharding_rule = pointwise_rule;
  where.kernel = [infer = where.infer](const OpArgs& args, std::span<const DenseTensor> in) {
    const std::vector<TensorType> types = types_of(in);
    const TensorType out_type = infer(args, types)[0];
    const DenseTensor a = cast(in[1], out_type.dtype);
    const DenseTensor b = cast(in[2], out_type.dtype);
    DenseTensor out = DenseTensor::empty(out_type.dtype, out_type.shape);
    visit_dtype(out_type.dtype, [&](auto tag) {
      using T = decltype(tag);
      const Shape* shapes[] = {&in[0].shape(), &a.shape(), &b.shape()};
      T* z = out.data_as<T>();
      for_each_broadcast_row(out_type.shape, shapes, [&](int64_t n, const int64_t* offset, const int64_t* inner) {
        const bool* c = in[0].data_as<bool>() + offset[0];
        const T* x = a.data_as<T>() + offset[1];
        const T* y = b.data_as<T>() + offset[2];
        for (int64_t i = 0; i < n; ++i) z[i] = c[i * inner[0]] ? x[i * inner[1]] : y[i * inner[2]];
        z += n;
      });
    });
    return std::vector<DenseTensor>{std::move(out)};
  };
  r.add("aten::where.self(Tensor condition, Tensor self, Tensor other) -> Tensor", std::move(where));

  OpDef to;
  to.family = OpFamily::kElementwise;
  // Linear for exact widenings only: the partitioner reduces partial sums
  // first when the result dtype cannot hold the operand's values.
  to.linearity = Linearity::kLinear;
  to.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    return std::vector<TensorType>{{args.get_dtype("dtype"), in[0].shape}};
  };
  to.sharding_rule = pointwise_rule;
  to.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    return std::vector<DenseTensor>{cast(in[0], args.get_dtype("dtype"))};
  };
  r.add(
      "aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, bool copy=False, "
      "MemoryFormat? memory_format=None) -> Tensor(a)",
      std::move(to));
}

}  // namespace

void register_elementwise_ops(OpRegistry& registry) {
  register_unary_ops(registry);
  register_binary_ops(registry);
  register_rounding_division(registry);
  register_bitwise_ops(registry);
  register_where_and_cast(registry);
}

}  // namespace shardflow::ops
