// Sharding propagation on annotated graphs: the shardings every value gets,
// and where they came from.
#include "shardflow/propagation/propagation.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/ops.h"

namespace sf = shardflow;

namespace {

sf::Graph parse(const char* text) {
  sf::ops::register_all_ops();
  sf::Graph graph = sf::parse_graph(text);
  sf::verify_graph(graph);
  return graph;
}

std::string readable(const sf::PropagationResult& result, const sf::Graph& graph, const char* name) {
  return result.sharding(graph.find_value(name)).to_readable();
}

constexpr const char* kMeshArgs = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('data', 'model')")M";

TEST(Propagation, MegatronMlp) {
  const std::string text = std::string(R"IR(func @mlp(%x: f32[8,16], %w1: f32[16,64], %w2: f32[64,16]) -> (f32[8,16]) {
  %a = xla::dynamo_mark_sharding(%w1, )IR") + kMeshArgs + R"IR(, "(None, 'model')") : f32[16,64]
  %b = xla::dynamo_mark_sharding(%w2, )IR" + kMeshArgs + R"IR(, "('model', None)") : f32[64,16]
  %h = aten::matmul(%x, %a) : f32[8,64]
  %g = aten::gelu(%h) : f32[8,64]
  %y = aten::matmul(%g, %b) : f32[8,16]
  return %y
}
)IR";
  const sf::Graph graph = parse(text.c_str());
  const sf::PropagationResult result = sf::propagate_shardings(graph);
  EXPECT_EQ(readable(result, graph, "h"), "[{},{model}]");
  EXPECT_EQ(readable(result, graph, "g"), "[{},{model}]");
  EXPECT_EQ(readable(result, graph, "y"), "[{},{}]");
  EXPECT_EQ(readable(result, graph, "x"), "[{},{}]");
  // The annotated operand of the annotation takes its sharding backward.
  EXPECT_EQ(readable(result, graph, "w1"), "[{},{model}]");
  EXPECT_EQ(result.origin(graph.find_value("g"), 1).describe(),
            "the annotation at %a through %h aten::matmul, %g aten::gelu");
}

TEST(Propagation, TwoDimensionalFsdpAndTensorParallel) {
  const std::string text = std::string(R"IR(func @mlp(%x: f32[8,16], %win: f32[16,32], %wout: f32[32,16]) -> (f32[8,16]) {
  %in = xla::dynamo_mark_sharding(%x, )IR") + kMeshArgs + R"IR(, "('data', 'model')") : f32[8,16]
  %wi = xla::dynamo_mark_sharding(%win, )IR" + kMeshArgs + R"IR(, "('data', 'model')") : f32[16,32]
  %wo = xla::dynamo_mark_sharding(%wout, )IR" + kMeshArgs + R"IR(, "('model', 'data')") : f32[32,16]
  %h = aten::matmul(%in, %wi) : f32[8,32]
  %o = aten::matmul(%h, %wo) : f32[8,16]
  %out = xla::dynamo_mark_sharding(%o, )IR" + kMeshArgs + R"IR(, "('data', 'model')") : f32[8,16]
  return %out
}
)IR";
  const sf::Graph graph = parse(text.c_str());
  const sf::PropagationResult result = sf::propagate_shardings(graph);
  EXPECT_EQ(readable(result, graph, "h"), "[{data},{model}]");  // B over data, F over model
}

TEST(Propagation, KeepsUnevenShardingsAndFlowsThroughReshapes) {
  const sf::Graph graph = parse(R"IR(func @f(%x: f32[17,6]) -> (f32[17,2,3]) {
  %a = xla::dynamo_mark_sharding(%x, [0, 1, 2, 3, 4, 5, 6, 7], "(8,)", "('d',)", "('d', None)") : f32[17,6]
  %b = aten::exp(%a) : f32[17,6]
  %c = aten::reshape(%b, [17, 2, 3]) : f32[17,2,3]
  return %c
}
)IR");
  const sf::PropagationResult result = sf::propagate_shardings(graph);
  EXPECT_EQ(readable(result, graph, "b"), "[{d},{}]");
  EXPECT_EQ(readable(result, graph, "c"), "[{d},{},{}]");
}

TEST(Propagation, NeedReplicationFactorsDoNotPropagate) {
  const sf::Graph graph = parse(R"IR(func @f(%x: f32[8,6]) -> (f32[8,6]) {
  %a = xla::dynamo_mark_sharding(%x, [0, 1], "(2,)", "('d',)", "(None, 'd')") : f32[8,6]
  %b = aten::softmax.int(%a, 1) : f32[8,6]
  return %b
}
)IR");
  const sf::PropagationResult result = sf::propagate_shardings(graph);
  EXPECT_EQ(readable(result, graph, "b"), "[{},{}]");
}

TEST(Propagation, InputShardingsAreKeptAndMeshesMustAgree) {
  const sf::Graph graph = parse(R"IR(func @f(%x: f32[8,6]) -> (f32[8,6]) {
  %a = aten::relu(%x) : f32[8,6]
  return %a
}
)IR");
  auto mesh = std::make_shared<const sf::Mesh>(std::vector<int64_t>{0, 1}, std::vector<int64_t>{2},
                                               std::vector<std::string>{"d"});
  const std::vector<std::optional<sf::Sharding>> inputs{sf::Sharding::from_spec(mesh, {"d", sf::none})};
  const sf::PropagationResult result = sf::propagate_shardings(graph, inputs);
  EXPECT_EQ(readable(result, graph, "a"), "[{d},{}]");
  EXPECT_EQ(result.origin(graph.find_value("a"), 0).describe(), "the sharding of input %x through %a aten::relu");
  EXPECT_TRUE(result.is_annotated(graph.find_value("x")));
  EXPECT_FALSE(result.is_annotated(graph.find_value("a")));
}

// A table annotated over its vocabulary is looked up in its shards (the
// partitioner does so when the table is much larger than the rows). Open
// token ids then stay whole: the batch axis the rows get from a later
// annotation would only make the lookup gather them back.
TEST(Propagation, LookupsInAnAnnotatedTableKeepOpenIndicesWhole) {
  const sf::Graph graph = parse(R"IR(func @f(%w: f32[1000,64], %tokens: i64[4,8]) -> (f32[4,8,64]) {
  %t = xla::dynamo_mark_sharding(%w, [0, 1, 2, 3], "(4,)", "('m',)", "('m', None)") : f32[1000,64]
  %e = aten::embedding(%t, %tokens) : f32[4,8,64]
  %s = aten::mul.Scalar(%e, 2.0) : f32[4,8,64]
  %a = xla::dynamo_mark_sharding(%s, [0, 1, 2, 3], "(4,)", "('m',)", "('m', None, None)") : f32[4,8,64]
  return %a
}
)IR");
  const sf::PropagationResult result = sf::propagate_shardings(graph);
  EXPECT_EQ(readable(result, graph, "tokens"), "[{},{}]");
  EXPECT_EQ(readable(result, graph, "e"), "[{m},{},{}]");  // where the partial rows are scattered to
}

// Annotated ids keep their batch split on the table's axis: the rows come
// out split over the batch (data parallel), not as partial sums.
TEST(Propagation, AnnotatedIndicesKeepTheirSplitOverATableOnTheSameAxis) {
  const sf::Graph graph = parse(R"IR(func @f(%w: f32[1000,64], %tokens: i64[4,8]) -> (f32[4,8,64]) {
  %t = xla::dynamo_mark_sharding(%w, [0, 1, 2, 3], "(4,)", "('m',)", "('m', None)") : f32[1000,64]
  %k = xla::dynamo_mark_sharding(%tokens, [0, 1, 2, 3], "(4,)", "('m',)", "('m', None)") : i64[4,8]
  %e = aten::embedding(%t, %k) : f32[4,8,64]
  return %e
}
)IR");
  const sf::PropagationResult result = sf::propagate_shardings(graph);
  EXPECT_EQ(readable(result, graph, "e"), "[{m},{},{}]");
  EXPECT_EQ(result.origin(graph.find_value("e"), 0).describe(), "the annotation at %k through %e aten::embedding");
}

}  // namespace

namespace {

// A mesh built without names inside a compiled step (PyTorch/XLA's
// `Mesh(torch.arange(8), (2, 4))`) is the named mesh of the weights: the
// shardings are device-based, and the result reads with the names.
TEST(Propagation, MeshesThatDifferOnlyInNamesAreOneMesh) {
  const std::string text = std::string(R"IR(func @f(%x: f32[8,16], %w: f32[16,64]) -> (f32[8,64]) {
  %a = xla::dynamo_mark_sharding(%w, )IR") + kMeshArgs + R"IR(, "(None, 'model')") : f32[16,64]
  %h = aten::matmul(%x, %a) : f32[8,64]
  %o = xla::dynamo_mark_sharding(%h, [0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "None", "(0, 1)") : f32[8,64]
  return %o
}
)IR";
  const sf::Graph graph = parse(text.c_str());
  const sf::PropagationResult result = sf::propagate_shardings(graph);
  EXPECT_EQ(readable(result, graph, "o"), "[{data},{model}]");
  EXPECT_TRUE(result.mesh()->has_axis_names());
}

TEST(Propagation, MeshesOfOtherDevicesOrShapesAreAnError) {
  for (const char* other : {R"M([7, 6, 5, 4, 3, 2, 1, 0], "(2, 4)")M", R"M([0, 1, 2, 3, 4, 5, 6, 7], "(4, 2)")M"}) {
    const std::string text = std::string(R"IR(func @f(%x: f32[8,16]) -> (f32[8,16]) {
  %a = xla::dynamo_mark_sharding(%x, )IR") + kMeshArgs + R"IR(, "('data', None)") : f32[8,16]
  %b = xla::dynamo_mark_sharding(%a, )IR" + std::string(other) +
                             R"IR(, "None", "(0, None)") : f32[8,16]
  return %b
}
)IR";
    const sf::Graph graph = parse(text.c_str());
    try {
      sf::propagate_shardings(graph);
      ADD_FAILURE() << "no error for " << other;
    } catch (const sf::Error& e) {
      EXPECT_NE(std::string(e.what()).find("a graph is partitioned over one mesh"), std::string::npos) << e.what();
    }
  }
}

// %a annotated over 'd', then `ops` adds %yk = %xk + %x(k+1) (with %x0 = %a):
// a sharding that has to go from each add to the next. `zigzag` puts the
// adds in the order 1, 0, 3, 2, ...: the path then turns back at every add,
// and each round of forward and backward sweeps carries it over two adds.
std::string chain_of_adds(int ops, bool zigzag) {
  std::string text = "func @chain(%x0: f32[8]";
  for (int k = 1; k <= ops; ++k) text += fmt::format(", %x{}: f32[8]", k);
  text += ") -> (f32[8]) {\n"
          "  %a = xla::dynamo_mark_sharding(%x0, [0, 1], \"(2,)\", \"('d',)\", \"('d',)\") : f32[8]\n";
  for (int n = 0; n < ops; ++n) {
    const int k = zigzag ? n ^ 1 : n;
    const std::string lhs = k == 0 ? "a" : fmt::format("x{}", k);
    text += fmt::format("  %y{} = aten::add.Tensor(%{}, %x{}) : f32[8]\n", k, lhs, k + 1);
  }
  return text + "  return %y0\n}\n";
}

TEST(Propagation, StoppingAtTheRoundLimitIsAWarning) {
  // In graph order one forward sweep carries the sharding to the end.
  const sf::Graph in_order = parse(chain_of_adds(300, false).c_str());
  const sf::PropagationResult converged = sf::propagate_shardings(in_order);
  EXPECT_EQ(readable(converged, in_order, "x300"), "[{d}]");
  EXPECT_TRUE(converged.warnings().empty());

  // Zig-zag: 64 rounds over pass-through ops and 64 over all ops carry it
  // over 2 * 128 adds, to %x256; each stage stops while still changing, and
  // names the result of the add its last round reached.
  const sf::Graph zigzag = parse(chain_of_adds(300, true).c_str());
  const sf::PropagationResult stopped = sf::propagate_shardings(zigzag);
  EXPECT_EQ(readable(stopped, zigzag, "x256"), "[{d}]");
  EXPECT_EQ(readable(stopped, zigzag, "x257"), "[{}]");
  ASSERT_EQ(stopped.warnings().size(), 2u);
  EXPECT_EQ(stopped.warnings()[0],
            "sharding propagation over pass-through ops stopped after 64 rounds while still changing (%y127 "
            "changed in the last round); shardings may be incomplete, annotate more values to fix them");
  EXPECT_NE(stopped.warnings()[1].find("over all ops stopped after 64 rounds while still changing "
                                       "(%y255 changed in the last round)"),
            std::string::npos)
      << stopped.warnings()[1];
}

}  // namespace

// A chain of ops after one annotation: each value's origin shares the path
// of the value before it (memory linear in the chain, where a copy per value
// needed gigabytes at 30k ops), releasing it does not recurse once per op,
// and its description names the first and last ops only.
TEST(Propagation, OriginsOfALongChainAreSharedAndDescribedBriefly) {
  constexpr int kOps = 60000;
  std::string text = std::string("func @chain(%x: f32[8,16]) -> (f32[8,16]) {\n  %v0 = xla::dynamo_mark_sharding(%x, ") +
                     kMeshArgs + ", \"('data', None)\") : f32[8,16]\n";
  for (int i = 1; i <= kOps; ++i) text += "  %v" + std::to_string(i) + " = aten::relu(%v" + std::to_string(i - 1) + ") : f32[8,16]\n";
  text += "  return %v" + std::to_string(kOps) + "\n}\n";
  const sf::Graph graph = parse(text.c_str());
  {
    const sf::PropagationResult result = sf::propagate_shardings(graph);
    const sf::ShardingOrigin& last = result.origin(graph.find_value("v" + std::to_string(kOps)), 0);
    ASSERT_EQ(last.through().size(), static_cast<std::size_t>(kOps));
    EXPECT_EQ(last.last->previous.get(), result.origin(graph.find_value("v" + std::to_string(kOps - 1)), 0).last.get());
    EXPECT_EQ(last.describe(),
              "the annotation at %v0 through %v1 aten::relu, %v2 aten::relu, %v3 aten::relu, %v4 aten::relu, "
              "(59992 more ops), %v59997 aten::relu, %v59998 aten::relu, %v59999 aten::relu, %v60000 aten::relu");
  }  // the result and its 60k-step chains are released here
}
