// One member's call of a collective, as both backends describe it, and the
// checks that every member runs over the calls of all members before any
// buffer is touched (so that every member reports the same error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "shardflow/runtime/communicator.h"

namespace shardflow::detail {

enum class CollectiveKind : uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kCollectivePermute,
  kBarrier,
};

// "all_reduce", "all_gather", ...
std::string_view collective_name(CollectiveKind kind);

// What one member passes to a collective, published for the other members.
struct CallInfo {
  CollectiveKind kind = CollectiveKind::kBarrier;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  const std::byte* input = nullptr;
  std::size_t input_bytes = 0;
  std::byte* output = nullptr;
  std::size_t output_bytes = 0;
  const std::vector<std::pair<int64_t, int64_t>>* pairs = nullptr;
};

// Throws the error that every member reports when the calls (one per member,
// in group order) disagree or are malformed: "all_reduce over group [0, 1]:
// device 0 passes 16 bytes but device 1 passes 12 bytes". Buffer addresses
// are compared only within one member's call.
void check_calls(const DeviceGroup& group, std::span<const CallInfo* const> calls);

}  // namespace shardflow::detail
