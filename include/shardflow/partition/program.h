// The SPMD program: one instruction list that every device runs on its own
// shards, parameterised by the device's mesh coordinates (which shard it
// holds, which groups it talks to). Its size does not depend on the number of
// devices.
//
// Local buffers live in numbered slots. Each slot holds the device's shard of
// some value: a dim sharded over mesh axes A holds ceil(size / |A|) entries
// (the padded shard size), of which the device's tile t (its coordinates over
// A, major to minor) covers [min(t * s, size), min((t + 1) * s, size)).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardflow/ir/graph.h"
#include "shardflow/propagation/propagation.h"
#include "shardflow/sharding/sharding.h"

namespace shardflow {

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kCollectivePermute };
// "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"
std::string_view to_string(CollectiveKind kind);

// A collective as the program reports it.
struct CollectiveInfo {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::vector<int> axes;  // the mesh axes it runs over
  ReduceOp reduction = ReduceOp::kSum;
  int64_t bytes_per_device = 0;  // the larger local buffer: what a reduce takes in (all-reduce,
                                 // reduce-scatter), what a gather puts out (all-gather)
  const Value* value = nullptr;  // the graph value it moves
  int rounds = 1;                // a halo exchange's collective-permutes (halo.h); bytes_per_device
                                 // is what a device sends at most in all of them
  std::string reason;            // one line: why it is there, with the origin of the sharding
  // The device groups it runs in (one per combination of the other axes).
  std::vector<std::vector<int64_t>> groups(const Mesh& mesh) const;
  // "all-reduce over 'model' (2 MiB/device): <reason>"
  std::string describe(const Mesh& mesh) const;
};

enum class InstructionKind {
  kCompute,      // run an op's kernel on local shards
  kCollective,   // see `collective`
  kLocalSlice,   // keep the device's tile of a dim (no communication)
  kMaskPadding,  // overwrite a dim's padding with `fill` (before a reduction over it)
  kCountOnce,    // keep the value where the coordinates over `axes_before` are all 0, zero it
                 // elsewhere: a partial sum over those axes then adds it once (linear's bias)
};

struct Instruction {
  InstructionKind kind = InstructionKind::kCompute;
  std::vector<int> inputs;   // slots
  std::vector<int> outputs;  // slots
  // kCompute: the op and its arguments for local shapes (tensor indices refer
  // to `inputs`).
  const OpDef* op = nullptr;
  std::optional<OpArgs> args;  // bound once by the partitioner, not on every run
  // The op only reinterprets its operand on the local shapes
  // (reinterprets_operand): the output is the input's buffer under the
  // output slot's shape, without a kernel call.
  bool reinterprets = false;
  // kCollective: index into PartitionedProgram::collectives.
  int collective = -1;
  // Dims: the tensor dim a gather, scatter, slice or mask works on; for
  // all-to-all, the first dim split and the last gathered (for reading:
  // dims_before and dims_after say what it does).
  int dim = 0;
  int concat_dim = 0;
  int64_t global_size = 0;       // the dim's global extent
  std::vector<int> axes_before;  // the dim's sharding before (slices, masks); count-once's axes
  std::vector<int> axes_after;   // and after
  // Collective-permute: every dim's sharding before and after (the same tile
  // count per dim, over other axes or in another order). All-to-all: the
  // same, each dim keeping its axes, losing some from its minor end or
  // gaining some there; the axes lost are those gained. A collective-permute
  // without them is a halo exchange (halo.h) of dim `dim` of `global_size`
  // rows from tiles over `axes_before` to tiles over `axes_after`.
  std::vector<std::vector<int>> dims_before, dims_after;
  double fill = 0;   // kMaskPadding
  double scale = 1;  // kCompute: multiply the result by it (mean over a sharded dim)
  // kCompute of a lookup in shards (an indexed factor, OpDef::windowed_kernel):
  // the input whose dim `dim` of `global_size` rows is split over
  // `axes_before`; -1 for a plain kernel call. indexed_write: the op writes
  // those rows (index_copy) rather than looking them up.
  int indexed_input = -1;
  bool indexed_write = false;
  // kCompute of a position-dependent op (OpDef::position_dependent): each
  // result dim's sharding, from which a device finds where its tile lies in
  // the result (the result slot's type is the tile's padded shape).
  std::vector<std::vector<int>> tile_axes;
  Shape global_shape;  // the result's
  // Input slots this instruction reads last (program outputs never): a device
  // drops them after it, so it holds only the values still ahead of it, and
  // a compute instruction that reads such a slot once takes it as the sole
  // holder (a donated KV cache is updated in place).
  std::vector<int> releases;
};

struct PartitionedProgram {
  std::shared_ptr<const Mesh> mesh;
  std::vector<TensorType> slots;  // local (padded) types
  std::vector<Instruction> instructions;
  std::vector<int> input_slots;            // one per graph input
  std::vector<Sharding> input_shardings;   // the layout each input is fed in
  std::vector<int> output_slots;           // one per graph output
  std::vector<Sharding> output_shardings;  // the layout each output comes out in
  std::vector<TensorType> output_types;    // their global types
  std::vector<CollectiveInfo> collectives;
  // Propagation's warnings (PropagationResult::warnings), then full
  // rematerialisations, with the op that caused them.
  std::vector<std::string> warnings;

  // The per-device program as text, one instruction per line.
  std::string to_string(const Graph& graph) const;
};

// Partitions a graph whose values have shardings (propagate_shardings).
PartitionedProgram partition_graph(const Graph& graph, const PropagationResult& shardings);

// The padded local shape of a tensor under a sharding.
Shape local_shape(const Shape& global, const Sharding& sharding);

}  // namespace shardflow
