// Uses the sharding core, a compiled function and the runtime through the
// installed headers and libraries; prints what the test compares.
#include <iostream>

#include "shardflow/runtime/runtime.h"
#include "shardflow/shardflow.h"

namespace sf = shardflow;

int main() {
  auto mesh = std::make_shared<const sf::Mesh>(std::vector<int64_t>{0, 1, 2, 3}, std::vector<int64_t>{2, 2},
                                               std::vector<std::string>{"data", "model"});
  std::cout << sf::Sharding::from_spec(mesh, {sf::none, "model"}).to_hlo_v1().to_string() << "\n";
  sf::Runtime runtime = sf::Runtime::local(4);
  sf::Tensor w = sf::randn({8, 4}, 0);
  sf::mark_sharding(w, *mesh, {sf::none, "model"});
  auto step = sf::compile([&](sf::Tensor x) { return sf::matmul(x, w); });
  const sf::Tensor y = step(sf::randn({2, 8}, 1));
  const sf::Tensor expected = sf::matmul(sf::randn({2, 8}, 1), sf::randn({8, 4}, 0));
  const std::vector<float> got = y.to_floats(), want = expected.to_floats();
  double diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i) diff = std::max(diff, double(std::abs(got[i] - want[i])));
  std::cout << (diff < 1e-5 ? "sharded matmul matches" : "sharded matmul DIFFERS") << "\n";
  return diff < 1e-5 ? 0 : 1;
}
