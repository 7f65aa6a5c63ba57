// The IR: a function in SSA form. Every node calls one registered op; values
// are typed (dtype + static shape) and named (%0, %x0, %attn_out).
//
//   func @mlp(%x: f32[8,512], %w: f32[512,2048]) -> (f32[8,2048]) {
//     %0 = aten::matmul(%x, %w) : f32[8,2048]
//     return %0
//   }
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "shardflow/ir/op_def.h"

namespace shardflow {

class Node;

class Value {
 public:
  const std::string& name() const { return name_; }
  const TensorType& type() const { return type_; }
  // The node computing the value; nullptr for a graph input.
  Node* producer() const { return producer_; }
  int output_index() const { return output_index_; }

 private:
  friend class Graph;
  std::string name_;
  TensorType type_;
  Node* producer_ = nullptr;
  int output_index_ = 0;
};

// One argument of a node, in schema order: a constant, a value, or a list.
struct NodeArg {
  std::variant<Constant, Value*, std::vector<Value*>> value;

  bool is_constant() const { return std::holds_alternative<Constant>(value); }
  const Constant& constant() const { return std::get<Constant>(value); }
};

// A call's bound arguments as node arguments: tensor indices become the
// values `tensors[index]`.
std::vector<NodeArg> node_args_of(const OpArgs& bound, std::span<Value* const> tensors);

class Node {
 public:
  const OpDef& op() const { return *op_; }
  const std::vector<NodeArg>& args() const { return args_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* output(int i = 0) const { return outputs_.at(static_cast<std::size_t>(i)); }
  // The tensor operands, in argument order (lists flattened).
  std::vector<Value*> inputs() const;
  // The arguments as an OpArgs (tensor indices refer to inputs()).
  OpArgs op_args() const;
  // The IR text line the node was parsed from, for errors; 0 when traced.
  int source_line() const { return source_line_; }
  void set_source_line(int line) { source_line_ = line; }

 private:
  friend class Graph;
  const OpDef* op_ = nullptr;
  int source_line_ = 0;
  std::vector<NodeArg> args_;
  std::vector<Value*> outputs_;
};

class Graph {
 public:
  explicit Graph(std::string name = "main") : name_(std::move(name)) {}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  const std::string& name() const { return name_; }
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }

  // `name` empty: the next free number ("%0", "%1", ...). A name in use is an
  // error.
  Value* add_input(TensorType type, std::string name = {});
  // Appends a node whose args are already bound to the op's schema; the
  // output types are given (the verifier re-infers them).
  Node* add_node(const OpDef& op, std::vector<NodeArg> args, std::vector<TensorType> output_types,
                 std::vector<std::string> output_names = {});
  void set_outputs(std::vector<Value*> outputs);

  Value* find_value(std::string_view name) const;

 private:
  Value* new_value(TensorType type, std::string name);

  std::string name_;
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  std::unordered_map<std::string, Value*> by_name_;
  int64_t next_number_ = 0;
};

}  // namespace shardflow
