// Splitting one kernel call over the kernel threads: GEMM blocks, the
// matrix-vector products and attention of decode steps. The pool follows
// kernel_threads() (tensor/gemm.h), so an in-process multi-device runtime,
// which sets it to 1, gets inline execution: its device threads are the
// parallelism there.
#pragma once

#include <cstdint>

namespace shardflow {

// Calls body(begin, end) on disjoint ranges that together cover [0, count)
// exactly once, and returns when all are done. Each thread takes chunks
// from the front of its own share, so it reads that share front to back
// (less what others take from its back), then from the back of the others'
// shares, so a thread that starts late takes fewer. A call runs on the
// calling thread alone when the pool is busy or count has fewer than
// 2 * min_part items, or when called from inside a body (nested calls run
// inline). Ranges start at multiples of align. The result must not depend
// on how [0, count) is split (write each output element from one range
// only). If a range throws, the others still run and the first exception
// is rethrown on the calling thread.
template <class Body>
void parallel_for(int64_t count, int64_t min_part, int64_t align, const Body& body);

// The cores this process may run on (its CPU affinity), at least 1.
int available_cores();

namespace detail {
using RangeFn = void (*)(const void* body, int64_t begin, int64_t end);
void parallel_for_impl(int64_t count, int64_t min_part, int64_t align, RangeFn fn, const void* body);
}  // namespace detail

template <class Body>
void parallel_for(int64_t count, int64_t min_part, int64_t align, const Body& body) {
  detail::parallel_for_impl(
      count, min_part, align,
      [](const void* b, int64_t begin, int64_t end) { (*static_cast<const Body*>(b))(begin, end); }, &body);
}

}  // namespace shardflow
