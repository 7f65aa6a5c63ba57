// Helpers for runtime tests: a watchdog that kills a hung test, random data
// of every dtype, and straightforward reference collectives on host vectors.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "shardflow/runtime/communicator.h"
#include "shardflow/runtime/runtime.h"

namespace shardflow::testing_util {

using Bytes = std::vector<std::byte>;

// Aborts the test program when the test that owns it runs longer than
// `limit`: a hang in the runtime must fail the test, not stall CI.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit = std::chrono::seconds(20));
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_changed_;
  bool done_ = false;
  std::thread thread_;
};

// Fixtures that run every test under a Watchdog.
class RuntimeTest : public testing::Test {
  Watchdog watchdog_;
};
template <class Param>
class RuntimeTestWithParam : public testing::TestWithParam<Param> {
  Watchdog watchdog_;
};

// `count` valid values of `dtype`: finite floats in [-8, 8), integers in
// [-1000, 1000], bools 0/1.
Bytes random_values(DType dtype, std::size_t count, uint32_t seed);
// Arbitrary bytes.
Bytes random_bytes(std::size_t count, uint32_t seed);

// The element-wise reduction of `inputs` in their order (16-bit floats
// combined in f32 and rounded once; integer sums wrap; NaN propagates).
Bytes reference_reduce(DType dtype, ReduceOp op, const std::vector<Bytes>& inputs);

// Equal as values: bitwise, except that any NaN equals any NaN of the same dtype.
bool same_values(DType dtype, const Bytes& a, const Bytes& b);

// A group of `size` devices out of 8, in a scrambled order so that group
// order differs from device order: {5, 2, 7, 0, 3, 6, 1, 4}[0:size].
DeviceGroup scrambled_group(int64_t size);

// Bytes [begin, begin + count) of `bytes`.
Bytes sub_bytes(const Bytes& bytes, std::size_t begin, std::size_t count);

}  // namespace shardflow::testing_util
