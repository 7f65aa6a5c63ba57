// Every collective against a straightforward host reference on random data:
// groups of 1 to 8 of 8 devices (in scrambled order, so group order is not
// device order), concurrent mesh-axis groups, and long interleaved sequences
// of collectives on different groups. To add a collective: a parameterised
// test over the group size that fills per-device inputs, computes the
// expected outputs on the host, runs the collective and compares.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>

#include "runtime_test_util.h"
#include "shardflow/sharding/mesh.h"

namespace sf = shardflow;
using sf::DeviceGroup;
using sf::DType;
using sf::ReduceOp;
using sf::testing_util::Bytes;
using sf::testing_util::random_bytes;
using sf::testing_util::random_values;
using sf::testing_util::reference_reduce;
using sf::testing_util::same_values;
using sf::testing_util::scrambled_group;
using sf::testing_util::sub_bytes;

namespace {

constexpr int64_t kDevices = 8;
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};

bool is_member(const DeviceGroup& group, int64_t device) {
  return std::find(group.devices.begin(), group.devices.end(), device) != group.devices.end();
}

// Buffers indexed by global device id.
using PerDevice = std::vector<Bytes>;

std::string size_name(const testing::TestParamInfo<int64_t>& info) {
  return "group" + std::to_string(info.param);
}

// ---------------------------------------------------------------- all_reduce

class AllReduce
    : public sf::testing_util::RuntimeTestWithParam<std::tuple<DType, ReduceOp, int64_t>> {};

TEST_P(AllReduce, MatchesReference) {
  const auto [dtype, op, size] = GetParam();
  const DeviceGroup group = scrambled_group(size);
  sf::Runtime rt = sf::Runtime::local(kDevices);
  // Empty, tiny, and both sides of the whole/sliced switch (256 KiB in all).
  for (const std::size_t count : {0, 1, 37, 1000, 300001}) {
    std::vector<Bytes> inputs;
    PerDevice data(kDevices);
    for (int64_t r = 0; r < size; ++r) {
      inputs.push_back(random_values(dtype, count, static_cast<uint32_t>(count * 10 + r)));
      data[static_cast<std::size_t>(group.devices[static_cast<std::size_t>(r)])] = inputs.back();
    }
    const Bytes expected = reference_reduce(dtype, op, inputs);
    // By value: clang 14 cannot capture structured bindings.
    rt.run([&, element_type = dtype, reduction = op](int64_t device, sf::Communicator& comm) {
      if (is_member(group, device)) {
        comm.all_reduce(group, data[static_cast<std::size_t>(device)], element_type, reduction);
      }
    });
    for (int64_t device : group.devices) {
      EXPECT_TRUE(same_values(dtype, data[static_cast<std::size_t>(device)], expected))
          << "device " << device << ", " << count << " elements";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, AllReduce,
                         testing::Combine(testing::ValuesIn(sf::kAllDTypes),
                                          testing::ValuesIn(kAllOps),
                                          testing::Range(int64_t{1}, int64_t{9})),
                         [](const auto& test) {
                           return std::string(sf::dtype_name(std::get<0>(test.param))) + "_" +
                                  std::string(sf::reduce_op_name(std::get<1>(test.param))) +
                                  "_group" + std::to_string(std::get<2>(test.param));
                         });

class AllReduceNaN : public sf::testing_util::RuntimeTest {};

// max and min propagate a NaN of any member, as torch.max does; sum too.
TEST_F(AllReduceNaN, Propagates) {
  sf::Runtime rt = sf::Runtime::local(4);
  const DeviceGroup group{{0, 1, 2, 3}};
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const ReduceOp op : kAllOps) {
      std::vector<Bytes> inputs;
      for (uint32_t r = 0; r < 4; ++r) inputs.push_back(random_values(dtype, 100000, r));
      // Element 5 is NaN on the first member, element 7 on the last.
      sf::visit_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        reinterpret_cast<T*>(inputs[0].data())[5] = sf::store<T>(std::nanf(""));
        reinterpret_cast<T*>(inputs[3].data())[7] = sf::store<T>(std::nanf(""));
      });
      const Bytes expected = reference_reduce(dtype, op, inputs);
      PerDevice data = inputs;
      rt.run([&](int64_t device, sf::Communicator& comm) {
        comm.all_reduce(group, data[static_cast<std::size_t>(device)], dtype, op);
      });
      for (const Bytes& result : data) EXPECT_TRUE(same_values(dtype, result, expected));
    }
  }
}

// ---------------------------------------------------------------- all_gather

class AllGather : public sf::testing_util::RuntimeTestWithParam<int64_t> {};

TEST_P(AllGather, MatchesReference) {
  const int64_t size = GetParam();
  const DeviceGroup group = scrambled_group(size);
  sf::Runtime rt = sf::Runtime::local(kDevices);
  for (const std::size_t bytes : {0, 5, 4099, 100000}) {
    for (const bool in_place : {false, true}) {
      PerDevice inputs(kDevices), outputs(kDevices);
      Bytes expected;
      for (int64_t r = 0; r < size; ++r) {
        const auto d = static_cast<std::size_t>(group.devices[static_cast<std::size_t>(r)]);
        inputs[d] = random_bytes(bytes, static_cast<uint32_t>(d * 1000 + bytes));
        expected.insert(expected.end(), inputs[d].begin(), inputs[d].end());
        outputs[d] = random_bytes(bytes * static_cast<std::size_t>(size), 7);
        // In place: the input is this member's chunk of the output.
        if (in_place)
          std::copy(inputs[d].begin(), inputs[d].end(),
                    outputs[d].begin() +
                        static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * bytes));
      }
      rt.run([&](int64_t device, sf::Communicator& comm) {
        if (!is_member(group, device)) return;
        const auto d = static_cast<std::size_t>(device);
        const std::span<std::byte> output(outputs[d]);
        const std::span<const std::byte> input =
            in_place
                ? output.subspan(static_cast<std::size_t>(group.rank_of(device)) * bytes, bytes)
                : std::span<const std::byte>(inputs[d]);
        comm.all_gather(group, input, output);
      });
      for (int64_t device : group.devices) {
        EXPECT_EQ(outputs[static_cast<std::size_t>(device)], expected)
            << "device " << device << ", " << bytes << " bytes" << (in_place ? ", in place" : "");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, AllGather, testing::Range(int64_t{1}, int64_t{9}), size_name);

// ------------------------------------------------------------ reduce_scatter

class ReduceScatter : public sf::testing_util::RuntimeTestWithParam<int64_t> {};

TEST_P(ReduceScatter, MatchesReferenceForEveryDTypeAndOp) {
  const int64_t size = GetParam();
  const auto n = static_cast<std::size_t>(size);
  const DeviceGroup group = scrambled_group(size);
  sf::Runtime rt = sf::Runtime::local(kDevices);
  for (const DType dtype : sf::kAllDTypes) {
    for (const ReduceOp op : kAllOps) {
      for (const std::size_t chunk : {0, 3, 10000}) {
        for (const bool in_place : {false, true}) {
          const std::size_t chunk_bytes = chunk * sf::element_size(dtype);
          std::vector<Bytes> inputs;
          PerDevice data(kDevices), outputs(kDevices);
          for (std::size_t r = 0; r < n; ++r) {
            inputs.push_back(random_values(dtype, chunk * n, static_cast<uint32_t>(r + chunk)));
            const auto d = static_cast<std::size_t>(group.devices[r]);
            data[d] = inputs.back();
            outputs[d].resize(chunk_bytes);
          }
          const Bytes total = reference_reduce(dtype, op, inputs);
          rt.run([&](int64_t device, sf::Communicator& comm) {
            if (!is_member(group, device)) return;
            const auto d = static_cast<std::size_t>(device);
            const std::span<std::byte> input(data[d]);
            const std::span<std::byte> output =
                in_place
                    ? input.subspan(static_cast<std::size_t>(group.rank_of(device)) * chunk_bytes,
                                    chunk_bytes)
                    : std::span<std::byte>(outputs[d]);
            comm.reduce_scatter(group, input, output, dtype, op);
          });
          for (std::size_t r = 0; r < n; ++r) {
            const auto d = static_cast<std::size_t>(group.devices[r]);
            const Bytes result =
                in_place ? sub_bytes(data[d], r * chunk_bytes, chunk_bytes) : outputs[d];
            EXPECT_TRUE(same_values(dtype, result, sub_bytes(total, r * chunk_bytes, chunk_bytes)))
                << sf::dtype_name(dtype) << " " << sf::reduce_op_name(op) << ", device " << d
                << ", chunk " << chunk << (in_place ? ", in place" : "");
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, ReduceScatter, testing::Range(int64_t{1}, int64_t{9}), size_name);

// ---------------------------------------------------------------- all_to_all

class AllToAll : public sf::testing_util::RuntimeTestWithParam<int64_t> {};

TEST_P(AllToAll, MatchesReference) {
  const int64_t size = GetParam();
  const auto n = static_cast<std::size_t>(size);
  const DeviceGroup group = scrambled_group(size);
  sf::Runtime rt = sf::Runtime::local(kDevices);
  for (const std::size_t chunk : {0, 1, 7, 5000}) {
    PerDevice inputs(kDevices), outputs(kDevices);
    for (std::size_t r = 0; r < n; ++r) {
      const auto d = static_cast<std::size_t>(group.devices[r]);
      inputs[d] = random_bytes(chunk * n, static_cast<uint32_t>(d + 100 * chunk));
      outputs[d].resize(chunk * n);
    }
    rt.run([&](int64_t device, sf::Communicator& comm) {
      if (!is_member(group, device)) return;
      const auto d = static_cast<std::size_t>(device);
      comm.all_to_all(group, inputs[d], outputs[d]);
    });
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        // Output chunk j of member i is input chunk i of member j.
        const auto di = static_cast<std::size_t>(group.devices[i]);
        const auto dj = static_cast<std::size_t>(group.devices[j]);
        EXPECT_EQ(sub_bytes(outputs[di], j * chunk, chunk), sub_bytes(inputs[dj], i * chunk, chunk))
            << "member " << i << " chunk " << j << ", " << chunk << " bytes per chunk";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, AllToAll, testing::Range(int64_t{1}, int64_t{9}), size_name);

// -------------------------------------------------------- collective_permute

class CollectivePermute : public sf::testing_util::RuntimeTestWithParam<int64_t> {};

TEST_P(CollectivePermute, MatchesReference) {
  const int64_t size = GetParam();
  const auto n = static_cast<std::size_t>(size);
  const DeviceGroup group = scrambled_group(size);
  const auto& ids = group.devices;
  using Pairs = std::vector<std::pair<int64_t, int64_t>>;
  Pairs ring, even_to_next, broadcast;
  for (std::size_t r = 0; r < n; ++r) {
    ring.emplace_back(ids[r], ids[(r + 1) % n]);
    if (r % 2 == 0 && r + 1 < n) even_to_next.emplace_back(ids[r], ids[r + 1]);
    if (r > 0) broadcast.emplace_back(ids[0], ids[r]);
  }
  sf::Runtime rt = sf::Runtime::local(kDevices);
  for (const Pairs& pairs : {ring, even_to_next, broadcast, Pairs{}}) {
    for (const std::size_t bytes : {0, 13, 70000}) {
      PerDevice inputs(kDevices), outputs(kDevices);
      for (int64_t d : ids) {
        inputs[static_cast<std::size_t>(d)] = random_bytes(bytes, static_cast<uint32_t>(d));
        outputs[static_cast<std::size_t>(d)] = random_bytes(bytes, 99);
      }
      rt.run([&](int64_t device, sf::Communicator& comm) {
        if (!is_member(group, device)) return;
        const auto d = static_cast<std::size_t>(device);
        comm.collective_permute(group, pairs, inputs[d], outputs[d]);
      });
      for (int64_t d : ids) {
        Bytes expected(bytes);  // zeros unless d is a target
        for (const auto& [source, target] : pairs) {
          if (target == d) expected = inputs[static_cast<std::size_t>(source)];
        }
        EXPECT_EQ(outputs[static_cast<std::size_t>(d)], expected)
            << "device " << d << ", " << pairs.size() << " pairs, " << bytes << " bytes";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, CollectivePermute, testing::Range(int64_t{1}, int64_t{9}), size_name);

// ------------------------------------------------------------------- barrier

class Barrier : public sf::testing_util::RuntimeTestWithParam<int64_t> {};

// After a barrier, every member sees what every member did before it.
TEST_P(Barrier, OrdersTheMembers) {
  const int64_t size = GetParam();
  const DeviceGroup group = scrambled_group(size);
  sf::Runtime rt = sf::Runtime::local(kDevices);
  constexpr int kRounds = 200;
  std::vector<std::atomic<int>> arrived(kRounds);
  std::atomic<int> violations{0};
  rt.run([&](int64_t device, sf::Communicator& comm) {
    if (!is_member(group, device)) return;
    for (int round = 0; round < kRounds; ++round) {
      arrived[static_cast<std::size_t>(round)].fetch_add(1, std::memory_order_relaxed);
      comm.barrier(group);
      if (arrived[static_cast<std::size_t>(round)].load(std::memory_order_relaxed) != size) {
        violations.fetch_add(1);
      }
    }
  });
  EXPECT_EQ(violations.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(, Barrier, testing::Range(int64_t{1}, int64_t{9}), size_name);

// --------------------------------------------------- concurrent mesh groups

// The groups along one axis of `mesh` (devices that differ only in that
// axis' coordinate), each in axis order, for every device.
std::vector<DeviceGroup> axis_group_of(const sf::Mesh& mesh, int axis) {
  std::vector<DeviceGroup> groups(static_cast<std::size_t>(mesh.size()));
  for (int64_t device : mesh.device_ids()) {
    std::vector<int64_t> coords = mesh.coords_of(device);
    DeviceGroup& group = groups[static_cast<std::size_t>(device)];
    for (int64_t i = 0; i < mesh.axis_size(axis); ++i) {
      coords[static_cast<std::size_t>(axis)] = i;
      group.devices.push_back(mesh.device_at(coords));
    }
  }
  return groups;
}

class MeshAxisGroups : public sf::testing_util::RuntimeTest {};

// A 2x4 ('data', 'model') mesh: the 2 'model' groups of 4 and the 4 'data'
// groups of 2 run their collectives at the same time.
TEST_F(MeshAxisGroups, RunConcurrently) {
  sf::Runtime rt = sf::Runtime::local(kDevices);
  std::vector<int64_t> ids(kDevices);
  std::iota(ids.begin(), ids.end(), 0);
  const sf::Mesh mesh(ids, {2, 4}, {"data", "model"});
  const auto model = axis_group_of(mesh, 1), data = axis_group_of(mesh, 0);
  constexpr std::size_t kCount = 40000;  // f32 elements per device
  PerDevice inputs(kDevices), reduced(kDevices), gathered(kDevices), scattered(kDevices);
  for (std::size_t d = 0; d < kDevices; ++d)
    inputs[d] = random_values(DType::kF32, kCount, static_cast<uint32_t>(d));
  rt.run([&](int64_t device, sf::Communicator& comm) {
    const auto d = static_cast<std::size_t>(device);
    reduced[d] = inputs[d];
    comm.all_reduce(model[d], reduced[d], DType::kF32, ReduceOp::kSum);
    gathered[d].resize(reduced[d].size() * 2);
    comm.all_gather(data[d], reduced[d], gathered[d]);
    scattered[d].resize(gathered[d].size() / 4);
    comm.reduce_scatter(model[d], gathered[d], scattered[d], DType::kF32, ReduceOp::kMax);
  });
  for (std::size_t d = 0; d < kDevices; ++d) {
    const DeviceGroup& row = model[d];
    const DeviceGroup& column = data[d];
    auto row_sum = [&](int64_t any_member) {
      std::vector<Bytes> members;
      for (int64_t m : model[static_cast<std::size_t>(any_member)].devices)
        members.push_back(inputs[static_cast<std::size_t>(m)]);
      return reference_reduce(DType::kF32, ReduceOp::kSum, members);
    };
    Bytes expected_gather;
    for (int64_t m : column.devices) {
      const Bytes part = row_sum(m);
      expected_gather.insert(expected_gather.end(), part.begin(), part.end());
    }
    EXPECT_TRUE(same_values(DType::kF32, reduced[d], row_sum(static_cast<int64_t>(d)))) << d;
    EXPECT_EQ(gathered[d], expected_gather) << d;
    // Every member of the row gathered the same data, so the max is the data.
    const std::size_t chunk = expected_gather.size() / 4;
    EXPECT_EQ(
        scattered[d],
        sub_bytes(expected_gather,
                  static_cast<std::size_t>(row.rank_of(static_cast<int64_t>(d))) * chunk, chunk))
        << d;
  }
}

// ---------------------------------------------------- interleaved sequences

// A random sequence of collectives over changing group partitions (mesh
// rows, columns, everything, pairs, singletons), run on the devices and
// simulated on the host with the references; the final states must agree.
class Interleaved : public sf::testing_util::RuntimeTest {};

enum class StepKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kPermute, kBarrier };

// Every step keeps a device's state at kStateBytes (i32 elements).
struct Step {
  StepKind kind;
  ReduceOp op;
  std::vector<DeviceGroup> partition;  // every device in at most one group
};
constexpr std::size_t kStateBytes = 840 * 4;  // 840 is divisible by 1..8

Bytes tiled(const Bytes& chunk, std::size_t times) {
  Bytes out;
  for (std::size_t i = 0; i < times; ++i) out.insert(out.end(), chunk.begin(), chunk.end());
  return out;
}

// One step on one device: gathers keep the next member's chunk, scatters
// tile their chunk back to full size, permutes shift along the group ring.
void run_step(const Step& step, const DeviceGroup& group, int64_t device, sf::Communicator& comm,
              Bytes& state) {
  const std::size_t n = group.devices.size();
  const auto rank = static_cast<std::size_t>(group.rank_of(device));
  std::vector<std::pair<int64_t, int64_t>> ring;
  for (std::size_t r = 0; r < n; ++r) {
    ring.emplace_back(group.devices[r], group.devices[(r + 1) % n]);
  }
  Bytes out(step.kind == StepKind::kAllGather       ? kStateBytes * n
            : step.kind == StepKind::kReduceScatter ? kStateBytes / n
                                                    : kStateBytes);
  switch (step.kind) {
    case StepKind::kAllReduce:
      comm.all_reduce(group, state, DType::kI32, step.op);
      return;
    case StepKind::kAllGather:
      comm.all_gather(group, state, out);
      state = sub_bytes(out, (rank + 1) % n * kStateBytes, kStateBytes);
      return;
    case StepKind::kReduceScatter:
      comm.reduce_scatter(group, state, out, DType::kI32, step.op);
      state = tiled(out, n);
      return;
    case StepKind::kAllToAll:
      comm.all_to_all(group, state, out);
      state = out;
      return;
    case StepKind::kPermute:
      comm.collective_permute(group, ring, state, out);
      state = out;
      return;
    case StepKind::kBarrier:
      comm.barrier(group);
      return;
  }
}

// The same step for a whole group, on the host.
void simulate_step(const Step& step, const DeviceGroup& group, std::vector<Bytes>& states) {
  const std::size_t n = group.devices.size();
  const std::size_t chunk = kStateBytes / n;
  std::vector<Bytes> before;
  for (int64_t d : group.devices) before.push_back(states[static_cast<std::size_t>(d)]);
  for (std::size_t r = 0; r < n; ++r) {
    Bytes& out = states[static_cast<std::size_t>(group.devices[r])];
    std::vector<Bytes> parts;  // chunk r of every member
    for (const Bytes& member : before) parts.push_back(sub_bytes(member, r * chunk, chunk));
    switch (step.kind) {
      case StepKind::kAllReduce:
        out = reference_reduce(DType::kI32, step.op, before);
        break;
      case StepKind::kAllGather:
        out = before[(r + 1) % n];
        break;
      case StepKind::kReduceScatter:
        out = tiled(reference_reduce(DType::kI32, step.op, parts), n);
        break;
      case StepKind::kAllToAll:
        out.clear();
        for (const Bytes& part : parts) out.insert(out.end(), part.begin(), part.end());
        break;
      case StepKind::kPermute:
        out = before[(r + n - 1) % n];
        break;
      case StepKind::kBarrier:
        break;
    }
  }
}

TEST_F(Interleaved, ManyCollectivesOnChangingGroups) {
  const std::vector<std::vector<DeviceGroup>> partitions{
      {{{0, 1, 2, 3}}, {{4, 5, 6, 7}}},     {{{0, 4}}, {{1, 5}}, {{2, 6}}, {{3, 7}}},
      {{{7, 6, 5, 4, 3, 2, 1, 0}}},         {{{1, 0}}, {{3, 2}}, {{5, 4}}},
      {{{2}}, {{0, 3, 6}}, {{1, 4, 7, 5}}},
  };
  std::mt19937 rng(42);
  std::vector<Step> steps(400);
  for (Step& step : steps) {
    step.kind = static_cast<StepKind>(rng() % 6);
    step.op = kAllOps[rng() % 3];
    step.partition = partitions[rng() % partitions.size()];
  }
  PerDevice device_states(kDevices), host_states(kDevices);
  for (std::size_t d = 0; d < kDevices; ++d) {
    host_states[d] = device_states[d] =
        random_values(DType::kI32, kStateBytes / 4, static_cast<uint32_t>(d));
  }
  sf::Runtime rt = sf::Runtime::local(kDevices);
  rt.run([&](int64_t device, sf::Communicator& comm) {
    for (const Step& step : steps) {
      for (const DeviceGroup& group : step.partition) {
        if (!is_member(group, device)) continue;
        run_step(step, group, device, comm, device_states[static_cast<std::size_t>(device)]);
      }
    }
  });
  for (const Step& step : steps) {
    for (const DeviceGroup& group : step.partition) simulate_step(step, group, host_states);
  }
  for (std::size_t d = 0; d < kDevices; ++d) {
    EXPECT_EQ(device_states[d], host_states[d]) << "device " << d;
  }
}

}  // namespace
