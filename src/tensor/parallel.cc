#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "shardflow/tensor/gemm.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SHARDFLOW_CPU_RELAX() _mm_pause()
#else
#define SHARDFLOW_CPU_RELAX() std::this_thread::yield()
#endif

namespace shardflow::detail {
namespace {

// Workers spin this many rounds for the next job before they sleep: decode
// steps issue a matrix-vector product every few microseconds, and waking a
// sleeping thread costs about as much as one small product.
constexpr int kSpinRounds = 1 << 12;
// The job word: a generation count above, the number of workers that take
// part in this job in the low bits.
constexpr uint64_t kWorkerBits = 8;
constexpr uint64_t kWorkerMask = (uint64_t{1} << kWorkerBits) - 1;
constexpr int64_t kMaxParts = static_cast<int64_t>(kWorkerMask) + 1;

class KernelPool {
 public:
  // Never destroyed: its threads may still be asleep while static objects
  // are torn down at exit.
  static KernelPool& instance() {
    static auto* pool = new KernelPool;
    return *pool;
  }

  // False when another thread holds the pool (the caller then runs inline).
  bool run(int parts, int64_t count, int64_t part_size, RangeFn fn, const void* body) {
    const std::unique_lock lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    const int helpers = parts - 1;
    while (static_cast<int>(workers_.size()) < helpers) {
      const int index = static_cast<int>(workers_.size()) + 1;
      // A new worker starts from the current word, so it cannot miss the job
      // published below however late it is scheduled.
      workers_.emplace_back([this, index, seen = job_word_.load()] { work(index, seen); });
      workers_.back().detach();
    }
    fn_ = fn;
    body_ = body;
    count_ = count;
    part_size_ = part_size;
    remaining_.store(helpers, std::memory_order_relaxed);
    job_ += uint64_t{1} << kWorkerBits;
    job_word_.store(job_ | static_cast<uint64_t>(helpers), std::memory_order_release);
    job_word_.notify_all();
    run_part(0);
    for (int spins = 0; remaining_.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins < kSpinRounds) {
        SHARDFLOW_CPU_RELAX();
      } else {
        std::this_thread::yield();
      }
    }
    return true;
  }

 private:
  void run_part(int64_t part) const {
    const int64_t begin = std::min(count_, part * part_size_);
    const int64_t end = std::min(count_, begin + part_size_);
    if (begin < end) fn_(body_, begin, end);
  }

  void work(int index, uint64_t seen) {
    for (;;) {
      uint64_t word = job_word_.load(std::memory_order_acquire);
      for (int spins = 0; word == seen && spins < kSpinRounds; ++spins) {
        SHARDFLOW_CPU_RELAX();
        word = job_word_.load(std::memory_order_acquire);
      }
      if (word == seen) {
        job_word_.wait(seen, std::memory_order_acquire);
        continue;
      }
      seen = word;
      if (static_cast<uint64_t>(index) > (word & kWorkerMask)) continue;  // not in this job
      run_part(index);
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::mutex busy_;
  std::vector<std::thread> workers_;
  uint64_t job_ = 0;
  std::atomic<uint64_t> job_word_{0};
  std::atomic<int> remaining_{0};
  // The job; written before job_word_ is published, read by the workers
  // that take part, unchanged until they all report back.
  RangeFn fn_ = nullptr;
  const void* body_ = nullptr;
  int64_t count_ = 0, part_size_ = 0;
};

std::atomic<int64_t> parallel_calls{0};

}  // namespace

void parallel_for_impl(int64_t count, int64_t min_part, int64_t align, RangeFn fn, const void* body) {
  if (count <= 0) return;
  const int64_t most_parts = count / std::max<int64_t>(min_part, 1);
  const int parts = static_cast<int>(std::min({int64_t{kernel_threads()}, most_parts, kMaxParts}));
  if (parts > 1) {
    int64_t part_size = (count + parts - 1) / parts;
    part_size = (part_size + align - 1) / align * align;
    if (KernelPool::instance().run(parts, count, part_size, fn, body)) {
      parallel_calls.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  fn(body, 0, count);
}

}  // namespace shardflow::detail

namespace shardflow {

int64_t parallel_kernel_calls() { return detail::parallel_calls.load(std::memory_order_relaxed); }

}  // namespace shardflow
