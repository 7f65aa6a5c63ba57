// Single-precision GEMM: C = A · B (row-major, with optional transposes).
// OpenBLAS multiplies matrices, on blocks split over the kernel threads; a
// few rows of A (decode steps: up to 8 against a weight stored out x in, 2
// otherwise) go to our own matrix-vector kernels, which stream B once at
// close to memory bandwidth. Keeping the BLAS header out of this file keeps
// it cheap to include.
#pragma once

#include <cstdint>
#include <string>

namespace shardflow {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false;  // A is stored k x m
  bool transpose_b = false;  // B is stored n x k
};

// c[m x n] = a · b (+ c when accumulate). Leading dims are the row lengths of
// the stored matrices.
void gemm_f32(const GemmShape& shape, const float* a, const float* b, float* c, bool accumulate = false);

// The threads one kernel call may use, our own pool's: GEMMs are cut into
// fixed blocks of single-threaded OpenBLAS calls shared out over them, and
// the matrix-vector and attention kernels split the same way, so every
// kernel gives the same bits for any count. OpenBLAS itself is kept at one
// thread: its pool spun after each call and took cores from ours. The count
// starts at OPENBLAS_NUM_THREADS, else the number of cores. Process-wide; an
// in-process multi-device runtime sets it to 1 while it exists (its device
// threads are the parallelism), an MPI runtime to the host's cores divided
// by its ranks there.
void set_kernel_threads(int threads);
int kernel_threads();

// How many kernel calls so far were split over more than one thread.
int64_t parallel_kernel_calls();

// Whether OpenBLAS runs kernels as wide as the CPU's vector units. Its
// DYNAMIC_ARCH picks a kernel set by CPU model number, and a model it does
// not know gets its Prescott (SSE3) kernels: a fifth of the speed on an
// AVX-512 Xeon. It reads OPENBLAS_CORETYPE only when it loads, so the fix
// is that variable in the environment of a new process.
struct BlasKernelCheck {
  std::string corename;     // openblas_get_corename(): "Cooperlake", "Prescott", ...
  std::string cpu_isa;      // the widest the CPU has: "AVX-512", "AVX2", "AVX", "SSE"
  std::string better_core;  // an OPENBLAS_CORETYPE for this CPU, when the kernels are narrower; else empty
};
BlasKernelCheck check_blas_kernels();
// The same decision for a given core name and CPU level (0 SSE, 1 AVX,
// 2 AVX2+FMA, 3 AVX-512): the core to ask for, or "" when `corename`
// already matches (or is one this check does not know).
std::string better_blas_core(const std::string& corename, int cpu_level);

}  // namespace shardflow
