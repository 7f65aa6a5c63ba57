// Moving a value between layouts for its uses (Partitioner, see
// partitioner_pass.h): each move starts from the cheapest layout made so
// far; a partial sum that several uses share is reduced once, where all of
// them together are reached for least; values that later annotations want
// in other layouts are moved where all those moves together cost least.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

#include "partitioner_pass.h"
#include "shardflow/ops/annotation.h"

namespace shardflow::partition_detail {

LocalValue Partitioner::move_value_for_use(const Value* value, const DimAxes& target, std::string consumer,
                                           const std::vector<LaterUse>& later) {
  const LocalValue& rep = reps_.at(value);
  if (rep.dims == target && rep.unreduced.empty()) return rep;
  const Value* root = alias_root(value);
  if (rep.unreduced.empty()) layouts_.emplace(std::make_pair(root, rep.dims), rep);
  if (auto found = layouts_.find({root, target}); found != layouts_.end()) return found->second;
  ReshardReason why;
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
  const LocalValue* source = &rep;
  std::optional<MovesFrom> found;
  if (rep.unreduced.empty() || reduced_.contains(root)) {
    found = cheapest_from_made(root, nullptr, target, value->type());
    if (found) {
      source = found->source;
    } else if (!rep.unreduced.empty()) {
      source = &reduced_.at(root);  // too many axes to search: the first reduced copy
    }
  }
  std::vector<LocalValue> made;
  LocalValue result = partition_detail::emit_reshard(builder_, *source, target, value->type().shape,
                                                     value->type().dtype, why, &made, found ? &found->moves : nullptr);
  if (!source->unreduced.empty() && !made.empty()) reduced_.emplace(root, made.front());
  for (const LocalValue& layout : made) layouts_.emplace(std::make_pair(root, layout.dims), layout);
  return result;
}

std::string Partitioner::other_uses_text(const Value* value, const std::string& consumer) const {
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

std::string Partitioner::use_text(const Node& user) const {
  if (user.op().full_name() != ops::kMarkShardingOp) return node_text(user);
  return fmt::format("the annotation at %{}", user.output()->name());
}

const std::vector<const Node*>& Partitioner::users_of(const Value* value) const {
  static const std::vector<const Node*> none;
  const auto found = users_.find(value);
  return found == users_.end() ? none : found->second;
}

std::vector<partition_detail::LayoutMove> Partitioner::reduction_prefix(
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

std::optional<double> Partitioner::use_cost(const Node& user, const Value* value, const LocalValue& reduced) {
  std::vector<const LocalValue*> current;
  for (const Value* operand : user.inputs()) {
    const auto found = reps_.find(operand);
    if (operand != value && found == reps_.end()) return std::nullopt;
    current.push_back(operand == value ? &reduced : &found->second);
  }
  const OpPlanInputs inputs = plan_inputs(user);
  const bool partials_kept = settle_operands(user, current);
  double cost = 0;
  factors_of_cheapest_plan(user, inputs, current, partials_kept, OperandMoves::kFromMadeLayouts, &cost);
  return cost;
}

void Partitioner::reduce_for_all_uses(const Value* value, const LocalValue& rep, const DimAxes& target,
                                      const ReshardReason& why, const std::vector<LaterUse>& later) {
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
  ReshardReason shared_why = why;
  if (const std::string others = other_uses_text(value, why.consumer); !others.empty()) {
    shared_why.consumer = fmt::format("{} (and {}, sharing the reduction)", why.consumer, others);
  }
  const auto emit_reduction = [&](const std::vector<LayoutMove>& prefix, std::vector<LocalValue>& made) {
    partition_detail::emit_reshard(builder_, rep, prefix.back().after, type.shape, type.dtype, shared_why, &made,
                                   &prefix);
  };
  // Each reduction is tried as it is and followed by the layout that every
  // use slices its tiles from (shared_prefix_layout), where one exists.
  std::vector<std::optional<DimAxes>> shared(candidates.size());
  for (std::size_t c = 0, tried = candidates.size(); c < tried; ++c) {
    if (std::optional<DimAxes> layout = shared_prefix_layout(candidates[c].back().after, targets)) {
      candidates.push_back(candidates[c]);
      shared.push_back(std::move(layout));
    }
  }
  std::size_t best = 0;
  if (candidates.size() > 1) {
    double least = std::numeric_limits<double>::infinity();
    for (std::size_t c = 0; c < candidates.size(); ++c) {
      const ProgramBuilder::Mark mark = builder_.mark();
      std::vector<LocalValue> made;
      emit_reduction(candidates[c], made);
      const auto move_to = [&](const DimAxes& t) {
        if (!move_from(made, t, type, why)) {
          partition_detail::emit_reshard(builder_, made.front(), t, type.shape, type.dtype, why, &made);
        }
      };
      if (shared[c]) move_to(*shared[c]);
      for (const DimAxes& t : targets) move_to(t);
      // Op uses find the layouts made so far, as they will when lowered.
      std::vector<std::pair<const Value*, DimAxes>> added;
      for (const LocalValue& layout : made) {
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
  std::vector<LocalValue> made;
  emit_reduction(candidates[best], made);
  if (shared[best] && !move_from(made, *shared[best], type, shared_why)) {
    partition_detail::emit_reshard(builder_, made.front(), *shared[best], type.shape, type.dtype, shared_why, &made);
  }
  reduced_.emplace(root, made.front());
  for (const LocalValue& layout : made) layouts_.emplace(std::make_pair(root, layout.dims), layout);
}

std::optional<DimAxes> Partitioner::shared_prefix_layout(const DimAxes& from, const std::vector<DimAxes>& targets) {
  DimAxes shared = from;
  for (std::size_t d = 0; d < shared.size(); ++d) {
    for (const DimAxes& t : targets) {
      std::size_t k = 0;
      while (k < shared[d].size() && k < t[d].size() && shared[d][k] == t[d][k]) ++k;
      shared[d].resize(k);
    }
  }
  if (shared == from || std::find(targets.begin(), targets.end(), shared) != targets.end()) return std::nullopt;
  return shared;
}

std::optional<Partitioner::MovesFrom> Partitioner::cheapest_from_made(const Value* root, const LocalValue* rep,
                                                                      const DimAxes& target,
                                                                      const TensorType& type) const {
  std::vector<const LocalValue*> sources;
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

bool Partitioner::move_from(std::vector<LocalValue>& made, const DimAxes& target, const TensorType& type,
                            const ReshardReason& why) {
  std::vector<DimAxes> layouts;
  for (const LocalValue& layout : made) layouts.push_back(layout.dims);
  const std::optional<partition_detail::CheapestMoves> found =
      partition_detail::cheapest_moves(mesh_, type.shape, type.dtype, layouts, target);
  if (!found) return false;
  const LocalValue from = made[found->source];  // `made` grows below
  partition_detail::emit_reshard(builder_, from, target, type.shape, type.dtype, why, &made, &found->moves);
  return true;
}

double Partitioner::moves_cost(const Value* value, const std::vector<DimAxes>& targets, const ReshardReason& why) {
  const Value* root = alias_root(value);
  const TensorType& type = value->type();
  const ProgramBuilder::Mark mark = builder_.mark();
  std::vector<std::pair<const Value*, DimAxes>> added;
  for (const DimAxes& t : targets) {
    if (layouts_.contains({root, t})) continue;
    const std::optional<MovesFrom> found = cheapest_from_made(root, nullptr, t, type);
    if (!found) continue;  // too many axes to search: not told apart
    std::vector<LocalValue> made;
    partition_detail::emit_reshard(builder_, *found->source, t, type.shape, type.dtype, why, &made, &found->moves);
    for (const LocalValue& layout : made) {
      if (layouts_.emplace(std::make_pair(root, layout.dims), layout).second) added.emplace_back(root, layout.dims);
    }
  }
  for (const auto& key : added) layouts_.erase(key);
  const double cost = builder_.cost_since(mark);
  builder_.rollback(mark);
  return cost;
}

void Partitioner::move_for_later(const Value* value, const DimAxes& target, const std::vector<LaterUse>& later,
                                 const ReshardReason& why) {
  std::vector<DimAxes> order{target};
  for (const LaterUse& use : later) order.push_back(use.dims);
  double least = moves_cost(value, order, why);
  std::size_t best = 0;  // 0: target first, else later[best - 1]; later.size() + 1: `shared` first
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
  // Last, so that it wins only when strictly cheaper.
  const std::optional<DimAxes> shared = shared_prefix_layout(reps_.at(value).dims, order);
  if (shared) {
    std::vector<DimAxes> via{*shared};
    via.insert(via.end(), order.begin(), order.end());
    if (const double cost = moves_cost(value, via, why); cost < least) {
      least = cost;
      best = later.size() + 1;
    }
  }
  if (best == 0) return;
  // Made now for the later use (or for all of them), and recorded: that use
  // takes it as is.
  const Value* root = alias_root(value);
  const TensorType& type = value->type();
  const bool for_all = best == later.size() + 1;
  const DimAxes& first = for_all ? *shared : later[best - 1].dims;
  const std::optional<MovesFrom> found = cheapest_from_made(root, nullptr, first, type);
  if (!found) return;
  std::vector<std::string> later_uses;
  for (const LaterUse& use : later) later_uses.push_back(use.use);
  ReshardReason first_why = why;
  first_why.consumer =
      for_all
          ? fmt::format("{} (and {}, which take their tiles of it locally)", why.consumer, fmt::join(later_uses, ", "))
          : fmt::format("{} (moved here, before {}, as both then cost least)", later[best - 1].use, why.consumer);
  std::vector<LocalValue> made;
  partition_detail::emit_reshard(builder_, *found->source, first, type.shape, type.dtype, first_why, &made,
                                 &found->moves);
  for (const LocalValue& layout : made) layouts_.emplace(std::make_pair(root, layout.dims), layout);
}

void Partitioner::add_annotations_ahead(const Value* value, const DimAxes& own, const Node* skip,
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

void Partitioner::add_later_use(const Node& annotation, const DimAxes& own, const Node* skip,
                                std::vector<LaterUse>& later) const {
  if (&annotation == skip || later.size() >= kMaxLaterLayouts) return;
  DimAxes dims = effective_axes(mesh_, shardings_.sharding(annotation.output()));
  const bool known = std::any_of(later.begin(), later.end(), [&](const LaterUse& use) { return use.dims == dims; });
  if (dims != own && !known) later.push_back({std::move(dims), use_text(annotation)});
}

std::vector<Partitioner::LaterUse> Partitioner::later_uses(const Node& annotation) const {
  const DimAxes own = effective_axes(mesh_, shardings_.sharding(annotation.output()));
  std::vector<LaterUse> later;
  add_annotations_ahead(annotation.output(), own, &annotation, later);
  const std::vector<const Node*>& siblings = users_of(annotation.inputs()[0]);
  for (auto it = std::find(siblings.begin(), siblings.end(), &annotation); it != siblings.end(); ++it) {
    if ((*it)->op().full_name() == ops::kMarkShardingOp) add_later_use(**it, own, &annotation, later);
  }
  return later;
}

void Partitioner::lower_annotation(const Node& node) {
  const Value* input = node.inputs()[0];
  const Value* output = node.output();
  reps_[output] = move_value_for_use(input, effective_axes(mesh_, shardings_.sharding(output)),
                                     fmt::format("the annotation at %{}", output->name()), later_uses(node));
  alias_roots_[output] = alias_root(input);
}

bool Partitioner::reduction_shared(const Value* value, const DimAxes& target) const {
  const std::vector<const Node*>& users = users_of(value);
  if (!returned_.contains(value) && users.size() <= 1) return false;
  if (returned_.contains(value) && effective_axes(mesh_, shardings_.sharding(value)) != target) return true;
  return std::any_of(users.begin(), users.end(), [&](const Node* user) {
    return user->op().full_name() != ops::kMarkShardingOp ||
           effective_axes(mesh_, shardings_.sharding(user->output())) != target;
  });
}

}  // namespace shardflow::partition_detail
