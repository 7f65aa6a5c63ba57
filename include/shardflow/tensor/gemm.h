// Single-precision GEMM: C = A · B (row-major, with optional transposes).
// oneDNN multiplies matrices, on blocks split over the kernel threads: it
// picks its kernels by the instruction sets the CPU has (README: "Matrix
// kernels" has the measurements behind the choice). A few rows of A (decode
// steps: up to 8 against a weight stored out x in, 2 otherwise) go to our
// own matrix-vector kernels, which stream B once at close to memory
// bandwidth. Keeping oneDNN's header out of this file keeps it cheap to
// include.
#pragma once

#include <cstdint>
#include <string>

#include "shardflow/tensor/dtype.h"

namespace shardflow {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false;  // A is stored k x m
  bool transpose_b = false;  // B is stored n x k
};

// c[m x n] = a · b (+ c when accumulate). Leading dims are the row lengths of
// the stored matrices.
void gemm_f32(const GemmShape& shape, const float* a, const float* b, float* c, bool accumulate = false);

// The same with b of 16-bit floats (a 16-bit model's weights): computed in
// float, with gemm_f32's bits on b converted to float. The few rows of a
// decode step read b as it is stored, widened in registers (half the bytes
// of float weights); other shapes convert b to float first.
void gemm_f32(const GemmShape& shape, const float* a, const BFloat16* b, float* c, bool accumulate = false);
void gemm_f32(const GemmShape& shape, const float* a, const Float16* b, float* c, bool accumulate = false);

// The threads one kernel call may use, our own pool's: GEMMs are cut into
// fixed blocks of single-threaded oneDNN calls shared out over them, and
// the matrix-vector and attention kernels split the same way, so every
// kernel gives the same bits for any count. The count starts at
// OMP_NUM_THREADS, else OPENBLAS_NUM_THREADS, else the number of cores this
// process may run on. Process-wide; an
// in-process multi-device runtime sets it to 1 while it exists (its device
// threads are the parallelism), an MPI runtime to the host's cores divided
// by its ranks there.
void set_kernel_threads(int threads);
int kernel_threads();

// Sets kernel_threads() for a scope, then restores what it was.
class ScopedKernelThreads {
 public:
  explicit ScopedKernelThreads(int threads) : previous_(kernel_threads()) { set_kernel_threads(threads); }
  ~ScopedKernelThreads() { set_kernel_threads(previous_); }
  ScopedKernelThreads(const ScopedKernelThreads&) = delete;
  ScopedKernelThreads& operator=(const ScopedKernelThreads&) = delete;

 private:
  int previous_;
};

// How a decode step's one row of activations reads the weights: as three
// far-apart runs the core's own prefetchers follow, or as four runs
// prefetched ahead in software, long rows in tiles. kByCpu (the default)
// takes what measured fastest on the CPU's kind (README: "Decode kernels"):
// four on Intel with AVX-512, three elsewhere. With three, AVX-512 builds
// read short rows against two rows of activations in three runs too; with
// four, a weight row at a time. Every way gives the same bits.
enum class SingleRowReading { kByCpu, kThreeRuns, kFourPrefetchedRuns };
void set_single_row_reading(SingleRowReading reading);

// How many kernel calls so far were split over more than one thread.
int64_t parallel_kernel_calls();

// Whether oneDNN runs kernels as wide as the CPU's vector units. It picks
// them by the instruction sets the CPU reports, so only ONEDNN_MAX_CPU_ISA
// (or DNNL_MAX_CPU_ISA) in the environment makes them narrower.
struct MatrixKernelCheck {
  std::string kernel_isa;  // the widest oneDNN's kernels use: "AVX-512", "AVX2", "AVX", "SSE"
  std::string cpu_isa;     // the widest the CPU has, in the same terms
  std::string note;        // empty when the kernels are as wide as the CPU; else what is wrong and what to do
};
MatrixKernelCheck check_matrix_kernels();

}  // namespace shardflow
