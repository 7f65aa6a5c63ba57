// `shardflow ir FILE` and `shardflow run FILE`.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_util.h"
#include "commands.h"
#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/ops.h"
#include "shardflow/trace/interpreter.h"
#include "shardflow/trace/ops.h"

namespace shardflow::cli {

static std::string read_file(const std::string& path) {
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
  for (const auto& node : graph.nodes()) {
    const OpArgs args = node->op_args();
    const std::vector<Value*> operands = node->inputs();
    const auto operand = [&](std::string_view name) -> const Value* {
      const int index = node->op().schema.argument_index(name) >= 0 ? args.tensor(name) : -1;
      return index >= 0 ? operands[static_cast<std::size_t>(index)] : nullptr;
    };
    const std::string name = node->op().schema.qualified_name();
    const Value* indexed = nullptr;
    int64_t dim = 0;
    if (name == "aten::embedding" && operand("indices") == input) {
      indexed = operand("weight");
    } else if ((name == "aten::index_select" || name == "aten::index_copy" || name == "aten::gather") &&
               operand("index") == input) {
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

int run_run_command(const RunOptions& options) {
  if (options.devices != 1) {
    throw Error(fmt::format("--devices {}: this build runs graphs on one device; the SPMD runtime "
                            "that partitions them over several devices is not there yet", options.devices));
  }
  const Graph graph = load_graph(options.file);
  const std::vector<DenseTensor> outputs = run_graph(graph, make_inputs(graph, options.seed));
  nlohmann::ordered_json json_outputs = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor output(outputs[i]);
    const std::vector<float> values = output.to_floats();
    double sum = 0;
    for (float v : values) sum += v;
    std::vector<double> head;
    for (std::size_t k = 0; k < values.size() && k < 8; ++k) head.push_back(values[k]);
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
  if (options.format == "json") std::cout << nlohmann::ordered_json{{"outputs", json_outputs}}.dump() << "\n";
  return 0;
}

}  // namespace shardflow::cli
