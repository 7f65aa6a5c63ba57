// A text picture of which device holds which block of a tensor, for tensors
// of any rank (JAX and PyTorch only draw 1-D and 2-D).
//
// The two split dims with the most shards form the grid; each further split
// dim gets one grid per shard, with a heading. A cell lists the devices
// holding that block (all replicas), compressed as ranges ("0-3,8").
//
//            dim 1
//            [0:5]   [5:10]  [10:15] [15:20]
//          +-------+-------+-------+-------+
//   [0:5]  | 0,4   | 1,5   | 2,6   | 3,7   |
//   dim 0  ...
#pragma once

#include <string>

#include "shardflow/sharding/shard_layout.h"

namespace shardflow {

// `label_ranges` false labels blocks by shard index ("#0") instead of the
// global index ranges ("[0:5]"), for layouts drawn without a real shape.
std::string draw_shard_layout(const ShardLayout& layout, bool label_ranges = true);

// "0-3,8,10-11": sorted ids with runs of 3 or more as ranges.
std::string compress_device_list(std::vector<int64_t> devices);

}  // namespace shardflow
