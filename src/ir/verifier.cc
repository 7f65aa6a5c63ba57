// The IR verifier: schema conformance and re-inferred types.
#include <fmt/format.h>

#include <unordered_set>

#include "shardflow/base/error.h"
#include "shardflow/ir/binding.h"
#include "shardflow/ir/text.h"

namespace shardflow {

void verify_graph(const Graph& graph) {
  std::unordered_set<const Value*> defined(graph.inputs().begin(), graph.inputs().end());
  for (const auto& node_ptr : graph.nodes()) {
    const Node& node = *node_ptr;
    // "'%z = aten::matmul(%y, %x) : f32[4,8]' at line 3" (the line when parsed)
    const auto where = [&] {
      const std::string line = node.source_line() > 0 ? fmt::format(" at line {}", node.source_line()) : "";
      return fmt::format("'{}'{}", print_node(node), line);
    };
    const auto& params = node.op().schema.arguments();
    if (node.args().size() != params.size()) {
      throw Error(
          fmt::format("invalid node {}: {} arguments for {} schema slots", where(), node.args().size(), params.size()));
    }
    // Re-bind the arguments: every slot given, positionally.
    std::vector<CallArg> call_args;
    std::vector<TensorType> input_types;
    for (std::size_t slot = 0; slot < node.args().size(); ++slot) {
      const NodeArg& arg = node.args()[slot];
      // Keyword-only slots are passed by name, the others by position.
      const std::string keyword = params[slot].keyword_only ? params[slot].name : std::string();
      if (arg.is_constant()) {
        call_args.push_back(CallArg::constant_arg(arg.constant(), keyword));
        continue;
      }
      std::vector<Value*> values;
      if (auto* value = std::get_if<Value*>(&arg.value))
        values = {*value};
      else
        values = std::get<std::vector<Value*>>(arg.value);
      std::vector<int> indices;
      for (Value* value : values) {
        if (!defined.contains(value)) {
          throw Error(fmt::format("invalid node {}: %{} is used before it is defined", where(), value->name()));
        }
        indices.push_back(static_cast<int>(input_types.size()));
        input_types.push_back(value->type());
      }
      call_args.push_back(std::holds_alternative<Value*>(arg.value)
                              ? CallArg::tensor_arg(indices[0], keyword)
                              : CallArg::tensor_list_arg(std::move(indices), keyword));
    }
    OpArgs args = [&] {
      try {
        return bind_arguments(node.op(), call_args, input_types);
      } catch (const Error& error) {
        throw Error(fmt::format("invalid node {}: {}", where(), error.what()));
      }
    }();
    std::vector<TensorType> inferred;
    try {
      inferred = node.op().infer(args, input_types);
    } catch (const Error& error) {
      throw Error(fmt::format("invalid node {}: {}", where(), error.what()));
    }
    if (inferred.size() != node.outputs().size()) {
      throw Error(fmt::format("invalid node {}: the op returns {} value(s), the node has {}", where(), inferred.size(),
                              node.outputs().size()));
    }
    for (std::size_t i = 0; i < inferred.size(); ++i) {
      if (inferred[i] != node.outputs()[i]->type()) {
        throw Error(fmt::format("invalid node {}: %{} is declared {} but {} infers {}", where(),
                                node.outputs()[i]->name(), node.outputs()[i]->type().to_string(), node.op().full_name(),
                                inferred[i].to_string()));
      }
      defined.insert(node.outputs()[i]);
    }
  }
  for (const Value* output : graph.outputs()) {
    if (!defined.contains(output)) {
      throw Error(fmt::format("the graph returns %{}, which no node defines", output->name()));
    }
  }
}

}  // namespace shardflow
