#include "profile_report.h"

#include <fmt/format.h>

#include <algorithm>

namespace shardflow::cli {

std::optional<ProfileReport> report_of(const std::shared_ptr<OpProfile>& profile) {
  if (!profile || profile->function_calls() == 0) return std::nullopt;
  const std::vector<int64_t> devices = profile->devices();
  if (devices.empty()) return std::nullopt;
  ProfileReport r;
  r.device = devices.front();
  r.calls = profile->function_calls();
  r.ops = profile->entries(r.device);
  const double calls = static_cast<double>(r.calls), seconds = profile->function_seconds();
  r.ms_per_call = seconds * 1e3 / calls;
  double in_ops = 0;
  for (const OpProfile::Entry& e : r.ops) in_ops += e.seconds;
  r.outside_ops_ms = std::max(0.0, seconds - in_ops) * 1e3 / calls;
  return r;
}

nlohmann::ordered_json profile_json(const ProfileReport& r) {
  nlohmann::ordered_json ops = nlohmann::ordered_json::array();
  const double calls = static_cast<double>(r.calls);
  for (const OpProfile::Entry& e : r.ops) {
    const double ms = e.seconds * 1e3 / calls;
    ops.push_back({{"op", e.op},
                   {"calls_per_call", static_cast<double>(e.calls) / calls},
                   {"ms_per_call", ms},
                   {"share", r.ms_per_call > 0 ? ms / r.ms_per_call : 0.0}});
  }
  return {{"device", r.device},
          {"calls", r.calls},
          {"ms_per_call", r.ms_per_call},
          {"ops", ops},
          {"outside_ops_ms_per_call", r.outside_ops_ms}};
}

std::string profile_text(const std::string& title, const ProfileReport& r) {
  const double calls = static_cast<double>(r.calls);
  std::string out = fmt::format("{} profile, device {}: {:.3f} ms per call, mean of {} call(s); per call:\n", title,
                                r.device, r.ms_per_call, r.calls);
  out += fmt::format("  {:<40} {:>7} {:>10} {:>7}\n", "op", "calls", "ms", "share");
  const auto share = [&](double ms) { return r.ms_per_call > 0 ? 100 * ms / r.ms_per_call : 0.0; };
  for (const OpProfile::Entry& e : r.ops) {
    const double ms = e.seconds * 1e3 / calls;
    out += fmt::format("  {:<40} {:>7.4g} {:>10.3f} {:>6.1f}%\n", e.op, static_cast<double>(e.calls) / calls, ms,
                       share(ms));
  }
  // The interpreter or executor, feeding inputs, collecting outputs, and on
  // several devices waiting for the others to finish.
  out += fmt::format("  {:<40} {:>7} {:>10.3f} {:>6.1f}%\n", "(outside ops)", "", r.outside_ops_ms,
                     share(r.outside_ops_ms));
  return out;
}

}  // namespace shardflow::cli
