#include "trace_context.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"

namespace shardflow {

static thread_local TraceContext* t_current = nullptr;
static std::atomic<uint64_t> g_next_trace_id{1};

TraceContext::TraceContext(TraceRecord& record, bool replay)
    : record_(record), replay_(replay), id_(g_next_trace_id++), previous_(t_current) {
  if (previous_ != nullptr) {
    throw Error(
        "compile(): a compiled function was called while another one is being traced; "
        "nested compiled functions are not supported (call the inner function directly)");
  }
  t_current = this;
}

TraceContext::~TraceContext() { t_current = previous_; }

TraceContext* TraceContext::current() { return t_current; }

void TraceContext::mismatch(std::string reason) const { throw ReplayMismatch{std::move(reason)}; }

Tensor TraceContext::make_input(const TensorType& type, std::size_t index) {
  auto impl = std::make_shared<TensorImpl>();
  impl->type = type;
  impl->trace_id = id_;
  if (replay_) {
    impl->traced_value = record_.graph.inputs().at(index);
  } else {
    impl->traced_value = record_.graph.add_input(type, fmt::format("arg{}", index));
  }
  return Tensor(std::move(impl));
}

bool TraceContext::must_record(std::span<const std::shared_ptr<TensorImpl>> tensors) const {
  for (const auto& tensor : tensors) {
    // Traced here, annotated here, or from outside this trace (captured).
    if (tensor->trace_id != id_ || tensor->traced_value != nullptr || values_.contains(tensor.get())) {
      return true;
    }
  }
  return false;
}

Value* TraceContext::capture(const std::shared_ptr<TensorImpl>& tensor) {
  if (tensor->traced_value != nullptr) {
    // A traced tensor of another (finished) trace.
    throw Error(
        fmt::format("a tensor computed while tracing a compiled function was used outside "
                    "that trace (it is %{}, which has no value)",
                    tensor->traced_value->name()));
  }
  const std::size_t position = captured_.size();
  const std::size_t input_index = record_.num_explicit_inputs + position;
  // A tensor the function built from data during this trace is part of the
  // function; it is matched by value. Anything else is matched by identity,
  // as is a shape-only (meta) tensor, which has no value to match.
  const bool by_value = tensor->trace_id == id_ && !tensor->meta;
  Value* value = nullptr;
  if (replay_) {
    bool same = position < record_.captured.size();
    if (same && by_value) {
      const auto& kept = record_.captured[position].by_value;
      const DenseTensor current = gather_value(*tensor);
      same = kept && kept->dtype() == current.dtype() && kept->shape() == current.shape() &&
             std::equal(kept->bytes().begin(), kept->bytes().end(), current.bytes().begin());
    } else if (same) {
      same = !record_.captured[position].by_value && record_.captured[position].tensor.lock() == tensor;
    }
    if (!same) mismatch(fmt::format("captured tensor {} differs from the traced one", position));
    value = record_.graph.inputs().at(input_index);
  } else {
    value = record_.graph.add_input(tensor->type, fmt::format("captured{}", position));
    CapturedTensor captured{tensor, std::nullopt};
    if (by_value) captured.by_value = gather_value(*tensor);
    record_.captured.push_back(std::move(captured));
  }
  captured_.push_back(tensor);
  values_.emplace(tensor.get(), KnownValue{tensor, value});
  return value;
}

Value* TraceContext::value_of(const std::shared_ptr<TensorImpl>& tensor) {
  if (const auto found = values_.find(tensor.get()); found != values_.end()) return found->second.value;
  if (tensor->trace_id == id_ && tensor->traced_value != nullptr) return tensor->traced_value;
  if (tensor->trace_id == id_ && tensor->recipe) {
    // A trace-time constant used by a traced op: put its computation in the
    // graph (once).
    const ConstantRecipe& recipe = *tensor->recipe;
    std::vector<TensorType> types;
    for (const auto& input : recipe.inputs) types.push_back(input->type);
    const OpArgs args(recipe.op->schema, recipe.args);
    const std::vector<TensorType> outputs = recipe.op->infer(args, types);
    std::vector<Tensor> results = record(*recipe.op, args, recipe.inputs, outputs);
    Value* value = results.at(static_cast<std::size_t>(recipe.output_index)).impl()->traced_value;
    values_.emplace(tensor.get(), KnownValue{tensor, value});
    return value;
  }
  return capture(tensor);
}

void TraceContext::replace(const std::shared_ptr<TensorImpl>& tensor, Value* annotated) {
  values_[tensor.get()] = KnownValue{tensor, annotated};
}

static bool same_arg(const NodeArg& a, const NodeArg& b) {
  if (a.value.index() != b.value.index()) return false;
  if (a.is_constant()) {
    // Exact comparison, except that NaN constants match each other.
    return a.constant() == b.constant() || (a.constant().kind() == Constant::Kind::kFloat &&
                                            std::isnan(a.constant().as_float()) && std::isnan(b.constant().as_float()));
  }
  return a.value == b.value;
}

std::vector<Tensor> TraceContext::record(const OpDef& op, const OpArgs& args,
                                         std::span<const std::shared_ptr<TensorImpl>> tensors,
                                         std::vector<TensorType> output_types) {
  std::vector<NodeArg> node_args;
  for (const BoundArg& bound : args.all()) {
    NodeArg arg;
    switch (bound.kind) {
      case BoundArg::Kind::kConstant:
        arg.value = bound.constant;
        break;
      case BoundArg::Kind::kTensor:
        arg.value = value_of(tensors[static_cast<std::size_t>(bound.tensors[0])]);
        break;
      case BoundArg::Kind::kTensorList: {
        std::vector<Value*> list;
        for (int index : bound.tensors) list.push_back(value_of(tensors[static_cast<std::size_t>(index)]));
        arg.value = std::move(list);
        break;
      }
    }
    node_args.push_back(std::move(arg));
  }
  const Node* node = nullptr;
  if (replay_) {
    const auto& nodes = record_.graph.nodes();
    if (next_node_ >= nodes.size()) mismatch("the function calls more ops than when traced");
    node = nodes[next_node_].get();
    bool same = &node->op() == &op && node->args().size() == node_args.size();
    for (std::size_t i = 0; same && i < node_args.size(); ++i) same = same_arg(node->args()[i], node_args[i]);
    if (!same) mismatch(fmt::format("op {} differs from the traced '{}'", op.full_name(), print_node(*node)));
    ++next_node_;
  } else {
    node = record_.graph.add_node(op, std::move(node_args), std::move(output_types));
  }
  std::vector<Tensor> outputs;
  for (Value* value : node->outputs()) {
    auto impl = std::make_shared<TensorImpl>();
    impl->type = value->type();
    impl->trace_id = id_;
    impl->traced_value = value;
    outputs.emplace_back(std::move(impl));
  }
  return outputs;
}

void TraceContext::finish(std::span<const Tensor> outputs) {
  std::vector<Value*> values;
  for (const Tensor& output : outputs) {
    if (!output.defined()) throw Error("compile(): the traced function returned an undefined tensor");
    values.push_back(value_of(output.impl()));
  }
  if (replay_) {
    if (next_node_ != record_.graph.nodes().size()) mismatch("the function calls fewer ops than when traced");
    if (values != record_.graph.outputs()) mismatch("the function returns other values than when traced");
    if (captured_.size() != record_.captured.size()) mismatch("the function captures fewer tensors");
  } else {
    record_.graph.set_outputs(std::move(values));
  }
}

}  // namespace shardflow
