// Collectives between devices: the interface every backend implements.
//
// A Communicator belongs to one device and is used by that device's program
// only (one call at a time). Every method is collective over `group`: each
// member of the group must make the same call (same kind, same group, same
// sizes, dtype and reduction) as its next collective on that group, and the
// call returns once the member's part is done. A call that the members do not
// agree on (sizes, kinds, dtypes, permute pairs) throws the same
// shardflow::Error on every member, and the group stays usable; members that
// wait on different groups so that none can proceed end the run with an error
// naming what each device waits in (see Runtime::run).
//
// Buffers are raw bytes. Their sizes must be multiples of the element size and
// their addresses aligned to it. Unless a method says otherwise, input and
// output must not overlap.
//
// Group {0, 1, 2, 3}, 2 elements per device, all_gather:
//
//   before:   dev0 [a0 a1]   dev1 [b0 b1]   dev2 [c0 c1]   dev3 [d0 d1]
//   after:    every device [a0 a1 b0 b1 c0 c1 d0 d1]
//
// reduce_scatter (input 4 chunks of 1 element; output 1 element):
//
//   before:   dev0 [a0 a1 a2 a3] dev1 [b0 b1 b2 b3] ...
//   after:    dev0 [a0+b0+c0+d0] dev1 [a1+b1+c1+d1] ...
//
// all_to_all (chunk j of member i goes to member j, as chunk i):
//
//   before:   dev0 [a0 a1 a2 a3] dev1 [b0 b1 b2 b3] dev2 [c0 ...] dev3 [d0 ...]
//   after:    dev0 [a0 b0 c0 d0] dev1 [a1 b1 c1 d1] ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardflow/tensor/dtype.h"
#include "shardflow/tensor/reduce_op.h"

namespace shardflow {

// "sum", "max", "min".
std::string_view reduce_op_name(ReduceOp op);

// An ordered set of global device ids; a device's rank in the group is its
// index. The devices must be distinct and exist in the runtime.
struct DeviceGroup {
  std::vector<int64_t> devices;

  int64_t size() const { return static_cast<int64_t>(devices.size()); }
  // Throws shardflow::Error when `device` is not a member.
  int rank_of(int64_t device) const;
  // "[0, 1, 2, 3]"
  std::string to_string() const;

  friend bool operator==(const DeviceGroup&, const DeviceGroup&) = default;
};

// One per device; all methods are collective over `group`.
class Communicator {
 public:
  virtual ~Communicator() = default;
  // This communicator's global device id, and the runtime's device count.
  virtual int64_t device() const = 0;
  virtual int64_t num_devices() const = 0;

  // In place: `data` becomes the elementwise reduction over the group, the
  // same bits on every member. f32, bf16 and f16 are reduced in f32 (in group
  // order, rounded once); i64 and i32 in their own type.
  virtual void all_reduce(const DeviceGroup& group, std::span<std::byte> data, DType dtype, ReduceOp op) = 0;
  // output = the concatenation of every member's input, in group order
  // (output.size() == group size * input.size()). The input may be exactly
  // this member's chunk of the output (in place).
  virtual void all_gather(const DeviceGroup& group, std::span<const std::byte> input, std::span<std::byte> output) = 0;
  // input = group-size equal chunks; member r gets the reduction of
  // everyone's chunk r. The output may be exactly this member's chunk of the
  // input (in place).
  virtual void reduce_scatter(const DeviceGroup& group, std::span<const std::byte> input, std::span<std::byte> output,
                              DType dtype, ReduceOp op) = 0;
  // input = group-size equal chunks; chunk j goes to member j; output chunk i
  // comes from member i.
  virtual void all_to_all(const DeviceGroup& group, std::span<const std::byte> input, std::span<std::byte> output) = 0;
  // Every member sends its input to the members listed as its targets in
  // `pairs` (source -> target, global ids of group members, each target at
  // most once; a source may have several targets); a member that is no target
  // gets zeros. output.size() == input.size().
  virtual void collective_permute(const DeviceGroup& group, const std::vector<std::pair<int64_t, int64_t>>& pairs,
                                  std::span<const std::byte> input, std::span<std::byte> output) = 0;
  // Returns once every member has called it.
  virtual void barrier(const DeviceGroup& group) = 0;
};

}  // namespace shardflow
