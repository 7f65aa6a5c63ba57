// The custom op that carries a sharding annotation through traced graphs:
//   xla::dynamo_mark_sharding(Tensor t, int[] device_ids, str mesh_shape,
//                             str axis_names, str partition_spec) -> Tensor
// Its value is the input (identity); its meaning is a sharding constraint on
// its result. The mesh and spec travel as ints and strings, serialised as
// PyTorch/XLA does (sharding-semantics §4.2):
//   device_ids [0, 1, ..., 7], mesh_shape "(4, 1, 2)",
//   axis_names "('data', 'fsdp', 'model')" or "None", partition_spec "(0, None, 2)".
// The mark_sharding() users call, which records it, is
// shardflow/trace/mark_sharding.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shardflow/ir/op_def.h"
#include "shardflow/sharding/sharding.h"

namespace shardflow::ops {

inline constexpr const char* kMarkShardingOp = "xla::dynamo_mark_sharding";

struct MarkShardingStrings {
  std::vector<int64_t> device_ids;
  std::string mesh_shape;
  std::string axis_names;
  std::string partition_spec;
};

MarkShardingStrings encode_mark_sharding(const Mesh& mesh, const PartitionSpec& spec);

// The sharding an xla::dynamo_mark_sharding call asks for on a tensor of
// `rank`, validated as PyTorch/XLA does (mesh checks, then the rank, then the
// spec against the mesh); errors name what was wrong in the op's arguments.
Sharding decode_mark_sharding(const OpArgs& args, int64_t rank);

}  // namespace shardflow::ops
