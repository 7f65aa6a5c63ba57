// Sharding-core benchmarks.
//
// SplitIntoShards: laying a host tensor out across devices (eager
// mark_sharding does this) against one memcpy of the same bytes; the counter
// `vs_memcpy` is memcpy time / split time (1.0 = as fast as a plain copy).
// HloV1String: the V1 string of a sharding on large meshes (the string grows
// with the device count; everything else must not).
// FromSpecV1: a spec to its V1 string on a (4, 2) mesh, the call
// bench/python_bench.py times from Python (Sharding.from_spec(...).v1).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <numeric>

#include "shardflow/sharding/shard_layout.h"
#include "shardflow/sharding/sharding.h"

namespace sf = shardflow;

namespace {

std::shared_ptr<const sf::Mesh> make_mesh(std::vector<int64_t> shape) {
  int64_t size = 1;
  for (int64_t extent : shape) size *= extent;
  std::vector<int64_t> ids(static_cast<std::size_t>(size));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return std::make_shared<const sf::Mesh>(ids, shape);
}

double seconds_per_memcpy(std::size_t bytes) {
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  std::memcpy(dst.data(), src.data(), bytes);  // fault the pages in first
  const auto start = std::chrono::steady_clock::now();
  constexpr int kRepeats = 5;
  for (int i = 0; i < kRepeats; ++i) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kRepeats;
}

void SplitIntoShards(benchmark::State& state) {
  // f32[4096, 4096] (64 MiB) on a 2x4 mesh; spec from the benchmark argument.
  const std::vector<int64_t> shape{4096, 4096};
  const char* specs[] = {"(0, 1)", "(None, 1)", "(0, None)"};
  const auto spec = sf::PartitionSpec::parse(specs[state.range(0)]);
  const sf::ShardLayout layout = sf::shard_layout(sf::Sharding::from_spec(make_mesh({2, 4}), spec), shape);
  std::vector<float> global(4096 * 4096, 1.0f);
  const auto bytes = std::as_bytes(std::span(global));
  // Bytes written: one padded shard per device.
  const std::size_t written = layout.shards.size() * static_cast<std::size_t>(layout.shard_elements()) * 4;
  const double memcpy_seconds = seconds_per_memcpy(written);
  // Device buffers exist before the split, as in the runtime.
  auto buffers = sf::split_into_shards(layout, bytes, sizeof(float));
  std::vector<std::span<std::byte>> views(buffers.begin(), buffers.end());
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    sf::split_into_shards(layout, bytes, sizeof(float), views);
    benchmark::DoNotOptimize(buffers.data());
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * written));
  state.counters["vs_memcpy"] = memcpy_seconds / (total / static_cast<double>(state.iterations()));
  state.SetLabel(specs[state.range(0)]);
}
BENCHMARK(SplitIntoShards)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

void HloV1String(benchmark::State& state) {
  const int64_t devices = state.range(0);
  auto mesh = make_mesh({devices / 4, 4});
  const sf::Sharding sharding = sf::Sharding::from_spec(mesh, {sf::none, 1});
  for (auto _ : state) benchmark::DoNotOptimize(sharding.to_hlo_v1().to_string());
}
BENCHMARK(HloV1String)->Arg(8)->Arg(64)->Arg(256);

void FromSpecV1(benchmark::State& state) {
  auto mesh = std::make_shared<const sf::Mesh>(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, std::vector<int64_t>{4, 2},
                                               std::vector<std::string>{"data", "model"});
  for (auto _ : state) {
    benchmark::DoNotOptimize(sf::Sharding::from_spec(mesh, {"data", sf::none}).to_hlo_v1().to_string());
  }
}
BENCHMARK(FromSpecV1);

}  // namespace

BENCHMARK_MAIN();
