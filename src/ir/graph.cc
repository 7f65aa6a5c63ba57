#include "shardflow/ir/graph.h"

#include <fmt/format.h>

#include "shardflow/base/error.h"

namespace shardflow {

int64_t TensorType::nbytes() const {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel(shape), static_cast<int64_t>(element_size(dtype)), &bytes)) {
    throw Error(fmt::format("{} holds 2^63 bytes or more", to_string()));
  }
  return bytes;
}

std::string TensorType::to_string() const { return std::string(dtype_name(dtype)) + shape_to_string(shape); }

std::vector<NodeArg> node_args_of(const OpArgs& bound, std::span<Value* const> tensors) {
  std::vector<NodeArg> args;
  for (const BoundArg& b : bound.all()) {
    NodeArg arg;
    if (b.kind == BoundArg::Kind::kConstant) {
      arg.value = b.constant;
    } else if (b.kind == BoundArg::Kind::kTensor) {
      arg.value = tensors[static_cast<std::size_t>(b.tensors[0])];
    } else {
      std::vector<Value*> list;
      for (int index : b.tensors) list.push_back(tensors[static_cast<std::size_t>(index)]);
      arg.value = std::move(list);
    }
    args.push_back(std::move(arg));
  }
  return args;
}

std::vector<Value*> Node::inputs() const {
  std::vector<Value*> result;
  for (const NodeArg& arg : args_) {
    if (auto* value = std::get_if<Value*>(&arg.value)) result.push_back(*value);
    if (auto* list = std::get_if<std::vector<Value*>>(&arg.value)) {
      result.insert(result.end(), list->begin(), list->end());
    }
  }
  return result;
}

OpArgs Node::op_args() const {
  std::vector<BoundArg> bound;
  int next_tensor = 0;
  for (const NodeArg& arg : args_) {
    BoundArg b;
    if (arg.is_constant()) {
      b.constant = arg.constant();
    } else if (std::holds_alternative<Value*>(arg.value)) {
      b.kind = BoundArg::Kind::kTensor;
      b.tensors = {next_tensor++};
    } else {
      b.kind = BoundArg::Kind::kTensorList;
      for (std::size_t i = 0; i < std::get<std::vector<Value*>>(arg.value).size(); ++i) {
        b.tensors.push_back(next_tensor++);
      }
    }
    bound.push_back(std::move(b));
  }
  return OpArgs(op_->schema, std::move(bound));
}

Value* Graph::new_value(TensorType type, std::string name) {
  if (name.empty()) {
    do {
      name = std::to_string(next_number_++);
    } while (by_name_.contains(name));
  } else if (by_name_.contains(name)) {
    throw Error(fmt::format("value %{} is defined twice", name));
  }
  auto value = std::make_unique<Value>();
  value->name_ = name;
  value->type_ = std::move(type);
  Value* raw = value.get();
  values_.push_back(std::move(value));
  by_name_.emplace(std::move(name), raw);
  return raw;
}

Value* Graph::add_input(TensorType type, std::string name) {
  Value* value = new_value(std::move(type), std::move(name));
  inputs_.push_back(value);
  return value;
}

Node* Graph::add_node(const OpDef& op, std::vector<NodeArg> args, std::vector<TensorType> output_types,
                      std::vector<std::string> output_names) {
  auto node = std::make_unique<Node>();
  node->op_ = &op;
  node->args_ = std::move(args);
  for (std::size_t i = 0; i < output_types.size(); ++i) {
    std::string name = i < output_names.size() ? std::move(output_names[i]) : std::string();
    Value* value = new_value(std::move(output_types[i]), std::move(name));
    value->producer_ = node.get();
    value->output_index_ = static_cast<int>(i);
    node->outputs_.push_back(value);
  }
  nodes_.push_back(std::move(node));
  return nodes_.back().get();
}

void Graph::set_outputs(std::vector<Value*> outputs) { outputs_ = std::move(outputs); }

Value* Graph::find_value(std::string_view name) const {
  const auto found = by_name_.find(std::string(name));
  return found == by_name_.end() ? nullptr : found->second;
}

}  // namespace shardflow
