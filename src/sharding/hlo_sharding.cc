// HloSharding construction and printing, normalised as XLA does.
#include "shardflow/sharding/hlo_sharding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "shardflow/base/error.h"

namespace shardflow {

std::string_view to_string(SubgroupType type) {
  switch (type) {
    case SubgroupType::kReplicated:
      return "replicated";
    case SubgroupType::kMaximal:
      return "maximal";
    case SubgroupType::kManual:
      return "manual";
    case SubgroupType::kUnreduced:
      return "unreduced";
  }
  return "error_type.";
}

HloSharding HloSharding::replicate() { return HloSharding(); }

HloSharding HloSharding::manual() {
  HloSharding sharding;
  sharding.kind_ = Kind::kManual;
  return sharding;
}

HloSharding HloSharding::unknown() {
  HloSharding sharding;
  sharding.kind_ = Kind::kUnknown;
  return sharding;
}

HloSharding HloSharding::maximal(int64_t device) {
  HloSharding sharding;
  sharding.kind_ = Kind::kMaximal;
  sharding.maximal_device_ = device;
  return sharding;
}

HloSharding HloSharding::tile(TileAssignment tiles) {
  HloSharding sharding;
  sharding.kind_ = Kind::kTiled;
  sharding.tiles_ = std::move(tiles);
  return sharding;
}

HloSharding HloSharding::tuple(std::vector<HloSharding> elements) {
  HloSharding sharding;
  sharding.kind_ = Kind::kTuple;
  sharding.tuple_elements_ = std::move(elements);
  return sharding;
}

// XLA's GroupMinorIotaDimsSorted: rewrites the iota (reshape dims, perm) so
// that the `group_size` minor positions are whole reshape dims listed in
// ascending order, which makes every replication group sorted. Example:
// [2,4]T(1,0) (devices 0,4,1,5,2,6,3,7) with groups of 4 becomes
// [2,2,2]T(1,0,2) (groups {0,1,4,5} and {2,3,6,7}). Fails when the minor
// dims cannot be split to fit the group size.
static bool group_minor_iota_dims_sorted(std::vector<int64_t>& reshape_dims, std::vector<int64_t>& perm,
                                         int64_t group_size) {
  std::size_t grouped = 0;
  std::optional<std::pair<int64_t, int64_t>> split;  // (reshape dim, major part)
  for (std::size_t i = perm.size(); i-- > 0;) {
    const int64_t dim = perm[i];
    const int64_t size = reshape_dims[static_cast<std::size_t>(dim)];
    if (size <= group_size) {
      if (group_size % size != 0) return false;
      group_size /= size;
      ++grouped;
    } else {
      if (size % group_size != 0) return false;
      split = std::pair{dim, size / group_size};
      ++grouped;
      group_size = 1;
      break;
    }
  }
  if (split) {
    const auto [dim, major] = *split;
    const auto at = static_cast<std::size_t>(dim);
    const int64_t minor = reshape_dims[at] / major;
    reshape_dims[at] = major;
    reshape_dims.insert(reshape_dims.begin() + dim + 1, minor);
    std::vector<int64_t> new_perm;
    for (int64_t p : perm) {
      if (p == dim) {
        new_perm.push_back(dim);
        new_perm.push_back(dim + 1);
      } else {
        new_perm.push_back(p > dim ? p + 1 : p);
      }
    }
    perm = std::move(new_perm);
  }
  std::sort(perm.end() - static_cast<std::ptrdiff_t>(grouped), perm.end());
  return true;
}

HloSharding HloSharding::partial_tile(TileAssignment tiles) {
  const int64_t group_size = tiles.dims().back();
  if (tiles.num_dims() == 1 || group_size == tiles.num_elements()) return replicate();
  if (group_size == 1) {
    std::vector<int64_t> data_dims(tiles.dims().begin(), tiles.dims().end() - 1);
    return tile(tiles.reshape(std::move(data_dims)));
  }
  HloSharding sharding;
  sharding.kind_ = Kind::kTiled;
  sharding.replicate_on_last_tile_dim_ = true;
  if (tiles.is_iota()) {
    const IotaTileAssignment& iota = *tiles.iota();
    if (iota.reshape_dims()[static_cast<std::size_t>(iota.perm().back())] == group_size) {
      sharding.tiles_ = std::move(tiles);
      return sharding;
    }
    std::vector<int64_t> reshape_dims = iota.reshape_dims();
    std::vector<int64_t> perm = iota.perm();
    if (group_minor_iota_dims_sorted(reshape_dims, perm, group_size)) {
      sharding.tiles_ = TileAssignment(IotaTileAssignment::create(tiles.dims(), reshape_dims, perm));
      return sharding;
    }
  }
  std::vector<int64_t> devices = tiles.devices();
  for (auto group = devices.begin(); group != devices.end(); group += group_size) {
    std::sort(group, group + group_size);
  }
  sharding.tiles_ = TileAssignment(tiles.dims(), std::move(devices));
  return sharding;
}

// XLA's order of subgroup types after merging (MAXIMAL, TUPLE, OTHER, MANUAL,
// UNREDUCED, REPLICATED, UNKNOWN), restricted to the types subgroups use.
static constexpr SubgroupType kSubgroupOrder[] = {SubgroupType::kMaximal, SubgroupType::kManual,
                                                  SubgroupType::kUnreduced, SubgroupType::kReplicated};

HloSharding HloSharding::subgroup(TileAssignment tiles, std::vector<SubgroupType> types) {
  if (types.empty()) return tile(std::move(tiles));
  if (types.size() > static_cast<std::size_t>(tiles.num_dims())) {
    throw Error(
        fmt::format("{} subgroup types need at least as many tile dims, got {}", types.size(), tiles.num_dims()));
  }
  const int data_rank = tiles.num_dims() - static_cast<int>(types.size());
  int64_t data_tiles = 1;
  for (int d = 0; d < data_rank; ++d) data_tiles *= tiles.dim(d);
  const bool all_same = std::all_of(types.begin(), types.end(), [&](SubgroupType t) { return t == types[0]; });
  if (all_same && data_tiles == 1) {
    if (types[0] == SubgroupType::kManual) return manual();
    if (types[0] == SubgroupType::kReplicated) return replicate();
    if (types[0] == SubgroupType::kUnreduced) {
      HloSharding sharding;
      sharding.kind_ = Kind::kUnreduced;
      return sharding;
    }
  }
  // Drop size-1 subgroup dims and merge dims of one type, in XLA's type order.
  std::vector<int64_t> removed;
  bool needs_merge = false;
  int distinct_types = 0;
  std::vector<std::vector<int64_t>> dims_of_type(std::size(kSubgroupOrder));
  for (std::size_t j = 0; j < types.size(); ++j) {
    const auto dim = static_cast<int64_t>(data_rank + static_cast<int>(j));
    if (tiles.dim(static_cast<int>(dim)) == 1) {
      removed.push_back(dim);
      needs_merge = true;
      continue;
    }
    const auto slot = static_cast<std::size_t>(
        std::find(std::begin(kSubgroupOrder), std::end(kSubgroupOrder), types[j]) - std::begin(kSubgroupOrder));
    if (dims_of_type[slot].empty()) {
      ++distinct_types;
    } else {
      needs_merge = true;
    }
    dims_of_type[slot].push_back(dim);
  }
  needs_merge |= distinct_types > 1;

  if (needs_merge) {
    std::vector<int64_t> perm;
    std::vector<int64_t> merged_dims;
    for (int d = 0; d < data_rank; ++d) {
      perm.push_back(d);
      merged_dims.push_back(tiles.dim(d));
    }
    std::vector<SubgroupType> merged_types;
    for (std::size_t slot = 0; slot < std::size(kSubgroupOrder); ++slot) {
      if (dims_of_type[slot].empty()) continue;
      int64_t size = 1;
      for (int64_t dim : dims_of_type[slot]) {
        perm.push_back(dim);
        size *= tiles.dim(static_cast<int>(dim));
      }
      merged_dims.push_back(size);
      merged_types.push_back(kSubgroupOrder[slot]);
    }
    perm.insert(perm.end(), removed.begin(), removed.end());
    // No data dims and no subgroup dims left: one tile on one device. XLA
    // would build a rank-0 tile assignment; that has no text form, and one
    // device holding everything is replication.
    if (merged_dims.empty()) return replicate();
    tiles = tiles.transpose(perm).reshape(std::move(merged_dims));
    types = std::move(merged_types);
  }

  if (types.empty()) return tile(std::move(tiles));
  if (types.size() == 1 && types[0] == SubgroupType::kReplicated) {
    return partial_tile(std::move(tiles));
  }
  if (types.size() == 1 && types[0] == SubgroupType::kManual && tiles.num_elements() == tiles.dims().back()) {
    return manual();
  }
  HloSharding sharding;
  if (types.back() == SubgroupType::kReplicated) {
    // Sort the replication groups, then restore the subgroup types.
    sharding = partial_tile(std::move(tiles));
    sharding.replicate_on_last_tile_dim_ = false;
  } else {
    sharding.kind_ = Kind::kTiled;
    sharding.tiles_ = std::move(tiles);
  }
  sharding.subgroup_types_ = std::move(types);
  return sharding;
}

int HloSharding::num_data_dims() const {
  if (kind_ != Kind::kTiled) return 0;
  return tiles_->num_dims() - (replicate_on_last_tile_dim_ ? 1 : 0) - static_cast<int>(subgroup_types_.size());
}

void HloSharding::print(std::string& out) const {
  if (kind_ == Kind::kTuple) {
    out += "{";
    for (std::size_t i = 0; i < tuple_elements_.size(); ++i) {
      if (i > 0) out += i % 5 == 0 ? fmt::format(", /*index={}*/", i) : ", ";
      tuple_elements_[i].print(out);
    }
    out += "}";
    return;
  }
  out += "{";
  switch (kind_) {
    case Kind::kReplicated:
      out += "replicated";
      break;
    case Kind::kManual:
      out += "manual";
      break;
    case Kind::kUnknown:
      out += "unknown";
      break;
    case Kind::kUnreduced:
      out += "unreduced";
      break;
    case Kind::kMaximal:
      out += fmt::format("maximal device={}", maximal_device_);
      break;
    case Kind::kTiled:
      out += tiles_->to_string();
      if (replicate_on_last_tile_dim_) out += " last_tile_dim_replicate";
      if (!subgroup_types_.empty()) {
        out += " last_tile_dims={";
        for (std::size_t i = 0; i < subgroup_types_.size(); ++i) {
          if (i > 0) out += ", ";
          out += shardflow::to_string(subgroup_types_[i]);
        }
        out += "}";
      }
      break;
    case Kind::kTuple:
      break;  // handled above
  }
  if (shard_as_) {
    out += fmt::format(" shard_as {}", *shard_as_);
  } else if (shard_like_) {
    out += fmt::format(" shard_like {}", *shard_like_);
  }
  if (!metadata_.empty()) out += " metadata=" + metadata_;
  out += "}";
}

std::string HloSharding::to_string() const {
  std::string out;
  print(out);
  return out;
}

}  // namespace shardflow
