// Lowering one op (partitioner.cc's steps 1-4), each step a function:
// the factor shardings (factors_of_cheapest_plan), the operands moved to
// them (operands_in_layout), padding masked where a sharded dim is reduced
// (mask_reduced_padding) or divides (mask_divisor_padding), a lookup in
// shards (sharded_index), an addend kept once (count_addend_once), and the
// local op itself (emit_local_op).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "partitioner_pass.h"
#include "shardflow/base/error.h"
#include "shardflow/ir/sharding_projection.h"

namespace shardflow::partition_detail {

namespace {

// The first operand dim that factor f is on, as {operand, dim}; {-1, 0}
// when no operand has it.
std::pair<int, int> first_operand_dim(const OpShardingRule& rule, int f) {
  for (std::size_t o = 0; o < rule.operands.size(); ++o) {
    for (std::size_t d = 0; d < rule.operands[o].size(); ++d) {
      const std::vector<int>& factors = rule.operands[o][d];
      if (std::find(factors.begin(), factors.end(), f) != factors.end())
        return {static_cast<int>(o), static_cast<int>(d)};
    }
  }
  return {-1, 0};
}

// The value a reduction's padding must hold so that it changes nothing.
double reduction_identity(ReduceOp combine) {
  if (combine == ReduceOp::kSum) return 0.0;
  return combine == ReduceOp::kMax ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
}

}  // namespace

void Partitioner::lower_op(const Node& node) {
  const OpPlanInputs inputs = plan_inputs(node);
  std::vector<const LocalValue*> current;
  for (const Value* v : node.inputs()) current.push_back(&reps_.at(v));
  const bool partials_kept = settle_operands(node, current);
  if (lower_in_operand_tiles(node, inputs, current)) return;

  const std::vector<std::vector<int>> factor_axes =
      factors_of_cheapest_plan(node, inputs, current, partials_kept, OperandMoves::kFromCurrent, nullptr);
  std::vector<LocalValue> local = operands_in_layout(node, inputs.rule, factor_axes, current, partials_kept);

  PartialResult partial;
  partial.axes = sharded_reduction_axes(inputs.rule, factor_axes, partial.reduction);
  const double scale = mask_reduced_padding(node, inputs.rule, factor_axes, local, partial.reason);
  if (!node.op().divisor_arg.empty()) mask_divisor_padding(node, inputs.args, local);
  const ShardedIndex index = sharded_index(node, inputs.rule, factor_axes, partial.reason);
  if (inputs.addend >= 0 && !partial.axes.empty()) {
    count_addend_once(local[static_cast<std::size_t>(inputs.addend)], partial.axes);
  }
  // Partial sums carried through a linear op.
  for (const LocalValue& rep : local) {
    if (rep.unreduced.empty()) continue;
    for (int axis : rep.unreduced) {
      if (std::find(partial.axes.begin(), partial.axes.end(), axis) == partial.axes.end()) partial.axes.push_back(axis);
    }
    if (partial.reason.empty()) partial.reason = rep.unreduced_reason;
  }
  std::sort(partial.axes.begin(), partial.axes.end());
  emit_local_op(node, inputs, factor_axes, local, partial, index, scale);
}

std::vector<LocalValue> Partitioner::operands_in_layout(const Node& node, const OpShardingRule& rule,
                                                        const std::vector<std::vector<int>>& factor_axes,
                                                        const std::vector<const LocalValue*>& current,
                                                        bool partials_kept) {
  const std::vector<Value*> operands = node.inputs();
  std::vector<LocalValue> local;
  for (std::size_t o = 0; o < operands.size(); ++o) {
    const DimAxes wanted = project_to_dims(mesh_, rule, rule.operands[o], factor_axes);
    LocalValue rep = *current[o];
    const bool keep_partial = !rep.unreduced.empty() && partials_kept;
    if (rep.dims != wanted || (!rep.unreduced.empty() && !keep_partial)) {
      const ReshardReason why{operands[o], node_text(node),
                              [this, v = operands[o]](int d) { return origin_text(v, d); }};
      const TensorType& type = operands[o]->type();
      if (keep_partial) {
        // Move the layout of a partial sum without reducing it: gathering
        // or slicing partials of the same reduction group keeps them partial.
        LocalValue layout = rep;
        layout.unreduced.clear();
        LocalValue moved = emit_reshard(builder_, layout, wanted, type.shape, type.dtype, why);
        moved.unreduced = rep.unreduced;
        moved.reduction = rep.reduction;
        moved.unreduced_reason = rep.unreduced_reason;
        rep = std::move(moved);
      } else {
        rep = move_value_for_use(operands[o], wanted, node_text(node));
      }
    }
    local.push_back(std::move(rep));
  }
  return local;
}

double Partitioner::mask_reduced_padding(const Node& node, const OpShardingRule& rule,
                                         const std::vector<std::vector<int>>& factor_axes,
                                         std::vector<LocalValue>& local, std::string& reason) {
  const OpDef& op = node.op();
  const std::vector<Value*> operands = node.inputs();
  double scale = 1;
  for (std::size_t f = 0; f < rule.factors.size(); ++f) {
    if (rule.factors[f].kind != FactorKind::kReduction || factor_axes[f].empty()) continue;
    bool described = false;
    for (std::size_t o = 0; o < operands.size(); ++o) {
      for (std::size_t d = 0; d < rule.operands[o].size(); ++d) {
        const auto& mapping = rule.operands[o][d];
        if (std::find(mapping.begin(), mapping.end(), static_cast<int>(f)) == mapping.end()) continue;
        const int64_t size = operands[o]->type().shape[d];
        if (!described) {
          reason = fmt::format("{} {} dim {}, sharded on {} by {}", node_text(node),
                               op.family == OpFamily::kContraction ? "contracts" : "reduces", d,
                               builder_.axes_text(factor_axes[f]), origin_text(operands[o], static_cast<int>(d)));
          described = true;
        }
        if (op.averages) {
          scale *= static_cast<double>(padded_shape(mesh_, {size}, {local[o].dims[d]})[0]) / static_cast<double>(size);
        }
        mask_padding(local[o], static_cast<int>(d), size, reduction_identity(rule.factors[f].reduction));
      }
    }
  }
  return scale;
}

void Partitioner::mask_divisor_padding(const Node& node, const OpArgs& args, std::vector<LocalValue>& local) {
  const int o = args.tensor(node.op().divisor_arg);
  if (o < 0) return;
  const TensorType& type = node.inputs()[static_cast<std::size_t>(o)]->type();
  if (is_floating(type.dtype)) return;  // a float zero divides to inf or NaN, never an error
  for (std::size_t d = 0; d < type.shape.size(); ++d) {
    mask_padding(local[static_cast<std::size_t>(o)], static_cast<int>(d), type.shape[d], 1.0);
  }
}

Instruction Partitioner::rewriting(LocalValue& value, InstructionKind kind) {
  Instruction step;
  step.kind = kind;
  step.inputs = {value.slot};
  value.slot = builder_.new_slot(builder_.slot_type(value.slot));
  step.outputs = {value.slot};
  return step;
}

void Partitioner::mask_padding(LocalValue& operand, int dim, int64_t size, double fill) {
  const std::vector<int>& axes = operand.dims[static_cast<std::size_t>(dim)];
  if (size % builder_.axes_size(axes) == 0) return;
  Instruction mask = rewriting(operand, InstructionKind::kMaskPadding);
  mask.dim = dim;
  mask.global_size = size;
  mask.axes_before = axes;
  mask.fill = fill;
  builder_.emit(std::move(mask));
}

Partitioner::ShardedIndex Partitioner::sharded_index(const Node& node, const OpShardingRule& rule,
                                                     const std::vector<std::vector<int>>& factor_axes,
                                                     std::string& reason) const {
  ShardedIndex index;
  for (std::size_t f = 0; f < rule.factors.size() && index.input < 0; ++f) {
    if (rule.factors[f].kind != FactorKind::kIndexed || factor_axes[f].empty()) continue;
    std::tie(index.input, index.dim) = first_operand_dim(rule, static_cast<int>(f));
    if (index.input < 0) continue;
    index.write = !rule.leaves_partials(static_cast<int>(f));
    if (!node.op().windowed_kernel) {
      throw Error(fmt::format("internal: {} has an indexed dim but no windowed kernel", node.op().full_name()));
    }
    const Value* source = node.inputs()[static_cast<std::size_t>(index.input)];
    if (reason.empty() && !index.write) {
      reason = fmt::format(
          "{} looks up dim {} of %{}, sharded on {} by {}: each device gives the rows its shard "
          "holds and zeros for the others",
          node_text(node), index.dim, source->name(), builder_.axes_text(factor_axes[f]),
          origin_text(source, index.dim));
    }
  }
  return index;
}

void Partitioner::count_addend_once(LocalValue& addend, const std::vector<int>& partial_axes) {
  Instruction once = rewriting(addend, InstructionKind::kCountOnce);
  once.axes_before = partial_axes;
  std::sort(once.axes_before.begin(), once.axes_before.end());
  builder_.emit(std::move(once));
}

void Partitioner::emit_local_op(const Node& node, const OpPlanInputs& inputs,
                                const std::vector<std::vector<int>>& factor_axes, const std::vector<LocalValue>& local,
                                const PartialResult& partial, const ShardedIndex& index, double scale) {
  const OpDef& op = node.op();
  Instruction compute;
  compute.kind = InstructionKind::kCompute;
  compute.op = &op;
  std::vector<BoundArg> local_args = inputs.args.all();
  compute.scale = scale;
  if (index.input >= 0) {
    const auto input = static_cast<std::size_t>(index.input);
    compute.indexed_input = index.input;
    compute.indexed_write = index.write;
    compute.dim = index.dim;
    compute.global_size = node.inputs()[input]->type().shape[static_cast<std::size_t>(index.dim)];
    compute.axes_before = local[input].dims[static_cast<std::size_t>(index.dim)];
  }
  for (const LocalValue& rep : local) compute.inputs.push_back(rep.slot);
  std::vector<LocalValue> results;
  for (std::size_t r = 0; r < node.outputs().size(); ++r) {
    LocalValue rep = new_result(node, inputs.rule, r, factor_axes, partial.axes, partial.reduction);
    rep.unreduced_reason = partial.reason;
    compute.outputs.push_back(rep.slot);
    if (!op.output_shape_arg.empty()) {
      const int arg = op.schema.argument_index(op.output_shape_arg);
      local_args[static_cast<std::size_t>(arg)].constant =
          Constant(std::vector<int64_t>(builder_.slot_type(rep.slot).shape));
    }
    if (op.position_dependent) {
      compute.tile_axes = rep.dims;
      compute.global_shape = node.outputs()[r]->type().shape;
    }
    results.push_back(std::move(rep));
  }
  compute.args.emplace(op.schema, std::move(local_args));
  if (compute.scale == 1) {
    std::vector<TensorType> local_inputs, local_outputs;
    for (int slot : compute.inputs) local_inputs.push_back(builder_.slot_type(slot));
    for (int slot : compute.outputs) local_outputs.push_back(builder_.slot_type(slot));
    compute.reinterprets = reinterprets_operand(op, *compute.args, local_inputs, local_outputs);
  }
  builder_.emit(std::move(compute));
  for (std::size_t r = 0; r < node.outputs().size(); ++r) reps_[node.outputs()[r]] = results[r];
}

}  // namespace shardflow::partition_detail
