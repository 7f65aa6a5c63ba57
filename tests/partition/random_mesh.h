// A random mesh for the partitioner's property tests.
#pragma once

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "shardflow/sharding/mesh.h"

namespace shardflow::testing_util {

// 1-3 axes named 'a', 'b', ..., 1-8 devices, a random device order.
inline std::unique_ptr<Mesh> random_mesh(std::mt19937& rng) {
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int axes = pick(1, 3);
  std::vector<int64_t> shape;
  int64_t size = 1;
  for (int a = 0; a < axes; ++a) {
    int64_t extent = pick(1, 4);
    while (size * extent > 8) --extent;
    shape.push_back(extent);
    size *= extent;
  }
  std::vector<int64_t> ids(static_cast<std::size_t>(size));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::string> names;
  for (int a = 0; a < axes; ++a) names.push_back(std::string(1, static_cast<char>('a' + a)));
  return std::make_unique<Mesh>(ids, shape, names, size);
}

}  // namespace shardflow::testing_util
