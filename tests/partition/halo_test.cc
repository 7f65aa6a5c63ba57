// The halo exchange's schedule (shardflow/partition/halo.h): on random
// meshes, sizes and tilings, every device ends with exactly the rows of its
// new tile (those it holds plus those it receives, each once), and in each
// round every member sends at most once and receives at most once.
#include "shardflow/partition/halo.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace sf = shardflow;

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

int64_t tile_of(const sf::Mesh& mesh, const std::vector<int64_t>& coords, const std::vector<int>& axes) {
  int64_t t = 0;
  for (int axis : axes) t = t * mesh.axis_size(axis) + coords[static_cast<std::size_t>(axis)];
  return t;
}

int64_t tiles(const sf::Mesh& mesh, const std::vector<int>& axes) {
  int64_t n = 1;
  for (int axis : axes) n *= mesh.axis_size(axis);
  return n;
}

// Member m's coordinates over the schedule's axes (others 0).
std::vector<int64_t> coords_of(const sf::Mesh& mesh, const std::vector<int>& axes, int64_t m) {
  std::vector<int64_t> coords(static_cast<std::size_t>(mesh.num_axes()), 0);
  for (std::size_t k = axes.size(); k-- > 0;) {
    coords[static_cast<std::size_t>(axes[k])] = m % mesh.axis_size(axes[k]);
    m /= mesh.axis_size(axes[k]);
  }
  return coords;
}

// Checks the schedule for `size` rows from tiles of `held` rows over
// `before` to even tiles over `after`.
void expect_exact(const sf::Mesh& mesh, int64_t size, const std::vector<int>& before, const std::vector<int>& after,
                  int64_t held) {
  const sf::HaloSchedule schedule = sf::halo_schedule(mesh, size, before, after, held);
  if (held == 0) held = ceil_div(size, tiles(mesh, before));
  const int64_t wanted = ceil_div(size, tiles(mesh, after));
  const int64_t members = tiles(mesh, schedule.axes);
  std::vector<std::vector<int>> rows(static_cast<std::size_t>(members));  // times each row arrives, per member
  for (int64_t m = 0; m < members; ++m) {
    const std::vector<int64_t> coords = coords_of(mesh, schedule.axes, m);
    const int64_t begin = std::min(tile_of(mesh, coords, after) * wanted, size), end = std::min(begin + wanted, size);
    rows[static_cast<std::size_t>(m)].assign(static_cast<std::size_t>(end - begin), 0);
    const int64_t own = tile_of(mesh, coords, before) * held;
    for (int64_t r = std::max(begin, own); r < std::min(end, own + held); ++r) ++rows[static_cast<std::size_t>(m)][static_cast<std::size_t>(r - begin)];
  }
  ASSERT_EQ(schedule.rounds.size(), schedule.round_rows.size());
  for (std::size_t round = 0; round < schedule.rounds.size(); ++round) {
    std::vector<int> sends(static_cast<std::size_t>(members), 0), receives(static_cast<std::size_t>(members), 0);
    for (const sf::HaloTransfer& t : schedule.rounds[round]) {
      EXPECT_EQ(++sends[static_cast<std::size_t>(t.source)], 1) << "round " << round;
      EXPECT_EQ(++receives[static_cast<std::size_t>(t.target)], 1) << "round " << round;
      EXPECT_LE(t.end - t.begin, schedule.round_rows[round]);
      // The source holds the rows it sends.
      const int64_t source_start = tile_of(mesh, coords_of(mesh, schedule.axes, t.source), before) * held;
      EXPECT_GE(t.begin, source_start);
      EXPECT_LE(t.end, std::min(source_start + held, size));
      const std::vector<int64_t> target = coords_of(mesh, schedule.axes, t.target);
      const int64_t begin = tile_of(mesh, target, after) * wanted;
      for (int64_t r = t.begin; r < t.end; ++r) ++rows[static_cast<std::size_t>(t.target)][static_cast<std::size_t>(r - begin)];
    }
  }
  for (int64_t m = 0; m < members; ++m) {
    for (std::size_t r = 0; r < rows[static_cast<std::size_t>(m)].size(); ++r) {
      EXPECT_EQ(rows[static_cast<std::size_t>(m)][r], 1) << "member " << m << " row " << r << " of its tile";
    }
  }
}

TEST(HaloSchedule, TenRowsToAFinerTilingSendOneRow) {
  const sf::Mesh mesh({0, 1, 2, 3}, {2, 2}, {"a", "b"}, 4);
  const sf::HaloSchedule schedule = sf::halo_schedule(mesh, 10, {0}, {0, 1});
  ASSERT_EQ(schedule.rounds.size(), 1u);
  ASSERT_EQ(schedule.rounds[0].size(), 1u);
  // Member (a=0, b=1) wants rows 3-5 and holds 0-4: row 5 from (a=1, b=1).
  const sf::HaloTransfer& t = schedule.rounds[0][0];
  EXPECT_EQ((std::vector<int64_t>{t.source, t.target, t.begin, t.end}), (std::vector<int64_t>{3, 1, 5, 6}));
  expect_exact(mesh, 10, {0}, {0, 1}, 0);
}

TEST(HaloSchedule, EmptyDimSendsNothing) {
  const sf::Mesh mesh({0, 1}, {2}, {"x"}, 2);
  EXPECT_TRUE(sf::halo_schedule(mesh, 0, {0}, {0}, 0).rounds.empty());
}

TEST(HaloSchedule, RandomTilingsGiveEveryDeviceItsRowsOnce) {
  std::mt19937 rng(5);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int c = 0; c < 400; ++c) {
    const int axes = pick(1, 3);
    std::vector<int64_t> shape;
    for (int a = 0; a < axes; ++a) shape.push_back(pick(1, 4));
    const int64_t devices = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    std::vector<int64_t> ids(static_cast<std::size_t>(devices));
    std::iota(ids.begin(), ids.end(), int64_t{0});
    std::vector<std::string> names;
    for (int a = 0; a < axes; ++a) names.push_back(std::string(1, static_cast<char>('a' + a)));
    const sf::Mesh mesh(ids, shape, names, devices);
    const auto random_axes = [&] {
      std::vector<int> order(static_cast<std::size_t>(axes));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      order.resize(static_cast<std::size_t>(pick(0, axes)));
      return order;
    };
    const std::vector<int> before = random_axes(), after = random_axes();
    const int64_t size = pick(0, 40);
    // Sometimes a reshape's tiles: larger than the even ones, still covering the dim.
    const int64_t even = ceil_div(size, tiles(mesh, before));
    const int64_t held = pick(0, 2) == 0 ? even + pick(0, 3) : 0;
    SCOPED_TRACE(testing::Message() << "case " << c << ": size " << size << ", held " << held);
    expect_exact(mesh, size, before, after, held);
  }
}

}  // namespace
