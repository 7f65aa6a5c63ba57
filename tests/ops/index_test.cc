// Index ops (embedding, index_select, index_copy and its in-place form, gather, scatter) against
// straightforward reference loops, their errors and their sharding rules.
#include <gtest/gtest.h>

#include "op_test_util.h"
#include "shardflow/base/error.h"
#include "shardflow/ops/in_place.h"

namespace sf = shardflow;
using namespace shardflow::testing_util;

namespace {

using sf::DType;
using sf::Shape;

// The position of row-major element `flat` in `shape`.
std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> position(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    position[d] = flat % shape[d];
    flat /= shape[d];
  }
  return position;
}

int64_t ravel(const std::vector<int64_t>& position, const Shape& shape) {
  int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + position[d];
  return flat;
}

// Data dtypes, cycled through by the reference tests.
DType data_dtype(int case_number) { return sf::kAllDTypes[case_number % 6]; }
DType index_dtype(int case_number) { return case_number % 2 == 0 ? DType::kI64 : DType::kI32; }

// ---------------------------------------------------------------- embedding

TEST(IndexOps, EmbeddingMatchesReference) {
  std::mt19937 rng(1);
  int case_number = 0;
  for (const Shape& index_shape : {Shape{}, Shape{0}, Shape{5}, Shape{2, 3}, Shape{2, 0, 3}, Shape{3, 1, 4}}) {
    for (const auto& [vocabulary, width] : std::vector<std::pair<int64_t, int64_t>>{{1, 4}, {7, 3}, {6, 0}}) {
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64, DType::kBool}) {
        const auto weight = random_tensor(dtype, {vocabulary, width}, rng);
        const auto indices = random_tensor(index_dtype(case_number++), index_shape, rng, 0, vocabulary);
        const auto out = call("aten::embedding", {weight, indices});
        Shape shape = index_shape;
        shape.push_back(width);
        ASSERT_EQ(out.shape(), shape);
        EXPECT_EQ(out.dtype(), dtype);
        std::vector<double> expected;
        for (int64_t n = 0; n < indices.numel(); ++n) {
          const auto row = static_cast<int64_t>(element(indices, n));
          for (int64_t d = 0; d < width; ++d) expected.push_back(element(weight, row * width + d));
        }
        EXPECT_EQ(to_doubles(out), expected) << sf::shape_to_string(index_shape);
      }
    }
  }
}

TEST(IndexOps, EmbeddingSmallExampleAndGradientOnlyArguments) {
  const auto weight = from_floats({0, 1, 2, 3, 4, 5}, {3, 2});
  const auto indices = from_ints({2, 0, 2}, {1, 3});
  const std::vector<double> expected = {4, 5, 0, 1, 4, 5};
  EXPECT_EQ(to_doubles(call("aten::embedding", {weight, indices})), expected);
  // padding_idx, scale_grad_by_freq and sparse change only the gradient.
  EXPECT_EQ(to_doubles(call("aten::embedding", {weight, indices, kw("padding_idx", 2),
                                                kw("scale_grad_by_freq", true), kw("sparse", true)})),
            expected);
}

TEST(IndexOps, EmbeddingErrors) {
  std::mt19937 rng(2);
  const auto weight = random_tensor(DType::kF32, {5, 3}, rng);
  expect_errors({
      {"aten::embedding", {weight, random_tensor(DType::kF32, {2}, rng)},
       "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, "
       "Int; but got torch.FloatTensor instead (while checking arguments for embedding)"},
      {"aten::embedding", {weight, random_tensor(DType::kBool, {2}, rng)}, "but got torch.BoolTensor"},
      {"aten::embedding", {random_tensor(DType::kF32, {5}, rng), from_ints({0}, {1})}, "'weight' must be 2-D"},
      {"aten::embedding", {random_tensor(DType::kF32, {2, 2, 2}, rng), from_ints({0}, {1})}, "'weight' must be 2-D"},
      {"aten::embedding", {weight, from_ints({1, 7}, {2})},
       "index out of range in self: index 7 is out of bounds for dimension 0 with size 5"},
      {"aten::embedding", {weight, from_ints({5}, {}, DType::kI32)}, "index 5 is out of bounds for dimension 0 with size 5"},
      {"aten::embedding", {weight, from_ints({0, -1}, {1, 2})}, "index -1 is out of bounds for dimension 0 with size 5"},
      {"aten::embedding", {random_tensor(DType::kF32, {0, 3}, rng), from_ints({0}, {1})}, "with size 0"},
  });
}

// ------------------------------------------------------------- index_select

// out[p] = self[p with p[dim] replaced by index[p[dim]]].
std::vector<double> index_select_reference(const sf::DenseTensor& self, int64_t dim,
                                           const sf::DenseTensor& index, const Shape& out_shape) {
  std::vector<double> expected;
  for (int64_t flat = 0; flat < sf::numel(out_shape); ++flat) {
    if (self.rank() == 0) {
      expected.push_back(element(self, 0));
      continue;
    }
    std::vector<int64_t> position = unravel(flat, out_shape);
    position[dim] = static_cast<int64_t>(element(index, position[dim]));
    expected.push_back(element(self, ravel(position, self.shape())));
  }
  return expected;
}

TEST(IndexOps, IndexSelectMatchesReference) {
  std::mt19937 rng(3);
  int case_number = 0;
  for (const Shape& shape : {Shape{}, Shape{5}, Shape{3, 4}, Shape{2, 0, 3}, Shape{2, 3, 4}, Shape{1, 6}}) {
    const auto rank = static_cast<int64_t>(shape.size());
    for (int64_t dim = -std::max<int64_t>(rank, 1); dim < std::max<int64_t>(rank, 1); ++dim) {
      const int64_t wrapped = dim < 0 ? dim + std::max<int64_t>(rank, 1) : dim;
      const int64_t size = rank == 0 ? 1 : shape[wrapped];
      for (const Shape& index_shape : {Shape{}, Shape{0}, Shape{1}, Shape{4}, Shape{size + 2}}) {
        const int64_t count = sf::numel(index_shape);
        if ((size == 0 && count > 0) || (rank == 0 && count != 1)) continue;
        const DType dtype = data_dtype(case_number);
        const auto self = random_tensor(dtype, shape, rng);
        const auto index = random_tensor(index_dtype(case_number++), index_shape, rng, 0, std::max<int64_t>(size, 1));
        const auto out = call("aten::index_select", {self, dim, index});
        Shape out_shape = shape;
        if (rank > 0) out_shape[wrapped] = count;
        ASSERT_EQ(out.shape(), out_shape) << sf::shape_to_string(shape) << " dim " << dim;
        EXPECT_EQ(out.dtype(), dtype);
        EXPECT_EQ(to_doubles(out), index_select_reference(self, wrapped, index, out_shape))
            << sf::shape_to_string(shape) << " dim " << dim << " index " << sf::shape_to_string(index_shape);
      }
    }
  }
}

TEST(IndexOps, IndexSelectErrors) {
  std::mt19937 rng(4);
  const auto self = random_tensor(DType::kF32, {3, 4}, rng);
  expect_errors({
      {"aten::index_select", {self, 0, from_ints({0, 1}, {1, 2})}, "index_select(): Index is supposed to be a vector"},
      {"aten::index_select", {self, 0, from_floats({0}, {1})}, "index_select(): Expected dtype int32 or int64 for index"},
      {"aten::index_select", {self, 2, from_ints({0}, {1})},
       "Dimension out of range (expected to be in range of [-2, 1], but got 2)"},
      {"aten::index_select", {self, -3, from_ints({0}, {1})}, "Dimension out of range"},
      {"aten::index_select", {self, 1, from_ints({0, 4}, {2})},
       "index out of range in self: index 4 is out of bounds for dimension 1 with size 4"},
      {"aten::index_select", {self, -1, from_ints({-1}, {1}, DType::kI32)}, "index -1 is out of bounds for dimension 1"},
      {"aten::index_select", {random_tensor(DType::kF32, {}, rng), 0, from_ints({0, 0}, {2})},
       "index_select(): Index to scalar can have only 1 value, got 2 value(s)"},
      {"aten::index_select", {random_tensor(DType::kF32, {}, rng), 0, from_ints({1}, {1})}, "index 1 is out of bounds"},
      {"aten::index_select", {random_tensor(DType::kF32, {2, 0}, rng), 1, from_ints({0}, {1})}, "with size 0"},
  });
}

// --------------------------------------------------------------- index_copy

// A copy of self with self[p with p[dim] = index[k]] = source[p with p[dim] = k],
// for k ascending (so the last duplicate wins).
std::vector<double> index_copy_reference(const sf::DenseTensor& self, int64_t dim, const sf::DenseTensor& index,
                                         const sf::DenseTensor& source) {
  std::vector<double> expected = to_doubles(self);
  if (self.rank() == 0 || source.rank() == 0) {  // one element moves
    const auto target = static_cast<int64_t>(element(index, 0));
    expected[self.rank() == 0 ? 0 : target] = element(source, 0);
    return expected;
  }
  for (int64_t k = 0; k < index.numel(); ++k) {
    for (int64_t flat = 0; flat < source.numel(); ++flat) {
      std::vector<int64_t> position = unravel(flat, source.shape());
      if (position[dim] != k) continue;
      position[dim] = static_cast<int64_t>(element(index, k));
      expected[ravel(position, self.shape())] = element(source, flat);
    }
  }
  return expected;
}

TEST(IndexOps, IndexCopyMatchesReference) {
  std::mt19937 rng(5);
  int case_number = 0;
  for (const Shape& shape : {Shape{5}, Shape{3, 4}, Shape{2, 3, 4}, Shape{2, 0, 3}, Shape{4, 1}}) {
    const auto rank = static_cast<int64_t>(shape.size());
    for (int64_t dim = -rank; dim < rank; ++dim) {
      const int64_t wrapped = dim < 0 ? dim + rank : dim;
      const int64_t size = shape[wrapped];
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{3}, size + 2}) {  // size + 2: duplicates
        if (size == 0 && count > 0) continue;
        Shape source_shape = shape;
        source_shape[wrapped] = count;
        const DType dtype = data_dtype(case_number);
        const auto self = random_tensor(dtype, shape, rng);
        const auto source = random_tensor(dtype, source_shape, rng);
        const auto index = random_tensor(index_dtype(case_number++), {count}, rng, 0, std::max<int64_t>(size, 1));
        const auto out = call("aten::index_copy", {self, dim, index, source});
        ASSERT_EQ(out.shape(), shape);
        EXPECT_EQ(out.dtype(), dtype);
        EXPECT_EQ(to_doubles(out), index_copy_reference(self, wrapped, index, source))
            << sf::shape_to_string(shape) << " dim " << dim << " count " << count;
      }
    }
  }
}

TEST(IndexOps, IndexCopyScalarsAndZeroDimIndex) {
  const auto vector = from_floats({1, 2, 3}, {3});
  // A scalar source with a one-element index into a vector.
  EXPECT_EQ(to_doubles(call("aten::index_copy", {vector, 0, from_ints({1}, {1}), from_floats({9}, {})})),
            (std::vector<double>{1, 9, 3}));
  EXPECT_EQ(to_doubles(call("aten::index_copy", {vector, -1, from_ints({2}, {}), from_floats({9}, {1})})),
            (std::vector<double>{1, 2, 9}));
  // Scalar self: dim 0 has size 1.
  const auto scalar = from_floats({1}, {});
  const auto out = call("aten::index_copy", {scalar, 0, from_ints({0}, {1}), from_floats({7}, {1})});
  EXPECT_EQ(out.shape(), Shape{});
  EXPECT_EQ(to_doubles(out), (std::vector<double>{7}));
  EXPECT_EQ(to_doubles(call("aten::index_copy", {scalar, -1, from_ints({0}, {}), from_floats({5}, {})})),
            (std::vector<double>{5}));
}

TEST(IndexOps, IndexCopyLastDuplicateWinsAndSelfIsUnchanged) {
  const auto self = from_floats({0, 0, 0, 0, 0, 0}, {3, 2});
  const auto source = from_floats({1, 2, 3, 4, 5, 6}, {3, 2});
  const auto out = call("aten::index_copy", {self, 0, from_ints({1, 1, 0}, {3}), source});
  EXPECT_EQ(to_doubles(out), (std::vector<double>{5, 6, 3, 4, 0, 0}));
  EXPECT_EQ(to_doubles(self), (std::vector<double>(6, 0.0)));  // functional: self keeps its values
}

// The LLaMA demo's KV-cache update: new keys for positions `pos` written into
// a cache [batch, seq, heads, head_dim] along the seq dim.
TEST(IndexOps, IndexCopyKvCacheUpdate) {
  std::mt19937 rng(6);
  auto cache = sf::DenseTensor::zeros(DType::kBF16, {2, 6, 2, 3});
  const std::vector<std::pair<std::vector<int64_t>, DType>> steps = {
      {{0, 1, 2}, DType::kI64}, {{3}, DType::kI32}, {{4, 5}, DType::kI64}};
  for (const auto& [positions, dtype] : steps) {
    const auto count = static_cast<int64_t>(positions.size());
    const auto keys = random_tensor(DType::kBF16, {2, count, 2, 3}, rng);
    const auto updated = call("aten::index_copy", {cache, 1, from_ints(positions, {count}, dtype), keys});
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t s = 0; s < 6; ++s) {
        const auto found = std::find(positions.begin(), positions.end(), s);
        for (int64_t e = 0; e < 6; ++e) {  // heads * head_dim
          const double expected = found == positions.end()
                                      ? element(cache, (b * 6 + s) * 6 + e)
                                      : element(keys, (b * count + (found - positions.begin())) * 6 + e);
          ASSERT_EQ(element(updated, (b * 6 + s) * 6 + e), expected) << b << " " << s << " " << e;
        }
      }
    }
    cache = updated;
  }
}

TEST(IndexOps, IndexCopyErrors) {
  std::mt19937 rng(7);
  const auto self = random_tensor(DType::kF32, {3, 4}, rng);
  const auto source = random_tensor(DType::kF32, {2, 4}, rng);
  const auto two = from_ints({0, 1}, {2});
  expect_errors({
      {"aten::index_copy", {self, 0, from_ints({0, 1}, {2, 1}), source}, "index_copy_(): Index should have dimension 1 or 0 (got 2)"},
      {"aten::index_copy", {self, 0, two, random_tensor(DType::kF32, {}, rng)},
       "index_copy_(): When source is scalar, index should have one element (got 2)"},
      {"aten::index_copy", {self, 0, two, random_tensor(DType::kF32, {2, 4, 1}, rng)},
       "index_copy_(): When source and destination are not scalars, their dimensionality must match. "
       "Source dimensionality (3), destination dimensionality (2)"},
      {"aten::index_copy", {self, 0, from_floats({0, 1}, {2}), source},
       "index_copy_(): Expected dtype int32 or int64 for index, but got Float"},
      {"aten::index_copy", {self, 0, two, random_tensor(DType::kBF16, {2, 4}, rng)},
       "index_copy_(): self and source expected to have the same dtype, but got (self) Float and (source) BFloat16"},
      {"aten::index_copy", {self, 0, two, random_tensor(DType::kF32, {2, 5}, rng)},
       "index_copy_(): Source/destination tensor must have same slice shapes. Destination slice shape: [4] at "
       "dimension 0 and source slice shape: [5] at dimension 0."},
      {"aten::index_copy", {self, 1, two, random_tensor(DType::kF32, {3, 3}, rng)},
       "index_copy_(): Number of indices (2) should be equal to source.size(dim) (3)"},
      {"aten::index_copy", {self, 0, from_ints({0, 3}, {2}), source},
       "index_copy_(): index 3 is out of bounds for dimension 0 with size 3"},
      {"aten::index_copy", {self, -2, from_ints({-1, 0}, {2}, DType::kI32), source},
       "index_copy_(): index -1 is out of bounds for dimension 0 with size 3"},
      {"aten::index_copy", {self, 2, two, source}, "Dimension out of range"},
  });
}

// put_rows_into, index_copy's in-place form: the same rows as the op, written
// into self's own buffer, with negative indices counted from the end.
TEST(IndexOps, PutRowsIntoWritesWhatIndexCopyReturnsInPlace) {
  std::mt19937 rng(9);
  int case_number = 0;
  for (const Shape& shape : {Shape{5}, Shape{3, 4}, Shape{2, 3, 4}, Shape{1, 6, 2, 3}}) {
    const auto rank = static_cast<int64_t>(shape.size());
    for (int64_t dim = -rank; dim < rank; ++dim) {
      const int64_t wrapped = dim < 0 ? dim + rank : dim;
      const int64_t size = shape[static_cast<std::size_t>(wrapped)];
      for (int64_t count : {int64_t{0}, int64_t{1}, size + 1}) {
        Shape source_shape = shape;
        source_shape[static_cast<std::size_t>(wrapped)] = count;
        const DType dtype = data_dtype(case_number);
        auto self = random_tensor(dtype, shape, rng);
        const auto source = random_tensor(dtype, source_shape, rng);
        const auto index = random_tensor(index_dtype(case_number++), {count}, rng, -size, size);
        std::vector<int64_t> from_start;  // what index_copy takes
        for (int64_t k = 0; k < count; ++k) {
          const auto i = static_cast<int64_t>(element(index, k));
          from_start.push_back(i < 0 ? i + size : i);
        }
        const auto expected = call("aten::index_copy", {self, dim, from_ints(from_start, {count}), source});
        const std::byte* buffer = self.data();
        sf::ops::put_rows_into(self, dim, index, source);
        EXPECT_EQ(self.data(), buffer);
        EXPECT_EQ(to_doubles(self), to_doubles(expected)) << sf::shape_to_string(shape) << " dim " << dim;
      }
    }
  }
}

TEST(IndexOps, PutRowsIntoTakesSourceWithoutLeadingOnes) {
  auto cache = sf::DenseTensor::zeros(DType::kF32, {1, 2, 3, 2});  // [batch, heads, positions, head_dim]
  sf::ops::put_rows_into(cache, 2, from_ints({-1}, {1}), from_floats({1, 2, 3, 4}, {2, 1, 2}));
  EXPECT_EQ(to_doubles(cache), (std::vector<double>{0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 3, 4}));
}

TEST(IndexOps, PutRowsIntoErrors) {
  std::mt19937 rng(10);
  auto self = random_tensor(DType::kF32, {3, 4}, rng);
  const auto before = to_doubles(self);
  const auto source = random_tensor(DType::kF32, {2, 4}, rng);
  const auto expect_error = [&](int64_t dim, const sf::DenseTensor& index, const sf::DenseTensor& src,
                                const std::string& message) {
    try {
      sf::ops::put_rows_into(self, dim, index, src);
      ADD_FAILURE() << "no error; expected: " << message;
    } catch (const sf::Error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  };
  expect_error(0, from_ints({0, 3}, {2}), source, "index 3 is out of bounds for dimension 0 with size 3");
  expect_error(0, from_ints({-4, 0}, {2}), source, "index -4 is out of bounds for dimension 0 with size 3");
  expect_error(0, from_ints({0, 1}, {2}), random_tensor(DType::kBF16, {2, 4}, rng),
               "index_copy_(): self and source expected to have the same dtype, but got (self) Float and (source) "
               "BFloat16");
  expect_error(1, from_ints({0, 1}, {2}), source,
               "index_copy_(): Source/destination tensor must have same slice shapes. Destination slice shape: [3] "
               "at dimension 1 and source slice shape: [2] at dimension 0.");
  EXPECT_EQ(to_doubles(self), before);  // checked before anything is written
}

// ------------------------------------------------------------------- gather

// out[p] = self[p with p[dim] replaced by index[p]]; scalars act as [1].
std::vector<double> gather_reference(const sf::DenseTensor& self, int64_t dim, const sf::DenseTensor& index) {
  const Shape self_shape = self.rank() == 0 ? Shape{1} : self.shape();
  const Shape index_shape = index.rank() == 0 ? Shape{1} : index.shape();
  std::vector<double> expected;
  for (int64_t flat = 0; flat < index.numel(); ++flat) {
    std::vector<int64_t> position = unravel(flat, index_shape);
    position[dim] = static_cast<int64_t>(element(index, flat));
    expected.push_back(element(self, ravel(position, self_shape)));
  }
  return expected;
}

TEST(IndexOps, GatherMatchesReference) {
  std::mt19937 rng(8);
  int case_number = 0;
  for (const Shape& shape : {Shape{}, Shape{5}, Shape{3, 4}, Shape{2, 3, 4}, Shape{2, 0, 3}, Shape{1, 5}}) {
    const int64_t rank = std::max<int64_t>(static_cast<int64_t>(shape.size()), 1);
    for (int64_t dim = -rank; dim < rank; ++dim) {
      const int64_t wrapped = dim < 0 ? dim + rank : dim;
      const int64_t size = shape.empty() ? 1 : shape[wrapped];
      for (int repeat = 0; repeat < 4; ++repeat) {
        // Index dims up to self's, the gathered one anything; 0-d now and then.
        Shape index_shape;
        for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
          const int64_t limit = d == wrapped ? 5 : shape[d];
          index_shape.push_back(std::uniform_int_distribution<int64_t>(0, limit)(rng));
        }
        if (repeat == 3 && shape.size() == 1) index_shape = {};  // 0-d index, 1-d self
        if (repeat % 2 == 1 && shape.empty()) index_shape = {3};  // 1-d index, 0-d self
        if (size == 0 && sf::numel(index_shape) > 0) index_shape[wrapped] = 0;
        const DType dtype = data_dtype(case_number);
        const auto self = random_tensor(dtype, shape, rng);
        const auto index = random_tensor(index_dtype(case_number++), index_shape, rng, 0, std::max<int64_t>(size, 1));
        const auto out = call("aten::gather", {self, dim, index});
        ASSERT_EQ(out.shape(), index_shape);
        EXPECT_EQ(out.dtype(), dtype);
        EXPECT_EQ(to_doubles(out), gather_reference(self, wrapped, index))
            << sf::shape_to_string(shape) << " dim " << dim << " index " << sf::shape_to_string(index_shape);
      }
    }
  }
}

TEST(IndexOps, GatherSmallExample) {
  const auto self = from_floats({1, 2, 3, 4, 5, 6}, {2, 3});
  const auto index = from_ints({2, 0, 1, 1}, {2, 2});
  EXPECT_EQ(to_doubles(call("aten::gather", {self, 1, index})), (std::vector<double>{3, 1, 5, 5}));
  EXPECT_EQ(to_doubles(call("aten::gather", {self, 0, from_ints({1, 0, 1}, {1, 3}), kw("sparse_grad", true)})),
            (std::vector<double>{4, 2, 6}));
  // An empty index skips the shape checks, as in PyTorch.
  EXPECT_EQ(call("aten::gather", {self, 0, from_ints({}, {0})}).shape(), Shape{0});
}

TEST(IndexOps, GatherErrors) {
  std::mt19937 rng(9);
  const auto self = random_tensor(DType::kF32, {3, 5}, rng);
  expect_errors({
      {"aten::gather", {self, 1, from_ints({0, 1}, {2})}, "Index tensor must have the same number of dimensions as input tensor"},
      {"aten::gather", {self, 1, from_ints(std::vector<int64_t>(8, 0), {4, 2})},
       "Size does not match at dimension 0 expected index [4, 2] to be smaller than self [3, 5] apart for dimension 1"},
      {"aten::gather", {self, 1, from_floats({0}, {1, 1})}, "gather(): Expected dtype int32 or int64 for index"},
      {"aten::gather", {self, 1, from_ints({0, 5}, {1, 2})}, "index 5 is out of bounds for dimension 1 with size 5"},
      {"aten::gather", {self, -2, from_ints({-1}, {1, 1}, DType::kI32)}, "index -1 is out of bounds for dimension 0 with size 3"},
      {"aten::gather", {self, 2, from_ints({0}, {1, 1})}, "Dimension out of range"},
      {"aten::gather", {random_tensor(DType::kF32, {}, rng), 0, from_ints({1}, {})}, "index 1 is out of bounds for dimension 0 with size 1"},
  });
}

// ------------------------------------------------------------------ scatter

// A copy of self where self[p with p[dim] replaced by index[p]] is set to
// (add: increased by) src[p] for each position p of index, in row-major
// order; scalars act as [1].
std::vector<double> scatter_reference(const sf::DenseTensor& self, int64_t dim, const sf::DenseTensor& index,
                                      const sf::DenseTensor& src, bool add) {
  const Shape self_shape = self.rank() == 0 ? Shape{1} : self.shape();
  const Shape index_shape = index.rank() == 0 ? Shape{1} : index.shape();
  const Shape src_shape = src.rank() == 0 ? Shape{1} : src.shape();
  std::vector<double> out = to_doubles(self);
  for (int64_t flat = 0; flat < index.numel(); ++flat) {
    std::vector<int64_t> position = unravel(flat, index_shape);
    const double value = element(src, ravel(position, src_shape));
    position[dim] = static_cast<int64_t>(element(index, flat));
    double& target = out[static_cast<std::size_t>(ravel(position, self_shape))];
    target = add ? target + value : value;
  }
  return out;
}

TEST(IndexOps, ScatterMatchesReference) {
  std::mt19937 rng(11);
  int case_number = 0;
  for (const Shape& shape : {Shape{}, Shape{5}, Shape{3, 4}, Shape{2, 3, 4}, Shape{1, 5}}) {
    const int64_t rank = std::max<int64_t>(static_cast<int64_t>(shape.size()), 1);
    for (int64_t dim = -rank; dim < rank; ++dim) {
      const int64_t wrapped = dim < 0 ? dim + rank : dim;
      const int64_t size = shape.empty() ? 1 : shape[wrapped];
      for (int repeat = 0; repeat < 4; ++repeat) {
        // Index dims up to self's (any along dim), src at least the index.
        Shape index_shape, src_shape;
        for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
          const int64_t limit = d == wrapped ? 5 : shape[d];
          index_shape.push_back(std::uniform_int_distribution<int64_t>(0, limit)(rng));
          src_shape.push_back(index_shape.back() + std::uniform_int_distribution<int64_t>(0, 1)(rng));
        }
        const DType dtype = data_dtype(case_number);
        const auto self = random_tensor(dtype, shape, rng);
        const auto index = random_tensor(index_dtype(case_number++), index_shape, rng, 0, size);
        const auto src = random_tensor(dtype, src_shape, rng);
        const std::string what =
            sf::shape_to_string(shape) + " dim " + std::to_string(dim) + " index " + sf::shape_to_string(index_shape);
        const auto written = call("aten::scatter", {self, dim, index, src});
        ASSERT_EQ(written.shape(), shape);
        EXPECT_EQ(written.dtype(), dtype);
        EXPECT_EQ(to_doubles(written), scatter_reference(self, wrapped, index, src, false)) << what;
        if (dtype != DType::kBool) {
          EXPECT_TRUE(all_close(to_doubles(call("aten::scatter_add", {self, dim, index, src})),
                                scatter_reference(self, wrapped, index, src, true), 1e-2, 1e-2))
              << what;
        }
        const auto ones = call("aten::to.dtype", {from_floats(std::vector<float>(sf::numel(src_shape), 1), src_shape), dtype});
        const auto filled = call("aten::scatter", {self, dim, index, 1});
        EXPECT_EQ(to_doubles(filled), scatter_reference(self, wrapped, index, ones, false))
            << what;
      }
    }
  }
}

TEST(IndexOps, ScatterSmallExampleLastDuplicateWinsAndSelfIsUnchanged) {
  const auto self = from_floats({0, 0, 0, 0, 0, 0}, {2, 3});
  const auto index = from_ints({2, 2, 0, 1}, {2, 2});
  const auto src = from_floats({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(to_doubles(call("aten::scatter", {self, 1, index, src})), (std::vector<double>{0, 0, 2, 3, 4, 0}));
  EXPECT_EQ(to_doubles(call("aten::scatter_add", {self, 1, index, src})), (std::vector<double>{0, 0, 3, 3, 4, 0}));
  EXPECT_EQ(to_doubles(self), (std::vector<double>(6, 0)));
  // An empty index skips the shape checks, as in PyTorch.
  EXPECT_EQ(to_doubles(call("aten::scatter", {self, 0, from_ints({}, {0, 9}), src})), (std::vector<double>(6, 0)));
}

// scatter_reduce against a reference: every reduction, with and without
// self, duplicates included; integer means round down, NaN wins amax/amin.
TEST(IndexOps, ScatterReduceMatchesReference) {
  const auto self = from_floats({1, 2, 3, 4, -5, 6}, {2, 3});
  const auto index = from_ints({0, 0, 2, 1, 1, 1}, {2, 3});
  const auto src = from_floats({5, 6, 7, -2, 3, -4}, {2, 3});
  struct Row {
    const char* reduce;
    bool include_self;
    std::vector<double> expected;
  };
  const Row rows[] = {
      {"sum", true, {12, 2, 10, 4, -8, 6}},      {"sum", false, {11, 2, 7, 4, -3, 6}},
      {"prod", true, {30, 2, 21, 4, -120, 6}},    {"prod", false, {30, 2, 7, 4, 24, 6}},
      {"mean", true, {4, 2, 5, 4, -2, 6}},       {"mean", false, {5.5, 2, 7, 4, -1, 6}},
      {"amax", true, {6, 2, 7, 4, 3, 6}},        {"amax", false, {6, 2, 7, 4, 3, 6}},
      {"amin", true, {1, 2, 3, 4, -5, 6}},       {"amin", false, {5, 2, 7, 4, -4, 6}},
  };
  for (const Row& row : rows) {
    const auto out = call("aten::scatter_reduce", {self, 1, index, src, row.reduce, kw("include_self", row.include_self)});
    EXPECT_EQ(to_doubles(out), row.expected) << row.reduce << " include_self " << row.include_self;
  }
  // Integer means round down: (-5 - 2) / 2 is -4 and (3 + 8) / 2 is 5, as in PyTorch.
  EXPECT_EQ(to_doubles(call("aten::scatter_reduce",
                            {from_ints({-5, 3}, {1, 2}), 1, from_ints({0, 1}, {1, 2}), from_ints({-2, 8}, {1, 2}), "mean"})),
            (std::vector<double>{-4, 5}));
  const auto ints = call("aten::to.dtype", {self, DType::kI64});
  const auto int_src = call("aten::to.dtype", {src, DType::kI64});
  EXPECT_EQ(to_doubles(call("aten::scatter_reduce", {ints, 1, index, int_src, "mean"})),
            (std::vector<double>{4, 2, 5, 4, -2, 6}));
  EXPECT_EQ(to_doubles(call("aten::scatter_reduce",
                            {ints, 1, from_ints({1, 1, 1, 2, 2, 2}, {2, 3}), int_src, "mean", kw("include_self", false)})),
            (std::vector<double>{1, 6, 3, 4, -5, -1}));
  const auto with_nan = from_floats({1, NAN, 3}, {1, 3});
  const auto maxima = to_doubles(call("aten::scatter_reduce", {with_nan, 1, from_ints({0, 2}, {1, 2}),
                                                               from_floats({NAN, 1}, {1, 2}), "amax"}));
  EXPECT_TRUE(std::isnan(maxima[0]) && std::isnan(maxima[1]));
  EXPECT_EQ(maxima[2], 3);
}

TEST(IndexOps, ScatterErrors) {
  std::mt19937 rng(12);
  const auto self = random_tensor(DType::kF32, {3, 4}, rng);
  const auto src = random_tensor(DType::kF32, {2, 4}, rng);
  const auto index = from_ints({1, 2, 0, 3}, {2, 2});
  expect_errors({
      {"aten::scatter", {self, 1, from_floats({0}, {1, 1}), src}, "scatter(): Expected dtype int32/int64 for index"},
      {"aten::scatter", {self, 1, index, call("aten::to.dtype", {src, DType::kBF16})},
       "scatter(): Expected self.dtype to be equal to src.dtype"},
      {"aten::scatter", {self, 1, from_ints({1, 2}, {2}), src},
       "Index tensor must have the same number of dimensions as self tensor"},
      {"aten::scatter", {self, 1, from_ints({1, 2, 3, 0, 1}, {1, 5}), src},
       "Expected index [1, 5] to be no larger than self [3, 4] apart from dimension 1 and to be no larger size "
       "than src [2, 4]"},
      {"aten::scatter", {self, 0, from_ints(std::vector<int64_t>(5, 0), {1, 5}), 2.0},
       "Expected index [1, 5] to be no larger than self [3, 4] apart from dimension 0"},
      {"aten::scatter", {self, 1, from_ints({4}, {1, 1}), src}, "index 4 is out of bounds for dimension 1 with size 4"},
      {"aten::scatter_add", {self, 1, from_ints({-1}, {1, 1}), src},
       "index -1 is out of bounds for dimension 1 with size 4"},
      {"aten::scatter_reduce", {self, 1, index, src, "median"},
       "reduce argument must be either sum, prod, mean, amax or amin, got median"},
  });
}

// ------------------------------------------------------------------- rules

TEST(IndexOps, ShardingRules) {
  std::mt19937 rng(10);
  const auto f32 = [&](Shape shape) { return random_tensor(DType::kF32, std::move(shape), rng); };
  const auto idx = [&](Shape shape, int64_t hi) { return random_tensor(DType::kI64, std::move(shape), rng, 0, hi); };
  EXPECT_EQ(run_op("aten::embedding", {f32({100, 16}), idx({4, 8}, 100)}).rule.to_string(),
            "([l, k], [i, j])->([i, j, k]) {i=4, j=8, k=16, l=100} indexed={l}");
  EXPECT_EQ(run_op("aten::embedding", {f32({10, 4}), idx({}, 10)}).rule.to_string(),
            "([j, i], [])->([i]) {i=4, j=10} indexed={j}");
  EXPECT_EQ(run_op("aten::index_select", {f32({8, 16}), 1, idx({4}, 16)}).rule.to_string(),
            "([i, k], [j])->([i, j]) {i=8, j=4, k=16} indexed={k}");
  EXPECT_EQ(run_op("aten::index_select", {f32({8, 16}), -2, idx({}, 8)}).rule.to_string(),
            "([k, j], [])->([i, j]) {i=1, j=16, k=8} indexed={k}");
  EXPECT_EQ(run_op("aten::index_copy", {f32({2, 16, 8, 4}), 1, idx({3}, 16), f32({2, 3, 8, 4})}).rule.to_string(),
            "([i, j, k, l], [m], [i, m, k, l])->([i, j, k, l]) {i=2, j=16, k=8, l=4, m=3} need_replication={m} indexed={j}");
  EXPECT_EQ(run_op("aten::index_copy", {f32({5}), 0, idx({1}, 5), f32({})}).rule.to_string(),
            "([i], [j], [])->([i]) {i=5, j=1} need_replication={j} indexed={i}");
  EXPECT_EQ(run_op("aten::gather", {f32({4, 10}), 1, idx({4, 3}, 10)}).rule.to_string(),
            "([i, k], [i, j])->([i, j]) {i=4, j=3, k=10} indexed={k}");
  EXPECT_EQ(run_op("aten::gather", {f32({4, 10}), 1, idx({2, 3}, 10)}).rule.to_string(),
            "([k, l], [i, j])->([i, j]) {i=2, j=3, k=4, l=10} need_replication={k} indexed={l}");
  EXPECT_EQ(run_op("aten::scatter", {f32({4, 10}), 1, idx({4, 3}, 10), f32({4, 3})}).rule.to_string(),
            "([i, j], [i, k], [i, k])->([i, j]) {i=4, j=10, k=3} need_replication={k} indexed={j}");
  EXPECT_EQ(run_op("aten::scatter", {f32({4, 10}), 0, idx({2, 3}, 4), 0.5}).rule.to_string(),
            "([i, j], [k, l])->([i, j]) {i=4, j=10, k=2, l=3} need_replication={j, k, l} indexed={i}");
  // scatter_add sums over the (index, src) pairs: split over them, partial sums.
  EXPECT_EQ(run_op("aten::scatter_add", {f32({10}), 0, idx({100}, 10), f32({100})}).rule.to_string(),
            "([i], [j], [j])->([i]) {i=10, j=100} reduction={j} indexed={i}");
  EXPECT_EQ(run_op("aten::scatter_add", {f32({4, 10}), 1, idx({4, 3}, 10), f32({4, 3})}).rule.to_string(),
            "([i, j], [i, k], [i, k])->([i, j]) {i=4, j=10, k=3} reduction={k} indexed={j}");
}

}  // namespace
