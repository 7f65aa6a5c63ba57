// Creation ops: arange, full, zeros, ones, triu and tril, and shardflow's
// seeded rand and randn.
//
// Ops without tensor operands give every result dim its own pass-through
// factor. triu/tril keep batch dims pass-through and make the two matrix dims
// need-replication, as the mask depends on global row and column positions.
// Examples:
//   zeros [4,8]:       ()->([i, j]) {i=4, j=8}
//   triu f32[2,4,5]:   ([i, j, k])->([i, j, k]) {i=2, j=4, k=5} need_replication={j, k}
//
// rand and randn (seeded by a constant, or by a 0-dim i64 tensor in their
// .seed_tensor overloads) are counter-based, so that any device can draw
// exactly its own slice of a sharded tensor: element i (row-major flat
// index) of a tensor drawn with `seed` depends on (seed, i) only. With
// mix = splitmix64's output function (z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
// z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31),
//   bits(seed, c) = mix(mix(seed) + (c + 1) * 0x9E3779B97F4A7C15)   (mod 2^64)
//   rand:  (bits(seed, i) >> 40) * 2^-24; bf16 and f16 keep the top 8 and 11
//          of those bits (rounding down, so that values stay below 1)
//   randn: sqrt(-2 ln u1) * cos(2 pi u2), computed in double, with
//          u1 = ((bits(seed, 2i) >> 11) + 1) * 2^-53   in (0, 1]
//          u2 = (bits(seed, 2i + 1) >> 11) * 2^-53     in [0, 1)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include "families.h"
#include "kernel_util.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"

namespace shardflow::ops {
namespace {

bool is_integral_scalar(const Constant& value) {
  return value.kind() == Constant::Kind::kInt || value.kind() == Constant::Kind::kBool;
}

double scalar_number(const Constant& value) {
  if (value.kind() == Constant::Kind::kBool) return value.as_bool() ? 1.0 : 0.0;
  return value.as_number();
}

// PyTorch's names of the C++ types in its conversion errors.
std::string_view cpp_type_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float";
    case DType::kBF16:
      return "at::BFloat16";
    case DType::kF16:
      return "at::Half";
    case DType::kI64:
      return "int64_t";
    case DType::kI32:
      return "int";
    case DType::kBool:
      return "bool";
  }
  return "float";
}

Error overflow_error(DType dtype) {
  return Error(fmt::format("value cannot be converted to type {} without overflow", cpp_type_name(dtype)));
}

// A Scalar as an int64, truncating floats toward zero, as Scalar::to<T> for
// an integer type T does; `dtype` names T in the overflow error.
int64_t scalar_to_int64(const Constant& value, DType dtype = DType::kI64) {
  if (value.kind() == Constant::Kind::kBool) return value.as_bool() ? 1 : 0;
  if (value.kind() == Constant::Kind::kInt) return value.as_int();  // not through double: exact
  const double v = value.as_float();
  // 2^63 is exact in double; NaN fails both comparisons.
  if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0)) throw overflow_error(dtype);
  return static_cast<int64_t>(v);
}

// A Scalar stored as T, with PyTorch's overflow check (infinities and NaN
// may become floats; bool takes anything).
template <class T>
T checked_store(const Constant& value, DType dtype) {
  if constexpr (std::is_same_v<T, bool>) {
    return scalar_number(value) != 0;
  } else if constexpr (std::is_integral_v<T>) {
    const int64_t v = scalar_to_int64(value, dtype);
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) throw overflow_error(dtype);
    return static_cast<T>(v);
  } else {
    const double v = scalar_number(value);
    const double max = dtype == DType::kF16    ? 65504.0
                       : dtype == DType::kBF16 ? 3.3895313892515355e38
                                               : static_cast<double>(std::numeric_limits<float>::max());
    if (std::isfinite(v) && std::abs(v) > max) throw overflow_error(dtype);
    return store<T>(v);
  }
}

// The size argument, checked as PyTorch checks it.
Shape size_arg(const OpArgs& args) {
  const std::vector<int64_t> size = args.get_int_list("size");
  for (int64_t d : size) {
    if (d < 0) {
      throw Error(fmt::format("Trying to create tensor with negative dimension {}: [{}]", d, join_ints(size, ", ")));
    }
  }
  return size;
}

// Rules of ops without tensor operands: RuleBuilder::build gives every
// result dim its own pass-through factor.
OpShardingRule own_factors_rule(const OpArgs&, std::span<const TensorType> in, std::span<const TensorType> out) {
  return RuleBuilder(in, out).build();
}

// Calls run(offset, flat, count) for each run of `tile`'s elements that lie
// inside the result, consecutive along the last dim: `count` elements from
// `offset` in the tile (row-major), whose first has row-major index `flat`
// in the whole result. Position-dependent kernels fill those from `flat`
// on; the tile's other elements are padding.
template <class Run>
void for_each_run_in_tile(const ResultTile& tile, Run&& run) {
  const std::size_t rank = tile.shape.size();
  if (rank == 0) {
    run(int64_t{0}, int64_t{0}, int64_t{1});
    return;
  }
  const int64_t elements = numel(tile.shape);
  if (elements == 0) return;
  const std::size_t last = rank - 1;
  const int64_t row = tile.shape[last];
  const int64_t inside = std::clamp<int64_t>(tile.global_shape[last] - tile.begin[last], 0, row);
  std::vector<int64_t> index(rank, 0);  // over the leading dims
  for (int64_t offset = 0; offset < elements; offset += row) {
    bool in_result = inside > 0;
    int64_t flat = 0;
    for (std::size_t d = 0; d < rank && in_result; ++d) {
      const int64_t g = tile.begin[d] + index[d];
      in_result = g < tile.global_shape[d];
      flat = flat * tile.global_shape[d] + g;
    }
    if (in_result) run(offset, flat, inside);
    for (std::size_t d = last; d-- > 0 && ++index[d] == tile.shape[d];) index[d] = 0;
  }
}

// An op's tile kernel as its kernel: the whole result is one tile.
KernelFn whole_result_kernel(TiledKernelFn tiled, std::function<Shape(const OpArgs&)> shape_of) {
  return
      [tiled = std::move(tiled), shape_of = std::move(shape_of)](const OpArgs& args, std::span<const DenseTensor> in) {
        return tiled(args, in, ResultTile::whole(shape_of(args)));
      };
}

// ------------------------------------------------------------------- arange

// arange's arguments, read the way its result dtype reads them.
struct ArangeSpec {
  DType dtype = DType::kI64;
  int64_t length = 0;
  int64_t int_start = 0, int_step = 1;  // integer dtypes: the scalars truncated to int64
  double start = 0, step = 1;           // floating dtypes
};

ArangeSpec arange_spec(const OpArgs& args) {
  const FunctionSchema& schema = args.schema();
  const Constant start = schema.argument_index("start") >= 0 ? args.constant("start") : Constant(0);
  const Constant& end = args.constant("end");
  const Constant step = schema.argument_index("step") >= 0 ? args.constant("step") : Constant(1);
  ArangeSpec spec;
  const bool all_integral = is_integral_scalar(start) && is_integral_scalar(end) && is_integral_scalar(step);
  spec.dtype = args.get_optional_dtype("dtype").value_or(all_integral ? DType::kI64 : DType::kF32);
  if (spec.dtype == DType::kBool) throw Error("\"arange_cpu\" not implemented for 'Bool'");
  const double d_start = scalar_number(start), d_end = scalar_number(end), d_step = scalar_number(step);
  double length = 0;
  if (is_floating(spec.dtype)) {
    spec.start = d_start;
    spec.step = d_step;
    if (!(d_step > 0 || d_step < 0)) throw Error("step must be nonzero");
    if (!std::isfinite(d_start) || !std::isfinite(d_end)) {
      throw Error(fmt::format("unsupported range: {} -> {}", d_start, d_end));
    }
    if (!((d_step > 0 && d_end >= d_start) || (d_step < 0 && d_end <= d_start))) {
      throw Error("upper bound and larger bound inconsistent with step sign");
    }
    length = std::ceil((d_end - d_start) / d_step);
  } else {
    // Integer dtypes compute in int64 (so the scalars are truncated first).
    spec.int_start = scalar_to_int64(start);
    spec.int_step = scalar_to_int64(step);
    const int64_t int_end = scalar_to_int64(end);
    if (spec.int_step == 0) throw Error("step must be nonzero");
    if (!((spec.int_step > 0 && int_end >= spec.int_start) || (spec.int_step < 0 && int_end <= spec.int_start))) {
      throw Error("upper bound and larger bound inconsistent with step sign");
    }
    if (spec.dtype == DType::kI64) {
      // Exact ceil((end - start) / step): int64 has more precision than double.
      int64_t span = 0, rounded = 0;
      const int64_t sign = spec.int_step > 0 ? 1 : -1;
      if (__builtin_sub_overflow(int_end, spec.int_start, &span) ||
          __builtin_add_overflow(span, spec.int_step - sign, &rounded)) {
        throw Error("invalid size, possible overflow?");
      }
      spec.length = rounded / spec.int_step;
      return spec;
    }
    // As PyTorch, the other integer dtypes size the range from the scalars as given.
    length = std::ceil((d_end - d_start) / d_step);
  }
  if (!(length >= 0 && length < 9223372036854775808.0)) throw Error("invalid size, possible overflow?");
  spec.length = static_cast<int64_t>(length);
  return spec;
}

void register_arange(OpRegistry& r) {
  const auto def = [] {
    OpDef op;
    op.family = OpFamily::kCreation;
    op.position_dependent = true;  // element i is start + i * step
    op.infer = [](const OpArgs& args, std::span<const TensorType>) {
      const ArangeSpec spec = arange_spec(args);
      return std::vector<TensorType>{{spec.dtype, {spec.length}}};
    };
    op.sharding_rule = own_factors_rule;
    op.tiled_kernel = [](const OpArgs& args, std::span<const DenseTensor>, const ResultTile& tile) {
      const ArangeSpec spec = arange_spec(args);
      DenseTensor out = DenseTensor::zeros(spec.dtype, tile.shape);
      visit_dtype(spec.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* y = out.data_as<T>();
        for_each_run_in_tile(tile, [&](int64_t offset, int64_t first, int64_t count) {
          T* run = y + offset;
          for (int64_t k = 0, i = first; k < count; ++k, ++i) {
            if constexpr (std::is_integral_v<T>) {
              run[k] = static_cast<T>(spec.int_start + spec.int_step * i);
            } else {
              // start + step * i, in double for f32 and in float for bf16/f16, as PyTorch's CPU kernel.
              using Acc = std::conditional_t<std::is_same_v<T, float>, double, float>;
              run[k] = store<T>(static_cast<Acc>(spec.start) + static_cast<Acc>(spec.step) * static_cast<Acc>(i));
            }
          }
        });
      });
      return std::vector<DenseTensor>{std::move(out)};
    };
    op.kernel =
        whole_result_kernel(op.tiled_kernel, [](const OpArgs& args) { return Shape{arange_spec(args).length}; });
    return op;
  };
  const char* const options =
      "*, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
      "bool? pin_memory=None) -> Tensor";
  // Calls with a start name the overload: OpRegistry::overloads("aten::arange")
  // returns just the first op, whose name matches exactly.
  r.add(fmt::format("aten::arange(Scalar end, {}", options), def());
  r.add(fmt::format("aten::arange.start(Scalar start, Scalar end, {}", options), def());
  r.add(fmt::format("aten::arange.start_step(Scalar start, Scalar end, Scalar step=1, {}", options), def());
}

// ------------------------------------------------------ full, zeros, ones

// `fill` is the fill value's argument name, or empty for zeros/ones, whose
// value is `fixed`.
void add_filled(OpRegistry& r, std::string_view schema, std::string fill, int fixed) {
  const auto value_of = [fill, fixed](const OpArgs& args) {
    return fill.empty() ? Constant(fixed) : args.constant(fill);
  };
  // full's dtype follows its value (bool, int, float); zeros/ones default to f32.
  const auto dtype_of = [fill, value_of](const OpArgs& args) {
    if (const auto dtype = args.get_optional_dtype("dtype")) return *dtype;
    if (fill.empty()) return DType::kF32;
    const Constant value = value_of(args);
    if (value.kind() == Constant::Kind::kBool) return DType::kBool;
    return value.kind() == Constant::Kind::kInt ? DType::kI64 : DType::kF32;
  };
  OpDef def;
  def.family = OpFamily::kCreation;
  def.infer = [dtype_of](const OpArgs& args, std::span<const TensorType>) {
    return std::vector<TensorType>{{dtype_of(args), size_arg(args)}};
  };
  def.sharding_rule = own_factors_rule;
  def.output_shape_arg = "size";  // a constant fill: each device makes its own shard
  def.kernel = [dtype_of, value_of](const OpArgs& args, std::span<const DenseTensor>) {
    const DType dtype = dtype_of(args);
    DenseTensor out = DenseTensor::empty(dtype, size_arg(args));
    visit_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      const T v = checked_store<T>(value_of(args), dtype);
      std::fill_n(out.data_as<T>(), out.numel(), v);
    });
    return std::vector<DenseTensor>{std::move(out)};
  };
  r.add(schema, std::move(def));
}

void register_filled(OpRegistry& r) {
  const std::string options =
      "*, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
      "bool? pin_memory=None) -> Tensor";
  add_filled(r, "aten::full(SymInt[] size, Scalar fill_value, " + options, "fill_value", 0);
  add_filled(r, "aten::ones(SymInt[] size, " + options, "", 1);
  add_filled(r, "aten::zeros(SymInt[] size, " + options, "", 0);
}

// --------------------------------------------------------------- triu, tril

void add_triangle(OpRegistry& r, std::string_view schema, bool upper) {
  const std::string name = upper ? "triu" : "tril";
  OpDef def;
  def.family = OpFamily::kCreation;
  def.infer = [name](const OpArgs&, std::span<const TensorType> in) {
    if (in[0].rank() < 2) throw Error(name + ": input tensor must have at least 2 dimensions");
    return std::vector<TensorType>{in[0]};
  };
  def.sharding_rule = [](const OpArgs&, std::span<const TensorType> in, std::span<const TensorType> out) {
    RuleBuilder b(in, out);
    const auto rank = static_cast<int>(in[0].rank());
    for (int d = 0; d < rank; ++d) {
      b.add_factor({d}, {d}, in[0].shape[static_cast<std::size_t>(d)],
                   d >= rank - 2 ? FactorKind::kNeedReplication : FactorKind::kPassThrough);
    }
    return b.build();
  };
  def.kernel = [infer = def.infer, upper](const OpArgs& args, std::span<const DenseTensor> in) {
    const TensorType type = infer(args, types_of(in))[0];
    const DenseTensor& self = in[0];
    DenseTensor out = DenseTensor::empty(type.dtype, type.shape);
    std::memcpy(out.data(), self.data(), self.nbytes());
    const int64_t rows = type.shape[type.shape.size() - 2];
    const int64_t cols = type.shape.back();
    // Beyond these bounds the mask no longer changes; clamping keeps the sums small.
    const int64_t diagonal = std::clamp<int64_t>(args.get_int("diagonal"), -rows, cols);
    const std::size_t element = element_size(type.dtype);
    const int64_t matrices = rows * cols == 0 ? 0 : self.numel() / (rows * cols);
    // Zero bytes are zero in every dtype. Row i keeps columns j with
    // j - i >= diagonal (triu) or j - i <= diagonal (tril).
    for (int64_t m = 0; m < matrices; ++m) {
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t from = upper ? 0 : std::clamp<int64_t>(i + diagonal + 1, 0, cols);
        const int64_t to = upper ? std::clamp<int64_t>(i + diagonal, 0, cols) : cols;
        std::byte* row = out.data() + static_cast<std::size_t>((m * rows + i) * cols) * element;
        std::memset(row + static_cast<std::size_t>(from) * element, 0, static_cast<std::size_t>(to - from) * element);
      }
    }
    return std::vector<DenseTensor>{std::move(out)};
  };
  r.add(schema, std::move(def));
}

// ------------------------------------------------------------ rand, randn

enum class Distribution { kUniform, kNormal };

constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The counter-th output of splitmix64 started at mix64(seed).
constexpr uint64_t random_bits(int64_t seed, uint64_t counter) {
  return mix64(mix64(static_cast<uint64_t>(seed)) + (counter + 1) * 0x9E3779B97F4A7C15ULL);
}

// Element `flat_index` of a uniform draw with `seed` in a dtype of `bits`
// significand bits: the top `bits` of its random bits times 2^-bits, exact
// in the dtype and below 1 (f32 keeps 24, bf16 8 and f16 11: the rounding
// down of the 24-bit value). `scale` is 2^-bits.
float uniform_element(int64_t seed, int64_t flat_index, int bits, float scale) {
  return static_cast<float>(random_bits(seed, static_cast<uint64_t>(flat_index)) >> (64 - bits)) * scale;
}

// Element `flat_index` of a standard normal draw with `seed`. Each element
// is a pure function of its arguments, so a tensor is the concatenation of
// its elements drawn one by one.
double normal_element(int64_t seed, int64_t flat_index) {
  constexpr double k2ToMinus53 = 0x1p-53;
  const auto i = static_cast<uint64_t>(flat_index);
  const double u1 = static_cast<double>((random_bits(seed, 2 * i) >> 11) + 1) * k2ToMinus53;
  const double u2 = static_cast<double>(random_bits(seed, 2 * i + 1) >> 11) * k2ToMinus53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// Significand bits of the floating dtypes, for rand's rounding down.
int significand_bits(DType dtype) { return dtype == DType::kBF16 ? 8 : dtype == DType::kF16 ? 11 : 24; }

// Where a draw's seed comes from: the `int seed` constant, or a 0-dim i64
// tensor read at run time (the torch bridge feeds a fresh one per call, so
// one compiled graph draws new values each call).
enum class SeedSource { kConstant, kTensor };

template <Distribution kDist, SeedSource kSeed>
void add_random(OpRegistry& r, std::string_view schema) {
  const auto dtype_of = [](const OpArgs& args) {
    const DType dtype = args.get_optional_dtype("dtype").value_or(DType::kF32);
    if (!is_floating(dtype)) {
      // PyTorch's messages for torch.rand / torch.randn with such a dtype.
      throw Error(fmt::format("\"{}\" not implemented for '{}'",
                              kDist == Distribution::kUniform ? "check_uniform_bounds" : "normal_kernel_cpu",
                              scalar_type_name(dtype)));
    }
    return dtype;
  };
  OpDef def;
  def.family = OpFamily::kCreation;
  def.position_dependent = true;  // element i is a function of (seed, i)
  def.infer = [dtype_of](const OpArgs& args, std::span<const TensorType> in) {
    if constexpr (kSeed == SeedSource::kTensor) {
      if (in[0].dtype != DType::kI64 || in[0].rank() != 0) {
        throw Error(fmt::format("the seed must be a 0-dim i64 tensor, got {}", in[0].to_string()));
      }
    }
    return std::vector<TensorType>{{dtype_of(args), size_arg(args)}};
  };
  def.sharding_rule = own_factors_rule;
  def.tiled_kernel = [dtype_of](const OpArgs& args, std::span<const DenseTensor> in, const ResultTile& tile) {
    const DType dtype = dtype_of(args);
    int64_t seed = 0;
    if constexpr (kSeed == SeedSource::kTensor) {
      seed = in[0].data_as<int64_t>()[0];
    } else {
      seed = args.get_int("seed");
    }
    DenseTensor out = DenseTensor::zeros(dtype, tile.shape);
    const int bits = significand_bits(dtype);
    const float scale = std::ldexp(1.0f, -bits);
    visit_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      for_each_run_in_tile(tile, [&](int64_t offset, int64_t first, int64_t count) {
        T* run = out.data_as<T>() + offset;
        for (int64_t k = 0; k < count; ++k) {
          if constexpr (kDist == Distribution::kUniform) {
            run[k] = store<T>(uniform_element(seed, first + k, bits, scale));
          } else {
            run[k] = store<T>(normal_element(seed, first + k));
          }
        }
      });
    });
    return std::vector<DenseTensor>{std::move(out)};
  };
  def.kernel = whole_result_kernel(def.tiled_kernel, size_arg);
  r.add(schema, std::move(def));
}

}  // namespace

void register_creation_ops(OpRegistry& registry) {
  register_arange(registry);
  register_filled(registry);
  add_triangle(registry, "aten::triu(Tensor self, int diagonal=0) -> Tensor", true);
  add_triangle(registry, "aten::tril(Tensor self, int diagonal=0) -> Tensor", false);
  using enum Distribution;
  using enum SeedSource;
  add_random<kUniform, kConstant>(registry,
                                  "shardflow::rand(SymInt[] size, int seed, *, ScalarType? dtype=None) -> Tensor");
  add_random<kNormal, kConstant>(registry,
                                 "shardflow::randn(SymInt[] size, int seed, *, ScalarType? dtype=None) -> Tensor");
  add_random<kUniform, kTensor>(
      registry, "shardflow::rand.seed_tensor(SymInt[] size, Tensor seed, *, ScalarType? dtype=None) -> Tensor");
  add_random<kNormal, kTensor>(
      registry, "shardflow::randn.seed_tensor(SymInt[] size, Tensor seed, *, ScalarType? dtype=None) -> Tensor");
}

}  // namespace shardflow::ops
