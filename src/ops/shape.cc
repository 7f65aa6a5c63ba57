#include "families.h"

namespace shardflow::ops {

void register_shape_ops(OpRegistry&) {}

}  // namespace shardflow::ops
