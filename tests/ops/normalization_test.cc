// rms_norm against x / sqrt(mean(x^2) + eps) * weight computed in double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "op_test_util.h"
#include "shardflow/base/error.h"

namespace sf = shardflow;
using namespace shardflow::testing_util;

namespace {

std::vector<double> reference(const sf::DenseTensor& x, int64_t width, const sf::DenseTensor* weight, double eps) {
  const std::vector<double> xv = to_doubles(x);
  const std::vector<double> wv = weight ? to_doubles(*weight) : std::vector<double>(static_cast<std::size_t>(width), 1.0);
  std::vector<double> out(xv.size());
  const std::size_t rows = width == 0 ? 0 : xv.size() / static_cast<std::size_t>(width);
  for (std::size_t r = 0; r < rows; ++r) {
    double squares = 0;
    for (int64_t i = 0; i < width; ++i) {
      const double v = xv[r * static_cast<std::size_t>(width) + static_cast<std::size_t>(i)];
      squares += v * v;
    }
    const double scale = 1.0 / std::sqrt(squares / static_cast<double>(width) + eps);
    for (int64_t i = 0; i < width; ++i) {
      const std::size_t at = r * static_cast<std::size_t>(width) + static_cast<std::size_t>(i);
      out[at] = xv[at] * scale * wv[static_cast<std::size_t>(i)];
    }
  }
  return out;
}

TEST(NormalizationOps, RmsNormMatchesTheFormula) {
  std::mt19937 rng(1);
  struct Case {
    sf::Shape input, normalized;
    bool weight;
    std::optional<double> eps;
  };
  for (const Case& c : {Case{{2, 3, 8}, {8}, true, 1e-5}, Case{{4, 6}, {6}, false, std::nullopt},
                        Case{{2, 3, 4}, {3, 4}, true, std::nullopt}, Case{{5}, {5}, true, 0.5},
                        Case{{3, 0}, {0}, false, 1e-6}}) {
    const sf::DenseTensor x = random_tensor(sf::DType::kF32, c.input, rng);
    std::optional<sf::DenseTensor> w;
    if (c.weight) w = random_tensor(sf::DType::kF32, c.normalized, rng);
    const sf::DenseTensor out =
        call("aten::rms_norm", {x, c.normalized, w ? TestArg(*w) : TestArg(sf::Constant()),
                                c.eps ? TestArg(*c.eps) : TestArg(sf::Constant())});
    EXPECT_EQ(out.shape(), c.input);
    const double eps = c.eps.value_or(std::numeric_limits<float>::epsilon());
    EXPECT_TRUE(all_close(to_doubles(out), reference(x, sf::numel(c.normalized), w ? &*w : nullptr, eps), 1e-5, 1e-6))
        << sf::shape_to_string(c.input) << " over " << sf::shape_to_string(c.normalized);
  }
}

TEST(NormalizationOps, RmsNormBadArgumentsAreClearErrors) {
  std::mt19937 rng(2);
  const sf::DenseTensor x = random_tensor(sf::DType::kF32, {2, 4}, rng);
  const auto fails = [&](std::vector<TestArg> args, const std::string& expected) {
    try {
      call("aten::rms_norm", args);
      ADD_FAILURE() << "no error; expected: " << expected;
    } catch (const sf::Error& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  };
  fails({x, std::vector<int64_t>{2}, sf::Constant(), sf::Constant()}, "must be the last dims of the input");
  fails({x, std::vector<int64_t>{3, 2, 4}, sf::Constant(), sf::Constant()}, "must be the last dims of the input");
  fails({x, std::vector<int64_t>{4}, random_tensor(sf::DType::kF32, {2}, rng), sf::Constant()},
        "weight must be f32[4]");
  fails({random_tensor(sf::DType::kI64, {2, 4}, rng), std::vector<int64_t>{4}, sf::Constant(), sf::Constant()},
        "only float32 input is implemented");
}

}  // namespace
