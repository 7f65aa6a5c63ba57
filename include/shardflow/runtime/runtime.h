// The runtime: a set of devices that run one program each, in parallel, and
// talk through their Communicators.
//
//   sf::Runtime rt = sf::Runtime::local(8);   // 8 in-process devices
//   rt.run([&](int64_t device, sf::Communicator& comm) {
//     comm.all_reduce(sf::DeviceGroup{{0, 1, 2, 3, 4, 5, 6, 7}}, bytes, sf::DType::kF32,
//                     sf::ReduceOp::kSum);
//   });
//
// Failure: an exception on any device ends the run on every device. Devices
// waiting in a collective wake at once and throw; a device that is computing
// stops at its next collective. run() then throws the first error as
// shardflow::Error("device 3: <message>"). Devices that wait on collectives
// that can never complete (members calling different groups, or a member whose
// program already returned) end the run the same way, with a message naming
// what each device waits in. A run never hangs in the runtime, and after a
// failed run the runtime is ready for the next one.
//
// The current runtime: while a Runtime exists, its device count is the global
// device count that Mesh validates against (set_global_device_count). Runtimes
// that exist at the same time must be destroyed in reverse order of creation.
//
// OpenBLAS: a runtime with more than one device sets OpenBLAS to one thread
// (restored on destruction). The device threads are the parallelism; an
// OpenBLAS pool competing with them for the cores makes GEMM timings bimodal
// (see background/dependencies.md §2). openblas_set_num_threads(1) alone still
// leaves OpenBLAS's idle pool threads around; for stable timings also export
// OPENBLAS_NUM_THREADS=1 before the program starts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "shardflow/runtime/communicator.h"

namespace shardflow {

class Runtime {
 public:
  // `num_devices` in-process devices, each with its own persistent thread,
  // communicating through shared memory.
  static Runtime local(int64_t num_devices);

  Runtime(Runtime&& other) noexcept;
  Runtime& operator=(Runtime&&) = delete;  // would break the creation order
  ~Runtime();

  int64_t num_devices() const;

  // Runs fn(device, comm) on every device in parallel and waits for all of
  // them. Throws shardflow::Error("device <d>: <message>") with the first
  // error of any device. Not reentrant: calling run() from a device program,
  // or from two threads at once, throws.
  void run(const std::function<void(int64_t device, Communicator& comm)>& fn);

 private:
  class Impl;
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardflow
