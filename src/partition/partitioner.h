// Internals of the partitioner shared by its files (private to partition/).
#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "program_builder.h"
#include "shardflow/ir/sharding_rule.h"
#include "shardflow/partition/program.h"

namespace shardflow::partition_detail {

using DimAxes = std::vector<std::vector<int>>;

// Whether `axes` begins with `prefix`.
inline bool starts_with(const std::vector<int>& axes, const std::vector<int>& prefix) {
  return prefix.size() <= axes.size() && std::equal(prefix.begin(), prefix.end(), axes.begin());
}

// Whether each tile of a dim of `size` split `inner_tiles` ways lies inside
// the tile split `outer_tiles` ways (the first axes of the same split) that
// its device holds, padding included: always from a whole dim, otherwise
// when an outer tile is exactly its inner tiles. True of every even split,
// and of some uneven ones: 7 rows in 2 tiles of 4, then 4 tiles of 2.
// Only between nesting layouts do slices, gathers and reduce-scatters keep
// or send each device's own rows.
inline bool tiles_nest(int64_t size, int64_t outer_tiles, int64_t inner_tiles) {
  const auto tile = [size](int64_t tiles) { return ceil_div(size, tiles); };
  return outer_tiles == 1 || tile(outer_tiles) == inner_tiles / outer_tiles * tile(inner_tiles);
}
// The same for a dim split over mesh axes `inner` and over its first
// `outer` of them.
inline bool tiles_nest(const Mesh& mesh, int64_t size, const std::vector<int>& inner, std::size_t outer) {
  int64_t outer_tiles = 1, inner_tiles = 1;
  for (std::size_t k = 0; k < inner.size(); ++k) {
    inner_tiles *= mesh.axis_size(inner[k]);
    if (k < outer) outer_tiles *= mesh.axis_size(inner[k]);
  }
  return tiles_nest(size, outer_tiles, inner_tiles);
}

// A graph value as every device holds it now (its local representation):
// its slot, the mesh axes its dims are split over, its partial sums.
struct LocalValue {
  int slot = -1;
  DimAxes dims;
  std::vector<int> unreduced;  // sorted mesh axes over which the value is a partial result
  ReduceOp reduction = ReduceOp::kSum;
  std::string unreduced_reason;  // why it is partial: the contraction and its origin
};

// Why a value is being resharded: who needs it, and how to describe a dim's
// current sharding.
struct ReshardReason {
  const Value* value = nullptr;            // the graph value
  std::string consumer;                    // "%9 aten::softmax.int", "the annotation at %4", "output 0"
  std::function<std::string(int)> origin;  // describes where dim d's current axes came from
  // A partial sum whose reduction other consumers reuse in other layouts.
  // The partitioner chooses that reduction for all of them; where the
  // search gives up, the fallback reduce-scatters only over all partial
  // axes at once, since a scatter over some then an all-reduce over the
  // rest leaves a result the others must gather again. The search obeys
  // the same rule when asked (one of the partitioner's candidates).
  bool reduction_shared = false;
};

// Whether one all-to-all turns `before` into `after`: every dim keeps its
// axes, loses some from its minor end or gains some at it (none both), the
// axes lost are the axes gained, and the tiles of each dim nest (a dim that
// loses axes is gathered over them, one that gains is sliced: tiles_nest).
bool all_to_all_makes(const Mesh& mesh, const Shape& global, const DimAxes& before, const DimAxes& after);
// The axes such an all-to-all runs over: those each dim loses, dim by dim.
std::vector<int> all_to_all_axes(const DimAxes& before, const DimAxes& after);

// One step of a reshard: a layout move, or a reduction of partial sums.
struct LayoutMove {
  enum class Kind { kAllGather, kAllToAll, kSlice, kPermute, kReduceScatter, kAllReduce, kHalo };
  Kind kind;
  DimAxes after;             // the layout it makes (all that tells an all-to-all)
  int dim = -1;              // the dim gathered, sliced, scattered onto or halo-exchanged
  std::size_t kept = 0;      // axes the gathered dim keeps
  std::vector<int> reduced;  // the partial axes a reduction sums over, in scatter order
  bool operator==(const LayoutMove&) const = default;
};

// Emits what turns `from` into `target` dims with no partial sums; returns
// the new representation. It starts from `from` only: reusing a layout the
// graph value already has elsewhere is Partitioner::move_value_for_use's.
// `made`, when given, gets every representation without partial sums made
// on the way, in order (the result last): the first is the reduction's
// result when `from` is partial. `planned`, when given, are the moves
// cheapest_moves found from `from` (not searched again).
LocalValue emit_reshard(ProgramBuilder& builder, const LocalValue& from, const DimAxes& target, const Shape& global,
                        DType dtype, const ReshardReason& why, std::vector<LocalValue>* made = nullptr,
                        const std::vector<LayoutMove>* planned = nullptr);

// Moves dim `dim` of `from`, whose slot holds tiles of it larger than the
// even (ceil-sized) tiles of its axes, to those tiles by a halo exchange
// (halo.h): a reshape computed in its operand's uneven tiles.
LocalValue even_tiles(ProgramBuilder& builder, const LocalValue& from, int dim, const Shape& global, DType dtype,
                      const ReshardReason& why);

// The moves to `to` that cost least (bytes sent plus kCollectiveLatencyBytes
// per collective), from whichever of `sources` (layouts of the same values)
// that is cheapest; nullopt when the search is too large for the axes
// involved (reshard_search.cc). A source with partial sums (`unreduced`
// axes, all sources alike) is reduced on the way: reduce-scatters onto any
// dim, in any order of its partial axes, and an all-reduce of what is left,
// with layout moves before, between or after them. `reduction_shared`
// (ReshardReason::reduction_shared) allows only a scatter over every
// partial axis at once where the target has them, or an all-reduce, before
// any layout move.
struct CheapestMoves {
  std::size_t source = 0;  // index into the sources
  std::vector<LayoutMove> moves;
};
std::optional<CheapestMoves> cheapest_moves(const Mesh& mesh, const Shape& global, DType dtype,
                                            const std::vector<DimAxes>& sources, const DimAxes& to,
                                            const std::vector<int>& unreduced = {}, bool reduction_shared = false);

// Moves that always reach `to` from `from` (with partial sums over
// `unreduced`), for a reshard too large to search: an all-reduce of the
// partial sums, each dim gathered to the axes it shares with `to` (whole
// where tiles would not nest), then sliced (reshard_search.cc).
std::vector<LayoutMove> direct_moves(const Mesh& mesh, const Shape& global, const LocalValue& from, const DimAxes& to);

// A sharding's axes per dim, without axes of size one: they split nothing
// (a (4,1,2) mesh's 'fsdp'), so the partitioner never spends a collective
// on them.
DimAxes effective_axes(const Mesh& mesh, const Sharding& sharding);

// What choosing an op's factor shardings looks at (factors.cc).
struct FactorChoice {
  const Mesh& mesh;
  const PropagationResult& shardings;
  const Node& node;
  const OpShardingRule& rule;
  const std::vector<const LocalValue*>& current;  // the operands as they are now
  bool partials_kept;                             // its partial operands stay partial
  int addend;                                     // the operand counted once (linear's bias), or -1
};

// Where an op is computed: its results' layouts, filled in by what the
// operands offer (the default); the operands' layouts only; or the
// results' layouts only (a factor a result has whole stays whole, even
// where an operand shards it).
enum class FactorPlan { kResultsThenOperands, kOperandsOnly, kResultsOnly };

// The mesh axes of each factor under one plan: contractions the operands
// already agree on, then (by the plan) the layouts propagation gave the
// results and what the operands' layouts offer. Costing the plans against
// each other is the Partitioner's (factors_of_cheapest_plan).
std::vector<std::vector<int>> factors_for_plan(const FactorChoice& choice, FactorPlan plan);

// The padded local shape of `global` under `dims`.
Shape padded_shape(const Mesh& mesh, const Shape& global, const DimAxes& dims);

}  // namespace shardflow::partition_detail
