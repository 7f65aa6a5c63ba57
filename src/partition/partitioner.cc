// The SPMD partitioner: one local program for all devices.
//
// For each op, in graph order:
//  1. settle how its factors are sharded (factors.cc): a factor the result
//     has takes the result's axes (propagation chose them); other factors
//     (contracted or reduced dims) take their operands' axes where those are
//     free; factors that need replication take none. When computing in the
//     operands' layout and moving the results costs less, that wins;
//  2. reshard every operand whose layout differs from what the factors ask
//     (reshard.cc), except that partial sums may stay partial through ops
//     that are linear in them;
//  3. overwrite padding with the reduction's identity where a sharded dim is
//     reduced or contracted and does not divide evenly, and keep an addend
//     (linear's bias) on one device of each group the contraction spans;
//  4. run the op's kernel on the local shards (shape arguments rewritten to
//     local shapes); a sharded contraction leaves a partial sum over its axes.
// Graph outputs are reduced and laid out as propagation said.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "partitioner.h"
#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/mark_sharding.h"

namespace shardflow {

using partition_detail::choose_factors;
using partition_detail::DimAxes;
using partition_detail::effective_axes;
using partition_detail::FactorChoice;
using partition_detail::FactorPlan;
using partition_detail::padded_shape;
using partition_detail::project_back;
using partition_detail::ProgramBuilder;
using partition_detail::Rep;
using partition_detail::ReshardWhy;

Shape local_shape(const Shape& global, const Sharding& sharding) {
  return padded_shape(sharding.mesh(), global, sharding.all_dim_axes());
}

namespace {

class Partitioner {
 public:
  Partitioner(const Graph& graph, const PropagationResult& shardings, PartitionedProgram& program)
      : graph_(graph), shardings_(shardings), mesh_(*shardings.mesh()), builder_(program, mesh_),
        program_(program) {}

  void run() {
    for (const auto& node : graph_.nodes()) {
      for (const Value* input : node->inputs()) {
        std::vector<const Node*>& users = users_[input];
        if (users.empty() || users.back() != node.get()) users.push_back(node.get());  // mul(%p, %p) is one user
      }
    }
    for (const Value* output : graph_.outputs()) returned_.insert(output);
    for (const Value* input : graph_.inputs()) {
      const Sharding& sharding = shardings_.sharding(input);
      Rep rep;
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
      const Rep rep = reshard_value(output, effective_axes(mesh_, sharding), fmt::format("output {}", i));
      program_.output_slots.push_back(rep.slot);
      program_.output_shardings.push_back(sharding);
      program_.output_types.push_back(output->type());
    }
  }

 private:
  std::string node_text(const Node& node) const {
    return fmt::format("%{} {}", node.outputs().empty() ? "?" : node.output()->name(), node.op().full_name());
  }

  std::string origin_text(const Value* value, int dim) const {
    const ShardingOrigin& origin = shardings_.origin(value, dim);
    const auto rep = reps_.find(value);
    const bool as_propagated = rep == reps_.end() || rep->second.dims[static_cast<std::size_t>(dim)] ==
                                                         effective_axes(mesh_, shardings_.sharding(value))[static_cast<std::size_t>(dim)];
    if ((origin.source != nullptr && as_propagated) || value->producer() == nullptr) return origin.describe();
    // Propagation left the dim whole or gave it other axes; the partitioner
    // kept the producer's operands' layout because that moved fewer bytes.
    return fmt::format("%{} {}, computed in its operands' layout", value->name(),
                       value->producer()->op().full_name());
  }

  // An annotation's result holds its input's values: both have one root.
  const Value* alias_root(const Value* value) const {
    const auto found = alias_roots_.find(value);
    return found == alias_roots_.end() ? value : found->second;
  }

  // A layout the same values are wanted in after the current move, and
  // the use that wants it ("the annotation at %c").
  struct LaterUse {
    DimAxes dims;
    std::string use;
  };

  // The same values wanted in a layout they already have somewhere are not
  // moved again: q, k and v projections of one normalised input share one
  // reshard, and so do an annotation's result and its input (or another
  // annotation of it). Otherwise the move starts from whichever layout made
  // so far sends the fewest bytes: a whole copy made inside an earlier
  // gather-then-slice is sliced, not gathered again.
  Rep reshard_value(const Value* value, const DimAxes& target, std::string consumer,
                    const std::vector<LaterUse>& later = {}) {
    const Rep& rep = reps_.at(value);
    if (rep.dims == target && rep.unreduced.empty()) return rep;
    const Value* root = alias_root(value);
    if (rep.unreduced.empty()) layouts_.emplace(std::make_pair(root, rep.dims), rep);
    if (auto found = layouts_.find({root, target}); found != layouts_.end()) return found->second;
    ReshardWhy why;
    why.value = value;
    why.consumer = std::move(consumer);
    why.origin = [this, value](int dim) { return origin_text(value, dim); };
    why.reduction_shared = reduction_shared(value, target);
    if (!rep.unreduced.empty() && (why.reduction_shared || !later.empty()) && !reduced_.contains(root)) {
      reduce_for_all_uses(value, rep, target, why, later);
    } else if (!later.empty() && rep.unreduced.empty()) {
      move_for_later(value, target, later, why);
    }
    // A partial sum already reduced for another consumer is not reduced
    // again: it is moved from a layout made of the reduction's result, so
    // every consumer sees the same sums.
    const Rep* source = &rep;
    std::optional<MovesFrom> found;
    if (rep.unreduced.empty() || reduced_.contains(root)) {
      found = cheapest_from_made(root, nullptr, target, value->type());
      if (found) {
        source = found->source;
      } else if (!rep.unreduced.empty()) {
        source = &reduced_.at(root);  // too many axes to search: the first reduced copy
      }
    }
    std::vector<Rep> made;
    Rep result = partition_detail::reshard(builder_, *source, target, value->type().shape, value->type().dtype, why,
                                           &made, found ? &found->moves : nullptr);
    if (!source->unreduced.empty() && !made.empty()) reduced_.emplace(root, made.front());
    for (const Rep& layout : made) layouts_.emplace(std::make_pair(root, layout.dims), layout);
    return result;
  }

  // "the annotation at %c, %q aten::neg": the uses of `value` other than
  // `consumer`, as collective reasons name them.
  std::string other_uses_text(const Value* value, const std::string& consumer) const {
    std::vector<std::string> uses;
    const auto add = [&](std::string use) {
      if (use != consumer && std::find(uses.begin(), uses.end(), use) == uses.end()) uses.push_back(std::move(use));
    };
    for (const Node* user : users_of(value)) add(use_text(*user));
    for (std::size_t i = 0; i < graph_.outputs().size(); ++i) {
      if (graph_.outputs()[i] == value) add(fmt::format("output {}", i));
    }
    return fmt::format("{}", fmt::join(uses, ", "));
  }

  std::string use_text(const Node& user) const {
    if (user.op().full_name() != ops::kMarkShardingOp) return node_text(user);
    return fmt::format("the annotation at %{}", user.output()->name());
  }

  const std::vector<const Node*>& users_of(const Value* value) const {
    static const std::vector<const Node*> none;
    const auto found = users_.find(value);
    return found == users_.end() ? none : found->second;
  }

  // The moves of `moves` up to the one that leaves no partial sums.
  static std::vector<partition_detail::LayoutMove> reduction_prefix(
      const std::vector<partition_detail::LayoutMove>& moves, std::size_t partial_axes) {
    std::vector<partition_detail::LayoutMove> prefix;
    std::size_t reduced = 0;
    for (const partition_detail::LayoutMove& move : moves) {
      prefix.push_back(move);
      reduced += move.reduced.size();
      if (reduced == partial_axes) break;
    }
    return prefix;
  }

  // What op use `user` of `value` costs with `value` as `reduced`: the plan
  // lower_op would choose and its moves (plan_cost); nullopt while another
  // operand is not lowered yet.
  std::optional<double> use_cost(const Node& user, const Value* value, const Rep& reduced) {
    std::vector<const Rep*> current;
    for (const Value* operand : user.inputs()) {
      const auto found = reps_.find(operand);
      if (operand != value && found == reps_.end()) return std::nullopt;
      current.push_back(operand == value ? &reduced : &found->second);
    }
    const OpPlanInputs inputs = plan_inputs(user);
    const bool partials_kept = settle_operands(user, current);
    double cost = 0;
    chosen_factors(user, inputs, current, partials_kept, OperandMoves::kFromMadeLayouts, &cost);
    return cost;
  }

  // Emits the reduction of a partial sum that several uses share (or whose
  // result later annotations want in other layouts), into the layout from
  // which all of them together are reached for least. Candidates: the
  // reductions on the cheapest ways to each use's layout (an annotation's,
  // a later annotation's or an output's own; for another op, the value's
  // propagated layout), searched freely and with a scatter over all
  // partial axes only (ReshardWhy::reduction_shared). Each is emitted with
  // every use after it, costed and rolled back: an annotation or output by
  // its move, an op by the plan lower_op would choose (which may compute it
  // in the reduced layout and move its smaller result instead). The
  // reduction's result and the layouts made on the way are recorded, so
  // each use starts from them. Nothing is emitted when the search gives up
  // (too many axes): the fallback's rule then holds.
  void reduce_for_all_uses(const Value* value, const Rep& rep, const DimAxes& target, const ReshardWhy& why,
                           const std::vector<LaterUse>& later) {
    using partition_detail::cheapest_moves;
    using partition_detail::LayoutMove;
    const TensorType& type = value->type();
    const DimAxes propagated = effective_axes(mesh_, shardings_.sharding(value));
    const Value* root = alias_root(value);
    // Layouts uses want (the consumer's first), and the op uses costed by
    // their plan.
    std::vector<DimAxes> targets{target};
    std::vector<const Node*> op_uses;
    const auto add_target = [&](DimAxes dims) {
      if (std::find(targets.begin(), targets.end(), dims) == targets.end()) targets.push_back(std::move(dims));
    };
    if (returned_.contains(value)) add_target(propagated);
    for (const LaterUse& use : later) add_target(use.dims);
    for (const Node* user : users_of(value)) {
      if (use_text(*user) == why.consumer) continue;
      if (user->op().full_name() == ops::kMarkShardingOp) {
        add_target(effective_axes(mesh_, shardings_.sharding(user->output())));
      } else {
        op_uses.push_back(user);
      }
    }
    std::vector<DimAxes> seeds = targets;
    if (!op_uses.empty() && std::find(seeds.begin(), seeds.end(), propagated) == seeds.end()) seeds.push_back(propagated);

    std::vector<std::vector<LayoutMove>> candidates;
    for (const bool shared : {true, false}) {
      for (const DimAxes& t : seeds) {
        const auto found = cheapest_moves(mesh_, type.shape, type.dtype, {rep.dims}, t, rep.unreduced, shared);
        if (!found) continue;
        std::vector<LayoutMove> prefix = reduction_prefix(found->moves, rep.unreduced.size());
        if (std::find(candidates.begin(), candidates.end(), prefix) == candidates.end()) {
          candidates.push_back(std::move(prefix));
        }
      }
    }
    if (candidates.empty()) return;
    ReshardWhy shared_why = why;
    if (const std::string others = other_uses_text(value, why.consumer); !others.empty()) {
      shared_why.consumer = fmt::format("{} (and {}, sharing the reduction)", why.consumer, others);
    }
    const auto emit_reduction = [&](const std::vector<LayoutMove>& prefix, std::vector<Rep>& made) {
      partition_detail::reshard(builder_, rep, prefix.back().after, type.shape, type.dtype, shared_why, &made, &prefix);
    };
    std::size_t best = 0;
    if (candidates.size() > 1) {
      double least = std::numeric_limits<double>::infinity();
      for (std::size_t c = 0; c < candidates.size(); ++c) {
        const ProgramBuilder::Mark mark = builder_.mark();
        std::vector<Rep> made;
        emit_reduction(candidates[c], made);
        const auto move_to = [&](const DimAxes& t) {
          if (!move_from(made, t, type, why)) {
            partition_detail::reshard(builder_, made.front(), t, type.shape, type.dtype, why, &made);
          }
        };
        for (const DimAxes& t : targets) move_to(t);
        // Op uses find the layouts made so far, as they will when lowered.
        std::vector<std::pair<const Value*, DimAxes>> added;
        for (const Rep& layout : made) {
          if (layouts_.emplace(std::make_pair(root, layout.dims), layout).second) added.emplace_back(root, layout.dims);
        }
        double cost = 0;
        bool moved_to_propagated = false;
        for (const Node* user : op_uses) {
          if (const std::optional<double> use = use_cost(*user, value, made.front())) {
            cost += *use;
          } else if (!moved_to_propagated && std::find(targets.begin(), targets.end(), propagated) == targets.end()) {
            move_to(propagated);
            moved_to_propagated = true;
          }
        }
        for (const auto& key : added) layouts_.erase(key);
        cost += builder_.cost_since(mark);
        builder_.rollback(mark);
        if (cost < least) {
          least = cost;
          best = c;
        }
      }
    }
    std::vector<Rep> made;
    emit_reduction(candidates[best], made);
    reduced_.emplace(root, made.front());
    for (const Rep& layout : made) layouts_.emplace(std::make_pair(root, layout.dims), layout);
  }

  // The cheapest moves to `target` from `rep` (when given) or any layout of
  // `root` made so far; nullopt when the search gives up.
  struct MovesFrom {
    const Rep* source;
    std::vector<partition_detail::LayoutMove> moves;
  };
  std::optional<MovesFrom> cheapest_from_made(const Value* root, const Rep* rep, const DimAxes& target,
                                              const TensorType& type) const {
    std::vector<const Rep*> sources;
    std::vector<DimAxes> layouts;
    if (rep != nullptr) {
      sources.push_back(rep);
      layouts.push_back(rep->dims);
    }
    for (auto it = layouts_.lower_bound({root, DimAxes{}}); it != layouts_.end() && it->first.first == root; ++it) {
      sources.push_back(&it->second);
      layouts.push_back(it->second.dims);
    }
    std::optional<partition_detail::CheapestMoves> found =
        partition_detail::cheapest_moves(mesh_, type.shape, type.dtype, layouts, target);
    if (!found) return std::nullopt;
    return MovesFrom{sources[found->source], std::move(found->moves)};
  }

  // Emits the cheapest moves to `target` from any of `made` (layouts of one
  // value made so far, none partial) and appends the layouts they make;
  // false, emitting nothing, when the search gives up.
  bool move_from(std::vector<Rep>& made, const DimAxes& target, const TensorType& type, const ReshardWhy& why) {
    std::vector<DimAxes> layouts;
    for (const Rep& layout : made) layouts.push_back(layout.dims);
    const std::optional<partition_detail::CheapestMoves> found =
        partition_detail::cheapest_moves(mesh_, type.shape, type.dtype, layouts, target);
    if (!found) return false;
    const Rep from = made[found->source];  // `made` grows below
    partition_detail::reshard(builder_, from, target, type.shape, type.dtype, why, &made, &found->moves);
    return true;
  }

  // The cost of moving `root`'s values to each of `targets` in turn, each
  // from the cheapest layout made before it (those of the trial included).
  // Emitted and rolled back.
  double moves_cost(const Value* value, const std::vector<DimAxes>& targets, const ReshardWhy& why) {
    const Value* root = alias_root(value);
    const TensorType& type = value->type();
    const ProgramBuilder::Mark mark = builder_.mark();
    std::vector<std::pair<const Value*, DimAxes>> added;
    for (const DimAxes& t : targets) {
      if (layouts_.contains({root, t})) continue;
      const std::optional<MovesFrom> found = cheapest_from_made(root, nullptr, t, type);
      if (!found) continue;  // too many axes to search: not told apart
      std::vector<Rep> made;
      partition_detail::reshard(builder_, *found->source, t, type.shape, type.dtype, why, &made, &found->moves);
      for (const Rep& layout : made) {
        if (layouts_.emplace(std::make_pair(root, layout.dims), layout).second) added.emplace_back(root, layout.dims);
      }
    }
    for (const auto& key : added) layouts_.erase(key);
    const double cost = builder_.cost_since(mark);
    builder_.rollback(mark);
    return cost;
  }

  // Values wanted in `target` now and in `later` layouts next are first
  // moved to one of those when that makes all of them together cheaper:
  // (('a', 'b'),) then ('a',) of rows gathered over 'c' is one gather to
  // whole rows and two slices, where the cheapest way to (('a', 'b'),)
  // alone (a slice and a permute) leaves ('a',) another gather.
  void move_for_later(const Value* value, const DimAxes& target, const std::vector<LaterUse>& later,
                      const ReshardWhy& why) {
    std::vector<DimAxes> order{target};
    for (const LaterUse& use : later) order.push_back(use.dims);
    double least = moves_cost(value, order, why);
    std::size_t best = 0;  // 0: target first, else later[best - 1]
    for (std::size_t k = 0; k < later.size(); ++k) {
      std::vector<DimAxes> via{later[k].dims, target};
      for (std::size_t j = 0; j < later.size(); ++j) {
        if (j != k) via.push_back(later[j].dims);
      }
      const double cost = moves_cost(value, via, why);
      if (cost < least) {
        least = cost;
        best = k + 1;
      }
    }
    if (best == 0) return;
    // Made now for the later use, and recorded: that use takes it as is.
    const Value* root = alias_root(value);
    const TensorType& type = value->type();
    const LaterUse& first = later[best - 1];
    const std::optional<MovesFrom> found = cheapest_from_made(root, nullptr, first.dims, type);
    if (!found) return;
    ReshardWhy first_why = why;
    first_why.consumer = fmt::format("{} (moved here, before {}, as both then cost least)", first.use, why.consumer);
    std::vector<Rep> made;
    partition_detail::reshard(builder_, *found->source, first.dims, type.shape, type.dtype, first_why, &made,
                              &found->moves);
    for (const Rep& layout : made) layouts_.emplace(std::make_pair(root, layout.dims), layout);
  }

  // The layouts annotations want `value` in, other than `own`: its
  // annotations, theirs, and so on (breadth first, at most
  // kMaxLaterLayouts), with the uses that want them; `skip` is not counted.
  static constexpr std::size_t kMaxLaterLayouts = 3;
  void add_annotations_ahead(const Value* value, const DimAxes& own, const Node* skip,
                             std::vector<LaterUse>& later) const {
    std::vector<const Value*> results{value};
    for (std::size_t r = 0; r < results.size() && later.size() < kMaxLaterLayouts; ++r) {
      for (const Node* user : users_of(results[r])) {
        if (user->op().full_name() != ops::kMarkShardingOp) continue;
        add_later_use(*user, own, skip, later);
        results.push_back(user->output());
      }
    }
  }

  void add_later_use(const Node& annotation, const DimAxes& own, const Node* skip,
                     std::vector<LaterUse>& later) const {
    if (&annotation == skip || later.size() >= kMaxLaterLayouts) return;
    DimAxes dims = effective_axes(mesh_, shardings_.sharding(annotation.output()));
    const bool known = std::any_of(later.begin(), later.end(), [&](const LaterUse& use) { return use.dims == dims; });
    if (dims != own && !known) later.push_back({std::move(dims), use_text(annotation)});
  }

  // The layouts the values of an annotation's result are wanted in next,
  // other than its own: annotations of the result (and of those, in turn),
  // then later annotations of its input.
  std::vector<LaterUse> later_uses(const Node& annotation) const {
    const DimAxes own = effective_axes(mesh_, shardings_.sharding(annotation.output()));
    std::vector<LaterUse> later;
    add_annotations_ahead(annotation.output(), own, &annotation, later);
    const std::vector<const Node*>& siblings = users_of(annotation.inputs()[0]);
    for (auto it = std::find(siblings.begin(), siblings.end(), &annotation); it != siblings.end(); ++it) {
      if ((*it)->op().full_name() == ops::kMarkShardingOp) add_later_use(**it, own, &annotation, later);
    }
    return later;
  }

  void lower_annotation(const Node& node) {
    const Value* input = node.inputs()[0];
    const Value* output = node.output();
    reps_[output] = reshard_value(input, effective_axes(mesh_, shardings_.sharding(output)),
                                  fmt::format("the annotation at %{}", output->name()), later_uses(node));
    alias_roots_[output] = alias_root(input);
  }

  // Whether every value of `from` is exactly a value of `to`.
  static bool holds_exactly(DType from, DType to) {
    if (from == to || from == DType::kBool) return true;
    if (to == DType::kF32) return from == DType::kBF16 || from == DType::kF16;
    return to == DType::kI64 && from == DType::kI32;
  }

  // Whether operand `index` may stay a partial sum through this op.
  static bool keeps_partial(const Node& node, const std::vector<const Rep*>& operands, std::size_t index) {
    const Rep& rep = *operands[index];
    const auto partial = [](const Rep* r) { return !r->unreduced.empty(); };
    const auto same_partial = [&](const Rep* r) {
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
      if (arg.is_constant() && arg.constant().kind() == Constant::Kind::kFloat && !std::isfinite(arg.constant().as_float())) {
        return false;
      }
    }
    switch (node.op().linearity) {
      case Linearity::kNone: return false;
      case Linearity::kLinear: return operands.size() == 1;
      case Linearity::kAdditive: return std::all_of(operands.begin(), operands.end(), same_partial);
      case Linearity::kBilinear: return partial_count == 1;
    }
    return false;
  }

  // Whether a partial sum's reduction, made for a consumer that wants
  // `target`, serves other uses that may want another layout. Annotations
  // and graph outputs say what they want; other ops might want anything.
  bool reduction_shared(const Value* value, const DimAxes& target) const {
    const std::vector<const Node*>& users = users_of(value);
    if (!returned_.contains(value) && users.size() <= 1) return false;
    if (returned_.contains(value) && effective_axes(mesh_, shardings_.sharding(value)) != target) return true;
    return std::any_of(users.begin(), users.end(), [&](const Node* user) {
      return user->op().full_name() != ops::kMarkShardingOp ||
             effective_axes(mesh_, shardings_.sharding(user->output())) != target;
    });
  }

  // Whether `value` has a use other than `node` (a graph output counts).
  // Carried partial through several uses, it would be reduced once on each
  // path; reduced here, once, every use shares that reduction.
  bool used_elsewhere(const Value* value, const Node& node) const {
    if (returned_.contains(value)) return true;
    const auto found = users_.find(value);
    return found != users_.end() &&
           std::any_of(found->second.begin(), found->second.end(), [&](const Node* user) { return user != &node; });
  }

  // Whether the partial operands of `node` stay partial through it: the op
  // allows it for each, and none is used elsewhere. Otherwise all are
  // reduced here: an add of partial sums needs all or none of them partial
  // (an i64 part that cannot stay partial in an f32 result, reduced, would
  // be added once per device to the f32 parts).
  bool partials_stay(const Node& node, const std::vector<const Rep*>& operands) const {
    const std::vector<Value*> inputs = node.inputs();
    for (std::size_t o = 0; o < operands.size(); ++o) {
      if (operands[o]->unreduced.empty()) continue;
      if (!keeps_partial(node, operands, o) || used_elsewhere(inputs[o], node)) return false;
    }
    return true;
  }

  // The mesh axes the sharded reduction factors leave partial sums over,
  // and (in `reduction`) how those sums combine.
  static std::vector<int> sharded_reduction_axes(const OpShardingRule& rule,
                                                 const std::vector<std::vector<int>>& factor_axes, ReduceOp& reduction) {
    std::vector<int> axes;
    for (std::size_t f = 0; f < rule.factors.size(); ++f) {
      if (rule.factors[f].kind != FactorKind::kReduction || factor_axes[f].empty()) continue;
      reduction = rule.factors[f].reduction;
      axes.insert(axes.end(), factor_axes[f].begin(), factor_axes[f].end());
    }
    return axes;
  }

  // Result r of `node` as the factor shardings lay it out, in a new slot.
  Rep new_result(const Node& node, const OpShardingRule& rule, std::size_t r,
                 const std::vector<std::vector<int>>& factor_axes, const std::vector<int>& partial_axes,
                 ReduceOp reduction) {
    const TensorType& type = node.outputs()[r]->type();
    Rep rep;
    rep.dims = project_back(mesh_, rule, rule.results[r], factor_axes);
    rep.unreduced = partial_axes;
    rep.reduction = reduction;
    rep.slot = builder_.new_slot({type.dtype, padded_shape(mesh_, type.shape, rep.dims)});
    return rep;
  }

  // How plan_cost moves an operand: from its current layout (how lower_op
  // compares plans), or from whichever layout made so far costs least (how
  // reshard_value then moves it). Comparing plans the second way finds
  // plans that are cheaper one op at a time but dearer for the ops after
  // them: LLaMA's decode step on a 2,2,2 mesh took one collective more.
  enum class OperandMoves { kFromCurrent, kFromMadeLayouts };

  // The cost (ProgramBuilder::cost_since) of computing `node` with these
  // factor shardings: its operands moved to them, its results moved to the
  // layouts propagation gave them. Emitted and rolled back.
  double plan_cost(const Node& node, const OpShardingRule& rule, const std::vector<const Rep*>& current,
                   bool partials_kept, const std::vector<std::vector<int>>& factor_axes, OperandMoves operand_moves) {
    const ProgramBuilder::Mark mark = builder_.mark();
    const std::vector<Value*> operands = node.inputs();
    const ReshardWhy why{nullptr, "", [](int) { return std::string(); }};
    std::vector<int> partial_axes;
    ReduceOp reduction = ReduceOp::kSum;
    for (std::size_t o = 0; o < operands.size(); ++o) {
      const DimAxes wanted = project_back(mesh_, rule, rule.operands[o], factor_axes);
      const TensorType& type = operands[o]->type();
      Rep rep = *current[o];
      ReshardWhy operand_why = why;
      operand_why.value = operands[o];
      if (!rep.unreduced.empty() && partials_kept) {
        partial_axes.insert(partial_axes.end(), rep.unreduced.begin(), rep.unreduced.end());
        rep.unreduced.clear();
        if (rep.dims != wanted) partition_detail::reshard(builder_, rep, wanted, type.shape, type.dtype, operand_why);
      } else if ((rep.dims != wanted || !rep.unreduced.empty()) &&
                 !layouts_.contains({alias_root(operands[o]), wanted})) {
        const Value* root = alias_root(operands[o]);
        const std::optional<MovesFrom> found =
            operand_moves == OperandMoves::kFromMadeLayouts && (rep.unreduced.empty() || reduced_.contains(root))
                ? cheapest_from_made(root, rep.unreduced.empty() ? current[o] : nullptr, wanted, type)
                : std::nullopt;
        partition_detail::reshard(builder_, found ? *found->source : rep, wanted, type.shape, type.dtype, operand_why,
                                  nullptr, found ? &found->moves : nullptr);
      }
    }
    const std::vector<int> reduced = sharded_reduction_axes(rule, factor_axes, reduction);
    partial_axes.insert(partial_axes.end(), reduced.begin(), reduced.end());
    std::sort(partial_axes.begin(), partial_axes.end());
    partial_axes.erase(std::unique(partial_axes.begin(), partial_axes.end()), partial_axes.end());
    for (std::size_t r = 0; r < node.outputs().size(); ++r) {
      const Value* output = node.outputs()[r];
      const Rep rep = new_result(node, rule, r, factor_axes, partial_axes, reduction);
      const DimAxes wanted = effective_axes(mesh_, shardings_.sharding(output));
      ReshardWhy result_why = why;
      result_why.value = output;
      const TensorType& type = output->type();
      std::vector<Rep> made;
      if (rep.dims == wanted && rep.unreduced.empty()) {
        made.push_back(rep);
      } else {
        partition_detail::reshard(builder_, rep, wanted, type.shape, type.dtype, result_why, &made);
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

  // An op's sharding rule and the operand it adds once (linear's bias, or -1).
  struct OpPlanInputs {
    OpArgs args;  // bound to the global shapes
    OpShardingRule rule;
    int addend = -1;
  };
  static OpPlanInputs plan_inputs(const Node& node) {
    std::vector<TensorType> in_types, out_types;
    for (const Value* v : node.inputs()) in_types.push_back(v->type());
    for (const Value* v : node.outputs()) out_types.push_back(v->type());
    OpArgs args = node.op_args();
    OpShardingRule rule = node.op().sharding_rule(args, in_types, out_types);
    const int addend = node.op().addend_arg.empty() ? -1 : args.tensor(node.op().addend_arg);
    return {std::move(args), std::move(rule), addend};
  }

  // Settles `current`, an op's operands as they are, for choosing its plan:
  // a partial operand reduced here, whose reduction another consumer
  // already made, is that reduced copy and offers that copy's layout.
  // Returns whether the partial operands stay partial (partials_stay).
  bool settle_operands(const Node& node, std::vector<const Rep*>& current) const {
    const bool partials_kept = partials_stay(node, current);
    for (std::size_t o = 0; o < current.size(); ++o) {
      if (current[o]->unreduced.empty() || partials_kept) continue;
      if (const auto reduced = reduced_.find(node.inputs()[o]); reduced != reduced_.end()) current[o] = &reduced->second;
    }
    return partials_kept;
  }

  // The factor shardings of `node` with its operands as `current`. An op
  // whose results are wanted in another layout than its operands have is
  // computed where moving costs least: in the results' layout filled in by
  // the operands' (the default), in the operands' alone (moving the
  // smaller results: a sum that shrinks its input 4x), or in the results'
  // alone (gathering a smaller operand rather than a larger result). `cost`,
  // when given, gets the chosen plan's plan_cost.
  std::vector<std::vector<int>> chosen_factors(const Node& node, const OpPlanInputs& inputs,
                                               const std::vector<const Rep*>& current, bool partials_kept,
                                               OperandMoves operand_moves, double* cost) {
    const FactorChoice choice{mesh_, shardings_, node, inputs.rule, current, partials_kept, inputs.addend};
    std::vector<std::vector<int>> factor_axes = choose_factors(choice, FactorPlan::kResultsThenOperands);
    double least = -1;
    if (!node.op().position_dependent) {
      for (const FactorPlan plan : {FactorPlan::kOperandsOnly, FactorPlan::kResultsOnly}) {
        std::vector<std::vector<int>> other = choose_factors(choice, plan);
        if (other == factor_axes) continue;
        if (least < 0) least = plan_cost(node, inputs.rule, current, partials_kept, factor_axes, operand_moves);
        const double other_cost = plan_cost(node, inputs.rule, current, partials_kept, other, operand_moves);
        if (other_cost < least) {
          least = other_cost;
          factor_axes = std::move(other);
        }
      }
    }
    if (cost != nullptr) {
      *cost = least >= 0 ? least : plan_cost(node, inputs.rule, current, partials_kept, factor_axes, operand_moves);
    }
    return factor_axes;
  }

  void lower_op(const Node& node) {
    const OpDef& op = node.op();
    const std::vector<Value*> operands = node.inputs();
    const OpPlanInputs inputs = plan_inputs(node);
    const OpShardingRule& rule = inputs.rule;
    const int addend = inputs.addend;
    const OpArgs& global_args = inputs.args;

    // The operands as they are now.
    std::vector<const Rep*> current;
    for (const Value* v : operands) current.push_back(&reps_.at(v));
    const bool partials_kept = settle_operands(node, current);

    // 1. Factor shardings.
    std::vector<std::vector<int>> factor_axes =
        chosen_factors(node, inputs, current, partials_kept, OperandMoves::kFromCurrent, nullptr);

    // 2. Operands in the layout the factors ask for.
    std::vector<Rep> local;
    for (std::size_t o = 0; o < operands.size(); ++o) {
      const DimAxes wanted = project_back(mesh_, rule, rule.operands[o], factor_axes);
      Rep rep = *current[o];
      const bool keep_partial = !rep.unreduced.empty() && partials_kept;
      if (rep.dims != wanted || (!rep.unreduced.empty() && !keep_partial)) {
        const ReshardWhy why{operands[o], node_text(node),
                             [this, v = operands[o]](int d) { return origin_text(v, d); }};
        const TensorType& type = operands[o]->type();
        if (keep_partial) {
          // Move the layout of a partial sum without reducing it: gathering
          // or slicing partials of the same reduction group keeps them partial.
          Rep layout = rep;
          layout.unreduced.clear();
          Rep moved = partition_detail::reshard(builder_, layout, wanted, type.shape, type.dtype, why);
          moved.unreduced = rep.unreduced;
          moved.reduction = rep.reduction;
          moved.unreduced_reason = rep.unreduced_reason;
          rep = std::move(moved);
        } else {
          rep = reshard_value(operands[o], wanted, node_text(node));
        }
      }
      local.push_back(std::move(rep));
    }

    // 3. Padding of sharded reduced dims holds the reduction's identity.
    ReduceOp reduction = ReduceOp::kSum;
    std::vector<int> partial_axes = sharded_reduction_axes(rule, factor_axes, reduction);
    std::string partial_reason;
    double scale = 1;
    for (std::size_t f = 0; f < rule.factors.size(); ++f) {
      if (rule.factors[f].kind != FactorKind::kReduction || factor_axes[f].empty()) continue;
      const ReduceOp combine = rule.factors[f].reduction;
      const double identity = combine == ReduceOp::kSum ? 0.0
                              : combine == ReduceOp::kMax ? -std::numeric_limits<double>::infinity()
                                                             : std::numeric_limits<double>::infinity();
      bool described = false;
      for (std::size_t o = 0; o < operands.size(); ++o) {
        for (std::size_t d = 0; d < rule.operands[o].size(); ++d) {
          const auto& mapping = rule.operands[o][d];
          if (std::find(mapping.begin(), mapping.end(), static_cast<int>(f)) == mapping.end()) continue;
          const int64_t size = operands[o]->type().shape[d];
          if (!described) {
            partial_reason = fmt::format("{} {} dim {}, sharded on {} by {}", node_text(node),
                                         op.family == OpFamily::kContraction ? "contracts" : "reduces", d,
                                         builder_.axes_text(factor_axes[f]), origin_text(operands[o], static_cast<int>(d)));
            described = true;
          }
          if (op.averages) {
            scale *= static_cast<double>(padded_shape(mesh_, {size}, {local[o].dims[d]})[0]) / static_cast<double>(size);
          }
          if (size % builder_.axes_size(local[o].dims[d]) == 0) continue;
          Instruction mask;
          mask.kind = InstructionKind::kMaskPadding;
          mask.inputs = {local[o].slot};
          local[o].slot = builder_.new_slot(builder_.slot_type(local[o].slot));
          mask.outputs = {local[o].slot};
          mask.dim = static_cast<int>(d);
          mask.global_size = size;
          mask.axes_before = local[o].dims[d];
          mask.fill = identity;
          builder_.emit(std::move(mask));
        }
      }
    }
    // The addend joins one partial sum of each reduction group: every other
    // device adds zeros.
    if (addend >= 0 && !partial_axes.empty()) {
      Rep& rep = local[static_cast<std::size_t>(addend)];
      Instruction once;
      once.kind = InstructionKind::kCountOnce;
      once.inputs = {rep.slot};
      rep.slot = builder_.new_slot(builder_.slot_type(rep.slot));
      once.outputs = {rep.slot};
      once.axes_before = partial_axes;
      std::sort(once.axes_before.begin(), once.axes_before.end());
      builder_.emit(std::move(once));
    }
    // Partial sums carried through a linear op.
    for (const Rep& rep : local) {
      if (rep.unreduced.empty()) continue;
      for (int axis : rep.unreduced) {
        if (std::find(partial_axes.begin(), partial_axes.end(), axis) == partial_axes.end()) partial_axes.push_back(axis);
      }
      if (partial_reason.empty()) partial_reason = rep.unreduced_reason;
    }
    std::sort(partial_axes.begin(), partial_axes.end());

    // 4. The local op.
    Instruction compute;
    compute.kind = InstructionKind::kCompute;
    compute.op = &op;
    std::vector<BoundArg> local_args = global_args.all();
    compute.scale = scale;
    for (const Rep& rep : local) compute.inputs.push_back(rep.slot);
    std::vector<Rep> results;
    for (std::size_t r = 0; r < node.outputs().size(); ++r) {
      Rep rep = new_result(node, rule, r, factor_axes, partial_axes, reduction);
      rep.unreduced_reason = partial_reason;
      const Shape shape = builder_.slot_type(rep.slot).shape;
      compute.outputs.push_back(rep.slot);
      if (!op.output_shape_arg.empty()) {
        const int index = op.schema.argument_index(op.output_shape_arg);
        local_args[static_cast<std::size_t>(index)].constant = Constant(std::vector<int64_t>(shape));
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
    for (std::size_t r = 0; r < node.outputs().size(); ++r) {
      const Value* output = node.outputs()[r];
      reps_[output] = results[r];
      if (op.position_dependent) {
        // Computed whole on every device: keep the shard propagation chose.
        reps_[output] = reshard_value(output, effective_axes(mesh_, shardings_.sharding(output)), node_text(node));
      }
    }
  }

  const Graph& graph_;
  const PropagationResult& shardings_;
  const Mesh& mesh_;
  ProgramBuilder builder_;
  PartitionedProgram& program_;
  std::unordered_map<const Value*, Rep> reps_;
  // Reps made so far of each root's values, by layout (none partial).
  std::map<std::pair<const Value*, DimAxes>, Rep> layouts_;
  std::unordered_map<const Value*, const Value*> alias_roots_;
  std::unordered_map<const Value*, Rep> reduced_;  // a partial sum's first reduced copy, by root
  std::unordered_map<const Value*, std::vector<const Node*>> users_;
  std::unordered_set<const Value*> returned_;  // graph outputs
};

}  // namespace

namespace {

// Found once here rather than by every device on every run.
void assign_releases(PartitionedProgram& program) {
  std::vector<int64_t> last_reader(program.slots.size(), -1);
  for (std::size_t i = 0; i < program.instructions.size(); ++i) {
    for (int slot : program.instructions[i].inputs) last_reader[static_cast<std::size_t>(slot)] = static_cast<int64_t>(i);
  }
  for (int slot : program.output_slots) last_reader[static_cast<std::size_t>(slot)] = -1;
  for (std::size_t i = 0; i < program.instructions.size(); ++i) {
    Instruction& instruction = program.instructions[i];
    for (int slot : instruction.inputs) {
      const bool last = last_reader[static_cast<std::size_t>(slot)] == static_cast<int64_t>(i);
      if (last && std::find(instruction.releases.begin(), instruction.releases.end(), slot) == instruction.releases.end()) {
        instruction.releases.push_back(slot);
      }
    }
  }
}

}  // namespace

PartitionedProgram partition_graph(const Graph& graph, const PropagationResult& shardings) {
  PartitionedProgram program;
  program.mesh = shardings.mesh();
  Partitioner(graph, shardings, program).run();
  assign_releases(program);
  return program;
}

}  // namespace shardflow
