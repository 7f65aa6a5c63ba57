// Mesh construction, validation (PyTorch/XLA's order and messages, §1.2) and
// queries. Error rows: add one per bad input with the expected message.
#include "shardflow/sharding/mesh.h"

#include <gtest/gtest.h>

#include <numeric>

#include "shardflow/base/error.h"

namespace sf = shardflow;

namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return ids;
}

struct MeshErrorCase {
  const char* name;
  std::vector<int64_t> ids;
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  std::optional<int64_t> global_devices;
  const char* message;  // the whole message
};

const MeshErrorCase kErrors[] = {
    {"E1_axis_names_length", iota(8), {1, 8}, {"data", "model", "extra"}, 8,
     "Number of axis names (3) must match mesh dimensions (2)"},
    {"E3_mesh_size", iota(8), {2, 8}, {}, 8, "Number of device IDs (8) must match mesh size (16)"},
    {"E6_global_count", iota(4), {1, 4}, {}, 8,
     "Number of device IDs (4) must match the global number of devices (8)"},
    {"no_devices", {}, {}, {}, 0, "This requires XLA supported device(s)."},
    {"axis_names_unique", iota(4), {2, 2}, {"x", "x"}, std::nullopt,
     "Axis names must be unique, got: ('x', 'x')"},
    {"ids_unique", {0, 1, 1, 2}, {2, 2}, {}, std::nullopt,
     "Device IDs must be unique, got: [0 1 1 2]"},
    {"ids_below_size", {0, 1, 2, 4}, {2, 2}, {}, std::nullopt,
     "Device IDs must be less than mesh size (4), got: [0 1 2 4]"},
    {"ids_non_negative", {0, 1, -1, 3}, {2, 2}, {}, std::nullopt,
     "Device IDs must be non-negative, got: [ 0  1 -1  3]"},
    {"shape_positive", {}, {2, 0}, {}, std::nullopt,
     "Mesh shape entries must be positive, got: (2, 0)"},
    // Order: the global count is checked before the names and the size.
    {"order_global_before_names", iota(4), {4}, {"a", "b"}, 8,
     "Number of device IDs (4) must match the global number of devices (8)"},
    {"order_names_before_size", iota(4), {2, 4}, {"a"}, std::nullopt,
     "Number of axis names (1) must match mesh dimensions (2)"},
    {"order_unique_before_range", {0, 9, 9, 1}, {2, 2}, {}, std::nullopt,
     "Device IDs must be unique, got: [0 9 9 1]"},
    {"rank_above_numpy_limit", iota(2), [] {
       std::vector<int64_t> shape(65, 1);
       shape[0] = 2;
       return shape;
     }(), {}, std::nullopt,
     "Mesh shape has 65 dims; shardflow supports at most 64 (numpy 2's limit on array dims, which "
     "PyTorch/XLA reaches when it reshapes the device ids)"},
};

class MeshErrors : public testing::TestWithParam<MeshErrorCase> {};

TEST_P(MeshErrors, ReportsPyTorchXlaMessage) {
  const MeshErrorCase& c = GetParam();
  try {
    sf::Mesh mesh(c.ids, c.shape, c.names, c.global_devices);
    FAIL() << "no error for " << mesh.to_string();
  } catch (const sf::Error& error) {
    EXPECT_EQ(std::string(error.what()), c.message);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, MeshErrors, testing::ValuesIn(kErrors),
                         [](const auto& row) { return std::string(row.param.name); });

TEST(Mesh, SixtyFourAxesAndManyNamesAreAccepted) {
  std::vector<int64_t> shape(64, 1);
  shape[3] = 4;
  std::vector<std::string> names;
  for (int a = 0; a < 64; ++a) names.push_back("axis" + std::to_string(a));
  const sf::Mesh mesh(iota(4), shape, names);
  EXPECT_EQ(mesh.size(), 4);
  EXPECT_EQ(mesh.axis_size(3), 4);
  names[63] = "axis7";  // the uniqueness check sorts instead of comparing every pair
  EXPECT_THROW(sf::Mesh(iota(4), shape, names), sf::Error);
}

TEST(Mesh, LogicalMeshIsRowMajor) {
  const sf::Mesh mesh(iota(8), {4, 2});
  EXPECT_EQ(mesh.size(), 8);
  EXPECT_EQ(mesh.device_at({2, 1}), 5);
  EXPECT_EQ(mesh.coords_of(5), (std::vector<int64_t>{2, 1}));
  const sf::Mesh reordered({3, 1, 0, 2}, {2, 2});
  EXPECT_EQ(reordered.device_at({0, 0}), 3);
  EXPECT_EQ(reordered.coords_of(0), (std::vector<int64_t>{1, 0}));
  for (int64_t id = 0; id < 4; ++id) EXPECT_EQ(reordered.device_at(reordered.coords_of(id)), id);
  EXPECT_THROW(mesh.device_at({4, 0}), sf::Error);
  EXPECT_THROW(mesh.coords_of(8), sf::Error);
}

TEST(Mesh, AxesByNameAndIndex) {
  const sf::Mesh named(iota(8), {4, 1, 2}, {"data", "fsdp", "model"});
  EXPECT_EQ(named.axis_index("model"), 2);
  EXPECT_EQ(named.axis_index("tensor"), std::nullopt);
  EXPECT_EQ(named.shape(), (std::vector<std::pair<std::string, int64_t>>{
                               {"data", 4}, {"fsdp", 1}, {"model", 2}}));
  const sf::Mesh unnamed(iota(8), {2, 4});
  EXPECT_FALSE(unnamed.has_axis_names());
  EXPECT_EQ(unnamed.axis_index("data"), std::nullopt);
  EXPECT_EQ(unnamed.shape(), (std::vector<std::pair<std::string, int64_t>>{{"0", 2}, {"1", 4}}));
}

TEST(Mesh, PrintsAndParsesBack) {
  const sf::Mesh named(iota(8), {2, 4}, {"x", "y"});
  EXPECT_EQ(named.to_string(),
            "{'device_ids': [0, 1, 2, 3, 4, 5, 6, 7], 'mesh_shape': (2, 4), 'axis_names': ('x', 'y')}");
  EXPECT_EQ(sf::Mesh::from_string(named.to_string()), named);
  const sf::Mesh one_axis({1, 0}, {2});
  EXPECT_EQ(one_axis.to_string(), "{'device_ids': [1, 0], 'mesh_shape': (2,), 'axis_names': None}");
  EXPECT_EQ(sf::Mesh::from_string(one_axis.to_string()), one_axis);
  // An axis name containing "Mesh" survives (PyTorch/XLA's from_str corrupts it).
  const sf::Mesh odd_name(iota(2), {2}, {"Mesh'axis"});
  EXPECT_EQ(sf::Mesh::from_string(odd_name.to_string()), odd_name);
  // Parsing re-runs every validation.
  EXPECT_THROW(sf::Mesh::from_string("{'device_ids': [0, 0], 'mesh_shape': (2,), 'axis_names': None}"),
               sf::Error);
  EXPECT_THROW(sf::Mesh::from_string("{'mesh_shape': (2,)}"), sf::Error);
  EXPECT_THROW(sf::Mesh::from_string("[0, 1]"), sf::Error);
}

TEST(Mesh, UsesTheRuntimeDeviceCount) {
  sf::set_global_device_count(8);
  EXPECT_THROW(sf::Mesh(iota(4), {4}), sf::Error);
  EXPECT_NO_THROW(sf::Mesh(iota(8), {8}));
  sf::set_global_device_count(std::nullopt);
  EXPECT_NO_THROW(sf::Mesh(iota(4), {4}));
}

}  // namespace
