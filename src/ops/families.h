// The register functions of the op families (private to ops/).
#pragma once

#include "shardflow/ir/op_def.h"

namespace shardflow::ops {

void register_annotation_ops(OpRegistry& registry);
void register_attention_ops(OpRegistry& registry);
void register_creation_ops(OpRegistry& registry);
void register_elementwise_ops(OpRegistry& registry);
void register_index_ops(OpRegistry& registry);
void register_matmul_ops(OpRegistry& registry);
void register_normalization_ops(OpRegistry& registry);
void register_reduction_ops(OpRegistry& registry);
void register_shape_ops(OpRegistry& registry);

}  // namespace shardflow::ops
