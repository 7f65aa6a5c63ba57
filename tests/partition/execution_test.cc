// Partitioned programs run on in-process devices give the single-device
// results: reference patterns and uneven shapes.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "random_mesh.h"
#include "shardflow/partition/program.h"
#include "shardflow/runtime/executor.h"
#include "shardflow/shardflow.h"
#include "shardflow/trace/interpreter.h"

namespace sf = shardflow;

namespace {

// Runs `text` on one device and partitioned on the runtime; compares.
void expect_same(const std::string& text, sf::Runtime& runtime, const std::vector<sf::Tensor>& inputs,
                 std::vector<std::string>* collectives = nullptr) {
  sf::ops::register_all_ops();
  const sf::Graph graph = sf::parse_graph(text);
  sf::verify_graph(graph);
  const sf::PropagationResult shardings = sf::propagate_shardings(graph);
  const sf::PartitionedProgram program = sf::partition_graph(graph, shardings);
  std::vector<sf::DenseTensor> values;
  for (const sf::Tensor& input : inputs) values.push_back(input.value());
  const std::vector<sf::DenseTensor> expected = sf::run_graph(graph, values);
  const std::vector<sf::Tensor> actual = sf::run_program(program, runtime, inputs);
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t o = 0; o < expected.size(); ++o) {
    const std::vector<float> want = sf::Tensor(expected[o]).to_floats(), got = actual[o].to_floats();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i])))
          << "output " << o << " element " << i << "\n" << sf::print_with_shardings(graph, shardings)
          << program.to_string(graph);
    }
  }
  if (collectives != nullptr) {
    for (const sf::CollectiveInfo& info : program.collectives) collectives->push_back(info.describe(*program.mesh));
  }
}

// expect_same, and the collectives' descriptions begin with `prefixes`, in order.
void expect_same_with(const std::string& text, sf::Runtime& runtime, const std::vector<sf::Tensor>& inputs,
                      const std::vector<std::string>& prefixes) {
  std::vector<std::string> collectives;
  expect_same(text, runtime, inputs, &collectives);
  ASSERT_EQ(collectives.size(), prefixes.size()) << testing::PrintToString(collectives);
  for (std::size_t k = 0; k < collectives.size(); ++k) {
    EXPECT_EQ(collectives[k].rfind(prefixes[k], 0), 0u) << collectives[k];
  }
}

std::string annotate(const std::string& value, const std::string& spec, const std::string& type,
                     const std::string& mesh) {
  return "xla::dynamo_mark_sharding(%" + value + ", " + mesh + ", \"" + spec + "\") : " + type;
}

const std::string kMesh8 = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(8,)", "('x',)")M";

TEST(Execution, SeventeenRowsOnEightDevices) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const sf::Tensor x = sf::randn({17, 5}, 1);
  const sf::Tensor w = sf::randn({17, 3}, 2);
  const std::string text = "func @f(%x: f32[17,5], %w: f32[17,3]) -> (f32[5], f32[5], f32[17,5], f32[5,3], f32[17,5]) {\n"
                           "  %a = " + annotate("x", "('x', None)", "f32[17,5]", kMesh8) + "\n"
                           "  %b = " + annotate("w", "('x', None)", "f32[17,3]", kMesh8) + "\n"
                           "  %e = aten::exp(%a) : f32[17,5]\n"
                           "  %s = aten::sum.dim_IntList(%e, [0]) : f32[5]\n"
                           "  %m = aten::amax(%a, [0]) : f32[5]\n"
                           "  %p = aten::softmax.int(%a, 0) : f32[17,5]\n"
                           "  %t = aten::transpose.int(%a, 0, 1) : f32[5,17]\n"
                           "  %c = aten::matmul(%t, %b) : f32[5,3]\n"
                           "  %g = " + annotate("e", "(None, None)", "f32[17,5]", kMesh8) + "\n"
                           "  return %s, %m, %p, %c, %g\n}\n";
  std::vector<std::string> collectives;
  expect_same(text, runtime, {x, w}, &collectives);
  EXPECT_FALSE(collectives.empty());
}

// The padding of an uneven shard is masked with the reduction's identity
// before a min or max over it; for integers that is the dtype's largest or
// smallest value (+inf converted as it was gave INT_MIN).
TEST(Execution, IntegerMinAndMaxOverAPaddedShardedDim) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const sf::Tensor x = sf::randn({17, 5}, 3);
  const std::string text = "func @f(%x: f32[17,5]) -> (i32[5], i32[5], i64[5], i64[5]) {\n"
                           "  %a = " + annotate("x", "('x', None)", "f32[17,5]", kMesh8) + "\n"
                           "  %p = aten::add.Scalar(%a, 9) : f32[17,5]\n"
                           "  %n = aten::sub.Scalar(%a, 9) : f32[17,5]\n"
                           "  %i = aten::to.dtype(%p, i32) : i32[17,5]\n"
                           "  %j = aten::to.dtype(%n, i64) : i64[17,5]\n"
                           "  %lo = aten::amin(%i, [0]) : i32[5]\n"
                           "  %hi = aten::amax(%i, [0]) : i32[5]\n"
                           "  %nlo = aten::amin(%j, [0]) : i64[5]\n"
                           "  %nhi = aten::amax(%j, [0]) : i64[5]\n"
                           "  return %lo, %hi, %nlo, %nhi\n}\n";
  expect_same(text, runtime, {x});
}

// Integer division of shards padded on the divisor's dim: the padding must
// not divide by zero (ZeroDivisionError on a device whose values are fine).
TEST(Execution, IntegerDivisionByAShardedDivisorWithPadding) {
  sf::Runtime runtime = sf::Runtime::local(8);
  std::vector<int64_t> divisors;
  for (int64_t i = 0; i < 17 * 5; ++i) divisors.push_back(i % 2 == 0 ? 1 + i % 9 : -1 - i % 7);
  const std::string text = "func @f(%x: f32[17,5], %d: i64[17,5]) -> (i64[17,5], i64[17,5], i64[17,5], i64[17,5]) {\n"
                           "  %a = " + annotate("d", "('x', None)", "i64[17,5]", kMesh8) + "\n"
                           "  %s = aten::mul.Scalar(%x, 100) : f32[17,5]\n"
                           "  %n = aten::to.dtype(%s, i64) : i64[17,5]\n"
                           "  %q = aten::floor_divide(%n, %a) : i64[17,5]\n"
                           "  %r = aten::remainder.Tensor(%n, %a) : i64[17,5]\n"
                           "  %m = aten::fmod.Tensor(%n, %a) : i64[17,5]\n"
                           "  %t = aten::div.Tensor_mode(%n, %a, rounding_mode='trunc') : i64[17,5]\n"
                           "  return %q, %r, %m, %t\n}\n";
  expect_same(text, runtime, {sf::randn({17, 5}, 4), sf::Tensor::from_ints(divisors, {17, 5})});
}

// scatter into shards of the written dim (uneven: 13 over 8): each device
// writes the positions whose index falls in its shard; duplicates add up.
TEST(Execution, ScatterIntoAShardedDim) {
  sf::Runtime runtime = sf::Runtime::local(8);
  std::vector<int64_t> index;
  for (int64_t i = 0; i < 4 * 6; ++i) index.push_back((i * 7) % 13);
  const std::string text = "func @f(%x: f32[4,13], %i: i64[4,6], %s: f32[4,6]) -> (f32[4,13], f32[4,13]) {\n"
                           "  %a = " + annotate("x", "(None, 'x')", "f32[4,13]", kMesh8) + "\n"
                           "  %w = aten::scatter.src(%a, 1, %i, %s) : f32[4,13]\n"
                           "  %d = aten::scatter_add(%a, 1, %i, %s) : f32[4,13]\n"
                           "  return %w, %d\n}\n";
  expect_same(text, runtime, {sf::randn({4, 13}, 6), sf::Tensor::from_ints(index, {4, 6}), sf::randn({4, 6}, 7)});
}

// scatter_add with its index and src split over the pairs they list (a
// histogram of a sharded input, uneven: 21 over 8): each device adds its
// pairs, self counted on one device, and the partial results sum up (an
// all-reduce of the small result, not all-gathers of the pairs); also with
// the written dim sharded at the same time.
TEST(Execution, ScatterAddOfShardedPairsSumsPartials) {
  sf::Runtime runtime = sf::Runtime::local(8);
  std::vector<int64_t> index;
  for (int64_t i = 0; i < 3 * 21; ++i) index.push_back((i * 5) % 7);
  const sf::Tensor indices = sf::Tensor::from_ints(index, {3, 21});
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('a', 'b')")M";
  const std::string text =
      "func @f(%x: f32[3,7], %i: i64[3,21], %s: f32[3,21], %x2: f32[3,7], %i2: i64[3,21], %s2: f32[3,21]) "
      "-> (f32[3,7], f32[3,7]) {\n"
      "  %j = " + annotate("i", "(None, ('a', 'b'))", "i64[3,21]", mesh) + "\n"
      "  %t = " + annotate("s", "(None, ('a', 'b'))", "f32[3,21]", mesh) + "\n"
      "  %d = aten::scatter_add(%x, 1, %j, %t) : f32[3,7]\n"
      "  %y = " + annotate("x2", "(None, 'a')", "f32[3,7]", mesh) + "\n"
      "  %k = " + annotate("i2", "(None, 'b')", "i64[3,21]", mesh) + "\n"
      "  %u = " + annotate("s2", "(None, 'b')", "f32[3,21]", mesh) + "\n"
      "  %e = aten::scatter_add(%y, 1, %k, %u) : f32[3,7]\n"
      "  return %d, %e\n}\n";
  expect_same_with(text, runtime,
                   {sf::randn({3, 7}, 8), indices, sf::randn({3, 21}, 9), sf::randn({3, 7}, 10), indices,
                    sf::randn({3, 21}, 11)},
                   {"all-reduce over 'a', 'b'", "all-reduce over 'b'"});
}

TEST(Execution, MegatronMlp) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('data', 'model')")M";
  const std::string text = "func @mlp(%x: f32[8,16], %w1: f32[16,64], %w2: f32[64,16]) -> (f32[8,16]) {\n"
                           "  %a = " + annotate("w1", "(None, 'model')", "f32[16,64]", mesh) + "\n"
                           "  %b = " + annotate("w2", "('model', None)", "f32[64,16]", mesh) + "\n"
                           "  %h = aten::matmul(%x, %a) : f32[8,64]\n"
                           "  %g = aten::gelu(%h) : f32[8,64]\n"
                           "  %y = aten::matmul(%g, %b) : f32[8,16]\n"
                           "  return %y\n}\n";
  expect_same(text, runtime, {sf::randn({8, 16}, 1), sf::randn({16, 64}, 2), sf::randn({64, 16}, 3)});
}

TEST(Execution, ReshardsBetweenLayouts) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('x', 'y')")M";
  const char* specs[] = {"('x', 'y')", "('y', 'x')", "(('x', 'y'), None)", "(None, ('y', 'x'))", "(None, ('x', 'y'))",
                         "('x', None)", "(None, 'y')", "(None, None)"};
  for (const char* from : specs) {
    for (const char* to : specs) {
      for (const char* shape : {"f32[8,16]", "f32[7,13]"}) {
        const std::string text = std::string("func @f(%a: ") + shape + ") -> (" + shape + ") {\n"
                                 "  %b = " + annotate("a", from, shape, mesh) + "\n"
                                 "  %c = aten::exp(%b) : " + shape + "\n"
                                 "  %d = " + annotate("c", to, shape, mesh) + "\n"
                                 "  return %d\n}\n";
        const sf::Shape dims = std::string(shape) == "f32[8,16]" ? sf::Shape{8, 16} : sf::Shape{7, 13};
        SCOPED_TRACE(std::string(from) + " -> " + to + " " + shape);
        expect_same(text, runtime, {sf::randn(dims, 4)});
      }
    }
  }
}

}  // namespace

namespace {

TEST(Execution, PartialSumThroughTransposeOnACustomDeviceOrder) {
  sf::Runtime runtime = sf::Runtime::local(6);
  const std::string mesh = R"M([0, 5, 1, 3, 4, 2], "(3, 2)", "('a', 'b')")M";
  const std::string text = "func @f(%x: f32[3,5,5], %w: f32[5,5]) -> (f32[5,5,3]) {\n"
                           "  %a = " + annotate("x", "(None, None, 'a')", "f32[3,5,5]", mesh) + "\n"
                           "  %b = " + annotate("w", "('a', 'b')", "f32[5,5]", mesh) + "\n"
                           "  %m = aten::matmul(%a, %b) : f32[3,5,5]\n"
                           "  %n = " + annotate("m", "(('b', 'a'), None, None)", "f32[3,5,5]", mesh) + "\n"
                           "  %t = aten::transpose.int(%m, 0, 2) : f32[5,5,3]\n"
                           "  return %t\n}\n";
  expect_same(text, runtime, {sf::randn({3, 5, 5}, 1), sf::randn({5, 5}, 2)});
}

// A transpose that reorders the global tensor but, on each device's shard,
// moves only a dim of local size 1: the executor reuses the shard's buffer
// (no kernel), and the result is still the single-device one.
TEST(Execution, TransposeKeepingTheLocalOrderReusesTheShard) {
  sf::Runtime runtime = sf::Runtime::local(2);
  const std::string mesh = R"M([0, 1], "(2,)", "('x',)")M";
  const std::string text = "func @f(%x: f32[2,3,4]) -> (f32[3,2,4], f32[2,4,3]) {\n"
                           "  %a = " + annotate("x", "('x', None, None)", "f32[2,3,4]", mesh) + "\n"
                           "  %t = aten::transpose.int(%a, 0, 1) : f32[3,2,4]\n"
                           "  %e = aten::exp(%t) : f32[3,2,4]\n"
                           "  %u = aten::transpose.int(%a, 1, 2) : f32[2,4,3]\n"
                           "  return %e, %u\n}\n";
  expect_same(text, runtime, {sf::randn({2, 3, 4}, 1)});

  const sf::Graph graph = sf::parse_graph(text);
  const sf::PartitionedProgram program = sf::partition_graph(graph, sf::propagate_shardings(graph));
  std::vector<bool> reinterprets;
  for (const sf::Instruction& instruction : program.instructions) {
    if (instruction.kind == sf::InstructionKind::kCompute && instruction.op->full_name() == "aten::transpose.int") {
      reinterprets.push_back(instruction.reinterprets);
    }
  }
  EXPECT_EQ(reinterprets, (std::vector<bool>{true, false}));  // [1,3,4] -> [3,1,4]; [1,3,4] -> [1,4,3]
}

// Causal attention with the query rows split: the rows are gathered first,
// since the kernel cuts each row's keys at its index within its shard.
TEST(Execution, CausalAttentionWithSplitQueryRows) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const std::string mesh = R"M([0, 1, 2, 3], "(4,)", "('x',)")M";
  for (int rows : {8, 7}) {
    const std::string type = "f32[1,2," + std::to_string(rows) + ",4]";
    const std::string text = "func @f(%q: " + type + ", %k: " + type + ", %v: " + type + ") -> (" + type + ") {\n"
                             "  %a = " + annotate("q", "(None, None, 'x', None)", type, mesh) + "\n"
                             "  %b = " + annotate("k", "(None, None, 'x', None)", type, mesh) + "\n"
                             "  %o = aten::scaled_dot_product_attention(%a, %b, %v, None, 0.0, true) : " + type + "\n"
                             "  return %o\n}\n";
    const sf::Shape shape{1, 2, rows, 4};
    expect_same(text, runtime, {sf::randn(shape, 1), sf::randn(shape, 2), sf::randn(shape, 3)});
  }
}

// A cast of a partial sum (a matmul over a split contracting dim) waits for
// the all-reduce: truncating each device's part first gives another integer.
TEST(Execution, CastOfAPartialSumComesAfterTheReduction) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const std::string mesh = R"M([0, 1, 2, 3], "(4,)", "('x',)")M";
  const std::string text = "func @f(%x: f32[8,8], %w: f32[8,8]) -> (i32[8,8], bf16[8,8], i32[8]) {\n"
                           "  %a = " + annotate("x", "(None, 'x')", "f32[8,8]", mesh) + "\n"
                           "  %b = " + annotate("w", "('x', None)", "f32[8,8]", mesh) + "\n"
                           "  %m = aten::matmul(%a, %b) : f32[8,8]\n"
                           "  %i = aten::to.dtype(%m, i32) : i32[8,8]\n"
                           "  %h = aten::to.dtype(%m, bf16) : bf16[8,8]\n"
                           "  %s = aten::sum.dim_IntList(%m, [1], dtype=i32) : i32[8]\n"
                           "  return %i, %h, %s\n}\n";
  std::vector<std::string> collectives;
  expect_same(text, runtime, {sf::randn({8, 8}, 1) * 3, sf::randn({8, 8}, 2)}, &collectives);
  ASSERT_EQ(collectives.size(), 1u);
  EXPECT_EQ(collectives[0].rfind("all-reduce", 0), 0u) << collectives[0];
}

// Collective-permutes give the single-device values, also with padded
// tiles and a custom device order.
TEST(Execution, CollectivePermuteReshards) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const std::string mesh = R"M([3, 1, 4, 0, 7, 5, 2, 6], "(2, 2, 2)", "('a', 'b', 'c')")M";
  const std::string text = "func @f(%x: f32[4,7,2], %y: f32[7,6]) -> (f32[4,7,2], f32[7,6]) {\n"
                           "  %a = " + annotate("x", "('a', 'b', 'c')", "f32[4,7,2]", mesh) + "\n"
                           "  %e = aten::exp(%a) : f32[4,7,2]\n"
                           "  %b = " + annotate("e", "('c', 'a', 'b')", "f32[4,7,2]", mesh) + "\n"
                           "  %c = " + annotate("y", "(('a', 'b', 'c'), None)", "f32[7,6]", mesh) + "\n"
                           "  %t = aten::tanh(%c) : f32[7,6]\n"
                           "  %d = " + annotate("t", "(('c', 'b', 'a'), None)", "f32[7,6]", mesh) + "\n"
                           "  %n = aten::neg(%d) : f32[7,6]\n"
                           "  %s = aten::sin(%b) : f32[4,7,2]\n"
                           "  return %s, %n\n}\n";
  std::vector<std::string> collectives;
  expect_same(text, runtime, {sf::randn({4, 7, 2}, 1), sf::randn({7, 6}, 2)}, &collectives);
  ASSERT_EQ(collectives.size(), 2u);
  for (const std::string& c : collectives) EXPECT_EQ(c.rfind("collective-permute", 0), 0u) << c;
}

}  // namespace

namespace {

// Row-parallel linear with a bias (GPT-style layers): the product stays a
// partial sum and is reduced once; the bias joins one device's part per
// group, so it is added once. Nothing else moves: neither the weight nor
// the activation is gathered. Covers an uneven contraction (7 features over
// 'model' of 3: padded shards), a bias sharded with the output features, a
// 0-d bias, and a result wanted split over the contracted axis
// (reduce-scatter).
TEST(Execution, RowParallelLinearWithABiasReducesOnce) {
  sf::Runtime runtime = sf::Runtime::local(6);
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5], "(2, 3)", "('data', 'model')")M";
  struct Case {
    std::string w_spec, bias_type, out_spec, collective;
  };
  const Case cases[] = {
      {"(None, 'model')", "f32[4]", "('data', None, None)", "all-reduce over 'model'"},
      {"('data', 'model')", "f32[4]", "(None, None, 'data')", "all-reduce over 'model'"},
      {"(None, 'model')", "f32[]", "('data', None, None)", "all-reduce over 'model'"},
      {"(None, 'model')", "f32[4]", "('data', 'model', None)", "reduce-scatter over 'model'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.w_spec + " " + c.bias_type + " -> " + c.out_spec);
    const bool data_on_rows = c.out_spec.rfind("('data'", 0) == 0;
    const std::string x_spec = data_on_rows ? "('data', None, 'model')" : "(None, None, 'model')";
    const std::string text = "func @f(%x: f32[2,6,7], %w: f32[4,7], %b: " + c.bias_type + ") -> (f32[2,6,4]) {\n"
                             "  %xa = " + annotate("x", x_spec, "f32[2,6,7]", mesh) + "\n"
                             "  %wa = " + annotate("w", c.w_spec, "f32[4,7]", mesh) + "\n"
                             "  %y = aten::linear(%xa, %wa, %b) : f32[2,6,4]\n"
                             "  %ya = " + annotate("y", c.out_spec, "f32[2,6,4]", mesh) + "\n"
                             "  return %ya\n}\n";
    const sf::Shape bias_shape = c.bias_type == "f32[]" ? sf::Shape{} : sf::Shape{4};
    std::vector<std::string> collectives;
    expect_same(text, runtime, {sf::randn({2, 6, 7}, 1), sf::randn({4, 7}, 2), sf::randn(bias_shape, 3) + 5},
                &collectives);
    ASSERT_EQ(collectives.size(), 1u) << testing::PrintToString(collectives);
    EXPECT_EQ(collectives[0].rfind(c.collective, 0), 0u) << collectives[0];
  }
}

}  // namespace

namespace {

// A max over ('data', 'model') wanted in four layouts is all-reduced once;
// the other layouts slice the reduction's result, with no gathers after.
TEST(Execution, LaterConsumersSliceTheReductionsResult) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const std::string mesh8 = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('data', 'model')")M";
  std::string text = "func @f(%x: f32[8,8]) -> (f32[8], f32[8], f32[8], f32[8]) {\n"
                     "  %a = " + annotate("x", "(None, ('data', 'model'))", "f32[8,8]", mesh8) + "\n"
                     "  %m = aten::amax(%a, [1]) : f32[8]\n";
  const char* specs[] = {"('model',)", "(None,)", "('data',)", "(('data', 'model'),)"};
  for (int k = 0; k < 4; ++k) {
    text += fmt::format("  %p{} = {}\n  %q{} = aten::exp(%p{}) : f32[8]\n", k,
                        annotate("m", specs[k], "f32[8]", mesh8), k, k);
  }
  text += "  return %q0, %q1, %q2, %q3\n}\n";
  std::vector<std::string> collectives;
  expect_same(text, runtime, {sf::randn({8, 8}, 3)}, &collectives);
  EXPECT_EQ(collectives.size(), 1u) << testing::PrintToString(collectives);
}

// An add (or cat) of partial sums takes all of them partial or none: when
// one is used elsewhere (an output, a relu, an annotation) or cannot stay
// partial in the result's dtype, all are reduced first. Taking one reduced and one partial added the reduced one
// once per device (helper probe).
TEST(Execution, AddOfPartialSumsOneNeededWholeElsewhere) {
  sf::Runtime runtime = sf::Runtime::local(2);
  const std::string mesh = R"M([0, 1], "(2,)", "('m',)")M";
  const std::string head = "  %xa = " + annotate("x", "(None, 'm')", "f32[4,8]", mesh) + "\n"
                           "  %wa = " + annotate("w", "('m', None)", "f32[8,4]", mesh) + "\n"
                           "  %va = " + annotate("v", "('m', None)", "f32[8,4]", mesh) + "\n"
                           "  %p = aten::matmul(%xa, %wa) : f32[4,4]\n";
  const std::string bodies[] = {
      "  %q = aten::matmul(%xa, %va) : f32[4,4]\n  %r = aten::relu(%p) : f32[4,4]\n"
      "  %s = aten::add.Tensor(%p, %q) : f32[4,4]\n  return %r, %s\n",
      "  %n = aten::neg(%p) : f32[4,4]\n  %s = aten::add.Tensor(%n, %p) : f32[4,4]\n  return %n, %s\n",
      "  %n = aten::mul.Scalar(%p, 2.0) : f32[4,4]\n  %q = " + annotate("n", "(None, None)", "f32[4,4]", mesh) +
          "\n  %s = aten::cat([%n, %p]) : f32[8,4]\n  return %q, %s\n",
  };
  const std::string results[] = {"(f32[4,4], f32[4,4])", "(f32[4,4], f32[4,4])", "(f32[4,4], f32[8,4])"};
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(bodies[k]);
    const std::string text = "func @f(%x: f32[4,8], %w: f32[8,4], %v: f32[8,4]) -> " + results[k] + " {\n" + head +
                             bodies[k] + "}\n";
    expect_same(text, runtime, {sf::randn({4, 8}, 1), sf::randn({8, 4}, 2), sf::randn({8, 4}, 3)});
  }
  // An i64 partial sum cannot stay partial in an f32 result; the f32 one
  // added to it is then reduced too.
  for (const char* combine : {"aten::add.Tensor(%p, %q) : f32[4]", "aten::cat([%q, %p]) : f32[8]"}) {
    SCOPED_TRACE(combine);
    const std::string type = std::string(combine).find("cat") != std::string::npos ? "f32[8]" : "f32[4]";
    const std::string text = "func @f(%x: f32[4,8], %k: i64[4,8]) -> (" + type + ") {\n"
                             "  %xa = " + annotate("x", "(None, 'm')", "f32[4,8]", mesh) + "\n"
                             "  %ka = " + annotate("k", "(None, 'm')", "i64[4,8]", mesh) + "\n"
                             "  %p = aten::sum.dim_IntList(%xa, [1]) : f32[4]\n"
                             "  %q = aten::sum.dim_IntList(%ka, [1]) : i64[4]\n"
                             "  %s = " + combine + "\n  return %s\n}\n";
    expect_same(text, runtime, {sf::randn({4, 8}, 1), sf::Tensor::from_ints(std::vector<int64_t>(32, 7), {4, 8})});
  }
}

// A partial sum used by an op that could carry it partial (transpose) and
// by one that needs it whole (relu) is reduced once, for both: carrying it
// through the transpose would reduce it a second time.
TEST(Execution, PartialSumNeededWholeElsewhereIsReducedBeforeALinearUse) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('data', 'model')")M";
  for (const bool transpose_first : {true, false}) {
    const std::string relu = "  %r = aten::relu(%y) : f32[2,4]\n";
    const std::string transpose = "  %t = aten::transpose.int(%y, 0, 1) : f32[4,2]\n";
    const std::string text = "func @f(%x: f32[2,7], %w: f32[4,7], %b: f32[4]) -> (f32[2,4], f32[4,2]) {\n"
                             "  %xa = " + annotate("x", "(None, 'model')", "f32[2,7]", mesh) + "\n"
                             "  %wa = " + annotate("w", "(None, 'model')", "f32[4,7]", mesh) + "\n"
                             "  %y = aten::linear(%xa, %wa, %b) : f32[2,4]\n" +
                             (transpose_first ? transpose + relu : relu + transpose) +
                             "  return %r, %t\n}\n";
    std::vector<std::string> collectives;
    expect_same(text, runtime, {sf::randn({2, 7}, 1), sf::randn({4, 7}, 2), sf::randn({4}, 3)}, &collectives);
    EXPECT_EQ(collectives.size(), 1u) << testing::PrintToString(collectives);
  }
}

// One partial sum wanted whole by one consumer and split by another is
// reduced once: the second consumer slices (or gathers) the reduced copy.
// Two reductions would cost more and could round differently.
TEST(Execution, PartialSumWithTwoConsumersIsReducedOnce) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const std::string mesh = R"M([0, 1, 2, 3], "(4,)", "('model',)")M";
  struct Case {
    int64_t rows;
    std::string first, second;
    std::vector<std::string> collectives;  // their kinds, in order
  };
  const Case cases[] = {
      {8, "(None, None)", "('model', None)", {"all-reduce"}},
      // One all-reduce, then a slice: a reduce-scatter and an all-gather
      // would send as much in one more collective.
      {8, "('model', None)", "(None, None)", {"all-reduce"}},
      // 7 rows do not split evenly: all-reduced, then sliced; the second
      // consumer takes the all-reduce's result, not the slice.
      {7, "('model', None)", "(None, None)", {"all-reduce"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.first + " then " + c.second + fmt::format(", {} rows", c.rows));
    const std::string type = fmt::format("f32[{},8]", c.rows);
    const std::string text = "func @f(%x: " + type + ", %w: f32[8,8]) -> (" + type + ", " + type + ") {\n"
                             "  %a = " + annotate("x", "(None, 'model')", type, mesh) + "\n"
                             "  %b = " + annotate("w", "('model', None)", "f32[8,8]", mesh) + "\n"
                             "  %m = aten::matmul(%a, %b) : " + type + "\n"
                             "  %p = " + annotate("m", c.first, type, mesh) + "\n"
                             "  %q = " + annotate("m", c.second, type, mesh) + "\n"
                             "  return %p, %q\n}\n";
    std::vector<std::string> collectives;
    expect_same(text, runtime, {sf::randn({c.rows, 8}, 1), sf::randn({8, 8}, 2)}, &collectives);
    ASSERT_EQ(collectives.size(), c.collectives.size()) << testing::PrintToString(collectives);
    for (std::size_t k = 0; k < collectives.size(); ++k) {
      EXPECT_EQ(collectives[k].rfind(c.collectives[k] + " ", 0), 0u) << collectives[k];
    }
  }
}

// Values wanted in one layout now and in others by later annotations are
// moved, and ops computed, so that all of them together cost least, not
// the first alone.
TEST(Execution, ValuesWantedInSeveralLayoutsAreMovedForAllOfThem) {
  struct Case {
    std::string name;
    int devices;
    std::string mesh, input_type;
    sf::Shape input_shape;
    std::string body, result_type;
    std::vector<std::string> collectives;  // prefixes of their descriptions, in order
  };
  const std::string mesh8 = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 2, 2)", "('a', 'b', 'c')")M";
  const std::string mesh24 = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('a', 'b')")M";
  const std::string mesh16 =
      R"M([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], "(2, 2, 4)", "('a', 'b', 'c')")M";
  const Case cases[] = {
      // Rows on 'c', wanted on ('a', 'b') then on 'a': one permute to 'a'
      // and a slice. The cheapest way to ('a', 'b') alone, a slice and a
      // permute, leaves 'a' a gather.
      {"annotation_chain", 8, mesh8, "f32[1024,8]", {1024, 8},
       "  %a = " + annotate("x", "('c', None)", "f32[1024,8]", mesh8) + "\n  %e = aten::exp(%a) : f32[1024,8]\n"
       "  %b0 = " + annotate("e", "(('a', 'b'), None)", "f32[1024,8]", mesh8) + "\n"
       "  %b1 = " + annotate("b0", "('a', None)", "f32[1024,8]", mesh8) + "\n"
       "  %r = aten::sin(%b1) : f32[1024,8]\n  return %r\n",
       "f32[1024,8]", {"collective-permute over 'a', 'c' (16 KiB/device)"}},
      // A partial sum over 'a' wanted on ('b', 'a'), then on 'b': one
      // all-reduce. A reduce-scatter onto ('b', 'a') would leave 'b' a
      // gather.
      {"partial_sum_chain", 8, mesh24, "f32[13,11]", {13, 11},
       "  %a = " + annotate("x", "('b', 'a')", "f32[13,11]", mesh24) + "\n"
       "  %e = aten::sum.dim_IntList(%a, [1]) : f32[13]\n"
       "  %b0 = " + annotate("e", "(('b', 'a'),)", "f32[13]", mesh24) + "\n"
       "  %b1 = " + annotate("b0", "('b',)", "f32[13]", mesh24) + "\n"
       "  %r = aten::sin(%b1) : f32[13]\n  return %r\n",
       "f32[13]", {"all-reduce over 'a'"}},
      // Whole rows of exp, wanted on ('b', 'c'), then (('b', 'a'), 'c'),
      // then ('b', 'a'): exp runs on whole rows and every layout is a slice
      // of them. Run in the first layout (the cheapest for it alone), the
      // last needs a gather over 'c'.
      {"op_plan_sees_later_annotations", 16, mesh16, "f32[31,7]", {31, 7},
       "  %a = " + annotate("x", "(None, None)", "f32[31,7]", mesh16) + "\n  %e = aten::exp(%a) : f32[31,7]\n"
       "  %b0 = " + annotate("e", "('b', 'c')", "f32[31,7]", mesh16) + "\n"
       "  %b1 = " + annotate("b0", "(('b', 'a'), 'c')", "f32[31,7]", mesh16) + "\n"
       "  %b2 = " + annotate("b1", "('b', 'a')", "f32[31,7]", mesh16) + "\n"
       "  %r = aten::sin(%b2) : f32[31,7]\n  return %r\n",
       "f32[31,7]", {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    sf::Runtime runtime = sf::Runtime::local(c.devices);
    const std::string text = "func @f(%x: " + c.input_type + ") -> (" + c.result_type + ") {\n" + c.body + "}\n";
    expect_same_with(text, runtime, {sf::randn(c.input_shape, 6)}, c.collectives);
  }
}

// A partial sum with two uses is reduced where both are reached for least,
// not where the first one alone is: each case has the other's answer as
// the first use's cheapest way on its own.
TEST(Execution, SharedPartialSumIsReducedForAllItsUses) {
  struct Case {
    std::string name;
    int devices;
    std::string mesh, input_type;
    sf::Shape input_shape;
    std::string input_spec, sum_type, reduce, first, second;
    std::vector<std::string> collectives;  // prefixes of their descriptions, in order
  };
  const std::string mesh8 = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 2, 2)", "('a', 'b', 'c')")M";
  const std::string mesh16 =
      R"M([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], "(2, 2, 4)", "('a', 'b', 'c')")M";
  const Case cases[] = {
      // Sliced over 'b' before the all-reduce, which then sums half as
      // much; both uses start from that slice. For the first alone, the
      // all-reduce of the whole tile has one collective less on the way.
      {"slice_before_reduction", 8, mesh8, "f32[256,256,4]", {256, 256, 4}, "(None, 'c', 'a')", "f32[256,256]",
       "aten::sum.dim_IntList(%a, [2])", "(None, ('a', 'b'))", "('a', ('c', 'b'))",
       {"all-reduce over 'a' (64 KiB/device)", "collective-permute over 'a', 'b', 'c' (64 KiB/device)"}},
      // The max over 'b' is all-reduced where 'a' still splits the rows,
      // then gathered over 'a' for the first use: the second slices the
      // reduced tile. For the first alone, gathering over 'a' first and
      // all-reducing the gathered rows would do, but the second would then
      // need a third collective.
      {"reduce_before_gather", 16, mesh16, "f32[12,4]", {12, 4}, "('a', 'b')", "f32[12]", "aten::amax(%a, [1])", "('c',)",
       "(('a', 'c'),)", {"all-reduce (max) over 'b' (24 B/device)", "all-gather over 'a' (48 B/device)"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    sf::Runtime runtime = sf::Runtime::local(c.devices);
    const std::string text = "func @f(%x: " + c.input_type + ") -> (" + c.sum_type + ", " + c.sum_type + ") {\n"
                             "  %a = " + annotate("x", c.input_spec, c.input_type, c.mesh) + "\n"
                             "  %s = " + c.reduce + " : " + c.sum_type + "\n"
                             "  %b = " + annotate("s", c.first, c.sum_type, c.mesh) + "\n"
                             "  %r = aten::exp(%b) : " + c.sum_type + "\n"
                             "  %c = " + annotate("s", c.second, c.sum_type, c.mesh) + "\n"
                             "  %q = aten::sin(%c) : " + c.sum_type + "\n"
                             "  return %r, %q\n}\n";
    expect_same_with(text, runtime, {sf::randn(c.input_shape, 1)}, c.collectives);
  }
}

}  // namespace

namespace {

struct ReshardCase {
  std::string name, types, program;  // program: the lines after the header, return included
  std::vector<std::string> collectives;  // prefixes of their descriptions, in order
};

// Reshards that used to gather a whole dim (or all-reduce) where a cheaper
// sequence exists, run against one device, with the collectives they now
// take (tensors of 64-256 KiB: bytes, not the per-collective latency,
// decide): the searched sequence of all-to-alls and gathers; partial sums
// are reduce-scattered over the axes the target adds, in its order, on one
// dim or several, or onto a dim that then moves; a partial sum reduced for an
// annotation is reused by a later sum (a partial sum of its shards, not a
// gather) and by a reshard of the annotation's alias; a reduction is
// computed in its operand's layout when moving its smaller result costs
// fewer bytes than moving the operand; a reshard starts from the layout
// made so far that sends the fewest bytes.
TEST(Execution, ReshardsTakeTheCheaperSequence) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 2, 2)", "('a', 'b', 'c')")M";
  const auto resharded = [&](const std::string& from, const std::string& to) {
    return "  %a = " + annotate("x", from, "f32[256,256]", mesh) + "\n  %e = aten::exp(%a) : f32[256,256]\n"
           "  %b = " + annotate("e", to, "f32[256,256]", mesh) + "\n  %r = aten::sin(%b) : f32[256,256]\n  return %r\n";
  };
  const auto summed = [&](const std::string& from, const std::string& to) {
    return "  %a = " + annotate("x", from, "f32[256,256]", mesh) + "\n  %s = aten::sum.dim_IntList(%a, [1]) : f32[256]\n"
           "  %b = " + annotate("s", to, "f32[256]", mesh) + "\n  %r = aten::exp(%b) : f32[256]\n  return %r\n";
  };
  const auto matmul = [&](const std::string& to) {
    return "  %a = " + annotate("x", "(None, ('a', 'b'))", "f32[256,256]", mesh) + "\n"
           "  %w = " + annotate("x", "(('a', 'b'), None)", "f32[256,256]", mesh) + "\n"
           "  %m = aten::matmul(%a, %w) : f32[256,256]\n"
           "  %b = " + annotate("m", to, "f32[256,256]", mesh) + "\n  %r = aten::exp(%b) : f32[256,256]\n  return %r\n";
  };
  const std::string partial = "  %a = " + annotate("x", "(None, ('a', 'b'))", "f32[256,256]", mesh) + "\n"
                              "  %p = aten::amax(%a, [1]) : f32[256]\n";
  const ReshardCase cases[] = {
      {"dest_blocked", "f32[256,256]", resharded("('a', 'b')", "(None, 'a')"),
       {"all-gather over 'b'", "all-to-all over 'a'"}},
      // Both axes move (48 KiB sent), then 'b' is gathered (64 KiB), where
      // gathering 'b' first and moving 'a' sends 128 KiB.
      {"source_minor_moves_then_gathers", "f32[256,256]", resharded("(('a', 'b'), None)", "(None, 'a')"),
       {"all-to-all over 'a', 'b' (64 KiB/device)", "all-gather over 'b' (128 KiB/device)"}},
      // The gather keeps 'a' on dim 0, which the target leaves whole (the
      // re-materialisation check ran past the target's axes: a crash).
      {"gather_keeps_an_axis_the_dim_drops", "f32[65536,2]",
       "  %v = aten::reshape(%x, [65536, 1]) : f32[65536,1]\n"
       "  %w = aten::expand(%v, [65536, 2]) : f32[65536,2]\n"
       "  %a = " + annotate("w", "(('a', 'b'), None)", "f32[65536,2]", mesh) + "\n"
       "  %b = " + annotate("a", "(None, 'a')", "f32[65536,2]", mesh) + "\n  return %b\n",
       {"all-gather over 'b'", "all-to-all over 'a'"}},
      {"scatter_then_slice", "f32[256]", summed("(None, 'a')", "(('a', 'b'),)"), {"reduce-scatter over 'a'"}},
      {"scatter_reordered", "f32[256]", summed("(None, ('a', 'b'))", "(('b', 'a'),)"),
       {"reduce-scatter over 'b', 'a'"}},
      // 256 KiB of partial sums: a scatter and an all-reduce of half of
      // them send 256 KiB, one all-reduce 384 KiB (the extra collective's
      // latency counts 64 KiB). At 1 KiB, one all-reduce.
      {"scatter_then_all_reduce", "f32[65536]",
       "  %v = aten::reshape(%x, [65536, 1]) : f32[65536,1]\n"
       "  %w = aten::expand(%v, [65536, 4]) : f32[65536,4]\n"
       "  %a = " + annotate("w", "(None, ('a', 'b'))", "f32[65536,4]", mesh) + "\n"
       "  %s = aten::sum.dim_IntList(%a, [1]) : f32[65536]\n"
       "  %b = " + annotate("s", "('b',)", "f32[65536]", mesh) + "\n  %r = aten::exp(%b) : f32[65536]\n  return %r\n",
       {"reduce-scatter over 'b'", "all-reduce over 'a'"}},
      {"all_reduce_when_small", "f32[256]", summed("(None, ('a', 'b'))", "('b',)"), {"all-reduce over 'a', 'b'"}},
      {"scatter_on_two_dims", "f32[256,256]", matmul("('b', 'a')"),
       {"all-to-all over 'a', 'b'", "reduce-scatter over 'a'", "reduce-scatter over 'b'"}},
      // Partial over 'a' with rows on 'c', wanted on ('b', 'c'): scattered
      // to ('c', 'a') and relabelled, 256 KiB with the latencies. Before
      // partial sums were searched: %a's 128 KiB tile permuted to
      // ('b', 'c') and the sum all-reduced, 320 KiB.
      {"scatter_then_permute", "f32[256,256]",
       "  %v = aten::reshape(%x, [256, 256, 1]) : f32[256,256,1]\n"
       "  %w = aten::expand(%v, [256, 256, 4]) : f32[256,256,4]\n"
       "  %a = " + annotate("w", "('c', None, 'a')", "f32[256,256,4]", mesh) + "\n"
       "  %s = aten::sum.dim_IntList(%a, [2]) : f32[256,256]\n"
       "  %b = " + annotate("s", "(('b', 'c'), None)", "f32[256,256]", mesh) + "\n"
       "  %r = aten::exp(%b) : f32[256,256]\n  return %r\n",
       {"reduce-scatter over 'a' (128 KiB/device)", "collective-permute over 'a', 'b', 'c' (64 KiB/device)"}},
      // Summed where %a is, then the 16x smaller result moves by two
      // all-to-alls, where gathering %a to the result's layout moves 384 KiB.
      {"reduction_in_operands_layout", "f32[256,16]",
       "  %v = aten::reshape(%x, [256, 16, 16]) : f32[256,16,16]\n"
       "  %a = " + annotate("v", "('a', None, 'b')", "f32[256,16,16]", mesh) + "\n"
       "  %s = aten::sum.dim_IntList(%a, [1]) : f32[256,16]\n"
       "  %b = " + annotate("s", "(None, ('a', 'b'))", "f32[256,16]", mesh) + "\n  return %b\n",
       {"all-to-all over 'b' (4 KiB/device)", "all-to-all over 'a', 'b' (4 KiB/device)"}},
      // The sum of %p takes the shards of the reduced copy: a partial sum of
      // 4 B to all-reduce, not a gather of %p.
      {"sum_of_reduced_copy", "f32[256], f32[]",
       partial + "  %q = " + annotate("p", "(('a', 'b'),)", "f32[256]", mesh) + "\n"
       "  %s = aten::sum.dim_IntList(%p, [0]) : f32[]\n  %e = aten::exp(%q) : f32[256]\n  return %e, %s\n",
       {"reduce-scatter (max) over 'a', 'b'", "all-reduce over 'a', 'b'"}},
      // The whole copy gathered for %q is sliced for %p, not moved again
      // from %a (a slice and a collective-permute).
      {"whole_copy_made_before", "f32[256,256], f32[256,256]",
       "  %a = " + annotate("x", "('a', None)", "f32[256,256]", mesh) + "\n"
       "  %q = " + annotate("a", "(None, None)", "f32[256,256]", mesh) + "\n"
       "  %p = " + annotate("a", "(('b', 'c'), None)", "f32[256,256]", mesh) + "\n"
       "  %e = aten::exp(%p) : f32[256,256]\n  return %e, %q\n",
       {"all-gather over 'a'"}},
      // %a3 starts from %a1's layout (one all-to-all), not from %a0 (two).
      {"chain_starts_from_the_closest_layout", "f32[16,16,256], f32[16,16,256]",
       "  %v = aten::reshape(%x, [16, 16, 256]) : f32[16,16,256]\n"
       "  %a0 = " + annotate("v", "('b', None, 'a')", "f32[16,16,256]", mesh) + "\n"
       "  %a1 = " + annotate("a0", "(None, 'a', 'b')", "f32[16,16,256]", mesh) + "\n"
       "  %r1 = aten::abs(%a1) : f32[16,16,256]\n"
       "  %a3 = " + annotate("a0", "(None, ('a', 'b'), None)", "f32[16,16,256]", mesh) + "\n"
       "  %r3 = aten::abs(%a3) : f32[16,16,256]\n  return %r1, %r3\n",
       {"all-to-all over 'a'", "all-to-all over 'b'", "all-to-all over 'b'"}},
      // %q is an alias of the reduced %p: the sub moves it by the same
      // all-to-alls as %q2, not by a second chain.
      {"alias_shares_reshard", "f32[256]",
       partial + "  %q = " + annotate("p", "(('a', 'b'),)", "f32[256]", mesh) + "\n"
       "  %q2 = " + annotate("p", "(('b', 'a'),)", "f32[256]", mesh) + "\n"
       "  %d = aten::sub.Tensor(%q, %q2) : f32[256]\n  return %d\n",
       {"reduce-scatter (max) over 'a', 'b'", "collective-permute"}},
  };
  for (const ReshardCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string text = "func @f(%x: f32[256,256]) -> (" + c.types + ") {\n" + c.program + "}\n";
    expect_same_with(text, runtime, {sf::randn({256, 256}, 4)}, c.collectives);
  }
}

// Uneven tiles that nest (7 rows: 2 tiles of 4 over 'x', each holding 2 of
// the 8 tiles of 1 over ('x', 'y')) move as even ones do: a gather of the
// minor axis only, a local slice, a reduce-scatter of a padded dim. Before,
// each went through the whole dim.
TEST(Execution, UnevenTilesThatNestMoveLikeEvenOnes) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('x', 'y')")M";
  const auto resharded = [&](const std::string& from, const std::string& to) {
    return "  %a = " + annotate("x", from, "f32[7,8]", mesh) + "\n  %e = aten::exp(%a) : f32[7,8]\n"
           "  %b = " + annotate("e", to, "f32[7,8]", mesh) + "\n  %r = aten::sin(%b) : f32[7,8]\n  return %r\n";
  };
  const auto summed = [&](const std::string& from, const std::string& to) {
    return "  %a = " + annotate("x", from, "f32[7,8]", mesh) + "\n  %s = aten::sum.dim_IntList(%a, [1]) : f32[7]\n"
           "  %b = " + annotate("s", to, "f32[7]", mesh) + "\n  %r = aten::exp(%b) : f32[7]\n  return %r\n";
  };
  const ReshardCase cases[] = {
      {"gather_minor_axis", "f32[7,8]", resharded("(('x', 'y'), None)", "('x', None)"), {"all-gather over 'y'"}},
      {"slice_minor_axis", "f32[7,8]", resharded("('x', None)", "(('x', 'y'), None)"), {}},
      // From whole rows: the last device's tile is padding only.
      {"scatter_whole_dim", "f32[7]", summed("(None, 'y')", "('y',)"), {"reduce-scatter over 'y' (28 B/device)"}},
      {"scatter_inside_tiles", "f32[7]", summed("('x', 'y')", "(('x', 'y'),)"),
       {"reduce-scatter over 'y' (16 B/device)"}},
  };
  for (const ReshardCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string text = "func @f(%x: f32[7,8]) -> (" + c.types + ") {\n" + c.program + "}\n";
    expect_same_with(text, runtime, {sf::randn({7, 8}, 5)}, c.collectives);
  }
}

}  // namespace

namespace {

// Propagation leaves the product's rows whole (the result annotation wants
// them so) while x offers them split over 'x': computing split and
// gathering the 4 MiB result was the default; gathering x (1 MiB) first and
// computing in the result's layout costs less, and is taken (helper probe).
TEST(Execution, ContractionGathersTheSmallerOperandRatherThanTheLargerResult) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const std::string mesh = R"M([0, 1, 2, 3], "(2, 2, 1)", "('x', 'c', 'a')")M";
  const std::string text = "func @f(%x: f32[1024,256], %w: f32[256,1024]) -> (f32[1024,1024]) {\n"
                           "  %ax = " + annotate("x", "(('a', 'x'), None)", "f32[1024,256]", mesh) + "\n"
                           "  %aw = " + annotate("w", "('a', 'c')", "f32[256,1024]", mesh) + "\n"
                           "  %y = aten::matmul(%ax, %aw) : f32[1024,1024]\n"
                           "  %r = " + annotate("y", "(None, ('c', 'a'))", "f32[1024,1024]", mesh) + "\n"
                           "  return %r\n}\n";
  std::vector<std::string> collectives;
  expect_same(text, runtime, {sf::randn({1024, 256}, 5), sf::randn({256, 1024}, 6)}, &collectives);
  ASSERT_EQ(collectives.size(), 1u) << testing::PrintToString(collectives);
  EXPECT_EQ(collectives[0].rfind("all-gather over 'x' (1 MiB/device): %y aten::matmul needs dim 0 of %ax whole", 0), 0u)
      << collectives[0];
}

}  // namespace

namespace {

// Five axes of 2: the search used to give up after 4,096 layouts (free
// slices and 120 relabellings per layout filled them) and fall back to
// gathers and all-to-alls, 704 KiB with latencies; it now finds one
// all-to-all and one collective-permute, 240 KiB.
TEST(Execution, FiveAxisReshardIsSearchedToTheEnd) {
  sf::Runtime runtime = sf::Runtime::local(32);
  std::string ids;
  for (int d = 0; d < 32; ++d) ids += (d > 0 ? ", " : "") + std::to_string(d);
  const std::string mesh = "[" + ids + R"M(], "(2, 2, 2, 2, 2)", "('a', 'b', 'c', 'd', 'e')")M";
  const std::string type = "f32[64,64,64]";
  const std::string text = "func @f(%x: " + type + ") -> (" + type + ") {\n"
                           "  %a = " + annotate("x", "(('a', 'd'), ('b', 'e'), None)", type, mesh) + "\n"
                           "  %e = aten::sin(%a) : " + type + "\n"
                           "  %b = " + annotate("e", "(('d', 'c'), None, ('b', 'a'))", type, mesh) + "\n"
                           "  %r = aten::cos(%b) : " + type + "\n  return %r\n}\n";
  std::vector<std::string> collectives;
  expect_same(text, runtime, {sf::randn({64, 64, 64}, 7)}, &collectives);
  ASSERT_EQ(collectives.size(), 2u) << testing::PrintToString(collectives);
  EXPECT_EQ(collectives[0].rfind("all-to-all over 'b', 'e' (64 KiB/device)", 0), 0u) << collectives[0];
  EXPECT_EQ(collectives[1].rfind("collective-permute over 'a', 'b', 'c', 'd', 'e' (64 KiB/device)", 0), 0u)
      << collectives[1];
}

}  // namespace

namespace {

// A reshard with too many axes to search (more than 8,192 layouts) takes the
// direct moves: each dim gathered to the axes it shares with the target,
// then sliced; it says so.
TEST(Execution, ReshardTooLargeToSearchTakesTheDirectMoves) {
  sf::Runtime runtime = sf::Runtime::local(64);
  std::string ids;
  for (int d = 0; d < 64; ++d) ids += (d > 0 ? ", " : "") + std::to_string(d);
  const std::string mesh = "[" + ids + R"M(], "(2, 2, 2, 2, 2, 2)", "('a', 'b', 'c', 'd', 'e', 'f')")M";
  const std::string type = "f32[64,64,64]";
  const std::string text = "func @f(%x: " + type + ") -> (" + type + ") {\n"
                           "  %a = " + annotate("x", "(('b', 'f', 'e'), 'd', 'a')", type, mesh) + "\n"
                           "  %e = aten::sin(%a) : " + type + "\n"
                           "  %b = " + annotate("e", "(('b', 'e', 'c', 'f'), None, None)", type, mesh) + "\n"
                           "  return %b\n}\n";
  std::vector<std::string> collectives;
  expect_same(text, runtime, {sf::randn({64, 64, 64}, 8)}, &collectives);
  ASSERT_EQ(collectives.size(), 3u) << testing::PrintToString(collectives);
  EXPECT_EQ(collectives[0].rfind("all-gather over 'f', 'e'", 0), 0u) << collectives[0];
  EXPECT_EQ(collectives[1].rfind("all-gather over 'd'", 0), 0u) << collectives[1];
  EXPECT_EQ(collectives[2].rfind("all-gather over 'a'", 0), 0u) << collectives[2];
  const sf::Graph graph = sf::parse_graph(text);
  const sf::PartitionedProgram program = sf::partition_graph(graph, sf::propagate_shardings(graph));
  ASSERT_FALSE(program.warnings.empty());
  EXPECT_NE(program.warnings[0].find("involves too many mesh axes to search for its cheapest moves"), std::string::npos)
      << program.warnings[0];
}

// A reshape merging a dim split unevenly with the dims after it is computed
// in the operand's tiles, then only the rows each device lacks move (a halo
// exchange), not the whole dim (issue 30, case 3).
TEST(Execution, ReshapeOfAnUnevenDimMovesOnlyTheMissingRows) {
  struct Case {
    std::string mesh;
    int devices;
    std::string from, reshape, to, spec_from, spec_to;
    sf::Shape shape;
    int64_t halo_bytes;
  };
  const std::string mesh2 = R"M([0, 1], "(2,)", "('x',)")M";
  const std::string mesh4 = R"M([3, 1, 0, 2], "(4,)", "('x',)")M";
  const Case cases[] = {
      // XLA's test: 7 rows of 1000 merged and split into 14 of 500; one
      // half-row of 24 x 2 x 500 floats reaches device 1.
      {mesh2, 2, "f32[16,3,7,1000]", "[24, 2, 1, 14, 500]", "f32[24,2,1,14,500]", "(None, None, 'x', None)",
       "(None, None, None, 'x', None)", {16, 3, 7, 1000}, 24 * 2 * 500 * 4},
      // 5 rows over 4 devices (tiles of 2: 2, 2, 1, 0) merged with 6
      // columns: tiles of 12 of 30 rows, wanted in tiles of 8. Devices 1-3
      // lack 4, 8 and 6 rows, each from the one before: one round of 8 rows.
      {mesh4, 4, "f32[5,6,64]", "[30, 64]", "f32[30,64]", "('x', None, None)", "('x', None)", {5, 6, 64}, 8 * 64 * 4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.from + " -> " + c.to);
    sf::Runtime runtime = sf::Runtime::local(c.devices);
    const std::string text = "func @f(%p: " + c.from + ") -> (" + c.to + ") {\n"
                             "  %a = " + annotate("p", c.spec_from, c.from, c.mesh) + "\n"
                             "  %r = aten::reshape(%a, " + c.reshape + ") : " + c.to + "\n"
                             "  %b = " + annotate("r", c.spec_to, c.to, c.mesh) + "\n"
                             "  return %b\n}\n";
    std::vector<std::string> collectives;
    expect_same(text, runtime, {sf::randn(c.shape, 9)}, &collectives);
    ASSERT_EQ(collectives.size(), 1u) << testing::PrintToString(collectives);
    EXPECT_EQ(collectives[0].rfind("collective-permute over 'x'", 0), 0u) << collectives[0];
    const sf::Graph graph = sf::parse_graph(text);
    const sf::PartitionedProgram program = sf::partition_graph(graph, sf::propagate_shardings(graph));
    EXPECT_EQ(program.collectives[0].bytes_per_device, c.halo_bytes) << collectives[0];
    EXPECT_TRUE(program.warnings.empty());
  }
}


// Position-dependent ops (rand, randn, arange) on random meshes (1-8
// devices, 1-3 axes) and random shapes split over random axes, uneven
// dims and empty tiles included: each device computes only its tile of the
// result (no whole result, no local slice), and the tiles hold exactly the
// single-device values, bit for bit.
TEST(Execution, PositionDependentOpsComputeTheirTilesOnly) {
  std::mt19937 rng(29);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const char* const draws[] = {"shardflow::rand", "shardflow::randn", "shardflow::rand_bf16", "aten::arange",
                               "aten::arange_i64"};
  for (int trial = 0; trial < 60; ++trial) {
    const std::unique_ptr<sf::Mesh> random = sf::testing_util::random_mesh(rng);
    std::vector<std::string> quoted;
    for (const std::string& name : random->axis_names()) quoted.push_back("'" + name + "'");
    const std::string mesh = fmt::format("[{}], \"({},)\", \"({},)\"", fmt::join(random->device_ids(), ", "),
                                         fmt::join(random->mesh_shape(), ","), fmt::join(quoted, ", "));
    const auto mesh_axes = static_cast<int>(random->num_axes());
    const std::string draw = draws[trial % 5];
    const bool arange = draw.starts_with("aten::arange");
    std::vector<int64_t> shape;
    for (int d = 0, rank = arange ? 1 : pick(1, 3); d < rank; ++d) shape.push_back(pick(1, 9));
    // Each axis splits at most one dim, or none; dims of one element stay whole.
    std::vector<int> axes(static_cast<std::size_t>(mesh_axes));
    std::iota(axes.begin(), axes.end(), 0);
    std::shuffle(axes.begin(), axes.end(), rng);
    std::vector<std::vector<std::string>> dim_axes(shape.size());
    for (int axis : axes) {
      const auto d = static_cast<std::size_t>(pick(0, static_cast<int>(shape.size())));
      if (d < shape.size() && shape[d] > 1) dim_axes[d].push_back(quoted[static_cast<std::size_t>(axis)]);
    }
    std::vector<std::string> dims;
    for (const std::vector<std::string>& names : dim_axes) {
      dims.push_back(names.empty() ? "None" : fmt::format("({},)", fmt::join(names, ", ")));
    }
    const std::string spec = fmt::format("({},)", fmt::join(dims, ", "));
    const std::string dtype = draw == "shardflow::rand_bf16" ? "bf16" : draw == "aten::arange_i64" ? "i64" : "f32";
    const std::string type = fmt::format("{}[{}]", dtype, fmt::join(shape, ","));
    std::string call;
    if (arange) {
      call = fmt::format("aten::arange.start_step({}, {}, {}, dtype={})", -3, -3 + 2 * shape[0], 2, dtype);
    } else {
      call = fmt::format("{}([{}], {}{})", draw == "shardflow::rand_bf16" ? "shardflow::rand" : draw,
                         fmt::join(shape, ", "), trial, dtype == "bf16" ? ", dtype=bf16" : "");
    }
    const std::string text = fmt::format("func @f() -> ({}) {{\n  %r = {} : {}\n  %m = {}\n  return %m\n}}\n", type,
                                         call, type, annotate("r", spec, type, mesh));
    SCOPED_TRACE(text);
    sf::ops::register_all_ops();
    const sf::Graph graph = sf::parse_graph(text);
    const sf::PropagationResult shardings = sf::propagate_shardings(graph);
    const sf::PartitionedProgram program = sf::partition_graph(graph, shardings);
    const std::string listing = program.to_string(graph);
    ASSERT_EQ(program.instructions.size(), 1u) << listing;
    const sf::Instruction& computed = program.instructions[0];
    EXPECT_EQ(program.slots[static_cast<std::size_t>(computed.outputs[0])].shape,
              sf::local_shape(graph.outputs()[0]->type().shape, shardings.sharding(graph.outputs()[0])))
        << listing;
    sf::Runtime runtime = sf::Runtime::local(random->size());
    const sf::DenseTensor expected = sf::run_graph(graph, {})[0];
    const sf::DenseTensor actual = sf::run_program(program, runtime, {})[0].value();
    ASSERT_EQ(actual.nbytes(), expected.nbytes());
    EXPECT_EQ(std::memcmp(actual.data(), expected.data(), expected.nbytes()), 0) << listing;
  }
}
}  // namespace
