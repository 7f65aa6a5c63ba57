// The README's multi-device example, compiled and checked against the same
// program on one device, so that the README stays true.
#include <gtest/gtest.h>

#include <cmath>

#include "shardflow/runtime/runtime.h"
#include "shardflow/shardflow.h"

namespace sf = shardflow;

namespace {

std::vector<float> mlp_on_one_device() {
  sf::Tensor w1 = sf::randn({512, 2048}, 0), w2 = sf::randn({2048, 512}, 1);
  sf::Tensor x = sf::randn({8, 512}, 2);
  sf::Tensor y = sf::matmul(sf::gelu(sf::matmul(x, w1)), w2);
  return (y * 2 + y).to_floats();
}

}  // namespace

TEST(ReadmeExample, RunningOnSeveralDevices) {
  const std::vector<float> expected = mlp_on_one_device();
  sf::Runtime rt = sf::Runtime::local(8);
  sf::Mesh mesh({0, 1, 2, 3, 4, 5, 6, 7}, {2, 4}, {"data", "model"});
  sf::Tensor w1 = sf::randn({512, 2048}, 0), w2 = sf::randn({2048, 512}, 1);
  sf::mark_sharding(w1, mesh, {sf::none, "model"});
  sf::mark_sharding(w2, mesh, {"model", sf::none});
  auto mlp = sf::compile([&](sf::Tensor x) {
    x = sf::mark_sharding(x, mesh, {"data", sf::none});
    return sf::matmul(sf::gelu(sf::matmul(x, w1)), w2);
  });
  sf::Tensor y = mlp(sf::randn({8, 512}, 2));
  const std::string program = mlp.program_text();
  EXPECT_NE(program.find("all-reduce over 'model'"), std::string::npos) << program;
  ASSERT_TRUE(y.sharding().has_value());
  sf::Tensor z = y * 2 + y;
  ASSERT_TRUE(z.sharding().has_value());
  const std::vector<float> got = z.to_floats();
  ASSERT_EQ(got.size(), expected.size());
  double scale = 0;
  for (float e : expected) scale = std::max(scale, std::abs(static_cast<double>(e)));
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-4 * (1 + scale)) << i;
}
