// The allocator's side of device_memory(): the counter of this thread's
// current DeviceMemoryScope, credited with each buffer's size and debited when
// that buffer is freed.
#pragma once

#include <cstdint>

#include "shardflow/tensor/device_memory.h"

namespace shardflow::detail {

DeviceMemoryCounter* current_device_memory_counter();  // null outside any scope
void count_allocation(DeviceMemoryCounter& counter, int64_t bytes);
void count_free(DeviceMemoryCounter& counter, int64_t bytes);

}  // namespace shardflow::detail
