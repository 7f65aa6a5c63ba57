// Properties over thousands of random meshes (up to 5 axes, up to 64 devices,
// random device orders) and random partition specs:
//  - V1 equals an independent, step-by-step implementation of PyTorch/XLA's
//    algorithm (sharding-semantics §2.4-§2.7 and XLA's PartialTile, §2.8);
//  - with device ids 0..N-1, V2 expands to the same devices as V1;
//  - parsing a printed string prints it back;
//  - every element is held by exactly one device of each replica group, and
//    splitting a tensor into shards then assembling it returns the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include "shardflow/base/text.h"
#include "shardflow/sharding/shard_layout.h"
#include "shardflow/sharding/sharding.h"

namespace sf = shardflow;

namespace {

constexpr int kCases = 4000;

struct RandomCase {
  std::shared_ptr<const sf::Mesh> mesh;
  sf::PartitionSpec spec;
  std::vector<int64_t> shape;
};

RandomCase random_case(std::mt19937& rng) {
  std::uniform_int_distribution<int> coin(0, 1);
  const int num_axes = std::uniform_int_distribution<int>(1, 5)(rng);
  std::vector<int64_t> mesh_shape;
  int64_t size = 1;
  for (int a = 0; a < num_axes; ++a) {
    static constexpr int64_t kSizes[] = {1, 2, 2, 2, 3, 4, 4};
    int64_t extent = kSizes[std::uniform_int_distribution<std::size_t>(0, 6)(rng)];
    while (size * extent > 64) extent = 1;
    mesh_shape.push_back(extent);
    size *= extent;
  }
  std::vector<int64_t> ids(static_cast<std::size_t>(size));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  if (coin(rng)) std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::string> names;
  if (coin(rng)) {
    for (int a = 0; a < num_axes; ++a) names.push_back("ax" + std::to_string(a));
  }
  auto mesh = std::make_shared<const sf::Mesh>(ids, mesh_shape, names);

  const int rank = std::uniform_int_distribution<int>(0, 6)(rng);
  std::vector<std::vector<int>> dim_axes(static_cast<std::size_t>(rank));
  std::vector<int> axes(static_cast<std::size_t>(num_axes));
  std::iota(axes.begin(), axes.end(), 0);
  std::shuffle(axes.begin(), axes.end(), rng);  // random order inside tuples
  for (int axis : axes) {
    if (rank == 0 || std::uniform_int_distribution<int>(0, 9)(rng) < 3) continue;  // unused
    dim_axes[static_cast<std::size_t>(std::uniform_int_distribution<int>(0, rank - 1)(rng))]
        .push_back(axis);
  }
  std::vector<sf::SpecEntry> entries;
  const auto ref = [&](int axis) -> sf::AxisRef {
    if (!names.empty() && coin(rng)) return sf::AxisRef(names[static_cast<std::size_t>(axis)]);
    return sf::AxisRef(axis);
  };
  for (const auto& dim : dim_axes) {
    if (dim.empty()) {
      entries.push_back(sf::none);
    } else if (dim.size() == 1 && coin(rng)) {
      const sf::AxisRef axis = ref(dim[0]);
      entries.push_back(axis.is_name() ? sf::SpecEntry(axis.name()) : sf::SpecEntry(axis.index()));
    } else {
      std::vector<sf::AxisRef> refs;
      for (int axis : dim) refs.push_back(ref(axis));
      entries.push_back(sf::SpecEntry::tuple(std::move(refs)));
    }
  }
  std::vector<int64_t> shape;
  for (const auto& dim : dim_axes) {
    int64_t shards = 1;
    for (int axis : dim) shards *= mesh_shape[static_cast<std::size_t>(axis)];
    shape.push_back(std::uniform_int_distribution<int64_t>(0, 3 * shards + 2)(rng));
  }
  return {mesh, sf::PartitionSpec(std::move(entries)), shape};
}

// numpy-style n-d array of ints, just enough for the reference algorithm.
struct IntArray {
  std::vector<int64_t> shape;
  std::vector<int64_t> data;

  IntArray transpose(const std::vector<int64_t>& perm) const {
    return {[&] {
              std::vector<int64_t> s;
              for (int64_t p : perm) s.push_back(shape[static_cast<std::size_t>(p)]);
              return s;
            }(),
            sf::transpose_array(data, shape, perm)};
  }
};

// PyTorch/XLA's V1 path, step by step: _get_tile_assignment (transpose the
// logical mesh, merge tuple axes), the sharding type, _get_group_assignment,
// then XLA's PartialTile on the rebuilt array.
std::string reference_v1(const sf::Mesh& mesh, const sf::PartitionSpec& translated) {
  const std::size_t rank = translated.size();
  if (rank == 0) return "{replicated}";
  std::vector<int64_t> perm;
  std::vector<std::size_t> tuple_lengths;  // per non-None entry
  std::size_t none_count = 0;
  for (const sf::SpecEntry& entry : translated.entries()) {
    if (entry.is_none()) {
      ++none_count;
      continue;
    }
    for (const sf::AxisRef& axis : entry.axes()) perm.push_back(axis.index());
    tuple_lengths.push_back(entry.axes().size());
  }
  for (int a = 0; a < mesh.num_axes(); ++a) {
    if (std::find(perm.begin(), perm.end(), a) == perm.end()) perm.push_back(a);
  }
  IntArray t = IntArray{mesh.mesh_shape(), mesh.device_ids()}.transpose(perm);
  // Merge each tuple's axes; the i-th tiled entry starts at axis i once the
  // earlier tuples are merged.
  for (std::size_t i = 0; i < tuple_lengths.size(); ++i) {
    int64_t merged = 1;
    for (std::size_t k = 0; k < tuple_lengths[i]; ++k) merged *= t.shape[i + k];
    t.shape.erase(t.shape.begin() + static_cast<std::ptrdiff_t>(i),
                  t.shape.begin() + static_cast<std::ptrdiff_t>(i + tuple_lengths[i]));
    t.shape.insert(t.shape.begin() + static_cast<std::ptrdiff_t>(i), merged);
  }
  const std::size_t tiled = tuple_lengths.size();
  std::string type;
  if (t.shape.size() > rank) {
    type = "PARTIAL";
  } else if (mesh.size() == 1) {
    type = "MAXIMAL";
  } else if (none_count == rank) {
    type = "REPLICATED";
  } else if (none_count > 0) {
    type = "PARTIAL";
  } else {
    type = "TILED";
  }
  if (type == "REPLICATED" || type == "MAXIMAL") return "{replicated}";
  if (type == "TILED") {
    return "{devices=[" + sf::join_ints(t.shape, ",") + "]" + sf::join_ints(t.data, ",") + "}";
  }
  // Replication groups: split T along its tiled axes; each piece, flattened,
  // is one group, enumerated row-major.
  int64_t num_groups = 1;
  for (std::size_t i = 0; i < tiled; ++i) num_groups *= t.shape[i];
  const auto group_size = static_cast<int64_t>(t.data.size()) / num_groups;
  // Group assignment shape: 1 for None dims, the next tiled size otherwise.
  std::vector<int64_t> dims;
  std::size_t next_tiled = 0;
  for (const sf::SpecEntry& entry : translated.entries()) {
    dims.push_back(entry.is_none() ? 1 : t.shape[next_tiled++]);
  }
  dims.push_back(group_size);
  std::vector<int64_t> devices = t.data;  // group g is the g-th run of group_size
  // XLA's PartialTile: collapse, drop a size-1 group dim, or sort the groups.
  if (group_size == mesh.size()) return "{replicated}";
  if (group_size == 1) {
    dims.pop_back();
    return "{devices=[" + sf::join_ints(dims, ",") + "]" + sf::join_ints(devices, ",") + "}";
  }
  for (auto it = devices.begin(); it != devices.end(); it += group_size) {
    std::sort(it, it + group_size);
  }
  return "{devices=[" + sf::join_ints(dims, ",") + "]" + sf::join_ints(devices, ",") +
         " last_tile_dim_replicate}";
}

TEST(ShardingProperties, V1MatchesStepByStepAlgorithm) {
  std::mt19937 rng(20261130);
  for (int i = 0; i < kCases; ++i) {
    const RandomCase c = random_case(rng);
    const sf::Sharding sharding = sf::Sharding::from_spec(c.mesh, c.spec);
    const sf::PartitionSpec translated = sf::translate_partition_spec(c.spec, *c.mesh);
    ASSERT_EQ(sharding.to_hlo_v1().to_string(), reference_v1(*c.mesh, translated))
        << "mesh " << c.mesh->to_string() << " spec " << c.spec.to_string();
  }
}

TEST(ShardingProperties, V2ExpandsToV1WhenIdsAreIota) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int i = 0; i < kCases; ++i) {
    RandomCase c = random_case(rng);
    std::vector<int64_t> ids(static_cast<std::size_t>(c.mesh->size()));
    std::iota(ids.begin(), ids.end(), int64_t{0});
    auto mesh = std::make_shared<const sf::Mesh>(ids, c.mesh->mesh_shape(), c.mesh->axis_names());
    const sf::Sharding sharding = sf::Sharding::from_spec(mesh, c.spec);
    const sf::HloSharding v1 = sharding.to_hlo_v1();
    const sf::HloSharding v2 = sharding.to_hlo_v2();
    ASSERT_EQ(v1.kind(), v2.kind()) << v1.to_string() << " vs " << v2.to_string();
    if (!v1.is_tiled()) continue;
    ASSERT_FALSE(v1.tile_assignment().is_iota());
    ASSERT_EQ(v1.tile_assignment().dims(), v2.tile_assignment().dims()) << v2.to_string();
    ASSERT_EQ(v1.tile_assignment().devices(), v2.tile_assignment().devices())
        << v1.to_string() << " vs " << v2.to_string();
    ASSERT_EQ(v1.replicate_on_last_tile_dim(), v2.replicate_on_last_tile_dim());
    ++checked;
  }
  EXPECT_GT(checked, kCases / 3);
}

TEST(ShardingProperties, PrintedStringsParseBack) {
  std::mt19937 rng(11);
  for (int i = 0; i < kCases; ++i) {
    const RandomCase c = random_case(rng);
    const sf::Sharding sharding = sf::Sharding::from_spec(c.mesh, c.spec);
    for (const sf::HloSharding& hlo : {sharding.to_hlo_v1(), sharding.to_hlo_v2()}) {
      const std::string text = hlo.to_string();
      const sf::HloSharding parsed = sf::HloSharding::parse(text);
      ASSERT_EQ(parsed.to_string(), text);
      ASSERT_EQ(parsed, hlo) << text;
    }
  }
}

TEST(ShardingProperties, EachReplicaGroupHoldsEveryElementOnce) {
  std::mt19937 rng(3);
  for (int i = 0; i < kCases; ++i) {
    const RandomCase c = random_case(rng);
    const sf::Sharding sharding = sf::Sharding::from_spec(c.mesh, c.spec);
    const sf::ShardLayout layout = sf::shard_layout(sharding, c.shape);
    ASSERT_EQ(static_cast<int64_t>(layout.shards.size()), c.mesh->size());
    int64_t elements = 1;
    for (int64_t d : c.shape) elements *= d;
    // Count, per replica id, how often each global element is held.
    std::map<int64_t, std::vector<int>> held;
    for (const sf::DeviceShard& shard : layout.shards) {
      ASSERT_EQ(shard.device, &shard - layout.shards.data()) << "shards are ordered by device";
      std::vector<int>& counts = held[shard.whole ? 0 : shard.replica_id];
      counts.resize(static_cast<std::size_t>(elements));
      for (int64_t flat = 0; flat < elements; ++flat) {
        int64_t rest = flat;
        bool inside = true;
        for (std::size_t d = c.shape.size(); d-- > 0;) {
          const int64_t index = rest % c.shape[d];
          rest /= c.shape[d];
          inside = inside && index >= shard.slices[d].start && index < shard.slices[d].stop;
        }
        counts[static_cast<std::size_t>(flat)] += inside ? 1 : 0;
      }
    }
    for (const auto& [replica, counts] : held) {
      for (int count : counts) {
        ASSERT_EQ(count, held.size() == 1 && layout.shards.front().whole
                             ? static_cast<int>(layout.shards.size())
                             : 1)
            << "replica " << replica << " of " << sharding.to_hlo_v1().to_string();
      }
    }
  }
}

TEST(ShardingProperties, SplitThenAssembleReturnsTheTensor) {
  std::mt19937 rng(5);
  for (int i = 0; i < kCases / 4; ++i) {
    const RandomCase c = random_case(rng);
    const sf::Sharding sharding = sf::Sharding::from_spec(c.mesh, c.spec);
    const sf::ShardLayout layout = sf::shard_layout(sharding, c.shape);
    int64_t elements = 1;
    for (int64_t d : c.shape) elements *= d;
    std::vector<float> global(static_cast<std::size_t>(elements));
    std::iota(global.begin(), global.end(), 1.0f);  // no element is 0, the padding value
    const auto bytes = std::as_bytes(std::span(global));
    const auto shards = sf::split_into_shards(layout, bytes, sizeof(float));
    for (std::size_t s = 0; s < shards.size(); ++s) {
      // Each shard holds its slice, in order, then zero padding.
      std::vector<float> local(shards[s].size() / sizeof(float));
      if (!local.empty()) std::memcpy(local.data(), shards[s].data(), shards[s].size());
      int64_t valid = 1;
      for (const sf::DimSlice& slice : layout.shards[s].slices) valid *= slice.size();
      ASSERT_EQ(std::count(local.begin(), local.end(), 0.0f),
                static_cast<std::ptrdiff_t>(local.size()) - valid);
    }
    const std::vector<std::byte> assembled = sf::assemble_from_shards(layout, shards, sizeof(float));
    ASSERT_TRUE(std::equal(assembled.begin(), assembled.end(), bytes.begin(), bytes.end()))
        << sharding.to_hlo_v1().to_string();
  }
}

TEST(ShardingProperties, ContiguousShardOffsetsAreTheShardsThatAreRunsOfTheTensor) {
  // A shard may view the tensor's own memory (the torch bridge writes a KV
  // cache in place that way) exactly when it is a run of consecutive
  // elements of the row-major tensor, unpadded, and no two devices hold
  // the same tile.
  std::mt19937 rng(11);
  int contiguous = 0;
  for (int i = 0; i < kCases; ++i) {
    const RandomCase c = random_case(rng);
    int64_t elements = 1;
    for (int64_t d : c.shape) elements *= d;
    if (elements == 0 || elements > 4096) continue;
    const sf::Sharding sharding = sf::Sharding::from_spec(c.mesh, c.spec);
    const sf::ShardLayout layout = sf::shard_layout(sharding, c.shape);
    std::vector<int32_t> global(static_cast<std::size_t>(elements));
    std::iota(global.begin(), global.end(), 1);  // each element's offset + 1; padding reads 0
    const auto shards = sf::split_into_shards(layout, std::as_bytes(std::span(global)), sizeof(int32_t));
    int64_t tiles = 1;
    for (int64_t count : layout.num_tiles) tiles *= count;
    bool runs = tiles == static_cast<int64_t>(layout.shards.size());
    std::vector<int64_t> starts;
    for (const auto& bytes : shards) {
      std::vector<int32_t> local(bytes.size() / sizeof(int32_t));
      std::memcpy(local.data(), bytes.data(), bytes.size());
      for (std::size_t e = 0; e < local.size(); ++e) {
        runs = runs && local[e] != 0 && local[e] == local[0] + static_cast<int32_t>(e);
      }
      starts.push_back(local[0] - 1);
    }
    const std::optional<std::vector<int64_t>> offsets = sf::contiguous_shard_offsets(layout);
    ASSERT_EQ(offsets.has_value(), runs) << sharding.to_hlo_v1().to_string() << " on "
                                         << sf::python_int_tuple(c.shape);
    if (offsets) {
      EXPECT_EQ(*offsets, starts);
      ++contiguous;
    }
  }
  EXPECT_GT(contiguous, 100);  // the property was tested on both sides
}

}  // namespace
