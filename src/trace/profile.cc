#include "shardflow/trace/profile.h"

#include <algorithm>

namespace shardflow {

void OpProfile::add_run(int64_t device, const std::vector<Entry>& ops) {
  const std::lock_guard lock(mutex_);
  std::map<std::string, Entry>& totals = by_device_[device];
  for (const Entry& op : ops) {
    Entry& total = totals[op.op];
    total.op = op.op;
    total.calls += op.calls;
    total.seconds += op.seconds;
  }
}

void OpProfile::add_function_call(double seconds) {
  const std::lock_guard lock(mutex_);
  ++function_calls_;
  function_seconds_ += seconds;
}

std::vector<int64_t> OpProfile::devices() const {
  const std::lock_guard lock(mutex_);
  std::vector<int64_t> out;
  for (const auto& [device, totals] : by_device_) out.push_back(device);
  return out;
}

std::vector<OpProfile::Entry> OpProfile::entries(int64_t device) const {
  const std::lock_guard lock(mutex_);
  std::vector<Entry> out;
  const auto found = by_device_.find(device);
  if (found == by_device_.end()) return out;
  for (const auto& [op, entry] : found->second) out.push_back(entry);
  std::stable_sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
  return out;
}

int64_t OpProfile::function_calls() const {
  const std::lock_guard lock(mutex_);
  return function_calls_;
}

double OpProfile::function_seconds() const {
  const std::lock_guard lock(mutex_);
  return function_seconds_;
}

void OpProfile::clear() {
  const std::lock_guard lock(mutex_);
  by_device_.clear();
  function_calls_ = 0;
  function_seconds_ = 0;
}

}  // namespace shardflow
