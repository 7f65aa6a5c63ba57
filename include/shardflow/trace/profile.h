// Where compiled programs spend their time: per op kind and per device.
//
//   auto profile = std::make_shared<sf::OpProfile>();
//   step.set_profile(profile);               // a CompiledFunction
//   for (...) step.call(inputs);
//   for (const auto& e : profile->entries(0)) fmt::print("{} {} {}\n", e.op, e.calls, e.seconds);
//
// Each op is timed on its device's thread, wall clock, around its kernel: a
// collective's time includes waiting for the slowest device of its group.
// Timing adds two clock reads per op (tens of nanoseconds each).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace shardflow {

class OpProfile {
 public:
  struct Entry {
    // The op ("aten::linear"), a collective ("all-reduce"), or a partitioner
    // step ("local-slice": a device keeps its tile of a replicated value;
    // "mask-padding": the padded rows of an uneven shard are set before a
    // reduction; "count-once": a bias is zeroed on all but one device of a
    // sharded contraction).
    std::string op;
    int64_t calls = 0;
    double seconds = 0;
  };

  // One run of a program on `device`: per op kind, its calls and seconds.
  // Thread-safe: the devices of a run report from their own threads.
  void add_run(int64_t device, const std::vector<Entry>& ops);
  // One call of the compiled function, from its inputs to its outputs: the
  // guard check (for GuardMode::kReplay that re-runs the function on
  // symbolic tensors), feeding inputs, the ops, the interpreter or executor,
  // waiting for the other devices, collecting outputs; not tracing or
  // partitioning. A call that fails adds nothing, and neither do its ops.
  void add_function_call(double seconds);

  // Devices that reported, in order (a multi-process run: this process's).
  std::vector<int64_t> devices() const;
  // `device`'s totals, the most time first (empty for a device that never ran).
  std::vector<Entry> entries(int64_t device) const;
  // Calls of the compiled function, and their total time.
  int64_t function_calls() const;
  double function_seconds() const;
  void clear();

 private:
  mutable std::mutex mutex_;
  std::map<int64_t, std::map<std::string, Entry>> by_device_;
  int64_t function_calls_ = 0;
  double function_seconds_ = 0;
};

namespace detail {

// One run's op times by kind, for OpProfile::add_run (the interpreter's and
// the executor's). A kind is found by an identity that is cheap to hash
// (the op's definition, say), so timing a run does not look names up per op.
class RunTimes {
 public:
  // Adds one call of the kind with identity `key`; `name()` names it, and
  // is called only the first time.
  template <class NameFn>
  void add(const void* key, double seconds, NameFn&& name) {
    const auto [at, added] = numbers_.emplace(key, kinds_.size());
    if (added) kinds_.push_back({std::string(name()), 0, 0});
    OpProfile::Entry& entry = kinds_[at->second];
    ++entry.calls;
    entry.seconds += seconds;
  }
  // The kinds that ran, with their totals.
  const std::vector<OpProfile::Entry>& totals() const { return kinds_; }

 private:
  std::vector<OpProfile::Entry> kinds_;
  std::unordered_map<const void*, std::size_t> numbers_;
};

}  // namespace detail
}  // namespace shardflow
