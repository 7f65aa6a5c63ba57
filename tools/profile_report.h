// The per-op profile tables of `shardflow llama --profile` and
// `shardflow run --profile`.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "shardflow/trace/profile.h"

namespace shardflow::cli {

// One program's profile, per call, on the first device that reported
// (this process's device under MPI).
struct ProfileReport {
  int64_t device = 0, calls = 0;
  double ms_per_call = 0, outside_ops_ms = 0;
  std::vector<OpProfile::Entry> ops;  // totals
};

// Nothing when the program never ran.
std::optional<ProfileReport> report_of(const std::shared_ptr<OpProfile>& profile);

// {"device", "calls", "ms_per_call", "ops": [{"op", "calls_per_call",
// "ms_per_call", "share"}], "outside_ops_ms_per_call"}
nlohmann::ordered_json profile_json(const ProfileReport& report);

// A table headed "<title> profile, device d: ...", one row per op kind.
std::string profile_text(const std::string& title, const ProfileReport& report);

}  // namespace shardflow::cli
