// The partitioner's pass over one graph, in two files: partitioner.cc walks
// the graph and lowers each op (which factors are sharded, which partial
// sums stay partial, which plan costs least); value_moves.cc moves values
// between layouts for their uses (annotations, ops, outputs), sharing a
// partial sum's reduction among them and moving early for later
// annotations.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "partitioner.h"
#include "shardflow/ir/graph.h"
#include "shardflow/propagation/propagation.h"

namespace shardflow::partition_detail {

class Partitioner {
 public:
  Partitioner(const Graph& graph, const PropagationResult& shardings, PartitionedProgram& program)
      : graph_(graph), shardings_(shardings), mesh_(*shardings.mesh()), builder_(program, mesh_), program_(program) {}

  void run();

 private:
  std::string node_text(const Node& node) const;

  std::string origin_text(const Value* value, int dim) const;

  // An annotation's result holds its input's values: both have one root.
  const Value* alias_root(const Value* value) const;

  // A layout the same values are wanted in after the current move, and
  // the use that wants it ("the annotation at %c").
  struct LaterUse {
    DimAxes dims;
    std::string use;
  };

  // Emits the moves of graph value `value` to `target` for `consumer`
  // (emit_reshard, from a layout made so far). The same values wanted in a
  // layout they already have somewhere are not moved again: q, k and v
  // projections of one normalised input share one reshard, and so do an
  // annotation's result and its input (or another annotation of it).
  // Otherwise the move starts from whichever layout made so far sends the
  // fewest bytes: a whole copy made inside an earlier gather-then-slice is
  // sliced, not gathered again.
  LocalValue move_value_for_use(const Value* value, const DimAxes& target, std::string consumer,
                                const std::vector<LaterUse>& later = {});

  // "the annotation at %c, %q aten::neg": the uses of `value` other than
  // `consumer`, as collective reasons name them.
  std::string other_uses_text(const Value* value, const std::string& consumer) const;

  std::string use_text(const Node& user) const;

  const std::vector<const Node*>& users_of(const Value* value) const;

  // The moves of `moves` up to the one that leaves no partial sums.
  static std::vector<partition_detail::LayoutMove> reduction_prefix(
      const std::vector<partition_detail::LayoutMove>& moves, std::size_t partial_axes);

  // What op use `user` of `value` costs with `value` as `reduced`: the plan
  // lower_op would choose and its moves (plan_cost); nullopt while another
  // operand is not lowered yet.
  std::optional<double> use_cost(const Node& user, const Value* value, const LocalValue& reduced);

  // Emits the reduction of a partial sum that several uses share (or whose
  // result later annotations want in other layouts), into the layout from
  // which all of them together are reached for least. Candidates: the
  // reductions on the cheapest ways to each use's layout (an annotation's,
  // a later annotation's or an output's own; for another op, the value's
  // propagated layout), searched freely and with a scatter over all
  // partial axes only (ReshardReason::reduction_shared). Each is emitted
  // with every use after it, costed and rolled back: an annotation or
  // output by its move, an op by the plan lower_op would choose (which may
  // compute it in the reduced layout and move its smaller result instead).
  // The reduction's result and the layouts made on the way are recorded,
  // so each use starts from them. Nothing is emitted when the search gives
  // up (too many axes): the fallback's rule then holds.
  void reduce_for_all_uses(const Value* value, const LocalValue& rep, const DimAxes& target, const ReshardReason& why,
                           const std::vector<LaterUse>& later);

  // The layout each of `targets` slices its tiles from: every dim keeps the
  // axes `from` and all targets begin with. Gathered once, it can serve
  // uses that would each need a collective of their own (a halo exchange
  // to each of two finer tilings). nullopt when that is `from` or a target.
  static std::optional<DimAxes> shared_prefix_layout(const DimAxes& from, const std::vector<DimAxes>& targets);

  // The cheapest moves to `target` from `rep` (when given) or any layout of
  // `root` made so far; nullopt when the search gives up.
  struct MovesFrom {
    const LocalValue* source;
    std::vector<partition_detail::LayoutMove> moves;
  };
  std::optional<MovesFrom> cheapest_from_made(const Value* root, const LocalValue* rep, const DimAxes& target,
                                              const TensorType& type) const;

  // Emits the cheapest moves to `target` from any of `made` (layouts of one
  // value made so far, none partial) and appends the layouts they make;
  // false, emitting nothing, when the search gives up.
  bool move_from(std::vector<LocalValue>& made, const DimAxes& target, const TensorType& type,
                 const ReshardReason& why);

  // The cost of moving `root`'s values to each of `targets` in turn, each
  // from the cheapest layout made before it (those of the trial included).
  // Emitted and rolled back.
  double moves_cost(const Value* value, const std::vector<DimAxes>& targets, const ReshardReason& why);

  // Values wanted in `target` now and in `later` layouts next are first
  // moved to one of those when that makes all of them together cheaper:
  // (('a', 'b'),) then ('a',) of rows gathered over 'c' is one gather to
  // whole rows and two slices, where the cheapest way to (('a', 'b'),)
  // alone (a slice and a permute) leaves ('a',) another gather.
  void move_for_later(const Value* value, const DimAxes& target, const std::vector<LaterUse>& later,
                      const ReshardReason& why);

  // The layouts annotations want `value` in, other than `own`: its
  // annotations, theirs, and so on (breadth first, at most
  // kMaxLaterLayouts), with the uses that want them; `skip` is not counted.
  static constexpr std::size_t kMaxLaterLayouts = 3;
  void add_annotations_ahead(const Value* value, const DimAxes& own, const Node* skip,
                             std::vector<LaterUse>& later) const;

  void add_later_use(const Node& annotation, const DimAxes& own, const Node* skip, std::vector<LaterUse>& later) const;

  // The layouts the values of an annotation's result are wanted in next,
  // other than its own: annotations of the result (and of those, in turn),
  // then later annotations of its input.
  std::vector<LaterUse> later_uses(const Node& annotation) const;

  void lower_annotation(const Node& node);

  // Whether every value of `from` is exactly a value of `to`.
  static bool holds_exactly(DType from, DType to);

  // Whether operand `index` may stay a partial sum through this op.
  static bool keeps_partial(const Node& node, const std::vector<const LocalValue*>& operands, std::size_t index);

  // Whether a partial sum's reduction, made for a consumer that wants
  // `target`, serves other uses that may want another layout. Annotations
  // and graph outputs say what they want; other ops might want anything.
  bool reduction_shared(const Value* value, const DimAxes& target) const;

  // Whether `value` has a use other than `node` (a graph output counts).
  // Carried partial through several uses, it would be reduced once on each
  // path; reduced here, once, every use shares that reduction.
  bool used_elsewhere(const Value* value, const Node& node) const;

  // Whether the partial operands of `node` stay partial through it: the op
  // allows it for each, and none is used elsewhere. Otherwise all are
  // reduced here: an add of partial sums needs all or none of them partial
  // (an i64 part that cannot stay partial in an f32 result, reduced, would
  // be added once per device to the f32 parts).
  bool partials_stay(const Node& node, const std::vector<const LocalValue*>& operands) const;

  // The mesh axes the sharded reduction factors leave partial sums over,
  // and (in `reduction`) how those sums combine.
  static std::vector<int> sharded_reduction_axes(const OpShardingRule& rule,
                                                 const std::vector<std::vector<int>>& factor_axes, ReduceOp& reduction);

  // Result r of `node` as the factor shardings lay it out, in a new slot.
  LocalValue new_result(const Node& node, const OpShardingRule& rule, std::size_t r,
                        const std::vector<std::vector<int>>& factor_axes, const std::vector<int>& partial_axes,
                        ReduceOp reduction);

  // How plan_cost moves an operand: from its current layout (how lower_op
  // compares plans), or from whichever layout made so far costs least (how
  // move_value_for_use then moves it). Comparing plans the second way finds
  // plans that are cheaper one op at a time but dearer for the ops after
  // them: LLaMA's decode step on a 2,2,2 mesh took one collective more.
  enum class OperandMoves { kFromCurrent, kFromMadeLayouts };

  // The cost (ProgramBuilder::cost_since) of computing `node` with these
  // factor shardings: its operands moved to them, its results moved to the
  // layouts propagation gave them. Emitted and rolled back.
  double plan_cost(const Node& node, const OpShardingRule& rule, const std::vector<const LocalValue*>& current,
                   bool partials_kept, const std::vector<std::vector<int>>& factor_axes, OperandMoves operand_moves);

  // An op's sharding rule and the operand it adds once (linear's bias, or -1).
  struct OpPlanInputs {
    OpArgs args;  // bound to the global shapes
    OpShardingRule rule;
    int addend = -1;
  };
  static OpPlanInputs plan_inputs(const Node& node);

  // Settles `current`, an op's operands as they are, for choosing its plan:
  // a partial operand reduced here, whose reduction another consumer
  // already made, is that reduced copy and offers that copy's layout.
  // Returns whether the partial operands stay partial (partials_stay).
  bool settle_operands(const Node& node, std::vector<const LocalValue*>& current) const;

  // The factor shardings of `node` with its operands as `current`, under
  // whichever FactorPlan costs least (factors_for_plan gives each plan's).
  // An op whose results are wanted in another layout than its operands have
  // is computed where moving costs least: in the results' layout filled in
  // by the operands' (the default), in the operands' alone (moving the
  // smaller results: a sum that shrinks its input 4x), or in the results'
  // alone (gathering a smaller operand rather than a larger result). `cost`,
  // when given, gets the chosen plan's plan_cost.
  std::vector<std::vector<int>> factors_of_cheapest_plan(const Node& node, const OpPlanInputs& inputs,
                                                         const std::vector<const LocalValue*>& current,
                                                         bool partials_kept, OperandMoves operand_moves, double* cost);

  // Lowers one op (lower_op.cc): its factor shardings, its operands moved
  // to them, padding masked, the local op.
  void lower_op(const Node& node);

  // Step 2: the operands moved to the layouts the factor shardings ask for
  // (partial sums kept partial where `partials_kept`).
  std::vector<LocalValue> operands_in_layout(const Node& node, const OpShardingRule& rule,
                                             const std::vector<std::vector<int>>& factor_axes,
                                             const std::vector<const LocalValue*>& current, bool partials_kept);

  // Step 3: overwrites the padding of each sharded dim the op reduces with
  // the reduction's identity, and says in `reason` what leaves partial sums;
  // returns the factor that corrects an average over a padded dim.
  double mask_reduced_padding(const Node& node, const OpShardingRule& rule,
                              const std::vector<std::vector<int>>& factor_axes, std::vector<LocalValue>& local,
                              std::string& reason);

  // Step 3 for an op that divides by an integer operand: the padding of
  // its shards holds ones, not the zeros that would be an error.
  void mask_divisor_padding(const Node& node, const OpArgs& args, std::vector<LocalValue>& local);
  // Overwrites the padding of `operand`'s dim (of global `size`) with
  // `fill`, where its shards are padded.
  void mask_padding(LocalValue& operand, int dim, int64_t size, double fill);
  // An instruction of `kind` from `value`'s slot to a new slot of the same
  // type, which `value` then names (the caller sets the kind's fields).
  Instruction rewriting(LocalValue& value, InstructionKind kind);

  // A lookup (or write) in the shards of an indexed dim: each device gives
  // the rows its shard holds and zeros for the others (writes the rows it
  // holds). input < 0: none.
  struct ShardedIndex {
    int input = -1, dim = 0;
    bool write = false;
  };
  ShardedIndex sharded_index(const Node& node, const OpShardingRule& rule,
                             const std::vector<std::vector<int>>& factor_axes, std::string& reason) const;

  // The addend (linear's bias) joins one partial sum of each reduction
  // group: every other device adds zeros.
  void count_addend_once(LocalValue& addend, const std::vector<int>& partial_axes);

  // What the local op leaves partial, and why.
  struct PartialResult {
    std::vector<int> axes;
    ReduceOp reduction = ReduceOp::kSum;
    std::string reason;
  };

  // Step 4: the op's kernel on the local shards, its shape arguments local.
  void emit_local_op(const Node& node, const OpPlanInputs& inputs, const std::vector<std::vector<int>>& factor_axes,
                     const std::vector<LocalValue>& local, const PartialResult& partial, const ShardedIndex& index,
                     double scale);

  // A reshape merging a dim split unevenly with the dims after it, computed
  // in the operand's tiles and moved to even tiles by a halo exchange, when
  // that costs less than the default plan (reshape_tiles.cc). Returns
  // whether it lowered `node`.
  bool lower_in_operand_tiles(const Node& node, const OpPlanInputs& inputs,
                              const std::vector<const LocalValue*>& current);

  const Graph& graph_;
  const PropagationResult& shardings_;
  const Mesh& mesh_;
  ProgramBuilder builder_;
  PartitionedProgram& program_;
  std::unordered_map<const Value*, LocalValue> reps_;
  // Representations made so far of each root's values, by layout (none partial).
  std::map<std::pair<const Value*, DimAxes>, LocalValue> layouts_;
  std::unordered_map<const Value*, const Value*> alias_roots_;
  std::unordered_map<const Value*, LocalValue> reduced_;  // a partial sum's first reduced copy, by root
  std::unordered_map<const Value*, std::vector<const Node*>> users_;
  std::unordered_set<const Value*> returned_;  // graph outputs
};

}  // namespace shardflow::partition_detail
