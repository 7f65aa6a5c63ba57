// OpProfile: where a compiled function's calls spend their time, per op
// kind, on one device (the interpreter).
#include <gtest/gtest.h>

#include "shardflow/shardflow.h"

namespace sf = shardflow;

namespace {

int64_t calls_of(const std::vector<sf::OpProfile::Entry>& entries, const std::string& op) {
  for (const sf::OpProfile::Entry& e : entries) {
    if (e.op == op) return e.calls;
  }
  return 0;
}

TEST(OpProfile, CountsEveryOpOfEveryCallAndStaysWithinTheCallTime) {
  const sf::Tensor w = sf::randn({64, 64}, 1);
  auto step = sf::compile([&](sf::Tensor x) { return sf::silu(sf::matmul(x, w) + x) + x; });
  auto profile = std::make_shared<sf::OpProfile>();
  step.set_profile(profile);  // before the first call
  const sf::Tensor x = sf::randn({8, 64}, 2);
  for (int i = 0; i < 3; ++i) step(x);
  EXPECT_EQ(profile->function_calls(), 3);
  EXPECT_EQ(profile->devices(), std::vector<int64_t>{0});
  const auto entries = profile->entries(0);
  EXPECT_EQ(calls_of(entries, "aten::matmul"), 3);
  EXPECT_EQ(calls_of(entries, "aten::add.Tensor"), 6);  // two adds per call
  EXPECT_EQ(calls_of(entries, "aten::silu"), 3);
  EXPECT_EQ(entries.size(), 3u);
  double in_ops = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    EXPECT_GE(entries[i].seconds, 0);
    if (i > 0) {
      EXPECT_GE(entries[i - 1].seconds, entries[i].seconds) << "the most time first";
    }
    in_ops += entries[i].seconds;
  }
  EXPECT_GT(in_ops, 0);
  EXPECT_LE(in_ops, profile->function_seconds());  // ops run inside the calls

  step.set_profile(nullptr);  // stops recording
  step(x);
  EXPECT_EQ(profile->function_calls(), 3);
  EXPECT_EQ(calls_of(profile->entries(0), "aten::matmul"), 3);
  profile->clear();
  EXPECT_EQ(profile->function_calls(), 0);
  EXPECT_TRUE(profile->devices().empty());
  EXPECT_TRUE(profile->entries(0).empty());
}

// A call that fails (here while tracing, on shapes matmul refuses) is not
// counted.
TEST(OpProfile, AFailedCallAddsNothing) {
  auto step = sf::compile([](sf::Tensor a, sf::Tensor b) { return sf::matmul(a, b); });
  auto profile = std::make_shared<sf::OpProfile>();
  step.set_profile(profile);
  EXPECT_THROW(step(sf::randn({2, 3}, 1), sf::randn({4, 5}, 2)), sf::Error);
  EXPECT_EQ(profile->function_calls(), 0);
  step(sf::randn({2, 3}, 1), sf::randn({3, 5}, 2));
  EXPECT_EQ(profile->function_calls(), 1);
  EXPECT_EQ(calls_of(profile->entries(0), "aten::matmul"), 1);
}

}  // namespace
