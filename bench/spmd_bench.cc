// An MLP block (dim 2048, ffn 8192, 256 tokens; Megatron: w1 split by
// columns, w2 by rows) on 8 in-process devices against 1 device, in the same
// process. Counter `cpu_vs_1` = total CPU time of the 8-device run / that of
// the 1-device run (target <= 1.15: sharding must not waste compute);
// `wall_vs_1` the same for wall time (2 cores: at best 0.5).
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <numeric>

#include "shardflow/runtime/runtime.h"
#include "shardflow/shardflow.h"

namespace sf = shardflow;

namespace {

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct Timing {
  double cpu = 0, wall = 0;
};

template <class F>
Timing measure(F&& f, int repeats) {
  f();  // warm up: trace, partition, buffers
  const double cpu = cpu_seconds();
  const auto wall = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) f();
  return {(cpu_seconds() - cpu) / repeats,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count() / repeats};
}

void MlpBlock(benchmark::State& state) {
  const int64_t dim = 2048, ffn = 8192, tokens = 256;
  const sf::Tensor x = sf::randn({tokens, dim}, 1);
  const sf::Tensor w1_value = sf::randn({dim, ffn}, 2), w2_value = sf::randn({ffn, dim}, 3);
  constexpr int kRepeats = 3;
  Timing one;
  {
    auto mlp = sf::compile([&](sf::Tensor in) { return sf::matmul(sf::gelu(sf::matmul(in, w1_value)), w2_value); });
    one = measure([&] { benchmark::DoNotOptimize(mlp(x)); }, kRepeats);
  }
  Timing eight;
  for (auto _ : state) {
    sf::Runtime runtime = sf::Runtime::local(8);
    std::vector<int64_t> ids(8);
    std::iota(ids.begin(), ids.end(), int64_t{0});
    const sf::Mesh mesh(ids, {1, 8}, {"data", "model"});
    sf::Tensor w1(w1_value.value()), w2(w2_value.value());
    sf::mark_sharding(w1, mesh, {sf::none, "model"});
    sf::mark_sharding(w2, mesh, {"model", sf::none});
    auto mlp = sf::compile([&](sf::Tensor in) { return sf::matmul(sf::gelu(sf::matmul(in, w1)), w2); });
    eight = measure([&] { benchmark::DoNotOptimize(mlp(x)); }, kRepeats);
    state.SetIterationTime(eight.wall);
  }
  state.counters["cpu_vs_1"] = eight.cpu / one.cpu;
  state.counters["wall_vs_1"] = eight.wall / one.wall;
  state.counters["wall_1_ms"] = one.wall * 1e3;
}
BENCHMARK(MlpBlock)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
