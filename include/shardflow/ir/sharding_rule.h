// An op's sharding rule, as factors (the idea of Shardy's OpShardingRule).
//
// Every tensor dim of every operand and result maps to one or more factors
// (major to minor; several factors for dims that a reshape splits or merges).
// A factor shared by several tensors can be sharded the same way on all of
// them. Its kind says what sharding it costs:
//   pass-through      no communication (batch dims, elementwise dims);
//   reduction         contracted or reduced: the result is an unreduced partial
//                     (sum or max) until reduced by a collective;
//   need-replication  must be gathered first (the softmax dim, the sliced dim
//                     of a slice, the cat dim);
//   indexed           a dim that index values pick from or write to (the op's
//                     windowed_kernel runs on a shard of it). Only on
//                     operands, a lookup (embedding's vocabulary): each
//                     device looks up the indices that fall in its shard and
//                     gives zeros for the others, so the result is a partial
//                     sum over the factor's axes, as for a reduction. On the
//                     result too, a write (index_copy's written dim): each
//                     device writes the indices in its shard, and the result
//                     is sharded as the operand is;
//   permutation       moves data between neighbouring shards (halo
//                     exchanges); no op uses it yet.
// A matmul f32[8,32] x f32[32,16] prints as
//   ([i, k], [k, j])->([i, j]) {i=8, j=16, k=32} reduction={k}
// and an embedding f32[100,16] of i64[4,8] as
//   ([l, k], [i, j])->([i, j, k]) {i=4, j=8, k=16, l=100} indexed={l}
// Propagation and partitioning read only these rules, never op kinds.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shardflow/ir/types.h"
#include "shardflow/tensor/reduce_op.h"

namespace shardflow {

enum class FactorKind { kPassThrough, kReduction, kNeedReplication, kPermutation, kIndexed };

struct Factor {
  int64_t size = 1;
  FactorKind kind = FactorKind::kPassThrough;
  ReduceOp reduction = ReduceOp::kSum;  // for kReduction: how partial results combine
};

// Per tensor dim, the factors it is made of (major to minor).
using DimFactors = std::vector<std::vector<int>>;

struct OpShardingRule {
  std::vector<Factor> factors;
  std::vector<DimFactors> operands;  // one per tensor operand (flattened lists)
  std::vector<DimFactors> results;

  // "([i, k], [k, j])->([i, j]) {i=8, j=16, k=32} reduction={k}"
  std::string to_string() const;
  // Whether some result has factor f.
  bool in_results(int f) const;
  // Whether sharding factor f leaves the results unreduced partial sums: a
  // reduction factor, or an indexed one the results lack (a lookup).
  bool leaves_partials(int f) const;
};

// Builds rules without index bookkeeping. Example (matmul 2-D):
//   RuleBuilder b(operands, results);
//   b.add_factor({0, -1}, {0}, m);                    // i: lhs dim 0, result dim 0
//   b.add_factor({-1, 1}, {1}, n);                    // j
//   b.add_factor({1, 0}, {-1}, k, FactorKind::kReduction);
class RuleBuilder {
 public:
  RuleBuilder(std::span<const TensorType> operands, std::span<const TensorType> results);

  // One factor on the given dim of each operand and result (-1: absent).
  int add_factor(std::vector<int> operand_dims, std::vector<int> result_dims, int64_t size,
                 FactorKind kind = FactorKind::kPassThrough, ReduceOp reduction = ReduceOp::kSum);
  // Appends `factor` (as the next, more minor, part) to one dim.
  void map_operand(int operand, int dim, int factor);
  void map_result(int result, int dim, int factor);
  // A new factor of `size` on one operand dim or one result dim only.
  int add_operand_only(int operand, int dim, FactorKind kind = FactorKind::kPassThrough);
  int add_result_only(int result, int dim, FactorKind kind = FactorKind::kPassThrough);
  // Elementwise with NumPy broadcasting: one factor per result dim, shared by
  // every operand dim it aligns with (right-aligned) unless that operand dim
  // is a broadcast size-1 dim, which gets its own size-1 factor.
  void add_pointwise(FactorKind kind = FactorKind::kPassThrough);

  // Every dim left without a factor gets its own (size = the dim's extent).
  OpShardingRule build();

 private:
  std::vector<TensorType> operand_types_;
  std::vector<TensorType> result_types_;
  OpShardingRule rule_;
};

}  // namespace shardflow
