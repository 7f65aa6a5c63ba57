// shardflow's internal, axis-based sharding (as in Shardy).
//
// A mesh plus, per tensor dimension, the mesh axes that split it, major to
// minor; plus the axes over which the value is an unreduced partial sum. Axes
// used nowhere mean replication. On a mesh data=4, model=2:
//   Sharding::from_spec(mesh, {"data", sf::none})  reads  [{data},{}]
//   and for a f32[16,8] tensor                     reads  f32[16@data,8]
// It converts exactly to XLA's HloSharding text, V1 (explicit device list,
// PyTorch/XLA's default) and V2 (iota), following sharding-semantics §2.3-§2.9.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardflow/sharding/hlo_sharding.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/sharding/partition_spec.h"

namespace shardflow {

// PyTorch/XLA's ShardingType (torch_xla values; PARTIAL and UNKNOWN differ
// from XLA's enum).
enum class ShardingType {
  kReplicated = 0,
  kMaximal = 1,
  kTuple = 2,
  kTiled = 3,
  kManual = 4,
  kPartial = 5,
  kUnknown = 6
};

// "REPLICATED", "MAXIMAL", "TUPLE", "TILED", "MANUAL", "PARTIAL", "UNKNOWN".
std::string_view to_string(ShardingType type);

// The type of an XLA sharding as PyTorch/XLA reports it
// (`_get_xla_sharding_type`): replicated, maximal, tuple and manual by kind;
// a tiling is PARTIAL when its last tile dim is a replication group, else TILED.
ShardingType sharding_type(const HloSharding& sharding);

class Sharding {
 public:
  // `dim_axes[d]` lists the mesh axes splitting dim d, major to minor. Each
  // axis may appear at most once across dims and unreduced axes.
  Sharding(std::shared_ptr<const Mesh> mesh, std::vector<std::vector<int>> dim_axes,
           std::vector<int> unreduced_axes = {});

  static Sharding replicated(std::shared_ptr<const Mesh> mesh, int rank);
  // Translates and validates `spec` against the mesh (PyTorch/XLA's errors).
  static Sharding from_spec(std::shared_ptr<const Mesh> mesh, const PartitionSpec& spec);

  const Mesh& mesh() const { return *mesh_; }
  const std::shared_ptr<const Mesh>& mesh_ptr() const { return mesh_; }
  int rank() const { return static_cast<int>(dim_axes_.size()); }
  const std::vector<int>& dim_axes(int dim) const { return dim_axes_.at(static_cast<std::size_t>(dim)); }
  const std::vector<std::vector<int>>& all_dim_axes() const { return dim_axes_; }
  const std::vector<int>& unreduced_axes() const { return unreduced_axes_; }
  // Mesh axes that neither split a dim nor are unreduced, ascending.
  std::vector<int> replicated_axes() const;
  // Number of shards of dim d: the product of its axes' sizes.
  int64_t num_shards(int dim) const;
  // No data is split and nothing is unreduced.
  bool is_replicated() const;

  // The partition spec this sharding came from (names when the mesh has them).
  PartitionSpec to_partition_spec() const;
  // The type users read as PyTorch/XLA's `sharding_type`: derived from the
  // final XLA sharding (to_hlo_v1), so `{replicated}` is REPLICATED (also on
  // a one-device mesh), `last_tile_dim_replicate` is PARTIAL and a tiling
  // without replication is TILED.
  ShardingType type() const;
  // The type mark_sharding computes from the spec before XLA normalises the
  // sharding (§2.5: unused axes or None entries make it PARTIAL). It picks
  // how V1 is built; users see type() instead. (None, 1) on a (2, 1) mesh is
  // PARTIAL here but REPLICATED as type().
  ShardingType spec_type() const;

  // XLA strings as PyTorch/XLA prints them. Shardings with unreduced axes have
  // no PyTorch/XLA form; they print with an `unreduced` subgroup.
  HloSharding to_hlo_v1() const;
  HloSharding to_hlo_v2() const;

  // "[{data},{}]", or with unreduced axes "[{data},{}] unreduced={model}".
  std::string to_readable() const;
  // "f32[16@data,8]", "f32[16@(data,fsdp),8]"; `dtype` may be empty.
  std::string to_readable(std::span<const int64_t> shape, std::string_view dtype = {}) const;

  friend bool operator==(const Sharding& a, const Sharding& b);

 private:
  std::shared_ptr<const Mesh> mesh_;
  std::vector<std::vector<int>> dim_axes_;
  std::vector<int> unreduced_axes_;
};

}  // namespace shardflow
