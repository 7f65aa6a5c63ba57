// The memory-bandwidth bound of the benchmarks: how fast a plain loop
// streams floats from memory on this machine, measured in the same process
// as what it bounds. Compile the including target with the machine's widest
// vectors (-march=native), as the kernels it is compared with are.
#pragma once

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "shardflow/tensor/dense_tensor.h"
#include "shardflow/tensor/gemm.h"

namespace shardflow::bench {

// One shape of a streaming sum over n floats (a multiple of 128): eight
// add chains of kBytes-wide vectors, with or without the decode kernel's
// non-temporal prefetch 2 KiB ahead. Which shape reads fastest differs by
// machine and, on the dev VM, from minute to minute, so the probe takes the
// best of them: the bound is what some plain read loop reaches.
template <int kBytes, bool kPrefetch>
void stream(const float* p, std::size_t n) {
  using V [[gnu::vector_size(kBytes)]] = float;
  constexpr std::size_t kLanes = kBytes / sizeof(float);
  V acc[8] = {};
  for (std::size_t i = 0; i < n; i += 8 * kLanes) {
    if constexpr (kPrefetch) {
      for (std::size_t line = 0; line < 8 * kLanes; line += 16) __builtin_prefetch(p + i + line + 512, 0, 0);
    }
    for (std::size_t k = 0; k < 8; ++k) {
      V v;
      std::memcpy(&v, p + i + k * kLanes, kBytes);
      acc[k] += v;
    }
  }
  for (std::size_t k = 1; k < 8; ++k) acc[0] += acc[k];
  float lanes[kLanes];
  std::memcpy(lanes, &acc[0], kBytes);
  benchmark::DoNotOptimize(lanes[0]);
}

// The same sum over kStreams equal parts of the n floats read side by side,
// two vectors from each per step: some cores fetch more from memory with
// several sequential streams in flight than with one (AMD Zen 2: the decode
// kernel, which reads two weight rows at once, read 1.2x a single stream;
// AMD Zen 3: three streams of 256-bit loads read 1.07-1.29x two, the best
// shape there, and four 0.8x).
template <int kBytes, int kStreams>
void streams(const float* p, std::size_t n) {
  using V [[gnu::vector_size(kBytes)]] = float;
  constexpr std::size_t kLanes = kBytes / sizeof(float);
  static_assert(2 * kStreams <= 8, "two accumulators per stream, at most eight");
  const std::size_t part = n / kStreams / (2 * kLanes) * (2 * kLanes);
  V acc[2 * kStreams] = {};
  for (std::size_t i = 0; i < part; i += 2 * kLanes) {
    for (std::size_t s = 0; s < kStreams; ++s) {
      for (std::size_t k = 0; k < 2; ++k) {
        V v;
        std::memcpy(&v, p + s * part + i + k * kLanes, kBytes);
        acc[2 * s + k] += v;
      }
    }
  }
  for (std::size_t k = 1; k < 2 * kStreams; ++k) acc[0] += acc[k];
  float lanes[kLanes];
  std::memcpy(lanes, &acc[0], kBytes);
  benchmark::DoNotOptimize(lanes[0]);
}

// The last-level cache of the first core, as the kernel lists it (what
// lscpu prints); else as the C library reports it; 0 when unknown. Under a
// VM the C library may count the host's: glibc says 256 MiB on the 2-core
// dev VM (AMD EPYC Zen 2), whose kernel lists one L3 of 16 MiB.
inline int64_t llc_bytes() {
  int64_t best_level = 0;
  int64_t bytes = 0;
  for (int index = 0;; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level");
    std::ifstream size_file(dir + "size");
    int64_t level = 0;
    int64_t size = 0;
    std::string unit;
    if (!(level_file >> level) || !(size_file >> size)) break;
    size_file >> unit;  // "16384K": the kernel prints sizes in KiB or MiB
    size *= unit == "M" ? (int64_t{1} << 20) : unit == "K" ? (int64_t{1} << 10) : 1;
    if (level > best_level) best_level = level, bytes = size;
  }
  if (bytes > 0) return bytes;
  const long reported = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return reported > 0 ? reported : 0;
}

// Bytes per second of streaming reads: the best of the loop shapes, on one
// thread and on as many as the kernels use. measure() reads the whole
// buffer, four times the last-level cache and at least 1 GiB, so that it
// comes from memory; measure(bytes) reads its first `bytes` pass after pass,
// keeping in the caches what they hold of a working set that size.
class BandwidthProbe {
 public:
  // The buffer comes from the tensor allocator, as the weights do (page
  // alignment), so that both stream from the same kind of memory.
  BandwidthProbe()
      : buffer_(
            shardflow::DenseTensor::empty(shardflow::DType::kF32, {std::max(int64_t{1} << 30, 4 * llc_bytes()) / 4})) {
    std::fill(data(), data() + size(), 1.0f);
  }

  double measure() { return measure(size() * sizeof(float)); }

  double measure(double bytes) {
    const float* buffer = data();
    const std::size_t floats = std::min(size(), static_cast<std::size_t>(bytes / sizeof(float)));
    double best = 0;
    std::vector<int> thread_counts{1};
    if (shardflow::kernel_threads() > 1) thread_counts.push_back(shardflow::kernel_threads());
    for (int threads : thread_counts) {
      const std::size_t part = floats / static_cast<std::size_t>(threads) / 128 * 128;
      for (auto* stream :
           {&stream<16, false>, &stream<32, false>, &stream<32, true>, &stream<64, false>, &stream<64, true>,
            &streams<32, 2>, &streams<32, 3>, &streams<32, 4>, &streams<64, 2>, &streams<64, 3>, &streams<64, 4>}) {
        // The median of three passes of each: a single pass on this VM
        // sometimes reads at half speed, and the fastest of many passes of
        // loops this close would be the luckiest moment of a memory whose
        // speed drifts, not a rate the loop holds.
        std::array<double, 3> rates{};
        for (double& rate : rates) {
          const auto start = std::chrono::steady_clock::now();
          std::vector<std::thread> helpers;
          for (int t = 1; t < threads; ++t) {
            helpers.emplace_back(stream, buffer + part * static_cast<std::size_t>(t), part);
          }
          stream(buffer, part);
          for (std::thread& helper : helpers) helper.join();
          rate = static_cast<double>(part * static_cast<std::size_t>(threads) * sizeof(float)) /
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
        std::sort(rates.begin(), rates.end());
        best = std::max(best, rates[1]);
      }
    }
    return best;
  }

  double bytes() const { return static_cast<double>(size() * sizeof(float)); }

 private:
  float* data() { return buffer_.data_as<float>(); }
  std::size_t size() const { return static_cast<std::size_t>(buffer_.numel()); }

  shardflow::DenseTensor buffer_;
};

}  // namespace shardflow::bench
