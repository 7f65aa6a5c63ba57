// XLA's HloSharding, as text: printer, parser and normalisation.
//
// This is the form PyTorch/XLA and JAX users read in HLO dumps:
//   {replicated}  {manual}  {unknown}  {maximal device=3}
//   {devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}   (V1, explicit)
//   {devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}      (V2, iota)
//   {devices=[2,2,2]<=[8] last_tile_dims={manual}}
//   {{replicated}, {maximal device=0}}                          (tuple)
// The constructors normalise exactly as XLA does (sharding-semantics §2.8,
// §5): partial_tile sorts devices inside each replication group and collapses
// trivial groups; subgroup merges and orders subgroup dims.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardflow/sharding/tile_assignment.h"

namespace shardflow {

// XLA's OpSharding::Type values used for subgroups (last_tile_dims).
enum class SubgroupType { kReplicated = 0, kMaximal = 1, kManual = 4, kUnreduced = 6 };

std::string_view to_string(SubgroupType type);

class HloSharding {
 public:
  enum class Kind { kReplicated, kManual, kUnknown, kUnreduced, kMaximal, kTiled, kTuple };

  static HloSharding replicate();
  static HloSharding manual();
  static HloSharding unknown();
  static HloSharding maximal(int64_t device);
  // A tiled sharding with one tile dim per tensor dim.
  static HloSharding tile(TileAssignment tiles);
  // The last tile dim is a replication group (XLA's PartialTile).
  static HloSharding partial_tile(TileAssignment tiles_with_replication_dim);
  // The trailing tile dims are subgroups of the given types (XLA's Subgroup).
  static HloSharding subgroup(TileAssignment tiles, std::vector<SubgroupType> types);
  static HloSharding tuple(std::vector<HloSharding> elements);

  // Parses the text form (grammar in sharding-semantics §5.2). Errors name
  // the column and what was expected.
  static HloSharding parse(std::string_view text);

  Kind kind() const { return kind_; }
  bool is_tiled() const { return kind_ == Kind::kTiled; }
  const TileAssignment& tile_assignment() const { return *tiles_; }
  bool replicate_on_last_tile_dim() const { return replicate_on_last_tile_dim_; }
  const std::vector<SubgroupType>& subgroup_types() const { return subgroup_types_; }
  int64_t maximal_device() const { return maximal_device_; }
  const std::vector<HloSharding>& tuple_elements() const { return tuple_elements_; }
  // Tile dims that split tensor dims (the rest are replication or subgroups).
  int num_data_dims() const;

  // Shard groups and metadata are kept so that parsed text prints back.
  const std::optional<int64_t>& shard_as() const { return shard_as_; }
  const std::optional<int64_t>& shard_like() const { return shard_like_; }
  const std::string& metadata() const { return metadata_; }

  std::string to_string() const;

  friend bool operator==(const HloSharding&, const HloSharding&) = default;

 private:
  HloSharding() = default;
  void print(std::string& out) const;

  Kind kind_ = Kind::kReplicated;
  std::optional<TileAssignment> tiles_;
  bool replicate_on_last_tile_dim_ = false;
  std::vector<SubgroupType> subgroup_types_;
  int64_t maximal_device_ = -1;
  std::vector<HloSharding> tuple_elements_;
  std::optional<int64_t> shard_as_;
  std::optional<int64_t> shard_like_;
  std::string metadata_;  // the text inside metadata={...}, verbatim

  friend class HloShardingParser;
};

}  // namespace shardflow
