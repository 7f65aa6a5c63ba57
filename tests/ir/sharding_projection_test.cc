// The projection of a dim's mesh axes onto an op's factors and back
// (sharding_projection.h), on a dim made of two factors, as a reshape's
// merged dim is. To add a case: one EXPECT per dim, with the reason above it.
#include "shardflow/ir/sharding_projection.h"

#include <gtest/gtest.h>

#include <numeric>

namespace sf = shardflow;

namespace {

using Axes = std::vector<int>;

// Axes a=0 (2 devices), b=1 (4), c=2 (3).
constexpr int kA = 0, kB = 1, kC = 2;

sf::Mesh abc_mesh() {
  std::vector<int64_t> ids(24);
  std::iota(ids.begin(), ids.end(), 0);
  return sf::Mesh(ids, {2, 4, 3}, {"a", "b", "c"}, 24);
}

// Factors i=0 {8}, j=1 {6}, k=2 {1}; one operand whose only dim is `factors`.
sf::OpShardingRule rule_for(std::vector<int> factors) {
  return sf::OpShardingRule{
      .factors = {{.size = 8}, {.size = 6}, {.size = 1}},
      .operands = {{std::move(factors)}},
      .results = {},
  };
}
constexpr int kI = 0, kJ = 1, kK = 2;

// "i:[0, 1] j:[2]": the factors reached, in order, with their axes.
std::string text(const std::vector<sf::FactorAxes>& projected) {
  std::string out;
  for (const sf::FactorAxes& f : projected) {
    out += out.empty() ? "" : " ";
    out += std::string(1, static_cast<char>('i' + f.factor)) + ":[";
    for (std::size_t n = 0; n < f.axes.size(); ++n) out += (n > 0 ? ", " : "") + std::to_string(f.axes[n]);
    out += "]";
  }
  return out;
}

TEST(ShardingProjection, DimAxesGoToFactorsMajorFirst) {
  const sf::Mesh mesh = abc_mesh();
  const sf::OpShardingRule ij = rule_for({kI, kJ});
  // a * b = 8 splits i whole, so j takes what is left.
  EXPECT_EQ(text(sf::project_to_factors(mesh, ij, {kI, kJ}, {kA, kB, kC})), "i:[0, 1] j:[2]");
  // c (3) does not divide 8 / 2: i keeps [a], is not whole, and j is not
  // reached; c is dropped.
  EXPECT_EQ(text(sf::project_to_factors(mesh, ij, {kI, kJ}, {kA, kC})), "i:[0]");
  // The first axis already does not divide i: i takes nothing, j nothing.
  EXPECT_EQ(text(sf::project_to_factors(mesh, ij, {kI, kJ}, {kC})), "i:[]");
  // A whole dim reaches its first factor only (whole too).
  EXPECT_EQ(text(sf::project_to_factors(mesh, ij, {kI, kJ}, {})), "i:[]");
}

TEST(ShardingProjection, LastFactorMayBeUneven) {
  const sf::Mesh mesh = abc_mesh();
  const sf::OpShardingRule j = rule_for({kJ});
  // b (4) does not divide j (6); as the dim's last factor j still takes it
  // (the partitioner pads the shards).
  EXPECT_EQ(text(sf::project_to_factors(mesh, j, {kJ}, {kB})), "j:[1]");
  const sf::OpShardingRule ij = rule_for({kI, kJ});
  EXPECT_EQ(text(sf::project_to_factors(mesh, ij, {kI, kJ}, {kA, kB, kB})), "i:[0, 1] j:[1]");
}

TEST(ShardingProjection, SizeOneFactorIsWholeWithoutAxes) {
  const sf::Mesh mesh = abc_mesh();
  const sf::OpShardingRule ki = rule_for({kK, kI});
  // k (size 1) can take no axis but is whole, so i takes a.
  EXPECT_EQ(text(sf::project_to_factors(mesh, ki, {kK, kI}, {kA})), "k:[] i:[0]");
}

TEST(ShardingProjection, FactorAxesGoBackToTheDim) {
  const sf::Mesh mesh = abc_mesh();
  const sf::OpShardingRule ij = rule_for({kI, kJ});
  const auto back = [&](Axes i, Axes j) {
    return sf::project_to_dim(mesh, ij, {kI, kJ}, {std::move(i), std::move(j), {}});
  };
  // i whole on [a, b], then j's [c]; the axes came first from i.
  const sf::DimProjection whole = back({kA, kB}, {kC});
  EXPECT_EQ(whole.axes, (Axes{kA, kB, kC}));
  EXPECT_EQ(whole.first_factor, kI);
  // i split on a only (not whole): j's axes cannot follow in the dim.
  EXPECT_EQ(back({kA}, {kC}).axes, (Axes{kA}));
  // i's axes do not divide it: neither i's nor j's axes reach the dim.
  const sf::DimProjection uneven = back({kC}, {kA});
  EXPECT_EQ(uneven.axes, Axes{});
  EXPECT_EQ(uneven.first_factor, -1);
  // i without axes is not split whole (1 != 8): j's axes cannot follow.
  EXPECT_EQ(back({}, {kC}).axes, Axes{});
  // The last factor may be uneven: j on b (4 does not divide 6).
  EXPECT_EQ(back({kA, kB}, {kB}).axes, (Axes{kA, kB, kB}));
}

TEST(ShardingProjection, FirstFactorSkipsFactorsWithoutAxes) {
  const sf::Mesh mesh = abc_mesh();
  const sf::OpShardingRule ki = rule_for({kK, kI});
  // k (size 1) gives no axes but is whole; the dim's axes come from i.
  const sf::DimProjection with_i = sf::project_to_dim(mesh, ki, {kK, kI}, {{kA}, {}, {}});
  EXPECT_EQ(with_i.axes, (Axes{kA}));
  EXPECT_EQ(with_i.first_factor, kI);
  // No factor gives axes: no first factor.
  EXPECT_EQ(sf::project_to_dim(mesh, ki, {kK, kI}, {{}, {}, {}}).first_factor, -1);
}

TEST(ShardingProjection, EveryDimOfATensorAndRoundTrip) {
  const sf::Mesh mesh = abc_mesh();
  // A tensor [ij, k]: dim 0 merges i and j, dim 1 is k.
  sf::OpShardingRule rule = rule_for({kI, kJ});
  rule.operands[0].push_back({kK});
  std::vector<Axes> factor_axes(rule.factors.size());
  for (const sf::FactorAxes& f : sf::project_to_factors(mesh, rule, {kI, kJ}, {kA, kB, kC})) {
    factor_axes[static_cast<std::size_t>(f.factor)] = f.axes;
  }
  // A dim its factors can represent comes back as it was; k has no axes.
  EXPECT_EQ(sf::project_to_dims(mesh, rule, rule.operands[0], factor_axes),
            (std::vector<Axes>{{kA, kB, kC}, {}}));
}

}  // namespace
