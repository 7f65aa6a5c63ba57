// The collectives of the in-process Communicator (the protocol is described
// in communicator_local.h). Between two barriers every byte is written by at
// most one member and read by no other, so the work needs no locks.
#include "communicator_local.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "reduce.h"

namespace shardflow::detail {

// An all_reduce whose total input over the group is at most this many bytes
// is staged and reduced whole by every member (1 barrier); larger ones split
// the reduction into one slice per member (2 barriers, less work).
static constexpr std::size_t kWholeReduceMaxBytes = 256 * 1024;

static void copy_bytes(std::byte* dst, const std::byte* src, std::size_t bytes) {
  if (bytes != 0 && dst != src) std::memcpy(dst, src, bytes);
}

LocalCommunicator::Membership LocalCommunicator::begin_call(const DeviceGroup& group, CallInfo call,
                                                            const Prepare& prepare) {
  world_.check_not_aborted();
  auto it = memberships_.find(group.devices);
  if (it == memberships_.end()) {
    GroupState& state = world_.group_state(group);  // checks the group
    const int rank = group.rank_of(device_);
    it = memberships_.emplace(group.devices, Membership{&state, rank}).first;
  }
  const Membership member = it->second;
  if (prepare) prepare(*member.state, member.rank, call);
  member.state->slot(member.rank) = call;
  world_.arrive_and_wait(*member.state, device_, call.kind);
  try {
    calls_.clear();
    for (int m = 0; m < member.state->size(); ++m) calls_.push_back(&member.state->call_of(m, member.rank));
    check_calls(member.state->group(), calls_);
  } catch (const Error&) {
    // Every member throws this error. Wait until all have checked: the checks
    // read the others' permute pairs, which die with the throw.
    end_call(member, call.kind);
    throw;
  }
  return member;
}

void LocalCommunicator::end_call(const Membership& member, CollectiveKind kind) {
  world_.arrive_and_wait(*member.state, device_, kind);
  member.state->next_call(member.rank);
}

void LocalCommunicator::reduce_range(const Membership& member, std::size_t begin, std::size_t end,
                                     std::span<std::byte* const> destinations) {
  const CallInfo& mine = member.state->call_of(member.rank, member.rank);
  sources_.clear();
  for (int s = 0; s < member.state->size(); ++s) {
    sources_.push_back(member.state->call_of(s, member.rank).input + begin);
  }
  reduce_arrays(mine.dtype, mine.op, sources_, destinations, (end - begin) / element_size(mine.dtype));
}

// Small: every member copies its data to its staging buffer and publishes
// that; after the first barrier every member reduces all staged copies into
// its own buffer, which nobody else reads, so no second barrier is needed
// (small all-reduces are latency-bound, and a barrier is most of the
// latency).
//
// Large: the buffers are cut into one slice per member; member r reduces
// slice r of every buffer and writes the result into slice r of every buffer
// (no one else reads or writes any slice r), then waits until all members are
// done. Each member reads one buffer's worth and writes one buffer's worth
// (about one memcpy of the data per member, however many members), and
// there is no second pass as in reduce-scatter + all-gather:
//
//   before:  dev0 [a0 a1]   dev1 [b0 b1]      member 0 reduces the slices 0,
//   after:   dev0 [s0 s1]   dev1 [s0 s1]      member 1 the slices 1, and each
//                                             writes its sum s to both devices
void LocalCommunicator::all_reduce(const DeviceGroup& group, std::span<std::byte> data, DType dtype, ReduceOp op) {
  const CallInfo call{.kind = CollectiveKind::kAllReduce,
                      .dtype = dtype,
                      .op = op,
                      .input = data.data(),
                      .input_bytes = data.size(),
                      .output = data.data(),
                      .output_bytes = data.size()};
  const std::size_t bytes = data.size();
  bool staged = false;  // the same on every member once the sizes are checked
  const Membership member = begin_call(group, call, [&](GroupState& state, int rank, CallInfo& published) {
    staged = bytes * static_cast<std::size_t>(state.size()) <= kWholeReduceMaxBytes;
    if (!staged) return;
    std::vector<std::byte>& staging = state.staging(rank);
    staging.resize(bytes);
    copy_bytes(staging.data(), data.data(), bytes);
    published.input = staging.data();
  });
  GroupState& state = *member.state;
  if (staged) {
    std::byte* const own = data.data();
    reduce_range(member, 0, bytes, std::span(&own, 1));
    state.next_call(member.rank);
    return;
  }
  const auto [begin, end] = slice_of(bytes, dtype, state.size(), member.rank);
  destinations_.clear();
  for (int s = 0; s < state.size(); ++s) {
    destinations_.push_back(state.call_of(s, member.rank).output + begin);
  }
  reduce_range(member, begin, end, destinations_);
  end_call(member, call.kind);
}

void LocalCommunicator::all_gather(const DeviceGroup& group, std::span<const std::byte> input,
                                   std::span<std::byte> output) {
  const CallInfo call{.kind = CollectiveKind::kAllGather,
                      .input = input.data(),
                      .input_bytes = input.size(),
                      .output = output.data(),
                      .output_bytes = output.size()};
  const Membership member = begin_call(group, call);
  const std::size_t chunk = input.size();
  for (int s = 0; s < member.state->size(); ++s) {
    copy_bytes(output.data() + static_cast<std::size_t>(s) * chunk, member.state->call_of(s, member.rank).input, chunk);
  }
  end_call(member, call.kind);
}

void LocalCommunicator::reduce_scatter(const DeviceGroup& group, std::span<const std::byte> input,
                                       std::span<std::byte> output, DType dtype, ReduceOp op) {
  const CallInfo call{.kind = CollectiveKind::kReduceScatter,
                      .dtype = dtype,
                      .op = op,
                      .input = input.data(),
                      .input_bytes = input.size(),
                      .output = output.data(),
                      .output_bytes = output.size()};
  const Membership member = begin_call(group, call);
  const std::size_t chunk = output.size();
  const std::size_t begin = static_cast<std::size_t>(member.rank) * chunk;
  std::byte* const destination = output.data();
  reduce_range(member, begin, begin + chunk, std::span(&destination, 1));
  end_call(member, call.kind);
}

void LocalCommunicator::all_to_all(const DeviceGroup& group, std::span<const std::byte> input,
                                   std::span<std::byte> output) {
  const CallInfo call{.kind = CollectiveKind::kAllToAll,
                      .input = input.data(),
                      .input_bytes = input.size(),
                      .output = output.data(),
                      .output_bytes = output.size()};
  const Membership member = begin_call(group, call);
  const auto members = static_cast<std::size_t>(member.state->size());
  const std::size_t chunk = input.size() / members;
  const std::size_t mine = static_cast<std::size_t>(member.rank) * chunk;
  for (std::size_t s = 0; s < members; ++s) {
    copy_bytes(output.data() + s * chunk, member.state->call_of(static_cast<int>(s), member.rank).input + mine, chunk);
  }
  end_call(member, call.kind);
}

void LocalCommunicator::collective_permute(const DeviceGroup& group,
                                           const std::vector<std::pair<int64_t, int64_t>>& pairs,
                                           std::span<const std::byte> input, std::span<std::byte> output) {
  const CallInfo call{.kind = CollectiveKind::kCollectivePermute,
                      .input = input.data(),
                      .input_bytes = input.size(),
                      .output = output.data(),
                      .output_bytes = output.size(),
                      .pairs = &pairs};
  const Membership member = begin_call(group, call);
  const auto source =
      std::find_if(pairs.begin(), pairs.end(), [&](const auto& pair) { return pair.second == device_; });
  if (source == pairs.end()) {
    if (!output.empty()) std::memset(output.data(), 0, output.size());
  } else {
    const int from = group.rank_of(source->first);
    copy_bytes(output.data(), member.state->call_of(from, member.rank).input, output.size());
  }
  end_call(member, call.kind);
}

void LocalCommunicator::barrier(const DeviceGroup& group) {
  const Membership member = begin_call(group, CallInfo{.kind = CollectiveKind::kBarrier});
  // Nobody reads a barrier's buffers: the call ends at its first barrier.
  member.state->next_call(member.rank);
}

}  // namespace shardflow::detail
