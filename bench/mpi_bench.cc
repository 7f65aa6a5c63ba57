// The MPI backend against its baselines, measured in the same job:
//   AllReduce/<bytes>   f32 sum over all ranks through the Communicator vs
//                       raw MPI_Allreduce on MPI_COMM_WORLD (blocks of calls
//                       alternate between the two); vs_mpi = raw time / ours
//   Stories15MDecode    stories15M (random weights) decode, batch 1, model
//                       axis over all ranks, vs the same on as many in-process
//                       devices (run by rank 0, on every CPU rather than the
//                       core mpiexec bound it to, while the other ranks sleep)
//
//   mpiexec -n 2 build/release/bench/mpi_bench      (rank 0 reports)
//
// Iteration counts are fixed: every rank must make the same calls.
#include <benchmark/benchmark.h>
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "shardflow/models/llama.h"
#include "shardflow/runtime/runtime.h"
#include "shardflow/shardflow.h"

namespace sf = shardflow;
namespace llama = shardflow::llama;

namespace {

sf::Runtime* g_mpi = nullptr;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

sf::DeviceGroup everyone() {
  sf::DeviceGroup group;
  for (int64_t d = 0; d < g_mpi->num_devices(); ++d) group.devices.push_back(d);
  return group;
}

void AllReduce(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<float> data(bytes / sizeof(float), 1.0f);
  const sf::DeviceGroup group = everyone();
  const int calls = bytes <= 65536 ? 200 : 10;
  double raw = 0, ours = 0;
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    raw += seconds_since(start);
    MPI_Barrier(MPI_COMM_WORLD);
    start = std::chrono::steady_clock::now();
    g_mpi->run([&](int64_t, sf::Communicator& comm) {
      for (int i = 0; i < calls; ++i) {
        comm.all_reduce(group, std::as_writable_bytes(std::span(data)), sf::DType::kF32, sf::ReduceOp::kSum);
      }
    });
    ours += seconds_since(start);
    std::fill(data.begin(), data.end(), 1.0f);  // keep the values finite
  }
  const double n = static_cast<double>(state.iterations()) * calls;
  state.counters["raw_mpi_us"] = raw / n * 1e6;
  state.counters["ours_us"] = ours / n * 1e6;
  state.counters["vs_mpi"] = raw / ours;
}

// Decode tokens/s of stories15M, batch 1, on `devices` devices over 'model'
// of whichever runtime is current.
double decode_tokens_per_s(int64_t devices, int64_t steps) {
  std::vector<int64_t> ids(static_cast<std::size_t>(devices));
  std::iota(ids.begin(), ids.end(), 0);
  const llama::ShardingPlan plan = llama::ShardingPlan::megatron(std::make_shared<const sf::Mesh>(
      ids, std::vector<int64_t>{1, 1, devices}, std::vector<std::string>{"data", "fsdp", "model"}));
  const llama::Config config = llama::Config::named("stories15M");
  llama::Model model(llama::random_weights(config, 0, &plan), plan);
  constexpr int64_t kPrompt = 16;
  model.trace(1, kPrompt);
  std::vector<int64_t> prompt(kPrompt);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>(1 + (i * 7919) % 31000);
  const sf::Tensor prompt_tokens = sf::Tensor::from_ints(prompt, {1, kPrompt});
  const sf::Tensor next = sf::Tensor::from_ints(std::vector<int64_t>{13}, {1, 1});
  llama::KVCache cache = model.new_cache(1);
  benchmark::DoNotOptimize(model.forward(prompt_tokens, 0, cache).value());
  benchmark::DoNotOptimize(model.forward(next, kPrompt, cache).value());  // warm up
  const auto start = std::chrono::steady_clock::now();
  for (int64_t s = 1; s <= steps; ++s) benchmark::DoNotOptimize(model.forward(next, kPrompt + s, cache).value());
  return static_cast<double>(steps) / seconds_since(start);
}

// While it exists, this thread and the threads it starts may run on every
// CPU of the machine, not only the core mpiexec bound the rank to (as a
// program started without mpiexec may).
class AllCpus {
 public:
  AllCpus() {
    sched_getaffinity(0, sizeof(bound_), &bound_);
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int cpu = 0, cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); cpu < cpus; ++cpu) CPU_SET(cpu, &all);
    sched_setaffinity(0, sizeof(all), &all);
  }
  ~AllCpus() { sched_setaffinity(0, sizeof(bound_), &bound_); }
  AllCpus(const AllCpus&) = delete;
  AllCpus& operator=(const AllCpus&) = delete;

 private:
  cpu_set_t bound_;
};

void Stories15MDecode(benchmark::State& state) {
  const int64_t devices = g_mpi->num_devices();
  constexpr int64_t kSteps = 32;
  double in_process = 0, mpi = 0;
  for (auto _ : state) {
    // The baseline on rank 0 alone; the others sleep instead of spinning in
    // MPI so that they leave the cores to it.
    if (g_mpi->process_index() == 0) {
      const AllCpus all_cpus;  // mpiexec binds each rank to one core; the devices get every core
      sf::Runtime local = sf::Runtime::local(devices);
      in_process = decode_tokens_per_s(devices, kSteps);
    }
    MPI_Request request;
    MPI_Ibarrier(MPI_COMM_WORLD, &request);
    for (int done = 0; !done;) {
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    mpi = decode_tokens_per_s(devices, kSteps);
  }
  state.counters["in_process_tok_s"] = in_process;
  state.counters["mpi_tok_s"] = mpi;
  state.counters["mpi_vs_in_process"] = mpi / in_process;
}

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

BENCHMARK(AllReduce)->Arg(4 << 10)->Arg(4 << 20)->Iterations(20)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(Stories15MDecode)->Iterations(1)->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  sf::Runtime mpi = sf::Runtime::mpi();
  g_mpi = &mpi;
  benchmark::Initialize(&argc, argv);
  if (mpi.process_index() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  return 0;
}
