// The op set of shardflow. Each family file in src/ops/ defines its ops in
// one place (schema, shape/dtype inference, sharding rule, CPU kernel) and
// ends with one register function; register_all_ops() calls them in
// alphabetical order, once.
#pragma once

namespace shardflow::ops {

// Fills op_registry() (idempotent, thread-safe).
void register_all_ops();

}  // namespace shardflow::ops
