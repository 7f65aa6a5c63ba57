// A partitioned run checked against one device (`shardflow run --check`,
// `shardflow.run(..., check=True)`), and the deterministic inputs such runs
// are fed with.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shardflow/ir/graph.h"
#include "shardflow/tensor/dense_tensor.h"

namespace shardflow {

// Each element of an output may differ from the one-device result by this
// times (1 + the output's largest finite |expected|): 1e-4, or 4e-3 / 2e-2
// when the output is computed through f16 / bf16 values.
double check_tolerance(const Value* output);

struct CheckResult {
  double max_abs_diff = 0;  // infinite where NaN or infinities differ
  double max_rel_diff = 0;
  // The element furthest over its output's tolerance; ratio 0: every element
  // of every output is within.
  struct Excess {
    double ratio = 0, got = 0, expected = 0, diff = 0, allowed = 0, tolerance = 0;
    std::size_t output = 0, element = 0;
  } worst;
  bool within() const { return worst.ratio == 0; }
  // "output 0 (%3) of the 8-device result differs from the one-device
  // result: element 5 is ..., expected ..." (empty when within).
  std::string error_message(const Graph& graph, int64_t devices) const;
};

// Compares `outputs` (one per graph output, any dtype) with `reference`
// element by element; infinities and NaN must match exactly.
CheckResult compare_with_reference(const Graph& graph, std::span<const std::vector<float>> outputs,
                                   std::span<const std::vector<float>> reference);

// Deterministic inputs for a graph: floats from randn(seed * 1000003 + i),
// bools from rand < 0.5, integers in [0, bound) where bound is the smallest
// size any op indexes with them (through annotations and views; 16 if none).
std::vector<DenseTensor> random_inputs(const Graph& graph, int64_t seed);

}  // namespace shardflow
