// The README's LLaMA example, compiled and checked.
#include <gtest/gtest.h>

#include "shardflow/models/llama.h"
#include "shardflow/runtime/runtime.h"
#include "shardflow/shardflow.h"

namespace sf = shardflow;
namespace llama = shardflow::llama;

TEST(ReadmeExample, LlamaGeneration) {
  sf::Runtime rt = sf::Runtime::local(8);
  auto mesh = std::make_shared<const sf::Mesh>(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7},
                                               std::vector<int64_t>{4, 1, 2},
                                               std::vector<std::string>{"data", "fsdp", "model"});
  llama::ShardingPlan plan = llama::ShardingPlan::megatron(mesh);
  EXPECT_NE(plan.to_string().find("activation  block_output    ('data', 'fsdp', 'model')"), std::string::npos);
  llama::Model model(llama::random_weights(llama::Config::named("stories15M"), /*seed=*/0, &plan), plan);
  llama::SamplingOptions options;
  options.steps = 32;
  llama::Generation g = llama::generate(
      model, {{1, 450, 4996}, {1, 450, 4996}, {1, 9038, 2501}, {1, 29871, 13}}, options);
  ASSERT_EQ(g.tokens.size(), 4u);
  EXPECT_EQ(g.tokens[0], g.tokens[1]);  // the same prompt, greedy
  EXPECT_EQ(g.tokens[0].size(), 32u);
  EXPECT_EQ(model.decode_stats().traces, 1);
  EXPECT_EQ(model.decode_stats().cache_hits, 30);
  EXPECT_EQ(model.decode_collectives().size(), 24u);
}
