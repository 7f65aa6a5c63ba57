#include "shardflow/tensor/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
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
// Chunks shrink as the job drains: each takes 1/(2 * threads) of what is
// left, down to a floor. The first ones stream long runs; the last ones are
// short, so the threads finish within one small chunk of each other instead
// of one thread waiting out another's last large chunk.
constexpr int64_t kShareDivisor = 2;

// The claim word: the job's generation (top 16 bits), its number of units
// (next 24) and the next unit to hand out (low 24); a unit is `align` items,
// or a multiple of that for very long jobs. A thread takes a chunk with one
// compare-and-swap on the whole word, so a claim that succeeds is a claim on
// the job the word describes, whatever job the claiming thread thought it
// was in, and that job cannot end before the chunk is done. The generation
// check keeps a worker that woke after its job ended out of the next one,
// which may have asked for fewer threads.
constexpr uint64_t kFieldBits = 24;
constexpr uint64_t kFieldMask = (uint64_t{1} << kFieldBits) - 1;
constexpr int64_t kMaxUnits = static_cast<int64_t>(kFieldMask);
constexpr uint64_t kGenerationShift = 2 * kFieldBits;
constexpr uint64_t kGenerationMask = 0xffff;

// Set while a thread runs chunks of a job: a parallel_for inside a body
// (a kernel calling another) runs inline instead of re-entering the pool.
thread_local bool running_a_chunk = false;

class KernelPool {
 public:
  // Never destroyed: its threads may still be asleep while static objects
  // are torn down at exit.
  static KernelPool& instance() {
    static auto* pool = new KernelPool;
    return *pool;
  }

  // False when another thread holds the pool (the caller then runs inline).
  bool run(int parts, int64_t count, int64_t align, int64_t min_chunk, RangeFn fn, const void* body) {
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
    const int64_t units = (count + align - 1) / align;
    const int64_t units_per_claim_unit = (units + kMaxUnits - 1) / kMaxUnits;
    unit_ = align * units_per_claim_unit;
    const int64_t claim_units = (count + unit_ - 1) / unit_;
    min_units_.store(std::max<int64_t>(1, (min_chunk + unit_ - 1) / unit_), std::memory_order_relaxed);
    share_divisor_.store(kShareDivisor * parts, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    ++generation_;
    claims_.store(((uint64_t{generation_} & kGenerationMask) << kGenerationShift) | (static_cast<uint64_t>(claim_units) << kFieldBits),
                  std::memory_order_release);
    job_word_.store((uint64_t{generation_} << kWorkerBits) | static_cast<uint64_t>(helpers),
                    std::memory_order_release);
    job_word_.notify_all();
    run_chunks(generation_);
    for (int spins = 0; done_.load(std::memory_order_acquire) != claim_units; ++spins) {
      if (spins < kSpinRounds) {
        SHARDFLOW_CPU_RELAX();
      } else {
        std::this_thread::yield();
      }
    }
    if (failed_.load(std::memory_order_acquire)) std::rethrow_exception(error_);
    return true;
  }

 private:
  // Takes and runs chunks of the job of this generation until none is left.
  void run_chunks(uint64_t generation) {
    uint64_t word = claims_.load(std::memory_order_acquire);
    for (;;) {
      const auto next = static_cast<int64_t>(word & kFieldMask);
      const auto units = static_cast<int64_t>((word >> kFieldBits) & kFieldMask);
      if (word >> kGenerationShift != (generation & kGenerationMask) || next >= units) return;
      // The sizing fields only shape the chunk; the word bounds it.
      const int64_t divisor = share_divisor_.load(std::memory_order_relaxed);
      const int64_t left = units - next;
      const int64_t take = std::min(left, std::max((left + divisor - 1) / divisor, min_units_.load(std::memory_order_relaxed)));
      if (!claims_.compare_exchange_weak(word, word + static_cast<uint64_t>(take), std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
        continue;
      }
      // The job cannot end before this chunk is done: its fields stay put.
      const int64_t begin = next * unit_;
      running_a_chunk = true;
      try {
        fn_(body_, begin, std::min(count_, (next + take) * unit_));
      } catch (...) {
        // The first error is rethrown by the caller once every chunk is done.
        if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::current_exception();
      }
      running_a_chunk = false;
      done_.fetch_add(take, std::memory_order_release);
      word = claims_.load(std::memory_order_acquire);
    }
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
      run_chunks(static_cast<uint32_t>(word >> kWorkerBits));
    }
  }

  std::mutex busy_;
  std::vector<std::thread> workers_;
  uint32_t generation_ = 0;
  // One cache line each: idle workers poll job_word_ while the taking
  // threads write claims_ and done_.
  alignas(64) std::atomic<uint64_t> job_word_{0};
  alignas(64) std::atomic<uint64_t> claims_{0};
  alignas(64) std::atomic<int64_t> done_{0};  // units
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;  // written by the thread that set failed_, before its chunk is counted done
  // The job; written before claims_ is published, read only by a thread
  // holding one of its chunks.
  RangeFn fn_ = nullptr;
  const void* body_ = nullptr;
  int64_t count_ = 0, unit_ = 1;
  // Read before a claim, possibly while the next job is set up: atomic.
  std::atomic<int64_t> min_units_{1}, share_divisor_{1};
};

std::atomic<int64_t> parallel_calls{0};

}  // namespace

void parallel_for_impl(int64_t count, int64_t min_part, int64_t align, RangeFn fn, const void* body) {
  if (count <= 0) return;
  align = std::max<int64_t>(align, 1);
  const int64_t most_parts = count / std::max<int64_t>(min_part, 1);
  const int parts = static_cast<int>(std::min({int64_t{kernel_threads()}, most_parts, kMaxParts}));
  if (parts > 1 && !running_a_chunk) {
    // The floor keeps a chunk at a quarter of the smallest part worth a thread.
    const int64_t min_chunk = std::max<int64_t>(min_part / 4, 1);
    if (KernelPool::instance().run(parts, count, align, min_chunk, fn, body)) {
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
