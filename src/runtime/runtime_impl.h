// What every kind of runtime implements behind shardflow::Runtime.
#pragma once

#include <functional>
#include <string_view>

#include "shardflow/runtime/runtime.h"

namespace shardflow {

class Runtime::Impl {
 public:
  using Program = std::function<void(int64_t device, Communicator& comm)>;

  virtual ~Impl() = default;
  virtual int64_t num_devices() const = 0;
  virtual int64_t process_index() const { return 0; }
  virtual int64_t process_count() const { return 1; }
  virtual int64_t devices_on_this_host() const { return num_devices(); }
  virtual void run(const Program& program) = 0;
  [[noreturn]] virtual void abort_job(std::string_view message, int status) = 0;
};

}  // namespace shardflow
