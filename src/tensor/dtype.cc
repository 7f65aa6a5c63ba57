#include "shardflow/tensor/dtype.h"

#include <cmath>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace shardflow {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI64:
      return "i64";
    case DType::kI32:
      return "i32";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

std::string_view scalar_type_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "Float";
    case DType::kBF16:
      return "BFloat16";
    case DType::kF16:
      return "Half";
    case DType::kI64:
      return "Long";
    case DType::kI32:
      return "Int";
    case DType::kBool:
      return "Bool";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {{"f32", DType::kF32},       {"float32", DType::kF32}, {"float", DType::kF32},
                                       {"Float", DType::kF32},     {"bf16", DType::kBF16},   {"bfloat16", DType::kBF16},
                                       {"BFloat16", DType::kBF16}, {"f16", DType::kF16},     {"float16", DType::kF16},
                                       {"half", DType::kF16},      {"Half", DType::kF16},    {"i64", DType::kI64},
                                       {"int64", DType::kI64},     {"long", DType::kI64},    {"Long", DType::kI64},
                                       {"i32", DType::kI32},       {"int32", DType::kI32},   {"int", DType::kI32},
                                       {"Int", DType::kI32},       {"bool", DType::kBool},   {"Bool", DType::kBool}};
  for (const Alias& alias : kAliases) {
    if (alias.name == name) return alias.dtype;
  }
  return std::nullopt;
}

std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kBool:
      return 1;
  }
  return 1;
}

// Category rank: bool 0, integral 1, floating 2.
static int category(DType dtype) {
  if (dtype == DType::kBool) return 0;
  return is_floating(dtype) ? 2 : 1;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  if (category(a) == 1) return DType::kI64;  // i32 with i64
  // Two different floats: f32 wins; bf16 with f16 is f32.
  return DType::kF32;
}

void to_floats(const BFloat16* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

void to_floats(const Float16* src, int64_t n, float* dst) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(halves));
  }
#endif
  for (; i < n; ++i) dst[i] = to_float(src[i]);
}

Float16 to_float16(float value) {
  const auto bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude > 0x7F800000) return {static_cast<uint16_t>(sign | 0x7E00)};   // NaN
  if (magnitude >= 0x477FF000) return {static_cast<uint16_t>(sign | 0x7C00)};  // overflow: inf
  if (magnitude < 0x38800000) {
    // Subnormal or zero: round magnitude * 2^24 to the nearest even integer.
    const float scaled = std::bit_cast<float>(magnitude) * 16777216.0f;
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)))};
  }
  // Normal: rebias the exponent, round the mantissa to nearest even.
  const uint32_t rounded = magnitude + 0xFFF + ((magnitude >> 13) & 1);
  return {static_cast<uint16_t>(sign | ((rounded - 0x38000000) >> 13))};
}

}  // namespace shardflow
