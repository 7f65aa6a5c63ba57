// mark_sharding: one API for eager and compiled code (sharding-semantics §2).
//
// On a concrete tensor it lays the data out across the devices as the shard
// layout says (per-device padded buffers); inside compile() it records
// xla::dynamo_mark_sharding (shardflow/ops/annotation.h) with the mesh and
// spec serialised as PyTorch/XLA does. No flag selects between the two. The
// tensor is annotated in place and returned, so both `mark_sharding(w, ...)`
// and `h = mark_sharding(h, ...)` work.
#pragma once

#include "shardflow/sharding/mesh.h"
#include "shardflow/sharding/partition_spec.h"
#include "shardflow/trace/tensor.h"

namespace shardflow {

// Errors, with PyTorch/XLA's messages: the spec's length must equal the rank;
// the spec must fit the mesh; a concrete tensor already laid out with another
// non-replicated sharding must be cleared first ("Existing annotation must be
// cleared first: ..."). The same sharding again is a no-op.
Tensor mark_sharding(const Tensor& tensor, const Mesh& mesh, const PartitionSpec& spec);

// Gathers an eagerly sharded tensor back into one value; returns it.
Tensor clear_sharding(const Tensor& tensor);

}  // namespace shardflow
