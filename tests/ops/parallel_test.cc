// parallel_for: every index of [0, count) is visited exactly once, in ranges
// that start at multiples of align, for any thread count, split and rhythm
// of calls.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "op_test_util.h"
#include "shardflow/tensor/parallel.h"

namespace sf = shardflow;
using shardflow::testing_util::KernelThreads;

namespace {

// Counts the visits of each index; checks each range's alignment and bounds.
struct Visits {
  explicit Visits(int64_t count) : counts(static_cast<std::size_t>(count)) {}
  std::vector<std::atomic<int>> counts;
  std::atomic<int> bad_ranges{0};

  void visit(int64_t begin, int64_t end, int64_t align) {
    if (begin % align != 0 || begin >= end || end > static_cast<int64_t>(counts.size())) ++bad_ranges;
    for (int64_t i = begin; i < end; ++i) counts[static_cast<std::size_t>(i)].fetch_add(1);
  }
  int64_t miscounted() const {
    int64_t wrong = 0;
    for (const std::atomic<int>& c : counts) wrong += c.load() != 1;
    return wrong;
  }
};

TEST(ParallelFor, VisitsEveryIndexOnceForAnySplit) {
  for (int threads : {1, 2, 3, 5}) {
    const KernelThreads scope(threads);
    for (int64_t count : {0, 1, 7, 64, 1000, 100003}) {
      for (int64_t min_part : {1, 10, 1000}) {
        for (int64_t align : {1, 8, 16}) {
          Visits visits(count);
          sf::parallel_for(count, min_part, align, [&](int64_t begin, int64_t end) { visits.visit(begin, end, align); });
          EXPECT_EQ(visits.miscounted(), 0) << threads << " threads, count " << count << ", min_part " << min_part
                                            << ", align " << align;
          EXPECT_EQ(visits.bad_ranges.load(), 0) << threads << " threads, count " << count << ", align " << align;
        }
      }
    }
  }
}

// Jobs back to back, most shorter than a worker's wake-up: a worker that
// arrives after its job ended must not run any part of the next one.
TEST(ParallelFor, ShortJobsInARowEachRunExactlyOnce) {
  const KernelThreads three(3);
  for (int job = 0; job < 20000; ++job) {
    const int64_t count = 16 + job % 50;
    Visits visits(count);
    sf::parallel_for(count, 1, 1, [&](int64_t begin, int64_t end) { visits.visit(begin, end, 1); });
    ASSERT_EQ(visits.miscounted(), 0) << "job " << job;
    ASSERT_EQ(visits.bad_ranges.load(), 0) << "job " << job;
  }
}

// Jobs of very different lengths back to back: a worker still looking at
// the end of a short job while a long one is set up must neither take part
// of the long one under the short one's bounds nor leave the caller waiting
// for units that were never there (this hung once).
TEST(ParallelFor, AlternatingShortAndLongJobsEachRunExactlyOnce) {
  for (int threads : {2, 3}) {
    const KernelThreads scope(threads);
    for (int job = 0; job < 50000; ++job) {
      // Short jobs take fewer threads than long ones, and chunk floors vary.
      const int64_t count = job % 2 == 0 ? 2 : 64 + job % 5;
      const int64_t min_part = job % 3 == 0 ? 1 : 8;
      Visits visits(count);
      sf::parallel_for(count, min_part, 1, [&](int64_t begin, int64_t end) { visits.visit(begin, end, 1); });
      ASSERT_EQ(visits.miscounted(), 0) << threads << " threads, job " << job;
      ASSERT_EQ(visits.bad_ranges.load(), 0) << threads << " threads, job " << job;
    }
  }
}

// A job of more units than a range word counts (2^24 - 1) is handed out in
// coarser units, still aligned and still covering every index once.
TEST(ParallelFor, JobsLongerThanARangeWordCoverEveryIndex) {
  const KernelThreads two(2);
  for (int64_t align : {1, 4}) {
    const int64_t count = (int64_t{1} << 24) * align + 5;
    std::atomic<int64_t> covered{0};
    std::atomic<int> bad{0};
    sf::parallel_for(count, 1, align, [&](int64_t begin, int64_t end) {
      if (begin % align != 0 || begin >= end || end > count) ++bad;
      covered += end - begin;
    });
    EXPECT_EQ(covered.load(), count) << "align " << align;
    EXPECT_EQ(bad.load(), 0) << "align " << align;
  }
}

// Each job's ranges run that job's body: a worker late from one job never
// runs a chunk of the next with the old body.
TEST(ParallelFor, EveryRangeRunsItsOwnJobsBody) {
  const KernelThreads three(3);
  std::atomic<int> wrong{0};
  std::vector<std::atomic<int>> seen(64);
  for (int job = 0; job < 20000; ++job) {
    for (std::atomic<int>& s : seen) s.store(-1);
    sf::parallel_for(64, 1, 1, [&, job](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (seen[static_cast<std::size_t>(i)].exchange(job) != -1) ++wrong;
      }
    });
    for (const std::atomic<int>& s : seen) wrong += s.load() != job;
  }
  EXPECT_EQ(wrong.load(), 0);
}

// A thread held up inside a chunk (descheduled, or a slow chunk) does not
// hold up the rest of its share: the other threads take it from the back.
TEST(ParallelFor, AThreadStuckInAChunkLeavesTheRestOfItsShareToTheOthers) {
  for (const int threads : {2, 3}) {
    const KernelThreads scope(threads);
    constexpr int64_t kCount = 1000;
    Visits visits(kCount);
    std::atomic<int64_t> visited{0};
    std::atomic<bool> others_done{false};
    sf::parallel_for(kCount, 1, 1, [&](int64_t begin, int64_t end) {
      visits.visit(begin, end, 1);
      if (begin != 0) {
        visited += end - begin;
        return;
      }
      // The chunk with index 0 waits for every other index; a deadline keeps
      // a broken split from hanging the test.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (visited.load() != kCount - end && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      others_done = visited.load() == kCount - end;
      visited += end;
    });
    EXPECT_TRUE(others_done.load()) << threads << " threads: the rest was left for the stuck thread";
    EXPECT_EQ(visits.miscounted(), 0) << threads << " threads";
  }
}

// The pool's workers may first be started by a thread pinned to one CPU (a
// device thread running a one-device program on a multi-device runtime).
// They run where the process may, not on that CPU: else every kernel split
// would share the one core with its caller.
TEST(ParallelFor, WorkersStartedByAPinnedThreadRunWhereTheProcessMay) {
  cpu_set_t process;
  ASSERT_EQ(sched_getaffinity(0, sizeof(process), &process), 0);
  if (CPU_COUNT(&process) < 2) GTEST_SKIP() << "needs 2 CPUs to pin a thread to one of them";
  int first_cpu = 0;
  while (!CPU_ISSET(first_cpu, &process)) ++first_cpu;
  std::atomic<int> worker_chunks{0}, pinned_worker_chunks{0};
  std::thread starter([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first_cpu, &one);
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
    const std::thread::id self = std::this_thread::get_id();
    const KernelThreads two(2);
    sf::parallel_for(64, 1, 1, [&](int64_t, int64_t) {
      if (std::this_thread::get_id() == self) {
        // Hold the starter's chunk until a worker ran one (a deadline keeps a
        // broken pool from hanging the test).
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (worker_chunks.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
        return;
      }
      cpu_set_t mine;
      if (sched_getaffinity(0, sizeof(mine), &mine) != 0 || !CPU_EQUAL(&mine, &process)) ++pinned_worker_chunks;
      ++worker_chunks;
    });
  });
  starter.join();
  EXPECT_GT(worker_chunks.load(), 0) << "no chunk ran on a worker";
  EXPECT_EQ(pinned_worker_chunks.load(), 0) << "workers kept their starter's one CPU";
}

// A kernel that calls another from inside its body runs the inner call on
// its own thread (the pool is its caller's).
TEST(ParallelFor, NestedCallsRunInline) {
  const KernelThreads two(2);
  Visits outer(64);
  std::atomic<int> inner_miscounted{0};
  sf::parallel_for(64, 1, 1, [&](int64_t begin, int64_t end) {
    outer.visit(begin, end, 1);
    Visits inner(100);
    sf::parallel_for(100, 1, 1, [&](int64_t b, int64_t e) { inner.visit(b, e, 1); });
    inner_miscounted += static_cast<int>(inner.miscounted());
  });
  EXPECT_EQ(outer.miscounted(), 0);
  EXPECT_EQ(inner_miscounted.load(), 0);
}

// A range that throws: the rest still run, the caller gets the error, and
// the pool serves the next call.
TEST(ParallelFor, AnErrorInARangeReachesTheCaller) {
  const KernelThreads two(2);
  for (int64_t failing : {0, 40, 99}) {
    Visits visits(100);
    EXPECT_THROW(sf::parallel_for(100, 1, 1,
                                  [&](int64_t begin, int64_t end) {
                                    visits.visit(begin, end, 1);
                                    if (begin <= failing && failing < end) throw std::runtime_error("range failed");
                                  }),
                 std::runtime_error);
    EXPECT_EQ(visits.miscounted(), 0) << "failing index " << failing;
  }
  Visits after(100);
  sf::parallel_for(100, 1, 1, [&](int64_t begin, int64_t end) { after.visit(begin, end, 1); });
  EXPECT_EQ(after.miscounted(), 0);
}

// Callers on several threads share one pool: whoever finds it busy runs its
// job alone, and every job is complete when its call returns.
TEST(ParallelFor, ConcurrentCallersEachGetTheirWholeJob) {
  const KernelThreads two(2);
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&failures] {
      for (int job = 0; job < 2000; ++job) {
        Visits visits(257);
        sf::parallel_for(257, 4, 1, [&](int64_t begin, int64_t end) { visits.visit(begin, end, 1); });
        if (visits.miscounted() != 0 || visits.bad_ranges.load() != 0) ++failures;
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
