#include <mutex>

#include "families.h"
#include "shardflow/ops/ops.h"

namespace shardflow::ops {

void register_all_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    OpRegistry& registry = op_registry();
    register_annotation_ops(registry);
    register_attention_ops(registry);
    register_creation_ops(registry);
    register_elementwise_ops(registry);
    register_index_ops(registry);
    register_matmul_ops(registry);
    register_normalization_ops(registry);
    register_reduction_ops(registry);
    register_shape_ops(registry);
  });
}

}  // namespace shardflow::ops
