#include "families.h"

namespace shardflow::ops {

void register_matmul_ops(OpRegistry&) {}

}  // namespace shardflow::ops
