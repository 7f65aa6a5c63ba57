// Appending to the partitioned program, and what the collectives appended
// cost (program_builder.h).
#include "program_builder.h"

#include <fmt/format.h>

#include <utility>

namespace shardflow::partition_detail {

int ProgramBuilder::new_slot(const TensorType& local_type) {
  program_.slots.push_back(local_type);
  return static_cast<int>(program_.slots.size() - 1);
}

int ProgramBuilder::add_collective(CollectiveInfo info) {
  program_.collectives.push_back(std::move(info));
  return static_cast<int>(program_.collectives.size() - 1);
}

ProgramBuilder::Mark ProgramBuilder::mark() const {
  return {program_.slots.size(), program_.instructions.size(), program_.collectives.size(), program_.warnings.size()};
}

void ProgramBuilder::rollback(const Mark& mark) {
  program_.slots.resize(mark.slots);
  program_.instructions.resize(mark.instructions);
  program_.collectives.resize(mark.collectives);
  program_.warnings.resize(mark.warnings);
}

double ring_bytes_sent(CollectiveKind kind, double group_size, double bytes) {
  const double n = group_size;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2 * (n - 1) / n * bytes;  // reduce-scatter + all-gather
    case CollectiveKind::kCollectivePermute:
      return bytes;
    default:
      return (n - 1) / n * bytes;  // reduce-scatter, all-gather, all-to-all
  }
}

double ProgramBuilder::cost_since(const Mark& mark) const {
  double sent = kCollectiveLatencyBytes * static_cast<double>(program_.collectives.size() - mark.collectives);
  for (std::size_t c = mark.collectives; c < program_.collectives.size(); ++c) {
    const CollectiveInfo& info = program_.collectives[c];
    sent += ring_bytes_sent(info.kind, static_cast<double>(axes_size(info.axes)),
                            static_cast<double>(info.bytes_per_device));
    sent += kCollectiveLatencyBytes * (info.rounds - 1);
  }
  return sent;
}

std::string ProgramBuilder::axes_text(const std::vector<int>& axes) const {
  std::string out;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    out += fmt::format("{}'{}'", i > 0 ? ", " : "", mesh_.axis_label(axes[i]));
  }
  return axes.size() == 1 ? out : "(" + out + ")";
}

}  // namespace shardflow::partition_detail
