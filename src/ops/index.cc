#include "families.h"

namespace shardflow::ops {

void register_index_ops(OpRegistry&) {}

}  // namespace shardflow::ops
