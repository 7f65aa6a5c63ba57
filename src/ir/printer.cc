#include <fmt/format.h>

#include <functional>

#include "shardflow/ir/text.h"

namespace shardflow {

static std::string arg_text(const NodeArg& arg) {
  if (arg.is_constant()) return arg.constant().to_string();
  if (auto* value = std::get_if<Value*>(&arg.value)) return "%" + (*value)->name();
  std::string out = "[";
  const auto& list = std::get<std::vector<Value*>>(arg.value);
  for (std::size_t i = 0; i < list.size(); ++i) out += (i > 0 ? ", %" : "%") + list[i]->name();
  return out + "]";
}

static bool is_default(const SchemaArgument& param, const Constant* value) {
  if (!param.default_value || value == nullptr) return false;
  const Constant& default_value = *param.default_value;
  if (*value == default_value) return true;
  // Identifier defaults (contiguous_format, ...) bind as None.
  if (default_value.kind() == Constant::Kind::kString && param.type.kind != SchemaType::Kind::kStr) {
    return value->is_none();
  }
  if (default_value.kind() == Constant::Kind::kInt && value->kind() == Constant::Kind::kFloat) {
    return static_cast<double>(default_value.as_int()) == value->as_float();
  }
  return false;
}

std::string print_arguments(const FunctionSchema& schema, const std::function<std::string(std::size_t)>& text_of,
                            const std::function<const Constant*(std::size_t)>& constant_of) {
  const auto& params = schema.arguments();
  std::size_t last_positional = 0;  // one past the last positional argument to print
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].keyword_only && !is_default(params[i], constant_of(i))) last_positional = i + 1;
  }
  std::string out;
  bool first = true;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const bool keyword = params[i].keyword_only;
    if (keyword ? is_default(params[i], constant_of(i)) : i >= last_positional) continue;
    out += first ? "" : ", ";
    first = false;
    if (keyword) out += params[i].name + "=";
    out += text_of(i);
  }
  return out;
}

std::string print_node(const Node& node) {
  const auto& args = node.args();
  std::string out;
  for (std::size_t i = 0; i < node.outputs().size(); ++i) {
    out += (i > 0 ? ", %" : "%") + node.outputs()[i]->name();
  }
  out += (node.outputs().empty() ? "" : " = ") + node.op().full_name() + "(";
  out += print_arguments(
      node.op().schema, [&](std::size_t i) { return arg_text(args[i]); },
      [&](std::size_t i) { return args[i].is_constant() ? &args[i].constant() : nullptr; });
  out += ")";
  if (node.outputs().size() == 1) {
    out += " : " + node.outputs()[0]->type().to_string();
  } else if (node.outputs().size() > 1) {
    out += " : (";
    for (std::size_t i = 0; i < node.outputs().size(); ++i) {
      out += (i > 0 ? ", " : "") + node.outputs()[i]->type().to_string();
    }
    out += ")";
  }
  return out;
}

std::string print_graph(const Graph& graph, const PrintOptions& options) {
  const auto annotation = [&](const Value& value) {
    if (!options.annotate_value) return std::string();
    std::string text = options.annotate_value(value);
    return text.empty() ? text : "  # " + text;
  };
  std::string out = "func @" + graph.name() + "(";
  for (std::size_t i = 0; i < graph.inputs().size(); ++i) {
    const Value& input = *graph.inputs()[i];
    out += fmt::format("{}%{}: {}", i > 0 ? ", " : "", input.name(), input.type().to_string());
  }
  out += ") -> (";
  for (std::size_t i = 0; i < graph.outputs().size(); ++i) {
    out += (i > 0 ? ", " : "") + graph.outputs()[i]->type().to_string();
  }
  out += ") {\n";
  if (options.annotate_value) {
    for (const Value* input : graph.inputs()) {
      const std::string text = options.annotate_value(*input);
      if (!text.empty()) out += "  # %" + input->name() + ": " + text + "\n";
    }
  }
  for (const auto& node : graph.nodes()) {
    out += "  " + print_node(*node);
    if (node->outputs().size() == 1) out += annotation(*node->output());
    out += "\n";
  }
  out += "  return";
  for (std::size_t i = 0; i < graph.outputs().size(); ++i) {
    out += (i > 0 ? ", %" : " %") + graph.outputs()[i]->name();
  }
  return out + "\n}\n";
}

}  // namespace shardflow
