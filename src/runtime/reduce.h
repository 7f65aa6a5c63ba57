// Elementwise reductions of n equally long arrays, for every dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "shardflow/runtime/communicator.h"
#include "shardflow/tensor/dtype.h"

namespace shardflow::detail {

// sources[0][i] op sources[1][i] op ... for i < count (elements), combined
// in source order (16-bit floats in f32, rounded once), written to every
// destination. A destination may be one of the sources (exactly, not
// shifted).
void reduce_arrays(DType dtype, ReduceOp op, std::span<const std::byte* const> sources,
                   std::span<std::byte* const> destinations, std::size_t count);

// The byte range of member `rank`'s slice when `bytes` bytes of `dtype` are
// split into `members` slices of whole cache lines (the last ones may be
// shorter or empty): the unit of work of a large all_reduce.
std::pair<std::size_t, std::size_t> slice_of(std::size_t bytes, DType dtype, int64_t members, int64_t rank);

}  // namespace shardflow::detail
