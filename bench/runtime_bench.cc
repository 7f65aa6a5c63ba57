// Collective benchmarks on the in-process runtime. Every variant is first
// checked against the expected result, then timed.
//
// AllReduce/<bytes>/<devices>: an f32 all-reduce over every device. One
// iteration is one run() of many collectives (the label says how many), so
// the run's start-up hardly counts. Counters: `us_per_op` the time of one
// collective; `bytes_per_second` the algorithm bandwidth (buffer size / time
// of one collective); `vs_memcpy` the time of one single-threaded memcpy of
// the same bytes, measured in this process, divided by the time of one
// collective (1.0 = as fast as one plain copy; with 8 devices on 2 cores each
// device's copies share the cores, so expect about 2/8 of a memcpy at best).
// Barrier/<devices>: the same for a barrier over every device.
// RunOverhead/<devices>: an empty run() (waking and joining the devices).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "shardflow/runtime/runtime.h"

namespace sf = shardflow;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_per_memcpy(std::size_t bytes) {
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  std::memcpy(dst.data(), src.data(), bytes);  // fault the pages in first
  constexpr int kRepeats = 20;
  const auto start = Clock::now();
  for (int i = 0; i < kRepeats; ++i) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / kRepeats;
}

sf::DeviceGroup all_devices(int64_t n) {
  sf::DeviceGroup group;
  for (int64_t d = 0; d < n; ++d) group.devices.push_back(d);
  return group;
}

// Times `repeats` collectives per iteration; sets the per-collective
// counters and returns the mean seconds per collective.
template <class F>
double time_per_op(benchmark::State& state, int repeats, std::size_t bytes, F&& run_repeats) {
  double total = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    run_repeats(repeats);
    total += std::chrono::duration<double>(Clock::now() - start).count();
  }
  const double per_op = total / static_cast<double>(state.iterations() * repeats);
  state.counters["us_per_op"] = per_op * 1e6;
  if (bytes != 0) state.counters["bytes_per_second"] = static_cast<double>(bytes) / per_op;
  state.SetLabel(std::to_string(repeats) + " collectives per run");
  return per_op;
}

void AllReduce(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const int64_t devices = state.range(1);
  sf::Runtime rt = sf::Runtime::local(devices);
  const sf::DeviceGroup group = all_devices(devices);
  std::vector<std::vector<float>> data(static_cast<std::size_t>(devices), std::vector<float>(bytes / sizeof(float)));
  auto all_reduce = [&](int repeats) {
    rt.run([&](int64_t device, sf::Communicator& comm) {
      auto span = std::as_writable_bytes(std::span(data[static_cast<std::size_t>(device)]));
      for (int i = 0; i < repeats; ++i) comm.all_reduce(group, span, sf::DType::kF32, sf::ReduceOp::kMax);
    });
  };
  // Check: device d holds d + i at element i; the max is devices - 1 + i.
  for (std::size_t d = 0; d < data.size(); ++d) {
    for (std::size_t i = 0; i < data[d].size(); ++i) data[d][i] = static_cast<float>(d + i % 1000);
  }
  all_reduce(1);
  for (const auto& values : data) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (values[i] != static_cast<float>(static_cast<std::size_t>(devices) - 1 + i % 1000)) {
        state.SkipWithError("all_reduce gave a wrong result");
        return;
      }
    }
  }
  const int repeats = bytes >= (1 << 20) ? 10 : 1000;
  const double memcpy_seconds = seconds_per_memcpy(bytes);
  const double per_op = time_per_op(state, repeats, bytes, all_reduce);
  state.counters["vs_memcpy"] = memcpy_seconds / per_op;
  state.counters["memcpy_us"] = memcpy_seconds * 1e6;
}
// Max costs what a sum costs and keeps the values finite over many repeats.
BENCHMARK(AllReduce)
    ->ArgNames({"bytes", "devices"})
    ->Args({4 << 20, 8})
    ->Args({4 << 10, 8})
    ->Args({4 << 20, 2})
    ->Args({4 << 10, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void Barrier(benchmark::State& state) {
  const int64_t devices = state.range(0);
  sf::Runtime rt = sf::Runtime::local(devices);
  const sf::DeviceGroup group = all_devices(devices);
  constexpr int kRepeats = 1000;
  time_per_op(state, kRepeats, 0, [&](int repeats) {
    rt.run([&](int64_t, sf::Communicator& comm) {
      for (int i = 0; i < repeats; ++i) comm.barrier(group);
    });
  });
}
BENCHMARK(Barrier)->Arg(8)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

void RunOverhead(benchmark::State& state) {
  sf::Runtime rt = sf::Runtime::local(state.range(0));
  for (auto _ : state) rt.run([](int64_t, sf::Communicator&) {});
}
BENCHMARK(RunOverhead)->Arg(8)->Arg(2)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
