// Reference patterns (spmd-anchors §9): the exact collectives the partitioner
// inserts for well-known shardings.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "shardflow/ir/text.h"
#include "shardflow/ops/ops.h"
#include "shardflow/partition/program.h"
#include "shardflow/shardflow.h"

namespace sf = shardflow;

namespace {

struct Partitioned {
  sf::Graph graph;
  sf::PropagationResult shardings;
  sf::PartitionedProgram program;
};

Partitioned partition(const std::string& text) {
  sf::ops::register_all_ops();
  sf::Graph graph = sf::parse_graph(text);
  sf::verify_graph(graph);
  sf::PropagationResult shardings = sf::propagate_shardings(graph);
  sf::PartitionedProgram program = sf::partition_graph(graph, shardings);
  return {std::move(graph), std::move(shardings), std::move(program)};
}

// "all-reduce over 'model'" for each collective, in order.
std::vector<std::string> summary(const Partitioned& p) {
  std::vector<std::string> out;
  for (const sf::CollectiveInfo& info : p.program.collectives) {
    std::string axes;
    for (std::size_t i = 0; i < info.axes.size(); ++i) {
      axes += (i > 0 ? "," : "") + p.program.mesh->axis_label(info.axes[i]);
    }
    out.push_back(std::string(sf::to_string(info.kind)) + " " + axes);
  }
  return out;
}

std::string annotate(const std::string& value, const std::string& spec, const std::string& type,
                     const std::string& mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('data', 'model')")M") {
  return "xla::dynamo_mark_sharding(%" + value + ", " + mesh + ", \"" + spec + "\") : " + type;
}

TEST(Patterns, MegatronMlpIsOneAllReduce) {
  const std::string text = "func @mlp(%x: f32[8,16], %w1: f32[16,64], %w2: f32[64,16]) -> (f32[8,16]) {\n"
                           "  %a = " + annotate("w1", "(None, 'model')", "f32[16,64]") + "\n"
                           "  %b = " + annotate("w2", "('model', None)", "f32[64,16]") + "\n"
                           "  %h = aten::matmul(%x, %a) : f32[8,64]\n"
                           "  %g = aten::gelu(%h) : f32[8,64]\n"
                           "  %y = aten::matmul(%g, %b) : f32[8,16]\n"
                           "  return %y\n}\n";
  const Partitioned p = partition(text);
  EXPECT_EQ(summary(p), (std::vector<std::string>{"all-reduce model"})) << p.program.to_string(p.graph);
  EXPECT_EQ(p.program.collectives[0].describe(*p.program.mesh),
            "all-reduce over 'model' (512 B/device): %y aten::matmul contracts dim 1, sharded on 'model' by "
            "the annotation at %a through %h aten::matmul, %g aten::gelu; output 0 needs whole values");
}

}  // namespace

namespace {

// Partitions a traced function of one input (shape-only tensors: nothing runs).
template <class F>
Partitioned partition_traced(F fn, const sf::Tensor& input) {
  auto compiled = sf::compile(fn);
  const sf::Graph& traced = compiled.trace(input);
  return partition(sf::print_graph(traced));
}

sf::Tensor meta(sf::Shape shape) { return sf::Tensor::meta(sf::DType::kF32, std::move(shape)); }

TEST(Patterns, TransformerLayerIsTwoAllReduces) {
  const sf::Mesh mesh({0, 1, 2, 3, 4, 5, 6, 7}, {2, 4}, {"data", "model"});
  const int64_t b = 2, t = 4, d = 16, heads = 4, hd = 4, ffn = 32;
  const sf::Tensor wq = meta({d, d}), wk = meta({d, d}), wv = meta({d, d}), wo = meta({d, d});
  const sf::Tensor w1 = meta({d, ffn}), w2 = meta({ffn, d});
  const auto layer = [&](sf::Tensor x) {
    const auto column = [&](const sf::Tensor& w) { return sf::mark_sharding(w * 1, mesh, {sf::none, "model"}); };
    const auto row = [&](const sf::Tensor& w) { return sf::mark_sharding(w * 1, mesh, {"model", sf::none}); };
    x = sf::mark_sharding(x, mesh, {"data", sf::none, sf::none});
    const auto split = [&](const sf::Tensor& y) { return y.reshape({b, t, heads, hd}).transpose(1, 2); };
    const sf::Tensor q = split(sf::matmul(x, column(wq)));
    const sf::Tensor k = split(sf::matmul(x, column(wk)));
    const sf::Tensor v = split(sf::matmul(x, column(wv)));
    const sf::Tensor probs = sf::softmax(sf::matmul(q, k.transpose(-2, -1)) * 0.5, -1);
    const sf::Tensor attention = sf::matmul(probs, v).transpose(1, 2).reshape({b, t, d});
    const sf::Tensor x1 = x + sf::matmul(attention, row(wo));
    return x1 + sf::matmul(sf::gelu(sf::matmul(x1, column(w1))), row(w2));
  };
  const Partitioned p = partition_traced(layer, meta({b, t, d}));
  EXPECT_EQ(summary(p), (std::vector<std::string>{"all-reduce model", "all-reduce model"}))
      << sf::print_with_shardings(p.graph, p.shardings) << p.program.to_string(p.graph);
}

// The same layer as GPT-2 writes it: linear layers with biases. A row-parallel
// layer's bias is added by one device of each 'model' group, so the
// Megatron count holds (before, the bias kept the contraction whole).
TEST(Patterns, TransformerLayerWithBiasesIsTwoAllReduces) {
  const sf::Mesh mesh({0, 1, 2, 3, 4, 5, 6, 7}, {2, 4}, {"data", "model"});
  const int64_t b = 2, t = 4, d = 16, heads = 4, hd = 4, ffn = 32;
  const auto layer = [&](sf::Tensor x) {
    // Weights stored [out, in], as linear takes them.
    const auto column = [&](int64_t out, int64_t in, const sf::Tensor& y) {
      return sf::linear(y, sf::mark_sharding(meta({out, in}) * 1, mesh, {"model", sf::none}), meta({out}) * 1);
    };
    const auto row = [&](int64_t out, int64_t in, const sf::Tensor& y) {
      return sf::linear(y, sf::mark_sharding(meta({out, in}) * 1, mesh, {sf::none, "model"}), meta({out}) * 1);
    };
    x = sf::mark_sharding(x, mesh, {"data", sf::none, sf::none});
    const auto split = [&](const sf::Tensor& y) { return y.reshape({b, t, heads, hd}).transpose(1, 2); };
    const sf::Tensor q = split(column(d, d, x)), k = split(column(d, d, x)), v = split(column(d, d, x));
    const sf::Tensor probs = sf::softmax(sf::matmul(q, k.transpose(-2, -1)) * 0.5, -1);
    const sf::Tensor attention = sf::matmul(probs, v).transpose(1, 2).reshape({b, t, d});
    const sf::Tensor x1 = x + row(d, d, attention);
    return x1 + row(d, ffn, sf::gelu(column(ffn, d, x1)));
  };
  const Partitioned p = partition_traced(layer, meta({b, t, d}));
  EXPECT_EQ(summary(p), (std::vector<std::string>{"all-reduce model", "all-reduce model"}))
      << sf::print_with_shardings(p.graph, p.shardings) << p.program.to_string(p.graph);
}

TEST(Patterns, TwoDimensionalFsdpAndTensorParallelMlp) {
  // In[B_data, D_model], W_in[D_data, F_model], W_out[F_model, D_data] (here
  // X = data, Y = model): forward = all-gather_Y(In), all-gather_X(W_in),
  // all-gather_X(W_out), reduce-scatter_Y(Out).
  const std::string text = "func @mlp(%x: f32[8,16], %win: f32[16,32], %wout: f32[32,16]) -> (f32[8,16]) {\n"
                           "  %in = " + annotate("x", "('data', 'model')", "f32[8,16]") + "\n"
                           "  %wi = " + annotate("win", "('data', 'model')", "f32[16,32]") + "\n"
                           "  %wo = " + annotate("wout", "('model', 'data')", "f32[32,16]") + "\n"
                           "  %h = aten::matmul(%in, %wi) : f32[8,32]\n"
                           "  %o = aten::matmul(%h, %wo) : f32[8,16]\n"
                           "  %out = " + annotate("o", "('data', 'model')", "f32[8,16]") + "\n"
                           "  return %out\n}\n";
  const Partitioned p = partition(text);
  EXPECT_EQ(summary(p), (std::vector<std::string>{"all-gather model", "all-gather data", "all-gather data",
                                                  "reduce-scatter model"}))
      << p.program.to_string(p.graph);
}

struct ReshardRow {
  const char* name;
  const char* mesh_shape;
  const char* axis_names;
  const char* from;
  const char* to;
  std::vector<std::string> expected;
};

TEST(Patterns, ReshardTable) {
  const ReshardRow rows[] = {
      {"gather_minor_axes", "(2, 2, 2)", "('x', 'y', 'z')", "(('x', 'y', 'z'), None)", "('x', None)",
       {"all-gather y,z"}},
      {"move_between_dims", "(8,)", "('x',)", "('x', None)", "(None, 'x')", {"all-to-all x"}},
      {"to_replicated", "(8,)", "('x',)", "('x', None)", "(None, None)", {"all-gather x"}},
      {"replicated_to_sharded", "(8,)", "('x',)", "(None, None)", "(None, 'x')", {}},
      {"add_minor_axis", "(2, 4)", "('x', 'y')", "('x', None)", "(('x', 'y'), None)", {}},
      {"same_sharding", "(2, 4)", "('x', 'y')", "('x', 'y')", "('x', 'y')", {}},
      {"swap_dims_2d", "(2, 4)", "('x', 'y')", "('x', 'y')", "('x', None)", {"all-gather y"}},
  };
  for (const ReshardRow& row : rows) {
    const std::string mesh = std::string("[0, 1, 2, 3, 4, 5, 6, 7], \"") + row.mesh_shape + "\", \"" + row.axis_names + "\"";
    const std::string text = "func @f(%x: f32[8,16]) -> (f32[8,16]) {\n"
                             "  %a = " + annotate("x", row.from, "f32[8,16]", mesh) + "\n"
                             "  %b = " + annotate("a", row.to, "f32[8,16]", mesh) + "\n"
                             "  return %b\n}\n";
    const Partitioned p = partition(text);
    EXPECT_EQ(summary(p), row.expected) << row.name << "\n" << p.program.to_string(p.graph);
  }
}

TEST(Patterns, ContractingShardedDimsOfBothOperands) {
  // lhs [{x},{y}] . rhs [{y},{x}] -> [{x},{}]: rhs loses 'x' (all-gather),
  // the dot contracts over 'y', then an all-reduce over 'y'.
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('x', 'y')")M";
  const std::string text = "func @f(%a: f32[8,16], %b: f32[16,8]) -> (f32[8,8]) {\n"
                           "  %l = " + annotate("a", "('x', 'y')", "f32[8,16]", mesh) + "\n"
                           "  %r = " + annotate("b", "('y', 'x')", "f32[16,8]", mesh) + "\n"
                           "  %d = aten::matmul(%l, %r) : f32[8,8]\n"
                           "  %o = " + annotate("d", "('x', None)", "f32[8,8]", mesh) + "\n"
                           "  return %o\n}\n";
  const Partitioned p = partition(text);
  EXPECT_EQ(summary(p), (std::vector<std::string>{"all-gather x", "all-reduce y"})) << p.program.to_string(p.graph);
}

TEST(Patterns, SumOverAShardedDimIsAnAllReduce) {
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('X', 'Y')")M";
  const std::string text = "func @f(%x: f32[8,16]) -> (f32[16]) {\n"
                           "  %a = " + annotate("x", "('X', 'Y')", "f32[8,16]", mesh) + "\n"
                           "  %s = aten::sum.dim_IntList(%a, [0]) : f32[16]\n"
                           "  return %s\n}\n";
  const Partitioned p = partition(text);
  EXPECT_EQ(summary(p), (std::vector<std::string>{"all-reduce X"})) << p.program.to_string(p.graph);
}

TEST(Patterns, ReshapeSplittingAShardedDimNeedsNoCollective) {
  // The major part of a split dim keeps the axis: [8] on x=2 -> [2,4] is
  // [{x},{}], and merging back gives [{x}] again.
  const std::string mesh = R"M([0, 1], "(2,)", "('x',)")M";
  const std::string text = "func @f(%x: f32[8]) -> (f32[2,4], f32[8]) {\n"
                           "  %a = " + annotate("x", "('x',)", "f32[8]", mesh) + "\n"
                           "  %r = aten::reshape(%a, [2, 4]) : f32[2,4]\n"
                           "  %e = aten::exp(%r) : f32[2,4]\n"
                           "  %m = aten::reshape(%e, [8]) : f32[8]\n"
                           "  return %e, %m\n}\n";
  const Partitioned p = partition(text);
  EXPECT_EQ(summary(p), std::vector<std::string>{}) << p.program.to_string(p.graph);
  EXPECT_EQ(p.shardings.sharding(p.graph.find_value("r")).to_readable(), "[{x},{}]");
  EXPECT_EQ(p.shardings.sharding(p.graph.find_value("m")).to_readable(), "[{x}]");
}

}  // namespace

namespace {

// %x annotated `from`, through a relu, annotated `to`: one reshard of %r
// to the annotation at %b.
std::string relu_resharded(const std::string& mesh, const std::string& type, const std::string& from,
                           const std::string& to) {
  return "func @f(%x: " + type + ") -> (" + type + ") {\n"
         "  %a = " + annotate("x", from, type, mesh) + "\n"
         "  %r = aten::relu(%a) : " + type + "\n"
         "  %b = " + annotate("r", to, type, mesh) + "\n"
         "  return %b\n}\n";
}

// The same tiles on other devices move in one collective-permute: axes
// swapped between dims, reordered within a dim, rotated over three dims.
// A move it cannot make (a tuple of axes from one dim to another in
// another order) gathers, and says so.
TEST(Patterns, ReassignedTilesMoveInOneCollectivePermute) {
  const std::string mesh4 = R"M([0, 1, 2, 3], "(2, 2)", "('a', 'b')")M";
  const std::string mesh8 = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 2, 2)", "('a', 'b', 'c')")M";
  const std::vector<std::string> one_permute_of_ab{"collective-permute a,b"};
  Partitioned swap = partition(relu_resharded(mesh4, "f32[8,6]", "('a', 'b')", "('b', 'a')"));
  EXPECT_EQ(summary(swap), one_permute_of_ab) << swap.program.to_string(swap.graph);
  EXPECT_TRUE(swap.program.warnings.empty());
  Partitioned reorder = partition(relu_resharded(mesh4, "f32[8,6]", "(('a', 'b'), None)", "(('b', 'a'), None)"));
  EXPECT_EQ(summary(reorder), one_permute_of_ab) << reorder.program.to_string(reorder.graph);
  Partitioned uneven = partition(relu_resharded(mesh4, "f32[7,6]", "(('a', 'b'), None)", "(('b', 'a'), None)"));
  EXPECT_EQ(summary(uneven), one_permute_of_ab) << uneven.program.to_string(uneven.graph);
  Partitioned other_axis = partition(relu_resharded(mesh4, "f32[8,6]", "('a', None)", "('b', None)"));
  EXPECT_EQ(summary(other_axis), one_permute_of_ab) << other_axis.program.to_string(other_axis.graph);
  Partitioned rotate = partition(relu_resharded(mesh8, "f32[4,4,4]", "('a', 'b', 'c')", "('c', 'a', 'b')"));
  EXPECT_EQ(summary(rotate), (std::vector<std::string>{"collective-permute a,b,c"}))
      << rotate.program.to_string(rotate.graph);
  Partitioned across = partition(relu_resharded(mesh4, "f32[8,8]", "(('a', 'b'), None)", "('b', 'a')"));
  EXPECT_EQ(summary(across), (std::vector<std::string>{"all-gather a,b"})) << across.program.to_string(across.graph);
  ASSERT_EQ(across.program.warnings.size(), 1u);
  EXPECT_NE(across.program.warnings[0].find("involuntary re-materialisation for the annotation at %b: dim 0 of %r "
                                            "is gathered over ('a', 'b') and split over ('b', 'a') again"),
            std::string::npos)
      << across.program.warnings[0];
}

// Axes moving together from the minor end of one dim to the minor end of
// another, in the same order, move in one all-to-all over all of them; moves
// that no single all-to-all makes take one per group of axes, in turn.
TEST(Patterns, AxesMovingBetweenDimsAreAllToAlls) {
  const std::string mesh8 = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 2, 2)", "('a', 'b', 'c')")M";
  Partitioned both = partition(relu_resharded(mesh8, "f32[512,512]", "(('a', 'b'), None)", "(None, ('a', 'b'))"));
  EXPECT_EQ(summary(both), (std::vector<std::string>{"all-to-all a,b"})) << both.program.to_string(both.graph);
  EXPECT_TRUE(both.program.warnings.empty());
  Partitioned suffix = partition(relu_resharded(mesh8, "f32[512,512]", "(('a', 'b', 'c'), None)", "('a', ('b', 'c'))"));
  EXPECT_EQ(summary(suffix), (std::vector<std::string>{"all-to-all b,c"})) << suffix.program.to_string(suffix.graph);
  Partitioned onto = partition(relu_resharded(mesh8, "f32[512,512]", "(('b', 'c'), 'a')", "(None, ('a', 'b', 'c'))"));
  EXPECT_EQ(summary(onto), (std::vector<std::string>{"all-to-all b,c"})) << onto.program.to_string(onto.graph);
  const auto all_to_alls = [&](const char* type, const char* from, const char* to) {
    Partitioned p = partition(relu_resharded(mesh8, type, from, to));
    EXPECT_TRUE(p.program.warnings.empty()) << from << " -> " << to;
    return summary(p);
  };
  using Names = std::vector<std::string>;
  // The axes land in another order, or split between two dims: still one.
  EXPECT_EQ(all_to_alls("f32[512,512]", "(('a', 'b'), None)", "(None, ('b', 'a'))"), (Names{"all-to-all a,b"}));
  EXPECT_EQ(all_to_alls("f32[64,64,64]", "(('a', 'b'), None, None)", "(None, 'a', 'b')"), (Names{"all-to-all a,b"}));
  // Dim 0 both loses and gains axes: no single all-to-all makes that.
  EXPECT_EQ(all_to_alls("f32[64,64,64]", "(('a', 'b'), None, 'c')", "('c', ('a', 'b'), None)"),
            (Names{"all-to-all a,b", "all-to-all c"}));
  // The target adds an axis after the moved one: sliced locally first, so
  // the all-to-all moves a quarter of the tensor, not half.
  EXPECT_EQ(all_to_alls("f32[512,512]", "('a', None)", "(None, ('a', 'b'))"), (Names{"all-to-all a,b"}));
}

// XLA's partitioner moves axes between two pairs of dims in one all-to-all
// over all of them: on a (4, 2) mesh, 'a' from dim 1 to dim 3 and 'b' from
// dim 2 to dim 0 send 7/8 of the 8 MiB tile, where two all-to-alls in turn
// send 3/4 and 1/2 of it (issue 30, case 2).
TEST(Patterns, MovesBetweenTwoPairsOfDimsAreOneAllToAll) {
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(4, 2)", "('a', 'b')")M";
  const Partitioned p = partition(relu_resharded(mesh, "i32[64,64,64,64]", "(None, 'a', 'b', None)",
                                                 "('b', None, None, 'a')"));
  ASSERT_EQ(summary(p), (std::vector<std::string>{"all-to-all a,b"})) << p.program.to_string(p.graph);
  EXPECT_EQ(p.program.collectives[0].bytes_per_device, 8 << 20);
  EXPECT_NE(p.program.collectives[0].reason.find("needs dim 0 of %r sharded on 'b' and dim 3 of %r sharded on 'a' "
                                                 "instead of dim 1 (sharded by"),
            std::string::npos)
      << p.program.collectives[0].reason;
  EXPECT_TRUE(p.program.warnings.empty());
}

// A dim that does not divide by the axes still moves by one all-to-all, its
// last tile padded, as in XLA: f32[1024,1023] from columns to rows over 8
// devices sends 512 KiB per device, not a 4 MiB all-gather (issue 30, case 1).
TEST(Patterns, UnevenDimMovesByOnePaddedAllToAll) {
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(8,)", "('x',)")M";
  const Partitioned p = partition(relu_resharded(mesh, "f32[1024,1023]", "(None, 'x')", "('x', None)"));
  ASSERT_EQ(summary(p), (std::vector<std::string>{"all-to-all x"})) << p.program.to_string(p.graph);
  EXPECT_EQ(p.program.collectives[0].bytes_per_device, 512 << 10);
  EXPECT_TRUE(p.program.warnings.empty());
  // Back, with both dims uneven.
  const Partitioned back = partition(relu_resharded(mesh, "f32[1023,1021]", "('x', None)", "(None, 'x')"));
  EXPECT_EQ(summary(back), (std::vector<std::string>{"all-to-all x"})) << back.program.to_string(back.graph);
}

// A dim moved to tiles that do not nest in its own gets only the rows each
// device lacks, in collective-permutes (a halo exchange), where a gather
// would make the whole dim on every device. Over (2, 4): 8 rows from tiles
// of 4 over 'x' to tiles of 2 over 'y' is 2 rows for half the devices. 10
// rows from tiles of 5 over 'a' to tiles of 3 over ('a', 'b') is 1 row, for
// one device (issue 30, case 3's kin: partial replication to a finer uneven
// tiling).
TEST(Patterns, TilesThatDoNotNestGetOnlyTheirMissingRows) {
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('x', 'y')")M";
  const Partitioned p = partition(relu_resharded(mesh, "f32[8,6]", "('x', None)", "('y', None)"));
  ASSERT_EQ(summary(p), (std::vector<std::string>{"collective-permute x,y"})) << p.program.to_string(p.graph);
  EXPECT_EQ(p.program.collectives[0].bytes_per_device, 2 * 6 * 4);
  EXPECT_EQ(p.program.collectives[0].rounds, 1);
  EXPECT_TRUE(p.program.warnings.empty());
  EXPECT_NE(p.program.collectives[0].reason.find("the tiles do not nest, so each device receives the rows it lacks "
                                                 "(at most 2 of 8) instead of the whole dim"),
            std::string::npos)
      << p.program.collectives[0].reason;

  const std::string mesh22 = R"M([0, 1, 2, 3], "(2, 2)", "('a', 'b')")M";
  const Partitioned finer = partition(relu_resharded(mesh22, "f32[10,1000]", "('a', None)", "(('a', 'b'), None)"));
  ASSERT_EQ(summary(finer), (std::vector<std::string>{"collective-permute a,b"})) << finer.program.to_string(finer.graph);
  EXPECT_EQ(finer.program.collectives[0].bytes_per_device, 1000 * 4);
  EXPECT_TRUE(finer.program.warnings.empty());
}

// A partial sum stays partial through an exact widening (bf16 -> f32), so
// the all-reduce runs in f32; the per-device listing shows constants.
TEST(Patterns, PartialSumsPassExactWideningsAndTheListingShowsConstants) {
  const std::string mesh = R"M([0, 1, 2, 3], "(4,)", "('x',)")M";
  const std::string text = "func @f(%x: bf16[8,16], %w: bf16[16,8]) -> (f32[8,8], bf16[4,16]) {\n"
                           "  %a = " + annotate("x", "(None, 'x')", "bf16[8,16]", mesh) + "\n"
                           "  %b = " + annotate("w", "('x', None)", "bf16[16,8]", mesh) + "\n"
                           "  %m = aten::matmul(%a, %b) : bf16[8,8]\n"
                           "  %f = aten::to.dtype(%m, f32) : f32[8,8]\n"
                           "  %s = aten::slice.Tensor(%a, 0, 2, 6) : bf16[4,16]\n"
                           "  return %f, %s\n}\n";
  const Partitioned p = partition(text);
  ASSERT_EQ(summary(p), (std::vector<std::string>{"all-reduce x"})) << p.program.to_string(p.graph);
  EXPECT_EQ(p.program.collectives[0].bytes_per_device, 8 * 8 * 4);  // f32[8,8]: after the cast
  EXPECT_NE(p.program.to_string(p.graph).find("aten::slice.Tensor(%"), std::string::npos);
  EXPECT_NE(p.program.to_string(p.graph).find(", 0, 2, 6)"), std::string::npos) << p.program.to_string(p.graph);
}

// Collectives made for more than the consumer that asked say so: a
// reduction shared by two annotations names both, and a move made early for
// a later annotation names that one and why it came first.
TEST(Patterns, CollectivesMadeForSeveralUsesNameThem) {
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 2, 2)", "('a', 'b', 'c')")M";
  const std::string shared = "func @f(%x: f32[256,256,4]) -> (f32[256,256], f32[256,256]) {\n"
                             "  %a = " + annotate("x", "(None, 'c', 'a')", "f32[256,256,4]", mesh) + "\n"
                             "  %s = aten::sum.dim_IntList(%a, [2]) : f32[256,256]\n"
                             "  %b = " + annotate("s", "(None, ('a', 'b'))", "f32[256,256]", mesh) + "\n"
                             "  %c = " + annotate("s", "('a', ('c', 'b'))", "f32[256,256]", mesh) + "\n"
                             "  return %b, %c\n}\n";
  const Partitioned p = partition(shared);
  ASSERT_FALSE(p.program.collectives.empty()) << p.program.to_string(p.graph);
  EXPECT_NE(p.program.collectives[0].reason.find(
                "the annotation at %b (and the annotation at %c, sharing the reduction) needs values reduced over 'a'"),
            std::string::npos)
      << p.program.collectives[0].reason;

  const std::string chain = "func @f(%x: f32[1024,8]) -> (f32[1024,8]) {\n"
                            "  %a = " + annotate("x", "('c', None)", "f32[1024,8]", mesh) + "\n"
                            "  %b0 = " + annotate("a", "(('a', 'b'), None)", "f32[1024,8]", mesh) + "\n"
                            "  %b1 = " + annotate("b0", "('a', None)", "f32[1024,8]", mesh) + "\n"
                            "  return %b1\n}\n";
  const Partitioned q = partition(chain);
  ASSERT_EQ(q.program.collectives.size(), 1u) << q.program.to_string(q.graph);
  EXPECT_NE(q.program.collectives[0].reason.find(
                "the annotation at %b1 (moved here, before the annotation at %b0, as both then cost least)"),
            std::string::npos)
      << q.program.collectives[0].reason;
}

TEST(Patterns, UnevenReshardsAreReported) {
  // 5 rows over ('x', 'y') (tiles of 1) -> over 'x' alone (tiles of 3): the
  // shards do not nest, so the dim is gathered whole and sliced again, with a
  // warning naming the consumer. (7 rows would nest: tiles of 4 hold 4 of 1.)
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('x', 'y')")M";
  const std::string text = "func @f(%a: f32[5,3]) -> (f32[5,3]) {\n"
                           "  %b = " + annotate("a", "(('x', 'y'), None)", "f32[5,3]", mesh) + "\n"
                           "  %c = " + annotate("b", "('x', None)", "f32[5,3]", mesh) + "\n"
                           "  return %c\n}\n";
  const Partitioned p = partition(text);
  EXPECT_EQ(summary(p), (std::vector<std::string>{"all-gather x,y"})) << p.program.to_string(p.graph);
  ASSERT_EQ(p.program.warnings.size(), 1u);
  EXPECT_NE(p.program.warnings[0].find("involuntary re-materialisation for the annotation at %c: dim 0 of %b"),
            std::string::npos) << p.program.warnings[0];
}

}  // namespace

namespace {

// A lookup in a replicated table whose result is wanted split on the hidden
// dim looks up whole rows and slices the small result: slicing the table
// instead would copy an eighth of it on every run.
TEST(Patterns, LookupInAReplicatedTableSlicesTheResultNotTheTable) {
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(8,)", "('model',)")M";
  const std::string text = "func @f(%table: f32[1000,64], %tokens: i64[4,8]) -> (f32[4,8,64]) {\n"
                           "  %t = " + annotate("table", "(None, None)", "f32[1000,64]", mesh) + "\n"
                           "  %e = aten::embedding(%t, %tokens) : f32[4,8,64]\n"
                           "  %a = " + annotate("e", "(None, None, 'model')", "f32[4,8,64]", mesh) + "\n"
                           "  return %a\n}\n";
  const Partitioned p = partition(text);
  EXPECT_EQ(summary(p), std::vector<std::string>{}) << p.program.to_string(p.graph);
  int slices = 0;
  for (const sf::Instruction& instruction : p.program.instructions) {
    if (instruction.kind != sf::InstructionKind::kLocalSlice) continue;
    ++slices;
    const sf::TensorType& sliced = p.program.slots[static_cast<std::size_t>(instruction.inputs[0])];
    EXPECT_EQ(sliced.shape, (sf::Shape{4, 8, 64})) << p.program.to_string(p.graph);
  }
  EXPECT_EQ(slices, 1) << p.program.to_string(p.graph);
}

// A weight sharded on its input features meets an activation that is whole
// along them (gathered earlier: 6 heads do not split over 8 devices). Slicing
// the activation locally and reduce-scattering the small result moves a few
// KiB; moving the weight to the result's layout would send 1/8 of it on
// every run. With a large activation and a small weight the reverse holds.
std::vector<std::string> linear_against_a_weight_sharded_on_its_inputs(int64_t rows, int64_t out_features,
                                                                       const std::string& x_spec = "(None, None)",
                                                                       bool bias = false) {
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(8,)", "('model',)")M";
  const std::string x = fmt::format("f32[{},288]", rows), w = fmt::format("f32[{},288]", out_features),
                    b = fmt::format("f32[{}]", out_features), y = fmt::format("f32[{},{}]", rows, out_features);
  const std::string text = "func @f(%x: " + x + ", %w: " + w + ", %b: " + b + ") -> (" + y + ") {\n"
                           "  %xa = " + annotate("x", x_spec, x, mesh) + "\n"
                           "  %wa = " + annotate("w", "(None, 'model')", w, mesh) + "\n"
                           "  %y = aten::linear(%xa, %wa" + (bias ? ", %b" : "") + ") : " + y + "\n"
                           "  %ya = " + annotate("y", "(None, 'model')", y, mesh) + "\n"
                           "  return %ya\n}\n";
  return summary(partition(text));
}

TEST(Patterns, ContractionShardedByTheWeightSlicesAWholeActivationWhenTheResultIsSmaller) {
  EXPECT_EQ(linear_against_a_weight_sharded_on_its_inputs(1, 288), (std::vector<std::string>{"reduce-scatter model"}));
  EXPECT_EQ(linear_against_a_weight_sharded_on_its_inputs(4096, 64), (std::vector<std::string>{"all-to-all model"}));
}

// A bias does not change that choice: one device of the reduction group
// adds it to its partial sum, the others add zeros.
TEST(Patterns, ContractionWithABiasStillSlicesTheActivation) {
  EXPECT_EQ(linear_against_a_weight_sharded_on_its_inputs(1, 288, "(None, None)", true),
            (std::vector<std::string>{"reduce-scatter model"}));
}

// An activation split over 'model' along its rows cannot also be sliced
// along its features by 'model' for free: the contraction is not sharded.
TEST(Patterns, ContractionDoesNotSliceAnOperandThatUsesTheAxisElsewhere) {
  const std::vector<std::string> collectives = linear_against_a_weight_sharded_on_its_inputs(8, 288, "('model', None)");
  EXPECT_EQ(std::count(collectives.begin(), collectives.end(), "reduce-scatter model"), 0);
  EXPECT_EQ(std::count(collectives.begin(), collectives.end(), "all-reduce model"), 0);
}

// Propagation that stops at its round limit warns in the program's
// warnings, ahead of the partitioner's own: 300 adds whose order makes the
// sharding turn back at every add (%y1 before %y0, %y3 before %y2, ...).
TEST(Patterns, PropagationWarningsComeFirstInTheProgram) {
  std::string text = "func @f(%x0: f32[8]";
  for (int k = 1; k <= 300; ++k) text += fmt::format(", %x{}: f32[8]", k);
  text += ") -> (f32[8]) {\n  %y = " + annotate("x0", "('data',)", "f32[8]") + "\n";
  for (int n = 0; n < 300; ++n) {
    const int k = n ^ 1;
    const std::string lhs = k == 0 ? "y" : fmt::format("x{}", k);
    text += fmt::format("  %y{} = aten::add.Tensor(%{}, %x{}) : f32[8]\n", k, lhs, k + 1);
  }
  const Partitioned p = partition(text + "  return %y0\n}\n");
  ASSERT_GE(p.program.warnings.size(), 2u);
  EXPECT_NE(p.program.warnings[0].find("sharding propagation over pass-through ops stopped after 64 rounds"),
            std::string::npos) << p.program.warnings[0];
  EXPECT_NE(p.program.warnings[1].find("sharding propagation over all ops stopped after 64 rounds"),
            std::string::npos) << p.program.warnings[1];
}

}  // namespace
