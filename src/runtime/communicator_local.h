// The in-process Communicator: devices are threads of one process and
// exchange data through shared memory.
//
// Every collective is a rendezvous on the group's GroupState:
//   1. publish: the member writes its call (kind, buffers, sizes) to its slot;
//   2. barrier: now every member sees every call;
//   3. check: every member checks all calls the same way, so a disagreement
//      throws the same error on every member (after a barrier, and with no
//      buffer touched);
//   4. work: each member computes its own output directly from the others'
//      buffers (a large all_reduce splits the reduction instead, and a small
//      one reads staged copies, see all_reduce);
//   5. barrier: no member leaves while others may still read its buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "local_world.h"

namespace shardflow::detail {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(World& world, int64_t device) : world_(world), device_(device) {}

  int64_t device() const override { return device_; }
  int64_t num_devices() const override { return world_.num_devices(); }

  void all_reduce(const DeviceGroup& group, std::span<std::byte> data, DType dtype, ReduceOp op) override;
  void all_gather(const DeviceGroup& group, std::span<const std::byte> input, std::span<std::byte> output) override;
  void reduce_scatter(const DeviceGroup& group, std::span<const std::byte> input, std::span<std::byte> output,
                      DType dtype, ReduceOp op) override;
  void all_to_all(const DeviceGroup& group, std::span<const std::byte> input, std::span<std::byte> output) override;
  void collective_permute(const DeviceGroup& group, const std::vector<std::pair<int64_t, int64_t>>& pairs,
                          std::span<const std::byte> input, std::span<std::byte> output) override;
  void barrier(const DeviceGroup& group) override;

 private:
  struct Membership {
    GroupState* state = nullptr;
    int rank = 0;
  };

  // Runs before a call is published, with the group, this member's rank and
  // the call (to stage data and point the call at it).
  using Prepare = std::function<void(GroupState& state, int rank, CallInfo& call)>;

  // Steps 1-3: prepare and publish `call`, wait for every member, check the
  // calls.
  Membership begin_call(const DeviceGroup& group, CallInfo call, const Prepare& prepare = nullptr);
  // Step 5: wait until every member is done with this call.
  void end_call(const Membership& member, CollectiveKind kind);
  // The reduction of the byte range [begin, end) of every member's buffer
  // (`input` of every call), written to every destination.
  void reduce_range(const Membership& member, std::size_t begin, std::size_t end,
                    std::span<std::byte* const> destinations);

  World& world_;
  const int64_t device_;
  std::map<std::vector<int64_t>, Membership> memberships_;  // cache of world_.group_state
  std::vector<const std::byte*> sources_;                   // reduce_range's, kept to avoid allocations
  std::vector<std::byte*> destinations_;
  std::vector<const CallInfo*> calls_;  // begin_call's view of every member's call
};

}  // namespace shardflow::detail
