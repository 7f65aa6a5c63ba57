#include "families.h"

namespace shardflow::ops {

void register_reduction_ops(OpRegistry&) {}

}  // namespace shardflow::ops
