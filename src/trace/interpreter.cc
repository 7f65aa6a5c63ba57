#include "shardflow/trace/interpreter.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"
#include "shardflow/trace/profile.h"

namespace shardflow {

GraphInterpreter::GraphInterpreter(const Graph& graph) : graph_(graph) {
  // Slots: the graph inputs first, then every node output in order.
  std::unordered_map<const Value*, int> slot;
  for (const Value* input : graph.inputs()) slot.emplace(input, static_cast<int>(slot.size()));
  // Operand slots are stored shifted left by one (a hand-over bit below).
  std::size_t values = graph.inputs().size();
  for (const auto& node : graph.nodes()) values += node->outputs().size();
  if (values >= (std::size_t{1} << 30)) {
    throw Error(fmt::format("graph @{} has {} values; the interpreter handles fewer than 2^30", graph.name(), values));
  }
  std::unordered_map<const Value*, std::size_t> last_use;  // node index; outputs are kept
  for (std::size_t n = 0; n < graph.nodes().size(); ++n) {
    for (const Value* input : graph.nodes()[n]->inputs()) last_use[input] = n;
  }
  for (const Value* output : graph.outputs()) last_use[output] = graph.nodes().size();
  for (std::size_t n = 0; n < graph.nodes().size(); ++n) {
    const Node& node = *graph.nodes()[n];
    std::vector<int> operands, releases;
    for (const Value* input : node.inputs()) {
      operands.push_back(slot.at(input));
      if (last_use.at(input) == n && std::find(releases.begin(), releases.end(), operands.back()) == releases.end()) {
        releases.push_back(operands.back());
      }
    }
    Step step{&node,
              &node.op().kernel,
              node.op_args(),
              static_cast<uint32_t>(slot_lists_.size()),
              static_cast<uint32_t>(operands.size()),
              static_cast<uint32_t>(node.outputs().size()),
              static_cast<uint32_t>(releases.size()),
              -1};
    std::vector<TensorType> input_types, output_types;
    for (const Value* input : node.inputs()) input_types.push_back(input->type());
    for (const Value* output : node.outputs()) output_types.push_back(output->type());
    if (reinterprets_operand(node.op(), step.args, input_types, output_types)) {
      step.new_shape = static_cast<int32_t>(new_shapes_.size());
      new_shapes_.push_back(output_types[0].shape);
    }
    for (int operand : operands) {
      const bool last = std::find(releases.begin(), releases.end(), operand) != releases.end();
      const bool handed_over = last && std::count(operands.begin(), operands.end(), operand) == 1;
      slot_lists_.push_back(operand << 1 | static_cast<int>(handed_over));
    }
    for (const Value* output : node.outputs()) {
      slot_lists_.push_back(static_cast<int>(slot.size()));
      slot.emplace(output, static_cast<int>(slot.size()));
    }
    slot_lists_.insert(slot_lists_.end(), releases.begin(), releases.end());
    steps_.push_back(std::move(step));
  }
  for (const Value* output : graph.outputs()) output_slots_.push_back(slot.at(output));
  num_slots_ = slot.size();
}

std::vector<DenseTensor> GraphInterpreter::run(std::vector<DenseTensor> inputs, OpProfile* profile) const {
  const Graph& graph = graph_;
  if (inputs.size() != graph.inputs().size()) {
    throw Error(fmt::format("graph @{} takes {} inputs, got {}", graph.name(), graph.inputs().size(), inputs.size()));
  }
  std::vector<DenseTensor> slots(num_slots_);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const TensorType expected = graph.inputs()[i]->type();
    if (inputs[i].dtype() != expected.dtype || inputs[i].shape() != expected.shape) {
      throw Error(fmt::format("input %{} of graph @{} is {} but got {}{}", graph.inputs()[i]->name(), graph.name(),
                              expected.to_string(), dtype_name(inputs[i].dtype()), shape_to_string(inputs[i].shape())));
    }
    slots[i] = std::move(inputs[i]);
  }
  std::vector<DenseTensor> operands, results;
  detail::RunTimes times;
  for (const Step& step : steps_) {
    const int* lists = slot_lists_.data() + step.first_operand;
    operands.clear();
    for (uint32_t k = 0; k < step.num_operands; ++k) {
      DenseTensor& slot = slots[static_cast<std::size_t>(lists[k] >> 1)];
      operands.push_back((lists[k] & 1) != 0 ? std::move(slot) : slot);
    }
    lists += step.num_operands;
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = profile ? Clock::now() : Clock::time_point();
    try {
      if (step.new_shape >= 0) {
        results.clear();
        results.push_back(operands[0].reshaped(new_shapes_[static_cast<std::size_t>(step.new_shape)]));
      } else {
        results = (*step.kernel)(step.args, operands);
      }
    } catch (const Error& error) {
      throw Error(fmt::format("{}: {}", print_node(*step.node), error.what()));
    }
    if (profile) {
      const OpDef& op = step.node->op();
      times.add(&op, std::chrono::duration<double>(Clock::now() - start).count(), [&] { return op.full_name(); });
    }
    if (results.size() != step.num_results) {
      throw Error(fmt::format("internal: {}: the kernel returned {} results", print_node(*step.node), results.size()));
    }
    for (uint32_t i = 0; i < step.num_results; ++i) slots[static_cast<std::size_t>(lists[i])] = std::move(results[i]);
    lists += step.num_results;
    for (uint32_t i = 0; i < step.num_releases; ++i) slots[static_cast<std::size_t>(lists[i])] = DenseTensor();
  }
  if (profile) profile->add_run(0, times.totals());
  std::vector<DenseTensor> outputs;
  for (int output : output_slots_) outputs.push_back(slots[static_cast<std::size_t>(output)]);
  return outputs;
}

std::vector<DenseTensor> run_graph(const Graph& graph, std::span<const DenseTensor> inputs) {
  return GraphInterpreter(graph).run(std::vector<DenseTensor>(inputs.begin(), inputs.end()));
}

}  // namespace shardflow
