// A small pool of kernel threads for the memory-bound kernels that OpenBLAS
// does not serve well (matrix-vector products of decode steps). It follows
// the process's kernel thread count (kernel_threads() in gemm.h), so a
// multi-device runtime that sets it to 1 gets inline execution: the device
// threads are the parallelism there.
#pragma once

#include <cstdint>

namespace shardflow::detail {

// Calls body(begin, end) on disjoint ranges that cover [0, count), in parallel
// when the pool is free and count allows parts of at least min_part items,
// else once on the calling thread. Ranges start at multiples of align. The
// body must not throw. Returns when every range is done.
template <class Body>
void parallel_for(int64_t count, int64_t min_part, int64_t align, const Body& body);

using RangeFn = void (*)(const void* body, int64_t begin, int64_t end);
void parallel_for_impl(int64_t count, int64_t min_part, int64_t align, RangeFn fn, const void* body);

template <class Body>
void parallel_for(int64_t count, int64_t min_part, int64_t align, const Body& body) {
  parallel_for_impl(count, min_part, align,
                    [](const void* b, int64_t begin, int64_t end) { (*static_cast<const Body*>(b))(begin, end); },
                    &body);
}

}  // namespace shardflow::detail
