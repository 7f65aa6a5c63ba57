// Runs a partitioned program (partition/program.h) on a runtime's devices.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "shardflow/partition/program.h"
#include "shardflow/runtime/runtime.h"
#include "shardflow/trace/tensor.h"

namespace shardflow {

class OpProfile;  // trace/profile.h

// One tensor per graph input: its global value, or a tensor already laid out
// as the program's input sharding says (its shards are used as they are).
// Returns one tensor per graph output, laid out across the devices as the
// program's output sharding says (a plain tensor when replicated). The
// runtime must have exactly as many devices as the program's mesh.
//
// The inputs are taken by value and let go of before the devices run: a
// shard whose only other holder was that handle (a donated input) is then
// the device's alone, and an op that owns its operand (index_copy) updates
// it in place.
//
// With a profile, every device that runs in this process adds its op times
// to it (collectives by kind: "all-reduce", ...).
std::vector<Tensor> run_program(const PartitionedProgram& program, Runtime& runtime, std::vector<Tensor> inputs,
                                OpProfile* profile = nullptr);

// The same on any set of devices: `run_on_devices(fn)` runs fn on each of
// `num_devices` devices and waits (Runtime::run).
using DeviceProgram = std::function<void(int64_t device, Communicator& comm)>;
std::vector<Tensor> run_program(const PartitionedProgram& program, int64_t num_devices,
                                const std::function<void(const DeviceProgram&)>& run_on_devices,
                                std::vector<Tensor> inputs, OpProfile* profile = nullptr);

}  // namespace shardflow
