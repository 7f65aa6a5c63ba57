// compile(): tracing, the xla::dynamo_mark_sharding custom op, constants,
// guards and the cache (the seed scenarios of the IR/tracing issue).
#include <gtest/gtest.h>

#include <numeric>

#include "shardflow/shardflow.h"

namespace sf = shardflow;

namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return ids;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void expect_close(const sf::Tensor& a, const sf::Tensor& b) {
  const auto x = a.to_floats(), y = b.to_floats();
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-5 * (1 + std::abs(y[i]))) << i;
}

// (a) Activation sharding inside compile, with the mesh built inside the
// function from arange(8): a trace-time constant, so its values are known.
TEST(Compile, ActivationShardingWithMeshBuiltInside) {
  const sf::Tensor w = sf::randn({16, 32}, 1);
  auto step = sf::compile([&](sf::Tensor x) {
    const sf::Mesh mesh(sf::arange(8).to_ints(), {4, 1, 2}, {"data", "fsdp", "model"});
    sf::Tensor h = sf::matmul(x, w);
    h = sf::mark_sharding(h, mesh, {0, 1, 2});
    return sf::silu(h);
  });
  const sf::Tensor x = sf::randn({4, 8, 16}, 2);
  const sf::Tensor y = step(x);
  expect_close(y, sf::silu(sf::matmul(x, w)));
  const std::string text = step.graph_text();
  EXPECT_TRUE(contains(text, "xla::dynamo_mark_sharding(%0, [0, 1, 2, 3, 4, 5, 6, 7], \"(4, 1, 2)\", "
                             "\"('data', 'fsdp', 'model')\", \"(0, 1, 2)\") : f32[4,8,32]"))
      << text;
  // The constant computation does not appear: only the traced ops do.
  EXPECT_FALSE(contains(text, "arange")) << text;
  // The graph prints, re-parses and verifies.
  EXPECT_EQ(sf::print_graph(sf::parse_graph(text)), text);
}

// (b) Device ids that depend on traced data: a clear error naming the op.
TEST(Compile, DeviceIdsFromTracedDataIsAClearError) {
  auto step = sf::compile([](sf::Tensor x) {
    const sf::Tensor ids = sf::arange(8) + x.sum({}).to(sf::DType::kI64) * 0;
    const sf::Mesh mesh(ids.to_ints(), {8});
    return sf::mark_sharding(x, mesh, {0});
  });
  try {
    step(sf::randn({8}, 0));
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    const std::string message = error.what();
    EXPECT_TRUE(contains(message, "depends on the inputs of the compiled function")) << message;
    EXPECT_TRUE(contains(message, "aten::add.Tensor")) << message;
  }
  // The same through the custom op called by name: the binder names the
  // argument and the reason.
  auto by_name = sf::compile([](sf::Tensor x) {
    const sf::Tensor ids = sf::arange(2) + x.sum({}).to(sf::DType::kI64) * 0;
    return sf::ops::call("xla::dynamo_mark_sharding", {x, ids, "(2,)", "None", "(0,)"});
  });
  try {
    by_name(sf::randn({2}, 0));
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    const std::string message = error.what();
    EXPECT_TRUE(contains(message, "xla::dynamo_mark_sharding() Expected a value of type 'List[int]' "
                                  "for argument 'device_ids' but instead found type 'Tensor' whose "
                                  "values depend on the inputs of the compiled function"))
        << message;
    EXPECT_TRUE(contains(message, "Position: 1")) << message;
  }
}

// (c) Calling the op by name with a wrong argument type: PyTorch's message.
TEST(Compile, WrongArgumentTypeGivesPyTorchMessage) {
  const sf::Tensor t = sf::randn({2}, 0);
  try {
    sf::ops::call("xla::dynamo_mark_sharding", {t, "0,1", "(2,)", "None", "(0,)"});
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    EXPECT_EQ(std::string(error.what()),
              "xla::dynamo_mark_sharding() Expected a value of type 'List[int]' for argument "
              "'device_ids' but instead found type 'str'.\n"
              "Position: 1\n"
              "Value: \"0,1\"\n"
              "Declaration: xla::dynamo_mark_sharding(Tensor t, int[] device_ids, str mesh_shape, "
              "str axis_names, str partition_spec) -> Tensor");
  }
  // A correct call by name is the identity on values.
  const sf::Tensor same =
      sf::ops::call("xla::dynamo_mark_sharding", {t, std::vector<int64_t>{0, 1}, "(2,)", "None", "(0,)"});
  EXPECT_EQ(same.to_floats(), t.to_floats());
}

// (d) The same mark_sharding call eagerly and inside compile, no flag.
TEST(Compile, SameMarkShardingEagerAndCompiled) {
  const sf::Mesh mesh(iota(8), {2, 4}, {"data", "model"});
  const auto annotate = [&](const sf::Tensor& t) { return sf::mark_sharding(t, mesh, {"data", sf::none}); };
  sf::Tensor eager = sf::randn({4, 6}, 3);
  const std::vector<float> before = eager.to_floats();
  annotate(eager);
  EXPECT_EQ(eager.sharding_spec(), "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}");
  EXPECT_EQ(eager.to_floats(), before);  // the value is unchanged, only laid out
  auto step = sf::compile([&](sf::Tensor x) { return annotate(x * 2); });
  const sf::Tensor y = step(sf::Tensor(eager.value()));
  EXPECT_TRUE(contains(step.graph_text(), "\"('data', 'model')\", \"('data', None)\"")) << step.graph_text();
  expect_close(y, eager * 2);
}

// (e) Retrace when the mesh or spec changes; a cache hit otherwise.
TEST(Compile, RetracesWhenMeshOrSpecChanges) {
  sf::Mesh mesh(iota(4), {2, 2}, {"a", "b"});
  sf::PartitionSpec spec{"a", sf::none};
  auto step = sf::compile([&](sf::Tensor x) { return sf::mark_sharding(sf::relu(x), mesh, spec); });
  const sf::Tensor x = sf::randn({4, 4}, 0);
  step(x);
  step(x);
  EXPECT_EQ(step.stats().traces, 1);
  EXPECT_EQ(step.stats().cache_hits, 1);
  spec = {sf::none, "b"};
  step(x);
  EXPECT_EQ(step.stats().traces, 2);
  EXPECT_EQ(step.stats().guard_failures, 1);
  EXPECT_TRUE(contains(step.graph_text(), "\"(None, 'b')\"")) << step.graph_text();
  mesh = sf::Mesh({3, 2, 1, 0}, {2, 2}, {"a", "b"});
  step(x);
  EXPECT_EQ(step.stats().traces, 3);
  EXPECT_TRUE(contains(step.graph_text(), "[3, 2, 1, 0]")) << step.graph_text();
  step(x);  // the last trace is cached
  EXPECT_EQ(step.stats().traces, 3);
  spec = {"a", sf::none};
  mesh = sf::Mesh(iota(4), {2, 2}, {"a", "b"});
  step(x);  // back to the first: still cached
  EXPECT_EQ(step.stats().traces, 3);
  EXPECT_EQ(step.stats().cache_hits, 3);
}

TEST(Compile, GuardsOnInputTypesAndShardings) {
  auto step = sf::compile([](sf::Tensor x) { return sf::exp(x) + 1; });
  step(sf::randn({4}, 0));
  step(sf::randn({4}, 1));
  EXPECT_EQ(step.stats().traces, 1);
  step(sf::randn({5}, 0));  // new shape
  step(sf::randn({4}, 0, sf::DType::kBF16));  // new dtype
  EXPECT_EQ(step.stats().traces, 3);
  sf::Tensor sharded = sf::randn({4}, 0);
  sf::mark_sharding(sharded, sf::Mesh(iota(2), {2}), {0});
  step(sharded);  // new input sharding
  EXPECT_EQ(step.stats().traces, 4);
  EXPECT_EQ(step.stats().guard_failures, 3);
}

TEST(Compile, CapturedTensorsBecomeInputsAndKeepTheirSharding) {
  const sf::Mesh mesh(iota(4), {4}, {"model"});
  sf::Tensor w = sf::randn({8, 12}, 5);
  sf::mark_sharding(w, mesh, {sf::none, "model"});
  auto step = sf::compile([&](sf::Tensor x) { return sf::matmul(x, w); });
  const sf::Tensor x = sf::randn({3, 8}, 6);
  expect_close(step(x), sf::matmul(x, sf::Tensor(w.value())));
  const sf::Graph& graph = step.graph();
  ASSERT_EQ(graph.inputs().size(), 2u);  // x and the captured w
  EXPECT_EQ(graph.inputs()[1]->type().to_string(), "f32[8,12]");
  // Replacing the captured tensor retraces; the same tensor does not.
  step(x);
  EXPECT_EQ(step.stats().traces, 1);
  w = sf::randn({8, 12}, 7);
  expect_close(step(x), sf::matmul(x, w));
  EXPECT_EQ(step.stats().traces, 2);
}

TEST(Compile, ConstantsUsedByTracedOpsEnterTheGraph) {
  auto step = sf::compile([](sf::Tensor x) {
    const sf::Tensor mask = sf::triu(sf::ones({4, 4}), 1);
    return x + mask * -1e9;
  });
  const sf::Tensor x = sf::randn({4, 4}, 0);
  const sf::Tensor y = step(x);
  const std::string text = step.graph_text();
  EXPECT_TRUE(contains(text, "aten::ones([4, 4]")) << text;
  EXPECT_TRUE(contains(text, "aten::triu(")) << text;
  expect_close(y, x + sf::triu(sf::ones({4, 4}), 1) * -1e9);
  step(x);
  EXPECT_EQ(step.stats().cache_hits, 1);
}

TEST(Compile, OutputsAsTupleAndVector) {
  auto pair = sf::compile([](sf::Tensor a, sf::Tensor b) { return std::tuple{a + b, a * b}; });
  const auto [sum, product] = pair(sf::ones({2}), sf::full({2}, 3));
  EXPECT_EQ(sum.to_floats(), (std::vector<float>{4, 4}));
  EXPECT_EQ(product.to_floats(), (std::vector<float>{3, 3}));
  auto many = sf::compile([](sf::Tensor a) { return std::vector<sf::Tensor>{a, sf::neg(a), a}; });
  const std::vector<sf::Tensor> outs = many(sf::ones({1}));
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_EQ(outs[1].to_floats(), (std::vector<float>{-1}));
}

TEST(Compile, TracesShapeOnlyInputsWithoutRunning) {
  const sf::Tensor w = sf::Tensor::meta(sf::DType::kF32, {4096, 4096});
  auto step = sf::compile([&](sf::Tensor x) { return sf::silu(sf::matmul(x, w)); });
  const sf::Graph& graph = step.trace(sf::Tensor::meta(sf::DType::kF32, {8, 4096}));
  EXPECT_EQ(graph.nodes().size(), 2u);
  EXPECT_THROW(step(sf::Tensor::meta(sf::DType::kF32, {8, 4096})), sf::Error);
}

// Shape-only tensors made inside the function (a 7B layer's weights, say)
// become graph inputs, annotated or not, also after an op on them.
TEST(Compile, TracesShapeOnlyTensorsMadeInsideTheFunction) {
  const sf::Mesh mesh({0, 1, 2, 3}, {4}, {"model"});
  auto step = sf::compile([&](sf::Tensor x) {
    const sf::Tensor w = sf::mark_sharding(sf::Tensor::meta(sf::DType::kF32, {64, 32}) * 1, mesh, {"model", sf::none});
    const sf::Tensor b = sf::Tensor::meta(sf::DType::kF32, {64});
    return sf::linear(x, w, b);
  });
  const sf::Graph& graph = step.trace(sf::Tensor::meta(sf::DType::kF32, {8, 32}));
  EXPECT_EQ(graph.inputs().size(), 3u) << sf::print_graph(graph);
  ASSERT_EQ(graph.nodes().size(), 2u) << sf::print_graph(graph);
  EXPECT_EQ(graph.nodes()[0]->op().full_name(), "xla::dynamo_mark_sharding");
  EXPECT_EQ(graph.nodes()[1]->op().full_name(), "aten::linear");
}

TEST(Compile, SavedGraphRunsFromTheCli) {
  auto step = sf::compile([](sf::Tensor x) { return sf::softmax(x, -1); });
  step(sf::randn({2, 3}, 0));
  const std::string path = testing::TempDir() + "softmax.ir";
  step.save_graph(path);
  EXPECT_EQ(sf::print_graph(sf::parse_graph(step.graph_text())), step.graph_text());
}

}  // namespace

namespace {

// GuardMode::kSignature: a hit does not run the function again; new input
// types, a replaced or re-laid-out captured tensor make a new trace.
TEST(Compile, SignatureGuardsSkipTheReplay) {
  int body_runs = 0;
  auto w = std::make_shared<sf::Tensor>(sf::randn({4, 4}, 1));
  sf::CompiledFunction step(
      [&](const std::vector<sf::Tensor>& in) {
        ++body_runs;
        return std::vector<sf::Tensor>{sf::matmul(in[0], *w) + 1};
      },
      "step", sf::GuardMode::kSignature);
  const sf::Tensor x = sf::randn({2, 4}, 2);
  const std::vector<float> first = step.call({x})[0].to_floats();
  EXPECT_EQ(body_runs, 1);
  EXPECT_EQ(step.call({x})[0].to_floats(), first);
  EXPECT_EQ(step.call({sf::randn({2, 4}, 3)})[0].numel(), 8);
  EXPECT_EQ(body_runs, 1);
  EXPECT_EQ(step.stats().cache_hits, 2);

  step.call({sf::randn({3, 4}, 2)});  // another shape
  EXPECT_EQ(body_runs, 2);
  *w = sf::randn({4, 4}, 5);  // the traced tensor is gone: trace again, with the new one
  const std::vector<float> with_new = step.call({x})[0].to_floats();
  EXPECT_EQ(body_runs, 3);
  EXPECT_NE(with_new, first);
  EXPECT_EQ(step.stats().traces, 3);
}

// A step that writes rows of its input 0 at the positions in input 1 with
// the rows of input 2 (a KV cache update).
sf::CompiledFunction row_update_step(const std::string& name) {
  return sf::CompiledFunction(
      [](const std::vector<sf::Tensor>& in) {
        return std::vector<sf::Tensor>{sf::index_copy(in[0], 0, in[1], in[2])};
      },
      name);
}

}  // namespace

// donate_inputs: a sole handle moved into the call gives its buffer to the
// step (the update happens in place, and the old handle is used up); a
// shared handle keeps functional semantics.
TEST(Compile, DonatedInputIsUpdatedInPlaceAndUsedUp) {
  sf::CompiledFunction step = row_update_step("cache_update");
  step.donate_inputs({0});
  const sf::Tensor index = sf::Tensor::from_ints(std::vector<int64_t>{1}, {1});
  const sf::Tensor row = sf::Tensor::from_floats(std::vector<float>{7, 8}, {1, 2});

  sf::Tensor cache = sf::zeros({3, 2});
  const float* before = cache.value().data_as<float>();
  std::vector<sf::Tensor> inputs{std::move(cache), index, row};
  sf::Tensor updated = step.call(inputs)[0];
  EXPECT_EQ(updated.to_floats(), (std::vector<float>{0, 0, 7, 8, 0, 0}));
  EXPECT_EQ(updated.value().data_as<float>(), before);  // the same buffer: no copy
  try {
    inputs[0].to_floats();
    ADD_FAILURE() << "a donated tensor was readable";
  } catch (const sf::Error& error) {
    EXPECT_NE(std::string(error.what()).find("donated to the compiled function 'cache_update'"), std::string::npos)
        << error.what();
  }

  // A handle the caller keeps is not donated: it stays as it was.
  const sf::Tensor kept = sf::zeros({3, 2});
  const sf::Tensor result = step.call({kept, index, row})[0];
  EXPECT_EQ(kept.to_floats(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(result.to_floats(), (std::vector<float>{0, 0, 7, 8, 0, 0}));
}

// Another library's memory (a torch tensor): a donated read-only view is
// never written (the step copies it), a donated writable view is updated
// where it lies, as the torch bridge's one-device KV caches are.
TEST(Compile, DonatedBorrowedMemoryIsWrittenOnlyWhenWritable) {
  sf::CompiledFunction step = row_update_step("borrowed_cache_update");
  step.donate_inputs({0});
  const sf::Tensor index = sf::Tensor::from_ints(std::vector<int64_t>{0}, {1});
  const sf::Tensor row = sf::Tensor::from_floats(std::vector<float>{7, 8}, {1, 2});
  for (const auto access : {sf::DenseTensor::Access::kReadOnly, sf::DenseTensor::Access::kWritable}) {
    std::vector<float> memory(4, 0.0f);
    std::shared_ptr<std::byte> owner(reinterpret_cast<std::byte*>(memory.data()), [](std::byte*) {});
    std::vector<sf::Tensor> inputs{
        sf::Tensor(sf::DenseTensor::borrow(sf::DType::kF32, {2, 2}, std::move(owner), access)), index, row};
    const sf::Tensor updated = step.call(inputs)[0];
    EXPECT_EQ(updated.to_floats(), (std::vector<float>{7, 8, 0, 0}));
    const bool writable = access == sf::DenseTensor::Access::kWritable;
    EXPECT_EQ(updated.value().data_as<float>() == memory.data(), writable);
    EXPECT_EQ(memory, writable ? (std::vector<float>{7, 8, 0, 0}) : std::vector<float>(4, 0.0f));
  }
}

// Views on the way (a reshape here; transposes of size-1 dims in LLaMA's
// cache updates) run without a kernel and pass the donated buffer on, so the
// update still happens in place; a kept handle still sees no change.
TEST(Compile, DonatedInputThroughAViewIsUpdatedInPlace) {
  sf::CompiledFunction step(
      [](const std::vector<sf::Tensor>& in) {
        const sf::Tensor rows = in[0].reshape({3, 1, 2}).transpose(0, 1).squeeze(0);
        return std::vector<sf::Tensor>{sf::index_copy(rows, 0, in[1], in[2]).reshape({6})};
      },
      "flat_cache_update");
  step.donate_inputs({0});
  const sf::Tensor index = sf::Tensor::from_ints(std::vector<int64_t>{2}, {1});
  const sf::Tensor row = sf::Tensor::from_floats(std::vector<float>{7, 8}, {1, 2});

  sf::Tensor cache = sf::zeros({6});
  const float* before = cache.value().data_as<float>();
  std::vector<sf::Tensor> inputs{std::move(cache), index, row};
  const sf::Tensor updated = step.call(inputs)[0];
  EXPECT_EQ(updated.to_floats(), (std::vector<float>{0, 0, 0, 0, 7, 8}));
  EXPECT_EQ(updated.value().data_as<float>(), before);

  const sf::Tensor kept = sf::zeros({6});
  EXPECT_EQ(step.call({kept, index, row})[0].to_floats(), (std::vector<float>{0, 0, 0, 0, 7, 8}));
  EXPECT_EQ(kept.to_floats(), std::vector<float>(6, 0.0f));
}
