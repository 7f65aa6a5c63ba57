// The 16-bit floats' conversions to f32: every bit pattern, one at a time
// and in bulk (the vector path and its scalar tail).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "shardflow/tensor/dtype.h"

namespace sf = shardflow;

namespace {

// IEEE binary16's value of `bits` from its definition (not NaN).
double half_value(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return (bits & 0x8000) != 0 ? -magnitude : magnitude;
}

std::vector<sf::Float16> every_half() {
  std::vector<sf::Float16> halves(65536);
  for (uint32_t bits = 0; bits < halves.size(); ++bits) halves[bits] = {static_cast<uint16_t>(bits)};
  return halves;
}

TEST(Float16, EveryPatternWidensToItsValueAndNaNsComeOutQuiet) {
  for (const sf::Float16 half : every_half()) {
    const float wide = sf::to_float(half);
    const bool nan = ((half.bits >> 10) & 0x1F) == 0x1F && (half.bits & 0x3FF) != 0;
    if (nan) {
      ASSERT_TRUE(std::isnan(wide)) << half.bits;
      EXPECT_NE(std::bit_cast<uint32_t>(wide) & 0x00400000u, 0u) << "quiet bit of " << half.bits;
      EXPECT_EQ(std::signbit(wide), (half.bits & 0x8000) != 0) << half.bits;
    } else if (((half.bits >> 10) & 0x1F) == 0x1F) {
      EXPECT_EQ(wide, (half.bits & 0x8000) != 0 ? -INFINITY : INFINITY) << half.bits;
    } else {
      EXPECT_EQ(static_cast<double>(wide), half_value(half.bits)) << half.bits;
      EXPECT_EQ(std::signbit(wide), (half.bits & 0x8000) != 0) << half.bits;  // -0 too
    }
  }
}

TEST(Float16, BulkWideningHasTheBitsOfOneAtATime) {
  const std::vector<sf::Float16> halves = every_half();
  // From offsets 0 and 3 and to lengths that are and are not multiples of 8.
  for (const int64_t offset : {0, 3}) {
    for (const int64_t n : {int64_t{0}, int64_t{5}, int64_t{8}, int64_t{13}, int64_t{65536 - offset}}) {
      std::vector<float> wide(static_cast<std::size_t>(n));
      sf::to_floats(halves.data() + offset, n, wide.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(wide[static_cast<std::size_t>(i)]),
                  std::bit_cast<uint32_t>(sf::to_float(halves[static_cast<std::size_t>(offset + i)])))
            << "pattern " << offset + i << " of " << n;
      }
    }
  }
}

TEST(BFloat16, BulkWideningIsTheHighHalfOfTheFloat) {
  std::vector<sf::BFloat16> values(65536);
  for (uint32_t bits = 0; bits < values.size(); ++bits) values[bits] = {static_cast<uint16_t>(bits)};
  std::vector<float> wide(values.size());
  sf::to_floats(values.data(), static_cast<int64_t>(values.size()), wide.data());
  for (uint32_t bits = 0; bits < values.size(); ++bits) {
    ASSERT_EQ(std::bit_cast<uint32_t>(wide[bits]), bits << 16) << bits;
  }
}

}  // namespace
