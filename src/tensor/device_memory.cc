#include "shardflow/tensor/device_memory.h"

#include <atomic>
#include <deque>
#include <mutex>

#include "device_memory_counter.h"

namespace shardflow {
namespace detail {

// One cache line each: device threads count their allocations side by side.
struct alignas(64) DeviceMemoryCounter {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
};

}  // namespace detail

namespace {

// Counters live as long as the process: freed buffers still find theirs.
class DeviceMemoryCounters {
 public:
  static DeviceMemoryCounters& instance() {
    static auto* counters = new DeviceMemoryCounters;
    return *counters;
  }

  detail::DeviceMemoryCounter* find(int64_t device, bool create) {
    const std::lock_guard lock(mutex_);
    if (device < 0) return nullptr;
    const auto index = static_cast<std::size_t>(device);
    if (index >= counters_.size()) {
      if (!create) return nullptr;
      counters_.resize(index + 1);  // a deque keeps existing counters in place
    }
    return &counters_[index];
  }

  void reset_peaks() {
    const std::lock_guard lock(mutex_);
    for (detail::DeviceMemoryCounter& counter : counters_) {
      counter.peak.store(counter.current.load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
  }

 private:
  std::mutex mutex_;
  std::deque<detail::DeviceMemoryCounter> counters_;
};

thread_local detail::DeviceMemoryCounter* thread_counter = nullptr;

}  // namespace

DeviceMemory device_memory(int64_t device) {
  const detail::DeviceMemoryCounter* counter = DeviceMemoryCounters::instance().find(device, false);
  if (counter == nullptr) return {};
  return {counter->current.load(std::memory_order_relaxed), counter->peak.load(std::memory_order_relaxed)};
}

void reset_device_memory_peaks() { DeviceMemoryCounters::instance().reset_peaks(); }

DeviceMemoryScope::DeviceMemoryScope(int64_t device) : previous_(thread_counter) {
  thread_counter = DeviceMemoryCounters::instance().find(device, true);
}

DeviceMemoryScope::~DeviceMemoryScope() { thread_counter = previous_; }

namespace detail {

DeviceMemoryCounter* current_device_memory_counter() { return thread_counter; }

void count_allocation(DeviceMemoryCounter& counter, int64_t bytes) {
  const int64_t now = counter.current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = counter.peak.load(std::memory_order_relaxed);
  while (now > peak && !counter.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void count_free(DeviceMemoryCounter& counter, int64_t bytes) {
  counter.current.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace detail
}  // namespace shardflow
