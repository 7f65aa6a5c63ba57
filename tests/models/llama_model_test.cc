// The LLaMA model against the plain-loop reference, on one device and on
// meshes that split batch, heads and the MLP evenly and unevenly.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>

#include "models/llama_reference.h"
#include "shardflow/base/error.h"
#include "shardflow/models/llama.h"
#include "shardflow/runtime/runtime.h"
#include "shardflow/shardflow.h"

namespace shardflow::llama {
namespace {

// Two rows of nine tokens: five prefilled, four decoded one at a time.
const std::vector<std::vector<int64_t>> kSequences{{1, 17, 300, 4, 99, 250, 3, 8, 64},
                                                   {1, 5, 6, 7, 8, 9, 10, 11, 12}};
constexpr int64_t kPrompt = 5;

// Runs the sequences through the model (prefill, then decode steps) and
// checks each step's logits against the reference.
void expect_matches_reference(Model& model) {
  const testing::ReferenceWeights ref = testing::reference_weights(model.weights());
  std::vector<std::vector<std::vector<float>>> expected;
  for (const auto& seq : kSequences) expected.push_back(testing::reference_logits(ref, seq));
  testing::expect_steps_match(model, kSequences, kPrompt, expected);
  EXPECT_EQ(model.prefill_stats().traces, 1);
  EXPECT_EQ(model.decode_stats().traces, 1);
  EXPECT_EQ(model.decode_stats().cache_hits, static_cast<int64_t>(kSequences[0].size()) - kPrompt - 1);
}

TEST(LlamaModel, OneDeviceMatchesReference) {
  Model model(random_weights(Config::named("tiny"), 7));
  expect_matches_reference(model);
}

TEST(LlamaModel, UntiedHeadMatchesReference) {
  Config config = Config::named("tiny");
  config.shared_classifier = false;
  config.n_kv_heads = config.n_heads;
  Model model(random_weights(config, 3));
  expect_matches_reference(model);
}

// A tied head costs no memory of its own where it is laid out like the
// embedding; where the plan splits it differently it gets its own layout.
TEST(LlamaModel, TiedHeadSharesTheEmbeddingBufferWhenLaidOutAlike) {
  const Weights one_device = random_weights(Config::named("tiny"), 7);
  EXPECT_EQ(one_device.output.impl(), one_device.tok_embeddings.impl());

  Runtime runtime = Runtime::local(4);
  auto mesh = std::make_shared<const Mesh>(std::vector<int64_t>{0, 1, 2, 3}, std::vector<int64_t>{1, 1, 4},
                                           std::vector<std::string>{"data", "fsdp", "model"});
  ShardingPlan plan = ShardingPlan::megatron(mesh);
  ASSERT_EQ(plan.param("output"), plan.param("tok_embeddings"));  // both over the vocabulary
  const Weights alike = random_weights(Config::named("tiny"), 7, &plan);
  EXPECT_EQ(alike.output.impl(), alike.tok_embeddings.impl());

  plan.params["tok_embeddings"] = PartitionSpec{none, "model"};
  const Weights split = random_weights(Config::named("tiny"), 7, &plan);
  EXPECT_NE(split.output.impl(), split.tok_embeddings.impl());
  EXPECT_EQ(split.output.sharding()->to_readable(), Sharding::from_spec(mesh, plan.param("output")).to_readable());
  EXPECT_EQ(split.output.to_floats(), split.tok_embeddings.to_floats());
}

// A plan naming an axis the mesh lacks is refused where it is made or
// used, naming the entry and the plan's axes, not by the first traced
// annotation in XLA's words alone.
TEST(LlamaModel, PlanWithAnAxisTheMeshLacksIsRefusedUpFront) {
  const auto error_of = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  auto two_axes = std::make_shared<const Mesh>(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7},
                                               std::vector<int64_t>{4, 2}, std::vector<std::string>{"data", "model"});
  EXPECT_EQ(error_of([&] { ShardingPlan::megatron(two_axes); }),
            "the sharding plan's parameter 'output' ('model', 'fsdp') does not fit the mesh (data=4, model=2): Axis "
            "name fsdp is not defined in the given mesh (the plan names the axes 'data', 'fsdp', 'model'; give the "
            "mesh each of them, size 1 leaves one unused)");

  auto mesh = std::make_shared<const Mesh>(std::vector<int64_t>{0, 1}, std::vector<int64_t>{1, 1, 2},
                                           std::vector<std::string>{"data", "fsdp", "model"});
  ShardingPlan plan = ShardingPlan::megatron(mesh);
  plan.activations["kv_cache"] = PartitionSpec{"data", "model", "seq", none};
  const std::string expected_start = "the sharding plan's activation 'kv_cache' ('data', 'model', 'seq', None)";
  EXPECT_EQ(error_of([&] { random_weights(Config::named("tiny"), 7, &plan); }).rfind(expected_start, 0), 0u);
  EXPECT_EQ(error_of([&] { Model(random_weights(Config::named("tiny"), 7), plan); }).rfind(expected_start, 0), 0u);
  plan.activations["kv_cache"] = PartitionSpec{"model", "model", none, none};
  EXPECT_NE(error_of([&] { plan.check(); }).find("'kv_cache' ('model', 'model', None, None) does not fit"),
            std::string::npos);
}

// The embedding table and head are split over the vocabulary on 'model':
// 323 rows (HF checkpoints add tokens to 32000 too) leave uneven tiles on 4
// and 8 devices, whose lookups and logits still match one device.
TEST(LlamaModel, VocabularyNoAxisDividesMatchesReference) {
  Config config = Config::named("tiny");
  config.vocab_size = 323;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 1, 8}, std::vector<int64_t>{2, 1, 4}}) {
    Runtime runtime = Runtime::local(8);
    std::vector<int64_t> ids(8);
    std::iota(ids.begin(), ids.end(), 0);
    const ShardingPlan plan =
        ShardingPlan::megatron(std::make_shared<const Mesh>(ids, shape, std::vector<std::string>{"data", "fsdp", "model"}));
    Model model(random_weights(config, 9, &plan), plan);
    expect_matches_reference(model);
  }
}

class LlamaOnMesh : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(LlamaOnMesh, MatchesReference) {
  const std::vector<int64_t> shape = GetParam();
  const int64_t devices = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  Runtime runtime = Runtime::local(devices);
  std::vector<int64_t> ids(static_cast<std::size_t>(devices));
  std::iota(ids.begin(), ids.end(), 0);
  auto mesh = std::make_shared<const Mesh>(ids, shape, std::vector<std::string>{"data", "fsdp", "model"});
  const ShardingPlan plan = ShardingPlan::megatron(mesh);
  Model model(random_weights(Config::named("tiny"), 7, &plan), plan);
  expect_matches_reference(model);
}

// 6 query heads and 3 key/value heads divide neither 4 nor 8; batch 2 on
// data=4 or 8 leaves devices holding only padding.
INSTANTIATE_TEST_SUITE_P(Meshes, LlamaOnMesh,
                         ::testing::Values(std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{2, 1, 4},
                                           std::vector<int64_t>{4, 1, 2}, std::vector<int64_t>{8, 1, 1},
                                           std::vector<int64_t>{1, 1, 8}, std::vector<int64_t>{1, 2, 2}),
                         [](const auto& param_info) {
                           std::string name;
                           for (int64_t s : param_info.param) name += (name.empty() ? "" : "x") + std::to_string(s);
                           return name;
                         });

}  // namespace
}  // namespace shardflow::llama
