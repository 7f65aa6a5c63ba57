// sf::Shape keeps up to Shape::kInline extents in place and behaves as
// std::vector<int64_t> does: random edit sequences applied to both must
// agree after every step, on either side of the inline capacity.
#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

#include "shardflow/base/error.h"
#include "shardflow/tensor/shape.h"

namespace sf = shardflow;

namespace {

void expect_same(const sf::Shape& shape, const std::vector<int64_t>& reference, int step) {
  ASSERT_EQ(shape.size(), reference.size()) << "after step " << step;
  ASSERT_EQ(std::vector<int64_t>(shape), reference) << "after step " << step;
  ASSERT_EQ(shape.empty(), reference.empty());
  ASSERT_GE(shape.capacity(), shape.size());
}

TEST(TensorShape, RandomEditsMatchStdVector) {
  std::mt19937_64 random(7);
  const auto pick = [&](std::size_t n) { return static_cast<std::size_t>(random() % n); };
  for (int trial = 0; trial < 200; ++trial) {
    sf::Shape shape;
    std::vector<int64_t> reference;
    for (int step = 0; step < 60; ++step) {
      const auto value = static_cast<int64_t>(random() % 100);
      switch (pick(16)) {
        case 0:
        case 1:
          shape.push_back(value);
          reference.push_back(value);
          break;
        case 2:
          if (!reference.empty()) {
            shape.pop_back();
            reference.pop_back();
          }
          break;
        case 3: {
          const std::size_t at = pick(reference.size() + 1);
          shape.insert(shape.begin() + at, value);
          reference.insert(reference.begin() + static_cast<std::ptrdiff_t>(at), value);
          break;
        }
        case 4: {
          // Inserting a shape's own extents into itself.
          const std::size_t at = pick(reference.size() + 1);
          shape.insert(shape.begin() + at, shape.begin(), shape.end());
          const std::vector<int64_t> copy = reference;
          reference.insert(reference.begin() + static_cast<std::ptrdiff_t>(at), copy.begin(),
                           copy.end());
          break;
        }
        case 5:
          if (!reference.empty()) {
            const std::size_t first = pick(reference.size());
            const std::size_t last = first + pick(reference.size() - first + 1);
            shape.erase(shape.begin() + first, shape.begin() + last);
            reference.erase(reference.begin() + static_cast<std::ptrdiff_t>(first),
                            reference.begin() + static_cast<std::ptrdiff_t>(last));
          }
          break;
        case 6: {
          const std::size_t count = pick(2 * sf::Shape::kInline + 2);
          shape.resize(count, value);
          reference.resize(count, value);
          break;
        }
        case 7: {
          sf::Shape copy = shape;  // copy, then move back
          shape = sf::Shape();
          EXPECT_TRUE(shape.empty());
          shape = std::move(copy);
          break;
        }
        case 8: {
          sf::Shape moved(std::move(shape));
          shape = moved;
          EXPECT_EQ(shape, moved);
          break;
        }
        case 9: {
          const sf::Shape& self = shape;
          shape = self;  // self-assignment keeps the extents
          break;
        }
        case 10: {
          // Copy into, then move into, targets that already hold values
          // (inline or on the heap).
          sf::Shape target(pick(2 * sf::Shape::kInline + 3), value);
          target = shape;
          shape = sf::Shape(pick(2 * sf::Shape::kInline + 3), value + 1);
          shape = std::move(target);
          break;
        }
        case 11: {
          sf::Shape& alias = shape;
          shape = std::move(alias);  // self-move keeps the extents
          break;
        }
        case 12: {
          const std::size_t at = pick(reference.size() + 1);
          const std::size_t count = pick(9);
          shape.insert(shape.begin() + at, count, value);
          reference.insert(reference.begin() + static_cast<std::ptrdiff_t>(at), count, value);
          break;
        }
        case 13:
          if (!reference.empty()) {
            const std::size_t at = pick(reference.size());
            shape.erase(shape.begin() + at);
            reference.erase(reference.begin() + static_cast<std::ptrdiff_t>(at));
          }
          break;
        case 14: {
          const std::size_t count = pick(2 * sf::Shape::kInline + 2);
          shape.assign(count, value);
          reference.assign(count, value);
          break;
        }
        default: {
          const sf::Shape converted(reference);
          EXPECT_EQ(converted, shape);
          break;
        }
      }
      expect_same(shape, reference, step);
    }
  }
}

TEST(TensorShape, ComparesAndConvertsLikeAVector) {
  const std::vector<int64_t> long_list{1, 2, 3, 4, 5, 6, 7, 8, 9};
  const sf::Shape inline_shape{2, 3};
  const sf::Shape heap_shape(long_list.begin(), long_list.end());
  EXPECT_EQ(heap_shape, long_list);
  EXPECT_NE(inline_shape, heap_shape);
  EXPECT_LT((sf::Shape{1, 2}), (sf::Shape{1, 3}));
  EXPECT_LT((sf::Shape{1, 2}), (sf::Shape{1, 2, 0}));
  EXPECT_EQ(sf::Shape(3, 7), (sf::Shape{7, 7, 7}));
  EXPECT_EQ(std::vector<int64_t>(heap_shape), long_list);
  EXPECT_EQ(inline_shape.front(), 2);
  EXPECT_EQ(heap_shape.back(), 9);
  EXPECT_EQ(sf::numel(heap_shape), 362880);
  EXPECT_EQ(sf::shape_to_string(inline_shape), "[2,3]");
  sf::Shape assigned;
  assigned = {4, 5};
  EXPECT_EQ(assigned, (sf::Shape{4, 5}));
  EXPECT_EQ(assigned.at(1), 5);
  EXPECT_THROW(static_cast<void>(assigned.at(2)), sf::Error);
}

}  // namespace
