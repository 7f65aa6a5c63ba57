// Tensor memory by device, as torch.cuda.memory_allocated and
// max_memory_allocated report it: the bytes of tensor buffers a device's
// programs allocated that are still alive, and the most there were since the
// last reset.
//
// A buffer counts for the device whose DeviceMemoryScope was active on the
// allocating thread (the runtime opens one around each device's part of a
// compiled program, and around one-device runs); buffers made outside any
// scope (host tensors, weights loaded by the caller) are not counted. So a
// device's peak during a step, minus its current bytes before the step, is
// what the step needed on top of the tensors it was given.
#pragma once

#include <cstdint>

namespace shardflow {

namespace detail {
struct DeviceMemoryCounter;
}

struct DeviceMemory {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
};

DeviceMemory device_memory(int64_t device);

// Every device's peak becomes its current bytes.
void reset_device_memory_peaks();

// While it lives, tensor buffers this thread allocates count for `device`.
// Scopes nest; the innermost wins.
class DeviceMemoryScope {
 public:
  explicit DeviceMemoryScope(int64_t device);
  ~DeviceMemoryScope();
  DeviceMemoryScope(const DeviceMemoryScope&) = delete;
  DeviceMemoryScope& operator=(const DeviceMemoryScope&) = delete;

 private:
  detail::DeviceMemoryCounter* previous_;
};

}  // namespace shardflow
