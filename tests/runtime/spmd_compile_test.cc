// compile() and eager ops on a multi-device runtime: graphs are propagated,
// partitioned and run on the runtime's devices; results match one device.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "shardflow/runtime/runtime.h"
#include "shardflow/sharding/shard_layout.h"
#include "shardflow/shardflow.h"
#include "shardflow/tensor/gemm.h"

namespace sf = shardflow;

namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return ids;
}

void expect_close(const sf::Tensor& a, const sf::Tensor& b) {
  const auto x = a.to_floats(), y = b.to_floats();
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 1e-4 * (1 + std::abs(y[i]))) << i;
}

TEST(SpmdCompile, MegatronMlpRunsOnEightDevicesWithOneAllReduce) {
  // Reference values computed before any runtime exists (one device).
  const sf::Tensor x = sf::randn({8, 16}, 1);
  const sf::Tensor w1_value = sf::randn({16, 64}, 2), w2_value = sf::randn({64, 16}, 3);
  const sf::Tensor expected = sf::matmul(sf::gelu(sf::matmul(x, w1_value)), w2_value);

  sf::Runtime runtime = sf::Runtime::local(8);
  const sf::Mesh mesh(iota(8), {2, 4}, {"data", "model"});
  sf::Tensor w1(w1_value.value()), w2(w2_value.value());
  sf::mark_sharding(w1, mesh, {sf::none, "model"});
  sf::mark_sharding(w2, mesh, {"model", sf::none});
  auto mlp = sf::compile([&](sf::Tensor in) { return sf::matmul(sf::gelu(sf::matmul(in, w1)), w2); });
  expect_close(mlp(x), expected);
  const std::string program = mlp.program_text();
  EXPECT_NE(program.find("1 collective(s):\n  all-reduce over 'model'"), std::string::npos) << program;
  EXPECT_NE(program.find("{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"), std::string::npos)
      << program;  // each value's V1 string is shown
  expect_close(mlp(x), expected);
  EXPECT_EQ(mlp.stats().traces, 1);
  EXPECT_EQ(mlp.stats().cache_hits, 1);
}

// Every device reports its own ops, and each collective under its kind.
TEST(SpmdCompile, ProfileHasEveryDeviceItsOpsAndItsCollectives) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const sf::Mesh mesh(iota(8), {2, 4}, {"data", "model"});
  sf::Tensor w1(sf::randn({16, 64}, 2).value()), w2(sf::randn({64, 16}, 3).value());
  sf::mark_sharding(w1, mesh, {sf::none, "model"});
  sf::mark_sharding(w2, mesh, {"model", sf::none});
  auto mlp = sf::compile([&](sf::Tensor in) { return sf::matmul(sf::gelu(sf::matmul(in, w1)), w2); });
  auto profile = std::make_shared<sf::OpProfile>();
  mlp.set_profile(profile);
  const sf::Tensor x = sf::randn({8, 16}, 1);
  mlp(x);
  mlp(x);
  EXPECT_EQ(profile->function_calls(), 2);
  EXPECT_EQ(profile->devices(), iota(8));
  for (int64_t device = 0; device < 8; ++device) {
    std::map<std::string, int64_t> calls;
    for (const sf::OpProfile::Entry& e : profile->entries(device)) calls[e.op] = e.calls;
    EXPECT_EQ(calls["aten::matmul"], 4) << device;
    EXPECT_EQ(calls["aten::gelu"], 2) << device;
    EXPECT_EQ(calls["all-reduce"], 2) << device;  // the program's one all-reduce per call
  }
}

TEST(SpmdCompile, ActivationShardingComesBackLaidOut) {
  const sf::Tensor x_value = sf::randn({4, 6, 10}, 4);
  const sf::Tensor expected = sf::silu(x_value * 2);
  sf::Runtime runtime = sf::Runtime::local(8);
  const sf::Mesh mesh(iota(8), {4, 1, 2}, {"data", "fsdp", "model"});
  auto step = sf::compile([&](sf::Tensor x) {
    const sf::Tensor h = sf::mark_sharding(x * 2, mesh, {0, 1, 2});
    return sf::silu(h);
  });
  const sf::Tensor y = step(sf::Tensor(x_value.value()));
  ASSERT_TRUE(y.sharding().has_value());
  EXPECT_EQ(y.sharding_spec(), "{devices=[4,1,2]0,1,2,3,4,5,6,7}");
  EXPECT_EQ(y.local_shards()[3].data.shape(), (sf::Shape{1, 6, 5}));
  expect_close(y, expected);
}

TEST(SpmdCompile, EagerOpsOnShardedTensorsRunSharded) {
  const sf::Tensor a_value = sf::randn({17, 5}, 5);
  const sf::Tensor expected_sum = sf::sum(sf::exp(a_value), {0});
  sf::Runtime runtime = sf::Runtime::local(8);
  sf::Tensor a(a_value.value());
  sf::mark_sharding(a, sf::Mesh(iota(8), {8}, {"x"}), {"x", sf::none});
  const sf::Tensor e = sf::exp(a);
  ASSERT_TRUE(e.sharding().has_value());
  EXPECT_EQ(e.sharding_spec(), a.sharding_spec());  // elementwise: same layout
  expect_close(sf::sum(e, {0}), expected_sum);      // 17 rows on 8 devices, padding masked
}

TEST(SpmdCompile, MeshAndRuntimeMustAgree) {
  sf::Runtime runtime = sf::Runtime::local(4);
  auto step = sf::compile([](sf::Tensor x) {
    return sf::ops::call("xla::dynamo_mark_sharding",
                         {x, std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, "(8,)", "None", "(0,)"});
  });
  try {
    step(sf::randn({8}, 0));
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    EXPECT_NE(std::string(error.what()).find("must match the global number of devices (4)"), std::string::npos)
        << error.what();
  }
}

TEST(SpmdCompile, AKernelErrorOnTheDevicesEndsTheRun) {
  sf::Runtime runtime = sf::Runtime::local(2);
  const sf::Mesh mesh(iota(2), {2}, {"x"});
  sf::Tensor table = sf::randn({4, 3}, 1);
  sf::mark_sharding(table, mesh, {sf::none, "x"});
  auto lookup = sf::compile([&](sf::Tensor ids) { return sf::embedding(table, ids); });
  auto profile = std::make_shared<sf::OpProfile>();
  lookup.set_profile(profile);
  EXPECT_THROW(lookup(sf::Tensor::from_ints(std::vector<int64_t>{0, 9}, {2})), sf::Error);
  EXPECT_EQ(profile->function_calls(), 0);  // a failed run adds nothing
  EXPECT_TRUE(profile->devices().empty());
  expect_close(lookup(sf::Tensor::from_ints(std::vector<int64_t>{1, 3}, {2})),
               sf::embedding(sf::Tensor(table.value()), sf::Tensor::from_ints(std::vector<int64_t>{1, 3}, {2})));
  EXPECT_EQ(profile->function_calls(), 1);
  EXPECT_EQ(profile->devices(), iota(2));
}

}  // namespace

namespace {

// donate_inputs on devices: each device updates its own shard of a donated
// cache in place; a shard another holder shares is copied first.
// The cache split over its batch rows, and over its positions (the dim
// index_copy writes, 3 rows in tiles of 1: the last device holds none):
// either way each device updates its own shard, in place when donated.
TEST(SpmdCompile, DonatedShardsAreUpdatedInPlace) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const sf::Mesh mesh(iota(4), {4}, {"x"});
  for (const sf::PartitionSpec& spec : {sf::PartitionSpec{"x", sf::none, sf::none},
                                        sf::PartitionSpec{sf::none, "x", sf::none}}) {
    SCOPED_TRACE(spec.to_string());
    sf::CompiledFunction step(
        [&](const std::vector<sf::Tensor>& in) {
          return std::vector<sf::Tensor>{sf::mark_sharding(sf::index_copy(in[0], 1, in[1], in[2]), mesh, spec)};
        },
        "cache_update");
    step.donate_inputs({0});
    const sf::Tensor position = sf::Tensor::from_ints(std::vector<int64_t>{2}, {1});
    sf::Tensor row = sf::Tensor::from_floats(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {4, 1, 2});
    if (!spec[0].is_none()) sf::mark_sharding(row, mesh, spec);
    std::vector<float> expected(4 * 3 * 2, 0.0f);
    for (int b = 0; b < 4; ++b) {
      expected[static_cast<std::size_t>(b * 6 + 4)] = static_cast<float>(2 * b + 1);
      expected[static_cast<std::size_t>(b * 6 + 5)] = static_cast<float>(2 * b + 2);
    }

    sf::Tensor cache = sf::zeros({4, 3, 2});
    sf::mark_sharding(cache, mesh, spec);
    std::vector<const std::byte*> before;
    for (const sf::LocalShard& shard : cache.local_shards()) before.push_back(shard.data.data());
    std::vector<sf::Tensor> inputs{std::move(cache), position, row};
    const sf::Tensor updated = step.call(inputs)[0];
    EXPECT_EQ(updated.to_floats(), expected);
    EXPECT_EQ(step.program_text().find("all-gather"), std::string::npos) << step.program_text();
    ASSERT_EQ(updated.local_shards().size(), 4u);
    for (std::size_t d = 0; d < 4; ++d) EXPECT_EQ(updated.local_shards()[d].data.data(), before[d]) << "device " << d;
    EXPECT_THROW(inputs[0].to_floats(), sf::Error);

    // Kept by the caller: not donated, left as it was.
    sf::Tensor kept = sf::zeros({4, 3, 2});
    sf::mark_sharding(kept, mesh, spec);
    const sf::Tensor result = step.call({kept, position, row})[0];
    EXPECT_EQ(result.to_floats(), expected);
    EXPECT_EQ(kept.to_floats(), std::vector<float>(24, 0.0f));
    EXPECT_NE(result.local_shards()[0].data.data(), kept.local_shards()[0].data.data());
  }
}

}  // namespace

namespace {

// A replicated cache: the result keeps each device's copy, so fed back and
// donated it is updated in place on every device (one buffer shared by all
// would be copied by each device on every call).
TEST(SpmdCompile, ADonatedReplicatedResultIsUpdatedInPlaceOnEachDevice) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const sf::Mesh mesh(iota(4), {4}, {"x"});
  const sf::PartitionSpec replicated{sf::none, sf::none};
  sf::CompiledFunction step(
      [&](const std::vector<sf::Tensor>& in) {
        return std::vector<sf::Tensor>{sf::mark_sharding(sf::index_copy(in[0], 0, in[1], in[2]), mesh, replicated)};
      },
      "replicated_cache_update");
  step.donate_inputs({0});
  const sf::Tensor row = sf::Tensor::from_floats(std::vector<float>{7, 8}, {1, 2});
  sf::Tensor cache = sf::zeros({3, 2});
  sf::mark_sharding(cache, mesh, replicated);
  std::vector<float> expected(6, 0.0f);
  for (int64_t position : {0, 2, 1}) {
    SCOPED_TRACE(position);
    std::vector<const std::byte*> before;
    for (const sf::LocalShard& shard : cache.local_shards()) before.push_back(shard.data.data());
    std::vector<sf::Tensor> inputs{std::move(cache), sf::Tensor::from_ints(std::vector<int64_t>{position}, {1}), row};
    cache = step.call(inputs)[0];
    expected[static_cast<std::size_t>(2 * position)] = 7;
    expected[static_cast<std::size_t>(2 * position + 1)] = 8;
    EXPECT_EQ(cache.to_floats(), expected);
    const std::vector<sf::LocalShard> shards = cache.local_shards();
    ASSERT_EQ(shards.size(), 4u);
    for (std::size_t d = 0; d < 4; ++d) {
      const float* values = shards[d].data.data_as<float>();
      EXPECT_EQ(std::vector<float>(values, values + 6), expected) << "device " << d;
      for (std::size_t other = 0; other < d; ++other) EXPECT_NE(shards[d].data.data(), shards[other].data.data());
      if (position != 0) {
        EXPECT_EQ(shards[d].data.data(), before[d]) << "device " << d;  // in place
      }
    }
  }
}

// The torch bridge's in-place cache on several devices: each device's shard
// is a writable view of its run of one buffer (the torch tensor's memory).
// Donated, the shards are updated there, and the result lies in the buffer.
TEST(SpmdCompile, ShardsViewingRunsOfOneBufferAreUpdatedThere) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const sf::Mesh mesh(iota(4), {4}, {"x"});
  const sf::PartitionSpec spec{"x", sf::none, sf::none};
  const auto mesh_ptr = std::make_shared<const sf::Mesh>(mesh);
  const sf::Sharding sharding = sf::Sharding::from_spec(mesh_ptr, spec);
  sf::CompiledFunction step(
      [&](const std::vector<sf::Tensor>& in) {
        return std::vector<sf::Tensor>{sf::mark_sharding(sf::index_copy(in[0], 1, in[1], in[2]), mesh, spec)};
      },
      "cache_update");
  step.donate_inputs({0});
  std::vector<float> memory(4 * 3 * 2, 0.0f);  // [4, 3, 2], row-major
  auto* base = reinterpret_cast<std::byte*>(memory.data());
  const auto views_of_memory = [&] {
    const sf::ShardLayout layout = sf::shard_layout(sharding, std::vector<int64_t>{4, 3, 2});
    const std::optional<std::vector<int64_t>> offsets = sf::contiguous_shard_offsets(layout);
    EXPECT_TRUE(offsets.has_value());
    std::vector<sf::DenseTensor> shards;
    for (int64_t offset : offsets.value_or(std::vector<int64_t>{})) {
      std::shared_ptr<std::byte> first(base + offset * static_cast<int64_t>(sizeof(float)), [](std::byte*) {});
      shards.push_back(sf::DenseTensor::borrow(sf::DType::kF32, layout.shard_shape, std::move(first),
                                               sf::DenseTensor::Access::kWritable));
    }
    return sf::Tensor::from_shards(sf::DType::kF32, {4, 3, 2}, sharding, std::move(shards));
  };
  const sf::Tensor row = sf::Tensor::from_floats(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {4, 1, 2});
  std::vector<sf::Tensor> inputs{views_of_memory(), sf::Tensor::from_ints(std::vector<int64_t>{2}, {1}), row};
  EXPECT_TRUE(inputs[0].lies_in(base));
  const sf::Tensor updated = step.call(inputs)[0];
  EXPECT_TRUE(updated.lies_in(base)) << "the devices wrote their rows where the shards lie";
  EXPECT_FALSE(updated.lies_in(base + sizeof(float)));
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(memory[static_cast<std::size_t>(b * 6 + 4)], static_cast<float>(2 * b + 1));
    EXPECT_EQ(memory[static_cast<std::size_t>(b * 6 + 5)], static_cast<float>(2 * b + 2));
  }
  // Copies do not lie there; a plain tensor lies in its own memory.
  sf::Tensor copied = sf::Tensor::from_floats(memory, {4, 3, 2});
  EXPECT_TRUE(copied.lies_in(copied.value().data()));
  EXPECT_FALSE(copied.lies_in(base));
  sf::mark_sharding(copied, mesh, spec);
  EXPECT_FALSE(copied.lies_in(base));
}

// Attention sharded over heads runs locally; keys split along the sequence
// are gathered first (softmax needs every key), and the mask is honoured.
TEST(SpmdCompile, AttentionShardedOverHeadsOrKeysMatchesOneDevice) {
  const sf::Tensor q = sf::randn({2, 4, 3, 8}, 11), k = sf::randn({2, 4, 6, 8}, 12), v = sf::randn({2, 4, 6, 5}, 13);
  const sf::Tensor mask = sf::gt(sf::randn({3, 6}, 14), sf::zeros({}) - 0.3);
  const sf::Tensor expected = sf::scaled_dot_product_attention(q, k, v, mask);
  sf::Runtime runtime = sf::Runtime::local(4);
  const sf::Mesh mesh(iota(4), {2, 2}, {"data", "model"});
  auto heads = sf::compile([&](sf::Tensor q_in, sf::Tensor k_in, sf::Tensor v_in) {
    const auto spec = sf::PartitionSpec{"data", "model", sf::none, sf::none};
    return sf::scaled_dot_product_attention(sf::mark_sharding(q_in, mesh, spec), sf::mark_sharding(k_in, mesh, spec),
                                            sf::mark_sharding(v_in, mesh, spec), mask);
  });
  expect_close(heads(q, k, v), expected);
  EXPECT_EQ(heads.program_text().find("all-gather"), std::string::npos) << heads.program_text();
  auto keys = sf::compile([&](sf::Tensor q_in, sf::Tensor k_in, sf::Tensor v_in) {
    const auto spec = sf::PartitionSpec{sf::none, sf::none, "model", sf::none};
    return sf::scaled_dot_product_attention(q_in, sf::mark_sharding(k_in, mesh, spec), sf::mark_sharding(v_in, mesh, spec),
                                            mask);
  });
  expect_close(keys(q, k, v), expected);
  EXPECT_NE(keys.program_text().find("all-gather over 'model'"), std::string::npos) << keys.program_text();
}

}  // namespace

TEST(SpmdCompile, AProgramOnOneDeviceOfSeveralRunsItsKernelsOnTheIdleDevicesCores) {
  // A graph without annotations runs on device 0 alone: its kernels get the
  // kernel threads there were before the runtime (here 2), not the one
  // each device has while all of them compute.
  const sf::ScopedKernelThreads two(2);
  const sf::Tensor x = sf::randn({4, 256}, 1);
  const sf::Tensor w = sf::randn({256, 4096}, 2);
  const sf::Tensor expected = sf::matmul(x, w);
  {
    sf::Runtime runtime = sf::Runtime::local(2);
    ASSERT_EQ(sf::kernel_threads(), 1);
    auto product = sf::compile([&](sf::Tensor in) { return sf::matmul(in, w); });
    const int64_t split_before = sf::parallel_kernel_calls();
    const sf::Tensor result = product(x);
    EXPECT_GT(sf::parallel_kernel_calls(), split_before) << "the product ran on one kernel thread";
    EXPECT_EQ(sf::kernel_threads(), 1) << "the devices' setting is restored after the run";
    EXPECT_EQ(result.to_floats(), expected.to_floats());  // the same bits for any thread count
  }
  EXPECT_EQ(sf::kernel_threads(), 2);
}
