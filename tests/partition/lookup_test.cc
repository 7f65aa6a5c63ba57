// Lookups in a table sharded along the dim they index (embedding's
// vocabulary, index_select's source dim): each device looks up the indices
// that fall in its shard and gives zeros for the others, and one all-reduce
// of the small result replaces a gather of the whole table. Writes into a
// tensor sharded along the dim they index (index_copy into a KV cache split
// over its positions): each device writes the rows its shard holds, with no
// collective at all.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "shardflow/partition/program.h"
#include "shardflow/runtime/executor.h"
#include "shardflow/shardflow.h"
#include "shardflow/trace/interpreter.h"

namespace sf = shardflow;

namespace {

struct PartitionedRun {
  std::vector<std::string> collectives;  // described
  int lookups_in_shards = 0;             // compute instructions with an index window (lookups or writes)
  std::string program;
};

// Partitions and runs `text` on the runtime, compares every output with one
// device exactly (a lookup adds one row to zeros), and reports the program.
PartitionedRun run_and_compare(const std::string& text, sf::Runtime& runtime,
                               const std::vector<sf::Tensor>& inputs) {
  sf::ops::register_all_ops();
  const sf::Graph graph = sf::parse_graph(text);
  sf::verify_graph(graph);
  const sf::PropagationResult shardings = sf::propagate_shardings(graph);
  const sf::PartitionedProgram program = sf::partition_graph(graph, shardings);
  PartitionedRun run;
  run.program = program.to_string(graph);
  for (const sf::CollectiveInfo& info : program.collectives)
    run.collectives.push_back(info.describe(*program.mesh));
  for (const sf::Instruction& instruction : program.instructions) {
    run.lookups_in_shards += instruction.indexed_input >= 0 ? 1 : 0;
  }
  std::vector<sf::DenseTensor> values;
  for (const sf::Tensor& input : inputs) values.push_back(input.value());
  const std::vector<sf::DenseTensor> expected = sf::run_graph(graph, values);
  const std::vector<sf::Tensor> actual = sf::run_program(program, runtime, inputs);
  EXPECT_EQ(actual.size(), expected.size());
  for (std::size_t o = 0; o < expected.size() && o < actual.size(); ++o) {
    EXPECT_EQ(actual[o].to_floats(), sf::Tensor(expected[o]).to_floats()) << "output " << o << "\n"
                                                                          << run.program;
  }
  return run;
}

std::string annotate(const std::string& value, const std::string& spec, const std::string& type,
                     const std::string& mesh) {
  return "xla::dynamo_mark_sharding(%" + value + ", " + mesh + ", \"" + spec + "\") : " + type;
}

// `%e = aten::embedding(%t, %tokens)` of a table annotated `spec` on `mesh`.
std::string embedding_program(const std::string& table, const std::string& tokens,
                              const std::string& rows, const std::string& spec,
                              const std::string& mesh) {
  return "func @f(%w: " + table + ", %tokens: " + tokens + ") -> (" + rows + ") {\n  %t = " +
         annotate("w", spec, table, mesh) + "\n  %e = aten::embedding(%t, %tokens) : " + rows +
         "\n  return %e\n}\n";
}

std::string ints(const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

// A mesh of 8 devices with 1-3 axes 'a', 'b', ... (the trial picks the
// shape), as an annotation's first three arguments, and a random non-empty
// sequence of its axes as a spec entry's items ("'b', 'a'").
std::pair<std::string, std::string> random_mesh_and_axes(int trial, std::mt19937& rng) {
  const std::vector<std::vector<int64_t>> meshes = {{8}, {2, 4}, {4, 2}, {2, 2, 2}};
  const std::vector<int64_t>& shape = meshes[static_cast<std::size_t>(trial) % meshes.size()];
  std::vector<int> axes(shape.size());
  std::iota(axes.begin(), axes.end(), 0);
  std::shuffle(axes.begin(), axes.end(), rng);
  axes.resize(std::uniform_int_distribution<std::size_t>(1, axes.size())(rng));
  std::string names, spec, sizes;
  for (std::size_t a = 0; a < shape.size(); ++a) {
    names += fmt::format("{}'{}'", a > 0 ? ", " : "", static_cast<char>('a' + a));
    sizes += fmt::format("{}{}", a > 0 ? ", " : "", shape[a]);
  }
  for (int axis : axes) spec += fmt::format("{}'{}'", spec.empty() ? "" : ", ", static_cast<char>('a' + axis));
  const char* comma = shape.size() == 1 ? "," : "";
  return {fmt::format("[0, 1, 2, 3, 4, 5, 6, 7], \"({}{})\", \"({}{})\"", sizes, comma, names, comma), spec};
}

// A vocab-sharded embedding table on a random mesh (1-3 axes, 8 devices),
// its rows over a random non-empty sequence of axes (tiles that do not
// divide the vocabulary, empty last tiles), indices at both ends and in
// between: the same rows as one device, with no gather of the table and a
// single all-reduce of the looked-up rows.
TEST(LookupInShards, EmbeddingOverAnyAxesGivesTheSingleDeviceRows) {
  sf::Runtime runtime = sf::Runtime::local(8);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const auto [mesh, spec] = random_mesh_and_axes(trial, rng);
    // More rows than twice the 6 looked up: else gathering the table moves
    // less. The first: 17 rows in 8 tiles of 3, the last two empty.
    const int64_t vocab = trial == 0 ? 17 : std::uniform_int_distribution<int64_t>(13, 70)(rng);
    const int64_t dim = std::uniform_int_distribution<int64_t>(1, 9)(rng);
    std::vector<int64_t> tokens{0, vocab - 1};
    for (int k = 0; k < 4; ++k)
      tokens.push_back(std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng));
    const std::string table = fmt::format("f32[{},{}]", vocab, dim),
                      rows = fmt::format("f32[2,3,{}]", dim);
    const std::string text =
        embedding_program(table, "i64[2,3]", rows, "((" + spec + ",), None)", mesh);
    SCOPED_TRACE(text + "tokens " + ints(tokens));
    const sf::Tensor weights = sf::randn({vocab, dim}, static_cast<uint64_t>(trial));
    const PartitionedRun run =
        run_and_compare(text, runtime, {weights, sf::Tensor::from_ints(tokens, {2, 3})});
    EXPECT_EQ(run.lookups_in_shards, 1) << run.program;
    ASSERT_EQ(run.collectives.size(), 1u) << run.program;
    EXPECT_EQ(run.collectives[0].rfind("all-reduce over", 0), 0u) << run.collectives[0];
    EXPECT_NE(run.collectives[0].find("aten::embedding looks up dim 0 of %t"), std::string::npos)
        << run.collectives[0];
  }
}

// stories15M's table on 8 devices: the decode step's lookup moves 1.1 KiB
// where gathering the table moved 35 MiB.
TEST(LookupInShards, VocabParallelEmbeddingMovesTheRowsNotTheTable) {
  sf::Runtime runtime = sf::Runtime::local(8);
  const std::string mesh = R"M([0, 1, 2, 3, 4, 5, 6, 7], "(8,)", "('model',)")M";
  const std::string text =
      embedding_program("f32[32000,288]", "i64[1,1]", "f32[1,1,288]", "('model', None)", mesh);
  const PartitionedRun run = run_and_compare(
      text, runtime,
      {sf::randn({32000, 288}, 3), sf::Tensor::from_ints(std::vector<int64_t>{31999}, {1, 1})});
  ASSERT_EQ(run.collectives.size(), 1u) << run.program;
  EXPECT_EQ(
      run.collectives[0].rfind(
          "all-reduce over 'model' (1.1 KiB/device): %e aten::embedding looks up dim 0 of %t, "
          "sharded on 'model' by the annotation at %t: each device gives the rows its shard "
          "holds and zeros for the others",
          0),
      0u)
      << run.collectives[0];
  EXPECT_NE(
      run.program.find("looks up this device's rows of dim 0 of %0 (32000 rows over 'model')"),
      std::string::npos)
      << run.program;
}

// The partial rows stay partial through an elementwise op and are
// reduce-scattered where an annotation wants them sharded. The tokens are
// read where they are: annotated whole, or left open (propagation then
// leaves them whole too, rather than handing them the batch split of the
// rows only to have the lookup gather them back).
TEST(LookupInShards, LookedUpRowsAreReducedWhereTheyAreNeeded) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const std::string mesh = R"M([0, 1, 2, 3], "(4,)", "('m',)")M";
  for (const bool tokens_annotated : {true, false}) {
    SCOPED_TRACE(tokens_annotated ? "tokens annotated whole" : "tokens open");
    const std::string tokens_line =
        tokens_annotated ? "  %k = " + annotate("tokens", "(None, None)", "i64[4,8]", mesh) + "\n" : "";
    const std::string text = "func @f(%w: f32[1000,64], %tokens: i64[4,8]) -> (f32[4,8,64]) {\n  %t = " +
                             annotate("w", "('m', None)", "f32[1000,64]", mesh) + "\n" + tokens_line +
                             "  %e = aten::embedding(%t, " + (tokens_annotated ? "%k" : "%tokens") +
                             ") : f32[4,8,64]\n"
                             "  %s = aten::mul.Scalar(%e, 2.0) : f32[4,8,64]\n"
                             "  %a = " +
                             annotate("s", "('m', None, None)", "f32[4,8,64]", mesh) +
                             "\n"
                             "  %r = aten::exp(%a) : f32[4,8,64]\n"
                             "  return %r\n}\n";
    std::vector<int64_t> tokens(32);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i * 31 % 1000);
    const PartitionedRun run = run_and_compare(
        text, runtime, {sf::randn({1000, 64}, 4), sf::Tensor::from_ints(tokens, {4, 8})});
    ASSERT_EQ(run.collectives.size(), 1u) << run.program;
    EXPECT_EQ(run.collectives[0].rfind("reduce-scatter over 'm' (8 KiB/device)", 0), 0u)
        << run.collectives[0];
  }
}

// index_select from a source sharded along the selected dim: a few rows of
// a large source are looked up in place; selecting about as many rows as
// the source has gathers the source instead (the reduction of the partial
// result would move twice its bytes).
TEST(LookupInShards, IndexSelectLooksUpInPlaceOnlyWhenThatMovesLess) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const std::string mesh = R"M([0, 1, 2, 3], "(2, 2)", "('a', 'b')")M";
  const auto program = [&](int64_t picked) {
    const std::string out = fmt::format("f32[6,{},5]", picked),
                      index = fmt::format("i64[{}]", picked);
    return "func @f(%x: f32[6,50,5], %i: " + index + ") -> (" + out +
           ") {\n"
           "  %s = " +
           annotate("x", "('a', 'b', None)", "f32[6,50,5]", mesh) +
           "\n"
           "  %y = aten::index_select(%s, 1, %i) : " +
           out +
           "\n"
           "  return %y\n}\n";
  };
  const PartitionedRun few = run_and_compare(
      program(3), runtime,
      {sf::randn({6, 50, 5}, 5), sf::Tensor::from_ints(std::vector<int64_t>{49, 0, 26}, {3})});
  EXPECT_EQ(few.lookups_in_shards, 1) << few.program;
  ASSERT_EQ(few.collectives.size(), 1u) << few.program;
  EXPECT_EQ(few.collectives[0].rfind("all-reduce over 'b'", 0), 0u) << few.collectives[0];

  std::vector<int64_t> most(40);
  for (std::size_t i = 0; i < most.size(); ++i) most[i] = static_cast<int64_t>(49 - i);
  const PartitionedRun many = run_and_compare(
      program(40), runtime, {sf::randn({6, 50, 5}, 6), sf::Tensor::from_ints(most, {40})});
  EXPECT_EQ(many.lookups_in_shards, 0) << many.program;
  ASSERT_EQ(many.collectives.size(), 1u) << many.program;
  EXPECT_EQ(many.collectives[0].rfind("all-gather over 'b'", 0), 0u) << many.collectives[0];
}

// Vocab-parallel cross-entropy's pick of each row's label: logits split
// over the vocabulary (evenly and not) give each row's logit with one
// all-reduce of the picked values, where gathering the logits moves the
// whole vocabulary of every row.
TEST(LookupInShards, GatherFromVocabShardedLogitsPicksInTheShards) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const std::string mesh = R"M([0, 1, 2, 3], "(2, 2)", "('d', 'm')")M";
  for (const int64_t vocab : {1000, 999}) {
    const std::string logits = fmt::format("f32[6,{}]", vocab);
    const std::string text = "func @f(%x: " + logits +
                             ", %labels: i64[6,1]) -> (f32[6,1]) {\n"
                             "  %l = " +
                             annotate("x", "('d', 'm')", logits, mesh) +
                             "\n"
                             "  %y = aten::gather(%l, 1, %labels) : f32[6,1]\n"
                             "  return %y\n}\n";
    SCOPED_TRACE(text);
    const std::vector<int64_t> labels{0, vocab - 1, vocab / 2, 1, vocab - 2, 3};
    const PartitionedRun run = run_and_compare(
        text, runtime, {sf::randn({6, vocab}, 8), sf::Tensor::from_ints(labels, {6, 1})});
    EXPECT_EQ(run.lookups_in_shards, 1) << run.program;
    ASSERT_EQ(run.collectives.size(), 1u) << run.program;
    EXPECT_EQ(run.collectives[0].rfind(
                  "all-reduce over 'm' (12 B/device): %y aten::gather looks up dim 1 of %l", 0),
              0u)
        << run.collectives[0];
  }
}

// An index past the table is the single-device error on every device, not
// a zero row: each device checks all indices against the whole vocabulary.
TEST(LookupInShards, AnIndexPastTheTableIsTheSingleDeviceError) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const std::string mesh = R"M([0, 1, 2, 3], "(4,)", "('m',)")M";
  const std::string text = embedding_program("f32[10,3]", "i64[2]", "f32[2,3]", "('m', None)", mesh);
  sf::ops::register_all_ops();
  const sf::Graph graph = sf::parse_graph(text);
  const sf::PartitionedProgram program = sf::partition_graph(graph, sf::propagate_shardings(graph));
  const std::vector<sf::Tensor> inputs{sf::randn({10, 3}, 1),
                                       sf::Tensor::from_ints(std::vector<int64_t>{3, 10}, {2})};
  std::string single, sharded;
  try {
    sf::run_graph(graph, std::vector<sf::DenseTensor>{inputs[0].value(), inputs[1].value()});
  } catch (const sf::Error& e) {
    single = e.what();
  }
  try {
    sf::run_program(program, runtime, inputs);
  } catch (const sf::Error& e) {
    sharded = e.what();
  }
  EXPECT_NE(
      single.find(
          "index out of range in self: index 10 is out of bounds for dimension 0 with size 10"),
      std::string::npos)
      << single;
  EXPECT_NE(
      sharded.find(
          "index out of range in self: index 10 is out of bounds for dimension 0 with size 10"),
      std::string::npos)
      << sharded;
}

// A KV cache [2, S, 3, D] split over its positions on a random mesh (1-3
// axes, 8 devices), over a random non-empty sequence of axes (tiles that do
// not divide S, empty last tiles), updated at 1-3 positions (both ends,
// repeats: the last write wins): the single-device result, each device
// writing only the rows it holds, and no collective.
TEST(WritesInShards, CacheSplitOverPositionsIsUpdatedWhereItLies) {
  sf::Runtime runtime = sf::Runtime::local(8);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const auto [mesh, spec] = random_mesh_and_axes(trial, rng);
    // The first: 5 positions in 8 tiles of 1, the last three empty.
    const int64_t positions = trial == 0 ? 5 : std::uniform_int_distribution<int64_t>(2, 40)(rng);
    const int64_t depth = std::uniform_int_distribution<int64_t>(1, 5)(rng);
    std::vector<int64_t> written{positions - 1};
    if (trial % 2 == 0) written.push_back(0);
    if (trial % 3 == 0) written.push_back(positions - 1);
    const auto count = static_cast<int64_t>(written.size());
    const std::string cache = fmt::format("f32[2,{},3,{}]", positions, depth),
                      rows = fmt::format("f32[2,{},3,{}]", count, depth),
                      cache_spec = "(None, (" + spec + ",), None, None)";
    const std::string text = "func @f(%c: " + cache + ", %at: i64[" + std::to_string(count) + "], %new: " + rows +
                             ") -> (" + cache + ") {\n  %s = " + annotate("c", cache_spec, cache, mesh) +
                             "\n  %u = aten::index_copy(%s, 1, %at, %new) : " + cache + "\n  %o = " +
                             annotate("u", cache_spec, cache, mesh) + "\n  return %o\n}\n";
    SCOPED_TRACE(text + "positions " + ints(written));
    const PartitionedRun run = run_and_compare(
        text, runtime,
        {sf::randn({2, positions, 3, depth}, static_cast<uint64_t>(trial)),
         sf::Tensor::from_ints(written, {count}), sf::randn({2, count, 3, depth}, static_cast<uint64_t>(trial) + 100)});
    EXPECT_EQ(run.lookups_in_shards, 1) << run.program;
    EXPECT_TRUE(run.collectives.empty()) << run.program;
    EXPECT_NE(run.program.find("writes this device's rows of dim 1"), std::string::npos) << run.program;
  }
}

// A position past the cache is the single-device error on every device,
// not a write that no shard takes.
TEST(WritesInShards, APositionPastTheCacheIsTheSingleDeviceError) {
  sf::Runtime runtime = sf::Runtime::local(4);
  const std::string mesh = R"M([0, 1, 2, 3], "(4,)", "('s',)")M";
  const std::string text = "func @f(%c: f32[1,8,2], %at: i64[1], %new: f32[1,1,2]) -> (f32[1,8,2]) {\n  %s = " +
                           annotate("c", "(None, 's', None)", "f32[1,8,2]", mesh) +
                           "\n  %u = aten::index_copy(%s, 1, %at, %new) : f32[1,8,2]\n  return %u\n}\n";
  sf::ops::register_all_ops();
  const sf::Graph graph = sf::parse_graph(text);
  const sf::PartitionedProgram program = sf::partition_graph(graph, sf::propagate_shardings(graph));
  const std::vector<sf::Tensor> inputs{sf::randn({1, 8, 2}, 1), sf::Tensor::from_ints(std::vector<int64_t>{8}, {1}),
                                       sf::randn({1, 1, 2}, 2)};
  const std::string expected = "index_copy_(): index 8 is out of bounds for dimension 1 with size 8";
  std::vector<sf::DenseTensor> values;
  for (const sf::Tensor& input : inputs) values.push_back(input.value());
  try {
    sf::run_graph(graph, values);
    ADD_FAILURE() << "one device accepted position 8";
  } catch (const sf::Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
  try {
    sf::run_program(program, runtime, inputs);
    ADD_FAILURE() << "4 devices accepted position 8";
  } catch (const sf::Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

}  // namespace
