// The shared state of the in-process devices: one rendezvous per group, the
// abort flag, and the deadlock detector.
//
// Invariants:
// * GroupState objects live as long as the World; a device caches pointers to
//   them. They are created on first use, under the world mutex.
// * Between runs every device thread is parked, so begin_run() may reset the
//   group states without synchronisation with the devices.
// * `blocked_` never exceeds the number of devices that are really stuck:
//   devices that finished their program, plus devices waiting in a barrier
//   whose last member has not arrived. When it reaches the device count, no
//   device can make progress (a deadlock), and the device whose increment got
//   there reports it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collective_call.h"
#include "shardflow/base/error.h"
#include "shardflow/runtime/communicator.h"

namespace shardflow::detail {

// Thrown by a collective when the run was aborted by another device's error;
// run() reports that first error instead.
class RunAborted : public Error {
 public:
  RunAborted() : Error("the run was aborted by an error on another device") {}
};

// The rendezvous of one group. Calls (and staging buffers) are double-buffered
// by the parity of the per-group call sequence number, so a member that leaves
// call k early can publish call k+1 while slower members still read call k. It
// cannot get further ahead: call k+1 does not pass its first barrier before
// every member is done with call k.
class GroupState {
 public:
  explicit GroupState(DeviceGroup group);

  const DeviceGroup& group() const { return group_; }
  int64_t size() const { return group_.size(); }

  // The call slot of member `rank` for its current call, and its sequence.
  CallInfo& slot(int rank) { return members_[static_cast<std::size_t>(rank)].calls[parity(rank)]; }
  // The calls of every member at the current sequence of `rank` (valid after
  // the first barrier of that call).
  const CallInfo& call_of(int member, int rank) const {
    return members_[static_cast<std::size_t>(member)].calls[parity(rank)];
  }
  void next_call(int rank) { ++members_[static_cast<std::size_t>(rank)].sequence; }
  // Member `rank`'s staging buffer for its current call: a copy of its input
  // that the others read, so that the member need not wait for them before
  // it overwrites its own buffer. Only the owner writes or resizes it.
  std::vector<std::byte>& staging(int rank) { return members_[static_cast<std::size_t>(rank)].staging[parity(rank)]; }

 private:
  friend class World;
  struct alignas(64) Member {
    CallInfo calls[2];
    std::vector<std::byte> staging[2];
    uint64_t sequence = 0;
  };
  int parity(int rank) const { return static_cast<int>(members_[static_cast<std::size_t>(rank)].sequence & 1); }

  DeviceGroup group_;
  std::vector<Member> members_;
  // The barrier: arrivals in this phase, and the phase word (bit 0 = aborted,
  // the rest a generation counter that moves by 2 per completed phase).
  alignas(64) std::atomic<uint32_t> arrived_{0};
  alignas(64) std::atomic<uint32_t> word_{0};
};

class World {
 public:
  explicit World(int64_t num_devices);
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int64_t num_devices() const { return num_devices_; }

  // The rendezvous of `group`, created on first use. Throws when the group is
  // empty, repeats a device, or names a device that does not exist.
  GroupState& group_state(const DeviceGroup& group);

  // Waits until every member of `state` has arrived. `device` waits in the
  // collective `kind` (for the deadlock report). Throws RunAborted when the
  // run is aborted, and Error when this arrival completes a deadlock.
  void arrive_and_wait(GroupState& state, int64_t device, CollectiveKind kind);

  // Throws RunAborted when the run is aborted.
  void check_not_aborted() const {
    if (aborted_.load(std::memory_order_relaxed)) throw RunAborted();
  }

  // Records the run's first error and aborts the run: sets the flag and wakes
  // every waiting collective. Later errors are ignored; returns whether this
  // error was the first.
  bool fail(int64_t device, const std::string& message);
  // `device`'s program has returned (normally or not).
  void finish(int64_t device);
  // Resets the per-run state; every device must be parked.
  void begin_run();
  // The first error of the run: (device, message).
  std::optional<std::pair<int64_t, std::string>> first_error() const;

 private:
  struct alignas(64) DeviceStatus {
    std::atomic<GroupState*> waits_in{nullptr};
    std::atomic<CollectiveKind> kind{CollectiveKind::kBarrier};
    std::atomic<bool> finished{false};
  };

  void wait_for_phase(GroupState& state, uint32_t observed);
  void add_blocked(int64_t device);
  std::string deadlock_report() const;

  const int64_t num_devices_;
  std::unique_ptr<DeviceStatus[]> status_;
  alignas(64) std::atomic<int64_t> blocked_{0};
  std::atomic<bool> aborted_{false};

  mutable std::mutex mutex_;  // guards groups_ and error_
  std::map<std::vector<int64_t>, std::unique_ptr<GroupState>> groups_;
  std::optional<std::pair<int64_t, std::string>> error_;
};

}  // namespace shardflow::detail
