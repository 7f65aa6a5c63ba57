// DenseTensor buffers: the alignment kernels rely on, fresh and recycled;
// sizes that do not fit.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "shardflow/base/error.h"
#include "shardflow/tensor/dense_tensor.h"

namespace sf = shardflow;

namespace {

uintptr_t address(const sf::DenseTensor& t) { return reinterpret_cast<uintptr_t>(t.data()); }

TEST(DenseTensor, SmallBuffersAre64ByteAligned) {
  for (int64_t n : {1, 3, 16, 1000, 16000}) {  // below 64 KiB
    const sf::DenseTensor t = sf::DenseTensor::empty(sf::DType::kF32, {n});
    EXPECT_EQ(address(t) % 64, 0u) << n << " floats";
  }
}

// Matrix-vector kernels stream weights measurably faster from a page start.
TEST(DenseTensor, BuffersOf64KiBOrMoreStartOnAPage) {
  for (int round = 0; round < 2; ++round) {  // the second round gets recycled buffers
    std::vector<sf::DenseTensor> held;
    for (int64_t n : {16384, 16385, 589824, 1 << 22}) {
      held.push_back(sf::DenseTensor::empty(sf::DType::kF32, {n}));
      EXPECT_EQ(address(held.back()) % 4096, 0u) << n << " floats, round " << round;
      held.back().data_as<float>()[n - 1] = 1.0f;  // the whole size is there
    }
  }
}

}  // namespace

namespace {

// Element counts past int64 and byte counts past 2^63 are errors, never a
// wrapped-around small buffer; a zero extent makes any shape empty.
TEST(DenseTensor, SizesBeyondInt64AreErrors) {
  constexpr int64_t kHalf = int64_t{1} << 62;
  EXPECT_EQ(sf::numel(sf::Shape{0, kHalf, kHalf}), 0);
  EXPECT_EQ(sf::numel(sf::Shape{kHalf, 1}), kHalf);
  EXPECT_THROW(sf::numel(sf::Shape{kHalf, 4}), sf::Error);
  EXPECT_THROW(sf::DenseTensor::empty(sf::DType::kF32, {kHalf, 4}), sf::Error);
  EXPECT_THROW(sf::DenseTensor::zeros(sf::DType::kF32, {int64_t{1} << 61}), sf::Error);  // 2^63 bytes
  EXPECT_EQ(sf::DenseTensor::zeros(sf::DType::kF32, {0, kHalf}).numel(), 0);
}

}  // namespace
