// LLaMA 2 generation speed: stories15M and stories110M shapes (random
// weights), prefill of a 128-token prompt and decode, on 1 device and on 8
// in-process devices (mesh 4,1,2 with batch 4, and 1,1,8 with batch 1),
// each against one device at the same batch, measured in this process; and
// decode of a 1.1B shape (TinyLlama's) on 1 device, whose weights no cache
// holds.
//
// Counters:
//   prefill_tok_s, decode_tok_s   tokens per second (all batch rows)
//   decode_vs_1, prefill_vs_1     ratio to one device at the same batch
//   bw_fraction                   (1 device, batch 1) decode tokens/s divided
//                                 by the bound: read bandwidth of this machine
//                                 (bw_GB_s: streaming read of probe_MiB, four
//                                 times the last-level cache llc_MiB and at
//                                 least 1 GiB; the best of one thread and
//                                 kernel_threads threads, eleven loop shapes
//                                 of one to four streams per thread, the
//                                 median of three passes each) / weight
//                                 bytes a decode
//                                 step reads (weights_MiB);
//                                 the median over 5 chunks of decode steps
//                                 (bw_fraction_min and _max: their spread),
//                                 each bounded by the faster of the probes
//                                 right before and right after it, and
//                                 timed after one untimed step. Above 1 when
//                                 the caches keep some weights from step to
//                                 step (a VM may have an L3 larger than
//                                 stories110M's weights; llc_MiB is the
//                                 kernel's figure, as lscpu prints it)
//   same_bytes_bw_fraction        the same against a read of weights_MiB
//                                 pass after pass (same_bytes_bw_GB_s): what
//                                 the caches give a working set that size,
//                                 near or below 1 (reads at most the
//                                 probe's size)
//   matmul_bw_fraction            the same as bw_fraction for the decode
//                                 step's matrix products alone (its weights,
//                                 its order, one row of x), run after each
//                                 chunk: what the kernel reaches; the gap to
//                                 bw_fraction is the step's other ops and the
//                                 interpreter
//   collectives, vs_megatron      collectives per decode step; ratio to the
//                                 Megatron minimum (2 all-reduces per layer)
//   bytes_vs_megatron             bytes each device sends per decode step in
//                                 ring collectives, over what Megatron's 2
//                                 all-reduces per layer of the activations send
//   resident_MiB, resident_vs_1   weights + KV cache held per device (the
//                                 largest device) and its ratio to one device
//   peak_MiB, peak_vs_1           per-device peak: what the device holds plus
//                                 the most its prefill or decode steps
//                                 allocated on top (sf::device_memory), the
//                                 largest device, and its ratio to one device
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "bandwidth_probe.h"
#include "shardflow/models/llama.h"
#include "shardflow/runtime/runtime.h"
#include "shardflow/shardflow.h"
#include "shardflow/tensor/device_memory.h"
#include "shardflow/tensor/gemm.h"

namespace sf = shardflow;
using shardflow::bench::BandwidthProbe;
using shardflow::bench::llc_bytes;
namespace llama = shardflow::llama;

namespace {

constexpr int64_t kPrompt = 128;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <class T>
T median(std::vector<T> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
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

// The bytes each device holds for these tensors; a buffer two of them share
// (a tied output head) counts once.
std::vector<int64_t> resident_bytes(const std::vector<sf::Tensor>& tensors, int64_t devices) {
  std::vector<int64_t> per_device(static_cast<std::size_t>(devices), 0);
  std::set<std::pair<int64_t, const std::byte*>> seen;
  auto hold = [&](int64_t device, const sf::DenseTensor& data) {
    if (seen.insert({device, data.data()}).second)
      per_device[static_cast<std::size_t>(device)] += static_cast<int64_t>(data.nbytes());
  };
  for (const sf::Tensor& t : tensors) {
    if (!t.sharding()) {
      for (int64_t d = 0; d < devices; ++d) hold(d, t.value());
      continue;
    }
    for (const sf::LocalShard& shard : t.local_shards()) hold(shard.device, shard.data);
  }
  return per_device;
}

// What each device allocated during some steps on top of what it held
// before them (sf::device_memory), from construction to extra().
class StepMemory {
 public:
  explicit StepMemory(int64_t devices) : before_(static_cast<std::size_t>(devices)) {
    for (std::size_t d = 0; d < before_.size(); ++d)
      before_[d] = sf::device_memory(static_cast<int64_t>(d)).current_bytes;
    sf::reset_device_memory_peaks();
  }
  std::vector<int64_t> extra() const {
    std::vector<int64_t> bytes(before_.size());
    for (std::size_t d = 0; d < before_.size(); ++d) {
      bytes[d] = sf::device_memory(static_cast<int64_t>(d)).peak_bytes - before_[d];
    }
    return bytes;
  }

 private:
  std::vector<int64_t> before_;
};

// Bytes one device sends in a ring implementation of the collective over
// groups of n (all-reduce = reduce-scatter + all-gather); bytes_per_device
// is the whole buffer a reduce takes in or a gather puts out.
double ring_bytes_sent(const sf::ProgramCollective& c) {
  const double n = static_cast<double>(c.group_size), bytes = static_cast<double>(c.bytes_per_device);
  if (c.kind == "all-reduce") return 2 * (n - 1) / n * bytes;
  if (c.kind == "collective-permute") return bytes;
  return (n - 1) / n * bytes;  // reduce-scatter, all-gather, all-to-all
}

// The matrix products of one decode step, called directly in the step's
// order on the model's (unsharded) weights.
class StepMatmuls {
 public:
  explicit StepMatmuls(const llama::Weights& w) {
    for (const llama::LayerWeights& l : w.layers) {
      for (const sf::Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w3, &l.w2}) add(*t);
    }
    add(w.output);
  }

  void run() {
    for (const Matrix& m : matrices_) {
      sf::gemm_f32({1, m.rows, m.columns, false, true}, x_.data(), m.data, y_.data());
    }
    benchmark::DoNotOptimize(y_.data());
  }

 private:
  struct Matrix {
    const float* data;
    int64_t rows, columns;
  };
  void add(const sf::Tensor& weight) {
    const sf::DenseTensor& value = weight.value();
    matrices_.push_back({value.data_as<float>(), value.shape()[0], value.shape()[1]});
    x_.resize(std::max(x_.size(), static_cast<std::size_t>(value.shape()[1])), 0.01f);
    y_.resize(std::max(y_.size(), static_cast<std::size_t>(value.shape()[0])));
  }
  std::vector<Matrix> matrices_;
  std::vector<float> x_, y_;
};

struct Result {
  double prefill_tok_s = 0, decode_tok_s = 0, weight_bytes = 0;
  // One device, batch 1: memory bandwidth and the fractions of it reached;
  // the same against a read of the weights' bytes alone.
  double bandwidth = 0, bw_fraction = 0, matmul_bw_fraction = 0;
  double bw_fraction_min = 0, bw_fraction_max = 0;  // the spread of the chunks' fractions
  double same_bytes_bandwidth = 0, same_bytes_bw_fraction = 0, probe_bytes = 0;
  int64_t collectives = 0, resident = 0, peak = 0;
  double collective_bytes = 0, megatron_bytes = 0;  // sent per device per decode step
};

Result measure(const llama::Config& config, const std::vector<int64_t>& mesh_shape, int64_t batch, int64_t steps) {
  const int64_t devices = std::accumulate(mesh_shape.begin(), mesh_shape.end(), int64_t{1}, std::multiplies<>());
  std::optional<sf::Runtime> runtime;
  std::optional<llama::ShardingPlan> plan;
  if (devices > 1) {
    runtime.emplace(sf::Runtime::local(devices));
    std::vector<int64_t> ids(static_cast<std::size_t>(devices));
    std::iota(ids.begin(), ids.end(), 0);
    plan = llama::ShardingPlan::megatron(
        std::make_shared<const sf::Mesh>(ids, mesh_shape, std::vector<std::string>{"data", "fsdp", "model"}));
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
  StepMemory prefill_memory(devices);
  auto start = std::chrono::steady_clock::now();
  benchmark::DoNotOptimize(model.forward(prompt_tokens, 0, cache).value());
  r.prefill_tok_s = static_cast<double>(batch * kPrompt) / seconds_since(start);
  const std::vector<int64_t> prefill_extra = prefill_memory.extra();
  r.weight_bytes = decode_weight_bytes(model.weights());
  StepMemory decode_memory(devices);
  if (devices == 1 && batch == 1) {
    // Decode in chunks between bandwidth probes: this VM's speed drifts, and
    // a bound measured next to the steps it bounds follows it. Each chunk is
    // bounded by the faster of the probes before and after it, so a probe
    // that hit a slow moment does not lower the bound (the fraction once
    // read 1.2 with only the probe before). An untimed step after each
    // probe stands for the step before in a real generation: the probe's
    // 1 GiB stream evicts what decode keeps cached and lets the kernel
    // worker fall asleep.
    BandwidthProbe probe;
    StepMatmuls matmuls(model.weights());
    constexpr int64_t kChunks = 5;
    std::vector<double> bandwidths{probe.measure()}, same_bytes{probe.measure(r.weight_bytes)}, rates, matmul_rates;
    double seconds = 0;
    for (int64_t chunk = 0; chunk < kChunks; ++chunk) {
      // The first timed step rewrites the same cache slot.
      benchmark::DoNotOptimize(model.forward(next, kPrompt + chunk * steps / kChunks, cache).value());
      start = std::chrono::steady_clock::now();
      for (int64_t s = chunk * steps / kChunks; s < (chunk + 1) * steps / kChunks; ++s) {
        benchmark::DoNotOptimize(model.forward(next, kPrompt + s, cache).value());
      }
      const double chunk_seconds = seconds_since(start);
      seconds += chunk_seconds;
      const double chunk_steps = static_cast<double>((chunk + 1) * steps / kChunks - chunk * steps / kChunks);
      rates.push_back(chunk_steps * r.weight_bytes / chunk_seconds);
      matmuls.run();
      start = std::chrono::steady_clock::now();
      for (int64_t s = 0; s < static_cast<int64_t>(chunk_steps); ++s) matmuls.run();
      matmul_rates.push_back(chunk_steps * r.weight_bytes / seconds_since(start));
      bandwidths.push_back(probe.measure());
      same_bytes.push_back(probe.measure(r.weight_bytes));
    }
    std::vector<double> fractions, matmul_fractions, same_bytes_fractions;
    for (std::size_t chunk = 0; chunk < rates.size(); ++chunk) {
      const double bound = std::max(bandwidths[chunk], bandwidths[chunk + 1]);
      fractions.push_back(rates[chunk] / bound);
      matmul_fractions.push_back(matmul_rates[chunk] / bound);
      same_bytes_fractions.push_back(rates[chunk] / std::max(same_bytes[chunk], same_bytes[chunk + 1]));
    }
    r.decode_tok_s = static_cast<double>(steps) / seconds;
    r.bandwidth = median(bandwidths);
    r.bw_fraction = median(fractions);
    r.bw_fraction_min = *std::min_element(fractions.begin(), fractions.end());
    r.bw_fraction_max = *std::max_element(fractions.begin(), fractions.end());
    r.matmul_bw_fraction = median(matmul_fractions);
    r.same_bytes_bandwidth = median(same_bytes);
    r.same_bytes_bw_fraction = median(same_bytes_fractions);
    r.probe_bytes = probe.bytes();
  } else {
    start = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < steps; ++s) benchmark::DoNotOptimize(model.forward(next, kPrompt + s, cache).value());
    r.decode_tok_s = static_cast<double>(batch * steps) / seconds_since(start);
  }
  const std::vector<int64_t> decode_extra = decode_memory.extra();
  r.collectives = static_cast<int64_t>(model.decode_collectives().size());
  for (const sf::ProgramCollective& c : model.decode_collectives()) r.collective_bytes += ring_bytes_sent(c);
  const double model_axis = static_cast<double>(mesh_shape[2]);
  const double activation_bytes = 4.0 * static_cast<double>(batch) / static_cast<double>(mesh_shape[0]) *
                                  static_cast<double>(config.dim);  // a data shard's rows
  r.megatron_bytes = 2.0 * static_cast<double>(config.n_layers) * 2 * (model_axis - 1) / model_axis * activation_bytes;
  std::vector<sf::Tensor> held{model.weights().tok_embeddings, model.weights().norm, model.weights().output};
  for (const llama::LayerWeights& l : model.weights().layers) {
    held.insert(held.end(), {l.attention_norm, l.wq, l.wk, l.wv, l.wo, l.ffn_norm, l.w1, l.w2, l.w3});
  }
  held.insert(held.end(), cache.keys.begin(), cache.keys.end());
  held.insert(held.end(), cache.values.begin(), cache.values.end());
  const std::vector<int64_t> resident = resident_bytes(held, devices);
  for (std::size_t d = 0; d < resident.size(); ++d) {
    r.resident = std::max(r.resident, resident[d]);
    r.peak = std::max(r.peak, resident[d] + std::max(prefill_extra[d], decode_extra[d]));
  }
  return r;
}

// The named configs, and "1.1B": TinyLlama-1.1B's shape (grouped-query
// attention, untied head; 4.1 GiB of f32 weights, past any cache), for
// decode from memory.
llama::Config bench_config(const std::string& name) {
  if (name != "1.1B") return llama::Config::named(name);
  llama::Config c;
  c.name = name;
  c.dim = 2048;
  c.hidden_dim = 5632;
  c.n_layers = 22;
  c.n_heads = 32;
  c.n_kv_heads = 4;
  c.vocab_size = 32000;
  c.seq_len = 2048;
  c.shared_classifier = false;
  return c;
}

// One-device baselines, per (config, batch), measured once per process.
const Result& baseline(const std::string& name, int64_t batch, int64_t steps) {
  static std::map<std::pair<std::string, int64_t>, Result> cache;
  auto it = cache.find({name, batch});
  if (it == cache.end())
    it = cache.emplace(std::make_pair(name, batch), measure(bench_config(name), {1, 1, 1}, batch, steps)).first;
  return it->second;
}

void Generate(benchmark::State& state, const std::string& name, std::vector<int64_t> mesh, int64_t batch) {
  const llama::Config config = bench_config(name);
  const int64_t steps = name == "stories15M" ? 120 : name == "1.1B" ? 15 : 24;
  const Result& one = baseline(name, batch, steps);
  Result r;
  for (auto _ : state) r = mesh == std::vector<int64_t>{1, 1, 1} ? one : measure(config, mesh, batch, steps);
  state.counters["prefill_tok_s"] = r.prefill_tok_s;
  state.counters["decode_tok_s"] = r.decode_tok_s;
  state.counters["prefill_vs_1"] = r.prefill_tok_s / one.prefill_tok_s;
  state.counters["decode_vs_1"] = r.decode_tok_s / one.decode_tok_s;
  state.counters["collectives"] = static_cast<double>(r.collectives);
  state.counters["vs_megatron"] = static_cast<double>(r.collectives) / static_cast<double>(2 * config.n_layers);
  if (r.megatron_bytes > 0) state.counters["bytes_vs_megatron"] = r.collective_bytes / r.megatron_bytes;
  state.counters["resident_MiB"] = static_cast<double>(r.resident) / (1 << 20);
  state.counters["resident_vs_1"] = static_cast<double>(r.resident) / static_cast<double>(one.resident);
  state.counters["peak_MiB"] = static_cast<double>(r.peak) / (1 << 20);
  state.counters["peak_vs_1"] = static_cast<double>(r.peak) / static_cast<double>(one.peak);
  if (mesh == std::vector<int64_t>{1, 1, 1} && batch == 1) {
    state.counters["kernel_threads"] = sf::kernel_threads();
    state.counters["bw_GB_s"] = r.bandwidth / 1e9;
    state.counters["bw_fraction"] = r.bw_fraction;
    state.counters["bw_fraction_min"] = r.bw_fraction_min;
    state.counters["bw_fraction_max"] = r.bw_fraction_max;
    state.counters["matmul_bw_fraction"] = r.matmul_bw_fraction;
    state.counters["llc_MiB"] = static_cast<double>(llc_bytes()) / (1 << 20);
    state.counters["probe_MiB"] = r.probe_bytes / (1 << 20);
    state.counters["weights_MiB"] = r.weight_bytes / (1 << 20);
    state.counters["same_bytes_bw_GB_s"] = r.same_bytes_bandwidth / 1e9;
    state.counters["same_bytes_bw_fraction"] = r.same_bytes_bw_fraction;
  }
}

}  // namespace

BENCHMARK_CAPTURE(Generate, stories15M_1dev, "stories15M", {1, 1, 1}, 1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories15M_mesh_1_1_8, "stories15M", {1, 1, 8}, 1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories15M_1dev_batch4, "stories15M", {1, 1, 1}, 4)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories15M_mesh_4_1_2, "stories15M", {4, 1, 2}, 4)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories110M_1dev, "stories110M", {1, 1, 1}, 1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories110M_mesh_1_1_8, "stories110M", {1, 1, 8}, 1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories110M_1dev_batch4, "stories110M", {1, 1, 1}, 4)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, stories110M_mesh_4_1_2, "stories110M", {4, 1, 2}, 4)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Generate, 1_1B_1dev, "1.1B", {1, 1, 1}, 1)->Iterations(1)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
