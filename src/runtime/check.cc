#include "shardflow/runtime/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "shardflow/base/error.h"
#include "shardflow/ir/op_def.h"
#include "shardflow/trace/ops.h"
#include "shardflow/trace/tensor.h"

namespace shardflow {

// Sharded contractions add partial sums in another order, so the error scales
// with the magnitudes summed, which the output's scale bounds better than the
// element itself (a cancelling sum). For outputs computed through 16-bit
// values, a few units in the last place of the narrowest such format: a sum
// in another order may round the other way, and a later f32 op (a sum with
// dtype=f32) keeps that difference.
double check_tolerance(const Value* output) {
  bool bf16 = false, f16 = false;
  std::vector<const Value*> pending{output};
  std::unordered_set<const Value*> seen{output};
  while (!pending.empty()) {
    const Value* value = pending.back();
    pending.pop_back();
    bf16 = bf16 || value->type().dtype == DType::kBF16;
    f16 = f16 || value->type().dtype == DType::kF16;
    if (value->producer() == nullptr) continue;
    for (const Value* input : value->producer()->inputs()) {
      if (seen.insert(input).second) pending.push_back(input);
    }
  }
  return bf16 ? 2e-2 : f16 ? 4e-3 : 1e-4;
}

CheckResult compare_with_reference(const Graph& graph, std::span<const std::vector<float>> outputs,
                                   std::span<const std::vector<float>> reference) {
  if (outputs.size() != graph.outputs().size() || reference.size() != outputs.size()) {
    throw Error(
        fmt::format("compare_with_reference: the graph has {} output(s) but {} result(s) and {} "
                    "reference(s) were given",
                    graph.outputs().size(), outputs.size(), reference.size()));
  }
  CheckResult result;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const std::vector<float>& values = outputs[i];
    const std::vector<float>& expected = reference[i];
    if (values.size() != expected.size()) {
      throw Error(fmt::format("output {} has {} elements but the reference has {}", i, values.size(), expected.size()));
    }
    const double tolerance = check_tolerance(graph.outputs()[i]);
    // Finite values only: an infinity in the reference would make every
    // difference of the output tolerable.
    double scale = 0;
    for (float e : expected) {
      if (std::isfinite(e)) scale = std::max(scale, std::abs(static_cast<double>(e)));
    }
    const double allowed = tolerance * (1 + scale);
    for (std::size_t k = 0; k < values.size(); ++k) {
      const bool both_nan = std::isnan(values[k]) && std::isnan(expected[k]);
      double diff = std::abs(static_cast<double>(values[k]) - expected[k]);
      if (both_nan || values[k] == expected[k]) diff = 0;  // equal infinities too
      if (std::isnan(diff)) diff = std::numeric_limits<double>::infinity();
      result.max_abs_diff = std::max(result.max_abs_diff, diff);
      result.max_rel_diff =
          std::max(result.max_rel_diff,
                   std::isinf(diff) ? diff : diff / std::max(std::abs(static_cast<double>(expected[k])), 1e-6));
      if (diff > allowed && diff / allowed > result.worst.ratio) {
        result.worst = {diff / allowed, values[k], expected[k], diff, allowed, tolerance, i, k};
      }
    }
  }
  return result;
}

std::string CheckResult::error_message(const Graph& graph, int64_t devices) const {
  if (within()) return {};
  return fmt::format(
      "output {} (%{}) of the {}-device result differs from the one-device result: element {} is "
      "{:.6g}, expected {:.6g} (difference {:.3g}, allowed {:.3g} = {:g} times 1 + max finite "
      "|expected|; the tolerance is 1e-4, 4e-3 through f16 and 2e-2 through bf16 values)",
      worst.output, graph.outputs()[worst.output]->name(), devices, worst.element, worst.got, worst.expected,
      worst.diff, worst.allowed, worst.tolerance);
}

// Integer inputs used as indices must stay below the size they index: per
// input, the smallest such size over all uses (16 when unused as an index).
// One pass: each value that carries an input's elements unchanged (the input
// itself, annotations and views of it) maps to that input.
static std::unordered_map<const Value*, int64_t> index_bounds(const Graph& graph) {
  std::unordered_map<const Value*, const Value*> carried;
  std::unordered_map<const Value*, int64_t> bounds;
  for (const Value* input : graph.inputs()) {
    if (is_floating(input->type().dtype) || input->type().dtype == DType::kBool) continue;
    carried[input] = input;
    bounds[input] = 16;
  }
  const auto input_carried_by = [&](const Value* value) -> const Value* {
    const auto it = value == nullptr ? carried.end() : carried.find(value);
    return it == carried.end() ? nullptr : it->second;
  };
  for (const auto& node : graph.nodes()) {
    const std::vector<Value*> operands = node->inputs();
    const OpFamily family = node->op().family;
    if ((family == OpFamily::kMovement || family == OpFamily::kAnnotation) && !operands.empty()) {
      if (const Value* input = input_carried_by(operands[0])) {
        for (const Value* output : node->outputs()) carried[output] = input;
      }
    }
    const OpArgs args = node->op_args();
    const auto operand = [&](std::string_view name) -> const Value* {
      const int index = node->op().schema.argument_index(name) >= 0 ? args.tensor(name) : -1;
      return index >= 0 ? operands[static_cast<std::size_t>(index)] : nullptr;
    };
    const std::string name = node->op().schema.qualified_name();
    const Value* input = nullptr;
    const Value* indexed = nullptr;
    int64_t dim = 0;
    if (name == "aten::embedding") {
      input = input_carried_by(operand("indices"));
      indexed = operand("weight");
    } else if (name == "aten::index_select" || name == "aten::index_copy" || name == "aten::gather") {
      input = input_carried_by(operand("index"));
      indexed = operand("self");
      if (input != nullptr) dim = wrap_dim(args.get_int("dim"), indexed->type().rank());
    }
    if (input != nullptr && indexed->type().rank() > 0) {
      int64_t& bound = bounds[input];
      bound = std::min(bound, std::max<int64_t>(indexed->type().shape[static_cast<std::size_t>(dim)], 1));
    }
  }
  return bounds;
}

std::vector<DenseTensor> random_inputs(const Graph& graph, int64_t seed) {
  const std::unordered_map<const Value*, int64_t> bounds = index_bounds(graph);
  std::vector<DenseTensor> inputs;
  for (std::size_t i = 0; i < graph.inputs().size(); ++i) {
    const Value* input = graph.inputs()[i];
    const TensorType& type = input->type();
    // Wraps around instead of overflowing for seeds near the int64 limits.
    const auto input_seed = static_cast<int64_t>(static_cast<uint64_t>(seed) * 1000003u + i);
    Tensor value;
    if (is_floating(type.dtype)) {
      value = randn(type.shape, input_seed, type.dtype);
    } else if (type.dtype == DType::kBool) {
      value = lt(rand(type.shape, input_seed), Tensor::scalar(0.5));
    } else {
      const double bound = static_cast<double>(bounds.at(input));
      value = (rand(type.shape, input_seed) * bound).to(type.dtype);
    }
    inputs.push_back(value.value());
  }
  return inputs;
}

}  // namespace shardflow
