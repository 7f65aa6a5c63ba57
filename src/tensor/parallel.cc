#include "shardflow/tensor/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

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
// Each taking thread owns one contiguous range of the job and takes chunks
// from its front, half of what its range has left at a time, so its reads
// form one forward stream from chunk to chunk: streams restarted at every
// chunk read the weights of decode steps 4-9% slower. A thread whose range
// is empty steals half of what another range has left, from the back, so
// a thread that runs out of work waits at most for chunks already running,
// not for the rest of another's share.
//
// A range word holds the job's generation (top 16 bits), the range's end
// (next 24) and its front (low 24), in units of `align` items (or a
// multiple of that for very long jobs). A thread takes a chunk with one
// compare-and-swap on the whole word, so a claim that succeeds is a claim
// on the job the word describes, whatever job the claiming thread thought
// it was in, and that job cannot end before the chunk is done. The
// generation check keeps a worker that woke after its job ended out of the
// next one, which may have asked for fewer threads (a worker asleep across
// 2^16 jobs may claim in a later one; by the above, that claim is still
// correct).
constexpr uint64_t kFieldBits = 24;
constexpr uint64_t kFieldMask = (uint64_t{1} << kFieldBits) - 1;
constexpr int64_t kMaxUnits = static_cast<int64_t>(kFieldMask);
constexpr uint64_t kGenerationShift = 2 * kFieldBits;
constexpr uint64_t kGenerationMask = 0xffff;

uint64_t range_word(uint64_t generation, int64_t end, int64_t front) {
  return ((generation & kGenerationMask) << kGenerationShift) | (static_cast<uint64_t>(end) << kFieldBits) |
         static_cast<uint64_t>(front);
}
int64_t range_front(uint64_t word) { return static_cast<int64_t>(word & kFieldMask); }
int64_t range_end(uint64_t word) { return static_cast<int64_t>((word >> kFieldBits) & kFieldMask); }
bool of_job(uint64_t word, uint64_t generation) { return word >> kGenerationShift == (generation & kGenerationMask); }

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
    done_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    ++generation_;
    parts_.store(parts, std::memory_order_relaxed);
    for (int part = 0; part < parts; ++part) {
      ranges_[part].word.store(range_word(generation_, claim_units * (part + 1) / parts, claim_units * part / parts),
                               std::memory_order_release);
    }
    job_word_.store((uint64_t{generation_} << kWorkerBits) | static_cast<uint64_t>(helpers), std::memory_order_release);
    job_word_.notify_all();
    run_chunks(generation_, 0);
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
  // Takes and runs chunks of the job of this generation until none is
  // left: from the front of range `own`, then from the back of the others.
  void run_chunks(uint64_t generation, int own) {
    for (;;) {
      int64_t begin = 0, end = 0;
      if (!take_front(generation, own, begin, end) && !steal_back(generation, own, begin, end)) return;
      // The job cannot end before this chunk is done: its fields stay put.
      running_a_chunk = true;
      try {
        fn_(body_, begin * unit_, std::min(count_, end * unit_));
      } catch (...) {
        // The first error is rethrown by the caller once every chunk is done.
        if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::current_exception();
      }
      running_a_chunk = false;
      done_.fetch_add(end - begin, std::memory_order_release);
    }
  }

  // Half of `left` units, at least min_units_, at most all of them.
  int64_t chunk_of(int64_t left) const {
    return std::min(left, std::max((left + 1) / 2, min_units_.load(std::memory_order_relaxed)));
  }

  // Units [begin, end) from the front of range `own`: half of what it has
  // left, at least min_units_. False once it is empty or the job is over.
  bool take_front(uint64_t generation, int own, int64_t& begin, int64_t& end) {
    std::atomic<uint64_t>& range = ranges_[own].word;
    uint64_t word = range.load(std::memory_order_acquire);
    for (;;) {
      const int64_t front = range_front(word), back = range_end(word);
      if (!of_job(word, generation) || front >= back) return false;
      const int64_t take = chunk_of(back - front);
      if (range.compare_exchange_weak(word, range_word(generation, back, front + take), std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
        begin = front;
        end = front + take;
        return true;
      }
    }
  }

  // Units [begin, end) from the back of the range, other than `own`, with
  // the most left: half of it, at least min_units_. False once all are empty
  // or the job is over.
  bool steal_back(uint64_t generation, int own, int64_t& begin, int64_t& end) {
    // A worker of an ended job may read another job's part count: it only
    // bounds the scan, the words' generation decides.
    const int parts = parts_.load(std::memory_order_relaxed);
    for (;;) {
      int victim = -1;
      uint64_t victim_word = 0;
      int64_t most = 0;
      for (int part = 0; part < parts; ++part) {
        if (part == own) continue;
        const uint64_t word = ranges_[part].word.load(std::memory_order_acquire);
        if (!of_job(word, generation)) return false;
        if (range_end(word) - range_front(word) > most) {
          most = range_end(word) - range_front(word);
          victim = part;
          victim_word = word;
        }
      }
      if (victim < 0) return false;
      const int64_t front = range_front(victim_word), back = range_end(victim_word);
      const int64_t take = chunk_of(most);
      if (ranges_[victim].word.compare_exchange_strong(victim_word, range_word(generation, back - take, front),
                                                       std::memory_order_acq_rel, std::memory_order_acquire)) {
        begin = back - take;
        end = back;
        return true;
      }
    }
  }

  void work(int index, uint64_t seen) {
    // A thread starts with its creator's CPU affinity, and the first job may
    // come from a device thread pinned to one CPU (a one-device program on a
    // multi-device runtime): the worker runs wherever the process's main
    // thread may instead, not on that device's CPU.
    cpu_set_t cpus;
    if (sched_getaffinity(getpid(), sizeof(cpus), &cpus) == 0) {
      pthread_setaffinity_np(pthread_self(), sizeof(cpus), &cpus);
    }
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
      run_chunks(static_cast<uint32_t>(word >> kWorkerBits), index);
    }
  }

  std::mutex busy_;
  std::vector<std::thread> workers_;
  uint32_t generation_ = 0;
  // Own cache lines: idle workers poll job_word_, the taking threads write
  // the range words and done_, and read the job's fields below.
  struct alignas(64) Range {
    std::atomic<uint64_t> word{0};
  };
  alignas(64) std::atomic<uint64_t> job_word_{0};
  Range ranges_[kMaxParts];
  alignas(64) std::atomic<int64_t> done_{0};  // units
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;  // written by the thread that set failed_, before its chunk is counted done
  // The job; written before the range words are published, read only by a
  // thread holding one of its chunks.
  alignas(64) RangeFn fn_ = nullptr;
  const void* body_ = nullptr;
  int64_t count_ = 0, unit_ = 1;
  // Read before a claim, possibly while the next job is set up: atomic.
  std::atomic<int64_t> min_units_{1};
  std::atomic<int> parts_{1};
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

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(CPU_COUNT(&set), 1);
  return static_cast<int>(std::max(std::thread::hardware_concurrency(), 1u));
}

}  // namespace shardflow
