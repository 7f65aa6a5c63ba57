// The three steps of propagating shardings across one op, private to
// propagation/ (propagation.cc runs them for each node its worklist holds;
// tests/propagation/propagation_steps_test.cc checks each one alone).
//
// For an op, its rule and the current states of its operands and results:
//   1. gather_candidates: the axes each tensor dim offers each factor;
//   2. settle_factors: one list of axes per factor, every mesh axis given to
//      one factor at most;
//   3. extend_tensor: the factors' axes projected back onto an open tensor,
//      each dim gaining axes at its minor end where they are free.
// Example: %h = aten::matmul(%x, %w), rule ([i, k], [k, j])->([i, j]), with
// %w [{},{model}] annotated: step 1 gives j the candidate [model] (from %w
// dim 1), step 2 settles j = [model], step 3 extends %h to [{},{model}].
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "shardflow/ir/graph.h"
#include "shardflow/ir/sharding_rule.h"
#include "shardflow/propagation/propagation.h"
#include "shardflow/sharding/mesh.h"

namespace shardflow::propagation_detail {

// What propagation knows about one value so far.
struct ValueState {
  std::vector<std::vector<int>> dims;   // per dim, its mesh axes (major to minor)
  std::vector<ShardingOrigin> origins;  // per dim, where its axes came from
  bool closed = false;                  // annotated or an input sharding: never changed
  int64_t bytes = 0;                    // the whole value's size
};

// One factor's axes as one dim of a tensor offers them.
struct Candidate {
  std::vector<int> axes;
  const ValueState* tensor = nullptr;
  int dim = 0;
};

// The factors of the dims of an op's tensor t, counting its operands first,
// then its results.
const DimFactors& tensor_factors(const OpShardingRule& rule, std::size_t t);

// Step 1. Per factor of `rule`, what the dims of `tensors` (the op's operands
// then its results, one per entry of the rule) map onto it, in tensor order.
std::vector<std::vector<Candidate>> gather_candidates(const Mesh& mesh, const OpShardingRule& rule,
                                                      std::span<ValueState* const> tensors);

// Step 2. The axes each factor gets, and the candidate they came from.
struct SettledFactors {
  std::vector<std::vector<int>> axes;     // per factor; empty: whole
  std::vector<const Candidate*> sources;  // per factor; null: no candidate won
};

// The candidate a factor follows: an annotated tensor's (even one that keeps
// the factor whole), then the one with the most axes, then the larger
// tensor's; the first of equals. Null for no candidates.
const Candidate* best_candidate(std::span<const Candidate> candidates);

// When factor f, won by `winner`, takes its axes (lower first); see
// settle_factors. `result_bytes`: the op's largest result.
int settle_rank(const OpShardingRule& rule, int f, const Candidate& winner, int64_t result_bytes);

// Each factor takes its best candidate's axes, up to the first axis an
// earlier factor took. `candidates` (from gather_candidates) must outlive
// the result, which points into it.
SettledFactors settle_factors(const OpShardingRule& rule, int num_axes,
                              const std::vector<std::vector<Candidate>>& candidates, int64_t result_bytes);

// Step 3. The axes dim d of a tensor with `dims` has after taking `wanted`:
// the next of wanted's axes, in order, while it extends the dim's current
// axes and no other dim holds it. Unchanged when `wanted` does not extend
// the current axes (nothing new, or a conflict).
std::vector<int> extend_dim(const std::vector<std::vector<int>>& dims, std::size_t d, const std::vector<int>& wanted);

// Extends every dim of the open tensor `state` (whose dims map to `mapping`)
// with the axes `settled` projects onto it; a dim that gains axes records
// their origin, through `node`. Returns whether any dim gained axes.
bool extend_tensor(const Mesh& mesh, const OpShardingRule& rule, const DimFactors& mapping,
                   const SettledFactors& settled, const Node& node, ValueState& state);

}  // namespace shardflow::propagation_detail
