// Shape ops against reference index computations written here (not the
// kernels): each row gives the expected result shape and, for every result
// element, the operand element it holds. To add a case, add a row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>

#include "op_test_util.h"
#include "shardflow/base/error.h"

namespace sf = shardflow;
using namespace shardflow::testing_util;

namespace {

using Index = std::vector<int64_t>;

const sf::Constant kNone;

TestArg ints(std::initializer_list<int64_t> values) { return std::vector<int64_t>(values); }

Index unravel(int64_t flat, const sf::Shape& shape) {
  Index index(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    index[k] = flat % shape[k];
    flat /= shape[k];
  }
  return index;
}

int64_t ravel(const Index& index, const sf::Shape& shape) {
  int64_t flat = 0;
  for (std::size_t k = 0; k < shape.size(); ++k) flat = flat * shape[k] + index[k];
  return flat;
}

// The operand index that result element `out` comes from.
using Source = std::function<Index(const Index& out, const sf::Shape& in, const sf::Shape& result)>;

// Reshapes keep the row-major order of the elements.
Source same_order() {
  return [](const Index& out, const sf::Shape& in, const sf::Shape& result) {
    return unravel(ravel(out, result), in);
  };
}

// Result dim k is operand dim perm[k].
Source permuted(std::vector<int64_t> perm) {
  return [perm](const Index& out, const sf::Shape& in, const sf::Shape&) {
    Index index(in.size());
    for (std::size_t k = 0; k < perm.size(); ++k) index[static_cast<std::size_t>(perm[k])] = out[k];
    return index;
  };
}

// Right-aligned; size-1 operand dims repeat their one element.
Source expanded() {
  return [](const Index& out, const sf::Shape& in, const sf::Shape&) {
    const std::size_t lead = out.size() - in.size();
    Index index(in.size());
    for (std::size_t d = 0; d < in.size(); ++d) index[d] = in[d] == 1 ? 0 : out[d + lead];
    return index;
  };
}

Source sliced(std::size_t dim, int64_t start, int64_t step) {
  return [=](const Index& out, const sf::Shape&, const sf::Shape&) {
    Index index = out;
    index[dim] = start + out[dim] * step;
    return index;
  };
}

Source selected(std::size_t dim, int64_t at) {
  return [=](const Index& out, const sf::Shape&, const sf::Shape&) {
    Index index = out;
    index.insert(index.begin() + static_cast<std::ptrdiff_t>(dim), at);
    return index;
  };
}

struct MovementRow {
  const char* op;
  sf::Shape input;
  std::vector<TestArg> args;  // after the tensor
  sf::Shape expected;
  Source source;
};

std::vector<MovementRow> movement_rows() {
  return {
      {"aten::reshape", {2, 3}, {ints({3, 2})}, {3, 2}, same_order()},
      {"aten::reshape", {2, 3}, {ints({-1})}, {6}, same_order()},
      {"aten::reshape", {2, 3, 4}, {ints({4, -1})}, {4, 6}, same_order()},
      {"aten::reshape", {}, {ints({1, 1})}, {1, 1}, same_order()},
      {"aten::reshape", {1}, {ints({})}, {}, same_order()},
      {"aten::reshape", {0, 3}, {ints({3, -1, 2})}, {3, 0, 2}, same_order()},
      {"aten::reshape", {4, 0}, {ints({0, 5})}, {0, 5}, same_order()},
      {"aten::view", {2, 6}, {ints({3, 4})}, {3, 4}, same_order()},
      {"aten::view", {6}, {kw("size", ints({2, -1}))}, {2, 3}, same_order()},
      {"aten::flatten", {2, 3, 4}, {}, {24}, same_order()},
      {"aten::flatten", {2, 3, 4}, {1}, {2, 12}, same_order()},
      {"aten::flatten", {2, 3, 4, 5}, {kw("start_dim", -3), kw("end_dim", -2)}, {2, 12, 5},
       same_order()},
      {"aten::flatten", {}, {}, {1}, same_order()},
      {"aten::flatten", {2, 0, 3}, {0, 1}, {0, 3}, same_order()},
      {"aten::flatten", {3}, {}, {3}, same_order()},
      {"aten::squeeze", {1, 3, 1, 2}, {}, {3, 2}, same_order()},
      {"aten::squeeze", {}, {}, {}, same_order()},
      {"aten::squeeze", {1, 0, 1}, {}, {0}, same_order()},
      {"aten::squeeze.dim", {1, 3, 1, 2}, {-2}, {1, 3, 2}, same_order()},
      {"aten::squeeze.dim", {2, 3}, {1}, {2, 3}, same_order()},
      {"aten::squeeze.dim", {}, {-1}, {}, same_order()},
      {"aten::unsqueeze", {2, 3}, {0}, {1, 2, 3}, same_order()},
      {"aten::unsqueeze", {2, 3}, {1}, {2, 1, 3}, same_order()},
      {"aten::unsqueeze", {2, 3}, {-1}, {2, 3, 1}, same_order()},
      {"aten::unsqueeze", {}, {-1}, {1}, same_order()},
      {"aten::unsqueeze", {0}, {1}, {0, 1}, same_order()},
      {"aten::permute", {2, 3, 4}, {ints({2, 0, 1})}, {4, 2, 3}, permuted({2, 0, 1})},
      {"aten::permute", {2, 3, 4}, {ints({-1, -2, -3})}, {4, 3, 2}, permuted({2, 1, 0})},
      {"aten::permute", {2, 3, 4}, {ints({1, 0, 2})}, {3, 2, 4}, permuted({1, 0, 2})},
      {"aten::permute", {3, 4, 5, 6}, {ints({0, 2, 1, 3})}, {3, 5, 4, 6}, permuted({0, 2, 1, 3})},
      {"aten::permute", {3, 4, 5, 6}, {ints({3, 1, 2, 0})}, {6, 4, 5, 3}, permuted({3, 1, 2, 0})},
      {"aten::permute", {1, 5, 1, 3}, {ints({2, 0, 3, 1})}, {1, 1, 3, 5}, permuted({2, 0, 3, 1})},
      {"aten::permute", {1, 5, 1, 3}, {ints({2, 1, 0, 3})}, {1, 5, 1, 3}, permuted({2, 1, 0, 3})},
      {"aten::permute", {}, {ints({})}, {}, permuted({})},
      {"aten::permute", {2, 0, 3}, {ints({2, 1, 0})}, {3, 0, 2}, permuted({2, 1, 0})},
      {"aten::transpose", {2, 3}, {0, 1}, {3, 2}, permuted({1, 0})},
      {"aten::transpose", {2, 3, 4}, {-1, 0}, {4, 3, 2}, permuted({2, 1, 0})},
      {"aten::transpose", {2, 3}, {1, -1}, {2, 3}, permuted({0, 1})},
      {"aten::transpose", {}, {0, -1}, {}, permuted({})},
      {"aten::expand", {3, 1}, {ints({2, 3, 4})}, {2, 3, 4}, expanded()},
      {"aten::expand", {3, 1}, {ints({-1, 5})}, {3, 5}, expanded()},
      {"aten::expand", {}, {ints({2, 3})}, {2, 3}, expanded()},
      {"aten::expand", {1}, {ints({0})}, {0}, expanded()},
      {"aten::expand", {2, 3}, {ints({2, 3})}, {2, 3}, expanded()},
      {"aten::expand", {1, 3}, {ints({4, -1}), kw("implicit", true)}, {4, 3}, expanded()},
      {"aten::expand", {2, 1, 1}, {ints({3, 2, 4, 5})}, {3, 2, 4, 5}, expanded()},
      {"aten::expand", {1, 3, 1}, {ints({1, 3, 1})}, {1, 3, 1}, expanded()},
      {"aten::slice", {5}, {0, 1, 4}, {3}, sliced(0, 1, 1)},
      {"aten::slice", {4, 6}, {1, -4, kNone, 2}, {4, 2}, sliced(1, 2, 2)},
      {"aten::slice", {4, 6}, {kw("dim", -2), kw("end", -1)}, {3, 6}, sliced(0, 0, 1)},
      {"aten::slice", {4, 6}, {0, 10}, {0, 6}, sliced(0, 4, 1)},
      {"aten::slice", {4, 6}, {0, -10, 2}, {2, 6}, sliced(0, 0, 1)},
      {"aten::slice", {4, 6}, {1, 3, 1}, {4, 0}, sliced(1, 3, 1)},
      {"aten::slice", {3, 4, 5}, {1, 1, 3}, {3, 2, 5}, sliced(1, 1, 1)},
      {"aten::slice", {4}, {}, {4}, sliced(0, 0, 1)},
      {"aten::slice", {0, 3}, {1, 1}, {0, 2}, sliced(1, 1, 1)},
      {"aten::slice", {7}, {0, 1, 7, 3}, {2}, sliced(0, 1, 3)},
      {"aten::slice", {2, 7, 3}, {1, kNone, kNone, 4}, {2, 2, 3}, sliced(1, 0, 4)},
      {"aten::select", {3}, {0, -1}, {}, selected(0, 2)},
      {"aten::select", {2, 3, 4}, {1, 2}, {2, 4}, selected(1, 2)},
      {"aten::select", {2, 3, 4}, {-1, 0}, {2, 3}, selected(2, 0)},
      {"aten::select", {1, 4}, {0, 0}, {4}, selected(0, 0)},
      {"aten::select", {2, 0}, {0, 1}, {0}, selected(0, 1)},
  };
}

// The first element whose bytes differ from the reference's, or "".
std::string first_mismatch(const sf::DenseTensor& out, const sf::DenseTensor& in,
                           const Source& source) {
  const std::size_t size = sf::element_size(out.dtype());
  for (int64_t f = 0; f < out.numel(); ++f) {
    const Index at = unravel(f, out.shape());
    const int64_t from = ravel(source(at, in.shape(), out.shape()), in.shape());
    if (std::memcmp(out.data() + f * static_cast<int64_t>(size),
                    in.data() + from * static_cast<int64_t>(size), size) != 0) {
      return "element " + std::to_string(f) + " (from " + std::to_string(from) + ")";
    }
  }
  return "";
}

TEST(ShapeOps, MovementMatchesReferenceForEveryDtype) {
  std::mt19937 rng(1);
  for (const MovementRow& row : movement_rows()) {
    for (sf::DType dtype : sf::kAllDTypes) {
      const sf::DenseTensor x = random_tensor(dtype, row.input, rng);
      std::vector<TestArg> args = {x};
      args.insert(args.end(), row.args.begin(), row.args.end());
      const sf::DenseTensor out = call(row.op, args);
      const std::string where = std::string(row.op) + " " + sf::shape_to_string(row.input) + " " +
                                std::string(sf::dtype_name(dtype));
      ASSERT_EQ(out.shape(), row.expected) << where;
      EXPECT_EQ(out.dtype(), dtype) << where;
      EXPECT_EQ(first_mismatch(out, x, row.source), "") << where;
    }
  }
}

// Ops whose bytes are unchanged return the operand's buffer; the others copy.
TEST(ShapeOps, SharesTheBufferWhenTheBytesAreUnchanged) {
  std::mt19937 rng(2);
  const sf::DenseTensor x = random_tensor(sf::DType::kF32, {2, 1, 3}, rng);
  const auto shares = [&](const std::string& op, std::vector<TestArg> args) {
    args.insert(args.begin(), x);
    return call(op, args).data() == x.data();
  };
  EXPECT_TRUE(shares("aten::reshape", {ints({3, 2})}));
  EXPECT_TRUE(shares("aten::view", {ints({6})}));
  EXPECT_TRUE(shares("aten::flatten", {}));
  EXPECT_TRUE(shares("aten::squeeze", {}));
  EXPECT_TRUE(shares("aten::unsqueeze", {0}));
  EXPECT_TRUE(shares("aten::permute", {ints({1, 0, 2})}));  // moves only the size-1 dim
  EXPECT_TRUE(shares("aten::transpose", {1, 1}));
  EXPECT_TRUE(shares("aten::expand", {ints({1, 2, 1, 3})}));
  EXPECT_TRUE(shares("aten::slice", {2, 0, 100}));
  EXPECT_TRUE(shares("aten::select", {1, 0}));
  EXPECT_TRUE(call("aten::cat", {std::vector<sf::DenseTensor>{x}}).data() == x.data());
  EXPECT_FALSE(shares("aten::permute", {ints({2, 1, 0})}));
  EXPECT_FALSE(shares("aten::expand", {ints({2, 4, 3})}));
  EXPECT_FALSE(shares("aten::slice", {2, 1}));
  EXPECT_FALSE(shares("aten::select", {0, 1}));
  EXPECT_FALSE(call("aten::stack", {std::vector<sf::DenseTensor>{x}}).data() == x.data());
}

// The interpreter and the executor skip the kernel of a call that
// reinterprets its operand. Over random shapes with size-1 dims (distinct
// element values, so a reordering shows), the claim must hold exactly when
// the kernel's bytes are the operand's: never wrong, and not missed for the
// moves of size-1 dims that decode steps are full of.
TEST(ShapeOps, ReinterpretsExactlyWhenTheKernelKeepsTheBytes) {
  std::mt19937 rng(11);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int reinterpreted = 0, reordered = 0;
  for (int trial = 0; trial < 400; ++trial) {
    sf::Shape shape;
    for (int d = pick(0, 5); d > 0; --d) shape.push_back(pick(0, 1) ? 1 : pick(2, 3));
    std::vector<float> values(static_cast<std::size_t>(sf::numel(shape)));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
    const sf::DenseTensor x = from_floats(values, shape);
    const auto rank = static_cast<int64_t>(shape.size());
    std::vector<TestArg> args{x};
    std::string op;
    switch (pick(0, 3)) {
      case 0: {
        std::vector<int64_t> perm(shape.size());
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        op = "aten::permute";
        args.push_back(perm);
        break;
      }
      case 1:
        op = "aten::transpose";
        args.push_back(rank == 0 ? 0 : pick(0, static_cast<int>(rank) - 1));
        args.push_back(rank == 0 ? 0 : pick(0, static_cast<int>(rank) - 1));
        break;
      case 2: {  // grow some size-1 dims, or only add leading ones
        std::vector<int64_t> sizes(static_cast<std::size_t>(pick(0, 2)), 1);
        for (int64_t d : shape) sizes.push_back(d == 1 && pick(0, 1) ? pick(1, 3) : d);
        op = "aten::expand";
        args.push_back(sizes);
        break;
      }
      default:
        op = "aten::unsqueeze";
        args.push_back(pick(0, static_cast<int>(rank)));
        break;
    }
    const OpRun run = run_op(op, args);
    const sf::DenseTensor& out = run.outputs.at(0);
    const bool same_bytes = out.nbytes() == x.nbytes() && std::memcmp(out.data(), x.data(), x.nbytes()) == 0;
    EXPECT_EQ(run.reinterprets, same_bytes) << op << " on " << sf::shape_to_string(shape) << " -> "
                                            << sf::shape_to_string(out.shape());
    (run.reinterprets ? reinterpreted : reordered) += 1;
  }
  EXPECT_GT(reinterpreted, 100);  // both kinds were drawn
  EXPECT_GT(reordered, 50);
}

// ------------------------------------------------------------ cat, stack

struct JoinRow {
  const char* op;
  std::vector<sf::Shape> inputs;
  int dim;
  sf::Shape expected;
};

const JoinRow kJoins[] = {
    {"aten::cat", {{2, 3}, {4, 3}}, 0, {6, 3}},
    {"aten::cat", {{2, 3}, {2, 1}, {2, 0}, {2, 2}}, -1, {2, 6}},
    {"aten::cat", {{2, 3, 4}, {2, 1, 4}}, 1, {2, 4, 4}},
    {"aten::cat", {{5}}, 0, {5}},
    {"aten::cat", {{0, 3}, {0, 3}}, 0, {0, 3}},
    {"aten::cat", {{0, 3}, {2, 3}}, 0, {2, 3}},
    {"aten::cat", {{3, 0}, {3, 0}}, 0, {6, 0}},
    {"aten::stack", {{2, 3}, {2, 3}}, 0, {2, 2, 3}},
    {"aten::stack", {{2, 3}, {2, 3}, {2, 3}}, -1, {2, 3, 3}},
    {"aten::stack", {{2, 3}, {2, 3}}, 1, {2, 2, 3}},
    {"aten::stack", {{}, {}, {}, {}}, 0, {4}},
    {"aten::stack", {{0, 2}, {0, 2}}, 2, {0, 2, 2}},
    {"aten::stack", {{4}}, -2, {1, 4}},
};

// Which input and which of its elements result element `out` comes from.
std::pair<std::size_t, Index> join_source(const JoinRow& row, std::size_t dim, Index out) {
  if (std::string(row.op) == "aten::stack") {
    const auto t = static_cast<std::size_t>(out[dim]);
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(dim));
    return {t, out};
  }
  std::size_t t = 0;
  while (out[dim] >= row.inputs[t][dim]) out[dim] -= row.inputs[t++][dim];
  return {t, out};
}

TEST(ShapeOps, CatAndStackMatchReference) {
  std::mt19937 rng(3);
  for (const JoinRow& row : kJoins) {
    for (sf::DType dtype : {sf::DType::kF32, sf::DType::kBF16, sf::DType::kBool, sf::DType::kI64}) {
      std::vector<sf::DenseTensor> inputs;
      for (const sf::Shape& shape : row.inputs) inputs.push_back(random_tensor(dtype, shape, rng));
      const sf::DenseTensor out = call(row.op, {inputs, kw("dim", row.dim)});
      ASSERT_EQ(out.shape(), row.expected) << row.op << " dim " << row.dim;
      ASSERT_EQ(out.dtype(), dtype);
      const int64_t rank = static_cast<int64_t>(row.expected.size());
      const auto dim = static_cast<std::size_t>(row.dim < 0 ? row.dim + rank : row.dim);
      const std::size_t size = sf::element_size(dtype);
      for (int64_t f = 0; f < out.numel(); ++f) {
        const auto [t, at] = join_source(row, dim, unravel(f, row.expected));
        const int64_t from = ravel(at, inputs[t].shape());
        ASSERT_EQ(std::memcmp(out.data() + f * static_cast<int64_t>(size),
                              inputs[t].data() + from * static_cast<int64_t>(size), size), 0)
            << row.op << " dim " << row.dim << " element " << f;
      }
    }
  }
}

TEST(ShapeOps, CatAndStackPromoteTypes) {
  const auto i32 = from_ints({1, 2}, {2}, sf::DType::kI32);
  const auto i64 = from_ints({3, 4}, {2}, sf::DType::kI64);
  const auto f32 = from_floats({0.5f, 1.5f}, {2});
  const auto f16 = from_ints({5, 6}, {2}, sf::DType::kF16);
  const auto bf16 = from_ints({7, 8}, {2}, sf::DType::kBF16);
  const auto flags = from_ints({1, 0}, {2}, sf::DType::kBool);
  const auto cat = [](std::vector<sf::DenseTensor> ts) {
    return call("aten::cat", {std::move(ts)});
  };
  EXPECT_EQ(cat({i32, f32}).dtype(), sf::DType::kF32);
  EXPECT_EQ(to_doubles(cat({i32, f32})), (std::vector<double>{1, 2, 0.5, 1.5}));
  EXPECT_EQ(cat({i32, i64}).dtype(), sf::DType::kI64);
  EXPECT_EQ(cat({f16, bf16}).dtype(), sf::DType::kF32);
  EXPECT_EQ(to_doubles(cat({f16, bf16})), (std::vector<double>{5, 6, 7, 8}));
  EXPECT_EQ(cat({flags, i32}).dtype(), sf::DType::kI32);
  EXPECT_EQ(to_doubles(cat({flags, i32})), (std::vector<double>{1, 0, 1, 2}));
  const auto stacked = call("aten::stack", {std::vector<sf::DenseTensor>{flags, bf16}, 1});
  EXPECT_EQ(stacked.dtype(), sf::DType::kBF16);
  EXPECT_EQ(stacked.shape(), (sf::Shape{2, 2}));
  EXPECT_EQ(to_doubles(stacked), (std::vector<double>{1, 7, 0, 8}));
}

// ------------------------------------------------------------------ errors

sf::DenseTensor zeros(sf::Shape shape, sf::DType dtype = sf::DType::kF32) {
  return sf::DenseTensor::zeros(dtype, std::move(shape));
}

std::vector<sf::DenseTensor> zeros_list(std::vector<sf::Shape> shapes) {
  std::vector<sf::DenseTensor> tensors;
  for (sf::Shape& shape : shapes) tensors.push_back(zeros(std::move(shape)));
  return tensors;
}

std::vector<ErrorRow> error_rows() {
  const char* range2 = "Dimension out of range (expected to be in range of [-2, 1], but got 2)";
  return {
      {"aten::reshape", {zeros({2, 3}), ints({2, 5})},
       "shape '[2, 5]' is invalid for input of size 6"},
      {"aten::reshape", {zeros({6}), ints({4, -1})},
       "shape '[4, -1]' is invalid for input of size 6"},
      {"aten::reshape", {zeros({6}), ints({-1, -1})}, "only one dimension can be inferred"},
      // The product wraps to 6 in 64 bits (UBSan: signed overflow); the shape is still refused.
      {"aten::reshape", {zeros({6}), ints({8589934595, 6148914685509894146})},
       "shape '[8589934595, 6148914685509894146]' is invalid for input of size 6"},
      {"aten::reshape", {zeros({6}), ints({8589934595, 6148914685509894146, -1})},
       "shape '[8589934595, 6148914685509894146, -1]' is invalid for input of size 6"},
      {"aten::reshape", {zeros({6}), ints({-2, -3})}, "invalid shape dimension -2"},
      {"aten::reshape", {zeros({0, 3}), ints({-1, 0})},
       "cannot reshape tensor of 0 elements into shape [-1, 0] because the unspecified dimension "
       "size -1 can be any value and is ambiguous"},
      {"aten::view", {zeros({2, 3}), ints({4})}, "shape '[4]' is invalid for input of size 6"},
      {"aten::flatten", {zeros({2, 3}), 1, 0},
       "flatten() has invalid args: start_dim cannot come after end_dim"},
      {"aten::flatten", {zeros({2, 3}), 2}, range2},
      {"aten::permute", {zeros({2, 3}), ints({0})},
       "permute(sparse_coo): number of dimensions in the tensor input does not match the length "
       "of the desired ordering of dimensions i.e. input.dim() = 2 is not equal to len(dims) = 1"},
      {"aten::permute", {zeros({2, 3}), ints({0, -2})},
       "permute(): duplicate dims are not allowed."},
      {"aten::permute", {zeros({2, 3}), ints({0, 2})}, range2},
      {"aten::transpose", {zeros({2, 3}), 0, 2}, range2},
      {"aten::unsqueeze", {zeros({2, 3}), 3},
       "Dimension out of range (expected to be in range of [-3, 2], but got 3)"},
      {"aten::unsqueeze", {zeros({2, 3}), -4},
       "Dimension out of range (expected to be in range of [-3, 2], but got -4)"},
      {"aten::squeeze.dim", {zeros({2, 3}), 2}, range2},
      {"aten::expand", {zeros({2, 3}), ints({3})},
       "expand(torch.FloatTensor{[2, 3]}, size=[3]): the number of sizes provided (1) must be "
       "greater or equal to the number of dimensions in the tensor (2)"},
      {"aten::expand", {zeros({2}, sf::DType::kI64), ints({})},
       "expand(torch.LongTensor{[2]}, size=[]): the number of sizes provided (0)"},
      {"aten::expand", {zeros({2, 3}), ints({2, 4})},
       "The expanded size of the tensor (4) must match the existing size (3) at non-singleton "
       "dimension 1.  Target sizes: [2, 4].  Tensor sizes: [2, 3]"},
      {"aten::expand", {zeros({3}), ints({-1, 3})},
       "The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension 0"},
      {"aten::expand", {zeros({}), ints({-1})},
       "The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension 0"},
      {"aten::expand", {zeros({1}), ints({-2})},
       "Trying to create tensor with negative dimension -2"},
      {"aten::slice", {zeros({}), 0}, "slice() cannot be applied to a 0-dim tensor."},
      {"aten::slice", {zeros({4}), 0, 0, 4, 0}, "slice step must be positive"},
      {"aten::slice", {zeros({4}), kw("step", -1)}, "slice step must be positive"},
      {"aten::slice", {zeros({4}), 1},
       "Dimension out of range (expected to be in range of [-1, 0], but got 1)"},
      {"aten::select", {zeros({3}), 0, 5},
       "select(): index 5 out of range for tensor of size [3] at dimension 0"},
      {"aten::select", {zeros({2, 3}), -1, -4},
       "select(): index -4 out of range for tensor of size [2, 3] at dimension 1"},
      {"aten::select", {zeros({2, 0}), 1, 0},
       "select(): index 0 out of range for tensor of size [2, 0] at dimension 1"},
      {"aten::select", {zeros({}), 0, 0}, "select() cannot be applied to a 0-dim tensor."},
      {"aten::cat", {std::vector<sf::DenseTensor>{}},
       "torch.cat(): expected a non-empty list of Tensors"},
      {"aten::cat", {zeros_list({{2}, {}})},
       "zero-dimensional tensor (at position 1) cannot be concatenated"},
      {"aten::cat", {zeros_list({{2, 3}, {2}})},
       "Tensors must have same number of dimensions: got 2 and 1"},
      {"aten::cat", {zeros_list({{2, 3}, {2, 3}, {3, 3}}), 1},
       "Sizes of tensors must match except in dimension 1. Expected size 2 but got size 3 for "
       "tensor number 2 in the list."},
      {"aten::cat", {zeros_list({{2, 3}}), 2}, range2},
      {"aten::stack", {std::vector<sf::DenseTensor>{}}, "stack expects a non-empty TensorList"},
      {"aten::stack", {zeros_list({{2, 3}, {2, 3}, {3, 2}})},
       "stack expects each tensor to be equal size, but got [2, 3] at entry 0 and [3, 2] at "
       "entry 2"},
      {"aten::stack", {zeros_list({{2, 3}}), 3},
       "Dimension out of range (expected to be in range of [-3, 2], but got 3)"},
  };
}

TEST(ShapeOps, ErrorsHavePyTorchMessages) {
  expect_errors(error_rows());
}

// ------------------------------------------------------------ sharding rules

struct RuleRow {
  const char* op;
  std::vector<TestArg> args;
  const char* rule;
};

std::vector<RuleRow> rule_rows() {
  return {
      // Reshape: 1:1 dims, splits, merges, size-1 dims, non-dividing groups.
      {"aten::reshape", {zeros({8}), ints({2, 4})}, "([ij])->([i, j]) {i=2, j=4}"},
      {"aten::reshape", {zeros({2, 4}), ints({8})}, "([i, j])->([ij]) {i=2, j=4}"},
      {"aten::reshape", {zeros({2, 3}), ints({3, 2})},
       "([i, j])->([k, l]) {i=2, j=3, k=3, l=2} need_replication={i, j}"},
      {"aten::reshape", {zeros({4, 3}), ints({2, 6})}, "([ij, k])->([i, jk]) {i=2, j=2, k=3}"},
      {"aten::reshape", {zeros({2, 3, 4}), ints({6, 4})}, "([i, j, k])->([ij, k]) {i=2, j=3, k=4}"},
      {"aten::reshape", {zeros({2, 1, 4}), ints({8})}, "([i, j, k])->([ik]) {i=2, j=1, k=4}"},
      {"aten::reshape", {zeros({8}), ints({2, 1, 4})}, "([ik])->([i, j, k]) {i=2, j=1, k=4}"},
      {"aten::reshape", {zeros({12, 5}), ints({2, 10, 3})},
       "([ij, k])->([i, l, m]) {i=2, j=6, k=5, l=10, m=3} need_replication={j, k}"},
      {"aten::reshape", {zeros({6, 4}), ints({4, 6})},
       "([i, j])->([k, l]) {i=6, j=4, k=4, l=6} need_replication={i, j}"},
      {"aten::reshape", {zeros({8, 3}), ints({2, 4, 3})}, "([ij, k])->([i, j, k]) {i=2, j=4, k=3}"},
      {"aten::reshape", {zeros({}), ints({1, 1})}, "([])->([i, j]) {i=1, j=1}"},
      {"aten::reshape", {zeros({0, 3}), ints({3, 0})},
       "([i, j])->([k, l]) {i=0, j=3, k=3, l=0} need_replication={i, j}"},
      {"aten::view", {zeros({5, 0}), ints({5, 0})}, "([i, j])->([i, j]) {i=5, j=0}"},
      {"aten::flatten", {zeros({2, 3, 4}), 1}, "([i, j, k])->([i, jk]) {i=2, j=3, k=4}"},
      {"aten::flatten", {zeros({})}, "([])->([i]) {i=1}"},
      // Permute and transpose: the factors move with the dims.
      {"aten::permute", {zeros({2, 3, 4}), ints({2, 0, 1})},
       "([i, j, k])->([k, i, j]) {i=2, j=3, k=4}"},
      {"aten::transpose", {zeros({2, 3}), 0, 1}, "([i, j])->([j, i]) {i=2, j=3}"},
      {"aten::transpose", {zeros({2, 3, 4}), -1, 0}, "([i, j, k])->([k, j, i]) {i=2, j=3, k=4}"},
      // Squeeze and unsqueeze: removed and new size-1 dims have own factors.
      {"aten::unsqueeze", {zeros({2, 3}), 1}, "([i, k])->([i, j, k]) {i=2, j=1, k=3}"},
      {"aten::unsqueeze", {zeros({2, 3}), -1}, "([i, j])->([i, j, k]) {i=2, j=3, k=1}"},
      {"aten::squeeze", {zeros({2, 1, 3})}, "([i, j, k])->([i, k]) {i=2, j=1, k=3}"},
      {"aten::squeeze.dim", {zeros({1, 2, 1}), 0}, "([i, j, k])->([j, k]) {i=1, j=2, k=1}"},
      // Expand: grown size-1 dims and new dims are not shared.
      {"aten::expand", {zeros({3, 1}), ints({2, 3, 4})},
       "([j, k])->([i, j, l]) {i=2, j=3, k=1, l=4}"},
      {"aten::expand", {zeros({3}), ints({-1})}, "([i])->([i]) {i=3}"},
      // Slice: a whole dim is shared, a sliced one needs replication.
      {"aten::slice", {zeros({8, 6}), 1, 0, 4},
       "([i, j])->([i, k]) {i=8, j=6, k=4} need_replication={j}"},
      {"aten::slice", {zeros({8, 6}), 1, kNone, kNone, 2},
       "([i, j])->([i, k]) {i=8, j=6, k=3} need_replication={j}"},
      {"aten::slice", {zeros({8, 6}), 1, 0, 100}, "([i, j])->([i, j]) {i=8, j=6}"},
      {"aten::slice", {zeros({8, 6}), 0, -8}, "([i, j])->([i, j]) {i=8, j=6}"},
      {"aten::select", {zeros({8, 6}), 0, 3}, "([i, j])->([j]) {i=8, j=6} need_replication={i}"},
      {"aten::select", {zeros({8, 6}), -1, 0}, "([i, j])->([i]) {i=8, j=6} need_replication={j}"},
      // Cat: each operand's cat dim needs replication; stack: the new dim is the result's.
      {"aten::cat", {zeros_list({{2, 3}, {2, 5}}), 1},
       "([i, j], [i, k])->([i, l]) {i=2, j=3, k=5, l=8} need_replication={j, k}"},
      {"aten::cat", {zeros_list({{2, 3}, {4, 3}, {1, 3}})},
       "([i, m], [j, m], [k, m])->([l, m]) {i=2, j=4, k=1, l=7, m=3} need_replication={i, j, k}"},
      {"aten::stack", {zeros_list({{2, 3}, {2, 3}})},
       "([j, k], [j, k])->([i, j, k]) {i=2, j=2, k=3}"},
      {"aten::stack", {zeros_list({{2, 3}, {2, 3}}), -1},
       "([i, j], [i, j])->([i, j, k]) {i=2, j=3, k=2}"},
      {"aten::stack", {zeros_list({{}, {}, {}})}, "([], [], [])->([i]) {i=3}"},
  };
}

TEST(ShapeOps, ShardingRules) {
  for (const RuleRow& row : rule_rows()) {
    EXPECT_EQ(run_op(row.op, row.args).rule.to_string(), row.rule) << row.op;
  }
}

// An int[] given as a small int tensor is bound as a constant but stays a
// tensor input of the call, so `self` need not be input 0 and the extra input
// gets its own factors.
TEST(ShapeOps, IntListGivenAsATensorInput) {
  sf::ops::register_all_ops();
  std::mt19937 rng(5);
  const sf::DenseTensor x = random_tensor(sf::DType::kF32, {2, 6}, rng);
  const sf::DenseTensor sizes = from_ints({2, 3, 2}, {3});
  sf::CallArg sizes_arg = sf::CallArg::tensor_arg(0, "shape");
  sizes_arg.known_int_values = std::vector<int64_t>{2, 3, 2};
  const std::vector<sf::CallArg> args = {sizes_arg, sf::CallArg::tensor_arg(1, "self")};
  const std::vector<sf::TensorType> types = {{sf::DType::kI64, {3}}, {sf::DType::kF32, {2, 6}}};
  const auto [op, bound] = sf::resolve_call("aten::reshape", args, types);
  const std::vector<sf::TensorType> inferred = op->infer(bound, types);
  EXPECT_EQ(inferred, (std::vector<sf::TensorType>{{sf::DType::kF32, {2, 3, 2}}}));
  EXPECT_EQ(op->sharding_rule(bound, types, inferred).to_string(),
            "([l], [i, jk])->([i, j, k]) {i=2, j=3, k=2, l=3}");
  const std::vector<sf::DenseTensor> inputs = {sizes, x};
  const std::vector<sf::DenseTensor> out = op->kernel(bound, inputs);
  EXPECT_EQ(out.at(0).shape(), (sf::Shape{2, 3, 2}));
  EXPECT_EQ(to_doubles(out.at(0)), to_doubles(x));
}

// Random reshapes: every factor the operand shares with the result must sit
// at the same element stride in both (so that sharding it selects the same
// elements on both sides); an operand factor the result lacks must need
// replication.
TEST(ShapeOps, ReshapeRuleFactorsLineUp) {
  std::mt19937 rng(4);
  const int64_t primes[] = {2, 2, 2, 3, 3, 5};
  // Element stride of each factor of a tensor: the row-major stride of its
  // dim times the sizes of the more minor factors in the dim.
  const auto factor_strides = [](const sf::OpShardingRule& rule, const sf::DimFactors& dims) {
    std::map<int, int64_t> strides;
    int64_t stride = 1;
    for (std::size_t d = dims.size(); d-- > 0;) {
      for (std::size_t k = dims[d].size(); k-- > 0;) {
        strides[dims[d][k]] = stride;
        stride *= rule.factors[static_cast<std::size_t>(dims[d][k])].size;
      }
    }
    return strides;
  };
  const auto random_shape = [&](std::vector<int64_t> parts) {
    std::shuffle(parts.begin(), parts.end(), rng);
    sf::Shape shape;
    for (int64_t part : parts) {
      if (shape.empty() || rng() % 2 == 0) {
        shape.push_back(part);
      } else {
        shape.back() *= part;
      }
      if (rng() % 5 == 0) shape.push_back(1);
    }
    return shape;
  };
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int64_t> parts;
    for (int64_t p : primes) {
      if (rng() % 2 == 0) parts.push_back(p);
    }
    const sf::Shape from = random_shape(parts), to = random_shape(parts);
    const sf::DenseTensor x = random_tensor(sf::DType::kI32, from, rng);
    const OpRun run = run_op("aten::reshape", {x, std::vector<int64_t>(to)});
    const std::string where = sf::shape_to_string(from) + " -> " + sf::shape_to_string(to) + ": " +
                              run.rule.to_string();
    const auto in = factor_strides(run.rule, run.rule.operands[0]);
    const auto out = factor_strides(run.rule, run.rule.results[0]);
    for (const auto& [factor, stride] : in) {
      const auto shared = out.find(factor);
      if (shared != out.end()) {
        EXPECT_EQ(shared->second, stride) << where;
      }
      const sf::Factor& f = run.rule.factors[static_cast<std::size_t>(factor)];
      if (shared == out.end() && f.size > 1) {
        EXPECT_EQ(f.kind, sf::FactorKind::kNeedReplication) << where;
      }
    }
    EXPECT_EQ(to_doubles(run.outputs[0]), to_doubles(x)) << where;
  }
}

}  // namespace
