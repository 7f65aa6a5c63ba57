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
// Kernel threads: a runtime with more than one device sets kernel_threads()
// (tensor/gemm.h) to one, restored on destruction. The device threads are
// the parallelism; a kernel pool competing with them for the cores makes
// GEMM timings bimodal (see background/dependencies.md §2). oneDNN runs
// single-threaded under shardflow in any case (each GEMM block asks OpenMP
// for one thread). An in-process program on one device alone (a graph
// without annotations) runs with the kernel threads the runtime found: the
// other devices' cores would idle.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "shardflow/runtime/communicator.h"

namespace shardflow {

// Runtime::mpi's settings.
struct MpiOptions {
  // Start-up check: every rank passes the text that must be the same on all
  // ranks (the tool passes its command line). A rank whose text differs makes
  // Runtime::mpi throw, on every rank, an error naming that rank and both
  // texts. Empty: no check.
  std::string job_fingerprint;
  // A rank that waits this long inside one collective ends the job with a
  // report of what it waits in (other ranks never joined: their programs
  // differ, or one is stuck). 0 waits forever. The environment variable
  // SHARDFLOW_MPI_TIMEOUT (seconds) overrides it.
  double collective_timeout_s = 300;
  // Before each collective the members exchange their call descriptions and
  // check them as the in-process backend does, so a mismatch is the same
  // shardflow::Error on every member. Costs one small MPI call per
  // collective; programs from the partitioner never mismatch (their
  // agreement is checked once per program), so it is off by default.
  bool check_calls = false;
};

class Runtime {
 public:
  // `num_devices` in-process devices, each with its own persistent thread,
  // communicating through shared memory. With at least as many devices (and
  // more than one) as the n CPUs in the calling thread's affinity mask,
  // device d's thread is pinned to the (d mod n)-th of them (as mpiexec binds
  // ranks). The environment variable SHARDFLOW_PIN_DEVICES chooses: auto (that,
  // the default), 1 (pin whatever the count), 0 (never); anything else is an
  // Error.
  static Runtime local(int64_t num_devices);

  // One device per MPI rank: the job's world size is the device count, and
  // this process runs (and holds the data of) device = its rank only. Every
  // rank runs the same program (SPMD, as under jax.distributed): tensors
  // hold only this rank's shards, and reading a sharded tensor's value is a
  // collective that every rank must reach. Programs of one device (no mesh)
  // run on every rank.
  //
  // Initialises MPI (MPI_THREAD_SERIALIZED) unless the program did, and
  // finalises it on destruction when it initialised it; so at most one MPI
  // runtime per process, and none after another has finished. Each rank's
  // kernel threads (tensor/gemm.h) get at most the cores of this host
  // divided by the ranks on it.
  //
  // Failure: an exception in a device program, or a runtime destroyed by an
  // exception, prints "shardflow: rank R of N: <error>" and ends every rank
  // (MPI_Abort); a rank that exits makes mpirun end the job. A job never
  // hangs longer than `collective_timeout_s`.
  static Runtime mpi(const MpiOptions& options = {});

  // Whether an MPI launcher (mpirun, mpiexec, srun with PMI or PMIx) started
  // this process: one of the variables they set before main
  // (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK). Ask before MPI starts: a
  // singleton Open MPI sets them itself. The tool and the Python package
  // run one device per rank when it is true and no backend is named.
  static bool started_by_mpi_launcher();

  Runtime(Runtime&& other) noexcept;
  Runtime& operator=(Runtime&&) = delete;  // would break the creation order
  ~Runtime();

  int64_t num_devices() const;
  // This process's index among the job's processes (the MPI rank), and
  // their count: 0 and 1 in-process.
  int64_t process_index() const;
  int64_t process_count() const;
  // The job's devices that share this host's cores: all of them in
  // process; in an MPI job the ranks on this rank's host (the ranks
  // MPI_COMM_TYPE_SHARED groups with it), whichever launcher started them.
  int64_t devices_on_this_host() const;

  // Runs fn(device, comm) on every device in parallel and waits for all of
  // them. Throws shardflow::Error("device <d>: <message>") with the first
  // error of any device. Not reentrant: calling run() from a device program,
  // or from two threads at once, throws.
  void run(const std::function<void(int64_t device, Communicator& comm)>& fn);

  // Prints "shardflow: <message>" (with the rank in an MPI job) to stderr
  // and ends the job with `status`: every rank of an MPI job (MPI_Abort),
  // or this process. For errors that only some ranks see (a file missing on
  // one host): returning from them would leave the other ranks waiting.
  [[noreturn]] void abort_job(std::string_view message, int status = 1);

  class Impl;  // a backend (src/runtime/runtime_impl.h)

 private:
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardflow
