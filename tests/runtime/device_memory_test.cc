// device_memory(): what each device's part of a compiled program allocates,
// like torch.cuda.max_memory_allocated per device.
#include <gtest/gtest.h>

#include <numeric>
#include <optional>

#include "shardflow/runtime/runtime.h"
#include "shardflow/shardflow.h"
#include "shardflow/tensor/device_memory.h"

namespace sf = shardflow;

namespace {

constexpr int64_t kRows = 1024, kCols = 256;
constexpr int64_t kBytes = kRows * kCols * 4;  // one f32 activation

sf::Tensor step_body(const sf::Tensor& x) { return sf::silu(x * 2) + x; }

// The most a step allocated on `device` on top of what it held before.
int64_t step_peak(int64_t device, const std::function<void()>& step) {
  const int64_t before = sf::device_memory(device).current_bytes;
  sf::reset_device_memory_peaks();
  step();
  return sf::device_memory(device).peak_bytes - before;
}

TEST(DeviceMemory, OneDeviceStepCountsItsActivationsAndReleasesThem) {
  auto step = sf::compile(step_body);
  const sf::Tensor x = sf::randn({kRows, kCols}, 1);
  step(x);  // traced; the rest measures the cached program
  const int64_t before = sf::device_memory(0).current_bytes;
  std::optional<sf::Tensor> y;
  const int64_t peak = step_peak(0, [&] { y = step(x); });
  EXPECT_GE(peak, 2 * kBytes) << "x * 2 and the result are alive together";
  EXPECT_LE(peak, 4 * kBytes);
  EXPECT_EQ(sf::device_memory(0).current_bytes - before, kBytes) << "the result is still held";
  y.reset();
  EXPECT_EQ(sf::device_memory(0).current_bytes, before);
}

TEST(DeviceMemory, ShardingOverFourDevicesDividesTheStepMemory) {
  const sf::Tensor x_value = sf::randn({kRows, kCols}, 2);
  auto one_device = sf::compile(step_body);
  one_device(x_value);
  const int64_t one = step_peak(0, [&] { one_device(x_value); });

  sf::Runtime runtime = sf::Runtime::local(4);
  std::vector<int64_t> ids(4);
  std::iota(ids.begin(), ids.end(), 0);
  sf::Tensor x(x_value.value());
  sf::mark_sharding(x, sf::Mesh(ids, {4}, {"data"}), {"data", sf::none});
  auto sharded = sf::compile(step_body);
  sharded(x);
  std::vector<int64_t> before(4);
  for (int64_t d = 0; d < 4; ++d) before[static_cast<std::size_t>(d)] = sf::device_memory(d).current_bytes;
  sf::reset_device_memory_peaks();
  const sf::Tensor y = sharded(x);
  for (int64_t d = 0; d < 4; ++d) {
    const int64_t peak = sf::device_memory(d).peak_bytes - before[static_cast<std::size_t>(d)];
    EXPECT_GT(peak, 0) << "device " << d;
    EXPECT_LE(peak, one / 4) << "device " << d << " of 4 (one device: " << one << " bytes)";
  }
}

TEST(DeviceMemory, AWholeInputIsReadWhereItLiesNotCopiedPerDevice) {
  // An input fed whole (not laid out: a torch parameter viewed without a
  // copy) that a device reads whole is not copied for the step.
  const sf::Tensor x = sf::randn({kRows, kCols}, 3);
  for (const bool with_runtime : {false, true}) {
    std::optional<sf::Runtime> one_device;
    if (with_runtime) one_device.emplace(sf::Runtime::local(1));
    auto twice = sf::compile([](const sf::Tensor& v) { return v * 2; });
    twice(x);
    const int64_t one = step_peak(0, [&] { twice(x); });
    EXPECT_GE(one, kBytes);
    EXPECT_LT(one, 2 * kBytes) << "the result, and no copy of x; runtime: " << with_runtime;
  }

  // Every device of four reads x whole against its columns of w.
  sf::Runtime runtime = sf::Runtime::local(4);
  std::vector<int64_t> ids(4);
  std::iota(ids.begin(), ids.end(), 0);
  sf::Tensor w(sf::randn({kCols, kCols}, 4).value());
  sf::mark_sharding(w, sf::Mesh(ids, {4}, {"model"}), {sf::none, "model"});
  auto product = sf::compile([](const sf::Tensor& a, const sf::Tensor& b) { return sf::matmul(a, b); });
  product(x, w);
  std::vector<int64_t> before(4);
  for (int64_t d = 0; d < 4; ++d) before[static_cast<std::size_t>(d)] = sf::device_memory(d).current_bytes;
  sf::reset_device_memory_peaks();
  const sf::Tensor y = product(x, w);
  for (int64_t d = 0; d < 4; ++d) {
    const int64_t peak = sf::device_memory(d).peak_bytes - before[static_cast<std::size_t>(d)];
    EXPECT_GE(peak, kBytes / 4) << "device " << d << ": its columns of the result";
    EXPECT_LT(peak, kBytes / 2) << "device " << d << ": and no copy of x";
  }
}

TEST(DeviceMemory, OnlyBuffersMadeInAScopeCount) {
  const int64_t before = sf::device_memory(5).current_bytes;
  const sf::DenseTensor outside = sf::DenseTensor::zeros(sf::DType::kF32, {1000});
  EXPECT_EQ(sf::device_memory(5).current_bytes, before);
  std::optional<sf::DenseTensor> inner, outer;
  {
    const sf::DeviceMemoryScope five(5);
    outer = sf::DenseTensor::zeros(sf::DType::kF32, {1000});  // 4000 bytes, 4032 with alignment
    {
      const sf::DeviceMemoryScope six(6);
      inner = sf::DenseTensor::zeros(sf::DType::kF32, {16});
    }
    EXPECT_EQ(sf::device_memory(5).current_bytes - before, 4032);
  }
  EXPECT_EQ(sf::device_memory(6).current_bytes, 64);
  const sf::DenseTensor after = sf::DenseTensor::zeros(sf::DType::kF32, {1000});
  EXPECT_EQ(sf::device_memory(5).current_bytes - before, 4032) << "the scope ended";
  outer.reset();
  inner.reset();
  EXPECT_EQ(sf::device_memory(5).current_bytes, before);
  EXPECT_EQ(sf::device_memory(6).current_bytes, 0);
  EXPECT_EQ(sf::device_memory(1000).peak_bytes, 0) << "a device never seen";
}

}  // namespace
