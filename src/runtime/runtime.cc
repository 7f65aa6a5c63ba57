// The local runtime: one persistent thread per device, parked between runs.
//
// A run: run() publishes the program and bumps the job generation; every
// device thread runs it, records its error (which aborts the others) and
// reports that it finished; run() waits for all of them and rethrows the
// first error.
//
// With at least as many devices as CPUs the process may use, each device
// thread is pinned to one of them (device d to the (d mod n)-th). Unpinned,
// Linux's wake-up placement kept the two device threads of a (1,1,2) mesh,
// which wake each other at every collective, on one of the 2 cores of the
// AMD EPYC (Zen 2) VM for most of a run: each slept in ~15 barriers per
// decode step, and stories15M decoded at 300 tok/s against 460 pinned (MPI
// ranks, which mpiexec binds: 466). Eight devices on the 2 cores: 460-505
// against 547-560.
#include "shardflow/runtime/runtime.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "communicator_local.h"
#include "runtime_impl.h"
#include "shardflow/base/error.h"
#include "shardflow/runtime/spmd_runner.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/tensor/gemm.h"

namespace shardflow {

namespace {

// SHARDFLOW_PIN_DEVICES: "auto" (the default) pins device threads when
// there are at least as many devices as CPUs to put them on (every CPU then
// has a device; with CPUs to spare the scheduler finds idle ones itself, and
// two processes pinned to the same first CPUs would halve each other), "1"
// always pins them, "0" never.
enum class Pinning { kAuto, kAlways, kNever };

Pinning pinning_setting() {
  const char* text = std::getenv("SHARDFLOW_PIN_DEVICES");
  if (text == nullptr || *text == '\0') return Pinning::kAuto;
  const std::string_view value(text);
  if (value == "auto") return Pinning::kAuto;
  if (value == "1") return Pinning::kAlways;
  if (value == "0") return Pinning::kNever;
  throw Error(fmt::format(
      "SHARDFLOW_PIN_DEVICES must be auto (pin device threads when there are at least as many devices as CPUs), "
      "1 (always pin them) or 0 (never), got '{}'",
      value));
}

// The CPUs device threads are pinned to (device d to the (d mod n)-th), or
// none.
std::vector<int> device_cpus(int64_t num_devices, const std::vector<int>& allowed, Pinning pinning) {
  if (num_devices < 2 || allowed.size() < 2 || pinning == Pinning::kNever) return {};
  if (pinning == Pinning::kAuto && num_devices < static_cast<int64_t>(allowed.size())) return {};
  return allowed;
}

// The CPUs this thread may run on, in increasing order.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// Best effort: a refused pin (a cpuset that changed since) leaves the thread
// where the scheduler puts it, which is only slower.
void pin_current_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

class LocalRuntime final : public Runtime::Impl {
 public:
  explicit LocalRuntime(int64_t num_devices);
  ~LocalRuntime() override;
  LocalRuntime(const LocalRuntime&) = delete;
  LocalRuntime& operator=(const LocalRuntime&) = delete;

  int64_t num_devices() const override { return world_.num_devices(); }
  void run(const Program& program) override;
  [[noreturn]] void abort_job(std::string_view message, int status) override {
    std::fflush(nullptr);
    std::fprintf(stderr, "shardflow: %.*s\n", static_cast<int>(message.size()), message.data());
    std::fflush(stderr);
    std::_Exit(status);  // not exit(): other device threads may be running
  }

 private:
  void device_loop(int64_t device);
  // Stops and joins the device threads; restores what the constructor set.
  void shut_down();

  detail::World world_;
  std::vector<std::unique_ptr<detail::LocalCommunicator>> communicators_;
  std::vector<std::thread> threads_;

  std::mutex mutex_;  // guards the job fields below
  std::condition_variable job_ready_;
  std::condition_variable job_done_;
  const Program* program_ = nullptr;
  uint64_t generation_ = 0;
  int64_t running_devices_ = 0;
  bool stopping_ = false;
  std::atomic<bool> in_run_{false};

  // compile()d graphs run on these devices while the runtime exists.
  std::unique_ptr<SpmdRunner> runner_;
  GraphRunner* previous_runner_ = nullptr;

  // Device d runs on device_cpus_[d % size]; empty: not pinned.
  std::vector<int> device_cpus_;

  // Restored on destruction.
  std::optional<int64_t> previous_device_count_;
  std::optional<int> previous_kernel_threads_;
};

LocalRuntime::LocalRuntime(int64_t num_devices) : world_(num_devices), previous_device_count_(global_device_count()) {
  // Read first: a bad setting throws before anything global is changed.
  device_cpus_ = device_cpus(num_devices, allowed_cpus(), pinning_setting());
  if (num_devices > 1) {
    // The device threads are the parallelism: kernels run in each of them
    // single-threaded instead of starting their own pools on the same cores.
    previous_kernel_threads_ = kernel_threads();
    set_kernel_threads(1);
  }
  set_global_device_count(num_devices);
  runner_ = std::make_unique<SpmdRunner>(
      num_devices, [this](const DeviceProgram& fn) { run(fn); }, std::nullopt, previous_kernel_threads_.value_or(0));
  previous_runner_ = set_graph_runner(runner_.get());
  communicators_.reserve(static_cast<std::size_t>(num_devices));
  for (int64_t d = 0; d < num_devices; ++d) {
    communicators_.push_back(std::make_unique<detail::LocalCommunicator>(world_, d));
  }
  try {
    threads_.reserve(static_cast<std::size_t>(num_devices));
    for (int64_t d = 0; d < num_devices; ++d) threads_.emplace_back([this, d] { device_loop(d); });
  } catch (const std::exception& error) {
    const auto started = threads_.size();
    shut_down();
    throw Error(fmt::format("Runtime::local: could start only {} of {} device threads: {}", started, num_devices,
                            error.what()));
  }
}

LocalRuntime::~LocalRuntime() { shut_down(); }

void LocalRuntime::shut_down() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  job_ready_.notify_all();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
  if (runner_) set_graph_runner(previous_runner_);
  set_global_device_count(previous_device_count_);
  if (previous_kernel_threads_) set_kernel_threads(*previous_kernel_threads_);
}

void LocalRuntime::device_loop(int64_t device) {
  if (!device_cpus_.empty()) {
    pin_current_thread(device_cpus_[static_cast<std::size_t>(device) % device_cpus_.size()]);
  }
  uint64_t seen = 0;
  for (;;) {
    const Program* program = nullptr;
    {
      std::unique_lock lock(mutex_);
      job_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      program = program_;
    }
    try {
      (*program)(device, *communicators_[static_cast<std::size_t>(device)]);
    } catch (const std::exception& error) {
      world_.fail(device, error.what());
    } catch (...) {
      world_.fail(device, "unknown exception");
    }
    world_.finish(device);
    const std::lock_guard lock(mutex_);
    if (--running_devices_ == 0) job_done_.notify_all();
  }
}

void LocalRuntime::run(const Program& program) {
  if (in_run_.exchange(true)) {
    throw Error(
        "Runtime::run called while a run is in progress (from a device program, or "
        "from two threads at once)");
  }
  world_.begin_run();
  {
    std::unique_lock lock(mutex_);
    program_ = &program;
    running_devices_ = num_devices();
    ++generation_;
    job_ready_.notify_all();
    job_done_.wait(lock, [&] { return running_devices_ == 0; });
    program_ = nullptr;
  }
  const auto error = world_.first_error();
  in_run_.store(false);
  if (error) throw Error(fmt::format("device {}: {}", error->first, error->second));
}

}  // namespace

Runtime Runtime::local(int64_t num_devices) {
  // Each in-process device is a thread with its own stack and buffers: past
  // a few thousand the process runs out of threads or memory before the
  // first op (a mesh may still have up to 2^20 devices over MPI).
  constexpr int64_t kMaxLocalDevices = 4096;
  if (num_devices < 1 || num_devices > kMaxLocalDevices) {
    throw Error(
        fmt::format("Runtime::local: the device count must be in [1, {}] (in-process devices are threads; "
                    "run more as MPI ranks), got {}",
                    kMaxLocalDevices, num_devices));
  }
  return Runtime(std::make_unique<LocalRuntime>(num_devices));
}

bool Runtime::started_by_mpi_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Runtime::Runtime(Runtime&& other) noexcept = default;
Runtime::~Runtime() = default;

int64_t Runtime::num_devices() const { return impl_ ? impl_->num_devices() : 0; }

int64_t Runtime::process_index() const { return impl_ ? impl_->process_index() : 0; }
int64_t Runtime::process_count() const { return impl_ ? impl_->process_count() : 1; }
int64_t Runtime::devices_on_this_host() const { return impl_ ? impl_->devices_on_this_host() : 0; }

void Runtime::abort_job(std::string_view message, int status) {
  if (!impl_) {
    std::fprintf(stderr, "shardflow: %.*s\n", static_cast<int>(message.size()), message.data());
    std::_Exit(status);
  }
  impl_->abort_job(message, status);  // [[noreturn]] virtual; the compiler cannot see it
  std::_Exit(status);
}

void Runtime::run(const Impl::Program& fn) {
  if (!impl_) throw Error("Runtime::run on a moved-from runtime");
  impl_->run(fn);
}

}  // namespace shardflow
