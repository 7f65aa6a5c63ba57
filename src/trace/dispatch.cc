// Every op call from the user API goes through here: bind the arguments to
// the schema, then run the kernel now (eager, or a trace-time constant) or
// record a node (tracing).
#include <fmt/format.h>

#include <mutex>
#include <optional>
#include <unordered_map>

#include "shardflow/base/error.h"
#include "shardflow/ir/binding.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/ops.h"
#include "shardflow/trace/call.h"
#include "shardflow/trace/compile.h"
#include "trace_context.h"

namespace shardflow {

// How a traced tensor was computed, for errors about missing values.
std::string traced_origin(const TensorImpl& impl) {
  const Value* value = impl.traced_value;
  if (value == nullptr) return "";
  if (value->producer() == nullptr) return "%" + value->name() + " (an input of the compiled function)";
  return print_node(*value->producer());
}

// Keeps only the tensors the bound arguments refer to, renumbering them.
static OpArgs drop_unused_tensors(const OpArgs& bound, std::vector<std::shared_ptr<TensorImpl>>& tensors,
                                  std::vector<TensorType>& types) {
  std::vector<BoundArg> args = bound.all();
  std::vector<std::shared_ptr<TensorImpl>> kept;
  std::vector<TensorType> kept_types;
  for (BoundArg& arg : args) {
    for (int& index : arg.tensors) {
      kept.push_back(tensors[static_cast<std::size_t>(index)]);
      kept_types.push_back(types[static_cast<std::size_t>(index)]);
      index = static_cast<int>(kept.size() - 1);
    }
  }
  if (kept.size() == tensors.size()) return bound;
  tensors = std::move(kept);
  types = std::move(kept_types);
  return OpArgs(bound.schema(), std::move(args));
}

// Eager SPMD: an op on eagerly sharded tensors, with a multi-device runtime
// installed, runs as a one-op graph through the runtime's pipeline
// (propagation, partitioning, execution), so its result comes back sharded.
// The prepared graphs are cached by the call's signature.
static std::optional<std::vector<Tensor>> run_sharded(const OpDef& op, const OpArgs& bound,
                                                      const std::vector<std::shared_ptr<TensorImpl>>& tensors,
                                                      const std::vector<TensorType>& output_types) {
  GraphRunner* runner = graph_runner();
  if (runner == nullptr) return std::nullopt;
  bool any_sharded = false;
  for (const auto& tensor : tensors) {
    if (tensor->meta) return std::nullopt;
    any_sharded = any_sharded || tensor->sharding.has_value();
  }
  if (!any_sharded) return std::nullopt;

  std::string key = fmt::format("{}|{}|", op.full_name(), static_cast<const void*>(runner));
  for (const BoundArg& arg : bound.all()) {
    key += arg.kind == BoundArg::Kind::kConstant ? arg.constant.to_string() : "T";
    key += ";";
  }
  std::vector<std::optional<Sharding>> shardings;
  for (const auto& tensor : tensors) {
    key += tensor->type.to_string();
    key += tensor->sharding ? tensor->sharding->mesh().to_string() + tensor->sharding->to_readable() : "-";
    shardings.push_back(tensor->sharding);
  }
  struct Cached {
    std::unique_ptr<Graph> graph;
    std::shared_ptr<const PreparedGraph> prepared;
  };
  static std::mutex mutex;
  static std::unordered_map<std::string, Cached> cache;
  std::shared_ptr<const PreparedGraph> prepared;
  {
    std::lock_guard lock(mutex);
    if (auto found = cache.find(key); found != cache.end()) prepared = found->second.prepared;
  }
  if (!prepared) {
    auto graph = std::make_unique<Graph>(std::string(op.schema.name()));
    std::vector<Value*> inputs;
    for (const auto& tensor : tensors) inputs.push_back(graph->add_input(tensor->type));
    std::vector<NodeArg> args = node_args_of(bound, inputs);
    Node* node = graph->add_node(op, std::move(args), output_types);
    graph->set_outputs(node->outputs());
    prepared = runner->prepare(*graph, shardings);
    std::lock_guard lock(mutex);
    if (cache.size() >= 1024) cache.clear();  // bounded: signatures are few in practice
    cache.emplace(key, Cached{std::move(graph), prepared});
  }
  std::vector<Tensor> inputs;
  for (const auto& tensor : tensors) inputs.emplace_back(tensor);
  return runner->run(*prepared, std::move(inputs), nullptr);  // eager ops are not profiled
}

namespace ops {

std::vector<Tensor> call_multi(std::string_view name, std::vector<Arg> args) {
  register_all_ops();
  TraceContext* trace = TraceContext::current();
  std::vector<std::shared_ptr<TensorImpl>> tensors;
  std::vector<TensorType> types;
  std::vector<CallArg> call_args;
  const auto add_tensor = [&](const Tensor& tensor) {
    if (!tensor.defined()) throw Error(fmt::format("{}: an argument is an undefined tensor", name));
    tensors.push_back(tensor.impl());
    types.push_back(tensor.type());
    return static_cast<int>(tensors.size() - 1);
  };
  for (const Arg& arg : args) {
    if (const auto* constant = std::get_if<Constant>(&arg.value)) {
      call_args.push_back(CallArg::constant_arg(*constant, arg.keyword));
    } else if (const auto* tensor = std::get_if<Tensor>(&arg.value)) {
      CallArg call_arg = CallArg::tensor_arg(add_tensor(*tensor), arg.keyword);
      const TensorImpl& impl = *tensor->impl();
      const bool traced = trace != nullptr && trace->must_record(std::span(&tensor->impl(), 1));
      if (traced) {
        call_arg.traced_origin =
            impl.traced_value ? traced_origin(impl) : "a tensor captured from outside the compiled function";
      } else if (impl.is_concrete() && !is_floating(impl.type.dtype) && impl.type.rank() <= 1 &&
                 impl.type.shape.size() <= 1 && numel(impl.type.shape) <= 64) {
        call_arg.known_int_values = tensor->to_ints();  // an int list given as a small tensor
      }
      call_args.push_back(std::move(call_arg));
    } else {
      std::vector<int> indices;
      for (const Tensor& element : std::get<std::vector<Tensor>>(arg.value)) indices.push_back(add_tensor(element));
      call_args.push_back(CallArg::tensor_list_arg(std::move(indices), arg.keyword));
    }
  }
  auto [op, bound_args] = resolve_call(name, call_args, types);
  // A small int tensor bound as an int[] constant is no longer an operand.
  OpArgs bound = drop_unused_tensors(bound_args, tensors, types);
  std::vector<TensorType> output_types = op->infer(bound, types);
  if (trace != nullptr && trace->must_record(tensors)) {
    return trace->record(*op, bound, tensors, std::move(output_types));
  }
  if (trace == nullptr) {
    if (auto spmd = run_sharded(*op, bound, tensors, output_types)) return std::move(*spmd);
  }
  const uint64_t trace_id = trace != nullptr ? trace->id() : 0;
  std::vector<Tensor> outputs;
  const bool any_meta = std::any_of(tensors.begin(), tensors.end(), [](const auto& t) { return t->meta; });
  if (any_meta) {
    for (TensorType& type : output_types) {
      auto impl = std::make_shared<TensorImpl>();
      impl->type = std::move(type);
      impl->meta = true;
      impl->trace_id = trace_id;
      outputs.emplace_back(std::move(impl));
    }
    return outputs;
  }
  std::vector<DenseTensor> values;
  for (const auto& tensor : tensors) values.push_back(gather_value(*tensor));
  std::vector<DenseTensor> results = op->kernel(bound, values);
  for (std::size_t i = 0; i < results.size(); ++i) {
    auto impl = make_concrete_impl(std::move(results[i]));
    if (trace != nullptr) {
      // A trace-time constant: remember how to compute it in the graph.
      impl->recipe = ConstantRecipe{op, bound.all(), tensors, static_cast<int>(i)};
    }
    impl->trace_id = trace_id;
    outputs.emplace_back(std::move(impl));
  }
  return outputs;
}

Tensor call(std::string_view name, std::vector<Arg> args) {
  std::vector<Tensor> outputs = call_multi(name, std::move(args));
  if (outputs.size() != 1) {
    throw Error(fmt::format("{} returns {} tensors; use ops::call_multi", name, outputs.size()));
  }
  return std::move(outputs[0]);
}

}  // namespace ops
}  // namespace shardflow
