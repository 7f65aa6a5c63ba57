// A reshape that merges a dim split unevenly over mesh axes with the dims
// after it (f32[16,3,7,1000] with 7 rows over 2 devices, to
// f32[24,2,1,14,500]). The merged dim's even tiles (7 rows of 14) are not
// tiles of the operand's (4 and 3 rows of 7: 8 and 6 of 14), so no factor
// sharding computes it in place, and the default plan gathers the operand
// dim whole. Computed in the operand's tiles instead, each device holds 8
// rows of 14; a halo exchange (halo.h) then sends the one row device 1
// lacks, as XLA's partitioner does, when that costs less.
#include <fmt/format.h>

#include "partitioner_pass.h"

namespace shardflow::partition_detail {

namespace {

// Where the operand's one sharded dim goes: its axes, all on its last
// factor (any factors before it of size 1), which the axes do not divide
// and which begins result dim `result_dim` (after factors of size 1 only),
// whose other factors make `minor_rows` rows per row of it.
struct UnevenMerge {
  int operand_dim = -1, result_dim = -1;
  int64_t factor_size = 0, minor_rows = 1;
};

std::optional<UnevenMerge> uneven_merge(const Mesh& mesh, const OpShardingRule& rule, const DimAxes& operand) {
  UnevenMerge merge;
  for (std::size_t d = 0; d < operand.size(); ++d) {
    if (operand[d].empty()) continue;
    if (merge.operand_dim >= 0) return std::nullopt;  // one sharded dim only
    merge.operand_dim = static_cast<int>(d);
  }
  if (merge.operand_dim < 0) return std::nullopt;
  const std::vector<int>& factors = rule.operands[0][static_cast<std::size_t>(merge.operand_dim)];
  if (factors.empty()) return std::nullopt;
  const int f = factors.back();
  const auto size = [&](int factor) { return rule.factors[static_cast<std::size_t>(factor)].size; };
  if (std::any_of(factors.begin(), factors.end() - 1, [&](int g) { return size(g) != 1; })) return std::nullopt;
  if (rule.factors[static_cast<std::size_t>(f)].kind != FactorKind::kPassThrough) return std::nullopt;
  merge.factor_size = size(f);
  if (merge.factor_size % axes_size(mesh, operand[static_cast<std::size_t>(merge.operand_dim)]) == 0) {
    return std::nullopt;
  }  // even: the default plan computes it in place
  for (std::size_t e = 0; e < rule.results[0].size(); ++e) {
    const std::vector<int>& dim = rule.results[0][e];
    const auto at = std::find(dim.begin(), dim.end(), f);
    if (at == dim.end()) continue;
    if (std::any_of(dim.begin(), at, [&](int g) { return size(g) != 1; })) return std::nullopt;
    merge.result_dim = static_cast<int>(e);
    for (auto g = at + 1; g != dim.end(); ++g) merge.minor_rows *= size(*g);
    if (merge.minor_rows == 0) return std::nullopt;  // an empty result: nothing to exchange
    return merge;
  }
  return std::nullopt;
}

}  // namespace

bool Partitioner::lower_in_operand_tiles(const Node& node, const OpPlanInputs& inputs,
                                         const std::vector<const LocalValue*>& current) {
  const OpDef& op = node.op();
  if (op.output_shape_arg.empty() || node.inputs().size() != 1 || node.outputs().size() != 1) return false;
  const LocalValue& operand = *current[0];
  if (!operand.unreduced.empty()) return false;
  const std::optional<UnevenMerge> merge = uneven_merge(mesh_, inputs.rule, operand.dims);
  if (!merge) return false;
  const Value* output = node.output();
  const TensorType& type = output->type();
  const auto e = static_cast<std::size_t>(merge->result_dim);
  LocalValue result;
  result.dims.resize(type.shape.size());
  result.dims[e] = operand.dims[static_cast<std::size_t>(merge->operand_dim)];
  Shape local = type.shape;
  local[e] = ceil_div(merge->factor_size, builder_.axes_size(result.dims[e])) * merge->minor_rows;
  if (numel(local) != numel(builder_.slot_type(operand.slot).shape)) return false;

  const auto emit = [&] {
    LocalValue made = result;
    made.slot = builder_.new_slot({type.dtype, local});
    std::vector<BoundArg> local_args = inputs.args.all();
    local_args[static_cast<std::size_t>(op.schema.argument_index(op.output_shape_arg))].constant =
        Constant(std::vector<int64_t>(local));
    Instruction compute;
    compute.kind = InstructionKind::kCompute;
    compute.op = &op;
    compute.inputs = {operand.slot};
    compute.outputs = {made.slot};
    compute.args.emplace(op.schema, std::move(local_args));
    const TensorType local_in = builder_.slot_type(operand.slot), local_out = builder_.slot_type(made.slot);
    compute.reinterprets = reinterprets_operand(op, *compute.args, {&local_in, 1}, {&local_out, 1});
    builder_.emit(std::move(compute));
    const ReshardReason why{output, node_text(node), [this, &node, merge](int) {
                              return fmt::format("from dim {} of %{}, sharded by {}", merge->operand_dim,
                                                 node.inputs()[0]->name(),
                                                 origin_text(node.inputs()[0], merge->operand_dim));
                            }};
    return even_tiles(builder_, made, merge->result_dim, type.shape, type.dtype, why);
  };
  // Against the default plan, both with the result moved to the layout
  // propagation gave it.
  double default_cost = 0;
  factors_of_cheapest_plan(node, inputs, current, false, OperandMoves::kFromCurrent, &default_cost);
  const ProgramBuilder::Mark mark = builder_.mark();
  const DimAxes wanted = effective_axes(mesh_, shardings_.sharding(output));
  const LocalValue trial = emit();
  const ReshardReason trial_why{output, "", [](int) { return std::string(); }};
  if (trial.dims != wanted) partition_detail::emit_reshard(builder_, trial, wanted, type.shape, type.dtype, trial_why);
  const double cost = builder_.cost_since(mark);
  builder_.rollback(mark);
  if (cost >= default_cost) return false;
  reps_[output] = emit();
  return true;
}

}  // namespace shardflow::partition_detail
