// The cheapest sequence of layout moves between layouts without partial
// sums: Dijkstra over layouts of the axes they use, each move costing the
// bytes one device sends in a ring implementation plus a fixed latency per
// collective. It finds what a fixed order of moves misses, e.g.
// (('a', 'b'), 'c') -> ('c', 'a'): one collective-permute swapping 'a' and
// 'c', then a gather of 'b', instead of gathering both dims whole.
#include <algorithm>
#include <map>
#include <queue>

#include "partitioner.h"

namespace shardflow::partition_detail {

namespace {

// Beyond this many layouts the caller falls back to its fixed ladder.
constexpr std::size_t kMaxLayouts = 4096;
// Relabellings tried as collective-permutes: all of them up to 6 axes of
// one size; with more (7 or more equal axes in one tensor's layouts) the
// first ones only, so a search stays within milliseconds.
constexpr std::size_t kMaxRelabellings = 720;

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

class Search {
 public:
  Search(const Mesh& mesh, const Shape& global, DType dtype, const std::vector<DimAxes>& sources, const DimAxes& to)
      : mesh_(mesh), global_(global), element_bytes_(static_cast<int64_t>(element_size(dtype))), target_(to) {
    for (const DimAxes& source : sources) {
      for (const std::vector<int>& dim : source) axes_.insert(axes_.end(), dim.begin(), dim.end());
    }
    for (const std::vector<int>& dim : to) {
      axes_.insert(axes_.end(), dim.begin(), dim.end());
      target_axes_.insert(target_axes_.end(), dim.begin(), dim.end());
    }
    std::sort(axes_.begin(), axes_.end());
    axes_.erase(std::unique(axes_.begin(), axes_.end()), axes_.end());
    // Relabellings of the involved axes that keep every axis's size: the
    // collective-permutes worth trying.
    std::vector<int> image = axes_;
    while (relabellings_.size() < kMaxRelabellings && std::next_permutation(image.begin(), image.end())) {
      bool same_sizes = true;
      for (std::size_t i = 0; i < axes_.size(); ++i) {
        same_sizes = same_sizes && mesh_.axis_size(axes_[i]) == mesh_.axis_size(image[i]);
      }
      if (same_sizes) relabellings_.push_back(image);
    }
  }

  // Every source starts at cost 0: the path found starts from the one
  // that reaches the target cheapest.
  std::optional<CheapestMoves> run(const std::vector<DimAxes>& sources) {
    using Entry = std::pair<Cost, DimAxes>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> frontier;
    for (const DimAxes& source : sources) {
      best_[source] = {Cost{}, std::nullopt};
      frontier.push({Cost{}, source});
    }
    while (!frontier.empty()) {
      const auto [cost, layout] = frontier.top();
      frontier.pop();
      if (cost > best_.at(layout).first) continue;
      if (layout == target_) {
        CheapestMoves found;
        DimAxes start = layout;
        found.moves = path_to(start);
        found.source = static_cast<std::size_t>(std::find(sources.begin(), sources.end(), start) - sources.begin());
        return found;
      }
      if (best_.size() > kMaxLayouts) return std::nullopt;
      for (const auto& [move, step] : moves(layout)) {
        const Cost reached = cost + step;
        const auto found = best_.find(move.after);
        if (found != best_.end() && !(reached < found->second.first)) continue;
        best_[move.after] = {reached, Arrival{layout, move}};
        frontier.push({reached, move.after});
      }
    }
    return std::nullopt;
  }

 private:
  struct Arrival {
    DimAxes before;
    LayoutMove move;
  };

  bool even(std::size_t dim, const std::vector<int>& axes) const {
    int64_t tiles = 1;
    for (int axis : axes) tiles *= mesh_.axis_size(axis);
    return global_[dim] % tiles == 0;
  }

  int64_t group_size(const std::vector<int>& axes) const {
    int64_t size = 1;
    for (int axis : axes) size *= mesh_.axis_size(axis);
    return size;
  }

  double tile_bytes(const DimAxes& layout) const {
    double bytes = static_cast<double>(element_bytes_);
    for (std::size_t d = 0; d < global_.size(); ++d) {
      const int64_t tiles = group_size(layout[d]);
      bytes *= static_cast<double>(global_[d] / tiles + (global_[d] % tiles != 0 ? 1 : 0));
    }
    return bytes;
  }

  bool uses(const DimAxes& layout, int axis) const {
    return std::any_of(layout.begin(), layout.end(), [&](const std::vector<int>& dim) {
      return std::find(dim.begin(), dim.end(), axis) != dim.end();
    });
  }

  std::vector<std::pair<LayoutMove, Cost>> moves(const DimAxes& layout) const {
    std::vector<std::pair<LayoutMove, Cost>> out;
    const double bytes = tile_bytes(layout);
    for (std::size_t d = 0; d < layout.size(); ++d) {
      const std::vector<int>& have = layout[d];
      // All-gathers of a minor-end suffix (an uneven dim only whole: its
      // shards do not nest).
      for (std::size_t kept = 0; kept < have.size(); ++kept) {
        if (kept > 0 && !even(d, have)) continue;
        LayoutMove move{LayoutMove::Kind::kAllGather, layout, static_cast<int>(d), -1, kept};
        move.after[d].resize(kept);
        const double n = static_cast<double>(group_size({have.begin() + static_cast<std::ptrdiff_t>(kept), have.end()}));
        out.push_back({move, {ring_bytes_sent(CollectiveKind::kAllGather, n, tile_bytes(move.after)), 1}});
      }
      // All-to-alls moving a minor-end suffix to the minor end of another dim.
      for (std::size_t kept = 0; kept < have.size() && even(d, have); ++kept) {
        const std::vector<int> moving(have.begin() + static_cast<std::ptrdiff_t>(kept), have.end());
        const double n = static_cast<double>(group_size(moving));
        for (std::size_t to = 0; to < layout.size(); ++to) {
          if (to == d) continue;
          LayoutMove move{LayoutMove::Kind::kAllToAll, layout, static_cast<int>(to), static_cast<int>(d), kept};
          move.after[d].resize(kept);
          move.after[to].insert(move.after[to].end(), moving.begin(), moving.end());
          if (!even(to, move.after[to])) continue;
          out.push_back({move, {ring_bytes_sent(CollectiveKind::kAllToAll, n, bytes), 1}});
        }
      }
      // Local slices towards the target's prefix of this dim, for free.
      const std::vector<int>& want = target_[d];
      if (have.size() < want.size() && starts_with(want, have)) {
        for (std::size_t length = have.size() + 1; length <= want.size(); ++length) {
          LayoutMove move{LayoutMove::Kind::kSlice, layout, static_cast<int>(d), -1, 0};
          move.after[d].assign(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(length));
          if (std::any_of(want.begin() + static_cast<std::ptrdiff_t>(have.size()),
                          want.begin() + static_cast<std::ptrdiff_t>(length),
                          [&](int axis) { return uses(layout, axis); })) {
            break;
          }
          if (!have.empty() && !even(d, move.after[d])) continue;
          out.push_back({move, {0, 0}});
        }
      }
      // Any other axis the target uses, sliced here to be moved on by an
      // all-to-all or a permute: ['x'] -> [('a', 'x')] slices 'a' after 'x'
      // and swaps them, instead of gathering 'x'.
      for (int axis : target_axes_) {
        if (uses(layout, axis)) continue;
        LayoutMove move{LayoutMove::Kind::kSlice, layout, static_cast<int>(d), -1, 0};
        move.after[d].push_back(axis);
        if (!have.empty() && !even(d, move.after[d])) continue;
        out.push_back({move, {0, 0}});
      }
    }
    // Collective-permutes: the same tiles, counted by other axes.
    for (const std::vector<int>& image : relabellings_) {
      LayoutMove move{LayoutMove::Kind::kPermute, layout, -1, -1, 0};
      for (std::vector<int>& dim : move.after) {
        for (int& axis : dim) axis = image[static_cast<std::size_t>(std::find(axes_.begin(), axes_.end(), axis) - axes_.begin())];
      }
      if (move.after != layout) out.push_back({move, {bytes, 1}});  // each device sends its tile
    }
    return out;
  }

  // The moves that reach `layout`; `layout` becomes the source they start at.
  std::vector<LayoutMove> path_to(DimAxes& layout) const {
    std::vector<LayoutMove> path;
    for (;;) {
      const std::optional<Arrival>& arrival = best_.at(layout).second;
      if (!arrival) break;
      path.push_back(arrival->move);
      layout = arrival->before;
    }
    std::reverse(path.begin(), path.end());
    return path;
  }

  const Mesh& mesh_;
  const Shape& global_;
  int64_t element_bytes_;
  const DimAxes& target_;
  std::vector<int> axes_;                     // used by a source or the target, sorted
  std::vector<int> target_axes_;              // used by the target
  std::vector<std::vector<int>> relabellings_;  // images of axes_, sizes kept
  std::map<DimAxes, std::pair<Cost, std::optional<Arrival>>> best_;
};

}  // namespace

std::optional<CheapestMoves> cheapest_moves(const Mesh& mesh, const Shape& global, DType dtype,
                                            const std::vector<DimAxes>& sources, const DimAxes& to) {
  return Search(mesh, global, dtype, sources, to).run(sources);
}

}  // namespace shardflow::partition_detail
