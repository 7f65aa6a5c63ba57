// How values combine in a reduction: the partial results of a sharded
// reduction factor (ir/sharding_rule.h) and the collectives that combine
// them (runtime/communicator.h) use the same three.
#pragma once

namespace shardflow {

// Floating max/min propagate NaN, as torch.max does. For bool, sum and max
// are a logical or, min a logical and. Integer sums wrap around.
enum class ReduceOp { kSum, kMax, kMin };

}  // namespace shardflow
