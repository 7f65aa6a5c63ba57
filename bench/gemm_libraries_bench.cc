// Which matrix library: shardflow's GEMM (fixed blocks of single-threaded
// oneDNN calls on our pool) against OpenBLAS, oneDNN and BLIS, each with
// its own threads, on the products of prefill (LLaMA's linear layers at the
// stories110M and 7B shapes, attention's two products) and two square-ish
// sizes, at 1 and kernel_threads() threads.
//
// oneDNN's C GEMM (libdnnl.so.2, already loaded by shardflow) and BLIS
// (blis-pthread/libblis.so.4) are opened with dlopen, so the project does
// not depend on BLIS; a library that is not installed is left out (Debian:
// libblis4-pthread). OpenBLAS's kernels are the ones it chose when it
// loaded: run again with OPENBLAS_CORETYPE=Haswell, SkylakeX, ... to
// compare its kernel sets.
//
// Each row: GFLOPS of each library, median of `--rounds` rounds (default 3)
// in which the libraries alternate, and ours / the best of the others. Every
// library's C is checked against ours (relative max difference). `--only
// TEXT` times the products whose name contains TEXT.
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "openblas_kernels.h"
#include "shardflow/tensor/gemm.h"

namespace sf = shardflow;

namespace {

struct Product {
  const char* what;
  int64_t m, n, k;
  bool transpose_b;  // B stored n x k (a linear layer's weight)
};

// The prefill products: a 16- and a 128-token prompt at stories110M's shape, a
// 512-token prompt at 7B's (one head's attention products: head dim 64 / 128).
const Product kProducts[] = {
    {"square 1024^3", 1024, 1024, 1024, false},         {"2048x2048x8192", 2048, 2048, 8192, false},
    {"2048x8192x2048", 2048, 8192, 2048, false},        {"110M wq/wk/wv/wo, 16 tok", 16, 768, 768, true},
    {"110M wq/wk/wv/wo, 128 tok", 128, 768, 768, true}, {"110M w1/w3, 128 tok", 128, 2048, 768, true},
    {"110M w2, 128 tok", 128, 768, 2048, true},         {"110M output, 128 tok", 128, 32000, 768, true},
    {"110M q.k^T, 128 tok", 128, 128, 64, true},        {"7B wq/wk/wv/wo, 512 tok", 512, 4096, 4096, true},
    {"7B w1/w3, 512 tok", 512, 11008, 4096, true},      {"7B w2, 512 tok", 512, 4096, 11008, true},
    {"7B q.k^T, 512 tok", 512, 512, 128, true},         {"7B p.v, 512 tok", 512, 128, 512, false},
};

using Gemm = std::function<void(const Product&, const float*, const float*, float*)>;

struct Library {
  std::string name;
  std::function<void(int)> set_threads;
  Gemm gemm;
};

// oneDNN's C GEMM (row-major) and its OpenMP thread count.
std::optional<Library> open_onednn() {
  // OpenMP threads would spin after each call and take the cores the next
  // library is timed on.
  setenv("OMP_WAIT_POLICY", "passive", 0);
  void* dnnl = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (dnnl == nullptr) return std::nullopt;
  using SgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(dnnl, "dnnl_sgemm"));
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
  auto set_omp = gomp != nullptr ? reinterpret_cast<void (*)(int)>(dlsym(gomp, "omp_set_num_threads")) : nullptr;
  if (sgemm == nullptr || set_omp == nullptr) return std::nullopt;
  return Library{"oneDNN", set_omp, [sgemm](const Product& p, const float* a, const float* b, float* c) {
                   sgemm('N', p.transpose_b ? 'T' : 'N', p.m, p.n, p.k, 1.0f, a, p.k, b, p.transpose_b ? p.k : p.n,
                         0.0f, c, p.n);
                 }};
}

// BLIS's typed API, which takes both strides of every matrix (so a
// transposed B is only its strides) and its own thread count.
std::optional<Library> open_blis() {
  void* blis = dlopen("/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4", RTLD_NOW | RTLD_LOCAL);
  if (blis == nullptr) return std::nullopt;
  using SgemmFn = void (*)(int, int, int64_t, int64_t, int64_t, const float*, const float*, int64_t, int64_t,
                           const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t);
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(blis, "bli_sgemm"));
  auto set_threads = reinterpret_cast<void (*)(int64_t)>(dlsym(blis, "bli_thread_set_num_threads"));
  auto arch_id = reinterpret_cast<int (*)()>(dlsym(blis, "bli_arch_query_id"));
  auto arch_name = reinterpret_cast<const char* (*)(int)>(dlsym(blis, "bli_arch_string"));
  if (sgemm == nullptr || set_threads == nullptr || arch_id == nullptr || arch_name == nullptr) return std::nullopt;
  constexpr int kNoTranspose = 0;
  return Library{std::string("BLIS ") + arch_name(arch_id()), [set_threads](int t) { set_threads(t); },
                 [sgemm](const Product& p, const float* a, const float* b, float* c) {
                   const float one = 1.0f, zero = 0.0f;
                   const int64_t b_row_stride = p.transpose_b ? 1 : p.n, b_col_stride = p.transpose_b ? p.k : 1;
                   sgemm(kNoTranspose, kNoTranspose, p.m, p.n, p.k, &one, a, p.k, 1, b, b_row_stride, b_col_stride,
                         &zero, c, p.n, 1);
                 }};
}

Library openblas() {
  return {sf::bench::openblas_kernels(), [](int t) { openblas_set_num_threads(t); },
          [](const Product& p, const float* a, const float* b, float* c) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, p.transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(p.m),
                        static_cast<int>(p.n), static_cast<int>(p.k), 1.0f, a, static_cast<int>(p.k), b,
                        static_cast<int>(p.transpose_b ? p.k : p.n), 0.0f, c, static_cast<int>(p.n));
          }};
}

Library shardflow_gemm() {
  return {"shardflow", [](int t) { sf::set_kernel_threads(t); },
          [](const Product& p, const float* a, const float* b, float* c) {
            sf::gemm_f32({.m = p.m, .n = p.n, .k = p.k, .transpose_b = p.transpose_b}, a, b, c);
          }};
}

double seconds_for(const Gemm& gemm, const Product& p, const float* a, const float* b, float* c) {
  const double flops = 2.0 * static_cast<double>(p.m * p.n * p.k);
  const int repeats = std::clamp(static_cast<int>(2e10 / flops), 1, 200);  // about 0.1-0.2 s per timing
  gemm(p, a, b, c);                                                        // warm up
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) gemm(p, a, b, c);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
}

double relative_difference(const std::vector<float>& x, const std::vector<float>& reference) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(x[i] - reference[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(reference[i])));
  }
  return worst / std::max(scale, 1e-30);
}

std::vector<float> random_floats(int64_t count, unsigned seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& v : values) v = normal(engine);
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  std::string only;  // --only TEXT: the products whose name contains TEXT
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::max(std::atoi(argv[i + 1]), 1);
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
  }
  const int max_threads = sf::kernel_threads();
  constexpr std::size_t kOurs = 0, kOpenBlas = 1;
  std::vector<Library> libraries = {shardflow_gemm(), openblas()};
  for (std::optional<Library> library : {open_onednn(), open_blis()}) {
    if (library) libraries.push_back(std::move(*library));
  }

  std::printf("GFLOPS, median of %d alternating rounds; 'ours/best': shardflow / the best other library\n", rounds);
  std::vector<int> thread_counts = {1};
  if (max_threads > 1) thread_counts.push_back(max_threads);
  for (int threads : thread_counts) {
    std::printf("\n%d thread(s)\n%-28s", threads, "product (m x n x k)");
    for (const Library& library : libraries) std::printf(" %16s", library.name.c_str());
    std::printf(" %10s %9s\n", "ours/best", "max diff");
    for (const Product& p : kProducts) {
      if (std::string(p.what).find(only) == std::string::npos) continue;
      const std::vector<float> a = random_floats(p.m * p.k, 1), b = random_floats(p.k * p.n, 2);
      std::vector<float> reference(static_cast<std::size_t>(p.m * p.n)), c(reference.size());
      libraries[kOurs].set_threads(threads);
      libraries[kOurs].gemm(p, a.data(), b.data(), reference.data());
      double difference = 0;
      std::vector<std::vector<double>> times(libraries.size());
      for (int round = 0; round < rounds; ++round) {
        for (std::size_t l = 0; l < libraries.size(); ++l) {
          libraries[l].set_threads(threads);
          times[l].push_back(seconds_for(libraries[l].gemm, p, a.data(), b.data(), c.data()));
          difference = std::max(difference, relative_difference(c, reference));
          if (l == kOpenBlas) {  // back to one thread; let its pool fall asleep before the next timing
            openblas_set_num_threads(1);
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        }
      }
      sf::set_kernel_threads(max_threads);
      const double flops = 2.0 * static_cast<double>(p.m * p.n * p.k);
      std::printf("%-28s", p.what);
      double best_other = 0, ours = 0;
      for (std::size_t l = 0; l < libraries.size(); ++l) {
        std::nth_element(times[l].begin(), times[l].begin() + rounds / 2, times[l].end());
        const double gflops = flops / times[l][static_cast<std::size_t>(rounds / 2)] / 1e9;
        if (l == kOurs) {
          ours = gflops;
        } else {
          best_other = std::max(best_other, gflops);
        }
        std::printf(" %16.1f", gflops);
      }
      std::printf(" %10.2f %9.1e\n", ours / best_other, difference);
      std::fflush(stdout);
    }
  }
  return 0;
}
