// Generation: program reuse, greedy equivalence with the reference, and the
// sampler's properties.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "models/llama_reference.h"
#include "shardflow/models/llama.h"
#include "shardflow/runtime/runtime.h"

namespace shardflow::llama {
namespace {

int64_t argmax(const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); }

TEST(LlamaGenerate, DecodeReusesOneProgramOnAMesh) {
  Runtime runtime = Runtime::local(8);
  std::vector<int64_t> ids(8);
  std::iota(ids.begin(), ids.end(), 0);
  const ShardingPlan plan = ShardingPlan::megatron(
      std::make_shared<const Mesh>(ids, std::vector<int64_t>{4, 1, 2}, std::vector<std::string>{"data", "fsdp", "model"}));
  Model model(random_weights(Config::named("tiny"), 1, &plan), plan);
  SamplingOptions options;
  options.steps = 33;  // the prefill's token, then 32 decode steps
  const Generation g = generate(model, std::vector<std::vector<int64_t>>(4, {1, 30, 31}), options);
  EXPECT_EQ(model.prefill_stats().traces + model.decode_stats().traces, 2);
  EXPECT_EQ(model.decode_stats().cache_hits, 31);
  ASSERT_EQ(g.tokens.size(), 4u);
  EXPECT_EQ(g.tokens[0].size(), 33u);
  const std::string program = model.decode_program_text();
  EXPECT_NE(program.find("aten::index_copy"), std::string::npos);  // the cache update is in the program

  // Greedy tokens are those of the plain-loop reference fed its own choices.
  const testing::ReferenceWeights ref = testing::reference_weights(model.weights());
  std::vector<int64_t> sequence{1, 30, 31};
  for (int64_t step = 0; step < 8; ++step) sequence.push_back(argmax(testing::reference_logits(ref, sequence).back()));
  EXPECT_EQ(std::vector<int64_t>(g.tokens[2].begin(), g.tokens[2].begin() + 8),
            std::vector<int64_t>(sequence.begin() + 3, sequence.end()));
}

TEST(LlamaGenerate, SamplingIsSeededAndRowsDiffer) {
  Model model(random_weights(Config::named("tiny"), 2));
  SamplingOptions options;
  options.steps = 12;
  options.temperature = 1.5;
  options.top_p = 0.95;
  options.seed = 42;
  const auto prompts = std::vector<std::vector<int64_t>>(3, {1, 5});
  const Generation a = generate(model, prompts, options);
  const Generation b = generate(model, prompts, options);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_TRUE(a.tokens[0] != a.tokens[1] || a.tokens[1] != a.tokens[2]);  // each row draws its own coins
  options.seed = 43;
  EXPECT_NE(generate(model, prompts, options).tokens, a.tokens);
}

// Greedy picks the first of the largest logits wherever it sits (any lane
// of the vectorised scan, or the tail), and skips NaN.
TEST(SampleToken, GreedyIsTheFirstMaximum) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-3, 3);  // few values: many ties
  for (std::size_t size : {1, 15, 16, 17, 33, 1000, 32003}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> logits(size);
      for (float& x : logits) x = static_cast<float>(small(rng));
      const auto expected = std::max_element(logits.begin(), logits.end()) - logits.begin();
      EXPECT_EQ(sample_token(logits, 0, 1.0, 0.5), expected) << size << " logits, trial " << trial;
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(sample_token(std::vector<float>{nan, 1.0f, 2.0f, nan}, 0, 1.0, 0.5), 2);
  EXPECT_EQ(sample_token(std::vector<float>{nan, nan}, 0, 1.0, 0.5), 0);
}

TEST(SampleToken, GreedyTemperatureAndNucleus) {
  const std::vector<float> logits{0.0f, 3.0f, 1.0f, 3.0f, -2.0f};
  EXPECT_EQ(sample_token(logits, 0, 0.9, 0.99), 1);  // first maximum
  // top_p small: only the most likely tokens (1 and 3, tied) can be drawn.
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> coin(0, 1);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < 4000; ++i) ++counts[static_cast<std::size_t>(sample_token(logits, 1.0, 0.5, coin(rng)))];
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);
  EXPECT_GT(counts[1], 0);
  // top_p 0.5 keeps just the first of the tied pair (its mass reaches 0.5 alone? no: each has ~0.42).
  EXPECT_GT(counts[3], 0);
  // Without a nucleus, frequencies follow softmax(logits / T).
  std::fill(counts.begin(), counts.end(), 0);
  const int draws = 200000;
  for (int i = 0; i < draws; ++i) ++counts[static_cast<std::size_t>(sample_token(logits, 2.0, 1.0, coin(rng)))];
  double total = 0;
  std::vector<double> p;
  for (float l : logits) total += std::exp(l / 2.0);
  for (float l : logits) p.push_back(std::exp(l / 2.0) / total);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    EXPECT_NEAR(counts[i] / static_cast<double>(draws), p[i], 0.01) << i;
  }
}

}  // namespace
}  // namespace shardflow::llama

namespace shardflow::llama {
namespace {

std::map<std::string, int> decode_collectives(bool annotate_block_outputs) {
  Runtime runtime = Runtime::local(8);
  std::vector<int64_t> ids(8);
  std::iota(ids.begin(), ids.end(), 0);
  ShardingPlan plan = ShardingPlan::megatron(
      std::make_shared<const Mesh>(ids, std::vector<int64_t>{4, 1, 2}, std::vector<std::string>{"data", "fsdp", "model"}));
  if (!annotate_block_outputs) plan.activations.erase("block_output");
  Config config = Config::named("tiny");
  config.n_kv_heads = config.n_heads;  // heads split evenly over model=2
  Model model(random_weights(config, 1, &plan), plan);
  SamplingOptions options;
  options.steps = 3;
  generate(model, std::vector<std::vector<int64_t>>(4, {1, 2}), options);
  std::map<std::string, int> kinds;
  for (const ProgramCollective& c : model.decode_collectives()) {
    ++kinds[c.kind];
    EXPECT_NE(c.description.find("over 'model'"), std::string::npos) << c.description;  // never the size-1 'fsdp'
    EXPECT_EQ(c.group_size, 2) << c.description;
  }
  return kinds;
}

// Megatron's two all-reduces per layer and the vocab-parallel embedding's
// one, nothing else (the logits leave the program split over the
// vocabulary).
TEST(LlamaCollectives, MegatronPlanReachesTheMinimum) {
  EXPECT_EQ(decode_collectives(false), (std::map<std::string, int>{{"all-reduce", 5}}));
}

// Block outputs sharded over 'model' (PyTorch/XLA's (0, 1, 2) annotation):
// the residual stays sharded, so each of the two sublayers gathers its
// normalised input and reduce-scatters its output (2 layers: the first
// layer's input is the embedding's all-reduced rows, the final norm gathers
// once more).
TEST(LlamaCollectives, ShardedBlockOutputsTradeAllReducesForGatherAndScatter) {
  EXPECT_EQ(decode_collectives(true),
            (std::map<std::string, int>{{"all-gather", 4}, {"all-reduce", 1}, {"reduce-scatter", 4}}));
}

}  // namespace
}  // namespace shardflow::llama
