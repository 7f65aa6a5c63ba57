// Building a (possibly sharded) f32 tensor from a source that can produce
// any contiguous run of its row-major elements: each device's shard is
// filled straight from the source, with no whole host copy of the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "shardflow/models/llama.h"

namespace shardflow::llama {

// Writes elements [offset, offset + count) of the global tensor to dst.
using ElementSource = std::function<void(int64_t offset, int64_t count, float* dst)>;

// Without a plan: the whole tensor on one device. With one: laid out as the
// plan's spec for `role` says (replicas share one buffer).
Tensor place_tensor(const Shape& shape, const ElementSource& source, const ShardingPlan* plan, const std::string& role);

// A head tied to the embedding can be the embedding tensor itself, one buffer
// for both, when the plan lays them out alike (always without a plan).
bool tied_head_shares_embedding(const ShardingPlan* plan);

}  // namespace shardflow::llama
