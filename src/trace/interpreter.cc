#include "shardflow/trace/interpreter.h"

#include <fmt/format.h>

#include <unordered_map>

#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"

namespace shardflow {

std::vector<DenseTensor> run_graph(const Graph& graph, std::span<const DenseTensor> inputs) {
  if (inputs.size() != graph.inputs().size()) {
    throw Error(fmt::format("graph @{} takes {} inputs, got {}", graph.name(), graph.inputs().size(),
                            inputs.size()));
  }
  // Index of the last node that reads each value (outputs are kept).
  std::unordered_map<const Value*, std::size_t> last_use;
  for (std::size_t n = 0; n < graph.nodes().size(); ++n) {
    for (const Value* input : graph.nodes()[n]->inputs()) last_use[input] = n;
  }
  for (const Value* output : graph.outputs()) last_use[output] = graph.nodes().size();

  std::unordered_map<const Value*, DenseTensor> values;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const TensorType expected = graph.inputs()[i]->type();
    if (inputs[i].dtype() != expected.dtype || inputs[i].shape() != expected.shape) {
      throw Error(fmt::format("input %{} of graph @{} is {} but got {}{}", graph.inputs()[i]->name(),
                              graph.name(), expected.to_string(), dtype_name(inputs[i].dtype()),
                              shape_to_string(inputs[i].shape())));
    }
    values[graph.inputs()[i]] = inputs[i];
  }
  for (std::size_t n = 0; n < graph.nodes().size(); ++n) {
    const Node& node = *graph.nodes()[n];
    std::vector<DenseTensor> operands;
    for (const Value* input : node.inputs()) operands.push_back(values.at(input));
    std::vector<DenseTensor> results;
    try {
      results = node.op().kernel(node.op_args(), operands);
    } catch (const Error& error) {
      throw Error(fmt::format("{}: {}", print_node(node), error.what()));
    }
    for (std::size_t i = 0; i < results.size(); ++i) values[node.outputs()[i]] = std::move(results[i]);
    for (const Value* input : node.inputs()) {
      if (last_use.at(input) == n) values.erase(input);
    }
  }
  std::vector<DenseTensor> outputs;
  for (const Value* output : graph.outputs()) outputs.push_back(values.at(output));
  return outputs;
}

}  // namespace shardflow
