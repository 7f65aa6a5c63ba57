// Lowering a reshard to collectives and local slices.
//
// From a representation (dims' axes, partial-sum axes) to target dims, by
// the cheapest sequence of moves (reshard_search.cc): reduce-scatters and
// an all-reduce of the partial sums, collective-permutes, all-to-alls,
// all-gathers and local slices. Where the search is too large (more than
// 8,192 layouts, seen only with 5 or more axes), a fixed order instead:
//  1. partial sums: a reduce-scatter over the partial axes a dim's target
//     adds next to the axes the dim has (any order, even dims), an
//     all-reduce over those no dim takes;
//  2. every dim keeping its tile count, over other axes or in another
//     order: one collective-permute;
//  3. axes moving from the minor end of one dim to the minor end of
//     another, where the target has them: an all-to-all over them (even
//     dims), repeated while one applies, after gathering axes the target
//     drops where they block one;
//  4. axes the target drops from a dim: an all-gather over them (a dim
//     whose tiles do not nest, tiles_nest(), is gathered whole; a gather of
//     axes the target still uses is reported as a re-materialisation);
//  5. axes the target adds: a local slice, no communication.
// Example, [{x,y},{}] -> [{x},{}]: one all-gather over 'y' on dim 0.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "partitioner.h"
#include "shardflow/base/error.h"
#include "shardflow/partition/halo.h"

namespace shardflow::partition_detail {

// Without forming a + b - 1, which overflows for sizes near 2^63.
static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

Shape padded_shape(const Mesh& mesh, const Shape& global, const DimAxes& dims) {
  Shape shape = global;
  for (std::size_t d = 0; d < global.size(); ++d) {
    int64_t shards = 1;
    for (int axis : dims[d]) shards *= mesh.axis_size(axis);
    shape[d] = ceil_div(global[d], shards);
  }
  return shape;
}

bool all_to_all_makes(const Mesh& mesh, const Shape& global, const DimAxes& before, const DimAxes& after) {
  std::vector<int> lost, gained;
  for (std::size_t d = 0; d < before.size(); ++d) {
    const std::vector<int>& b = before[d];
    const std::vector<int>& a = after[d];
    const bool loses = a.size() < b.size(), gains = a.size() > b.size();
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
    if (planned == nullptr && !trial_) {
      found = cheapest_moves(b_.mesh(), global_, dtype_, {rep.dims}, target, rep.unreduced, why_.reduction_shared);
    }
    if (planned != nullptr || found) {
      for (const LayoutMove& move : planned != nullptr ? *planned : found->moves) rep = apply(rep, move, target);
      return rep;
    }
    // Too many axes to search: the reduction first, then a fixed order of
    // moves.
    if (!rep.unreduced.empty()) {
      // Scattering over some partial axes and all-reducing the rest sends
      // fewer bytes than one all-reduce, in more collectives: tried both ways.
      const auto trial_cost = [&](bool scatter) {
        const ProgramBuilder::Mark mark = b_.mark();
        Resharder trial(b_, global_, dtype_, why_);
        trial.scatter_ = scatter;
        trial.trial_ = true;
        trial.run(rep, target, nullptr, nullptr);
        const double cost = b_.cost_since(mark);
        b_.rollback(mark);
        return cost;
      };
      if (!trial_) scatter_ = trial_cost(true) <= trial_cost(false);
      rep = reduce(rep, target);
      if (rep.dims == target) return rep;
    }
    rep = permute(rep, target);
    rep = all_to_all(rep, target);
    rep = unblock(rep, target);
    for (std::size_t d = 0; d < target.size(); ++d) rep = gather(rep, target, static_cast<int>(d));
    for (std::size_t d = 0; d < target.size(); ++d) rep = slice(rep, target, static_cast<int>(d));
    return rep;
  }

 private:
  // Whether dim `dim` over `inner` nests in it over its first `outer` axes.
  bool nests(int dim, std::size_t outer, const std::vector<int>& inner) const {
    return tiles_nest(b_.mesh(), global_[static_cast<std::size_t>(dim)], inner, outer);
  }

  bool even(int dim, const std::vector<int>& axes) const {
    return global_[static_cast<std::size_t>(dim)] % b_.axes_size(axes) == 0;
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

  int slot_for(const DimAxes& dims) {
    return b_.new_slot({dtype_, padded_shape(b_.mesh(), global_, dims)});
  }

  int64_t bytes(int slot) const { return b_.slot_type(slot).nbytes(); }

  std::string dim_text(int dim) const {
    return fmt::format("dim {} of %{}", dim, why_.value->name());
  }

  int collective(CollectiveKind kind, const std::vector<int>& axes, int64_t bytes_per_device,
                 std::string reason, ReduceOp reduction = ReduceOp::kSum) {
    CollectiveInfo info;
    info.kind = kind;
    info.axes = axes;
    info.reduction = reduction;
    info.bytes_per_device = bytes_per_device;
    info.value = why_.value;
    info.reason = std::move(reason);
    return b_.add_collective(std::move(info));
  }

  // The last resort of the ladder, reported: a whole dim gathered only to be
  // sliced again, because the shards of an uneven dim do not nest.
  void rematerialised(int dim, const std::vector<int>& from, const std::vector<int>& to) {
    b_.warn(fmt::format("involuntary re-materialisation for {}: {} ({} entries) goes from {} to {}; its "
                        "size does not divide evenly, so the shards do not nest and the dim is gathered "
                        "whole, then sliced", why_.consumer, dim_text(dim), global_[static_cast<std::size_t>(dim)],
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
    b_.warn(fmt::format("involuntary re-materialisation for {}: {} is gathered over {} and split over {} again "
                        "(the target splits it or another dim that way), so the dim is whole on every device in "
                        "between; no sequence of all-to-alls and collective-permutes found costs less (bytes "
                        "sent plus 64 KiB per collective)",
                        why_.consumer, dim_text(dim), b_.axes_text(axes), b_.axes_text(reused)));
  }

  // 1. Partial sums. A dim whose target continues its axes with partial
  // axes (in any order) takes them by a reduce-scatter; the rest of the
  // target is sliced later ([{},{}] partial over {a,b} -> [{b,a,c},{}] is a
  // reduce-scatter over ('b', 'a') and a slice over 'c'). Several dims may
  // each take some; what no dim takes is all-reduced, after the scatters
  // made the buffer smaller.
  LocalValue reduce(LocalValue rep, const DimAxes& target) {
    while (scatter_) {
      int dim = -1;
      std::vector<int> scattered;
      for (std::size_t d = 0; d < target.size(); ++d) {
        const std::vector<int>& have = rep.dims[d];
        const std::vector<int>& want = target[d];
        if (want.size() <= have.size() || !starts_with(want, have)) continue;
        std::vector<int> run;
        for (std::size_t k = have.size(); k < want.size(); ++k) {
          if (std::find(rep.unreduced.begin(), rep.unreduced.end(), want[k]) == rep.unreduced.end()) break;
          run.push_back(want[k]);
        }
        // The longest run that still divides the dim evenly, and only if
        // the target's rest can then be sliced without a gather: an uneven
        // target is all-reduced whole and sliced.
        while (!run.empty()) {
          std::vector<int> axes = have;
          axes.insert(axes.end(), run.begin(), run.end());
          if (even(static_cast<int>(d), axes)) break;
          run.pop_back();
        }
        if (have.size() + run.size() < want.size() && !even(static_cast<int>(d), want)) run.clear();
        if (why_.reduction_shared && run.size() != rep.unreduced.size()) continue;
        if (b_.axes_size(run) > b_.axes_size(scattered)) {
          dim = static_cast<int>(d);
          scattered = std::move(run);
        }
      }
      if (dim < 0) break;
      rep = emit_reduce_scatter(rep, dim, scattered);
    }
    return rep.unreduced.empty() ? rep : emit_all_reduce(rep, target);
  }

  // A reduce-scatter of partial axes `axes` (in this order) onto the minor
  // end of `dim`.
  LocalValue emit_reduce_scatter(const LocalValue& rep, int dim, const std::vector<int>& axes) {
    LocalValue out = rep;
    std::vector<int>& dim_axes = out.dims[static_cast<std::size_t>(dim)];
    dim_axes.insert(dim_axes.end(), axes.begin(), axes.end());
    std::erase_if(out.unreduced,
                  [&](int axis) { return std::find(axes.begin(), axes.end(), axis) != axes.end(); });
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
    instruction.collective = collective(
        CollectiveKind::kAllReduce, rep.unreduced, bytes(rep.slot),
        whole ? fmt::format("{}; {} needs whole values", rep.unreduced_reason, why_.consumer)
              : fmt::format("{}; {} needs values reduced over {}", rep.unreduced_reason, why_.consumer,
                            b_.axes_text(rep.unreduced)),
        rep.reduction);
    emit(std::move(instruction), out);
    return out;
  }

  // 2. The same tiles on other devices: each dim keeps its tile count, over
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
        moved.push_back(fmt::format("dim {} from {} to {}", d, rep.dims[d].empty() ? "whole" : b_.axes_text(rep.dims[d]),
                                    target[d].empty() ? "whole" : b_.axes_text(target[d])));
      }
    }
    instruction.collective = collective(
        CollectiveKind::kCollectivePermute, axes, bytes(rep.slot),
        fmt::format("{} needs %{} with the same tiles on other devices: {} (sharded by {}){}", why_.consumer,
                    why_.value->name(), fmt::join(moved, ", "), origin(first_moved, rep),
                    on_the_way(target_ == nullptr || target == *target_)));
    emit(std::move(instruction), out);
    return out;
  }

  // 3. Axes moving from the minor end of one dim to the minor end of
  // another, where the target has them: the device at index k over those
  // axes holds sub-tile k of the one dim and wants sub-tile k of the other,
  // so one all-to-all over them moves them all ([{a,b},{}] -> [{},{a,b}] is
  // one all-to-all over ('a', 'b')). Each move puts axes where the target
  // has them, so a few moves in turn reach layouts no single one does
  // ([{a,b},{},{}] -> [{},{a},{b}]); what they leave is gathered or sliced.
  std::optional<DimAxes> find_move(const DimAxes& dims, const DimAxes& target) const {
    for (std::size_t from = 0; from < target.size(); ++from) {
      const std::vector<int>& have = dims[from];
      for (std::size_t kept = 0; kept < have.size(); ++kept) {  // the most axes first
        for (std::size_t to = 0; to < target.size(); ++to) {
          if (to == from) continue;
          DimAxes after = dims;
          after[from].resize(kept);
          after[to].insert(after[to].end(), have.begin() + static_cast<std::ptrdiff_t>(kept), have.end());
          if (starts_with(target[to], after[to]) && all_to_all_makes(b_.mesh(), global_, dims, after)) return after;
        }
      }
    }
    return std::nullopt;
  }

  LocalValue all_to_all(LocalValue rep, const DimAxes& target) {
    while (const std::optional<DimAxes> after = find_move(rep.dims, target)) rep = emit_all_to_all(rep, *after);
    return rep;
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
        const std::vector<int> gained(after[d].begin() + static_cast<std::ptrdiff_t>(rep.dims[d].size()), after[d].end());
        split.push_back(fmt::format("{} sharded on {}", dim_text(dim), b_.axes_text(gained)));
        // Where the target has them: a prefix of the target's axes for that dim.
        there = there && (target_ == nullptr || starts_with((*target_)[d], after[d]));
      } else if (after[d].size() < rep.dims[d].size()) {
        instruction.concat_dim = dim;
        gathered.push_back(fmt::format("dim {} (sharded by {})", dim, origin(dim, rep)));
      }
    }
    instruction.collective = collective(
        CollectiveKind::kAllToAll, all_to_all_axes(rep.dims, after), bytes(rep.slot),
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
    const std::string lacking = fmt::format("each device receives the rows it lacks (at most {} of {}) instead of the "
                                            "whole dim{}", schedule.rows_sent(), global_[d],
                                            on_the_way(target_ == nullptr || axes == (*target_)[d]));
    const int id = collective(
        CollectiveKind::kCollectivePermute, schedule.axes, row_bytes * schedule.rows_sent(),
        rep.dims[d] == axes
            ? fmt::format("{} made {} in tiles of {} rows over {} ({}), where its {} rows split evenly are tiles of {}; "
                          "{}", why_.consumer, dim_text(dim), held_rows, b_.axes_text(axes), origin(dim, rep),
                          global_[d], padded_shape(b_.mesh(), {global_[d]}, {axes})[0], lacking)
            : fmt::format("{} needs {} sharded on {} but it is sharded on {} by {}; the tiles do not nest, so {}",
                          why_.consumer, dim_text(dim), b_.axes_text(axes), b_.axes_text(rep.dims[d]),
                          origin(dim, rep), lacking));
    b_.collective_info(id).rounds = std::max<int>(1, static_cast<int>(schedule.rounds.size()));
    instruction.collective = id;
    emit(std::move(instruction), out);
    return out;
  }

  // One move of a searched path.
  LocalValue apply(const LocalValue& rep, const LayoutMove& move, const DimAxes& target) {
    switch (move.kind) {
      case LayoutMove::Kind::kPermute: return permute(rep, move.after);
      case LayoutMove::Kind::kAllToAll: return emit_all_to_all(rep, move.after);
      case LayoutMove::Kind::kSlice: return slice(rep, move.after, move.dim);
      case LayoutMove::Kind::kReduceScatter: return emit_reduce_scatter(rep, move.dim, move.reduced);
      case LayoutMove::Kind::kAllReduce: return emit_all_reduce(rep, target);
      case LayoutMove::Kind::kHalo: return emit_halo(rep, move.dim, move.after[static_cast<std::size_t>(move.dim)]);
      case LayoutMove::Kind::kAllGather: break;
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

  // 3b. Axes the target drops everywhere can block a move: they sit minor
  // to the axes that move ([{a,b},{}] -> [{},{a}]) or in the dim they move
  // to ([{a},{b}] -> [{},{a}]). Gathering them first (they are gathered in
  // any case) lets the all-to-all run instead of gathering the moving axes
  // too and slicing them again.
  LocalValue unblock(LocalValue rep, const DimAxes& target) {
    for (;;) {
      DimAxes dropped_gathered = rep.dims;
      for (std::size_t d = 0; d < target.size(); ++d) {
        std::vector<int>& have = dropped_gathered[d];
        if (!even(static_cast<int>(d), have)) continue;  // its shards do not nest: step 4 handles it
        while (!have.empty() && std::none_of(target.begin(), target.end(), [&](const std::vector<int>& wanted) {
                 return std::find(wanted.begin(), wanted.end(), have.back()) != wanted.end();
               })) {
          have.pop_back();
        }
      }
      if (dropped_gathered == rep.dims || !find_move(dropped_gathered, target)) return rep;
      for (std::size_t d = 0; d < target.size(); ++d) {
        if (dropped_gathered[d] == rep.dims[d]) continue;
        const std::vector<int> axes(rep.dims[d].begin() + static_cast<std::ptrdiff_t>(dropped_gathered[d].size()),
                                    rep.dims[d].end());
        rep = emit_gather(rep, static_cast<int>(d), dropped_gathered[d].size(),
                          fmt::format("{} needs {} {}, and no dim of it sharded on {}; gathered before an "
                                      "all-to-all (sharded by {})",
                                      why_.consumer, dim_text(static_cast<int>(d)), wanted_text(target, d),
                                      b_.axes_text(axes), why_.origin(static_cast<int>(d))));
      }
      rep = all_to_all(rep, target);
    }
  }

  // 4. Axes the target drops.
  LocalValue gather(LocalValue rep, const DimAxes& target, int dim) {
    const auto d = static_cast<std::size_t>(dim);
    const std::vector<int>& have = rep.dims[d];
    std::size_t common = 0;
    while (common < have.size() && common < target[d].size() && have[common] == target[d][common]) ++common;
    if (common == have.size()) return rep;
    // Shards that do not nest in the common axes' tiles: gather the dim
    // whole and re-slice.
    const bool uneven = common > 0 && !nests(dim, common, have);
    if (uneven) {
      common = 0;
      rematerialised(dim, have, target[d]);
    }
    const std::vector<int> axes(have.begin() + static_cast<std::ptrdiff_t>(common), have.end());
    if (!uneven) regathered(dim, axes, common, target);
    return gather_for(rep, dim, common, target);
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

  // 5. Axes the target adds: each device keeps its tile.
  LocalValue slice(LocalValue rep, const DimAxes& target, int dim) {
    const auto d = static_cast<std::size_t>(dim);
    if (rep.dims[d] == target[d]) return rep;
    // A tile of the target must lie inside the tile the device holds.
    if (!nests(dim, rep.dims[d].size(), target[d])) {
      rematerialised(dim, rep.dims[d], target[d]);
      rep = gather(rep, DimAxes(target.size()), dim);
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
  bool scatter_ = true;  // reduce-scatter where the target allows; else all-reduce
  bool trial_ = false;   // a trial run: scatter_ is given
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
