// scaled_dot_product_attention against softmax(q k^T * scale + mask) v
// computed in double with plain loops; hidden keys are never read.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "op_test_util.h"
#include "shardflow/base/error.h"

namespace sf = shardflow;
using namespace shardflow::testing_util;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  sf::Shape batch;
  int64_t queries, keys, depth, value_depth;
  sf::Shape mask_shape;  // empty: no mask
  bool bool_mask = true, causal = false;
  std::optional<double> scale;
};

// mask(b, l, s) for a mask broadcast to [batch..., L, S]: whether key s is
// seen, and the float added to its score.
struct MaskView {
  const sf::DenseTensor* mask = nullptr;
  sf::Shape full;
  std::pair<bool, double> at(int64_t b, int64_t l, int64_t s) const {
    if (mask == nullptr) return {true, 0.0};
    std::vector<int64_t> index;
    const auto batch_rank = full.size() - 2;
    for (std::size_t d = batch_rank; d-- > 0;) {
      index.insert(index.begin(), b % full[d]);
      b /= full[d];
    }
    index.push_back(l);
    index.push_back(s);
    int64_t flat = 0;
    const sf::Shape& own = mask->shape();
    for (std::size_t d = 0; d < own.size(); ++d) {
      flat = flat * own[d] + (own[d] == 1 ? 0 : index[full.size() - own.size() + d]);
    }
    const double value = element(*mask, flat);
    if (mask->dtype() == sf::DType::kBool) return {value != 0, 0.0};
    return {value != -kInf, value};
  }
};

std::vector<double> reference(const Case& c, const sf::DenseTensor& q, const sf::DenseTensor& k,
                              const sf::DenseTensor& v, const sf::DenseTensor* mask) {
  const auto qv = to_doubles(q), kv = to_doubles(k), vv = to_doubles(v);
  sf::Shape full = c.batch;
  full.push_back(c.queries);
  full.push_back(c.keys);
  const MaskView view{mask, full};
  const double scale = c.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.depth)));
  const int64_t batches = sf::numel(c.batch);
  std::vector<double> out;
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t l = 0; l < c.queries; ++l) {
      std::vector<double> scores(static_cast<std::size_t>(c.keys), -kInf);
      double top = -kInf;
      for (int64_t s = 0; s < c.keys; ++s) {
        const auto [seen, bias] = view.at(b, l, s);
        if (!seen || (c.causal && s > l)) continue;
        double dot = 0;
        for (int64_t e = 0; e < c.depth; ++e) {
          dot += qv[static_cast<std::size_t>((b * c.queries + l) * c.depth + e)] *
                 kv[static_cast<std::size_t>((b * c.keys + s) * c.depth + e)];
        }
        scores[static_cast<std::size_t>(s)] = dot * scale + bias;
        top = std::max(top, scores[static_cast<std::size_t>(s)]);
      }
      double total = 0;
      for (double& score : scores) total += score == -kInf ? 0.0 : std::exp(score - top);
      for (int64_t e = 0; e < c.value_depth; ++e) {
        double sum = 0;
        for (int64_t s = 0; s < c.keys; ++s) {
          const double score = scores[static_cast<std::size_t>(s)];
          if (score == -kInf) continue;
          sum += std::exp(score - top) / total * vv[static_cast<std::size_t>((b * c.keys + s) * c.value_depth + e)];
        }
        out.push_back(top == -kInf ? std::nan("") : sum);
      }
    }
  }
  return out;
}

std::vector<TestArg> arguments(const Case& c, const sf::DenseTensor& q, const sf::DenseTensor& k,
                               const sf::DenseTensor& v, const sf::DenseTensor* mask) {
  std::vector<TestArg> args{q, k, v, mask ? TestArg(*mask) : TestArg(sf::Constant()), 0.0, c.causal};
  args.push_back(kw("scale", c.scale ? TestArg(*c.scale) : TestArg(sf::Constant())));
  return args;
}

sf::Shape with(sf::Shape batch, int64_t a, int64_t b) {
  batch.push_back(a);
  batch.push_back(b);
  return batch;
}

TEST(AttentionOps, MatchesSoftmaxOfScoresTimesValues) {
  const std::vector<Case> cases = {
      {{2, 3}, 4, 7, 8, 5, {}, true, false, std::nullopt},
      {{2}, 5, 9, 16, 16, {5, 9}, true, false, std::nullopt},         // bool mask over [L, S]
      {{2, 2}, 3, 6, 12, 4, {2, 1, 3, 6}, false, false, 0.5},        // float mask, broadcast over heads
      {{1}, 6, 6, 20, 3, {}, true, true, std::nullopt},              // causal
      {{2}, 6, 4, 8, 3, {}, true, true, std::nullopt},               // causal, more queries than keys
      {{2}, 3, 7, 8, 3, {}, true, true, std::nullopt},               // causal, fewer (top-left aligned)
      {{3}, 1, 40, 64, 64, {1, 40}, true, false, std::nullopt},      // a decode step
      {{}, 2, 3, 1, 1, {2, 3}, true, false, 2.0},                    // no batch dims
      {{2}, 3, 37, 72, 100, {3, 37}, false, false, std::nullopt},    // wide rows: vector blocks and tails
      {{2}, 2, 40, 20, 12, {2, 40}, true, false, std::nullopt},      // key blocks of a depth with a tail
      {{1, 6}, 1, 300, 48, 48, {1, 300}, true, false, std::nullopt},  // stories15M's heads, many key blocks
  };
  std::mt19937 rng(3);
  for (const Case& c : cases) {
    const auto q = random_tensor(sf::DType::kF32, with(c.batch, c.queries, c.depth), rng);
    const auto k = random_tensor(sf::DType::kF32, with(c.batch, c.keys, c.depth), rng);
    const auto v = random_tensor(sf::DType::kF32, with(c.batch, c.keys, c.value_depth), rng);
    std::optional<sf::DenseTensor> mask;
    if (!c.mask_shape.empty()) {
      mask = random_tensor(c.bool_mask ? sf::DType::kBool : sf::DType::kF32, c.mask_shape, rng);
      if (!c.bool_mask) {  // some keys hidden by -inf, the rest shifted
        float* m = mask->data_as<float>();
        for (int64_t i = 0; i < mask->numel(); i += 3) m[i] = -std::numeric_limits<float>::infinity();
      }
    }
    const sf::DenseTensor out = call("aten::scaled_dot_product_attention", arguments(c, q, k, v, mask ? &*mask : nullptr));
    EXPECT_EQ(out.shape(), with(c.batch, c.queries, c.value_depth));
    EXPECT_TRUE(all_close(to_doubles(out), reference(c, q, k, v, mask ? &*mask : nullptr), 1e-4, 1e-5))
        << "batch " << sf::shape_to_string(c.batch) << " L " << c.queries << " S " << c.keys;
  }
}

sf::DenseTensor converted(const sf::DenseTensor& t, sf::DType dtype) {
  return call("aten::to.dtype", {t, dtype});
}

// bf16 and f16 attend in f32 and round once: the bits of the f32 op on the
// same (widened) values, rounded; and close to the double reference.
TEST(AttentionOps, SixteenBitInputsAttendInFloat32AndRoundOnce) {
  const std::vector<Case> cases = {
      {{2, 3}, 4, 7, 8, 5, {}, true, false, std::nullopt},
      {{2, 2}, 3, 6, 12, 4, {2, 1, 3, 6}, false, false, 0.5},     // a mask of the query's dtype
      {{1}, 6, 6, 20, 3, {}, true, true, std::nullopt},           // causal
      {{3}, 1, 40, 64, 64, {1, 40}, true, false, std::nullopt},   // a decode step
  };
  std::mt19937 rng(5);
  for (const sf::DType dtype : {sf::DType::kBF16, sf::DType::kF16}) {
    for (const Case& c : cases) {
      const auto q = random_tensor(dtype, with(c.batch, c.queries, c.depth), rng);
      const auto k = random_tensor(dtype, with(c.batch, c.keys, c.depth), rng);
      const auto v = random_tensor(dtype, with(c.batch, c.keys, c.value_depth), rng);
      std::optional<sf::DenseTensor> mask;
      if (!c.mask_shape.empty()) mask = random_tensor(c.bool_mask ? sf::DType::kBool : dtype, c.mask_shape, rng);
      const sf::DenseTensor* m = mask ? &*mask : nullptr;
      const sf::DenseTensor out = call("aten::scaled_dot_product_attention", arguments(c, q, k, v, m));
      ASSERT_EQ(out.dtype(), dtype);
      EXPECT_TRUE(all_close(to_doubles(out), reference(c, q, k, v, m), 1e-2, 1e-2));
      std::optional<sf::DenseTensor> wide_mask;
      if (m != nullptr) wide_mask = c.bool_mask ? *m : converted(*m, sf::DType::kF32);
      const auto wide = [](const sf::DenseTensor& t) { return converted(t, sf::DType::kF32); };
      const sf::DenseTensor in_f32 = call("aten::scaled_dot_product_attention",
                                          arguments(c, wide(q), wide(k), wide(v), wide_mask ? &*wide_mask : nullptr));
      EXPECT_EQ(to_doubles(out), to_doubles(converted(in_f32, dtype))) << sf::scalar_type_name(dtype);
    }
  }
}

// Runs of hidden keys, as a decode step's mask has over the unwritten cache,
// and of shown ones, at offsets across the kernel's eight-key steps; bool masks and
// float ones (-inf hides, other values shift the scores).
TEST(AttentionOps, LongRunsOfHiddenKeysMatchTheReference) {
  for (const bool bool_mask : {true, false}) {
    std::mt19937 rng(11);
    const Case c{{2}, 3, 70, 8, 5, {3, 70}, bool_mask, false, std::nullopt};
    std::vector<int64_t> visible(3 * 70, 0);
    for (int64_t s = 0; s < 13; ++s) visible[static_cast<std::size_t>(s)] = 1;  // a prefix, then nothing
    for (int64_t s : {21, 29, 30, 31, 69}) visible[static_cast<std::size_t>(70 + s)] = 1;
    for (int64_t s = 35; s < 61; ++s) visible[static_cast<std::size_t>(70 + s)] = 1;  // shown from an odd key on
    visible[2 * 70 + 8] = 1;  // one key right after a run of eight
    sf::DenseTensor mask = from_ints(visible, {3, 70}, sf::DType::kBool);
    if (!bool_mask) {
      std::vector<float> biases;
      for (int64_t shown : visible) {
        biases.push_back(shown ? 0.25f * static_cast<float>(biases.size() % 5) : -std::numeric_limits<float>::infinity());
      }
      mask = from_floats(biases, {3, 70});
    }
    const auto q = random_tensor(sf::DType::kF32, {2, 3, 8}, rng);
    const auto k = random_tensor(sf::DType::kF32, {2, 70, 8}, rng);
    const auto v = random_tensor(sf::DType::kF32, {2, 70, 5}, rng);
    const sf::DenseTensor out = call("aten::scaled_dot_product_attention", arguments(c, q, k, v, &mask));
    EXPECT_TRUE(all_close(to_doubles(out), reference(c, q, k, v, &mask), 1e-4, 1e-5)) << "bool mask " << bool_mask;
  }
}

// A hidden key is never read: NaN in its key and value rows changes nothing.
TEST(AttentionOps, HiddenKeysAreNotRead) {
  std::mt19937 rng(5);
  const Case c{{2}, 1, 16, 8, 8, {1, 16}, true, false, std::nullopt};
  const auto q = random_tensor(sf::DType::kF32, {2, 1, 8}, rng);
  auto k = random_tensor(sf::DType::kF32, {2, 16, 8}, rng);
  auto v = random_tensor(sf::DType::kF32, {2, 16, 8}, rng);
  sf::DenseTensor mask = sf::DenseTensor::zeros(sf::DType::kBool, {1, 16});
  for (int s = 0; s < 5; ++s) mask.data_as<bool>()[s] = true;  // a cache written up to position 4
  const sf::DenseTensor clean = call("aten::scaled_dot_product_attention", arguments(c, q, k, v, &mask));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t s = 5; s < 16; ++s) {
      for (int64_t e = 0; e < 8; ++e) {
        k.data_as<float>()[(b * 16 + s) * 8 + e] = std::numeric_limits<float>::quiet_NaN();
        v.data_as<float>()[(b * 16 + s) * 8 + e] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  }
  const sf::DenseTensor poisoned = call("aten::scaled_dot_product_attention", arguments(c, q, k, v, &mask));
  EXPECT_EQ(to_doubles(poisoned), to_doubles(clean));
  EXPECT_TRUE(all_close(to_doubles(clean), reference(c, q, k, v, &mask)));
}

TEST(AttentionOps, ARowThatSeesNoKeyIsNaNAsInPyTorch) {
  std::mt19937 rng(7);
  const Case c{{1}, 2, 4, 4, 4, {2, 4}, true, false, std::nullopt};
  const auto q = random_tensor(sf::DType::kF32, {1, 2, 4}, rng);
  const auto k = random_tensor(sf::DType::kF32, {1, 4, 4}, rng);
  const auto v = random_tensor(sf::DType::kF32, {1, 4, 4}, rng);
  sf::DenseTensor mask = sf::DenseTensor::zeros(sf::DType::kBool, {2, 4});
  mask.data_as<bool>()[4] = true;  // row 1 sees key 0; row 0 sees nothing
  const auto out = to_doubles(call("aten::scaled_dot_product_attention", arguments(c, q, k, v, &mask)));
  for (int e = 0; e < 4; ++e) EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(e)]));
  for (int e = 0; e < 4; ++e) EXPECT_FLOAT_EQ(out[static_cast<std::size_t>(4 + e)], element(v, e));
}

// Query rows split over the kernel threads; each row is computed in one
// order, so a decode step gives the same bits on any core count.
TEST(AttentionOps, GivesTheSameBitsOnAnyNumberOfKernelThreads) {
  std::mt19937 rng(9);
  for (const Case& c : {Case{{2, 6}, 1, 300, 64, 64, {1, 300}, true, false, std::nullopt},  // decode, cache of 300
                        Case{{3}, 40, 40, 32, 16, {}, true, true, std::nullopt}}) {         // causal prefill
    const auto q = random_tensor(sf::DType::kF32, with(c.batch, c.queries, c.depth), rng);
    const auto k = random_tensor(sf::DType::kF32, with(c.batch, c.keys, c.depth), rng);
    const auto v = random_tensor(sf::DType::kF32, with(c.batch, c.keys, c.value_depth), rng);
    std::optional<sf::DenseTensor> mask;
    if (!c.mask_shape.empty()) mask = random_tensor(sf::DType::kBool, c.mask_shape, rng);
    const auto args = arguments(c, q, k, v, mask ? &*mask : nullptr);
    std::vector<double> single;
    {
      const KernelThreads one(1);
      single = to_doubles(call("aten::scaled_dot_product_attention", args));
    }
    for (int threads : {2, 3}) {
      const KernelThreads many(threads);
      const int64_t split_before = sf::parallel_kernel_calls();
      const std::vector<double> split = to_doubles(call("aten::scaled_dot_product_attention", args));
      EXPECT_GT(sf::parallel_kernel_calls(), split_before) << c.keys << " keys: the call was not split";
      ASSERT_EQ(split.size(), single.size());
      for (std::size_t i = 0; i < split.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint64_t>(split[i]), std::bit_cast<uint64_t>(single[i]))
            << threads << " threads, element " << i;
      }
    }
  }
}

TEST(AttentionOps, BadArgumentsAreClearErrors) {
  std::mt19937 rng(9);
  const auto f = [&](sf::Shape shape) { return random_tensor(sf::DType::kF32, std::move(shape), rng); };
  const sf::Constant none;
  struct Row {
    std::vector<TestArg> args;
    std::string message;
  };
  const std::vector<Row> rows = {
      {{f({2, 3, 4}), f({2, 5, 6}), f({2, 5, 4})}, "query and key need the same last dim (E)"},
      {{f({2, 3, 4}), f({2, 5, 4}), f({2, 6, 4})}, "key and value need the same number of rows (S)"},
      {{f({2, 3, 4}), f({3, 5, 4}), f({3, 5, 4})}, "need the same batch dims"},
      {{f({3, 4}), f({2, 5, 4}), f({2, 5, 4})}, "need the same rank"},
      {{f({2, 3, 4}), f({2, 5, 4}), f({2, 5, 4}), f({3, 4})}, "attn_mask f32[3,4] does not broadcast"},
      {{f({2, 3, 4}), f({2, 5, 4}), f({2, 5, 4}), none, 0.1}, "dropout_p must be 0"},
      {{f({2, 3, 4}), f({2, 5, 4}), f({2, 5, 4}), f({3, 5}), 0.0, true}, "cannot be given with is_causal=True"},
      {{f({2, 3, 4}), f({2, 5, 4}), f({2, 5, 4}), none, 0.0, false, kw("enable_gqa", true)}, "enable_gqa=True"},
      // Grouped heads: the option is named, not the batch dims it would allow.
      {{f({1, 4, 5, 4}), f({1, 2, 5, 4}), f({1, 2, 5, 4}), none, 0.0, false, kw("enable_gqa", true)},
       "enable_gqa=True is not implemented"},
      {{from_ints({1, 2}, {1, 2}), f({1, 2}), f({1, 2})}, "Expected query, key, and value to have the same dtype"},
      {{from_ints({1, 2}, {1, 2}), from_ints({1, 2}, {1, 2}), from_ints({1, 2}, {1, 2})},
       "must be float32, bfloat16 or float16, got Long"},
      {{f({2, 3, 4}), f({2, 5, 4}), f({2, 5, 4}), from_ints({1}, {1})}, "attn_mask must be bool, float32 or the"},
  };
  for (const Row& row : rows) {
    try {
      call("aten::scaled_dot_product_attention", row.args);
      ADD_FAILURE() << "no error, expected \"" << row.message << "\"";
    } catch (const sf::Error& error) {
      EXPECT_NE(std::string(error.what()).find(row.message), std::string::npos)
          << "got \"" << error.what() << "\", expected \"" << row.message << "\"";
    }
  }
}

}  // namespace
