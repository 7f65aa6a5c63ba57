// Runtime: device threads, reuse across runs, first-error reporting, the
// current-runtime device count and the kernel thread setting.
#include "shardflow/runtime/runtime.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "runtime_test_util.h"
#include "shardflow/base/error.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/tensor/gemm.h"


namespace sf = shardflow;
using sf::DeviceGroup;
using sf::DType;
using sf::ReduceOp;

namespace {

class Runtime : public sf::testing_util::RuntimeTest {};

DeviceGroup all_devices(int64_t n) {
  DeviceGroup group;
  for (int64_t d = 0; d < n; ++d) group.devices.push_back(d);
  return group;
}

TEST_F(Runtime, RunsEveryDeviceOnItsOwnThread) {
  sf::Runtime rt = sf::Runtime::local(8);
  EXPECT_EQ(rt.num_devices(), 8);
  EXPECT_EQ(rt.devices_on_this_host(), 8);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::vector<int> calls(8);
  rt.run([&](int64_t device, sf::Communicator& comm) {
    EXPECT_EQ(comm.device(), device);
    EXPECT_EQ(comm.num_devices(), 8);
    ++calls[static_cast<std::size_t>(device)];
    const std::lock_guard lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(calls, std::vector<int>(8, 1));
  EXPECT_EQ(threads.size(), 8u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

// The same threads serve run after run; the communicators keep working.
TEST_F(Runtime, IsReusedForAHundredRuns) {
  sf::Runtime rt = sf::Runtime::local(8);
  const DeviceGroup all = all_devices(8);
  std::vector<std::thread::id> first_threads(8);
  for (int iteration = 0; iteration < 100; ++iteration) {
    std::vector<int64_t> values(8);
    std::atomic<int> same_thread{0};
    rt.run([&](int64_t device, sf::Communicator& comm) {
      const auto d = static_cast<std::size_t>(device);
      if (iteration == 0) first_threads[d] = std::this_thread::get_id();
      if (first_threads[d] == std::this_thread::get_id()) ++same_thread;
      values[d] = device + iteration;
      comm.all_reduce(all, std::as_writable_bytes(std::span(&values[d], 1)), DType::kI64,
                      ReduceOp::kSum);
    });
    // sum over d of (d + iteration) = 28 + 8 * iteration
    EXPECT_EQ(values, std::vector<int64_t>(8, 28 + 8 * iteration)) << "run " << iteration;
    EXPECT_EQ(same_thread.load(), 8);
  }
}

// Failed runs (an exception, a mismatch, a deadlock) leave the runtime ready
// for the next run.
TEST_F(Runtime, RecoversFromFailedRuns) {
  sf::Runtime rt = sf::Runtime::local(4);
  const DeviceGroup all = all_devices(4);
  for (int iteration = 0; iteration < 30; ++iteration) {
    const int failure = iteration % 3;
    EXPECT_THROW(rt.run([&](int64_t device, sf::Communicator& comm) {
      comm.barrier(all);
      if (failure == 0 && device == 2) throw sf::Error("boom");
      if (failure == 1) {
        float value = 1;
        comm.all_reduce(all, std::as_writable_bytes(std::span(&value, device == 0 ? 0 : 1)),
                        DType::kF32, ReduceOp::kSum);
      }
      if (failure == 2 && device != 1) comm.barrier(all);
    }),
                 sf::Error);
    std::vector<float> values(4, 1.0f);
    rt.run([&](int64_t device, sf::Communicator& comm) {
      comm.all_reduce(
          all, std::as_writable_bytes(std::span(&values[static_cast<std::size_t>(device)], 1)),
          DType::kF32, ReduceOp::kSum);
    });
    EXPECT_EQ(values, std::vector<float>(4, 4.0f)) << "after failure kind " << failure;
  }
}

// The first error is reported, not the abort errors it causes nor later ones.
TEST_F(Runtime, ReportsTheFirstError) {
  sf::Runtime rt = sf::Runtime::local(8);
  try {
    rt.run([&](int64_t device, sf::Communicator&) {
      if (device == 5) throw sf::Error("first");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (device == 2) throw sf::Error("second");
    });
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    EXPECT_STREQ(error.what(), "device 5: first");
  }
}

TEST_F(Runtime, WrapsForeignExceptions) {
  sf::Runtime rt = sf::Runtime::local(2);
  try {
    rt.run([&](int64_t device, sf::Communicator&) {
      if (device == 1) throw 42;
    });
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    EXPECT_STREQ(error.what(), "device 1: unknown exception");
  }
}

TEST_F(Runtime, RejectsNestedRuns) {
  sf::Runtime rt = sf::Runtime::local(2);
  try {
    rt.run([&](int64_t device, sf::Communicator&) {
      if (device == 0) rt.run([](int64_t, sf::Communicator&) {});
    });
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    EXPECT_THAT(error.what(), testing::StartsWith("device 0: Runtime::run called while a run is in "
                                                  "progress"));
  }
  rt.run([](int64_t, sf::Communicator&) {});  // still usable
}

TEST_F(Runtime, RejectsBadDeviceCounts) {
  EXPECT_THROW(sf::Runtime::local(0), sf::Error);
  EXPECT_THROW(sf::Runtime::local(-3), sf::Error);
  // A thread per device: a million would end the process, not the run.
  try {
    sf::Runtime::local(1 << 20);
    ADD_FAILURE() << "2^20 in-process devices were accepted";
  } catch (const sf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be in [1, 4096] (in-process devices are threads; run more as MPI "
                                         "ranks), got 1048576"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Runtime, SingleDevice) {
  sf::Runtime rt = sf::Runtime::local(1);
  std::vector<int32_t> data{1, 2, 3, 4};
  std::vector<int32_t> gathered(4), scattered(4);
  rt.run([&](int64_t, sf::Communicator& comm) {
    const DeviceGroup self{{0}};
    comm.all_reduce(self, std::as_writable_bytes(std::span(data)), DType::kI32, ReduceOp::kMin);
    comm.all_gather(self, std::as_bytes(std::span(data)),
                    std::as_writable_bytes(std::span(gathered)));
    comm.reduce_scatter(self, std::as_bytes(std::span(data)),
                        std::as_writable_bytes(std::span(scattered)), DType::kI32, ReduceOp::kSum);
    comm.barrier(self);
  });
  EXPECT_EQ(data, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(gathered, data);
  EXPECT_EQ(scattered, data);
}

TEST_F(Runtime, CanBeMoved) {
  sf::Runtime first = sf::Runtime::local(3);
  sf::Runtime second(std::move(first));
  EXPECT_EQ(second.num_devices(), 3);
  std::atomic<int> ran{0};
  second.run([&](int64_t, sf::Communicator& comm) {
    comm.barrier(all_devices(3));
    ++ran;
  });
  EXPECT_EQ(ran.load(), 3);
}

// While a runtime exists, meshes validate against its device count.
TEST_F(Runtime, IsTheCurrentRuntime) {
  const auto before = sf::global_device_count();
  {
    sf::Runtime rt = sf::Runtime::local(8);
    EXPECT_EQ(sf::global_device_count(), 8);
    EXPECT_THROW(sf::Mesh({0, 1, 2, 3}, {4}), sf::Error);  // covers 4 of 8 devices
    {
      sf::Runtime inner = sf::Runtime::local(4);
      EXPECT_EQ(sf::global_device_count(), 4);
      EXPECT_NO_THROW(sf::Mesh({0, 1, 2, 3}, {2, 2}));
    }
    EXPECT_EQ(sf::global_device_count(), 8);
  }
  EXPECT_EQ(sf::global_device_count(), before);
}

// Kernels run on the calling device thread inside a multi-device runtime;
// the previous count comes back afterwards.
TEST_F(Runtime, RunsKernelsSingleThreaded) {
  const int before = sf::kernel_threads();
  {
    sf::Runtime rt = sf::Runtime::local(2);
    EXPECT_EQ(sf::kernel_threads(), 1);
  }
  EXPECT_EQ(sf::kernel_threads(), before);
}

std::vector<int> cpus_of(pthread_t thread) {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(pthread_getaffinity_np(thread, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// Sets an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// The CPU each device thread may run on, by device.
std::vector<std::vector<int>> device_cpus(sf::Runtime& rt) {
  std::vector<std::vector<int>> cpus(static_cast<std::size_t>(rt.num_devices()));
  rt.run([&](int64_t device, sf::Communicator&) { cpus[static_cast<std::size_t>(device)] = cpus_of(pthread_self()); });
  return cpus;
}

// With at least as many devices as CPUs, device threads are pinned
// round-robin over the CPUs the process may use (so the scheduler cannot
// stack devices that wait on each other on one core); with CPUs to spare
// they are not, unless SHARDFLOW_PIN_DEVICES=1; =0 never pins; the caller's
// own affinity is untouched.
TEST_F(Runtime, PinsEachDeviceThreadToOneOfTheAllowedCpus) {
  const std::vector<int> allowed = cpus_of(pthread_self());
  if (allowed.size() < 2) GTEST_SKIP() << "pinning needs at least 2 CPUs; this process may use " << allowed.size();
  const int64_t devices = static_cast<int64_t>(allowed.size()) + 1;  // one more: the count wraps
  {
    sf::Runtime rt = sf::Runtime::local(devices);
    const auto cpus = device_cpus(rt);
    for (int64_t d = 0; d < devices; ++d) {
      EXPECT_EQ(cpus[static_cast<std::size_t>(d)],
                std::vector<int>{allowed[static_cast<std::size_t>(d) % allowed.size()]})
          << "device " << d;
    }
    EXPECT_EQ(cpus_of(pthread_self()), allowed);
  }
  {
    ScopedEnv off("SHARDFLOW_PIN_DEVICES", "0");
    sf::Runtime rt = sf::Runtime::local(devices);
    for (const auto& cpus : device_cpus(rt)) EXPECT_EQ(cpus, allowed);
  }
  {
    sf::Runtime rt = sf::Runtime::local(1);  // one device: its kernels' pool has the cores
    EXPECT_EQ(device_cpus(rt)[0], allowed);
  }
  if (allowed.size() < 3) return;  // fewer devices than CPUs needs 2 devices on 3 or more
  {
    sf::Runtime rt = sf::Runtime::local(2);
    for (const auto& cpus : device_cpus(rt)) EXPECT_EQ(cpus, allowed);
  }
  {
    ScopedEnv always("SHARDFLOW_PIN_DEVICES", "1");
    sf::Runtime rt = sf::Runtime::local(2);
    EXPECT_EQ(device_cpus(rt), (std::vector<std::vector<int>>{{allowed[0]}, {allowed[1]}}));
  }
}

TEST_F(Runtime, RejectsABadPinningSetting) {
  const int threads_before = sf::kernel_threads();
  const auto devices_before = sf::global_device_count();
  ScopedEnv bad("SHARDFLOW_PIN_DEVICES", "yes");
  EXPECT_THAT([] { sf::Runtime::local(2); },
              testing::ThrowsMessage<sf::Error>(testing::HasSubstr(
                  "SHARDFLOW_PIN_DEVICES must be auto (pin device threads when there are at least as many devices "
                  "as CPUs), 1 (always pin them) or 0 (never), got 'yes'")));
  EXPECT_EQ(sf::kernel_threads(), threads_before);
  EXPECT_EQ(sf::global_device_count(), devices_before);
}

// Many small collectives on overlapping groups, to shake out races (run this
// under TSan).
TEST_F(Runtime, ManySmallCollectives) {
  sf::Runtime rt = sf::Runtime::local(8);
  const std::vector<DeviceGroup> groups{all_devices(8), DeviceGroup{{0, 1, 2, 3}},
                                        DeviceGroup{{4, 5, 6, 7}}, DeviceGroup{{1, 3, 5, 7}},
                                        DeviceGroup{{0, 2, 4, 6}}};
  std::vector<int64_t> results(8);
  rt.run([&](int64_t device, sf::Communicator& comm) {
    int64_t total = 0;
    for (int i = 0; i < 2000; ++i) {
      const DeviceGroup& group = groups[static_cast<std::size_t>(
          i % 3 == 0 ? 0 : (i % 3 == 1 ? (device < 4 ? 1 : 2) : (device % 2 == 1 ? 3 : 4)))];
      int64_t value = 1;
      comm.all_reduce(group, std::as_writable_bytes(std::span(&value, 1)), DType::kI64,
                      ReduceOp::kSum);
      total += value;
    }
    results[static_cast<std::size_t>(device)] = total;
  });
  // Per 3 iterations: 8 + 4 + 4; 2000 iterations = 666 full rounds + one (i = 1998: 8, 1999: 4).
  EXPECT_EQ(results, std::vector<int64_t>(8, 666 * 16 + 8 + 4));
}

}  // namespace
