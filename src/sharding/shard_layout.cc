#include "shardflow/sharding/shard_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "shardflow/base/error.h"
#include "shardflow/base/text.h"
#include "shardflow/sharding/sharding.h"

namespace shardflow {

// numel() of tensor/, which this stage does not link: the element count, an
// error past int64 (a zero extent gives 0).
static int64_t element_count(std::span<const int64_t> shape) {
  int64_t count = 1;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    overflow = __builtin_mul_overflow(count, d, &count) || overflow;
  }
  if (overflow) throw Error("shape " + python_int_tuple(shape) + " has more elements than a 64-bit count holds");
  return count;
}

int64_t ShardLayout::shard_elements() const { return element_count(shard_shape); }

int64_t ShardLayout::tile_edge(std::size_t dim, int64_t tile) const {
  const int64_t size = global_shape.at(dim), step = shard_shape.at(dim);
  return step != 0 && tile > size / step ? size : std::min(tile * step, size);
}

std::optional<std::vector<int64_t>> contiguous_shard_offsets(const ShardLayout& layout) {
  int64_t tiles = 1;
  for (int64_t count : layout.num_tiles) tiles *= count;
  if (tiles != static_cast<int64_t>(layout.shards.size())) return std::nullopt;  // a tile on several devices
  const std::size_t rank = layout.global_shape.size();
  std::vector<int64_t> strides(rank, 1);
  for (std::size_t d = rank; d-- > 1;) strides[d - 1] = strides[d] * layout.global_shape[d];
  std::vector<int64_t> offsets;
  offsets.reserve(layout.shards.size());
  for (const DeviceShard& shard : layout.shards) {
    int64_t offset = 0;
    bool spread = false;  // a dim before this one covers more than one index
    for (std::size_t d = 0; d < rank; ++d) {
      const DimSlice& slice = shard.slices[d];
      if (slice.size() != layout.shard_shape[d]) return std::nullopt;  // padded
      if (spread && slice.size() != layout.global_shape[d]) return std::nullopt;
      spread = spread || slice.size() > 1;
      offset += slice.start * strides[d];
    }
    offsets.push_back(offset);
  }
  return offsets;
}

const DeviceShard& ShardLayout::shard_of(int64_t device) const {
  for (const DeviceShard& shard : shards) {
    if (shard.device == device) return shard;
  }
  throw Error(fmt::format("device {} holds no shard of this tensor", device));
}

static std::vector<DimSlice> whole_slices(std::span<const int64_t> shape) {
  std::vector<DimSlice> slices;
  for (int64_t d : shape) slices.push_back({0, d});
  return slices;
}

ShardLayout shard_layout(const HloSharding& sharding, std::span<const int64_t> shape, int64_t num_devices) {
  for (int64_t d : shape) {
    if (d < 0) throw Error("tensor shape " + python_int_tuple(shape) + " has a negative dim");
  }
  ShardLayout layout;
  layout.global_shape.assign(shape.begin(), shape.end());
  layout.shard_shape = layout.global_shape;
  layout.num_tiles.assign(shape.size(), 1);
  const std::vector<int64_t> no_tile(shape.size(), 0);
  switch (sharding.kind()) {
    case HloSharding::Kind::kTuple:
      throw Error("a tuple sharding " + sharding.to_string() + " has no single shard layout");
    case HloSharding::Kind::kManual:
      throw Error("a manual sharding has no global shard layout");
    case HloSharding::Kind::kMaximal:
      if (sharding.maximal_device() >= num_devices) {
        throw Error(fmt::format("sharding {} names device {} but there are {} devices", sharding.to_string(),
                                sharding.maximal_device(), num_devices));
      }
      layout.shards.push_back({sharding.maximal_device(), 0, whole_slices(shape), no_tile, true});
      return layout;
    case HloSharding::Kind::kReplicated:
    case HloSharding::Kind::kUnknown:
    case HloSharding::Kind::kUnreduced:
      for (int64_t device = 0; device < num_devices; ++device) {
        layout.shards.push_back({device, device, whole_slices(shape), no_tile, true});
      }
      return layout;
    case HloSharding::Kind::kTiled:
      break;
  }

  const TileAssignment& tiles = sharding.tile_assignment();
  const int data_rank = sharding.num_data_dims();
  if (data_rank > static_cast<int>(shape.size())) {
    throw Error(fmt::format("sharding {} splits {} dims but the tensor {} has rank {}", sharding.to_string(), data_rank,
                            python_int_tuple(shape), shape.size()));
  }
  for (int d = 0; d < data_rank; ++d) {
    const auto k = static_cast<std::size_t>(d);
    layout.num_tiles[k] = tiles.dim(d);
    // ceil(size / tiles) without forming size + tiles - 1, which overflows
    // for sizes near 2^63.
    layout.shard_shape[k] = shape[k] / layout.num_tiles[k] + (shape[k] % layout.num_tiles[k] != 0 ? 1 : 0);
  }
  const std::vector<int64_t> devices = tiles.devices();
  std::vector<int64_t> index(static_cast<std::size_t>(tiles.num_dims()), 0);
  for (int64_t device : devices) {
    if (device >= num_devices) {
      throw Error(fmt::format("sharding {} names device {} but there are {} devices", sharding.to_string(), device,
                              num_devices));
    }
    DeviceShard shard{device, 0, whole_slices(shape), no_tile, false};
    for (int d = 0; d < data_rank; ++d) {
      const auto k = static_cast<std::size_t>(d);
      shard.tile_index[k] = index[k];
      shard.slices[k] = {layout.tile_edge(k, index[k]), layout.tile_edge(k, index[k] + 1)};
    }
    for (int d = data_rank; d < tiles.num_dims(); ++d) {
      shard.replica_id = shard.replica_id * tiles.dim(d) + index[static_cast<std::size_t>(d)];
    }
    layout.shards.push_back(std::move(shard));
    for (int d = tiles.num_dims(); d-- > 0;) {
      if (++index[static_cast<std::size_t>(d)] < tiles.dim(d)) break;
      index[static_cast<std::size_t>(d)] = 0;
    }
  }
  std::sort(layout.shards.begin(), layout.shards.end(),
            [](const DeviceShard& a, const DeviceShard& b) { return a.device < b.device; });
  return layout;
}

ShardLayout shard_layout(const Sharding& sharding, std::span<const int64_t> shape) {
  if (static_cast<int>(shape.size()) != sharding.rank()) {
    throw Error(fmt::format("tensor {} has rank {} but its sharding {} has rank {}", python_int_tuple(shape),
                            shape.size(), sharding.to_readable(), sharding.rank()));
  }
  return shard_layout(sharding.to_hlo_v1(), shape, sharding.mesh().size());
}

// Copies the box `extent` between two row-major arrays: from `src` (shape
// `src_shape`) at `src_offset` to `dst` (shape `dst_shape`) at `dst_offset`.
static void copy_box(const std::byte* src, std::span<const int64_t> src_shape, std::span<const int64_t> src_offset,
                     std::byte* dst, std::span<const int64_t> dst_shape, std::span<const int64_t> dst_offset,
                     std::span<const int64_t> extent, std::size_t element_size) {
  const std::size_t rank = extent.size();
  for (int64_t e : extent) {
    if (e == 0) return;
  }
  if (rank == 0) {
    std::memcpy(dst, src, element_size);
    return;
  }
  std::vector<int64_t> src_strides(rank, 1), dst_strides(rank, 1);
  for (std::size_t i = rank; i-- > 1;) {
    src_strides[i - 1] = src_strides[i] * src_shape[i];
    dst_strides[i - 1] = dst_strides[i] * dst_shape[i];
  }
  const std::size_t row_bytes = static_cast<std::size_t>(extent[rank - 1]) * element_size;
  std::vector<int64_t> index(rank, 0);  // over all dims but the last
  while (true) {
    int64_t src_at = 0, dst_at = 0;
    for (std::size_t i = 0; i < rank; ++i) {
      src_at += (src_offset[i] + index[i]) * src_strides[i];
      dst_at += (dst_offset[i] + index[i]) * dst_strides[i];
    }
    std::memcpy(dst + static_cast<std::size_t>(dst_at) * element_size,
                src + static_cast<std::size_t>(src_at) * element_size, row_bytes);
    std::size_t i = rank - 1;
    while (i-- > 0) {
      if (++index[i] < extent[i]) break;
      index[i] = 0;
    }
    if (i == static_cast<std::size_t>(-1)) return;
  }
}

static std::vector<int64_t> starts_of(const DeviceShard& shard) {
  std::vector<int64_t> starts;
  for (const DimSlice& s : shard.slices) starts.push_back(s.start);
  return starts;
}

static std::vector<int64_t> sizes_of(const DeviceShard& shard) {
  std::vector<int64_t> sizes;
  for (const DimSlice& s : shard.slices) sizes.push_back(s.size());
  return sizes;
}

void copy_shard(const ShardLayout& layout, std::size_t index, std::span<const std::byte> global,
                std::size_t element_size, std::span<std::byte> shard) {
  const auto expected = static_cast<std::size_t>(element_count(layout.global_shape)) * element_size;
  if (global.size() != expected) {
    throw Error(fmt::format("tensor {} of {}-byte elements needs {} bytes, got {}",
                            python_int_tuple(layout.global_shape), element_size, expected, global.size()));
  }
  const DeviceShard& device_shard = layout.shards.at(index);
  const auto shard_bytes = static_cast<std::size_t>(layout.shard_elements()) * element_size;
  if (shard.size() != shard_bytes) {
    throw Error(
        fmt::format("shard buffer of device {} has {} bytes but the padded shard shape "
                    "{} needs {}",
                    device_shard.device, shard.size(), python_int_tuple(layout.shard_shape), shard_bytes));
  }
  const std::vector<int64_t> sizes = sizes_of(device_shard);
  if (sizes != layout.shard_shape && shard_bytes > 0) std::memset(shard.data(), 0, shard_bytes);  // padding
  const std::vector<int64_t> zeros(layout.global_shape.size(), 0);
  copy_box(global.data(), layout.global_shape, starts_of(device_shard), shard.data(), layout.shard_shape, zeros, sizes,
           element_size);
}

void split_into_shards(const ShardLayout& layout, std::span<const std::byte> global, std::size_t element_size,
                       std::span<const std::span<std::byte>> shards) {
  if (shards.size() != layout.shards.size()) {
    throw Error(fmt::format("expected {} shard buffers (one per device of the layout), got {}", layout.shards.size(),
                            shards.size()));
  }
  for (std::size_t i = 0; i < shards.size(); ++i) {
    copy_shard(layout, i, global, element_size, shards[i]);
  }
}

std::vector<std::vector<std::byte>> split_into_shards(const ShardLayout& layout, std::span<const std::byte> global,
                                                      std::size_t element_size) {
  const auto shard_bytes = static_cast<std::size_t>(layout.shard_elements()) * element_size;
  std::vector<std::vector<std::byte>> buffers(layout.shards.size(), std::vector<std::byte>(shard_bytes));
  std::vector<std::span<std::byte>> views(buffers.begin(), buffers.end());
  split_into_shards(layout, global, element_size, views);
  return buffers;
}

void assemble_from_shards(const ShardLayout& layout, std::span<const std::span<const std::byte>> shards,
                          std::size_t element_size, std::span<std::byte> global) {
  if (shards.size() != layout.shards.size()) {
    throw Error(
        fmt::format("expected {} shards (one per device of the layout), got {}", layout.shards.size(), shards.size()));
  }
  const auto expected = static_cast<std::size_t>(element_count(layout.global_shape)) * element_size;
  if (global.size() != expected) {
    throw Error(fmt::format("tensor {} of {}-byte elements needs {} bytes, got {}",
                            python_int_tuple(layout.global_shape), element_size, expected, global.size()));
  }
  const auto shard_bytes = static_cast<std::size_t>(layout.shard_elements()) * element_size;
  const std::vector<int64_t> zeros(layout.global_shape.size(), 0);
  int64_t covered = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].size() != shard_bytes) {
      throw Error(
          fmt::format("shard of device {} has {} bytes but the padded shard shape {} "
                      "needs {}",
                      layout.shards[i].device, shards[i].size(), python_int_tuple(layout.shard_shape), shard_bytes));
    }
    const DeviceShard& shard = layout.shards[i];
    if (shard.replica_id != 0) continue;
    const std::vector<int64_t> sizes = sizes_of(shard);
    covered += element_count(sizes);
    copy_box(shards[i].data(), layout.shard_shape, zeros, global.data(), layout.global_shape, starts_of(shard), sizes,
             element_size);
  }
  if (covered != element_count(layout.global_shape)) {
    throw Error(fmt::format("the replica-0 shards cover {} of the {} elements of tensor {}", covered,
                            element_count(layout.global_shape), python_int_tuple(layout.global_shape)));
  }
}

std::vector<std::byte> assemble_from_shards(const ShardLayout& layout, std::span<const std::vector<std::byte>> shards,
                                            std::size_t element_size) {
  std::vector<std::span<const std::byte>> views(shards.begin(), shards.end());
  std::vector<std::byte> global(static_cast<std::size_t>(element_count(layout.global_shape)) * element_size);
  assemble_from_shards(layout, views, element_size, global);
  return global;
}

}  // namespace shardflow
