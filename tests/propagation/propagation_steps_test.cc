// The steps of propagation across one op, each checked alone
// (src/propagation/propagation_steps.h). To add a case: parse a one-op graph
// with one_op, set the dims of its operands and results, call the step.
#include "propagation_steps.h"

#include <gtest/gtest.h>

#include <numeric>

#include "shardflow/ir/text.h"
#include "shardflow/ops/ops.h"

namespace sf = shardflow;
namespace pd = shardflow::propagation_detail;

namespace {

constexpr int kA = 0, kB = 1;  // the axes of mesh(): a=2, b=4

const sf::Mesh& mesh() {
  static const sf::Mesh mesh(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {2, 4}, {"a", "b"}, 8);
  return mesh;
}

// A value's state with no dims.
pd::ValueState make_state(bool closed, int64_t bytes) {
  pd::ValueState state;
  state.closed = closed;
  state.bytes = bytes;
  return state;
}

// The last node of a graph, its rule, and an open, replicated state for each
// of its operands and results (in that order).
struct OneOp {
  sf::Graph graph;
  const sf::Node* node = nullptr;
  sf::OpShardingRule rule{};
  std::vector<pd::ValueState> states{};

  std::vector<pd::ValueState*> tensors() {
    std::vector<pd::ValueState*> pointers;
    for (pd::ValueState& state : states) pointers.push_back(&state);
    return pointers;
  }
  // Fixes tensor t's dims, as an annotation of `value` would.
  void annotate(std::size_t t, std::vector<std::vector<int>> dims, const sf::Value* value) {
    states[t].closed = true;
    states[t].dims = std::move(dims);
    for (sf::ShardingOrigin& origin : states[t].origins) origin.source = value;
  }
};

OneOp one_op(const char* text) {
  sf::ops::register_all_ops();
  OneOp op{sf::parse_graph(text)};
  op.node = op.graph.nodes().back().get();
  std::vector<sf::Value*> values = op.node->inputs();
  values.insert(values.end(), op.node->outputs().begin(), op.node->outputs().end());
  std::vector<sf::TensorType> in, out;
  for (const sf::Value* v : op.node->inputs()) in.push_back(v->type());
  for (const sf::Value* v : op.node->outputs()) out.push_back(v->type());
  op.rule = op.node->op().sharding_rule(op.node->op_args(), in, out);
  for (const sf::Value* v : values) {
    pd::ValueState state;
    state.dims.resize(static_cast<std::size_t>(v->type().rank()));
    state.origins.resize(state.dims.size());
    state.bytes = v->type().nbytes();
    op.states.push_back(std::move(state));
  }
  return op;
}

OneOp matmul() {
  OneOp op = one_op(R"IR(func @f(%x: f32[8,16], %w: f32[16,32]) -> (f32[8,32]) {
  %h = aten::matmul(%x, %w) : f32[8,32]
  return %h
}
)IR");
  EXPECT_EQ(op.rule.to_string(), "([i, k], [k, j])->([i, j]) {i=8, j=32, k=16} reduction={k}");
  return op;
}
constexpr int kI = 0, kJ = 1, kK = 2;  // matmul's factors
constexpr std::size_t kX = 0, kW = 1, kH = 2;  // and tensors

std::vector<std::vector<int>> axes_of(const std::vector<pd::Candidate>& candidates) {
  std::vector<std::vector<int>> axes;
  for (const pd::Candidate& candidate : candidates) axes.push_back(candidate.axes);
  return axes;
}

using Axes = std::vector<std::vector<int>>;

// Step 1 --------------------------------------------------------------------

TEST(PropagationSteps, GatherCollectsEveryTensorsProposalForAFactor) {
  OneOp op = matmul();
  op.states[kX].dims = {{kA}, {}};
  op.states[kH].dims = {{kB}, {}};
  const auto candidates = pd::gather_candidates(mesh(), op.rule, op.tensors());
  ASSERT_EQ(candidates.size(), 3u);
  // %x offers i [a], %h offers i [b]: both are kept, in tensor order, for
  // step 2 to choose between.
  EXPECT_EQ(axes_of(candidates[kI]), (Axes{{kA}, {kB}}));
  EXPECT_EQ(candidates[kI][1].tensor, &op.states[kH]);
  EXPECT_EQ(candidates[kI][1].dim, 0);
  // Replicated dims offer their factors no axes.
  EXPECT_EQ(axes_of(candidates[kK]), (Axes{{}, {}}));
  EXPECT_EQ(axes_of(candidates[kJ]), (Axes{{}, {}}));
}

TEST(PropagationSteps, GatherDropsAxesAMergedDimCannotGiveItsFactors) {
  OneOp op = one_op(R"IR(func @f(%x: f32[6,8]) -> (f32[48]) {
  %r = aten::reshape(%x, [48]) : f32[48]
  return %r
}
)IR");
  ASSERT_EQ(op.rule.to_string(), "([i, j])->([ij]) {i=6, j=8}");
  // [a] splits the major factor i (6 / 2), but i is not whole, so j gets
  // nothing from the merged dim.
  op.states[1].dims = {{kA}};
  auto candidates = pd::gather_candidates(mesh(), op.rule, op.tensors());
  EXPECT_EQ(axes_of(candidates[0]), (Axes{{}, {kA}}));
  EXPECT_EQ(axes_of(candidates[1]), (Axes{{}}));
  // [b] (4) does not divide i (6): the merged dim offers nothing at all.
  op.states[1].dims = {{kB}};
  candidates = pd::gather_candidates(mesh(), op.rule, op.tensors());
  EXPECT_EQ(axes_of(candidates[0]), (Axes{{}, {}}));
  EXPECT_EQ(axes_of(candidates[1]), (Axes{{}}));
}

// Step 2 --------------------------------------------------------------------

TEST(PropagationSteps, BestCandidateIsAnnotatedThenLongestThenLargest) {
  const pd::ValueState open_small = make_state(false, 10), open_large = make_state(false, 1000), closed = make_state(true, 10);
  EXPECT_EQ(pd::best_candidate({}), nullptr);
  // An annotation that keeps the factor whole beats any open proposal.
  std::vector<pd::Candidate> list{{{kA, kB}, &open_large, 0}, {{}, &closed, 0}};
  EXPECT_EQ(pd::best_candidate(list), &list[1]);
  // Among open tensors, more axes first, then the larger tensor.
  list = {{{kA}, &open_large, 0}, {{kA, kB}, &open_small, 0}};
  EXPECT_EQ(pd::best_candidate(list), &list[1]);
  list = {{{kA}, &open_small, 0}, {{kB}, &open_large, 0}};
  EXPECT_EQ(pd::best_candidate(list), &list[1]);
  // Equals: the first (the operands before the results).
  list = {{{kA}, &open_small, 0}, {{kB}, &open_small, 1}};
  EXPECT_EQ(pd::best_candidate(list), &list[0]);
}

TEST(PropagationSteps, SettleMergesCompatibleProposals) {
  OneOp op = one_op(R"IR(func @f(%x: f32[8,6]) -> (f32[8,6]) {
  %y = aten::relu(%x) : f32[8,6]
  return %y
}
)IR");
  // %x proposes i [a], %y i [a, b]: [a] is a prefix, the longer list wins.
  op.states[0].dims = {{kA}, {}};
  op.states[1].dims = {{kA, kB}, {}};
  const auto candidates = pd::gather_candidates(mesh(), op.rule, op.tensors());
  const pd::SettledFactors settled = pd::settle_factors(op.rule, mesh().num_axes(), candidates, 192);
  EXPECT_EQ(settled.axes, (Axes{{kA, kB}, {}}));
  ASSERT_NE(settled.sources[0], nullptr);
  EXPECT_EQ(settled.sources[0]->tensor, &op.states[1]);
  EXPECT_EQ(settled.sources[1], nullptr);  // no candidate had axes
}

TEST(PropagationSteps, SettleGivesAnAxisToOneFactorPassThroughFirst) {
  OneOp op = matmul();
  // The contracted k and the kept j both want a: j settles first (sharding
  // it costs no reduction), k gets what is left, nothing.
  op.states[kX].dims = {{}, {kA}};
  op.states[kW].dims = {{}, {kA}};
  const auto candidates = pd::gather_candidates(mesh(), op.rule, op.tensors());
  const pd::SettledFactors settled = pd::settle_factors(op.rule, mesh().num_axes(), candidates, 8 * 32 * 4);
  EXPECT_EQ(settled.axes[kJ], (std::vector<int>{kA}));
  EXPECT_EQ(settled.axes[kK], (std::vector<int>{}));
  EXPECT_EQ(settled.axes[kI], (std::vector<int>{}));
}

TEST(PropagationSteps, SettleLetsAnOpenPassThroughFactorGoBeforeAnAnnotatedReduction) {
  OneOp op = matmul();
  // %x annotated with k on [a, b]; the open %h wants j on [b]. j (kept, from
  // an open tensor) settles before k (contracted, even from an annotation):
  // j takes b, and k keeps its axes up to b, [a].
  op.annotate(kX, {{}, {kA, kB}}, op.node->inputs()[0]);
  op.states[kH].dims = {{}, {kB}};
  const auto candidates = pd::gather_candidates(mesh(), op.rule, op.tensors());
  const pd::SettledFactors settled = pd::settle_factors(op.rule, mesh().num_axes(), candidates, 8 * 32 * 4);
  EXPECT_EQ(settled.axes[kJ], (std::vector<int>{kB}));
  EXPECT_EQ(settled.axes[kK], (std::vector<int>{kA}));
  // The annotation keeps i whole: its candidate wins with no axes.
  EXPECT_EQ(settled.axes[kI], (std::vector<int>{}));
  EXPECT_EQ(settled.sources[kI], nullptr);
}

TEST(PropagationSteps, SettleRanksPassThroughThenLookupsThenReductions) {
  OneOp op = matmul();
  const pd::ValueState open = make_state(false, 100), closed = make_state(true, 100);
  EXPECT_EQ(pd::settle_rank(op.rule, kJ, {{kA}, &closed, 1}, 100), 0);
  EXPECT_EQ(pd::settle_rank(op.rule, kJ, {{kA}, &open, 1}, 100), 2);
  EXPECT_EQ(pd::settle_rank(op.rule, kK, {{kA}, &closed, 1}, 100), 3);
  EXPECT_EQ(pd::settle_rank(op.rule, kK, {{kA}, &open, 1}, 100), 4);

  OneOp lookup = one_op(R"IR(func @f(%t: f32[1000,64], %i: i64[4,8]) -> (f32[4,8,64]) {
  %e = aten::embedding(%t, %i) : f32[4,8,64]
  return %e
}
)IR");
  ASSERT_EQ(lookup.rule.to_string(), "([l, k], [i, j])->([i, j, k]) {i=4, j=8, k=64, l=1000} indexed={l}");
  constexpr int kL = 3;
  // An annotated table more than twice the rows is looked up in its shards:
  // its vocabulary settles right after the annotated pass-through factors.
  const pd::ValueState table = make_state(true, 1000 * 64 * 4);
  EXPECT_EQ(pd::settle_rank(lookup.rule, kL, {{kA}, &table, 0}, 4 * 8 * 64 * 4), 1);
  EXPECT_EQ(pd::settle_rank(lookup.rule, kL, {{kA}, &table, 0}, 1000 * 64 * 4), 3);
}

TEST(PropagationSteps, SettleSkipsNeedReplicationFactors) {
  OneOp op = one_op(R"IR(func @f(%x: f32[8,6]) -> (f32[8,6]) {
  %s = aten::softmax.int(%x, 1) : f32[8,6]
  return %s
}
)IR");
  op.states[0].dims = {{kB}, {kA}};
  const auto candidates = pd::gather_candidates(mesh(), op.rule, op.tensors());
  const pd::SettledFactors settled = pd::settle_factors(op.rule, mesh().num_axes(), candidates, 192);
  // The softmax dim stays whole; the batch dim takes [b].
  EXPECT_EQ(settled.axes, (Axes{{kB}, {}}));
  EXPECT_EQ(settled.sources[1], nullptr);
}

// Step 3 --------------------------------------------------------------------

TEST(PropagationSteps, ExtendDimGainsOnlyFreeAxesAtTheMinorEnd) {
  // Extends [a] to [a, b].
  EXPECT_EQ(pd::extend_dim({{kA}, {}}, 0, {kA, kB}), (std::vector<int>{kA, kB}));
  // b is on dim 1 already: dim 0 gains a only.
  EXPECT_EQ(pd::extend_dim({{}, {kB}}, 0, {kA, kB}), (std::vector<int>{kA}));
  // ... and nothing when b comes first.
  EXPECT_EQ(pd::extend_dim({{}, {kB}}, 0, {kB, kA}), (std::vector<int>{}));
  // A conflict ([b] wanted where [a] is) and nothing new leave the dim as it is.
  EXPECT_EQ(pd::extend_dim({{kA}, {}}, 0, {kB}), (std::vector<int>{kA}));
  EXPECT_EQ(pd::extend_dim({{kA, kB}, {}}, 0, {kA}), (std::vector<int>{kA, kB}));
}

TEST(PropagationSteps, ExtendTensorRecordsTheOriginThroughTheOp) {
  OneOp op = matmul();
  const sf::Value* w = op.node->inputs()[1];
  op.annotate(kW, {{}, {kB}}, w);
  const auto candidates = pd::gather_candidates(mesh(), op.rule, op.tensors());
  const pd::SettledFactors settled = pd::settle_factors(op.rule, mesh().num_axes(), candidates, 8 * 32 * 4);
  // %x has no dim of j: nothing to gain.
  EXPECT_FALSE(pd::extend_tensor(mesh(), op.rule, op.rule.operands[0], settled, *op.node, op.states[kX]));
  EXPECT_EQ(op.states[kX].dims, (Axes{{}, {}}));
  // %h's dim 1 takes j's [b], from the annotation of %w, through the matmul.
  ASSERT_TRUE(pd::extend_tensor(mesh(), op.rule, op.rule.results[0], settled, *op.node, op.states[kH]));
  EXPECT_EQ(op.states[kH].dims, (Axes{{}, {kB}}));
  EXPECT_EQ(op.states[kH].origins[1].source, w);
  EXPECT_EQ(op.states[kH].origins[1].through(), (std::vector<const sf::Node*>{op.node}));
  EXPECT_EQ(op.states[kH].origins[0].source, nullptr);
  // A second time: nothing new.
  EXPECT_FALSE(pd::extend_tensor(mesh(), op.rule, op.rule.results[0], settled, *op.node, op.states[kH]));
}

}  // namespace
