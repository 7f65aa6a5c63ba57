#include "shardflow/runtime/communicator.h"

#include <fmt/format.h>

#include <algorithm>

#include "shardflow/base/error.h"

namespace shardflow {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

int DeviceGroup::rank_of(int64_t device) const {
  const auto it = std::find(devices.begin(), devices.end(), device);
  if (it == devices.end()) {
    throw Error(fmt::format("device {} is not in the group {}", device, to_string()));
  }
  return static_cast<int>(it - devices.begin());
}

std::string DeviceGroup::to_string() const { return fmt::format("[{}]", fmt::join(devices, ", ")); }

}  // namespace shardflow
