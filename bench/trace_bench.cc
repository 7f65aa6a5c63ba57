// Tracing + verification time of a 32-layer LLaMA-7B-shaped forward traced
// on shape-only tensors (target < 200 ms), propagation alone on 8 devices,
// and propagation + partitioning
// of the same graph with Megatron annotations on 8, 64 and 256 devices
// (target < 300 ms on 8; the counter `vs_8` is the time relative to 8
// devices, target <= 1.2: the program does not grow with the device count).
#include <benchmark/benchmark.h>

#include <chrono>
#include <numeric>

#include "llama_shape.h"
#include "shardflow/partition/program.h"

namespace sf = shardflow;

static void TraceLlama7B(benchmark::State& state) {
  const bench::Llama7B model;
  const sf::Tensor tokens = sf::Tensor::meta(sf::DType::kI64, {1, model.tokens});
  std::size_t nodes = 0;
  for (auto _ : state) {
    auto step = sf::compile([&](sf::Tensor t) { return model.forward(t, std::nullopt); });  // fresh cache
    nodes = step.trace(tokens).nodes().size();
  }
  state.counters["nodes"] = static_cast<double>(nodes);
}
BENCHMARK(TraceLlama7B)->Unit(benchmark::kMillisecond);

static double partition_seconds(int64_t devices, std::size_t* collectives) {
  const bench::Llama7B model;
  std::vector<int64_t> ids(static_cast<std::size_t>(devices));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  const sf::Mesh mesh(ids, {1, devices}, {"data", "model"});
  auto step = sf::compile([&](sf::Tensor t) { return model.forward(t, mesh); });
  const sf::Graph& graph = step.trace(sf::Tensor::meta(sf::DType::kI64, {1, model.tokens}));
  const auto start = std::chrono::steady_clock::now();
  const sf::PropagationResult shardings = sf::propagate_shardings(graph);
  const sf::PartitionedProgram program = sf::partition_graph(graph, shardings);
  *collectives = program.collectives.size();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Sharding propagation alone, on the graph PartitionLlama7B partitions (8 devices).
static void PropagateLlama7B(benchmark::State& state) {
  const bench::Llama7B model;
  std::vector<int64_t> ids(8);
  std::iota(ids.begin(), ids.end(), int64_t{0});
  const sf::Mesh mesh(ids, {1, 8}, {"data", "model"});
  auto step = sf::compile([&](sf::Tensor t) { return model.forward(t, mesh); });
  const sf::Graph& graph = step.trace(sf::Tensor::meta(sf::DType::kI64, {1, model.tokens}));
  for (auto _ : state) {
    sf::PropagationResult shardings = sf::propagate_shardings(graph);
    benchmark::DoNotOptimize(shardings);
  }
  state.counters["nodes"] = static_cast<double>(graph.nodes().size());
}
BENCHMARK(PropagateLlama7B)->Unit(benchmark::kMillisecond);

static void PartitionLlama7B(benchmark::State& state) {
  std::size_t collectives = 0;
  const double eight = partition_seconds(8, &collectives);
  double total = 0;
  for (auto _ : state) {
    const double seconds = partition_seconds(state.range(0), &collectives);
    state.SetIterationTime(seconds);
    total += seconds;
  }
  state.counters["vs_8"] = total / static_cast<double>(state.iterations()) / eight;
  state.counters["collectives"] = static_cast<double>(collectives);
}
BENCHMARK(PartitionLlama7B)->Arg(8)->Arg(64)->Arg(256)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
