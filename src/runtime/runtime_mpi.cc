// The MPI runtime: this process is device `rank` of a world of MPI ranks.
//
// run() calls the device program on the calling thread. A failure cannot be
// reported to ranks blocked in MPI calls, so it ends the job (MPI_Abort)
// after printing the error. A watchdog thread ends the job when the rank has
// waited too long inside one collective; it does not call MPI (so MPI needs
// no thread support beyond SERIALIZED) but prints and _Exits, which makes
// mpirun end the other ranks.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "communicator_mpi.h"
#include "runtime_impl.h"
#include "shardflow/base/error.h"
#include "shardflow/runtime/spmd_runner.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/tensor/gemm.h"
#include "shardflow/tensor/parallel.h"

namespace shardflow {

namespace {

// Once per process: MPI cannot be initialised again after MPI_Finalize.
std::atomic<bool> g_mpi_runtime_created{false};

double timeout_from_environment(double fallback) {
  const char* text = std::getenv("SHARDFLOW_MPI_TIMEOUT");
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= 0)) {
    throw Error(fmt::format("SHARDFLOW_MPI_TIMEOUT must be a number of seconds >= 0, got '{}'", text));
  }
  return value;
}

class MpiRuntime final : public Runtime::Impl {
 public:
  explicit MpiRuntime(const MpiOptions& options);
  ~MpiRuntime() override;
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int64_t num_devices() const override { return size_; }
  int64_t process_index() const override { return rank_; }
  int64_t process_count() const override { return size_; }
  int64_t devices_on_this_host() const override { return host_ranks_; }
  void run(const Program& program) override;
  [[noreturn]] void abort_job(std::string_view message, int status) override;

 private:
  // Throws (on every rank) when the ranks' fingerprints differ.
  void check_fingerprints(const std::string& fingerprint);
  void watch_collectives(double timeout_s);
  void shut_down();

  int rank_ = 0;
  int size_ = 1;
  int host_ranks_ = 1;
  bool initialised_mpi_ = false;
  std::unique_ptr<detail::MpiCommunicator> comm_;
  std::unique_ptr<SpmdRunner> runner_;
  GraphRunner* previous_runner_ = nullptr;
  std::optional<int64_t> previous_device_count_;
  std::optional<int> previous_kernel_threads_;
  std::atomic<bool> in_run_{false};

  std::mutex watchdog_mutex_;
  std::condition_variable watchdog_wake_;
  bool stopping_ = false;
  std::thread watchdog_;
};

MpiRuntime::MpiRuntime(const MpiOptions& options) {
  const double timeout_s = timeout_from_environment(options.collective_timeout_s);
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (finalised) throw Error("Runtime::mpi: MPI was already finalised in this process");
  if (!initialised) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      throw Error("Runtime::mpi: MPI_Init_thread failed");
    }
    initialised_mpi_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  comm_ = std::make_unique<detail::MpiCommunicator>(rank_, size_, options.check_calls);
  try {
    if (!options.job_fingerprint.empty()) check_fingerprints(options.job_fingerprint);
  } catch (...) {
    shut_down();
    throw;
  }

  // The ranks on this host share its cores; the kernels get this rank's
  // share (never more threads than they had: OMP_NUM_THREADS=1 stays 1). A
  // rank bound to some cores (mpiexec binds each to one by default) has
  // those; an unbound one an equal part of the host's.
  MPI_Comm host = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host) == MPI_SUCCESS) {
    MPI_Comm_size(host, &host_ranks_);
    MPI_Comm_free(&host);
  }
  const int host_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int bound_cores = available_cores();
  const int share = bound_cores < host_cores ? bound_cores : host_cores / std::max(1, host_ranks_);
  previous_kernel_threads_ = kernel_threads();
  set_kernel_threads(std::clamp(share, 1, std::max(1, *previous_kernel_threads_)));

  previous_device_count_ = global_device_count();
  set_global_device_count(size_);
  runner_ = std::make_unique<SpmdRunner>(
      size_, [this](const DeviceProgram& fn) { run(fn); }, ProcessView{rank_, comm_.get()});
  previous_runner_ = set_graph_runner(runner_.get());
  if (timeout_s > 0) watchdog_ = std::thread([this, timeout_s] { watch_collectives(timeout_s); });
}

MpiRuntime::~MpiRuntime() {
  if (std::uncaught_exceptions() > 0) {
    abort_job("ended by an exception (see its message above, if any); ending the job", 1);
  }
  shut_down();
}

void MpiRuntime::shut_down() {
  {
    const std::lock_guard lock(watchdog_mutex_);
    stopping_ = true;
  }
  watchdog_wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (runner_) {
    set_graph_runner(previous_runner_);
    set_global_device_count(previous_device_count_);
  }
  runner_.reset();
  if (previous_kernel_threads_) set_kernel_threads(*previous_kernel_threads_);
  comm_.reset();  // frees the group communicators before MPI_Finalize
  if (initialised_mpi_) MPI_Finalize();
}

void MpiRuntime::check_fingerprints(const std::string& fingerprint) {
  // Lengths first, then the texts.
  const int length = static_cast<int>(std::min<std::size_t>(fingerprint.size(), 1 << 20));
  std::vector<int> lengths(static_cast<std::size_t>(size_));
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> offsets(lengths.size(), 0);
  for (std::size_t r = 1; r < lengths.size(); ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(static_cast<std::size_t>(offsets.back() + lengths.back()), '\0');
  MPI_Allgatherv(fingerprint.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
                 MPI_COMM_WORLD);
  const auto text_of = [&](std::size_t r) {
    return all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r]));
  };
  for (std::size_t r = 1; r < lengths.size(); ++r) {
    if (text_of(r) != text_of(0)) {
      throw Error(fmt::format(
          "the MPI ranks were started differently: rank 0 runs '{}' but rank {} runs '{}'; every rank must run "
          "the same command with the same arguments",
          text_of(0), r, text_of(r)));
    }
  }
}

void MpiRuntime::watch_collectives(double timeout_s) {
  const auto limit_ns = static_cast<int64_t>(timeout_s * 1e9);
  const auto period = std::chrono::milliseconds(std::clamp<int64_t>(limit_ns / 4'000'000, 10, 1000));
  detail::CollectiveWatch& watch = comm_->watch();
  std::unique_lock lock(watchdog_mutex_);
  while (!watchdog_wake_.wait_for(lock, period, [&] { return stopping_; })) {
    const int64_t since = watch.since_ns.load(std::memory_order_acquire);
    if (since == 0 || detail::CollectiveWatch::now_ns() - since < limit_ns) continue;
    const DeviceGroup* group = watch.group.load();
    const std::string message = fmt::format(
        "shardflow: rank {} of {}: waited {:.0f} s in {} over devices {} (after {} collectives), but not every "
        "member joined: the ranks run different programs, or a rank is stuck or gone; ending the job "
        "(SHARDFLOW_MPI_TIMEOUT sets the limit)\n",
        rank_, size_, timeout_s, detail::collective_name(watch.kind.load()),
        group != nullptr ? group->to_string() : "?", watch.calls.load());
    std::fputs(message.c_str(), stderr);
    std::fflush(stderr);
    std::_Exit(1);  // not MPI_Abort: this thread may not call MPI
  }
}

void MpiRuntime::run(const Program& program) {
  if (in_run_.exchange(true)) {
    throw Error("Runtime::run called while a run is in progress (from a device program, or from two threads at once)");
  }
  try {
    program(rank_, *comm_);
  } catch (const std::exception& error) {
    abort_job(fmt::format("device {}: {}", rank_, error.what()), 1);
  } catch (...) {
    abort_job(fmt::format("device {}: unknown exception", rank_), 1);
  }
  in_run_.store(false);
}

void MpiRuntime::abort_job(std::string_view message, int status) {
  // Bad input fails on every rank at once: the other ranks give rank 0 time
  // to report it and end the job, so the error is printed once, not once
  // per rank. An error of one rank alone is printed kOtherRanksWait later.
  // One second was too short on the 2-core VM under a parallel ctest: the
  // abort reached the other ranks after they had printed.
  constexpr auto kOtherRanksWait = std::chrono::seconds(10);
  if (rank_ != 0) std::this_thread::sleep_for(kOtherRanksWait);
  const std::string line = fmt::format("shardflow: rank {} of {}: {}\n", rank_, size_, message);
  std::fflush(nullptr);  // what was printed before the error, then the error
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, status);
  std::_Exit(status);  // MPI_Abort does not return; this is for the compiler
}

}  // namespace

Runtime Runtime::mpi(const MpiOptions& options) {
  if (g_mpi_runtime_created.exchange(true)) {
    throw Error(
        "Runtime::mpi: a process can create one MPI runtime (MPI cannot be initialised twice); keep it "
        "for the whole program");
  }
  return Runtime(std::make_unique<MpiRuntime>(options));
}

}  // namespace shardflow
