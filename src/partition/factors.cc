// How the partitioner shards an op's factors (dims of its sharding rule),
// before it moves any operand: contractions the operands agree on, then the
// layouts propagation gave the results, then what the operands offer.
#include <algorithm>
#include <optional>

#include "partitioner.h"
#include "shardflow/ir/op_def.h"
#include "shardflow/ir/sharding_projection.h"

namespace shardflow::partition_detail {

DimAxes effective_axes(const Mesh& mesh, const Sharding& sharding) {
  DimAxes dims = sharding.all_dim_axes();
  for (auto& axes : dims) std::erase_if(axes, [&](int axis) { return mesh.axis_size(axis) == 1; });
  return dims;
}

namespace {

// Whether factor f is on one of a tensor's dims.
bool has_factor(const DimFactors& mapping, std::size_t f) {
  return std::any_of(mapping.begin(), mapping.end(), [&](const std::vector<int>& factors) {
    return std::find(factors.begin(), factors.end(), static_cast<int>(f)) != factors.end();
  });
}

// The axes an operand's layout gives the factors on its dims, listed only
// for those factors: cat has a factor per operand, so a dense table would
// grow with the square of its operand count.
using FactorOffer = std::vector<std::pair<std::size_t, std::vector<int>>>;

const std::vector<int>& offered_axes(const FactorOffer& offer, std::size_t f) {
  static const std::vector<int> kWhole;
  for (const auto& [factor, axes] : offer) {
    if (factor == f) return axes;
  }
  return kWhole;
}

// A dim made of several factors (a reshape's merged dim) can carry only
// shardings of its factors that are blocks of the dim: every sharded factor
// divides evenly, and a factor is sharded only if the factors before it are
// sharded whole. Clears factor axes until every tensor can represent them.
void make_representable(const OpShardingRule& rule, std::vector<std::vector<int>>& factor_axes, const Mesh& mesh) {
  const auto size_of = [&](const std::vector<int>& axes) {
    int64_t size = 1;
    for (int axis : axes) size *= mesh.axis_size(axis);
    return size;
  };
  bool changed = true;
  while (changed) {
    changed = false;
    const auto check = [&](const DimFactors& mapping) {
      for (const std::vector<int>& factors : mapping) {
        int nontrivial = 0;
        for (int f : factors) nontrivial += rule.factors[static_cast<std::size_t>(f)].size > 1 ? 1 : 0;
        if (nontrivial <= 1) continue;
        bool blocked = false;  // an earlier factor is not sharded whole
        for (int f : factors) {
          std::vector<int>& axes = factor_axes[static_cast<std::size_t>(f)];
          const int64_t size = rule.factors[static_cast<std::size_t>(f)].size;
          if (!axes.empty() && (blocked || size % size_of(axes) != 0)) {
            axes.clear();
            changed = true;
          }
          if (size_of(axes) != size && size > 1) blocked = true;
        }
      }
    };
    for (const DimFactors& mapping : rule.operands) check(mapping);
    for (const DimFactors& mapping : rule.results) check(mapping);
  }
}

// Whether following the result's layout for factor f would re-slice an
// operand that the op only picks from (it has a need-replication or indexed
// factor: embedding's table, index_select's source) and that is larger than the
// result. The slice would copy 1/n of the operand on every run while the
// op reads a few rows of it; computing on the operand's layout and slicing
// the small result instead costs next to nothing.
bool slices_a_picked_from_operand(const OpShardingRule& rule, const std::vector<FactorOffer>& offered,
                                  const std::vector<Value*>& operands, std::size_t f, const std::vector<int>& wanted,
                                  const Value* result) {
  for (std::size_t o = 0; o < operands.size(); ++o) {
    bool has_f = false, picked_from = false;
    for (const std::vector<int>& factors : rule.operands[o]) {
      for (int g : factors) {
        has_f = has_f || g == static_cast<int>(f);
        const FactorKind kind = rule.factors[static_cast<std::size_t>(g)].kind;
        picked_from = picked_from || kind == FactorKind::kNeedReplication || kind == FactorKind::kIndexed;
      }
    }
    if (has_f && picked_from && offered_axes(offered[o], f) != wanted &&
        operands[o]->type().nbytes() > result->type().nbytes()) {
      return true;
    }
  }
  return false;
}

// The devices a layout splits a tensor over, leaving out the `skipped` axes.
int64_t devices_over(const Mesh& mesh, const DimAxes& dims, const std::vector<int>& skipped = {}) {
  int64_t devices = 1;
  for (const std::vector<int>& dim : dims) {
    for (int axis : dim) {
      if (std::find(skipped.begin(), skipped.end(), axis) == skipped.end()) devices *= mesh.axis_size(axis);
    }
  }
  return devices;
}

// Per device: the op's results as a partial sum over `axes`, laid out on
// the other axes as propagation gave them.
int64_t partial_result_bytes(const FactorChoice& c, const std::vector<int>& axes) {
  int64_t bytes = 0;
  for (const Value* result : c.node.outputs()) {
    bytes += result->type().nbytes() / devices_over(c.mesh, effective_axes(c.mesh, c.shardings.sharding(result)), axes);
  }
  return bytes;
}

// A contraction that some operands shard on `axes` and the others hold
// whole along: the whole ones can be sliced locally for free, leaving a
// partial sum to reduce (about the result's bytes); the alternative moves
// the sharded operands to the result's layout (at least a shard of each).
// Decode steps hit this with a weight sharded on its input features and
// an activation that had to be gathered (6 heads on 8 devices): slicing
// the activation reduces a few KiB where moving the weight sends 1/n of it
// every step. Slicing needs the whole operands not to use those axes.
bool slicing_whole_operands_is_cheaper(const FactorChoice& c, const std::vector<Value*>& operands,
                                       const std::vector<std::size_t>& whole, const std::vector<int>& axes) {
  const Mesh& mesh = c.mesh;
  const std::vector<const LocalValue*>& current = c.current;
  for (std::size_t o : whole) {
    for (const std::vector<int>& dim : current[o]->dims) {
      for (int axis : dim) {
        if (std::find(axes.begin(), axes.end(), axis) != axes.end()) return false;
      }
    }
  }
  // The partial result, against the shard each sharded operand holds now.
  int64_t shard_bytes = 0;
  for (std::size_t o = 0; o < operands.size(); ++o) {
    if (std::find(whole.begin(), whole.end(), o) != whole.end()) continue;
    shard_bytes += operands[o]->type().nbytes() / devices_over(mesh, current[o]->dims);
  }
  return partial_result_bytes(c, axes) < shard_bytes;
}

// An operand sharded on an indexed factor (embedding's table over its
// vocabulary): looking up in the shards leaves a partial result, whose
// all-reduce sends about twice its bytes; the alternative gathers the
// operand along the dim. A table is far larger than the rows a step looks
// up; an index_select that keeps most of its source is not.
bool lookup_in_shards_is_cheaper(const FactorChoice& c, const Value& operand, const LocalValue& current,
                                 const std::vector<int>& axes) {
  const int64_t shard_bytes = operand.type().nbytes() / devices_over(c.mesh, current.dims);
  return 2 * partial_result_bytes(c, axes) < devices_over(c.mesh, {axes}) * shard_bytes;
}

}  // namespace

std::vector<std::vector<int>> factors_for_plan(const FactorChoice& c, FactorPlan plan) {
  const Mesh& mesh = c.mesh;
  const Node& node = c.node;
  const OpShardingRule& rule = c.rule;
  const std::vector<const LocalValue*>& current = c.current;
  const OpDef& op = node.op();
  const std::vector<Value*> operands = node.inputs();
  std::vector<std::vector<int>> factor_axes(rule.factors.size());
  std::vector<bool> settled(rule.factors.size(), false);
  std::vector<bool> used(static_cast<std::size_t>(mesh.num_axes()), false);
  // Factors the results do not have are sharded only when they are
  // contracted: an operand-only dim (a broadcast size-1 dim, say) must be
  // whole on every device. Size-1 factors are never sharded.
  std::vector<bool> in_results(rule.factors.size(), false);
  for (const DimFactors& mapping : rule.results) {
    for (const std::vector<int>& factors : mapping) {
      for (int f : factors) in_results[static_cast<std::size_t>(f)] = true;
    }
  }
  const auto take = [&](std::size_t f, const std::vector<int>& axes) {
    if (settled[f] || rule.factors[f].kind == FactorKind::kNeedReplication) return;
    if (rule.factors[f].size <= 1) return;
    const FactorKind kind = rule.factors[f].kind;
    if (!in_results[f] && kind != FactorKind::kReduction && kind != FactorKind::kIndexed) return;
    std::vector<int> free;
    for (int axis : axes) {
      if (used[static_cast<std::size_t>(axis)]) break;
      free.push_back(axis);
    }
    if (free.empty()) return;
    for (int axis : free) used[static_cast<std::size_t>(axis)] = true;
    factor_axes[f] = std::move(free);
    settled[f] = true;
  };
  // A partial sum that may stay partial through this op keeps its axes to
  // itself: a value cannot be both summed over an axis and split by it.
  for (std::size_t o = 0; o < operands.size(); ++o) {
    if (current[o]->unreduced.empty() || !c.partials_kept) continue;
    for (int axis : current[o]->unreduced) used[static_cast<std::size_t>(axis)] = true;
  }
  // What each operand's current layout says about each factor.
  std::vector<FactorOffer> offered(operands.size());
  for (std::size_t o = 0; o < operands.size(); ++o) {
    const DimAxes& dims = current[o]->dims;
    for (std::size_t d = 0; d < dims.size(); ++d) {
      for (FactorAxes& taken : project_to_factors(mesh, rule, rule.operands[o][d], dims[d])) {
        offered[o].emplace_back(static_cast<std::size_t>(taken.factor), std::move(taken.axes));
      }
    }
  }
  // A factor only the results have (stack's new dim) can be sharded only
  // when the op can make a local shape of any size (it has a shape
  // argument, or computes any tile of its result: position-dependent ops);
  // otherwise the result is made whole along it and sliced.
  std::vector<bool> in_operands(rule.factors.size(), false);
  for (const DimFactors& mapping : rule.operands) {
    for (const std::vector<int>& factors : mapping) {
      for (int f : factors) in_operands[static_cast<std::size_t>(f)] = true;
    }
  }
  // A contraction its operands already agree on costs no operand
  // communication, only a reduction of the result (a reduce-scatter when
  // the result is wanted sharded): settle it first.
  for (std::size_t f = 0; f < rule.factors.size(); ++f) {
    if (rule.factors[f].kind != FactorKind::kReduction) continue;
    std::optional<std::vector<int>> agreed;
    bool all_agree = true;
    std::vector<std::size_t> whole;    // operands that have the factor's dim whole
    bool every_operand_has_it = true;  // else it stays whole (see the addend check below)
    for (std::size_t o = 0; o < operands.size(); ++o) {
      const bool has = has_factor(rule.operands[o], f);
      every_operand_has_it = every_operand_has_it && (has || static_cast<int>(o) == c.addend);
      if (!has) continue;
      const std::vector<int>& axes = offered_axes(offered[o], f);
      if (axes.empty()) {
        whole.push_back(o);
        continue;
      }
      if (!agreed) agreed = axes;
      all_agree = all_agree && *agreed == axes;
    }
    if (!agreed || !all_agree || !every_operand_has_it) continue;
    if (whole.empty() || slicing_whole_operands_is_cheaper(c, operands, whole, *agreed)) {
      take(f, *agreed);
    }
  }
  for (std::size_t r = 0; plan != FactorPlan::kOperandsOnly && r < node.outputs().size(); ++r) {
    const DimAxes dims = effective_axes(mesh, c.shardings.sharding(node.outputs()[r]));
    std::vector<std::vector<int>> projected(rule.factors.size());
    for (std::size_t d = 0; d < dims.size(); ++d) {
      for (FactorAxes& taken : project_to_factors(mesh, rule, rule.results[r][d], dims[d])) {
        projected[static_cast<std::size_t>(taken.factor)] = std::move(taken.axes);
      }
    }
    for (std::size_t f = 0; f < projected.size(); ++f) {
      if (projected[f].empty() || (!in_operands[f] && op.output_shape_arg.empty() && !op.position_dependent)) continue;
      if (slices_a_picked_from_operand(rule, offered, operands, f, projected[f], node.outputs()[r])) continue;
      take(f, projected[f]);
    }
    if (plan != FactorPlan::kResultsOnly) continue;
    // Whole in the result: kept whole, not taken from an operand.
    for (const std::vector<int>& factors : rule.results[r]) {
      for (int f : factors) settled[static_cast<std::size_t>(f)] = true;
    }
  }
  for (std::size_t o = 0; o < operands.size(); ++o) {
    for (const auto& [f, axes] : offered[o]) {
      if (rule.factors[f].kind == FactorKind::kIndexed && rule.leaves_partials(static_cast<int>(f)) && !axes.empty() &&
          !lookup_in_shards_is_cheaper(c, *operands[o], *current[o], axes)) {
        continue;
      }
      take(f, axes);
    }
  }

  make_representable(rule, factor_axes, mesh);
  // A sharded contraction leaves partial sums; an operand without that
  // factor would then be added once per shard. The op's addend (linear's
  // bias) is counted once instead (step 3); with any other such operand
  // the contraction is not sharded.
  for (std::size_t f = 0; f < rule.factors.size(); ++f) {
    if (rule.factors[f].kind != FactorKind::kReduction || factor_axes[f].empty()) continue;
    for (std::size_t o = 0; o < operands.size(); ++o) {
      const bool has = has_factor(rule.operands[o], f);
      const bool counted_once = static_cast<int>(o) == c.addend && rule.factors[f].reduction == ReduceOp::kSum;
      if (!has && !counted_once) factor_axes[f].clear();
    }
  }

  return factor_axes;
}

}  // namespace shardflow::partition_detail
