// The checks every member runs over all calls of a collective, after the
// first barrier and before touching any buffer. They read only the published
// calls, so every member throws the same error.
//
// Errors name the collective, the group, the device(s) at fault and both
// values: "all_reduce over group [0, 1]: device 0 passes 16 bytes but
// device 1 passes 12 bytes".
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "collective_call.h"
#include "shardflow/base/error.h"

namespace shardflow::detail {

namespace {

// The calls of one collective, with the names used in messages.
class Calls {
 public:
  Calls(const DeviceGroup& group, std::span<const CallInfo* const> calls) : group_(group), calls_(calls) {}

  int size() const { return static_cast<int>(calls_.size()); }
  const CallInfo& operator[](int member) const { return *calls_[static_cast<std::size_t>(member)]; }
  int64_t device(int member) const { return group_.devices[static_cast<std::size_t>(member)]; }
  const DeviceGroup& group() const { return group_; }
  std::string group_text() const { return group_.to_string(); }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("{} over group {}: {}", collective_name((*this)[0].kind), group_text(), what));
  }

 private:
  const DeviceGroup& group_;
  std::span<const CallInfo* const> calls_;
};

}  // namespace

static bool overlaps(const std::byte* a, std::size_t a_bytes, const std::byte* b, std::size_t b_bytes) {
  // Null: a call known only by its sizes (the MPI backend's view of others).
  if (a_bytes == 0 || b_bytes == 0 || a == nullptr || b == nullptr) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

static void check_same_kind(const Calls& calls) {
  for (int m = 1; m < calls.size(); ++m) {
    if (calls[m].kind != calls[0].kind) {
      throw Error(fmt::format("collective mismatch over group {}: device {} calls {} but device {} calls {}",
                              calls.group_text(), calls.device(0), collective_name(calls[0].kind), calls.device(m),
                              collective_name(calls[m].kind)));
    }
  }
}

static void check_same_input_bytes(const Calls& calls) {
  for (int m = 1; m < calls.size(); ++m) {
    if (calls[m].input_bytes != calls[0].input_bytes) {
      calls.fail(fmt::format("device {} passes {} input bytes but device {} passes {}", calls.device(0),
                             calls[0].input_bytes, calls.device(m), calls[m].input_bytes));
    }
  }
}

// Same dtype and reduction everywhere; sizes in whole, aligned elements.
static void check_reduction(const Calls& calls) {
  const CallInfo& first = calls[0];
  for (int m = 0; m < calls.size(); ++m) {
    const CallInfo& call = calls[m];
    if (call.dtype != first.dtype) {
      calls.fail(fmt::format("device {} passes {} data but device {} passes {} data", calls.device(0),
                             dtype_name(first.dtype), calls.device(m), dtype_name(call.dtype)));
    }
    if (call.op != first.op) {
      calls.fail(fmt::format("device {} reduces with {} but device {} with {}", calls.device(0),
                             reduce_op_name(first.op), calls.device(m), reduce_op_name(call.op)));
    }
    const std::size_t element = element_size(call.dtype);
    for (const auto& [pointer, bytes] : {std::pair{call.input, call.input_bytes},
                                         std::pair<const std::byte*, std::size_t>{call.output, call.output_bytes}}) {
      if (bytes % element != 0) {
        calls.fail(fmt::format("device {} passes {} bytes, not a whole number of {} elements", calls.device(m), bytes,
                               dtype_name(call.dtype)));
      }
      if (bytes != 0 && reinterpret_cast<uintptr_t>(pointer) % element != 0) {
        calls.fail(fmt::format("device {} passes a buffer not aligned to {} bytes for {}", calls.device(m), element,
                               dtype_name(call.dtype)));
      }
    }
  }
}

// Input and output of every member do not overlap, or (when in place is
// allowed) the smaller one is exactly chunk `rank` of the larger one.
static void check_overlap(const Calls& calls, bool in_place_allowed) {
  for (int m = 0; m < calls.size(); ++m) {
    const CallInfo& call = calls[m];
    if (!overlaps(call.input, call.input_bytes, call.output, call.output_bytes)) continue;
    if (in_place_allowed) {
      const auto chunk = std::min(call.input_bytes, call.output_bytes);
      const auto offset = static_cast<std::size_t>(m) * chunk;
      if (call.input_bytes <= call.output_bytes && call.input == call.output + offset) continue;
      if (call.output_bytes <= call.input_bytes && call.output == call.input + offset) continue;
    }
    calls.fail(fmt::format("device {} passes overlapping input and output buffers{}", calls.device(m),
                           in_place_allowed ? " (only its own chunk may be shared)" : ""));
  }
}

// Every member's input splits into `chunks` equal chunks of whole elements
// (bytes when `dtype` is not given).
static void check_splits(const Calls& calls, std::size_t chunks, std::optional<DType> dtype) {
  const std::size_t element = dtype ? element_size(*dtype) : 1;
  for (int m = 0; m < calls.size(); ++m) {
    const std::size_t count = calls[m].input_bytes / element;
    if (count % chunks != 0) {
      calls.fail(fmt::format("device {} passes {} {}, which do not split into {} equal chunks", calls.device(m), count,
                             dtype ? fmt::format("{} elements", dtype_name(*dtype)) : "input bytes", chunks));
    }
  }
}

// Every member's output has input_bytes * numerator / denominator bytes.
static void check_output_bytes(const Calls& calls, std::size_t numerator, std::size_t denominator) {
  for (int m = 0; m < calls.size(); ++m) {
    const CallInfo& call = calls[m];
    const std::size_t expected = call.input_bytes * numerator / denominator;
    if (call.output_bytes != expected) {
      calls.fail(
          fmt::format("device {} passes {} input bytes and {} output bytes; with {} "
                      "members the output must have {} bytes",
                      calls.device(m), call.input_bytes, call.output_bytes, calls.size(), expected));
    }
  }
}

static void check_pairs(const Calls& calls) {
  const auto& pairs = *calls[0].pairs;
  auto text = [](const std::vector<std::pair<int64_t, int64_t>>& list) {
    std::string out = "[";
    for (const auto& [source, target] : list) {
      out += fmt::format("{}({}, {})", out.size() > 1 ? ", " : "", source, target);
    }
    return out + "]";
  };
  for (int m = 1; m < calls.size(); ++m) {
    if (*calls[m].pairs != pairs) {
      calls.fail(fmt::format("device {} passes pairs {} but device {} passes {}", calls.device(0), text(pairs),
                             calls.device(m), text(*calls[m].pairs)));
    }
  }
  const auto& devices = calls.group().devices;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    for (int64_t device : {pairs[i].first, pairs[i].second}) {
      if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
        calls.fail(fmt::format("pair ({}, {}) names device {}, which is not in the group", pairs[i].first,
                               pairs[i].second, device));
      }
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (pairs[j].second == pairs[i].second) {
        calls.fail(fmt::format("device {} is the target of two pairs, ({}, {}) and ({}, {})", pairs[i].second,
                               pairs[j].first, pairs[j].second, pairs[i].first, pairs[i].second));
      }
    }
  }
}

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kCollectivePermute:
      return "collective_permute";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

void check_calls(const DeviceGroup& group, std::span<const CallInfo* const> calls_in) {
  const Calls calls(group, calls_in);
  check_same_kind(calls);
  const auto n = static_cast<std::size_t>(calls.size());
  switch (calls[0].kind) {
    case CollectiveKind::kAllReduce:
      check_reduction(calls);
      check_same_input_bytes(calls);
      return;
    case CollectiveKind::kAllGather:
      check_same_input_bytes(calls);
      check_output_bytes(calls, n, 1);
      check_overlap(calls, true);
      return;
    case CollectiveKind::kReduceScatter:
      check_reduction(calls);
      check_same_input_bytes(calls);
      check_splits(calls, n, calls[0].dtype);
      check_output_bytes(calls, 1, n);
      check_overlap(calls, true);
      return;
    case CollectiveKind::kAllToAll:
      check_same_input_bytes(calls);
      check_splits(calls, n, std::nullopt);
      check_output_bytes(calls, 1, 1);
      check_overlap(calls, false);
      return;
    case CollectiveKind::kCollectivePermute:
      check_same_input_bytes(calls);
      check_output_bytes(calls, 1, 1);
      check_pairs(calls);
      check_overlap(calls, false);
      return;
    case CollectiveKind::kBarrier:
      return;
  }
}

}  // namespace shardflow::detail
