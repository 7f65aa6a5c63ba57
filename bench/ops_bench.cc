// Op-layer benchmarks, each against a baseline measured in the same process.
//
// Matmul: aten::matmul through ops::call (binding, inference, kernel) vs a
//   direct cblas_sgemm on the same sizes; counter `vs_cblas` = cblas time /
//   op time (target >= 0.95).
// DecodeLinear: aten::linear of one row (a decode step) against weights of
//   37-98 MB, the size of LLaMA output heads, vs cblas_sgemv on the same operands;
//   `vs_cblas` as above, `GB_s` the weight bytes streamed per second.
// DecodeLinearFromMemory/<rows>/<threads>/<columns>: aten::linear of 1, 2,
//   4 or 8 rows against a weight of that many columns, at least 1 GiB and
//   four times the last-level cache (so it streams from memory), vs a streaming read of as many bytes
//   (bandwidth_probe.h), alternating in 5 rounds. `vs_stream` = the median
//   over rounds of the weight bytes per second / the faster probe before or
//   after (target >= 0.9); `vs_stream_min`/`_max` its spread.
// DecodeAttentionFromMemory/<keys>/<threads>: scaled_dot_product_attention
//   of a decode step (12 heads of 64, one query row each, a bool mask
//   showing the first <keys> slots of a cache twice as long), one layer's
//   cache after another over at least 1 GiB and four times the last-level
//   cache, vs a streaming read of the bytes shown (keys and values), in 5
//   rounds as above: `vs_stream`, its spread, and `us_per_layer`.
// Add, Silu on 16M f32: counter `vs_memcpy` = bandwidth of the op (bytes
//   read + written) / bandwidth of memcpy of the same bytes (target >= 0.6).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bandwidth_probe.h"
#include "openblas_kernels.h"
#include "shardflow/tensor/gemm.h"
#include "shardflow/trace/ops.h"

namespace sf = shardflow;

namespace {

template <class F>
double seconds_per_call(F&& f, int repeats) {
  f();  // warm up (page faults, caches)
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
}

// shardflow keeps OpenBLAS on one thread and splits its calls itself; the
// BLAS baselines run with OpenBLAS's own threads, as many as ours. Its
// threads spin for a while after their last call; the pause lets them fall
// asleep before our op is timed.
template <class F>
double blas_seconds_per_call(F&& f, int repeats) {
  openblas_set_num_threads(sf::kernel_threads());
  const double seconds = seconds_per_call(f, repeats);
  openblas_set_num_threads(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return seconds;
}

// The kernels OpenBLAS chose (see openblas_kernels.h): vs_cblas is against
// those; gemm_libraries_bench finds the best library on the machine.
std::string openblas_label() { return "cblas: " + sf::bench::openblas_kernels(); }

void Matmul(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const sf::Tensor a = sf::randn({m, k}, 1);
  const sf::Tensor b = sf::randn({k, n}, 2);
  const float* pa = a.value().data_as<float>();
  const float* pb = b.value().data_as<float>();
  std::vector<float> c(static_cast<std::size_t>(m * n));
  const int repeats = m * n * k > 1e9 ? 2 : 10;
  const double blas = blas_seconds_per_call(
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                    static_cast<int>(k), 1.0f, pa, static_cast<int>(k), pb, static_cast<int>(n), 0.0f, c.data(),
                    static_cast<int>(n));
        benchmark::DoNotOptimize(c.data());
      },
      repeats);
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    sf::Tensor out = sf::matmul(a, b);
    benchmark::DoNotOptimize(out);
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double op = total / static_cast<double>(state.iterations());
  state.counters["GFLOPS"] = 2.0 * static_cast<double>(m * n * k) / op / 1e9;
  state.counters["vs_cblas"] = blas / op;
  state.SetLabel(openblas_label());
}
BENCHMARK(Matmul)
    ->Args({256, 256, 256})
    ->Args({1024, 1024, 1024})
    ->Args({2048, 8192, 2048})
    ->Unit(benchmark::kMillisecond);

void DecodeLinear(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1);
  const sf::Tensor x = sf::randn({1, k}, 1);
  const sf::Tensor w = sf::randn({n, k}, 2);
  const float* px = x.value().data_as<float>();
  const float* pw = w.value().data_as<float>();
  std::vector<float> y(static_cast<std::size_t>(n));
  const double blas = blas_seconds_per_call(
      [&] {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, pw,
                    static_cast<int>(k), px, 1, 0.0f, y.data(), 1);
        benchmark::DoNotOptimize(y.data());
      },
      10);
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    sf::Tensor out = sf::linear(x, w);
    benchmark::DoNotOptimize(out);
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double op = total / static_cast<double>(state.iterations());
  state.counters["GB_s"] = static_cast<double>(n * k * 4) / op / 1e9;
  state.counters["vs_cblas"] = blas / op;
  state.SetLabel(openblas_label());
}
BENCHMARK(DecodeLinear)->Args({32000, 288})->Args({32000, 768})->Args({8192, 2048})->Unit(benchmark::kMillisecond);

// The decode kernel on one thread against weights the caches hold (1 MiB
// in L2, 12-16 MiB in L3): what its arithmetic and loads cost, apart from
// memory, against a streaming read of as many bytes kept in the caches the
// same way (vs_cached_read). Rows of x, weight rows, columns.
void DecodeRowsInCache(benchmark::State& state) {
  const int64_t rows = state.range(0), n = state.range(1), k = state.range(2);
  const int threads_before = sf::kernel_threads();
  sf::set_kernel_threads(1);
  static sf::bench::BandwidthProbe probe;  // 1 GiB: filled once for every case
  const sf::Tensor x = sf::randn({rows, k}, 1);
  const sf::Tensor w = sf::randn({n, k}, 2);
  const double bytes = static_cast<double>(n * k * 4);
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    sf::Tensor out = sf::linear(x, w);
    benchmark::DoNotOptimize(out);
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double rate = bytes * static_cast<double>(state.iterations()) / total;
  state.counters["GB_s"] = rate / 1e9;
  state.counters["vs_cached_read"] = rate / probe.measure(bytes);
  sf::set_kernel_threads(threads_before);
}
BENCHMARK(DecodeRowsInCache)->ArgsProduct({{1, 2, 4, 8}, {32, 512}, {8192}})->ArgsProduct({{1, 8}, {128, 4096}, {768}});

// Times `read`, which reads `bytes` from memory, on `threads` kernel
// threads in 5 rounds, each between two streaming reads of as many bytes;
// sets GB_s and vs_stream (medians of the rounds' rates, and of each rate
// over the faster probe beside it) and vs_stream's spread. Returns GB_s.
template <class Read>
double rounds_against_stream(benchmark::State& state, double bytes, int threads, Read&& read) {
  const int threads_before = sf::kernel_threads();
  sf::set_kernel_threads(threads);
  sf::bench::BandwidthProbe probe;
  std::vector<double> fractions, rates;
  for (auto _ : state) {
    double before = probe.measure(bytes);
    for (int round = 0; round < 5; ++round) {
      const auto start = std::chrono::steady_clock::now();
      read();
      const double rate = bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double after = probe.measure(bytes);
      rates.push_back(rate);
      fractions.push_back(rate / std::max(before, after));
      before = after;
    }
  }
  sf::set_kernel_threads(threads_before);
  std::sort(fractions.begin(), fractions.end());
  std::sort(rates.begin(), rates.end());
  state.counters["GB_s"] = rates[rates.size() / 2] / 1e9;
  state.counters["vs_stream"] = fractions[fractions.size() / 2];
  state.counters["vs_stream_min"] = fractions.front();
  state.counters["vs_stream_max"] = fractions.back();
  return rates[rates.size() / 2] / 1e9;
}

void DecodeLinearFromMemory(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int64_t columns = state.range(2);
  const int64_t weight_rows = std::max(int64_t{1} << 30, 4 * sf::bench::llc_bytes()) / 4 / columns;
  const int64_t weight_bytes = weight_rows * columns * 4;
  const sf::Tensor x = sf::randn({rows, columns}, 1);
  const sf::Tensor w = sf::randn({weight_rows, columns}, 2);
  rounds_against_stream(state, static_cast<double>(weight_bytes), static_cast<int>(state.range(1)),
                        [&] { benchmark::DoNotOptimize(sf::linear(x, w)); });
  state.counters["weights_MiB"] = static_cast<double>(weight_bytes) / (1 << 20);
  state.counters["llc_MiB"] = static_cast<double>(sf::bench::llc_bytes()) / (1 << 20);
  state.SetLabel("weights from memory: >= 1 GiB and >= 4x the last-level cache");
}
// Rows of x: 1, 2, 4 and 8 (each path of gemv.cc). Columns: a 7B-shaped
// w2's 11008 rounded to 8192, stories110M's w2 (2048: the longest rows one
// row of x reads as short ones) and its other matrices' 768 (short rows,
// read differently: see gemv.cc).
BENCHMARK(DecodeLinearFromMemory)
    ->ArgsProduct({{1, 2, 4, 8}, {1, 2}, {8192, 2048, 768}})
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// One decode step's attention: a query row of `heads` heads against `keys`
// cached positions of 64 floats per head (stories110M's and 7B's head size),
// a layer at a time over as many layers as make at least 1 GiB and four
// times the last-level cache, so each layer's cache comes from memory as in
// a step after the weights streamed through. The mask shows the first
// `keys` slots of a cache twice as long.
void DecodeAttentionFromMemory(benchmark::State& state) {
  const int64_t keys = state.range(0), heads = 12, depth = 64, slots = 2 * keys;
  const int64_t read_per_layer = 2 * heads * keys * depth * 4;  // keys and values
  const int64_t layers = std::max(int64_t{1} << 30, 4 * sf::bench::llc_bytes()) / read_per_layer + 1;
  const sf::Tensor q = sf::randn({1, heads, 1, depth}, 1);
  std::vector<sf::Tensor> cache_keys, cache_values;
  for (int64_t l = 0; l < layers; ++l) {
    cache_keys.push_back(sf::randn({1, heads, slots, depth}, 2 + 2 * static_cast<uint64_t>(l)));
    cache_values.push_back(sf::randn({1, heads, slots, depth}, 3 + 2 * static_cast<uint64_t>(l)));
  }
  std::vector<int64_t> visible(static_cast<std::size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) visible[static_cast<std::size_t>(s)] = s < keys ? 1 : 0;
  const sf::Tensor mask = sf::Tensor::from_ints(visible, {1, slots}, sf::DType::kBool);
  const double read_bytes = static_cast<double>(layers * read_per_layer);
  const double gb_s = rounds_against_stream(state, read_bytes, static_cast<int>(state.range(1)), [&] {
    for (int64_t l = 0; l < layers; ++l) {
      benchmark::DoNotOptimize(sf::scaled_dot_product_attention(q, cache_keys[static_cast<std::size_t>(l)],
                                                                cache_values[static_cast<std::size_t>(l)], mask));
    }
  });
  state.counters["us_per_layer"] = static_cast<double>(read_per_layer) / gb_s * 1e-3;
  state.SetLabel("KV caches from memory: >= 1 GiB and >= 4x the last-level cache");
}
BENCHMARK(DecodeAttentionFromMemory)
    ->ArgsProduct({{128, 1024}, {1, 2}})
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

constexpr int64_t kElements = int64_t{16} << 20;

double memcpy_seconds(std::size_t bytes) {
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  return seconds_per_call(
      [&] {
        std::memcpy(dst.data(), src.data(), bytes);
        benchmark::DoNotOptimize(dst.data());
      },
      5);
}

void Elementwise(benchmark::State& state) {
  const bool is_silu = state.range(0) == 1;
  const sf::Tensor x = sf::randn({kElements}, 3);
  const sf::Tensor y = sf::randn({kElements}, 4);
  // Bytes moved: add reads 2 and writes 1 tensor, silu reads 1 and writes 1.
  const auto bytes = static_cast<std::size_t>(kElements) * 4 * (is_silu ? 2 : 3);
  const double baseline = memcpy_seconds(bytes / 2);  // memcpy reads and writes its size
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    sf::Tensor out = is_silu ? sf::silu(x) : x + y;
    benchmark::DoNotOptimize(out);
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double op = total / static_cast<double>(state.iterations());
  state.counters["GB/s"] = static_cast<double>(bytes) / op / 1e9;
  state.counters["memcpy_GB/s"] = static_cast<double>(bytes) / baseline / 1e9;
  state.counters["vs_memcpy"] = baseline / op;
  state.SetLabel(is_silu ? "silu" : "add");
}
BENCHMARK(Elementwise)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
