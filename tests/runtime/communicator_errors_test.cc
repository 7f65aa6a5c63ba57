// Errors of the collectives: one row per bad call → the message run()
// reports. To add a case: a row with the program every device runs on a
// 4-device runtime and the expected message (or its tail after "device N: "
// when all members report it and any of them may come first).
//
// Also: a device that throws mid-collective ends the run on all devices
// within a second; members that agree on nothing never hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <thread>

#include "runtime_test_util.h"
#include "shardflow/base/error.h"

namespace sf = shardflow;
using sf::DeviceGroup;
using sf::DType;
using sf::ReduceOp;
using sf::testing_util::Bytes;
using testing::HasSubstr;

namespace {

using Program = std::function<void(int64_t device, sf::Communicator& comm)>;

const DeviceGroup kAll{{0, 1, 2, 3}};

struct ErrorCase {
  const char* name;
  Program program;
  const char* message;  // a substring of run()'s message
};

std::span<std::byte> buffer(std::size_t bytes) {
  // One aligned, thread-local scratch buffer per device thread is enough here.
  thread_local std::vector<std::byte> storage;
  storage.assign(1 << 16, std::byte{0});
  return std::span(storage).first(bytes);
}

const ErrorCase kErrors[] = {
    {"all_reduce_sizes",
     [](int64_t d, sf::Communicator& c) {
       c.all_reduce(kAll, buffer(d == 2 ? 12 : 16), DType::kF32, ReduceOp::kSum);
     },
     "all_reduce over group [0, 1, 2, 3]: device 0 passes 16 input bytes but device 2 passes 12"},
    {"all_reduce_dtypes",
     [](int64_t d, sf::Communicator& c) {
       c.all_reduce(kAll, buffer(16), d == 1 ? DType::kI32 : DType::kF32, ReduceOp::kSum);
     },
     "all_reduce over group [0, 1, 2, 3]: device 0 passes f32 data but device 1 passes i32 data"},
    {"all_reduce_ops",
     [](int64_t d, sf::Communicator& c) {
       c.all_reduce(kAll, buffer(16), DType::kF32, d == 3 ? ReduceOp::kMax : ReduceOp::kSum);
     },
     "all_reduce over group [0, 1, 2, 3]: device 0 reduces with sum but device 3 with max"},
    {"all_reduce_partial_element",
     [](int64_t, sf::Communicator& c) {
       c.all_reduce(kAll, buffer(6), DType::kF32, ReduceOp::kSum);
     },
     "all_reduce over group [0, 1, 2, 3]: device 0 passes 6 bytes, not a whole number of f32 "
     "elements"},
    {"all_reduce_misaligned",
     [](int64_t, sf::Communicator& c) {
       c.all_reduce(kAll, buffer(20).subspan(2, 8), DType::kI64, ReduceOp::kSum);
     },
     "all_reduce over group [0, 1, 2, 3]: device 0 passes a buffer not aligned to 8 bytes for i64"},
    {"kinds",
     [](int64_t d, sf::Communicator& c) {
       if (d == 2) {
         c.all_gather(kAll, buffer(4), buffer(16));
       } else {
         c.all_reduce(kAll, buffer(16), DType::kF32, ReduceOp::kSum);
       }
     },
     "collective mismatch over group [0, 1, 2, 3]: device 0 calls all_reduce but device 2 calls "
     "all_gather"},
    {"all_gather_output_size",
     [](int64_t d, sf::Communicator& c) {
       const auto out = buffer(64);
       c.all_gather(kAll, out.subspan(32, 8), out.first(d == 1 ? 24 : 32));
     },
     "all_gather over group [0, 1, 2, 3]: device 1 passes 8 input bytes and 24 output bytes; with "
     "4 members the output must have 32 bytes"},
    {"all_gather_overlap",
     [](int64_t, sf::Communicator& c) {
       const auto out = buffer(32);
       c.all_gather(kAll, out.subspan(1, 8), out);
     },
     "all_gather over group [0, 1, 2, 3]: device 0 passes overlapping input and output buffers "
     "(only its own chunk may be shared)"},
    {"reduce_scatter_split",
     [](int64_t, sf::Communicator& c) {
       const auto b = buffer(64);
       c.reduce_scatter(kAll, b.first(12), b.subspan(32, 4), DType::kBF16, ReduceOp::kSum);
     },
     "reduce_scatter over group [0, 1, 2, 3]: device 0 passes 6 bf16 elements, which do not split "
     "into 4 equal chunks"},
    {"all_to_all_split",
     [](int64_t, sf::Communicator& c) {
       const auto b = buffer(64);
       c.all_to_all(kAll, b.first(6), b.subspan(32, 6));
     },
     "all_to_all over group [0, 1, 2, 3]: device 0 passes 6 input bytes, which do not split into 4 "
     "equal chunks"},
    {"all_to_all_in_place",
     [](int64_t, sf::Communicator& c) {
       const auto b = buffer(16);
       c.all_to_all(kAll, b, b);
     },
     "all_to_all over group [0, 1, 2, 3]: device 0 passes overlapping input and output buffers"},
    {"permute_duplicate_target",
     [](int64_t, sf::Communicator& c) {
       const auto b = buffer(64);
       c.collective_permute(kAll, {{0, 1}, {2, 1}}, b.first(8), b.subspan(32, 8));
     },
     "collective_permute over group [0, 1, 2, 3]: device 1 is the target of two pairs, (0, 1) and "
     "(2, 1)"},
    {"permute_non_member",
     [](int64_t d, sf::Communicator& c) {
       const auto b = buffer(64);
       if (d < 2)
         c.collective_permute(DeviceGroup{{0, 1}}, {{0, 1}, {1, 2}}, b.first(8), b.subspan(32, 8));
     },
     "collective_permute over group [0, 1]: pair (1, 2) names device 2, which is not in the group"},
    {"permute_pairs_differ",
     [](int64_t d, sf::Communicator& c) {
       const auto b = buffer(64);
       c.collective_permute(kAll, {{0, d == 3 ? 2 : 1}}, b.first(8), b.subspan(32, 8));
     },
     "collective_permute over group [0, 1, 2, 3]: device 0 passes pairs [(0, 1)] but device 3 "
     "passes [(0, 2)]"},
    {"not_a_member",
     [](int64_t d, sf::Communicator& c) {
       if (d != 2) c.barrier(DeviceGroup{{0, 1}});
     },
     "device 3: device 3 is not in the group [0, 1]"},
    {"group_device_missing",
     [](int64_t, sf::Communicator& c) {
       c.barrier(DeviceGroup{{0, 7}});
     },
     "invalid device group [0, 7]: device 7 does not exist (the runtime has 4 devices)"},
    {"group_device_twice",
     [](int64_t, sf::Communicator& c) {
       c.barrier(DeviceGroup{{1, 0, 1}});
     },
     "invalid device group [1, 0, 1]: device 1 appears twice"},
    {"group_empty", [](int64_t, sf::Communicator& c) { c.barrier(DeviceGroup{}); },
     "invalid device group []: a group needs at least one device"},
    {"groups_disagree",
     [](int64_t d, sf::Communicator& c) {
       if (d == 3) return;
       c.barrier(DeviceGroup{{d, (d + 1) % 3}});
     },
     "device 0: deadlock: no device can proceed: device 0 waits in barrier over [0, 1] (1 of 2 "
     "members arrived); device 1 waits in barrier over [1, 2] (1 of 2 members arrived); device 2 "
     "waits in barrier over [2, 0] (1 of 2 members arrived); device 3 already returned from the "
     "program"},
    {"member_returned",
     [](int64_t d, sf::Communicator& c) {
       c.barrier(kAll);
       if (d != 1) c.all_reduce(kAll, buffer(8), DType::kI64, ReduceOp::kMax);
     },
     "device 0: deadlock: no device can proceed: devices 0, 2, 3 wait in all_reduce over [0, 1, 2, "
     "3] (3 of 4 members arrived); device 1 already returned from the program"},
};

class CollectiveErrors : public sf::testing_util::RuntimeTestWithParam<ErrorCase> {};

TEST_P(CollectiveErrors, ReportsTheMistake) {
  const ErrorCase& c = GetParam();
  sf::Runtime rt = sf::Runtime::local(4);
  try {
    rt.run(c.program);
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    EXPECT_THAT(error.what(), HasSubstr(c.message));
    EXPECT_THAT(error.what(), testing::StartsWith("device "));
  }
  // The runtime is usable after the failure.
  Bytes data(8, std::byte{1});
  rt.run([&](int64_t device, sf::Communicator& comm) {
    if (device == 0) comm.all_reduce(DeviceGroup{{0}}, data, DType::kBool, ReduceOp::kMin);
    comm.barrier(kAll);
  });
}

INSTANTIATE_TEST_SUITE_P(, CollectiveErrors, testing::ValuesIn(kErrors),
                         [](const auto& test) { return std::string(test.param.name); });

class CollectiveMismatch : public sf::testing_util::RuntimeTest {};

// A mismatch throws the same error on every member, touches no buffer, and
// leaves the group usable.
TEST_F(CollectiveMismatch, ThrowsOnEveryMemberAndKeepsTheGroupUsable) {
  sf::Runtime rt = sf::Runtime::local(4);
  std::vector<Bytes> data(4, Bytes(16, std::byte{3}));
  std::vector<std::string> messages(4);
  rt.run([&](int64_t device, sf::Communicator& comm) {
    const auto d = static_cast<std::size_t>(device);
    try {
      comm.all_reduce(kAll, std::span(data[d]).first(device == 1 ? 8 : 16), DType::kI32,
                      ReduceOp::kSum);
    } catch (const sf::Error& error) {
      messages[d] = error.what();
    }
    comm.all_reduce(kAll, data[d], DType::kI32, ReduceOp::kSum);
  });
  for (const std::string& message : messages) {
    EXPECT_EQ(message,
              "all_reduce over group [0, 1, 2, 3]: device 0 passes 16 input bytes but "
              "device 1 passes 8");
  }
  const Bytes expected(16, std::byte{12});  // 4 x 0x03030303 in every i32
  for (const Bytes& result : data) EXPECT_EQ(result, expected);
}

// ---------------------------------------------------------------- failures

class DeviceFailure : public sf::testing_util::RuntimeTest {};

using Clock = std::chrono::steady_clock;

// Device 3 throws while the others wait for it in an all_reduce: run() fails
// on every device with device 3's error, within a second of the throw.
TEST_F(DeviceFailure, EndsTheRunOnEveryDeviceWithinOneSecond) {
  sf::Runtime rt = sf::Runtime::local(8);
  const DeviceGroup all{{0, 1, 2, 3, 4, 5, 6, 7}};
  for (const bool shardflow_error : {true, false}) {
    std::atomic<Clock::rep> thrown_at{0};
    std::atomic<int> aborted{0};
    const auto start = Clock::now();
    try {
      rt.run([&](int64_t device, sf::Communicator& comm) {
        std::vector<float> data(1 << 16, 1.0f);
        for (int i = 0; i < 1000; ++i) {
          if (device == 3 && i == 5) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            thrown_at = Clock::now().time_since_epoch().count();
            if (shardflow_error) throw sf::Error("kernel failed: boom");
            throw std::runtime_error("kernel failed: boom");
          }
          try {
            comm.all_reduce(all, std::as_writable_bytes(std::span(data)), DType::kF32,
                            ReduceOp::kSum);
          } catch (const sf::Error&) {
            ++aborted;
            throw;
          }
        }
      });
      FAIL() << "no error";
    } catch (const sf::Error& error) {
      const auto returned = Clock::now();
      EXPECT_STREQ(error.what(), "device 3: kernel failed: boom");
      ASSERT_NE(thrown_at.load(), 0);
      const auto latency = returned - Clock::time_point(Clock::duration(thrown_at.load()));
      EXPECT_LT(latency, std::chrono::seconds(1));
      EXPECT_LT(returned - start, std::chrono::seconds(2));
      EXPECT_EQ(aborted.load(), 7);  // every other device was woken by the abort
    }
  }
}

// A device that fails while the others compute: they stop at their next
// collective.
TEST_F(DeviceFailure, StopsComputingDevicesAtTheirNextCollective) {
  sf::Runtime rt = sf::Runtime::local(4);
  std::atomic<int> collectives_entered{0};
  EXPECT_THROW(
      {
        try {
          rt.run([&](int64_t device, sf::Communicator& comm) {
            if (device == 0) throw sf::Error("bad input");
            std::this_thread::sleep_for(std::chrono::milliseconds(100));  // "computing"
            ++collectives_entered;
            comm.barrier(kAll);
            ADD_FAILURE() << "device " << device << " passed a barrier after the abort";
          });
        } catch (const sf::Error& error) {
          EXPECT_STREQ(error.what(), "device 0: bad input");
          throw;
        }
      },
      sf::Error);
  EXPECT_EQ(collectives_entered.load(), 3);
}

}  // namespace
