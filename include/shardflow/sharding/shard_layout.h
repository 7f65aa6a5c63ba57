// Where each device's piece of a global tensor lives (sharding-semantics §6).
//
// Shards are ceil-sized and padded on the high side, so every device holds a
// buffer of the same padded shard shape, and trailing devices may hold slices
// that are short or empty. Example: 17 rows on 8 devices gives shards of 3
// rows; devices 0-4 hold 3 valid rows, device 5 holds 2, devices 6-7 hold 0.
// Within a replication group, replica ids follow XLA's sorted device order;
// on a replicated tensor a device's replica id is its device id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "shardflow/sharding/hlo_sharding.h"

namespace shardflow {

class Sharding;

// The half-open range [start, stop) of one dimension of the global tensor.
struct DimSlice {
  int64_t start = 0;
  int64_t stop = 0;
  int64_t size() const { return stop - start; }
  friend bool operator==(const DimSlice&, const DimSlice&) = default;
};

struct DeviceShard {
  int64_t device = 0;
  int64_t replica_id = 0;
  // One slice per tensor dim, unpadded (global coordinates).
  std::vector<DimSlice> slices;
  // Which shard of each tensor dim the device holds (0 for dims not split).
  std::vector<int64_t> tile_index;
  // The device holds the whole tensor (Python's Ellipsis index).
  bool whole = false;
};

struct ShardLayout {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> shard_shape;  // padded; the same on every device
  std::vector<int64_t> num_tiles;    // shards per tensor dim (1 = not split)
  std::vector<DeviceShard> shards;   // ordered by device id

  int64_t shard_elements() const;
  const DeviceShard& shard_of(int64_t device) const;
  // Where tile `tile` of tensor dim `dim` starts (tile + 1: where it ends),
  // clamped to the dim: min(tile * shard size, size), without overflowing
  // for sizes near 2^63.
  int64_t tile_edge(std::size_t dim, int64_t tile) const;
};

// Layout of a tensor of `shape` under an XLA sharding over devices
// 0..num_devices-1. A tiled sharding may have fewer data dims than the tensor
// has dims; the trailing tensor dims are then taken whole.
ShardLayout shard_layout(const HloSharding& sharding, std::span<const int64_t> shape, int64_t num_devices);
// Layout under shardflow's sharding (through its V1 form).
ShardLayout shard_layout(const Sharding& sharding, std::span<const int64_t> shape);

// Where each shard starts in the row-major global tensor, in elements (in
// `layout.shards` order), when every shard is one contiguous run of it: no
// padding, each tile held by one device, and past the first dim a shard
// covers more than one index of, it covers whole dims. Then a shard can be
// a view of the global tensor's memory. Else nullopt.
std::optional<std::vector<int64_t>> contiguous_shard_offsets(const ShardLayout& layout);

// Splits a row-major global tensor into one padded buffer per shard (in
// `layout.shards` order); padding is zero bytes.
std::vector<std::vector<std::byte>> split_into_shards(const ShardLayout& layout, std::span<const std::byte> global,
                                                      std::size_t element_size);
// One device's padded shard (`layout.shards[index]`) into `shard`.
void copy_shard(const ShardLayout& layout, std::size_t index, std::span<const std::byte> global,
                std::size_t element_size, std::span<std::byte> shard);
// All shards into existing buffers (e.g. device memory), one per shard, each
// of shard_elements() * element_size bytes.
void split_into_shards(const ShardLayout& layout, std::span<const std::byte> global, std::size_t element_size,
                       std::span<const std::span<std::byte>> shards);
// Rebuilds the global tensor from padded shards, reading replica 0 of each tile.
std::vector<std::byte> assemble_from_shards(const ShardLayout& layout, std::span<const std::vector<std::byte>> shards,
                                            std::size_t element_size);
// The same from shard views into an existing global buffer.
void assemble_from_shards(const ShardLayout& layout, std::span<const std::span<const std::byte>> shards,
                          std::size_t element_size, std::span<std::byte> global);

}  // namespace shardflow
