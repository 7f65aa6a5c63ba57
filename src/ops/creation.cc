#include "families.h"

namespace shardflow::ops {

void register_creation_ops(OpRegistry&) {}

}  // namespace shardflow::ops
