// Lowering a reshard to collectives and local slices.
//
// From a representation (dims' axes, partial-sum axes) to target dims, by
// the cheapest sequence of moves (reshard_search.cc): reduce-scatters and
// an all-reduce of the partial sums, collective-permutes, all-to-alls,
// halo exchanges, all-gathers and local slices. Where the search is too
// large (more than 8,192 layouts, seen only with 5 or more axes), the
// direct moves instead (direct_moves), reported: an all-reduce of the
// partial sums, each dim gathered to the axes it shares with the target,
// then sliced. Either way, each move is emitted by apply().
// Example, [{x,y},{}] -> [{x},{}]: one all-gather over 'y' on dim 0.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "partitioner.h"
#include "shardflow/base/error.h"
#include "shardflow/partition/halo.h"

namespace shardflow::partition_detail {

Shape padded_shape(const Mesh& mesh, const Shape& global, const DimAxes& dims) {
  Shape shape = global;
  for (std::size_t d = 0; d < global.size(); ++d) shape[d] = ceil_div(global[d], axes_size(mesh, dims[d]));
  return shape;
}

bool all_to_all_makes(const Mesh& mesh, const Shape& global, const DimAxes& before, const DimAxes& after) {
  std::vector<int> lost, gained;
  for (std::size_t d = 0; d < before.size(); ++d) {
    const std::vector<int>& b = before[d];
    const std::vector<int>& a = after[d];
    const bool loses = a.size() < b.size();
    const bool gains = a.size() > b.size();
    if (!(loses ? starts_with(b, a) : starts_with(a, b))) return false;
    // The dim losing axes is gathered over them, the dim gaining is sliced.
    if (loses && !tiles_nest(mesh, global[d], b, a.size())) return false;
    if (gains && !tiles_nest(mesh, global[d], a, b.size())) return false;
    lost.insert(lost.end(), b.begin() + static_cast<std::ptrdiff_t>(std::min(a.size(), b.size())), b.end());
    gained.insert(gained.end(), a.begin() + static_cast<std::ptrdiff_t>(std::min(a.size(), b.size())), a.end());
  }
  std::sort(lost.begin(), lost.end());
  std::sort(gained.begin(), gained.end());
  return !lost.empty() && lost == gained;
}

std::vector<int> all_to_all_axes(const DimAxes& before, const DimAxes& after) {
  std::vector<int> axes;
  for (std::size_t d = 0; d < before.size(); ++d) {
    if (after[d].size() < before[d].size()) {
      axes.insert(axes.end(), before[d].begin() + static_cast<std::ptrdiff_t>(after[d].size()), before[d].end());
    }
  }
  return axes;
}

namespace {

class Resharder {
 public:
  Resharder(ProgramBuilder& builder, const Shape& global, DType dtype, const ReshardReason& why)
      : b_(builder), global_(global), dtype_(dtype), why_(why) {}

  // The halo exchange from the tiles rep's slot holds on `dim` to the even
  // tiles of the same axes.
  LocalValue even_tiles(const LocalValue& rep, int dim) {
    source_dims_ = rep.dims;
    return emit_halo(rep, dim, rep.dims[static_cast<std::size_t>(dim)]);
  }

  LocalValue run(LocalValue rep, const DimAxes& target, std::vector<LocalValue>* made,
                 const std::vector<LayoutMove>* planned) {
    made_ = made;
    if (rep.dims == target && rep.unreduced.empty()) return rep;
    source_dims_ = rep.dims;
    target_ = &target;
    std::optional<CheapestMoves> found;
    if (planned == nullptr) {
      found = cheapest_moves(b_.mesh(), global_, dtype_, {rep.dims}, target, rep.unreduced, why_.reduction_shared);
      if (!found) {
        searched_ = false;
        b_.warn(
            fmt::format("the reshard of %{} for {} involves too many mesh axes to search for its cheapest "
                        "moves (more than 8,192 layouts): it is reduced, gathered to the axes each dim shares "
                        "with the target and sliced",
                        why_.value->name(), why_.consumer));
      }
    }
    const std::vector<LayoutMove> moves = planned != nullptr ? *planned
                                          : found            ? found->moves
                                                             : direct_moves(b_.mesh(), global_, rep, target);
    for (const LayoutMove& move : moves) rep = apply(rep, move, target);
    return rep;
  }

 private:
  // Whether dim `dim` over `inner` nests in it over its first `outer` axes.
  bool nests(int dim, std::size_t outer, const std::vector<int>& inner) const {
    return tiles_nest(b_.mesh(), global_[static_cast<std::size_t>(dim)], inner, outer);
  }

  void emit(Instruction instruction, const LocalValue& out) {
    b_.emit(std::move(instruction));
    if (made_ != nullptr && out.unreduced.empty()) made_->push_back(out);
  }

  // An instruction from slot `in` to slot `out`, working on `dim`.
  static Instruction step(InstructionKind kind, int in, int out, int dim) {
    Instruction instruction;
    instruction.kind = kind;
    instruction.inputs = {in};
    instruction.outputs = {out};
    instruction.dim = dim;
    return instruction;
  }

  // Where dim `dim` of `rep` got its axes: the value's origin while the dim
  // is as the moves found it.
  std::string origin(int dim, const LocalValue& rep) const {
    const auto d = static_cast<std::size_t>(dim);
    if (source_dims_.size() > d && rep.dims[d] == source_dims_[d]) return why_.origin(dim);
    return "an earlier step of this move";
  }

  // ", on the way to (None, ('a', 'b'))" for a step that does not put the
  // dims where the target has them.
  std::string on_the_way(bool there) const {
    if (there || target_ == nullptr) return "";
    std::vector<std::string> dims;
    for (const std::vector<int>& axes : *target_) dims.push_back(axes.empty() ? "None" : b_.axes_text(axes));
    return fmt::format(", on the way to ({})", fmt::join(dims, ", "));
  }

  int slot_for(const DimAxes& dims) { return b_.new_slot({dtype_, padded_shape(b_.mesh(), global_, dims)}); }

  int64_t bytes(int slot) const { return b_.slot_type(slot).nbytes(); }

  std::string dim_text(int dim) const { return fmt::format("dim {} of %{}", dim, why_.value->name()); }

  int collective(CollectiveKind kind, const std::vector<int>& axes, int64_t bytes_per_device, std::string reason,
                 ReduceOp reduction = ReduceOp::kSum) {
    CollectiveInfo info;
    info.kind = kind;
    info.axes = axes;
    info.reduction = reduction;
    info.bytes_per_device = bytes_per_device;
    info.value = why_.value;
    info.reason = std::move(reason);
    return b_.add_collective(std::move(info));
  }

  // Reported: a whole dim gathered only to be sliced again, because the
  // shards of an uneven dim do not nest (direct moves only: the search has
  // halo exchanges).
  void rematerialised(int dim, const std::vector<int>& from, const std::vector<int>& to) {
    b_.warn(
        fmt::format("involuntary re-materialisation for {}: {} ({} entries) goes from {} to {}; its "
                    "size does not divide evenly, so the shards do not nest and the dim is gathered "
                    "whole, then sliced",
                    why_.consumer, dim_text(dim), global_[static_cast<std::size_t>(dim)],
                    from.empty() ? "whole" : b_.axes_text(from), to.empty() ? "whole" : b_.axes_text(to)));
  }

  // Also reported: axes gathered although the target still splits over them
  // (elsewhere or in another order), or a dim split over other axes right
  // after its gather: a move no single all-to-all or collective-permute here
  // makes, so the dim is briefly whole (over those axes) on every device.
  void regathered(int dim, const std::vector<int>& axes, std::size_t kept, const DimAxes& target) {
    // The dim itself split again after the gather (in the target's order),
    // then the gathered axes the target uses on other dims.
    const std::vector<int>& wanted = target[static_cast<std::size_t>(dim)];
    // (A searched path may keep more axes here than the target gives the dim.)
    std::vector<int> reused(wanted.begin() + static_cast<std::ptrdiff_t>(std::min(kept, wanted.size())), wanted.end());
    for (int axis : axes) {
      for (const std::vector<int>& other : target) {
        if (std::find(other.begin(), other.end(), axis) != other.end() &&
            std::find(reused.begin(), reused.end(), axis) == reused.end()) {
          reused.push_back(axis);
        }
      }
    }
    if (reused.empty()) return;
    b_.warn(
        fmt::format("involuntary re-materialisation for {}: {} is gathered over {} and split over {} again "
                    "(the target splits it or another dim that way), so the dim is whole on every device in "
                    "between; {}",
                    why_.consumer, dim_text(dim), b_.axes_text(axes), b_.axes_text(reused),
                    searched_ ? "no sequence of all-to-alls and collective-permutes found costs less (bytes "
                                "sent plus 64 KiB per collective)"
                              : "the moves were not searched (too many mesh axes)"));
  }

  // A reduce-scatter of partial axes `axes` (in this order) onto the minor
  // end of `dim`.
  LocalValue emit_reduce_scatter(const LocalValue& rep, int dim, const std::vector<int>& axes) {
    LocalValue out = rep;
    std::vector<int>& dim_axes = out.dims[static_cast<std::size_t>(dim)];
    dim_axes.insert(dim_axes.end(), axes.begin(), axes.end());
    std::erase_if(out.unreduced, [&](int axis) { return std::find(axes.begin(), axes.end(), axis) != axes.end(); });
    out.slot = slot_for(out.dims);
    Instruction instruction = step(InstructionKind::kCollective, rep.slot, out.slot, dim);
    const bool there = target_ == nullptr || starts_with((*target_)[static_cast<std::size_t>(dim)], dim_axes);
    instruction.collective = collective(CollectiveKind::kReduceScatter, axes, bytes(rep.slot),
                                        fmt::format("{}; {} wants it sharded on {}{}", rep.unreduced_reason,
                                                    why_.consumer, dim_text(dim), on_the_way(there)),
                                        rep.reduction);
    emit(std::move(instruction), out);
    return out;
  }

  // An all-reduce over every partial axis left.
  LocalValue emit_all_reduce(const LocalValue& rep, const DimAxes& target) {
    LocalValue out = rep;
    out.unreduced.clear();
    out.slot = slot_for(out.dims);
    Instruction instruction = step(InstructionKind::kCollective, rep.slot, out.slot, 0);
    const bool whole = std::all_of(target.begin(), target.end(), [](const std::vector<int>& d) { return d.empty(); });
    instruction.collective =
        collective(CollectiveKind::kAllReduce, rep.unreduced, bytes(rep.slot),
                   whole ? fmt::format("{}; {} needs whole values", rep.unreduced_reason, why_.consumer)
                         : fmt::format("{}; {} needs values reduced over {}", rep.unreduced_reason, why_.consumer,
                                       b_.axes_text(rep.unreduced)),
                   rep.reduction);
    emit(std::move(instruction), out);
    return out;
  }

  // The same tiles on other devices: each dim keeps its tile count, over
  // other axes or in another order ([4@(a,b)] -> [4@(b,a)], [4@a,4@b] ->
  // [4@b,4@a], [4@a] -> [4@b] with |a| = |b|). Tile t of a dim covers the
  // same rows whichever axes count it, so every device receives its new tile
  // whole from one device (a tile replicated over an axis it no longer is
  // goes to several). The group spans the axes used before or after.
  LocalValue permute(LocalValue rep, const DimAxes& target) {
    if (rep.dims == target) return rep;
    std::vector<int> axes;
    for (std::size_t d = 0; d < target.size(); ++d) {
      if (b_.axes_size(rep.dims[d]) != b_.axes_size(target[d])) return rep;
      axes.insert(axes.end(), rep.dims[d].begin(), rep.dims[d].end());
      axes.insert(axes.end(), target[d].begin(), target[d].end());
    }
    std::sort(axes.begin(), axes.end());
    axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
    LocalValue out = rep;
    out.dims = target;
    out.slot = slot_for(out.dims);
    Instruction instruction = step(InstructionKind::kCollective, rep.slot, out.slot, 0);
    instruction.dims_before = rep.dims;
    instruction.dims_after = target;
    std::vector<std::string> moved;
    int first_moved = -1;
    for (std::size_t d = 0; d < target.size(); ++d) {
      if (rep.dims[d] != target[d]) {
        if (first_moved < 0) first_moved = static_cast<int>(d);
        moved.push_back(fmt::format("dim {} from {} to {}", d,
                                    rep.dims[d].empty() ? "whole" : b_.axes_text(rep.dims[d]),
                                    target[d].empty() ? "whole" : b_.axes_text(target[d])));
      }
    }
    instruction.collective =
        collective(CollectiveKind::kCollectivePermute, axes, bytes(rep.slot),
                   fmt::format("{} needs %{} with the same tiles on other devices: {} (sharded by {}){}", why_.consumer,
                               why_.value->name(), fmt::join(moved, ", "), origin(first_moved, rep),
                               on_the_way(target_ == nullptr || target == *target_)));
    emit(std::move(instruction), out);
    return out;
  }

  // One all-to-all from rep's layout to `after` (all_to_all_makes): the
  // dims gaining axes are split, the dims losing them gathered, in one
  // exchange over the axes that move (a search also finds moves between
  // two pairs of dims at once).
  LocalValue emit_all_to_all(const LocalValue& rep, const DimAxes& after) {
    LocalValue out = rep;
    out.dims = after;
    out.slot = slot_for(out.dims);
    Instruction instruction = step(InstructionKind::kCollective, rep.slot, out.slot, -1);
    instruction.dims_before = rep.dims;
    instruction.dims_after = after;
    std::vector<std::string> split, gathered;
    bool there = true;
    for (std::size_t d = 0; d < after.size(); ++d) {
      const int dim = static_cast<int>(d);
      if (after[d].size() > rep.dims[d].size()) {
        if (instruction.dim < 0) instruction.dim = dim;
        const std::vector<int> gained(after[d].begin() + static_cast<std::ptrdiff_t>(rep.dims[d].size()),
                                      after[d].end());
        split.push_back(fmt::format("{} sharded on {}", dim_text(dim), b_.axes_text(gained)));
        // Where the target has them: a prefix of the target's axes for that dim.
        there = there && (target_ == nullptr || starts_with((*target_)[d], after[d]));
      } else if (after[d].size() < rep.dims[d].size()) {
        instruction.concat_dim = dim;
        gathered.push_back(fmt::format("dim {} (sharded by {})", dim, origin(dim, rep)));
      }
    }
    instruction.collective =
        collective(CollectiveKind::kAllToAll, all_to_all_axes(rep.dims, after), bytes(rep.slot),
                   fmt::format("{} needs {} instead of {}{}", why_.consumer, fmt::join(split, " and "),
                               fmt::join(gathered, " and "), on_the_way(there)));
    emit(std::move(instruction), out);
    return out;
  }

  // A dim moved to tiles that do not nest in its own: each device receives
  // only the rows it lacks (halo.h), where a gather would make the whole dim.
  LocalValue emit_halo(const LocalValue& rep, int dim, const std::vector<int>& axes) {
    const auto d = static_cast<std::size_t>(dim);
    const int64_t held_rows = b_.slot_type(rep.slot).shape[d];
    const HaloSchedule schedule = halo_schedule(b_.mesh(), global_[d], rep.dims[d], axes, held_rows);
    LocalValue out = rep;
    out.dims[d] = axes;
    out.slot = slot_for(out.dims);
    Instruction instruction = step(InstructionKind::kCollective, rep.slot, out.slot, dim);
    instruction.global_size = global_[d];
    instruction.axes_before = rep.dims[d];
    instruction.axes_after = axes;
    const int64_t row_bytes = bytes(rep.slot) / std::max<int64_t>(b_.slot_type(rep.slot).shape[d], 1);
    const std::string lacking = fmt::format(
        "each device receives the rows it lacks (at most {} of {}) instead of the "
        "whole dim{}",
        schedule.rows_sent(), global_[d], on_the_way(target_ == nullptr || axes == (*target_)[d]));
    const int id = collective(
        CollectiveKind::kCollectivePermute, schedule.axes, row_bytes * schedule.rows_sent(),
        rep.dims[d] == axes
            ? fmt::format(
                  "{} made {} in tiles of {} rows over {} ({}), where its {} rows split evenly are tiles of {}; "
                  "{}",
                  why_.consumer, dim_text(dim), held_rows, b_.axes_text(axes), origin(dim, rep), global_[d],
                  padded_shape(b_.mesh(), {global_[d]}, {axes})[0], lacking)
            : fmt::format("{} needs {} sharded on {} but it is sharded on {} by {}; the tiles do not nest, so {}",
                          why_.consumer, dim_text(dim), b_.axes_text(axes), b_.axes_text(rep.dims[d]), origin(dim, rep),
                          lacking));
    b_.collective_info(id).rounds = std::max<int>(1, static_cast<int>(schedule.rounds.size()));
    instruction.collective = id;
    emit(std::move(instruction), out);
    return out;
  }

  // One move of a searched path.
  LocalValue apply(const LocalValue& rep, const LayoutMove& move, const DimAxes& target) {
    switch (move.kind) {
      case LayoutMove::Kind::kPermute:
        return permute(rep, move.after);
      case LayoutMove::Kind::kAllToAll:
        return emit_all_to_all(rep, move.after);
      case LayoutMove::Kind::kSlice:
        return slice(rep, move.after, move.dim);
      case LayoutMove::Kind::kReduceScatter:
        return emit_reduce_scatter(rep, move.dim, move.reduced);
      case LayoutMove::Kind::kAllReduce:
        return emit_all_reduce(rep, target);
      case LayoutMove::Kind::kHalo:
        return emit_halo(rep, move.dim, move.after[static_cast<std::size_t>(move.dim)]);
      case LayoutMove::Kind::kAllGather:
        break;
    }
    const int dim = move.dim;
    const auto d = static_cast<std::size_t>(dim);
    const std::vector<int>& have = rep.dims[d];
    const std::vector<int> axes(have.begin() + static_cast<std::ptrdiff_t>(move.kept), have.end());
    if (move.kept == 0 && !nests(dim, 1, have) && !target[d].empty() && target[d][0] == have[0]) {
      rematerialised(dim, have, target[d]);
    } else {
      regathered(dim, axes, move.kept, target);
    }
    return gather_for(rep, dim, move.kept, target);
  }

  // An all-gather of `dim` down to its first `kept` axes, for `target`.
  LocalValue gather_for(const LocalValue& rep, int dim, std::size_t kept, const DimAxes& target) {
    const auto d = static_cast<std::size_t>(dim);
    return emit_gather(rep, dim, kept,
                       fmt::format("{} needs {} {} but it is sharded on {} by {}", why_.consumer, dim_text(dim),
                                   wanted_text(target, d), b_.axes_text(rep.dims[d]), origin(dim, rep)));
  }

  std::string wanted_text(const DimAxes& target, std::size_t d) const {
    return target[d].empty() ? "whole" : "sharded on " + b_.axes_text(target[d]);
  }

  // An all-gather of `dim` over its axes after the first `kept`.
  LocalValue emit_gather(const LocalValue& rep, int dim, std::size_t kept, std::string reason) {
    const auto d = static_cast<std::size_t>(dim);
    const std::vector<int>& have = rep.dims[d];
    const std::vector<int> axes(have.begin() + static_cast<std::ptrdiff_t>(kept), have.end());
    LocalValue out = rep;
    out.dims[d].resize(kept);
    out.slot = slot_for(out.dims);
    Instruction instruction = step(InstructionKind::kCollective, rep.slot, out.slot, dim);
    instruction.global_size = global_[d];
    instruction.axes_before = have;
    instruction.axes_after = out.dims[d];
    instruction.collective = collective(CollectiveKind::kAllGather, axes, bytes(out.slot), std::move(reason));
    emit(std::move(instruction), out);
    return out;
  }

  // Axes the target adds: each device keeps its tile.
  LocalValue slice(LocalValue rep, const DimAxes& target, int dim) {
    const auto d = static_cast<std::size_t>(dim);
    if (rep.dims[d] == target[d]) return rep;
    // A tile of the target must lie inside the tile the device holds.
    if (!nests(dim, rep.dims[d].size(), target[d])) {
      rematerialised(dim, rep.dims[d], target[d]);
      rep = gather_for(rep, dim, 0, target);
    }
    LocalValue out = rep;
    out.dims[d] = target[d];
    out.slot = slot_for(out.dims);
    Instruction instruction = step(InstructionKind::kLocalSlice, rep.slot, out.slot, dim);
    instruction.global_size = global_[d];
    instruction.axes_before = rep.dims[d];
    instruction.axes_after = target[d];
    emit(std::move(instruction), out);
    return out;
  }

  ProgramBuilder& b_;
  const Shape& global_;
  DType dtype_;
  const ReshardReason& why_;
  std::vector<LocalValue>* made_ = nullptr;
  DimAxes source_dims_;              // the layout the moves start from
  const DimAxes* target_ = nullptr;  // the layout they end at
  bool searched_ = true;             // false: the direct moves (too many axes to search)
};

}  // namespace

LocalValue emit_reshard(ProgramBuilder& builder, const LocalValue& from, const DimAxes& target, const Shape& global,
                        DType dtype, const ReshardReason& why, std::vector<LocalValue>* made,
                        const std::vector<LayoutMove>* planned) {
  if (target.size() != from.dims.size()) {
    throw Error(fmt::format("internal: resharding %{} of rank {} to a rank-{} sharding", why.value->name(),
                            from.dims.size(), target.size()));
  }
  return Resharder(builder, global, dtype, why).run(from, target, made, planned);
}

LocalValue even_tiles(ProgramBuilder& builder, const LocalValue& from, int dim, const Shape& global, DType dtype,
                      const ReshardReason& why) {
  return Resharder(builder, global, dtype, why).even_tiles(from, dim);
}

}  // namespace shardflow::partition_detail
