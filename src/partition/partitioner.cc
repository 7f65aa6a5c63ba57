// The SPMD partitioner: one local program for all devices.
//
// For each op, in graph order:
//  1. settle how its factors are sharded (factors.cc): a factor the result
//     has takes the result's axes (propagation chose them); other factors
//     (contracted or reduced dims) take their operands' axes where those are
//     free; factors that need replication take none. When computing in the
//     operands' layout and moving the results costs less, that wins;
//  2. reshard every operand whose layout differs from what the factors ask
//     (value_moves.cc, reshard.cc), except that partial sums may stay
//     partial through ops that are linear in them;
//  3. overwrite padding with the reduction's identity where a sharded dim is
//     reduced or contracted and does not divide evenly (with ones where an
//     integer divisor is padded), and keep an addend
//     (linear's bias) on one device of each group the contraction spans;
//  4. run the op's kernel on the local shards (shape arguments rewritten to
//     local shapes); a sharded contraction leaves a partial sum over its axes.
// Graph outputs are reduced and laid out as propagation said. lower_op.cc
// has the four steps; reshape_tiles.cc a reshape of an uneven dim.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_set>

#include "partitioner_pass.h"
#include "shardflow/ir/sharding_projection.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/annotation.h"

namespace shardflow {

using partition_detail::DimAxes;
using partition_detail::effective_axes;
using partition_detail::FactorChoice;
using partition_detail::FactorPlan;
using partition_detail::factors_for_plan;
using partition_detail::LocalValue;
using partition_detail::padded_shape;
using partition_detail::ProgramBuilder;
using partition_detail::ReshardReason;

Shape local_shape(const Shape& global, const Sharding& sharding) {
  return padded_shape(sharding.mesh(), global, sharding.all_dim_axes());
}

namespace partition_detail {

void Partitioner::run() {
  for (const auto& node : graph_.nodes()) {
    for (const Value* input : node->inputs()) {
      std::vector<const Node*>& users = users_[input];
      if (users.empty() || users.back() != node.get()) users.push_back(node.get());  // mul(%p, %p) is one user
    }
  }
  for (const Value* output : graph_.outputs()) returned_.insert(output);
  for (const Value* input : graph_.inputs()) {
    const Sharding& sharding = shardings_.sharding(input);
    LocalValue rep;
    rep.dims = effective_axes(mesh_, sharding);
    rep.slot = builder_.new_slot({input->type().dtype, padded_shape(mesh_, input->type().shape, rep.dims)});
    reps_[input] = rep;
    program_.input_slots.push_back(rep.slot);
    program_.input_shardings.push_back(sharding);
  }
  for (const auto& node : graph_.nodes()) {
    if (node->op().full_name() == ops::kMarkShardingOp) {
      lower_annotation(*node);
    } else {
      lower_op(*node);
    }
  }
  for (std::size_t i = 0; i < graph_.outputs().size(); ++i) {
    const Value* output = graph_.outputs()[i];
    const Sharding& sharding = shardings_.sharding(output);
    const LocalValue rep = move_value_for_use(output, effective_axes(mesh_, sharding), fmt::format("output {}", i));
    program_.output_slots.push_back(rep.slot);
    program_.output_shardings.push_back(sharding);
    program_.output_types.push_back(output->type());
  }
}

std::string Partitioner::node_text(const Node& node) const {
  return fmt::format("%{} {}", node.outputs().empty() ? "?" : node.output()->name(), node.op().full_name());
}

std::string Partitioner::origin_text(const Value* value, int dim) const {
  const ShardingOrigin& origin = shardings_.origin(value, dim);
  const auto rep = reps_.find(value);
  const bool as_propagated =
      rep == reps_.end() || rep->second.dims[static_cast<std::size_t>(dim)] ==
                                effective_axes(mesh_, shardings_.sharding(value))[static_cast<std::size_t>(dim)];
  if ((origin.source != nullptr && as_propagated) || value->producer() == nullptr) return origin.describe();
  // Propagation left the dim whole or gave it other axes; the partitioner
  // kept the producer's operands' layout because that moved fewer bytes.
  return fmt::format("%{} {}, computed in its operands' layout", value->name(), value->producer()->op().full_name());
}

const Value* Partitioner::alias_root(const Value* value) const {
  const auto found = alias_roots_.find(value);
  return found == alias_roots_.end() ? value : found->second;
}

bool Partitioner::holds_exactly(DType from, DType to) {
  if (from == to || from == DType::kBool) return true;
  if (to == DType::kF32) return from == DType::kBF16 || from == DType::kF16;
  return to == DType::kI64 && from == DType::kI32;
}

bool Partitioner::keeps_partial(const Node& node, const std::vector<const LocalValue*>& operands, std::size_t index) {
  const LocalValue& rep = *operands[index];
  const auto partial = [](const LocalValue* r) { return !r->unreduced.empty(); };
  const auto same_partial = [&](const LocalValue* r) {
    return r->unreduced == rep.unreduced && r->reduction == rep.reduction;
  };
  const std::size_t partial_count = static_cast<std::size_t>(std::count_if(operands.begin(), operands.end(), partial));
  if (rep.reduction != ReduceOp::kSum) return false;  // max/min partials: linear ops do not commute
  // A result dtype that cannot hold every operand value (a cast to ints,
  // bools or a narrower float, a sum with dtype=) would truncate or round
  // each device's part before the parts are added.
  for (const Value* output : node.outputs()) {
    if (!holds_exactly(node.inputs()[index]->type().dtype, output->type().dtype)) return false;
  }
  // A non-finite number (mul by inf) turns parts of either sign into
  // infinities that add to NaN.
  for (const NodeArg& arg : node.args()) {
    if (arg.is_constant() && arg.constant().kind() == Constant::Kind::kFloat &&
        !std::isfinite(arg.constant().as_float())) {
      return false;
    }
  }
  switch (node.op().linearity) {
    case Linearity::kNone:
      return false;
    case Linearity::kLinear:
      return operands.size() == 1;
    case Linearity::kAdditive:
      return std::all_of(operands.begin(), operands.end(), same_partial);
    case Linearity::kBilinear:
      return partial_count == 1;
  }
  return false;
}

bool Partitioner::used_elsewhere(const Value* value, const Node& node) const {
  if (returned_.contains(value)) return true;
  const auto found = users_.find(value);
  return found != users_.end() &&
         std::any_of(found->second.begin(), found->second.end(), [&](const Node* user) { return user != &node; });
}

bool Partitioner::partials_stay(const Node& node, const std::vector<const LocalValue*>& operands) const {
  const std::vector<Value*> inputs = node.inputs();
  for (std::size_t o = 0; o < operands.size(); ++o) {
    if (operands[o]->unreduced.empty()) continue;
    if (!keeps_partial(node, operands, o) || used_elsewhere(inputs[o], node)) return false;
  }
  return true;
}

std::vector<int> Partitioner::sharded_reduction_axes(const OpShardingRule& rule,
                                                     const std::vector<std::vector<int>>& factor_axes,
                                                     ReduceOp& reduction) {
  std::vector<int> axes;
  for (std::size_t f = 0; f < rule.factors.size(); ++f) {
    if (!rule.leaves_partials(static_cast<int>(f)) || factor_axes[f].empty()) continue;
    const FactorKind kind = rule.factors[f].kind;
    reduction = kind == FactorKind::kIndexed ? ReduceOp::kSum : rule.factors[f].reduction;
    axes.insert(axes.end(), factor_axes[f].begin(), factor_axes[f].end());
  }
  return axes;
}

LocalValue Partitioner::new_result(const Node& node, const OpShardingRule& rule, std::size_t r,
                                   const std::vector<std::vector<int>>& factor_axes,
                                   const std::vector<int>& partial_axes, ReduceOp reduction) {
  const TensorType& type = node.outputs()[r]->type();
  LocalValue rep;
  rep.dims = project_to_dims(mesh_, rule, rule.results[r], factor_axes);
  rep.unreduced = partial_axes;
  rep.reduction = reduction;
  rep.slot = builder_.new_slot({type.dtype, padded_shape(mesh_, type.shape, rep.dims)});
  return rep;
}

double Partitioner::plan_cost(const Node& node, const OpShardingRule& rule,
                              const std::vector<const LocalValue*>& current, bool partials_kept,
                              const std::vector<std::vector<int>>& factor_axes, OperandMoves operand_moves) {
  const ProgramBuilder::Mark mark = builder_.mark();
  const std::vector<Value*> operands = node.inputs();
  const ReshardReason why{nullptr, "", [](int) { return std::string(); }};
  std::vector<int> partial_axes;
  ReduceOp reduction = ReduceOp::kSum;
  for (std::size_t o = 0; o < operands.size(); ++o) {
    const DimAxes wanted = project_to_dims(mesh_, rule, rule.operands[o], factor_axes);
    const TensorType& type = operands[o]->type();
    LocalValue rep = *current[o];
    ReshardReason operand_why = why;
    operand_why.value = operands[o];
    if (!rep.unreduced.empty() && partials_kept) {
      partial_axes.insert(partial_axes.end(), rep.unreduced.begin(), rep.unreduced.end());
      rep.unreduced.clear();
      if (rep.dims != wanted)
        partition_detail::emit_reshard(builder_, rep, wanted, type.shape, type.dtype, operand_why);
    } else if ((rep.dims != wanted || !rep.unreduced.empty()) &&
               !layouts_.contains({alias_root(operands[o]), wanted})) {
      const Value* root = alias_root(operands[o]);
      const std::optional<MovesFrom> found =
          operand_moves == OperandMoves::kFromMadeLayouts && (rep.unreduced.empty() || reduced_.contains(root))
              ? cheapest_from_made(root, rep.unreduced.empty() ? current[o] : nullptr, wanted, type)
              : std::nullopt;
      partition_detail::emit_reshard(builder_, found ? *found->source : rep, wanted, type.shape, type.dtype,
                                     operand_why, nullptr, found ? &found->moves : nullptr);
    }
  }
  const std::vector<int> reduced = sharded_reduction_axes(rule, factor_axes, reduction);
  partial_axes.insert(partial_axes.end(), reduced.begin(), reduced.end());
  std::sort(partial_axes.begin(), partial_axes.end());
  partial_axes.erase(std::unique(partial_axes.begin(), partial_axes.end()), partial_axes.end());
  for (std::size_t r = 0; r < node.outputs().size(); ++r) {
    const Value* output = node.outputs()[r];
    const LocalValue rep = new_result(node, rule, r, factor_axes, partial_axes, reduction);
    const DimAxes wanted = effective_axes(mesh_, shardings_.sharding(output));
    ReshardReason result_why = why;
    result_why.value = output;
    const TensorType& type = output->type();
    std::vector<LocalValue> made;
    if (rep.dims == wanted && rep.unreduced.empty()) {
      made.push_back(rep);
    } else {
      partition_detail::emit_reshard(builder_, rep, wanted, type.shape, type.dtype, result_why, &made);
    }
    // And the layouts later annotations want it in: a plan whose result
    // slices cheaply to the first may leave the next a gather.
    std::vector<LaterUse> later;
    add_annotations_ahead(output, wanted, nullptr, later);
    for (const LaterUse& use : later) move_from(made, use.dims, type, result_why);
  }
  const double cost = builder_.cost_since(mark);
  builder_.rollback(mark);
  return cost;
}

Partitioner::OpPlanInputs Partitioner::plan_inputs(const Node& node) {
  std::vector<TensorType> in_types, out_types;
  for (const Value* v : node.inputs()) in_types.push_back(v->type());
  for (const Value* v : node.outputs()) out_types.push_back(v->type());
  OpArgs args = node.op_args();
  OpShardingRule rule = node.op().sharding_rule(args, in_types, out_types);
  const int addend = node.op().addend_arg.empty() ? -1 : args.tensor(node.op().addend_arg);
  return {std::move(args), std::move(rule), addend};
}

bool Partitioner::settle_operands(const Node& node, std::vector<const LocalValue*>& current) const {
  const bool partials_kept = partials_stay(node, current);
  for (std::size_t o = 0; o < current.size(); ++o) {
    if (current[o]->unreduced.empty() || partials_kept) continue;
    if (const auto reduced = reduced_.find(node.inputs()[o]); reduced != reduced_.end()) current[o] = &reduced->second;
  }
  return partials_kept;
}

std::vector<std::vector<int>> Partitioner::factors_of_cheapest_plan(const Node& node, const OpPlanInputs& inputs,
                                                                    const std::vector<const LocalValue*>& current,
                                                                    bool partials_kept, OperandMoves operand_moves,
                                                                    double* cost) {
  const FactorChoice choice{mesh_, shardings_, node, inputs.rule, current, partials_kept, inputs.addend};
  std::vector<std::vector<int>> factor_axes = factors_for_plan(choice, FactorPlan::kResultsThenOperands);
  double least = -1;
  for (const FactorPlan plan : {FactorPlan::kOperandsOnly, FactorPlan::kResultsOnly}) {
    std::vector<std::vector<int>> other = factors_for_plan(choice, plan);
    if (other == factor_axes) continue;
    if (least < 0) least = plan_cost(node, inputs.rule, current, partials_kept, factor_axes, operand_moves);
    const double other_cost = plan_cost(node, inputs.rule, current, partials_kept, other, operand_moves);
    if (other_cost < least) {
      least = other_cost;
      factor_axes = std::move(other);
    }
  }
  if (cost != nullptr) {
    *cost = least >= 0 ? least : plan_cost(node, inputs.rule, current, partials_kept, factor_axes, operand_moves);
  }
  return factor_axes;
}

}  // namespace partition_detail

namespace {

// Found once here rather than by every device on every run.
void assign_releases(PartitionedProgram& program) {
  std::vector<int64_t> last_reader(program.slots.size(), -1);
  for (std::size_t i = 0; i < program.instructions.size(); ++i) {
    for (int slot : program.instructions[i].inputs)
      last_reader[static_cast<std::size_t>(slot)] = static_cast<int64_t>(i);
  }
  for (int slot : program.output_slots) last_reader[static_cast<std::size_t>(slot)] = -1;
  for (std::size_t i = 0; i < program.instructions.size(); ++i) {
    Instruction& instruction = program.instructions[i];
    for (int slot : instruction.inputs) {
      const bool last = last_reader[static_cast<std::size_t>(slot)] == static_cast<int64_t>(i);
      if (last &&
          std::find(instruction.releases.begin(), instruction.releases.end(), slot) == instruction.releases.end()) {
        instruction.releases.push_back(slot);
      }
    }
  }
}

}  // namespace

PartitionedProgram partition_graph(const Graph& graph, const PropagationResult& shardings) {
  PartitionedProgram program;
  program.mesh = shardings.mesh();
  program.warnings = shardings.warnings();  // shown wherever the program's warnings are
  partition_detail::Partitioner(graph, shardings, program).run();
  assign_releases(program);
  return program;
}

}  // namespace shardflow
