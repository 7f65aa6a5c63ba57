// Element types: f32, bf16, f16, i64, i32, bool.
//
// bf16 and f16 are stored as 16-bit patterns and computed in f32 (round to
// nearest even on the way back), as PyTorch does on CPU.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>

namespace shardflow {

enum class DType : uint8_t { kF32, kBF16, kF16, kI64, kI32, kBool };

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kBool};

// The IR name: "f32", "bf16", "f16", "i64", "i32", "bool".
std::string_view dtype_name(DType dtype);
// Accepts the IR names and PyTorch's ("float32", "float", "bfloat16",
// "float16", "half", "int64", "long", "int32", "int", also "torch.float32").
std::optional<DType> dtype_from_name(std::string_view name);
// PyTorch's ScalarType name: "Float", "BFloat16", "Half", "Long", "Int", "Bool".
std::string_view scalar_type_name(DType dtype);

std::size_t element_size(DType dtype);
inline bool is_floating(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16; }

// torch.promote_types: bool < integers < floating; i32+i64 -> i64;
// bf16+f16 -> f32.
DType promote_types(DType a, DType b);

struct BFloat16 {
  uint16_t bits = 0;
};
struct Float16 {
  uint16_t bits = 0;
};

inline float to_float(BFloat16 value) { return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16); }
inline BFloat16 to_bfloat16(float value) {
  const auto bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) return {static_cast<uint16_t>((bits >> 16) | 0x40)};  // NaN
  const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);                                      // to nearest even
  return {static_cast<uint16_t>((bits + rounding) >> 16)};
}
inline float to_float(Float16 value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1F;
  const uint32_t mantissa = value.bits & 0x3FF;
  if (exponent == 0x1F) {  // inf, or NaN made quiet (as F16C's conversion does)
    const uint32_t quiet = mantissa != 0 ? 0x00400000 : 0;
    return std::bit_cast<float>(sign | 0x7F800000 | quiet | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24 (exact)
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}
Float16 to_float16(float value);

// Widens n 16-bit floats into dst, exactly (to_float's values, eight at a
// time by F16C where the build has it): the bulk form for casts and for
// weights read wide.
void to_floats(const BFloat16* src, int64_t n, float* dst);
void to_floats(const Float16* src, int64_t n, float* dst);

// Calls f(T{}) with the C++ type that stores `dtype`: float, BFloat16,
// Float16, int64_t, int32_t or bool.
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(BFloat16{});
    case DType::kF16:
      return f(Float16{});
    case DType::kI64:
      return f(int64_t{});
    case DType::kI32:
      return f(int32_t{});
    case DType::kBool:
      return f(bool{});
  }
  return f(float{});  // unreachable: the switch covers every dtype
}

// The type arithmetic on T is done in: float for the 16-bit floats, int32
// for bool (so that sums count and products are logical ands), T else.
template <class T>
struct ComputeTypeOf {
  using type = T;
};
template <>
struct ComputeTypeOf<BFloat16> {
  using type = float;
};
template <>
struct ComputeTypeOf<Float16> {
  using type = float;
};
template <>
struct ComputeTypeOf<bool> {
  using type = int32_t;
};
template <class T>
using ComputeType = typename ComputeTypeOf<T>::type;

template <class T>
inline ComputeType<T> load(T value) {
  return value;
}
inline float load(BFloat16 value) { return to_float(value); }
inline float load(Float16 value) { return to_float(value); }
inline int32_t load(bool value) { return value ? 1 : 0; }

template <class T, class C>
inline T store(C value) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return to_bfloat16(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, Float16>) {
    return to_float16(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, bool>) {
    return value != 0;
  } else {
    return static_cast<T>(value);
  }
}

}  // namespace shardflow
