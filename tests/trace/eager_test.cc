// Eager tensors: ops, mark_sharding layouts and their rules
// (sharding-semantics §2.10-§3).
#include <gtest/gtest.h>

#include <numeric>

#include "shardflow/shardflow.h"

namespace sf = shardflow;

namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return ids;
}

sf::Tensor arange_f32(int64_t n, sf::Shape shape) {
  return sf::arange(n).to(sf::DType::kF32).reshape(std::move(shape));
}

TEST(Eager, OpsRunImmediately) {
  const sf::Tensor a = sf::Tensor::from_floats(std::vector<float>{1, 2, 3, 4}, {2, 2});
  const sf::Tensor b = sf::ones({2});
  EXPECT_EQ((a + b).to_floats(), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_EQ((a * 2).to_floats(), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ((a - 1).to_floats(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ((-a).to_floats(), (std::vector<float>{-1, -2, -3, -4}));
  EXPECT_EQ(a.matmul(a).to_floats(), (std::vector<float>{7, 10, 15, 22}));
  EXPECT_EQ(a.transpose(0, 1).to_floats(), (std::vector<float>{1, 3, 2, 4}));
  EXPECT_EQ(a.sum({1}).to_floats(), (std::vector<float>{3, 7}));
  EXPECT_EQ((sf::arange(4) * 2).dtype(), sf::DType::kI64);  // int * int stays int
  EXPECT_EQ(a.to_string(), "Tensor(f32[2,2], [1, 2, 3, 4])");
}

TEST(Eager, MarkShardingLaysOutTheData) {
  // L5: (16,16) on (4,2), spec (None, 1): device i holds columns of its
  // 'model' coordinate, replica id = i // 2.
  sf::Tensor t = arange_f32(256, {16, 16});
  sf::mark_sharding(t, sf::Mesh(iota(8), {4, 2}), {sf::none, 1});
  EXPECT_EQ(t.sharding_spec(), "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}");
  const std::vector<sf::LocalShard> shards = t.local_shards();
  ASSERT_EQ(shards.size(), 8u);
  for (int64_t i = 0; i < 8; ++i) {
    const sf::LocalShard& shard = shards[static_cast<std::size_t>(i)];
    EXPECT_EQ(shard.device, i);
    EXPECT_EQ(shard.replica_id, i / 2);
    EXPECT_EQ(shard.slices[1], (sf::DimSlice{8 * (i % 2), 8 * (i % 2) + 8}));
    EXPECT_EQ(shard.data.shape(), (sf::Shape{16, 8}));
    EXPECT_EQ(shard.data.data_as<float>()[0], static_cast<float>(8 * (i % 2)));
  }
  // Replicas of a tile share one buffer (held once, not once per replica).
  for (std::size_t i = 0; i < 8; ++i) {
    for (std::size_t j = 0; j < 8; ++j) {
      EXPECT_EQ(shards[i].data.data() == shards[j].data.data(), i % 2 == j % 2) << i << " " << j;
    }
  }
  // The value is intact, and ops on the sharded tensor are correct.
  EXPECT_EQ(t.to_floats(), arange_f32(256, {16, 16}).to_floats());
  EXPECT_EQ((t * 1).sum({}).item(), 255.0 * 256 / 2);
}

TEST(Eager, PaddedShardsOfAnUnevenTensor) {
  // L2: 9 elements on 8 devices: shards of 2; device 4 holds [8, pad];
  // devices 5-7 hold only padding.
  sf::Tensor t = arange_f32(9, {9});
  sf::mark_sharding(t, sf::Mesh(iota(8), {8}), {0});
  const auto shards = t.local_shards();
  EXPECT_EQ(shards[4].data.data_as<float>()[0], 8.0f);
  EXPECT_EQ(shards[4].data.data_as<float>()[1], 0.0f);
  EXPECT_EQ(shards[6].slices[0], (sf::DimSlice{9, 9}));
  EXPECT_EQ(t.to_floats(), arange_f32(9, {9}).to_floats());
}

TEST(Eager, ReannotationRules) {
  const sf::Mesh mesh(iota(4), {2, 2});
  sf::Tensor t = arange_f32(16, {4, 4});
  sf::mark_sharding(t, mesh, {0, 1});
  sf::mark_sharding(t, mesh, {0, 1});  // the same spec again: a no-op
  try {
    sf::mark_sharding(t, mesh, {1, 0});
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    EXPECT_EQ(std::string(error.what()),
              "Existing annotation must be cleared first: {devices=[2,2]0,1,2,3}");
  }
  EXPECT_EQ(t.sharding_spec(), "{devices=[2,2]0,1,2,3}");  // the original is kept
  sf::clear_sharding(t);
  EXPECT_EQ(t.sharding_spec(), "");
  EXPECT_EQ(t.to_floats(), arange_f32(16, {4, 4}).to_floats());
  // A replicated annotation may be replaced without clearing.
  sf::mark_sharding(t, mesh, {sf::none, sf::none});
  EXPECT_EQ(t.sharding_spec(), "{replicated}");
  sf::mark_sharding(t, mesh, {1, 0});
  EXPECT_EQ(t.sharding_spec(), "{devices=[2,2]0,2,1,3}");
}

TEST(Eager, MarkShardingErrors) {
  sf::Tensor t = sf::zeros({2, 4});
  const sf::Mesh mesh(iota(8), {2, 4});
  const auto message = [&](const sf::PartitionSpec& spec) {
    try {
      sf::mark_sharding(t, mesh, spec);
    } catch (const sf::Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({0}), "Partition spec length (1) should be equal to the input rank (2).");
  EXPECT_EQ(message({0, 0}), "Each device mesh dimension should appear at most once in partition_spec (0, 0).");
  EXPECT_EQ(message({0, 2}), "partition_spec ((0, 2)) contains out of bound index into mesh_shape.");
  EXPECT_EQ(message({"x", sf::none}), "argument of type 'NoneType' is not iterable");
}

TEST(Eager, ScalarIsReplicatedOnEveryDevice) {
  sf::Tensor t = sf::Tensor::scalar(3);
  sf::mark_sharding(t, sf::Mesh(iota(4), {4}), {});
  EXPECT_EQ(t.sharding_spec(), "{replicated}");
  const auto shards = t.local_shards();
  ASSERT_EQ(shards.size(), 4u);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(shards[static_cast<std::size_t>(i)].whole);
    EXPECT_EQ(shards[static_cast<std::size_t>(i)].replica_id, i);
  }
}

TEST(Eager, MetaTensorsInferOnly) {
  const sf::Tensor x = sf::Tensor::meta(sf::DType::kBF16, {4096, 11008});
  const sf::Tensor y = sf::silu(x.matmul(sf::Tensor::meta(sf::DType::kBF16, {11008, 4096})));
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.shape(), (sf::Shape{4096, 4096}));
  EXPECT_THROW(y.to_floats(), sf::Error);
}

}  // namespace
