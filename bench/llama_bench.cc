// LLaMA 2 generation speed: stories15M and stories110M shapes (random
// weights), prefill of a 128-token prompt and decode, on 1 device and on 8
// in-process devices (mesh 4,1,2 with batch 4, and 1,1,8 with batch 1),
// each against one device at the same batch, measured in this process.
//
// Counters:
//   prefill_tok_s, decode_tok_s   tokens per second (all batch rows)
//   decode_vs_1, prefill_vs_1     ratio to one device at the same batch
//   bw_fraction                   (1 device, batch 1) decode tokens/s divided
//                                 by the bound: read bandwidth of this machine
//                                 (streaming read of 1 GiB, measured here) /
//                                 weight bytes a decode step reads
//   collectives, vs_megatron      collectives per decode step; ratio to the
//                                 Megatron minimum (2 all-reduces per layer)
//   resident_MiB, resident_vs_1   weights + KV cache held per device (the
//                                 largest device) and its ratio to one device
#include <benchmark/benchmark.h>

#include <chrono>
#include <map>
#include <numeric>

#include "shardflow/models/llama.h"
#include "shardflow/runtime/runtime.h"
#include "shardflow/shardflow.h"

namespace sf = shardflow;
namespace llama = shardflow::llama;

namespace {

constexpr int64_t kPrompt = 128;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Bytes per second of one thread streaming through a buffer far larger than
// the last-level cache (best of three passes).
double read_bandwidth() {
  static const double measured = [] {
    std::vector<float> buffer((1u << 30) / sizeof(float), 1.0f);
    double best = 0;
    for (int pass = 0; pass < 3; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      float acc[8] = {};
      for (std::size_t i = 0; i < buffer.size(); i += 8) {
        for (int k = 0; k < 8; ++k) acc[k] += buffer[i + static_cast<std::size_t>(k)];
      }
      benchmark::DoNotOptimize(acc);
      best = std::max(best, static_cast<double>(buffer.size() * sizeof(float)) / seconds_since(start));
    }
    return best;
  }();
  return measured;
}

// Bytes a decode step reads from the weights: everything but the embedding
// table, of which it reads one row per token.
double decode_weight_bytes(const llama::Weights& w) {
  int64_t elements = w.norm.numel() + w.output.numel();
  for (const llama::LayerWeights& l : w.layers) {
    for (const sf::Tensor* t : {&l.attention_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w1, &l.w2, &l.w3}) {
      elements += t->numel();
    }
  }
  return 4.0 * static_cast<double>(elements);
}

// The largest number of bytes any device holds for these tensors.
int64_t resident_bytes(const std::vector<sf::Tensor>& tensors, int64_t devices) {
  std::vector<int64_t> per_device(static_cast<std::size_t>(devices), 0);
  for (const sf::Tensor& t : tensors) {
    if (!t.sharding()) {
      for (int64_t& bytes : per_device) bytes += static_cast<int64_t>(t.value().nbytes());
      continue;
    }
    for (const sf::LocalShard& shard : t.local_shards()) {
      per_device[static_cast<std::size_t>(shard.device)] += static_cast<int64_t>(shard.data.nbytes());
    }
  }
  return *std::max_element(per_device.begin(), per_device.end());
}

struct Result {
  double prefill_tok_s = 0, decode_tok_s = 0, weight_bytes = 0;
  int64_t collectives = 0, resident = 0;
};

Result measure(const llama::Config& config, const std::vector<int64_t>& mesh_shape, int64_t batch, int64_t steps) {
  const int64_t devices = std::accumulate(mesh_shape.begin(), mesh_shape.end(), int64_t{1}, std::multiplies<>());
  std::optional<sf::Runtime> runtime;
  std::optional<llama::ShardingPlan> plan;
  if (devices > 1) {
    runtime.emplace(sf::Runtime::local(devices));
    std::vector<int64_t> ids(static_cast<std::size_t>(devices));
    std::iota(ids.begin(), ids.end(), 0);
    plan = llama::ShardingPlan::megatron(std::make_shared<const sf::Mesh>(
        ids, mesh_shape, std::vector<std::string>{"data", "fsdp", "model"}));
  }
  llama::Model model(llama::random_weights(config, 0, plan ? &*plan : nullptr), plan);
  model.trace(batch, kPrompt);
  std::vector<int64_t> prompt(static_cast<std::size_t>(batch * kPrompt));
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>(1 + (i * 7919) % 31000);
  const sf::Tensor prompt_tokens = sf::Tensor::from_ints(prompt, {batch, kPrompt});
  const sf::Tensor next = sf::Tensor::from_ints(std::vector<int64_t>(static_cast<std::size_t>(batch), 13), {batch, 1});

  Result r;
  llama::KVCache cache = model.new_cache(batch);
  benchmark::DoNotOptimize(model.forward(prompt_tokens, 0, cache).value());  // warm up both programs' buffers
  benchmark::DoNotOptimize(model.forward(next, kPrompt, cache).value());
  cache = model.new_cache(batch);
  auto start = std::chrono::steady_clock::now();
  benchmark::DoNotOptimize(model.forward(prompt_tokens, 0, cache).value());
  r.prefill_tok_s = static_cast<double>(batch * kPrompt) / seconds_since(start);
  start = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < steps; ++s) benchmark::DoNotOptimize(model.forward(next, kPrompt + s, cache).value());
  r.decode_tok_s = static_cast<double>(batch * steps) / seconds_since(start);
  r.collectives = static_cast<int64_t>(model.decode_collectives().size());
  r.weight_bytes = decode_weight_bytes(model.weights());
  std::vector<sf::Tensor> held{model.weights().tok_embeddings, model.weights().norm, model.weights().output};
  for (const llama::LayerWeights& l : model.weights().layers) {
    held.insert(held.end(), {l.attention_norm, l.wq, l.wk, l.wv, l.wo, l.ffn_norm, l.w1, l.w2, l.w3});
  }
  held.insert(held.end(), cache.keys.begin(), cache.keys.end());
  held.insert(held.end(), cache.values.begin(), cache.values.end());
  r.resident = resident_bytes(held, devices);
  return r;
}

// One-device baselines, per (config, batch), measured once per process.
const Result& baseline(const std::string& name, int64_t batch, int64_t steps) {
  static std::map<std::pair<std::string, int64_t>, Result> cache;
  auto it = cache.find({name, batch});
  if (it == cache.end()) it = cache.emplace(std::make_pair(name, batch), measure(llama::Config::named(name), {1, 1, 1}, batch, steps)).first;
  return it->second;
}

void Generate(benchmark::State& state, const std::string& name, std::vector<int64_t> mesh, int64_t batch) {
  const llama::Config config = llama::Config::named(name);
  const int64_t steps = name == "stories15M" ? 32 : 12;
  const Result& one = baseline(name, batch, steps);
  Result r;
  for (auto _ : state) r = mesh == std::vector<int64_t>{1, 1, 1} ? one : measure(config, mesh, batch, steps);
  state.counters["prefill_tok_s"] = r.prefill_tok_s;
  state.counters["decode_tok_s"] = r.decode_tok_s;
  state.counters["prefill_vs_1"] = r.prefill_tok_s / one.prefill_tok_s;
  state.counters["decode_vs_1"] = r.decode_tok_s / one.decode_tok_s;
  state.counters["collectives"] = static_cast<double>(r.collectives);
  state.counters["vs_megatron"] = static_cast<double>(r.collectives) / static_cast<double>(2 * config.n_layers);
  state.counters["resident_MiB"] = static_cast<double>(r.resident) / (1 << 20);
  state.counters["resident_vs_1"] = static_cast<double>(r.resident) / static_cast<double>(one.resident);
  if (mesh == std::vector<int64_t>{1, 1, 1} && batch == 1) {
    state.counters["bw_GB_s"] = read_bandwidth() / 1e9;
    state.counters["bw_fraction"] = r.decode_tok_s / (read_bandwidth() / r.weight_bytes);
  }
}

}  // namespace

BENCHMARK_CAPTURE(Generate, stories15M_1dev, "stories15M", {1, 1, 1}, 1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories15M_mesh_1_1_8, "stories15M", {1, 1, 8}, 1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories15M_1dev_batch4, "stories15M", {1, 1, 1}, 4)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories15M_mesh_4_1_2, "stories15M", {4, 1, 2}, 4)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories110M_1dev, "stories110M", {1, 1, 1}, 1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories110M_mesh_1_1_8, "stories110M", {1, 1, 8}, 1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories110M_1dev_batch4, "stories110M", {1, 1, 1}, 4)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories110M_mesh_4_1_2, "stories110M", {4, 1, 2}, 4)->Iterations(1)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
