// Sharding propagation over the ops' factor rules (see propagation.h).
#include "shardflow/propagation/propagation.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <queue>

#include "propagation_steps.h"
#include "shardflow/base/error.h"
#include "shardflow/ir/sharding_projection.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/annotation.h"

namespace shardflow {

std::vector<const Node*> ShardingOrigin::through() const {
  std::vector<const Node*> nodes;
  for (const Step* step = last.get(); step != nullptr; step = step->previous.get()) nodes.push_back(step->node);
  std::reverse(nodes.begin(), nodes.end());
  return nodes;
}

std::string ShardingOrigin::describe() const {
  if (source == nullptr) return "no annotation";
  std::string out = source->producer() != nullptr ? fmt::format("the annotation at %{}", source->name())
                                                  : fmt::format("the sharding of input %{}", source->name());
  const std::vector<const Node*> path = through();
  if (path.empty()) return out;
  // Every op of a long chain would make each message as long as the graph.
  constexpr std::size_t kShownAtEachEnd = 4;
  const auto name_of = [](const Node* node) {
    return fmt::format("%{} {}", node->outputs().empty() ? "?" : node->output()->name(), node->op().full_name());
  };
  out += " through ";
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path.size() > 2 * kShownAtEachEnd && i == kShownAtEachEnd) {
      out += fmt::format(", ({} more ops)", path.size() - 2 * kShownAtEachEnd);
      i = path.size() - kShownAtEachEnd;
    }
    out += (i > 0 ? ", " : "") + name_of(path[i]);
  }
  return out;
}

const Sharding& PropagationResult::sharding(const Value* value) const {
  const auto found = entries_.find(value);
  if (found == entries_.end()) throw Error(fmt::format("no sharding was propagated to %{}", value->name()));
  return found->second.sharding;
}

const ShardingOrigin& PropagationResult::origin(const Value* value, int dim) const {
  static const ShardingOrigin kNone;
  const auto found = entries_.find(value);
  if (found == entries_.end() || dim < 0 || static_cast<std::size_t>(dim) >= found->second.dim_origins.size()) {
    return kNone;
  }
  return found->second.dim_origins[static_cast<std::size_t>(dim)];
}

bool PropagationResult::is_annotated(const Value* value) const {
  const auto found = entries_.find(value);
  return found != entries_.end() && found->second.annotated;
}

namespace propagation_detail {

const DimFactors& tensor_factors(const OpShardingRule& rule, std::size_t t) {
  return t < rule.operands.size() ? rule.operands[t] : rule.results[t - rule.operands.size()];
}

std::vector<std::vector<Candidate>> gather_candidates(const Mesh& mesh, const OpShardingRule& rule,
                                                      std::span<ValueState* const> tensors) {
  std::vector<std::vector<Candidate>> candidates(rule.factors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const ValueState& state = *tensors[t];
    const DimFactors& mapping = tensor_factors(rule, t);
    for (std::size_t d = 0; d < mapping.size(); ++d) {
      for (FactorAxes& taken : project_to_factors(mesh, rule, mapping[d], state.dims[d])) {
        candidates[static_cast<std::size_t>(taken.factor)].push_back(
            {std::move(taken.axes), &state, static_cast<int>(d)});
      }
    }
  }
  return candidates;
}

const Candidate* best_candidate(std::span<const Candidate> candidates) {
  // The first of the smallest in this order is what a stable sort puts first.
  const auto better = [](const Candidate& a, const Candidate& b) {
    if (a.tensor->closed != b.tensor->closed) return a.tensor->closed;
    if (a.axes.size() != b.axes.size()) return a.axes.size() > b.axes.size();
    return a.tensor->bytes > b.tensor->bytes;
  };
  const auto best = std::min_element(candidates.begin(), candidates.end(), better);
  return best == candidates.end() ? nullptr : &*best;
}

// Pass-through factors settle before reduction factors: sharding a kept dim
// costs nothing, sharding a contracted one costs a reduction of the result.
// A lookup in an annotated table's shards (a partial sum, like a
// contraction) comes right after the annotated pass-through factors: the
// partitioner looks up there whenever the table is much larger than the rows
// (its lookup_in_shards_is_cheaper), so an axis an open tensor offers the
// batch would only make it gather the indices.
int settle_rank(const OpShardingRule& rule, int f, const Candidate& winner, int64_t result_bytes) {
  if (!rule.leaves_partials(f)) return winner.tensor->closed ? 0 : 2;
  const bool table_lookup = rule.factors[static_cast<std::size_t>(f)].kind == FactorKind::kIndexed &&
                            winner.tensor->closed && 2 * result_bytes < winner.tensor->bytes;
  if (table_lookup) return 1;
  return winner.tensor->closed ? 3 : 4;
}

SettledFactors settle_factors(const OpShardingRule& rule, int num_axes,
                              const std::vector<std::vector<Candidate>>& candidates, int64_t result_bytes) {
  struct Choice {
    int factor;
    const Candidate* winner;
    int rank;
  };
  std::vector<Choice> choices;
  for (std::size_t f = 0; f < rule.factors.size(); ++f) {
    if (rule.factors[f].kind == FactorKind::kNeedReplication) continue;
    const Candidate* winner = best_candidate(candidates[f]);
    if (winner == nullptr || winner->axes.empty()) continue;
    choices.push_back({static_cast<int>(f), winner, settle_rank(rule, static_cast<int>(f), *winner, result_bytes)});
  }
  // Within a rank, the factor won by the larger tensor settles first.
  std::stable_sort(choices.begin(), choices.end(), [](const Choice& a, const Choice& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.winner->tensor->bytes > b.winner->tensor->bytes;
  });
  SettledFactors settled{std::vector<std::vector<int>>(rule.factors.size()),
                         std::vector<const Candidate*>(rule.factors.size(), nullptr)};
  std::vector<bool> used(static_cast<std::size_t>(num_axes), false);
  for (const Choice& choice : choices) {
    std::vector<int>& axes = settled.axes[static_cast<std::size_t>(choice.factor)];
    for (int axis : choice.winner->axes) {
      if (used[static_cast<std::size_t>(axis)]) break;
      axes.push_back(axis);
    }
    for (int axis : axes) used[static_cast<std::size_t>(axis)] = true;
    settled.sources[static_cast<std::size_t>(choice.factor)] = choice.winner;
  }
  return settled;
}

std::vector<int> extend_dim(const std::vector<std::vector<int>>& dims, std::size_t d, const std::vector<int>& wanted) {
  const std::vector<int>& current = dims[d];
  if (wanted.size() <= current.size() || !std::equal(current.begin(), current.end(), wanted.begin())) return current;
  const auto held_elsewhere = [&](int axis) {
    for (std::size_t e = 0; e < dims.size(); ++e) {
      if (e != d && std::find(dims[e].begin(), dims[e].end(), axis) != dims[e].end()) return true;
    }
    return false;
  };
  std::vector<int> extended = current;
  for (std::size_t k = current.size(); k < wanted.size() && !held_elsewhere(wanted[k]); ++k) {
    extended.push_back(wanted[k]);
  }
  return extended;
}

bool extend_tensor(const Mesh& mesh, const OpShardingRule& rule, const DimFactors& mapping,
                   const SettledFactors& settled, const Node& node, ValueState& state) {
  bool changed = false;
  for (std::size_t d = 0; d < mapping.size(); ++d) {
    const DimProjection projected = project_to_dim(mesh, rule, mapping[d], settled.axes);
    std::vector<int> extended = extend_dim(state.dims, d, projected.axes);
    if (extended.size() == state.dims[d].size()) continue;
    state.dims[d] = std::move(extended);
    const Candidate* source =
        projected.first_factor < 0 ? nullptr : settled.sources[static_cast<std::size_t>(projected.first_factor)];
    if (source != nullptr) {
      // The new step shares the source's path (see ShardingOrigin::Step).
      const ShardingOrigin& from = source->tensor->origins[static_cast<std::size_t>(source->dim)];
      state.origins[d] = ShardingOrigin{
          from.source, std::make_shared<const ShardingOrigin::Step>(ShardingOrigin::Step{&node, from.last})};
    }
    changed = true;
  }
  return changed;
}

}  // namespace propagation_detail

using propagation_detail::Candidate;
using propagation_detail::extend_tensor;
using propagation_detail::gather_candidates;
using propagation_detail::settle_factors;
using propagation_detail::SettledFactors;
using propagation_detail::tensor_factors;
using propagation_detail::ValueState;

namespace {

// Propagation runs its stages in order, each until its worklist is empty or
// it has run kMaxRounds rounds.
enum class Stage {
  kPassThrough,  // elementwise, movement and annotation ops only
  kAllOps,
};

// The nodes waiting for a visit, visited in the order of sweeps over the
// whole graph (a forward pass in graph order, then a backward pass in
// reverse, repeated) but skipping the nodes none of whose values changed
// since their last visit. A node queued during a pass is visited later in
// the same pass if the pass has not reached it yet, otherwise in the next.
// The order matters where ops propose conflicting shardings (the first
// visit decides): a first-in first-out queue gave other shardings than the
// sweeps on 48 of the 1000 random graphs of Differential.*, this order gives
// the same on all. Skipping is exact: a visit reads only the node's values,
// and a node that changed one of them is queued again.
class Worklist {
 public:
  // Every node of `queued` (one flag per node) waits for the first forward pass.
  explicit Worklist(std::vector<bool> queued) : queued_(std::move(queued)) {
    for (std::size_t n = 0; n < queued_.size(); ++n) {
      if (queued_[n]) forward_.push(n);
    }
  }

  bool empty() const { return forward_.empty() && backward_.empty(); }

  // Starts a forward pass (or, with false, a backward pass).
  void start_pass(bool forward) { forward_pass_ = forward; }

  // The next node of the current pass; false at its end.
  bool next(std::size_t* node) {
    if (forward_pass_ ? forward_.empty() : backward_.empty()) return false;
    if (forward_pass_) {
      at_ = forward_.top();
      forward_.pop();
    } else {
      at_ = backward_.top();
      backward_.pop();
    }
    queued_[at_] = false;
    *node = at_;
    return true;
  }

  // Queues `node` unless it waits already. The node being visited waits for
  // the next pass.
  void push(std::size_t node) {
    if (queued_[node]) return;
    queued_[node] = true;
    // Forward: this pass if not reached yet. Backward: the next pass unless
    // not reached yet.
    const bool next_forward = forward_pass_ ? node > at_ : node >= at_;
    if (next_forward) {
      forward_.push(node);
    } else {
      backward_.push(node);
    }
  }

 private:
  std::vector<bool> queued_;
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> forward_;  // lowest first
  std::priority_queue<std::size_t> backward_;                                           // highest first
  bool forward_pass_ = true;
  std::size_t at_ = 0;  // the node visited last
};

class Propagator {
 public:
  // A round is a forward pass and a backward pass. It carries a sharding
  // along a path of ops that runs forward in the graph and then backward; a
  // path that turns between earlier and later ops needs a round for each
  // such pair of turns, so only a sharding that zig-zags about
  // 2 * kMaxRounds times can reach the limit.
  static constexpr int kMaxRounds = 64;

  Propagator(const Graph& graph, const Mesh& mesh) : graph_(graph), mesh_(mesh) {}

  std::unordered_map<const Value*, ValueState>& states() { return states_; }
  // One per stage that stopped at kMaxRounds while still changing.
  std::vector<std::string>& warnings() { return warnings_; }

  void run() {
    prepare();
    for (const Stage stage : {Stage::kPassThrough, Stage::kAllOps}) run_stage(stage);
  }

 private:
  static const char* stage_name(Stage stage) {
    switch (stage) {
      case Stage::kPassThrough:
        return "pass-through ops";
      case Stage::kAllOps:
        return "all ops";
    }
    return "?";
  }

  static bool in_stage(const Node& node, Stage stage) {
    const OpFamily family = node.op().family;
    return stage == Stage::kAllOps || family == OpFamily::kElementwise || family == OpFamily::kMovement ||
           family == OpFamily::kAnnotation;
  }

  // Each node's rule and values, and each value's nodes (its neighbours).
  void prepare() {
    for (std::size_t n = 0; n < graph_.nodes().size(); ++n) {
      const Node& node = *graph_.nodes()[n];
      const std::vector<Value*> inputs = node.inputs();
      std::vector<const Value*> values(inputs.begin(), inputs.end());
      values.insert(values.end(), node.outputs().begin(), node.outputs().end());
      std::vector<TensorType> in, out;
      for (const Value* v : inputs) in.push_back(v->type());
      for (const Value* v : node.outputs()) out.push_back(v->type());
      rules_.push_back(node.op().sharding_rule(node.op_args(), in, out));
      std::vector<ValueState*> states;
      for (const Value* v : values) {
        states.push_back(&states_.at(v));
        neighbours_[v].push_back(n);
      }
      node_values_.push_back(std::move(values));
      node_states_.push_back(std::move(states));
    }
  }

  void run_stage(Stage stage) {
    std::vector<bool> queued(graph_.nodes().size());
    for (std::size_t n = 0; n < queued.size(); ++n) queued[n] = in_stage(*graph_.nodes()[n], stage);
    Worklist work(std::move(queued));
    for (int round = 0; round < kMaxRounds && !work.empty(); ++round) {
      for (const bool forward : {true, false}) {
        work.start_pass(forward);
        for (std::size_t n = 0; work.next(&n);) visit(n, stage, work);
      }
    }
    // Still queued: the last round changed a value.
    if (!work.empty()) {
      warnings_.push_back(
          fmt::format("sharding propagation over {} stopped after {} rounds while still changing (%{} changed in the "
                      "last round); shardings may be incomplete, annotate more values to fix them",
                      stage_name(stage), kMaxRounds, last_changed_->name()));
    }
  }

  // Propagates across node n; queues the neighbours of the values it changes.
  void visit(std::size_t n, Stage stage, Worklist& work) {
    const OpShardingRule& rule = rules_[n];
    const std::vector<ValueState*>& tensors = node_states_[n];
    if (rule.operands.size() + rule.results.size() != tensors.size()) return;  // a rule that does not fit
    const Node& node = *graph_.nodes()[n];
    int64_t result_bytes = 0;
    for (std::size_t t = rule.operands.size(); t < tensors.size(); ++t) {
      result_bytes = std::max(result_bytes, tensors[t]->bytes);
    }
    const std::vector<std::vector<Candidate>> candidates = gather_candidates(mesh_, rule, tensors);
    const SettledFactors settled = settle_factors(rule, mesh_.num_axes(), candidates, result_bytes);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      if (tensors[t]->closed || !extend_tensor(mesh_, rule, tensor_factors(rule, t), settled, node, *tensors[t])) {
        continue;
      }
      last_changed_ = node_values_[n][t];
      for (std::size_t neighbour : neighbours_.at(last_changed_)) {
        if (in_stage(*graph_.nodes()[neighbour], stage)) work.push(neighbour);
      }
    }
  }

  const Graph& graph_;
  const Mesh& mesh_;
  std::vector<OpShardingRule> rules_;                                      // per node
  std::vector<std::vector<const Value*>> node_values_;                     // per node: its operands, then its results
  std::vector<std::vector<ValueState*>> node_states_;                      // per node: their states
  std::unordered_map<const Value*, std::vector<std::size_t>> neighbours_;  // per value: the nodes it is on
  std::unordered_map<const Value*, ValueState> states_;
  const Value* last_changed_ = nullptr;  // the value visit changed last
  std::vector<std::string> warnings_;
};

bool is_mark_sharding(const Node& node) { return node.op().full_name() == ops::kMarkShardingOp; }

}  // namespace

PropagationResult propagate_shardings(const Graph& graph, std::span<const std::optional<Sharding>> input_shardings) {
  // The mesh: every annotation and input sharding must use the same devices
  // in the same shape. Axis names do not matter, as in XLA's device-based
  // shardings: a mesh built without names inside a compiled step (PyTorch/XLA's
  // `Mesh(torch.arange(8), (4, 1, 2))`) is the same mesh as the named one the
  // weights were laid out on, whose names the result reads with.
  std::shared_ptr<const Mesh> mesh;
  std::string mesh_source;
  std::unordered_map<const Value*, Sharding> fixed;
  const auto use_mesh = [&](const std::shared_ptr<const Mesh>& candidate, const std::string& where) {
    if (!mesh || (!mesh->has_axis_names() && candidate->has_axis_names() &&
                  mesh->device_ids() == candidate->device_ids() && mesh->mesh_shape() == candidate->mesh_shape())) {
      mesh = candidate;
      mesh_source = where;
    } else if (mesh->device_ids() != candidate->device_ids() || mesh->mesh_shape() != candidate->mesh_shape()) {
      throw Error(fmt::format("{} uses the mesh {} but {} uses {}; a graph is partitioned over one mesh", where,
                              candidate->to_string(), mesh_source, mesh->to_string()));
    }
  };
  for (std::size_t i = 0; i < graph.inputs().size() && i < input_shardings.size(); ++i) {
    if (!input_shardings[i]) continue;
    const Value* input = graph.inputs()[i];
    if (input_shardings[i]->rank() != input->type().rank()) {
      throw Error(fmt::format("the sharding {} of input %{} has rank {} but the input is {}",
                              input_shardings[i]->to_readable(), input->name(), input_shardings[i]->rank(),
                              input->type().to_string()));
    }
    use_mesh(input_shardings[i]->mesh_ptr(), "input %" + input->name());
    fixed.emplace(input, *input_shardings[i]);
  }
  for (const auto& node : graph.nodes()) {
    if (!is_mark_sharding(*node)) continue;
    Sharding sharding = ops::decode_mark_sharding(node->op_args(), node->inputs()[0]->type().rank());
    use_mesh(sharding.mesh_ptr(), "the annotation at %" + node->output()->name());
    fixed.emplace(node->output(), std::move(sharding));
  }
  if (!mesh)
    mesh =
        std::make_shared<const Mesh>(std::vector<int64_t>{0}, std::vector<int64_t>{1}, std::vector<std::string>{}, 1);

  Propagator propagator(graph, *mesh);
  const auto add_value = [&](const Value* value) {
    ValueState state;
    state.dims.resize(static_cast<std::size_t>(value->type().rank()));
    state.origins.resize(state.dims.size());
    state.bytes = value->type().nbytes();
    if (const auto found = fixed.find(value); found != fixed.end()) {
      state.closed = true;
      state.dims = found->second.all_dim_axes();
      for (ShardingOrigin& origin : state.origins) origin.source = value;
    }
    propagator.states().emplace(value, std::move(state));
  };
  for (const Value* input : graph.inputs()) add_value(input);
  for (const auto& node : graph.nodes()) {
    for (const Value* output : node->outputs()) add_value(output);
  }
  propagator.run();

  PropagationResult result(mesh);
  result.warnings() = std::move(propagator.warnings());
  for (auto& [value, state] : propagator.states()) {
    PropagationResult::Entry entry{Sharding(mesh, state.dims), std::move(state.origins), state.closed};
    result.entries().emplace(value, std::move(entry));
  }
  return result;
}

std::string print_with_shardings(const Graph& graph, const PropagationResult& result) {
  PrintOptions options;
  options.annotate_value = [&](const Value& value) {
    const Sharding& sharding = result.sharding(&value);
    return fmt::format("{} {}", sharding.to_readable(value.type().shape, dtype_name(value.type().dtype)),
                       sharding.to_hlo_v1().to_string());
  };
  return print_graph(graph, options);
}

}  // namespace shardflow
