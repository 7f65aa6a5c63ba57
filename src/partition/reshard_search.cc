// The cheapest sequence of moves between layouts: A* over layouts of
// the axes they use (and the partial-sum axes not yet reduced), each move
// costing the bytes one device sends in a ring implementation plus a fixed
// latency per collective. It finds what a fixed order of moves misses, e.g.
// (('a', 'b'), 'c') -> ('c', 'a'): one collective-permute swapping 'a' and
// 'c', then a gather of 'b', instead of gathering both dims whole; or a
// partial sum over ('a', 'b') on ('x',) wanted as (('a', 'x'),): a
// reduce-scatter over 'a' (to ('x', 'a')), an all-reduce over 'b' and a
// permute swapping 'x' and 'a', instead of an all-reduce of the whole
// buffer and a gather.
#include <algorithm>
#include <map>
#include <queue>
#include <set>

#include "partitioner.h"
#include "shardflow/partition/halo.h"

namespace shardflow::partition_detail {

namespace {

// Beyond this many layouts the caller takes the direct moves instead.
constexpr std::size_t kMaxLayouts = 8192;
// Relabellings tried as collective-permutes: all of them up to 6 axes of
// one size; with more (7 or more equal axes in one tensor's layouts) the
// first ones only, so a search stays within milliseconds.
constexpr std::size_t kMaxRelabellings = 720;
// Orders of subsets of the partial axes tried as one reduce-scatter: all of
// them up to 4 partial axes.
constexpr std::size_t kMaxScatterOrders = 64;

struct Cost {
  double bytes = 0;
  int collectives = 0;
  double total() const { return bytes + kCollectiveLatencyBytes * collectives; }
  bool operator<(const Cost& other) const {
    return total() != other.total() ? total() < other.total() : collectives < other.collectives;
  }
  bool operator>(const Cost& other) const { return other < *this; }
  Cost operator+(const Cost& other) const { return {bytes + other.bytes, collectives + other.collectives}; }
};

// A layout on the way: the dims' axes and the partial-sum axes not yet
// reduced (sorted).
struct State {
  DimAxes dims;
  std::vector<int> unreduced;
  auto operator<=>(const State&) const = default;
};

class Search {
 public:
  Search(const Mesh& mesh, const Shape& global, DType dtype, const std::vector<DimAxes>& sources, const DimAxes& to,
         const std::vector<int>& unreduced, bool reduction_shared)
      : mesh_(mesh),
        global_(global),
        element_bytes_(static_cast<int64_t>(element_size(dtype))),
        target_(to),
        reduction_shared_(reduction_shared) {
    for (const DimAxes& source : sources) {
      for (const std::vector<int>& dim : source) axes_.insert(axes_.end(), dim.begin(), dim.end());
    }
    axes_.insert(axes_.end(), unreduced.begin(), unreduced.end());
    for (const std::vector<int>& dim : to) {
      axes_.insert(axes_.end(), dim.begin(), dim.end());
      target_axes_.insert(target_axes_.end(), dim.begin(), dim.end());
    }
    std::sort(axes_.begin(), axes_.end());
    axes_.erase(std::unique(axes_.begin(), axes_.end()), axes_.end());
    // Relabellings of the involved axes that keep every axis's size: the
    // collective-permutes worth trying.
    std::vector<int> image = axes_;
    while (std::next_permutation(image.begin(), image.end())) {
      if (relabellings_.size() == kMaxRelabellings) {
        relabellings_complete_ = false;
        break;
      }
      bool same_sizes = true;
      for (std::size_t i = 0; i < axes_.size(); ++i) {
        same_sizes = same_sizes && mesh_.axis_size(axes_[i]) == mesh_.axis_size(image[i]);
      }
      if (same_sizes) relabellings_.push_back(image);
    }
    scatter_orders_ = orders_of_subsets(unreduced);
  }

  // Every source starts at cost 0: the path found starts from the one
  // that reaches the target cheapest. A*: a layout from which slices alone
  // cannot reach the target is at least one collective away (a consistent
  // bound: no slice makes a layout slice-reachable that was not).
  std::optional<CheapestMoves> run(const std::vector<DimAxes>& sources, const std::vector<int>& unreduced) {
    struct Entry {
      Cost estimate, cost;  // the path's cost plus the bound of what is left; the path's cost
      State state;
      bool operator>(const Entry& other) const { return other.estimate < estimate; }
    };
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> frontier;
    for (const DimAxes& source : sources) {
      State start{source, unreduced};
      best_[start] = {Cost{}, std::nullopt};
      frontier.push({still_to_go(start), Cost{}, std::move(start)});
    }
    const State goal{target_, {}};
    while (!frontier.empty()) {
      const Entry entry = frontier.top();
      frontier.pop();
      const State& state = entry.state;
      const auto& [best_cost, arrival] = best_.at(state);
      if (entry.cost > best_cost) continue;
      if (state == goal) {
        CheapestMoves found;
        State start = state;
        found.moves = path_to(start);
        found.source =
            static_cast<std::size_t>(std::find(sources.begin(), sources.end(), start.dims) - sources.begin());
        return found;
      }
      if (best_.size() > kMaxLayouts) return std::nullopt;
      for (auto& [move, step] : moves(state, arrival && arrival->move.kind == LayoutMove::Kind::kPermute)) {
        const Cost reached = entry.cost + step;
        State next{move.after, state.unreduced};
        std::erase_if(next.unreduced, [&reduced = move.reduced](int axis) {
          return std::find(reduced.begin(), reduced.end(), axis) != reduced.end();
        });
        const auto found = best_.find(next);
        if (found != best_.end() && !(reached < found->second.first)) continue;
        best_[next] = {reached, Arrival{state, std::move(move)}};
        const Cost estimate = reached + still_to_go(next);
        frontier.push({estimate, reached, std::move(next)});
      }
    }
    return std::nullopt;
  }

 private:
  struct Arrival {
    State before;
    LayoutMove move;
  };

  // A lower bound on the cost from `state` to the target: one collective
  // unless slices alone get there (no partial sums left, every dim's axes a
  // prefix of the target's).
  Cost still_to_go(const State& state) const {
    bool slices_reach = state.unreduced.empty();
    for (std::size_t d = 0; d < target_.size() && slices_reach; ++d)
      slices_reach = starts_with(target_[d], state.dims[d]);
    return {0, slices_reach ? 0 : 1};
  }

  // Every order of every non-empty subset of `axes`, the longest first (at
  // most kMaxScatterOrders).
  static std::vector<std::vector<int>> orders_of_subsets(const std::vector<int>& axes) {
    std::vector<std::vector<int>> orders;
    for (std::size_t length = axes.size(); length > 0; --length) {
      // Subsets of this length by a selection mask, each in every order.
      std::vector<bool> chosen(axes.size(), false);
      std::fill(chosen.begin(), chosen.begin() + static_cast<std::ptrdiff_t>(length), true);
      do {
        std::vector<int> subset;
        for (std::size_t i = 0; i < axes.size(); ++i) {
          if (chosen[i]) subset.push_back(axes[i]);
        }
        std::sort(subset.begin(), subset.end());
        do {
          if (orders.size() == kMaxScatterOrders) return orders;
          orders.push_back(subset);
        } while (std::next_permutation(subset.begin(), subset.end()));
      } while (std::prev_permutation(chosen.begin(), chosen.end()));
    }
    return orders;
  }

  // Whether dim `dim` over `inner` nests in it over its first `outer` axes.
  bool nests(std::size_t dim, std::size_t outer, const std::vector<int>& inner) const {
    return tiles_nest(mesh_, global_[dim], inner, outer);
  }

  int64_t group_size(const std::vector<int>& axes) const { return axes_size(mesh_, axes); }

  double tile_bytes(const DimAxes& layout) const {
    double bytes = static_cast<double>(element_bytes_);
    for (std::size_t d = 0; d < global_.size(); ++d) {
      bytes *= static_cast<double>(ceil_div(global_[d], group_size(layout[d])));
    }
    return bytes;
  }

  bool uses(const DimAxes& layout, int axis) const {
    return std::any_of(layout.begin(), layout.end(), [&](const std::vector<int>& dim) {
      return std::find(dim.begin(), dim.end(), axis) != dim.end();
    });
  }

  // One all-to-all's worth of axes leaving one dim: its axes from `begin`
  // on (the minor end), appended to dim `to` in `order` (a permutation of
  // them).
  struct Departure {
    std::size_t from, begin, to;
    std::vector<int> order;
  };

  // The departures from `layout`: each minor-end suffix to each other dim,
  // in every order up to 3 axes (in theirs beyond), and a suffix split in
  // two for two other dims.
  static std::vector<std::vector<Departure>> departures(const DimAxes& layout) {
    std::vector<std::vector<Departure>> out;
    const std::size_t rank = layout.size();
    for (std::size_t d = 0; d < rank; ++d) {
      const std::vector<int>& have = layout[d];
      for (std::size_t begin = 0; begin < have.size(); ++begin) {
        std::vector<int> order(have.begin() + static_cast<std::ptrdiff_t>(begin), have.end());
        const bool every_order = order.size() <= 3;
        std::sort(order.begin(), order.end());
        std::vector<std::vector<int>> orders;
        if (every_order) {
          do orders.push_back(order);
          while (std::next_permutation(order.begin(), order.end()));
        } else {
          orders.emplace_back(have.begin() + static_cast<std::ptrdiff_t>(begin), have.end());
        }
        for (std::size_t to = 0; to < rank; ++to) {
          if (to == d) continue;
          for (const std::vector<int>& o : orders) out.push_back({{d, begin, to, o}});
          // The suffix split at `middle`: its major part to `to`, the rest to `other`.
          for (std::size_t middle = begin + 1; middle < have.size(); ++middle) {
            for (std::size_t other = 0; other < rank; ++other) {
              if (other == d || other == to) continue;
              out.push_back({{d,
                              begin,
                              to,
                              {have.begin() + static_cast<std::ptrdiff_t>(begin),
                               have.begin() + static_cast<std::ptrdiff_t>(middle)}},
                             {d, middle, other, {have.begin() + static_cast<std::ptrdiff_t>(middle), have.end()}}});
            }
          }
        }
      }
    }
    return out;
  }

  // All-to-alls: axes leaving the minor end of dims for the minor end of
  // others, in one collective over all the axes that move. A move between
  // two pairs of dims at once sends less than two in turn (over 8 devices,
  // 7/8 of the tile instead of 3/4 + 1/2) and pays one latency.
  void add_all_to_alls(const DimAxes& layout, double bytes, std::vector<std::pair<LayoutMove, Cost>>& out) const {
    const std::vector<std::vector<Departure>> single = departures(layout);
    const auto apply = [&](DimAxes& after, const std::vector<Departure>& parts) {
      for (const Departure& part : parts) {
        after[part.from].resize(std::min(after[part.from].size(), part.begin));
        after[part.to].insert(after[part.to].end(), part.order.begin(), part.order.end());
      }
    };
    std::set<DimAxes> made;
    const auto add = [&](const DimAxes& after) {
      if (!made.insert(after).second || !all_to_all_makes(mesh_, global_, layout, after)) return;
      const double n = static_cast<double>(group_size(all_to_all_axes(layout, after)));
      out.push_back({LayoutMove{LayoutMove::Kind::kAllToAll, after, -1, 0, {}},
                     {ring_bytes_sent(CollectiveKind::kAllToAll, n, bytes), 1}});
    };
    for (std::size_t i = 0; i < single.size(); ++i) {
      DimAxes after = layout;
      apply(after, single[i]);
      add(after);
      // With a departure between two other dims (whole suffixes only).
      if (single[i].size() != 1) continue;
      for (std::size_t j = i + 1; j < single.size(); ++j) {
        const Departure& a = single[i][0];
        if (single[j].size() != 1) continue;
        const Departure& b = single[j][0];
        if (a.from == b.from || a.from == b.to || a.to == b.from || a.to == b.to) continue;
        DimAxes both = layout;
        apply(both, {a, b});
        add(both);
      }
    }
  }

  std::vector<std::pair<LayoutMove, Cost>> moves(const State& state, bool after_permute) const {
    const DimAxes& layout = state.dims;
    const std::vector<int>& unreduced = state.unreduced;
    const auto partial = [&](int axis) {
      return std::find(unreduced.begin(), unreduced.end(), axis) != unreduced.end();
    };
    // Partial axes cannot split a dim: a device's slice of its partial sum
    // would drop the parts the others need.
    const auto taken = [&](int axis) { return uses(layout, axis) || partial(axis); };
    std::vector<std::pair<LayoutMove, Cost>> out;
    const double bytes = tile_bytes(layout);
    if (!unreduced.empty()) {
      // Reduce-scatters of some partial axes, in any order, onto the minor
      // end of a dim (where the new tiles nest in the old)...
      std::vector<const std::vector<int>*> orders;
      for (const std::vector<int>& order : scatter_orders_) {
        if ((!reduction_shared_ || order.size() == unreduced.size()) &&
            std::all_of(order.begin(), order.end(), partial)) {
          orders.push_back(&order);
        }
      }
      for (std::size_t d = 0; d < layout.size(); ++d) {
        for (const std::vector<int>* scattered : orders) {
          const std::vector<int>& order = *scattered;
          LayoutMove move{LayoutMove::Kind::kReduceScatter, layout, static_cast<int>(d), 0, order};
          move.after[d].insert(move.after[d].end(), order.begin(), order.end());
          if (!nests(d, layout[d].size(), move.after[d]) ||
              (reduction_shared_ && !starts_with(target_[d], move.after[d]))) {
            continue;
          }
          out.push_back(
              {move,
               {ring_bytes_sent(CollectiveKind::kReduceScatter, static_cast<double>(group_size(order)), bytes), 1}});
        }
      }
      // ... and an all-reduce of all that is left.
      LayoutMove move{LayoutMove::Kind::kAllReduce, layout, -1, 0, unreduced};
      out.push_back(
          {move, {ring_bytes_sent(CollectiveKind::kAllReduce, static_cast<double>(group_size(unreduced)), bytes), 1}});
      // A reduction other consumers reuse is made where the sums are, or
      // scattered where this consumer wants them: a reduced copy moved
      // first, or scattered on the way, would suit this consumer alone.
      if (reduction_shared_) return out;
    }
    for (std::size_t d = 0; d < layout.size(); ++d) {
      const std::vector<int>& have = layout[d];
      // All-gathers of a minor-end suffix (down to axes whose tiles hold
      // the current ones: tiles_nest).
      for (std::size_t kept = 0; kept < have.size(); ++kept) {
        if (!nests(d, kept, have)) continue;
        LayoutMove move{LayoutMove::Kind::kAllGather, layout, static_cast<int>(d), kept, {}};
        move.after[d].resize(kept);
        const double n =
            static_cast<double>(group_size({have.begin() + static_cast<std::ptrdiff_t>(kept), have.end()}));
        out.push_back({move, {ring_bytes_sent(CollectiveKind::kAllGather, n, tile_bytes(move.after)), 1}});
      }
      // Local slices towards the target's prefix of this dim, for free.
      const std::vector<int>& want = target_[d];
      if (have.size() < want.size() && starts_with(want, have)) {
        for (std::size_t length = have.size() + 1; length <= want.size(); ++length) {
          LayoutMove move{LayoutMove::Kind::kSlice, layout, static_cast<int>(d), 0, {}};
          move.after[d].assign(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(length));
          if (std::any_of(want.begin() + static_cast<std::ptrdiff_t>(have.size()),
                          want.begin() + static_cast<std::ptrdiff_t>(length), taken)) {
            break;
          }
          if (!nests(d, have.size(), move.after[d])) continue;
          out.push_back({move, {0, 0}});
        }
      }
      // A halo exchange to the target's tiles where they and the dim's do
      // not nest either way (nor are as many): only the rows each device
      // lacks move.
      const auto new_axes_free = [&] {
        return std::none_of(want.begin(), want.end(), [&](int axis) {
          return std::find(have.begin(), have.end(), axis) == have.end() && taken(axis);
        });
      };
      if (have != want && !want.empty() && group_size(have) != group_size(want) &&
          !(starts_with(want, have) && nests(d, have.size(), want)) &&
          !(starts_with(have, want) && nests(d, want.size(), have)) && new_axes_free()) {
        const HaloSchedule schedule = halo_schedule(mesh_, global_[d], have, want);
        LayoutMove move{LayoutMove::Kind::kHalo, layout, static_cast<int>(d), 0, {}};
        move.after[d] = want;
        const double local_rows = static_cast<double>(ceil_div(global_[d], group_size(have)));
        out.push_back({move,
                       {bytes / local_rows * static_cast<double>(schedule.rows_sent()),
                        std::max(1, static_cast<int>(schedule.rounds.size()))}});
      }
      // Any other axis the target uses, sliced here to be moved on by an
      // all-to-all or a permute: ['x'] -> [('a', 'x')] slices 'a' after 'x'
      // and swaps them, instead of gathering 'x'.
      for (int axis : target_axes_) {
        if (taken(axis)) continue;
        LayoutMove move{LayoutMove::Kind::kSlice, layout, static_cast<int>(d), 0, {}};
        move.after[d].push_back(axis);
        if (!nests(d, have.size(), move.after[d])) continue;
        out.push_back({move, {0, 0}});
      }
    }
    add_all_to_alls(layout, bytes, out);
    // Collective-permutes: the same tiles, counted by other axes; of
    // reduced values only (a partial axis relabelled would sum other parts).
    // After a permute, none: one permute makes any two's layout, for less
    // (while every relabelling is tried). Relabellings that differ only on
    // axes the layout does not use give the same layout: one move each.
    if (!unreduced.empty() || (after_permute && relabellings_complete_)) return out;
    std::set<DimAxes> permuted;
    for (const std::vector<int>& image : relabellings_) {
      LayoutMove move{LayoutMove::Kind::kPermute, layout, -1, 0, {}};
      for (std::vector<int>& dim : move.after) {
        for (int& axis : dim)
          axis = image[static_cast<std::size_t>(std::find(axes_.begin(), axes_.end(), axis) - axes_.begin())];
      }
      if (move.after != layout && permuted.insert(move.after).second)
        out.push_back({move, {bytes, 1}});  // each device sends its tile
    }
    return out;
  }

  // The moves that reach `state`; `state` becomes the source they start at.
  std::vector<LayoutMove> path_to(State& state) const {
    std::vector<LayoutMove> path;
    for (;;) {
      const std::optional<Arrival>& arrival = best_.at(state).second;
      if (!arrival) break;
      path.push_back(arrival->move);
      state = arrival->before;
    }
    std::reverse(path.begin(), path.end());
    return path;
  }

  const Mesh& mesh_;
  const Shape& global_;
  int64_t element_bytes_;
  const DimAxes& target_;
  bool reduction_shared_;
  std::vector<int> axes_;                         // used by a source or the target, or partial; sorted
  std::vector<int> target_axes_;                  // used by the target
  std::vector<std::vector<int>> relabellings_;    // images of axes_, sizes kept
  bool relabellings_complete_ = true;             // all of them, not the first kMaxRelabellings
  std::vector<std::vector<int>> scatter_orders_;  // of the partial axes
  std::map<State, std::pair<Cost, std::optional<Arrival>>> best_;
};

}  // namespace

std::optional<CheapestMoves> cheapest_moves(const Mesh& mesh, const Shape& global, DType dtype,
                                            const std::vector<DimAxes>& sources, const DimAxes& to,
                                            const std::vector<int>& unreduced, bool reduction_shared) {
  return Search(mesh, global, dtype, sources, to, unreduced, reduction_shared).run(sources, unreduced);
}

std::vector<LayoutMove> direct_moves(const Mesh& mesh, const Shape& global, const LocalValue& from, const DimAxes& to) {
  std::vector<LayoutMove> moves;
  DimAxes layout = from.dims;
  if (!from.unreduced.empty()) moves.push_back({LayoutMove::Kind::kAllReduce, layout, -1, 0, from.unreduced});
  std::vector<std::size_t> shared(layout.size(), 0);
  for (std::size_t d = 0; d < layout.size(); ++d) {
    std::size_t& k = shared[d];
    while (k < layout[d].size() && k < to[d].size() && layout[d][k] == to[d][k]) ++k;
    if (!tiles_nest(mesh, global[d], layout[d], k) || !tiles_nest(mesh, global[d], to[d], k)) k = 0;
    if (k == layout[d].size()) continue;
    layout[d].resize(k);
    moves.push_back({LayoutMove::Kind::kAllGather, layout, static_cast<int>(d), k, {}});
  }
  for (std::size_t d = 0; d < layout.size(); ++d) {
    if (layout[d] == to[d]) continue;
    layout[d] = to[d];
    moves.push_back({LayoutMove::Kind::kSlice, layout, static_cast<int>(d), 0, {}});
  }
  return moves;
}

}  // namespace shardflow::partition_detail
