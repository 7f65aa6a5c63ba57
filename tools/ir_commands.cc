// `shardflow ir FILE` and `shardflow run FILE`.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_set>

#include "cli_util.h"
#include "commands.h"
#include "profile_report.h"
#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/ops.h"
#include "shardflow/trace/interpreter.h"
#include "shardflow/trace/ops.h"
#include "shardflow/partition/program.h"
#include "shardflow/propagation/propagation.h"
#include "shardflow/runtime/executor.h"
#include "shardflow/runtime/runtime.h"

namespace shardflow::cli {

// `run --check`: each element within this times (1 + the output's largest
// |expected|) of the one-device result. Sharded contractions add partial sums
// in another order, so the error scales with the magnitudes summed, which the
// output's scale bounds better than the element itself (a cancelling sum).
// For outputs computed through 16-bit values, a few units in the last place
// of the narrowest such format: a sum in another order may round the other
// way, and a later f32 op (a sum with dtype=f32) keeps that difference.
static double check_tolerance(const Value* output) {
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

static std::string read_file(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) throw Error(fmt::format("cannot read '{}': it is a directory", path));
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error(fmt::format("cannot read '{}'", path));
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

Graph load_graph(const std::string& path) {
  ops::register_all_ops();
  Graph graph = parse_graph(read_file(path));
  verify_graph(graph);
  return graph;
}

int run_ir_command(const IrOptions& options) {
  std::cout << print_graph(load_graph(options.file));
  return 0;
}

// Integer inputs used as indices must stay below the size they index; the
// smallest such size over all uses (16 when unused as an index).
static int64_t index_bound(const Graph& graph, const Value* input) {
  int64_t bound = 16;
  // The input and the values that carry its elements unchanged (annotations,
  // reshapes, slices, ...), which may be the ones used as indices.
  std::set<const Value*> carriers{input};
  for (const auto& node : graph.nodes()) {
    const OpArgs args = node->op_args();
    const std::vector<Value*> operands = node->inputs();
    const auto operand = [&](std::string_view name) -> const Value* {
      const int index = node->op().schema.argument_index(name) >= 0 ? args.tensor(name) : -1;
      return index >= 0 ? operands[static_cast<std::size_t>(index)] : nullptr;
    };
    const OpFamily family = node->op().family;
    if ((family == OpFamily::kMovement || family == OpFamily::kAnnotation) && !operands.empty() &&
        carriers.contains(operands[0])) {
      carriers.insert(node->outputs().begin(), node->outputs().end());
    }
    const std::string name = node->op().schema.qualified_name();
    const Value* indexed = nullptr;
    int64_t dim = 0;
    if (name == "aten::embedding" && carriers.contains(operand("indices"))) {
      indexed = operand("weight");
    } else if ((name == "aten::index_select" || name == "aten::index_copy" || name == "aten::gather") &&
               carriers.contains(operand("index"))) {
      indexed = operand("self");
      dim = wrap_dim(args.get_int("dim"), indexed->type().rank());
    }
    if (indexed != nullptr && indexed->type().rank() > 0) {
      bound = std::min(bound, std::max<int64_t>(indexed->type().shape[static_cast<std::size_t>(dim)], 1));
    }
  }
  return bound;
}

// Deterministic inputs: floats from randn(seed + i), integers in [0, bound).
static std::vector<DenseTensor> make_inputs(const Graph& graph, int64_t seed) {
  std::vector<DenseTensor> inputs;
  for (std::size_t i = 0; i < graph.inputs().size(); ++i) {
    const Value* input = graph.inputs()[i];
    const TensorType& type = input->type();
    const int64_t input_seed = seed * 1000003 + static_cast<int64_t>(i);
    Tensor value;
    if (is_floating(type.dtype)) {
      value = randn(type.shape, input_seed, type.dtype);
    } else if (type.dtype == DType::kBool) {
      value = lt(rand(type.shape, input_seed), Tensor::scalar(0.5));
    } else {
      const double bound = static_cast<double>(index_bound(graph, input));
      value = (rand(type.shape, input_seed) * bound).to(type.dtype);
    }
    inputs.push_back(value.value());
  }
  return inputs;
}

// The partitioned program of a graph, for the device count asked for (the
// size of the annotations' mesh; --devices must agree with it).
struct Partitioned {
  PropagationResult shardings;
  PartitionedProgram program;
};

static Partitioned partition_for(const Graph& graph, std::optional<int64_t> devices) {
  PropagationResult shardings = propagate_shardings(graph);
  const int64_t mesh_size = shardings.mesh()->size();
  if (devices && *devices != mesh_size) {
    throw Error(fmt::format("the graph's annotations use a mesh of {} device(s) ({}); run it with "
                            "--devices {} (got --devices {})", mesh_size, shardings.mesh()->to_string(),
                            mesh_size, *devices));
  }
  PartitionedProgram program = partition_graph(graph, shardings);
  return {std::move(shardings), std::move(program)};
}

static std::string axes_json_label(const Mesh& mesh, int axis) { return mesh.axis_label(axis); }

int run_partition_command(const PartitionOptions& options) {
  const Graph graph = load_graph(options.file);
  const Partitioned p = partition_for(graph, options.devices);
  const Mesh& mesh = *p.program.mesh;
  if (options.format == "json") {
    nlohmann::ordered_json values = nlohmann::ordered_json::object();
    const auto add = [&](const Value* value) {
      const Sharding& sharding = p.shardings.sharding(value);
      values["%" + value->name()] = {{"sharding", sharding.to_hlo_v1().to_string()},
                                     {"readable", sharding.to_readable(value->type().shape, dtype_name(value->type().dtype))}};
    };
    for (const Value* input : graph.inputs()) add(input);
    for (const auto& node : graph.nodes()) {
      for (const Value* output : node->outputs()) add(output);
    }
    nlohmann::ordered_json collectives = nlohmann::ordered_json::array();
    for (const CollectiveInfo& info : p.program.collectives) {
      std::vector<std::string> axes;
      for (int axis : info.axes) axes.push_back(axes_json_label(mesh, axis));
      collectives.push_back({{"kind", std::string(to_string(info.kind))},
                             {"axes", axes},
                             {"bytes_per_device", info.bytes_per_device},
                             {"value", "%" + info.value->name()},
                             {"reason", info.reason}});
    }
    std::cout << nlohmann::ordered_json{{"values", values}, {"collectives", collectives}, {"warnings", p.program.warnings}}.dump()
              << "\n";
    return 0;
  }
  std::cout << print_with_shardings(graph, p.shardings) << "\n" << p.program.to_string(graph) << "\n";
  std::map<std::string, std::pair<int, int64_t>> totals;
  for (const CollectiveInfo& info : p.program.collectives) {
    std::cout << info.describe(mesh) << "\n";
    auto& [count, bytes] = totals[std::string(to_string(info.kind))];
    ++count;
    bytes += info.bytes_per_device;
  }
  std::cout << fmt::format("\n{} collective(s)", p.program.collectives.size());
  for (const auto& [kind, total] : totals) {
    std::cout << fmt::format("; {} {} ({} bytes/device)", total.first, kind, total.second);
  }
  std::cout << "\n";
  for (const std::string& warning : p.program.warnings) std::cout << "warning: " << warning << "\n";
  return 0;
}

int run_run_command(const RunOptions& options) {
  const Graph graph = load_graph(options.file);
  const Partitioned p = partition_for(graph, options.devices);
  const std::vector<DenseTensor> input_values = make_inputs(graph, options.seed);
  std::vector<Tensor> inputs;
  for (const DenseTensor& value : input_values) inputs.emplace_back(value);
  std::vector<Tensor> outputs;
  std::optional<Runtime> local;
  Runtime* runtime = mpi_runtime();
  check_mpi_ranks(p.program.mesh->size(), "the graph's mesh " + p.program.mesh->to_string());
  if (runtime == nullptr) runtime = &local.emplace(Runtime::local(p.program.mesh->size()));
  const auto profile = options.profile ? std::make_shared<OpProfile>() : nullptr;
  const auto started = std::chrono::steady_clock::now();
  outputs = run_program(p.program, *runtime, inputs, profile.get());
  if (profile) profile->add_function_call(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  const std::optional<ProfileReport> report = report_of(profile);
  std::optional<std::vector<DenseTensor>> reference;
  if (options.check) reference = run_graph(graph, input_values);
  nlohmann::ordered_json json_outputs = nlohmann::ordered_json::array();
  double max_abs = 0, max_rel = 0;
  // The element furthest over its output's tolerance, for the error line
  // (ratio 0: every element within).
  struct Excess {
    double ratio = 0, got = 0, expected = 0, diff = 0, allowed = 0, tolerance = 0;
    std::size_t output = 0, element = 0;
  } worst;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& output = outputs[i];
    const std::vector<float> values = output.to_floats();
    double sum = 0;
    for (float v : values) sum += v;
    std::vector<double> head;
    for (std::size_t k = 0; k < values.size() && k < 8; ++k) head.push_back(values[k]);
    if (reference) {
      const std::vector<float> expected = Tensor((*reference)[i]).to_floats();
      const double tolerance = check_tolerance(graph.outputs()[i]);
      // Finite values only: an infinity in the reference would make every
      // difference of the output tolerable.
      double scale = 0;
      for (float e : expected) {
        if (std::isfinite(e)) scale = std::max(scale, std::abs(static_cast<double>(e)));
      }
      for (std::size_t k = 0; k < values.size(); ++k) {
        const bool both_nan = std::isnan(values[k]) && std::isnan(expected[k]);
        double diff = std::abs(static_cast<double>(values[k]) - expected[k]);
        if (both_nan || values[k] == expected[k]) diff = 0;  // equal infinities too
        if (std::isnan(diff)) diff = std::numeric_limits<double>::infinity();
        max_abs = std::max(max_abs, diff);
        max_rel = std::max(max_rel, std::isinf(diff) ? diff : diff / std::max(std::abs(static_cast<double>(expected[k])), 1e-6));
        const double allowed = tolerance * (1 + scale);
        if (diff > allowed && diff / allowed > worst.ratio) {
          worst = {diff / allowed, values[k], expected[k], diff, allowed, tolerance, i, k};
        }
      }
    }
    if (options.format == "json") {
      json_outputs.push_back({{"shape", output.shape()},
                              {"dtype", std::string(dtype_name(output.dtype()))},
                              {"sum", sum},
                              {"values_head", head}});
    } else {
      std::cout << fmt::format("output {} (%{}): {}{}  sum {:.6g}  values [{:.6g}]{}\n", i,
                               graph.outputs()[i]->name(), dtype_name(output.dtype()),
                               shape_to_string(output.shape()), sum, fmt::join(head, ", "),
                               values.size() > head.size() ? " ..." : "");
    }
  }
  const bool within = worst.ratio == 0;
  if (options.format == "json") {
    nlohmann::ordered_json out{{"outputs", json_outputs}};
    if (reference) {
      out["max_abs_diff"] = max_abs;
      out["max_rel_diff"] = max_rel;
    }
    if (report) out["profile"] = profile_json(*report);
    std::cout << out.dump() << "\n";
  } else if (reference) {
    std::cout << fmt::format("check against one device: max abs diff {:.3g}, max rel diff {:.3g} ({})\n", max_abs,
                             max_rel, within ? "within tolerance" : "OUT OF TOLERANCE");
  }
  if (report && options.format != "json") std::cout << profile_text("run", *report);
  if (reference && !within) {
    std::cerr << fmt::format("error: output {} (%{}) of the {}-device result differs from the one-device result: "
                             "element {} is {:.6g}, expected {:.6g} (difference {:.3g}, allowed {:.3g} = {:g} times 1 + "
                             "max finite |expected|; the tolerance is 1e-4, 4e-3 through f16 and 2e-2 through bf16 "
                             "values)\n",
                             worst.output, graph.outputs()[worst.output]->name(), p.program.mesh->size(), worst.element,
                             worst.got, worst.expected, worst.diff, worst.allowed, worst.tolerance);
    return 1;
  }
  return 0;
}

}  // namespace shardflow::cli
