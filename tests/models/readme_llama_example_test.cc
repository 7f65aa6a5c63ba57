// The README's LLaMA example, compiled and checked.
#include <gtest/gtest.h>

#include <map>

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
  EXPECT_EQ(model.decode_collectives().size(), 25u);
  auto decode_profile = std::make_shared<sf::OpProfile>();
  model.set_profiles(nullptr, decode_profile);
  options.steps = 3;  // one prefill, two decode steps
  llama::generate(model, {{1, 450, 4996}, {1, 450, 4996}, {1, 9038, 2501}, {1, 29871, 13}}, options);
  EXPECT_EQ(decode_profile->function_calls(), 2);
  EXPECT_EQ(decode_profile->devices().size(), 8u);
  std::map<std::string, int64_t> per_kind;  // each collective of the program, twice
  for (const sf::ProgramCollective& c : model.decode_collectives()) per_kind[c.kind] += 2;
  for (const auto& [kind, calls] : per_kind) {
    int64_t profiled = 0;
    for (const sf::OpProfile::Entry& e : decode_profile->entries(0)) profiled += e.op == kind ? e.calls : 0;
    EXPECT_EQ(profiled, calls) << kind;
  }
}
