// Partition specs: C++ and literal forms, translation and validation errors
// with PyTorch/XLA's messages (§2.1, §7.3). To add an error case, add a row.
#include "shardflow/sharding/partition_spec.h"

#include <gtest/gtest.h>

#include <numeric>

#include "shardflow/base/error.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/sharding/sharding.h"

namespace sf = shardflow;

namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return ids;
}

TEST(PartitionSpec, CppFormsPrintLikePython) {
  EXPECT_EQ(sf::PartitionSpec({sf::none, "model"}).to_string(), "(None, 'model')");
  EXPECT_EQ(sf::PartitionSpec({{"data", "fsdp"}, sf::none}).to_string(), "(('data', 'fsdp'), None)");
  EXPECT_EQ(sf::PartitionSpec({0, 1, 2}).to_string(), "(0, 1, 2)");
  EXPECT_EQ(sf::PartitionSpec({"data"}).to_string(), "('data',)");
  EXPECT_EQ(sf::PartitionSpec({{"data"}}).to_string(), "(('data',),)");
  EXPECT_EQ(sf::PartitionSpec().to_string(), "()");
}

TEST(PartitionSpec, LiteralFormsEqualCppForms) {
  EXPECT_EQ(sf::PartitionSpec::parse("('data', None, 'model')"),
            sf::PartitionSpec({"data", sf::none, "model"}));
  EXPECT_EQ(sf::PartitionSpec::parse("(('r', 'b'), None)"),
            sf::PartitionSpec({{"r", "b"}, sf::none}));
  EXPECT_EQ(sf::PartitionSpec::parse("(0, 1, 2)"), sf::PartitionSpec({0, 1, 2}));
  EXPECT_EQ(sf::PartitionSpec::parse("('data',)"), sf::PartitionSpec({"data"}));
  EXPECT_EQ(sf::PartitionSpec::parse("()"), sf::PartitionSpec());
  EXPECT_EQ(sf::PartitionSpec::parse("(\"data\", None)"), sf::PartitionSpec({"data", sf::none}));
  // A list is accepted like a tuple (Python's "unhashable type" is an accident).
  EXPECT_EQ(sf::PartitionSpec::parse("[0, None]"), sf::PartitionSpec({0, sf::none}));
  EXPECT_EQ(sf::PartitionSpec::parse("([0, 1], None)"), sf::PartitionSpec({{0, 1}, sf::none}));
  for (const char* text : {"('data', None, 'model')", "(('r', 'b'), None)", "(0, 1, 2)",
                           "('data',)", "()", "((0,), None)"}) {
    EXPECT_EQ(sf::PartitionSpec::parse(text).to_string(), text);
  }
}

TEST(PartitionSpec, NonTupleLiteralIsAnError) {
  try {
    sf::PartitionSpec::parse("('data')");
    FAIL();
  } catch (const sf::Error& error) {
    EXPECT_NE(std::string(error.what()).find("a 1-tuple needs a trailing comma: ('data',)"),
              std::string::npos) << error.what();
  }
  EXPECT_THROW(sf::PartitionSpec::parse("(0, None"), sf::Error);
  EXPECT_THROW(sf::PartitionSpec::parse("None"), sf::Error);
}

struct SpecErrorCase {
  const char* name;
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> axis_names;
  const char* spec;
  std::optional<int64_t> rank;  // checked first when given, as mark_sharding does
  const char* message;          // the whole message
};

const SpecErrorCase kErrors[] = {
    {"E7_rank", {2, 4}, {}, "(0,)", 2, "Partition spec length (1) should be equal to the input rank (2)."},
    {"E8_out_of_bound", {2, 4}, {}, "(0, 2)", std::nullopt,
     "partition_spec ((0, 2)) contains out of bound index into mesh_shape."},
    {"E8_negative", {2, 4}, {}, "(-1, None)", std::nullopt,
     "partition_spec ((-1, None)) contains out of bound index into mesh_shape."},
    {"E9_twice", {2, 4}, {}, "(0, 0)", std::nullopt,
     "Each device mesh dimension should appear at most once in partition_spec (0, 0)."},
    {"E9_twice_in_tuple", {2, 4}, {}, "((0, 1), 1)", std::nullopt,
     "Each device mesh dimension should appear at most once in partition_spec ((0, 1), 1)."},
    {"E9_names_translated", {2, 4}, {"x", "y"}, "('y', ('x', 'y'))", std::nullopt,
     "Each device mesh dimension should appear at most once in partition_spec (1, (0, 1))."},
    {"E10_unknown_name", {2, 4}, {"x", "y"}, "('z', None)", std::nullopt,
     "Axis name z is not defined in the given mesh"},
    {"E11_name_on_unnamed_mesh", {2, 4}, {}, "('x', None)", std::nullopt,
     "argument of type 'NoneType' is not iterable"},
    {"nested_tuple", {2, 4}, {}, "(((0,),), None)", std::nullopt,
     "Partition spec cannot contain nested tuples"},
    {"float_entry", {2, 4}, {}, "(0.5, None)", std::nullopt,
     "Spec type <class 'float'> is not supported in partition spec"},
    {"bool_entry", {2, 4}, {}, "(True, None)", std::nullopt,
     "Spec type <class 'bool'> is not supported in partition spec"},
    {"float_in_tuple", {2, 4}, {}, "((0, 1.0), None)", std::nullopt,
     "Spec type <class 'float'> is not supported in partition spec"},
    // Python translates entries in order: the bad name comes before the float.
    {"order_name_before_type", {2, 4}, {"x", "y"}, "('z', 1.5)", std::nullopt,
     "Axis name z is not defined in the given mesh"},
    {"order_name_in_tuple_first", {2, 4}, {"x", "y"}, "(('z', 1.5),)", std::nullopt,
     "Axis name z is not defined in the given mesh"},
    // Bounds are checked on all entries before duplicates.
    {"order_bounds_before_duplicates", {2, 4}, {}, "(0, 0, 5)", std::nullopt,
     "partition_spec ((0, 0, 5)) contains out of bound index into mesh_shape."},
};

class SpecErrors : public testing::TestWithParam<SpecErrorCase> {};

TEST_P(SpecErrors, ReportsPyTorchXlaMessage) {
  const SpecErrorCase& c = GetParam();
  int64_t size = 1;
  for (int64_t extent : c.mesh_shape) size *= extent;
  auto mesh = std::make_shared<const sf::Mesh>(iota(size), c.mesh_shape, c.axis_names);
  try {
    const sf::PartitionSpec spec = sf::PartitionSpec::parse(c.spec);
    if (c.rank) sf::check_partition_spec_rank(spec, *c.rank);
    const sf::Sharding sharding = sf::Sharding::from_spec(mesh, spec);
    FAIL() << "no error; got " << sharding.to_readable();
  } catch (const sf::Error& error) {
    EXPECT_EQ(std::string(error.what()), c.message);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, SpecErrors, testing::ValuesIn(kErrors),
                         [](const auto& row) { return std::string(row.param.name); });

TEST(PartitionSpec, TranslationMapsNamesToIndices) {
  const sf::Mesh mesh(iota(8), {2, 2, 2}, {"data", "fsdp", "model"});
  const sf::PartitionSpec translated =
      sf::translate_partition_spec({{"model", "data"}, sf::none, "fsdp"}, mesh);
  EXPECT_EQ(translated.to_string(), "((2, 0), None, 1)");
  EXPECT_NO_THROW(sf::validate_partition_spec(translated, mesh));
}

}  // namespace
