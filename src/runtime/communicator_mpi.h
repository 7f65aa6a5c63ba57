// The MPI Communicator: one device per rank of MPI_COMM_WORLD (device id =
// world rank). Each group gets its own MPI communicator, made at the group's
// first collective with MPI_Comm_create_group (collective over the group's
// members only, so groups can be created lazily, in any order) and cached.
//
// Reductions give exactly the in-process backend's bits: every member
// receives the others' data and combines it with the same kernel, in group
// order, instead of MPI_Allreduce, whose order depends on the algorithm MPI
// picks (and which would round bf16/f16 at every step):
//   small all_reduce:  MPI_Allgather of the buffers, each member reduces all;
//   large all_reduce:  MPI_Alltoallv gives member r slice r of every buffer,
//                      it reduces that, MPI_Allgatherv shares the slices;
//   reduce_scatter:    MPI_Alltoall, then each member reduces its chunks.
// all_gather and all_to_all are MPI's own; collective_permute is point to
// point; barrier is MPI_Barrier.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "collective_call.h"

namespace shardflow::detail {

// What the rank is waiting in, for the watchdog of the MPI runtime: read by
// another thread while the rank's thread is inside MPI.
struct CollectiveWatch {
  std::atomic<int64_t> since_ns{0};  // steady_clock time of entry; 0 = not in a collective
  std::atomic<CollectiveKind> kind{CollectiveKind::kBarrier};
  std::atomic<const DeviceGroup*> group{nullptr};  // owned by the communicator
  std::atomic<uint64_t> calls{0};                  // collectives completed so far

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

class MpiCommunicator final : public Communicator {
 public:
  // `check_calls`: before each collective, the members exchange their call
  // descriptions (one small MPI_Allgather) and run the in-process backend's
  // checks, so a disagreement is the same shardflow::Error on every member
  // instead of an MPI error or a hang.
  MpiCommunicator(int64_t world_rank, int64_t world_size, bool check_calls);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int64_t device() const override { return rank_; }
  int64_t num_devices() const override { return size_; }
  CollectiveWatch& watch() { return watch_; }

  void all_reduce(const DeviceGroup& group, std::span<std::byte> data, DType dtype, ReduceOp op) override;
  void all_gather(const DeviceGroup& group, std::span<const std::byte> input, std::span<std::byte> output) override;
  void reduce_scatter(const DeviceGroup& group, std::span<const std::byte> input, std::span<std::byte> output,
                      DType dtype, ReduceOp op) override;
  void all_to_all(const DeviceGroup& group, std::span<const std::byte> input, std::span<std::byte> output) override;
  void collective_permute(const DeviceGroup& group, const std::vector<std::pair<int64_t, int64_t>>& pairs,
                          std::span<const std::byte> input, std::span<std::byte> output) override;
  void barrier(const DeviceGroup& group) override;

 private:
  struct GroupComm {
    DeviceGroup group;
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0;
    int size() const { return static_cast<int>(group.devices.size()); }
  };
  class Scope;  // marks the watch for the duration of one collective

  // The group's communicator, created on first use; checks the group.
  GroupComm& comm_of(const DeviceGroup& group, CollectiveKind kind);
  // The agreement check (when enabled) and the local checks of `call`.
  void check(const GroupComm& group, const CallInfo& call);

  const int64_t rank_;
  const int64_t size_;
  const bool check_calls_;
  CollectiveWatch watch_;
  std::map<std::vector<int64_t>, GroupComm> groups_;
  std::vector<std::byte> scratch_;         // received data of reductions
  std::vector<const std::byte*> sources_;  // the buffers a reduction combines
  std::vector<CallInfo> calls_;            // check()'s, kept to avoid allocations
  std::vector<const CallInfo*> call_views_;
  std::vector<int> counts_, displacements_;
  std::vector<MPI_Request> requests_;
};

}  // namespace shardflow::detail
