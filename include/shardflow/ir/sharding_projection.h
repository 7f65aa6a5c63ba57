// Sharding projection: how a tensor dim's mesh axes map onto the factors of an
// op's sharding rule (sharding_rule.h), and back. Propagation and the
// partitioner both read and write dim shardings through these functions, so
// the two stages agree on what a dim's axes mean for an op.
//
// A dim made of several factors (a reshape's merged dim) holds its factors'
// axes in order, major first: f32[8,6] reshaped to f32[48] maps the 48 dim to
// [i, j] {i=8, j=6}, and its axes [a, b, c] on a mesh {a=2, b=4, c=3} are i's
// [a, b] (2 * 4 = 8, whole), then j's [c]. A factor that is not the dim's last
// must be split exactly: its axes' product divides its size, and it is split
// whole (its axes' product is its size) before the next factor takes any
// axis. The last factor may be split unevenly (the partitioner pads it).
#pragma once

#include <vector>

#include "shardflow/ir/sharding_rule.h"
#include "shardflow/sharding/mesh.h"

namespace shardflow {

// The axes one factor gets from a dim.
struct FactorAxes {
  int factor = 0;
  std::vector<int> axes;  // major to minor; empty: the factor is whole
};

// Splits a dim's axes (major to minor) over the dim's factors (the dim's
// entry of a DimFactors), major first. Returns one entry per factor reached,
// in the dim's order: the factors after a non-last factor that is not split
// whole are not reached (their entries are left out), and the axes no factor
// can take are dropped. With factors [i, j] {i=8, j=6} on {a=2, b=4, c=3}:
// [a, b, c] gives i:[a, b], j:[c]; [a, c] gives i:[a] only (3 does not divide
// 8 / 2, and i is not whole, so j is not reached).
std::vector<FactorAxes> project_to_factors(const Mesh& mesh, const OpShardingRule& rule,
                                           const std::vector<int>& factors, const std::vector<int>& axes);

// The axes a dim gets from its factors' axes (`factor_axes[f]` for each
// factor f of the rule): each factor's axes in the dim's order, up to the
// first non-last factor whose axes do not divide its size (its axes are left
// out) or do not split it whole (its axes are kept, the later factors' are
// not).
struct DimProjection {
  std::vector<int> axes;
  int first_factor = -1;  // the first factor that gave the dim axes (-1: none)
};
DimProjection project_to_dim(const Mesh& mesh, const OpShardingRule& rule, const std::vector<int>& factors,
                             const std::vector<std::vector<int>>& factor_axes);

// project_to_dim for every dim of a tensor (`mapping`: its entry of the
// rule's operands or results).
std::vector<std::vector<int>> project_to_dims(const Mesh& mesh, const OpShardingRule& rule, const DimFactors& mapping,
                                              const std::vector<std::vector<int>>& factor_axes);

}  // namespace shardflow
