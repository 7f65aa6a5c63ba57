// The README's C++ examples, compiled and checked, so that the README stays
// true.
#include <gtest/gtest.h>

#include "shardflow/shardflow.h"

namespace sf = shardflow;

TEST(ReadmeExample, TensorsOpsAndCompile) {
  sf::Tensor w = sf::randn({512, 2048}, /*seed=*/0);
  sf::Mesh mesh({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}, {"data", "model"});
  sf::mark_sharding(w, mesh, {sf::none, "model"});
  EXPECT_EQ(w.sharding_spec(), "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}");
  EXPECT_EQ(w.local_shards().size(), 8u);

  auto step = sf::compile([&](sf::Tensor x) {
    sf::Tensor h = sf::matmul(x, w);
    h = sf::mark_sharding(h, mesh, {"data", sf::none});
    return sf::gelu(h);
  });
  sf::Tensor y = step(sf::randn({8, 512}, 1));
  y = step(sf::randn({8, 512}, 2));
  EXPECT_EQ(step.stats().traces, 1);
  EXPECT_EQ(step.stats().cache_hits, 1);
  EXPECT_NE(step.graph_text().find("xla::dynamo_mark_sharding"), std::string::npos);
  const sf::Tensor z = sf::ops::call("aten::add", {y, y, sf::kwarg("alpha", 2)});
  EXPECT_NEAR(z.to_floats()[0], 3 * y.to_floats()[0], 1e-5);
}

TEST(ReadmeExample, ShardingCore) {
  auto mesh = std::make_shared<const sf::Mesh>(
      std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, std::vector<int64_t>{4, 1, 2},
      std::vector<std::string>{"data", "fsdp", "model"});
  sf::Sharding s = sf::Sharding::from_spec(mesh, {"data", sf::none, "model"});
  EXPECT_EQ(s.to_readable(), "[{data},{},{model}]");
  EXPECT_EQ(s.to_hlo_v1().to_string(), "{devices=[4,1,2]0,1,2,3,4,5,6,7}");
  EXPECT_EQ(s.to_hlo_v2().to_string(), "{devices=[4,1,2]<=[8]}");
  sf::HloSharding h = sf::HloSharding::parse("{devices=[2,2]1,0,3,2 last_tile_dim_replicate}");
  EXPECT_EQ(h.to_string(), "{devices=[2,2]0,1,2,3 last_tile_dim_replicate}");
  std::vector<int64_t> shape{17, 64};
  sf::ShardLayout layout = sf::shard_layout(sf::Sharding::from_spec(mesh, {"data", sf::none}), shape);
  EXPECT_EQ(layout.shard_shape, (std::vector<int64_t>{5, 64}));
  EXPECT_EQ(layout.shards[6].slices[0], (sf::DimSlice{15, 17}));
  std::vector<float> host(17 * 64, 1.0f);
  auto shards = sf::split_into_shards(layout, std::as_bytes(std::span(host)), sizeof(float));
  auto back = sf::assemble_from_shards(layout, shards, sizeof(float));
  EXPECT_EQ(back.size(), host.size() * sizeof(float));
}
