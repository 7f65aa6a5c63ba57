// Which kernels OpenBLAS runs, for benches that compare with it. It picks
// them by CPU model number when it loads, and on a model it does not know
// falls back to SSE ones (Prescott on the Intel Xeon of family 6 model 207,
// a fifth of its AVX-512 speed there): a ratio against it then measures a
// slowed library. OPENBLAS_CORETYPE, set before it loads, chooses them.
#pragma once

#include <cblas.h>

#include <cstdio>
#include <string>
#include <string_view>

namespace shardflow::bench {

// OpenBLAS's kernel sets that use no AVX.
inline bool openblas_core_is_sse_only(std::string_view core) {
  for (std::string_view name : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai", "Coppermine",
                                "Northwood", "Banias", "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat"}) {
    if (core == name) return true;
  }
  return false;
}

// "OpenBLAS <kernels>"; the first call says on stderr when they are SSE
// ones on a CPU with AVX2, and what to set instead.
inline std::string openblas_kernels() {
  const std::string core = openblas_get_corename();
  static const bool warned = [&core] {
    if (!openblas_core_is_sse_only(core) || !__builtin_cpu_supports("avx2")) return false;
    const bool avx512 = __builtin_cpu_supports("avx512f");
    std::fprintf(stderr,
                 "warning: OpenBLAS runs its %s (SSE) kernels on this CPU, which has %s: ratios against it compare "
                 "with a slowed library. Run with OPENBLAS_CORETYPE=%s for its %s kernels.\n",
                 core.c_str(), avx512 ? "AVX-512" : "AVX2", avx512 ? "SkylakeX" : "Haswell",
                 avx512 ? "AVX-512" : "AVX2");
    return true;
  }();
  static_cast<void>(warned);
  return "OpenBLAS " + core;
}

}  // namespace shardflow::bench
