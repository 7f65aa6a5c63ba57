// Local shard layouts (sharding-semantics §6, §7.2): padded shard shapes,
// each device's global slice, replica ids, and the data each device holds.
#include "shardflow/sharding/shard_layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <numeric>

#include "shardflow/base/error.h"
#include "shardflow/sharding/shard_diagram.h"
#include "shardflow/sharding/sharding.h"

namespace sf = shardflow;

namespace {

using Slices = std::vector<sf::DimSlice>;

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return ids;
}

sf::ShardLayout layout_of(std::vector<int64_t> mesh_shape, const char* spec,
                          std::vector<int64_t> shape, std::vector<std::string> names = {}) {
  int64_t size = 1;
  for (int64_t extent : mesh_shape) size *= extent;
  auto mesh = std::make_shared<const sf::Mesh>(iota(size), mesh_shape, names);
  return sf::shard_layout(sf::Sharding::from_spec(mesh, sf::PartitionSpec::parse(spec)), shape);
}

std::vector<int64_t> unpadded_shape(const sf::DeviceShard& shard) {
  std::vector<int64_t> shape;
  for (const sf::DimSlice& slice : shard.slices) shape.push_back(slice.size());
  return shape;
}

// The shards of a float tensor holding 0, 1, 2, ... (row-major).
std::vector<std::vector<float>> shard_data(const sf::ShardLayout& layout) {
  int64_t elements = 1;
  for (int64_t d : layout.global_shape) elements *= d;
  std::vector<float> global(static_cast<std::size_t>(elements));
  std::iota(global.begin(), global.end(), 0.0f);
  std::vector<std::vector<float>> result;
  for (const auto& bytes : sf::split_into_shards(layout, std::as_bytes(std::span(global)), 4)) {
    std::vector<float> values(bytes.size() / 4);
    if (!values.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
    result.push_back(std::move(values));
  }
  return result;
}

TEST(ShardLayout, L1_OneElementPerDevice) {
  const sf::ShardLayout layout = layout_of({8}, "(0,)", {8});
  EXPECT_EQ(layout.shard_shape, (std::vector<int64_t>{1}));
  const auto data = shard_data(layout);
  for (int64_t i = 0; i < 8; ++i) {
    const sf::DeviceShard& shard = layout.shards[static_cast<std::size_t>(i)];
    EXPECT_EQ(shard.device, i);
    EXPECT_EQ(shard.replica_id, 0);
    EXPECT_EQ(shard.slices, (Slices{{i, i + 1}}));
    EXPECT_EQ(data[static_cast<std::size_t>(i)], (std::vector<float>{static_cast<float>(i)}));
  }
}

TEST(ShardLayout, L2_PaddedAndEmptyShards) {
  const sf::ShardLayout layout = layout_of({8}, "(0,)", {9});
  EXPECT_EQ(layout.shard_shape, (std::vector<int64_t>{2}));
  const auto data = shard_data(layout);
  EXPECT_EQ(layout.shards[0].slices, (Slices{{0, 2}}));
  EXPECT_EQ(layout.shards[3].slices, (Slices{{6, 8}}));
  EXPECT_EQ(layout.shards[4].slices, (Slices{{8, 9}}));
  EXPECT_EQ(data[4], (std::vector<float>{8, 0}));
  for (std::size_t d = 5; d < 8; ++d) {
    EXPECT_EQ(layout.shards[d].slices, (Slices{{9, 9}}));
    EXPECT_EQ(data[d], (std::vector<float>{0, 0}));
  }
  for (const auto& shard : layout.shards) EXPECT_EQ(shard.replica_id, 0);
}

TEST(ShardLayout, L3_L4_ReplicatedReplicaIdIsTheDevice) {
  for (const auto& [spec, shape] : {std::pair{"(None,)", std::vector<int64_t>{8}},
                                    std::pair{"()", std::vector<int64_t>{}}}) {
    const sf::ShardLayout layout = layout_of({8}, spec, shape);
    EXPECT_EQ(layout.shard_shape, shape);
    const auto data = shard_data(layout);
    for (int64_t i = 0; i < 8; ++i) {
      const sf::DeviceShard& shard = layout.shards[static_cast<std::size_t>(i)];
      EXPECT_TRUE(shard.whole);
      EXPECT_EQ(shard.replica_id, i);
      EXPECT_EQ(data[static_cast<std::size_t>(i)], data[0]);
    }
  }
}

TEST(ShardLayout, L5_PartialReplicaIds) {
  const sf::ShardLayout layout = layout_of({4, 2}, "(None, 1)", {16, 16});
  EXPECT_EQ(layout.shard_shape, (std::vector<int64_t>{16, 8}));
  for (int64_t i = 0; i < 8; ++i) {
    const sf::DeviceShard& shard = layout.shards[static_cast<std::size_t>(i)];
    EXPECT_EQ(shard.slices, (Slices{{0, 16}, {8 * (i % 2), 8 * (i % 2) + 8}}));
    EXPECT_EQ(shard.replica_id, i / 2);
  }
}

TEST(ShardLayout, L6_C1_ExplicitTileAssignment) {
  const sf::ShardLayout layout =
      sf::shard_layout(sf::HloSharding::parse("{devices=[2,2]0,1,2,3}"), std::vector<int64_t>{8, 7}, 4);
  EXPECT_EQ(layout.shard_shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(layout.shards[0].slices, (Slices{{0, 4}, {0, 4}}));
  EXPECT_EQ(layout.shards[1].slices, (Slices{{0, 4}, {4, 7}}));
  EXPECT_EQ(layout.shards[2].slices, (Slices{{4, 8}, {0, 4}}));
  EXPECT_EQ(layout.shards[3].slices, (Slices{{4, 8}, {4, 7}}));
}

TEST(ShardLayout, L8_PartialOnAThreeAxisMesh) {
  const sf::ShardLayout layout = layout_of({2, 1, 4}, "(1, None, 0)", {4, 3, 4});
  EXPECT_EQ(layout.shard_shape, (std::vector<int64_t>{4, 3, 2}));
  const auto data = shard_data(layout);
  for (int64_t i = 0; i < 8; ++i) {
    const sf::DeviceShard& shard = layout.shards[static_cast<std::size_t>(i)];
    const int64_t start = i < 4 ? 0 : 2;
    EXPECT_EQ(shard.slices, (Slices{{0, 4}, {0, 3}, {start, start + 2}}));
    EXPECT_EQ(shard.replica_id, i % 4);
  }
  EXPECT_EQ(data[0], data[1]);
  EXPECT_NE(data[0], data[4]);
}

TEST(ShardLayout, L10_L11_TileRankBelowTensorRank) {
  const sf::ShardLayout l10 = sf::shard_layout(sf::HloSharding::parse("{devices=[2,4]0,1,2,3,4,5,6,7}"),
                                               std::vector<int64_t>{8, 7, 4}, 8);
  EXPECT_EQ(unpadded_shape(l10.shards[0]), (std::vector<int64_t>{4, 2, 4}));
  EXPECT_EQ(unpadded_shape(l10.shards[7]), (std::vector<int64_t>{4, 1, 4}));
  const sf::ShardLayout l11 = sf::shard_layout(sf::HloSharding::parse("{devices=[1,1,2,2,2]<=[8]}"),
                                               std::vector<int64_t>{10, 1, 8, 7, 4}, 8);
  EXPECT_EQ(unpadded_shape(l11.shards[0]), (std::vector<int64_t>{10, 1, 4, 4, 2}));
  EXPECT_EQ(unpadded_shape(l11.shards[7]), (std::vector<int64_t>{10, 1, 4, 3, 2}));
  EXPECT_EQ(l11.shard_shape, (std::vector<int64_t>{10, 1, 4, 4, 2}));
}

TEST(ShardLayout, L12_DeviceOrderInTheAssignment) {
  const std::vector<int64_t> shape{8, 7, 4};
  const sf::ShardLayout first =
      sf::shard_layout(sf::HloSharding::parse("{devices=[2,4]4,5,0,1,6,7,2,3}"), shape, 8);
  for (int64_t device = 4; device < 8; ++device) {
    EXPECT_EQ(unpadded_shape(first.shard_of(device)), (std::vector<int64_t>{4, 2, 4}));
  }
  const sf::ShardLayout second =
      sf::shard_layout(sf::HloSharding::parse("{devices=[2,4]0,1,4,5,2,3,6,7}"), shape, 8);
  EXPECT_EQ(unpadded_shape(second.shard_of(7)), (std::vector<int64_t>{4, 1, 4}));
}

TEST(ShardLayout, L13_TrailingDeviceHoldsOnlyPadding) {
  const sf::ShardLayout layout = layout_of({8}, "('data', None, None, None)", {7, 3, 64, 64}, {"data"});
  EXPECT_EQ(layout.shard_shape, (std::vector<int64_t>{1, 3, 64, 64}));
  for (int64_t i = 0; i < 7; ++i) {
    EXPECT_EQ(layout.shards[static_cast<std::size_t>(i)].slices[0], (sf::DimSlice{i, i + 1}));
  }
  EXPECT_EQ(layout.shards[7].slices[0], (sf::DimSlice{7, 7}));
}

TEST(ShardLayout, SeventeenRowsOnEightDevices) {
  const sf::ShardLayout layout = layout_of({8}, "(0, None)", {17, 4});
  std::vector<int64_t> rows;
  for (const auto& shard : layout.shards) rows.push_back(shard.slices[0].size());
  EXPECT_EQ(rows, (std::vector<int64_t>{3, 3, 3, 3, 3, 2, 0, 0}));
  EXPECT_EQ(layout.shard_shape, (std::vector<int64_t>{3, 4}));
}

// Dims near 2^63 (shape-only tensors may have them): the padded tiles run
// past the largest int64, yet every tile edge is right and in [0, size].
TEST(ShardLayout, DimsNearTheLargestInt64) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int64_t tiles : {2, 3, 7, 8, 64}) {
    for (int64_t size : {kMax, kMax - 1, kMax - 6, kMax - tiles + 1, kMax / tiles * tiles}) {
      const sf::ShardLayout layout = layout_of({tiles}, "(0,)", {size});
      const int64_t step = size / tiles + (size % tiles != 0 ? 1 : 0);
      ASSERT_EQ(layout.shard_shape, (std::vector<int64_t>{step})) << size << " over " << tiles;
      int64_t next = 0;
      for (const sf::DeviceShard& shard : layout.shards) {
        const sf::DimSlice& slice = shard.slices[0];
        EXPECT_EQ(slice.start, next) << size << " over " << tiles << ", device " << shard.device;
        EXPECT_LE(slice.start, slice.stop);
        EXPECT_LE(slice.stop - slice.start, step);
        next = slice.stop;
      }
      EXPECT_EQ(next, size) << size << " over " << tiles;
    }
  }
}

TEST(ShardLayout, RejectsInconsistentInput) {
  const std::vector<int64_t> shape{8};
  EXPECT_THROW(sf::shard_layout(sf::HloSharding::parse("{devices=[2,2]0,1,2,3}"), shape, 4), sf::Error);
  EXPECT_THROW(sf::shard_layout(sf::HloSharding::parse("{devices=[4]0,1,2,7}"), shape, 4), sf::Error);
  EXPECT_THROW(sf::shard_layout(sf::HloSharding::parse("{manual}"), shape, 4), sf::Error);
  const sf::ShardLayout layout = layout_of({4}, "(0,)", {8});
  std::vector<float> too_short(7);
  EXPECT_THROW(sf::split_into_shards(layout, std::as_bytes(std::span(too_short)), 4), sf::Error);
  std::vector<std::vector<std::byte>> three(3, std::vector<std::byte>(8));
  EXPECT_THROW(sf::assemble_from_shards(layout, three, 4), sf::Error);
  std::vector<std::vector<std::byte>> wrong_size(4, std::vector<std::byte>(4));
  EXPECT_THROW(sf::assemble_from_shards(layout, wrong_size, 4), sf::Error);
}

TEST(ShardDiagram, DrawsAnyRank) {
  // Mesh axes (2, 2, 4) split dims 0, 2 and 3 in 2, 2 and 4 shards.
  const sf::ShardLayout layout = layout_of({2, 2, 4}, "(0, None, 1, 2)", {4, 5, 4, 8});
  const std::string picture = sf::draw_shard_layout(layout);
  EXPECT_NE(picture.find("not split (whole on every device): dim 1 (5)"), std::string::npos) << picture;
  // The grid holds dim 3 (most shards) and dim 0 (first of the ties); dim 2
  // gets one grid per shard.
  EXPECT_NE(picture.find("dim 2 [0:2]:"), std::string::npos) << picture;
  EXPECT_NE(picture.find("dim 2 [2:4]:"), std::string::npos) << picture;
  EXPECT_NE(picture.find("dim 0   [0:2]   [2:4]   [4:6]   [6:8]"), std::string::npos) << picture;
  EXPECT_NE(picture.find("[2:4] | 8     | 9     | 10    | 11    |"), std::string::npos) << picture;
  EXPECT_NE(picture.find("[2:4] | 12    | 13    | 14    | 15    |"), std::string::npos) << picture;
  // Replicas share a cell.
  const std::string partial = sf::draw_shard_layout(layout_of({2, 4}, "(0, None)", {4, 4}));
  EXPECT_NE(partial.find("| 0-3   | 4-7   |"), std::string::npos) << partial;
  EXPECT_EQ(sf::compress_device_list({7, 0, 1, 2, 3, 5, 9, 10}), "0-3,5,7,9,10");
}

}  // namespace
