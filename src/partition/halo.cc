// The rounds of a halo exchange (shardflow/partition/halo.h).
#include "shardflow/partition/halo.h"

#include <algorithm>
#include <numeric>

#include "program_builder.h"

namespace shardflow {

using partition_detail::axes_size;
using partition_detail::ceil_div;

namespace {

// Coordinates over the group's axes (by position in `axes`) <-> member index.
class Group {
 public:
  Group(const Mesh& mesh, std::vector<int> axes) : mesh_(mesh), axes_(std::move(axes)) {}

  int64_t size() const { return axes_size(mesh_, axes_); }

  // The member's coordinate on each mesh axis (0 off the group's axes).
  std::vector<int64_t> coords(int64_t member) const {
    std::vector<int64_t> out(static_cast<std::size_t>(mesh_.num_axes()), 0);
    for (std::size_t k = axes_.size(); k-- > 0;) {
      out[static_cast<std::size_t>(axes_[k])] = member % mesh_.axis_size(axes_[k]);
      member /= mesh_.axis_size(axes_[k]);
    }
    return out;
  }

  int64_t member(const std::vector<int64_t>& coords) const { return tile(coords, axes_); }

  // The tile a member's coordinates select over `over` (major first).
  int64_t tile(const std::vector<int64_t>& coords, const std::vector<int>& over) const {
    int64_t t = 0;
    for (int axis : over) t = t * mesh_.axis_size(axis) + coords[static_cast<std::size_t>(axis)];
    return t;
  }

  // `coords` with the coordinates over `over` set to select tile `t`.
  std::vector<int64_t> with_tile(std::vector<int64_t> coords, const std::vector<int>& over, int64_t t) const {
    for (std::size_t k = over.size(); k-- > 0;) {
      coords[static_cast<std::size_t>(over[k])] = t % mesh_.axis_size(over[k]);
      t /= mesh_.axis_size(over[k]);
    }
    return coords;
  }

 private:
  const Mesh& mesh_;
  std::vector<int> axes_;
};

}  // namespace

int64_t HaloSchedule::rows_sent() const { return std::accumulate(round_rows.begin(), round_rows.end(), int64_t{0}); }

HaloSchedule halo_schedule(const Mesh& mesh, int64_t size, const std::vector<int>& before,
                           const std::vector<int>& after, int64_t held_rows) {
  HaloSchedule schedule;
  schedule.axes = before;
  for (int axis : after) {
    if (std::find(before.begin(), before.end(), axis) == before.end()) schedule.axes.push_back(axis);
  }
  const Group group(mesh, schedule.axes);
  if (size <= 0) return schedule;  // no rows: nothing to send
  const int64_t held = held_rows > 0 ? held_rows : ceil_div(size, axes_size(mesh, before));
  const int64_t wanted = ceil_div(size, axes_size(mesh, after));
  // Each member's missing rows, tile by tile of the layout before, from the
  // member that holds that tile and agrees with it on every other axis.
  std::vector<HaloTransfer> transfers;
  for (int64_t target = 0; target < group.size(); ++target) {
    const std::vector<int64_t> coords = group.coords(target);
    const int64_t begin = std::min(group.tile(coords, after) * wanted, size);
    const int64_t end = std::min(begin + wanted, size);
    const int64_t own = group.tile(coords, before);
    for (int64_t source_tile = begin / held; begin < end && source_tile * held < end; ++source_tile) {
      if (source_tile == own) continue;
      const int64_t source = group.member(group.with_tile(coords, before, source_tile));
      transfers.push_back(
          {source, target, std::max(begin, source_tile * held), std::min(end, (source_tile + 1) * held)});
    }
  }
  // Rounds, first fit: a member sends at most once and receives at most once
  // in each.
  std::vector<std::vector<bool>> sending, receiving;
  for (const HaloTransfer& transfer : transfers) {
    std::size_t round = 0;
    while (round < schedule.rounds.size() && (sending[round][static_cast<std::size_t>(transfer.source)] ||
                                              receiving[round][static_cast<std::size_t>(transfer.target)])) {
      ++round;
    }
    if (round == schedule.rounds.size()) {
      schedule.rounds.emplace_back();
      schedule.round_rows.push_back(0);
      sending.emplace_back(static_cast<std::size_t>(group.size()), false);
      receiving.emplace_back(static_cast<std::size_t>(group.size()), false);
    }
    schedule.rounds[round].push_back(transfer);
    schedule.round_rows[round] = std::max(schedule.round_rows[round], transfer.end - transfer.begin);
    sending[round][static_cast<std::size_t>(transfer.source)] = true;
    receiving[round][static_cast<std::size_t>(transfer.target)] = true;
  }
  return schedule;
}

}  // namespace shardflow
