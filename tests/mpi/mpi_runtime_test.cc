// The MPI runtime, run under mpiexec (1, 2 and 4 ranks, see CMakeLists.txt):
// every collective gives exactly the in-process backend's bytes (each rank
// also runs the same calls on Runtime::local and compares its own device's
// result), SPMD programs give the unsharded results, tensors hold only the
// rank's shards, and disagreements are the same error on every rank.
//
// Every rank runs every test in the same order; a test must make the same
// collective calls on all ranks. `--check-calls` runs the suite with
// MpiOptions::check_calls (the mismatch tests need it).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>

#include "../runtime/runtime_test_util.h"
#include "shardflow/base/error.h"
#include "shardflow/tensor/gemm.h"
#include "shardflow/tensor/parallel.h"
#include "shardflow/trace/compile.h"
#include "shardflow/trace/mark_sharding.h"
#include "shardflow/trace/ops.h"

namespace sf = shardflow;
using sf::DeviceGroup;
using sf::DType;
using sf::ReduceOp;
using sf::testing_util::Bytes;
using sf::testing_util::random_bytes;
using sf::testing_util::random_values;
using sf::testing_util::same_values;

namespace {

sf::Runtime* g_mpi = nullptr;
bool g_check_calls = false;

int64_t world() { return g_mpi->num_devices(); }
int64_t rank() { return g_mpi->process_index(); }

// One device's part of a test: its calls on `comm`, returning its output.
using DeviceCalls = std::function<Bytes(int64_t device, sf::Communicator& comm)>;

// Runs `calls` on every device of an in-process runtime of the job's size,
// and on this rank's device of the MPI job; compares this rank's outputs.
void expect_same_as_local(const DeviceCalls& calls, DType dtype, const std::string& what) {
  std::vector<Bytes> local(static_cast<std::size_t>(world()));
  {
    sf::Runtime rt = sf::Runtime::local(world());
    rt.run([&](int64_t device, sf::Communicator& comm) { local[static_cast<std::size_t>(device)] = calls(device, comm); });
  }
  Bytes mine;
  g_mpi->run([&](int64_t device, sf::Communicator& comm) { mine = calls(device, comm); });
  EXPECT_TRUE(same_values(dtype, mine, local[static_cast<std::size_t>(rank())]))
      << what << " on rank " << rank() << ": " << mine.size() << " bytes vs " << local[static_cast<std::size_t>(rank())].size();
}

// The groups a test runs over: a partition of the devices, as mesh axes
// make them. Each device's group is the one containing it.
struct Partition {
  std::string name;
  std::function<DeviceGroup(int64_t device)> group_of;
};

std::vector<Partition> partitions() {
  std::vector<Partition> out;
  out.push_back({"world", [](int64_t) {
                   DeviceGroup g;
                   for (int64_t d = 0; d < world(); ++d) g.devices.push_back(d);
                   return g;
                 }});
  out.push_back({"world reversed", [](int64_t) {
                   DeviceGroup g;
                   for (int64_t d = world(); d-- > 0;) g.devices.push_back(d);
                   return g;
                 }});
  if (world() % 2 == 0 && world() >= 4) {
    // The 'data' axis of a (2, world/2) mesh: devices d, d + world/2.
    out.push_back({"strided pairs", [](int64_t d) {
                     const int64_t half = world() / 2;
                     return DeviceGroup{{d % half, d % half + half}};
                   }});
    // The 'model' axis, in reverse order.
    out.push_back({"adjacent pairs reversed", [](int64_t d) { return DeviceGroup{{d | 1, d & ~int64_t{1}}}; }});
  }
  return out;
}

uint32_t seed_of(int64_t device, std::size_t count, int salt) {
  return static_cast<uint32_t>(device * 7919 + static_cast<int64_t>(count) * 31 + salt);
}

// mpirun starts every rank of these tests on this host.
TEST(MpiRuntime, CountsTheRanksOnThisHost) { EXPECT_EQ(g_mpi->devices_on_this_host(), world()); }

TEST(MpiCollectives, AllReduceMatchesInProcessBitForBit) {
  for (const Partition& partition : partitions()) {
    for (const DType dtype : sf::kAllDTypes) {
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        // Both sides of the gather/slice switch, and slices of uneven size.
        for (const std::size_t count : {0, 1, 37, 1000, 70001}) {
          expect_same_as_local(
              [&](int64_t device, sf::Communicator& comm) {
                Bytes data = random_values(dtype, count, seed_of(device, count, 1));
                comm.all_reduce(partition.group_of(device), data, dtype, op);
                return data;
              },
              dtype,
              fmt::format("all_reduce {} {} of {} over {}", sf::dtype_name(dtype), sf::reduce_op_name(op), count,
                          partition.name));
        }
      }
    }
  }
}

TEST(MpiCollectives, AllGatherAndInPlace) {
  for (const Partition& partition : partitions()) {
    for (const std::size_t bytes : {0, 5, 4099, 100000}) {
      for (const bool in_place : {false, true}) {
        expect_same_as_local(
            [&](int64_t device, sf::Communicator& comm) {
              const DeviceGroup group = partition.group_of(device);
              const Bytes input = random_bytes(bytes, seed_of(device, bytes, 2));
              Bytes output = random_bytes(bytes * static_cast<std::size_t>(group.size()), 3);
              const std::size_t offset = static_cast<std::size_t>(group.rank_of(device)) * bytes;
              if (in_place) {
                std::copy(input.begin(), input.end(), output.begin() + static_cast<std::ptrdiff_t>(offset));
                comm.all_gather(group, std::span<const std::byte>(output).subspan(offset, bytes), output);
              } else {
                comm.all_gather(group, input, output);
              }
              return output;
            },
            DType::kI32, fmt::format("all_gather of {} bytes over {}{}", bytes, partition.name, in_place ? ", in place" : ""));
      }
    }
  }
}

TEST(MpiCollectives, ReduceScatterAndInPlace) {
  for (const Partition& partition : partitions()) {
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kI64}) {
      for (const std::size_t chunk : {1, 333, 20000}) {
        for (const bool in_place : {false, true}) {
          expect_same_as_local(
              [&](int64_t device, sf::Communicator& comm) {
                const DeviceGroup group = partition.group_of(device);
                const std::size_t element = sf::element_size(dtype);
                Bytes input = random_values(dtype, chunk * static_cast<std::size_t>(group.size()), seed_of(device, chunk, 4));
                if (in_place) {
                  const std::size_t offset = static_cast<std::size_t>(group.rank_of(device)) * chunk * element;
                  comm.reduce_scatter(group, input, std::span(input).subspan(offset, chunk * element), dtype, ReduceOp::kSum);
                  return sf::testing_util::sub_bytes(input, offset, chunk * element);
                }
                Bytes output(chunk * element);
                comm.reduce_scatter(group, input, output, dtype, ReduceOp::kSum);
                return output;
              },
              dtype, fmt::format("reduce_scatter {} chunk {} over {}", sf::dtype_name(dtype), chunk, partition.name));
        }
      }
    }
  }
}

TEST(MpiCollectives, AllToAllPermuteAndBarrier) {
  for (const Partition& partition : partitions()) {
    for (const std::size_t chunk : {0, 3, 50000}) {
      expect_same_as_local(
          [&](int64_t device, sf::Communicator& comm) {
            const DeviceGroup group = partition.group_of(device);
            const Bytes input = random_bytes(chunk * static_cast<std::size_t>(group.size()), seed_of(device, chunk, 5));
            Bytes output(input.size());
            comm.all_to_all(group, input, output);
            comm.barrier(group);
            return output;
          },
          DType::kI32, fmt::format("all_to_all chunk {} over {}", chunk, partition.name));
    }
    // A shift by one along the group; the first member is nobody's target
    // (it gets zeros).
    expect_same_as_local(
        [&](int64_t device, sf::Communicator& comm) {
          const DeviceGroup group = partition.group_of(device);
          std::vector<std::pair<int64_t, int64_t>> pairs;
          for (std::size_t i = 0; i + 1 < group.devices.size(); ++i) pairs.emplace_back(group.devices[i], group.devices[i + 1]);
          const Bytes input = random_bytes(1000, seed_of(device, 0, 6));
          Bytes output = random_bytes(1000, 9);
          comm.collective_permute(group, pairs, input, output);
          return output;
        },
        DType::kI32, "collective_permute over " + partition.name);
  }
}

// A group of one device, and groups used before, interleaved.
TEST(MpiCollectives, SingletonAndRepeatedGroups) {
  expect_same_as_local(
      [&](int64_t device, sf::Communicator& comm) {
        Bytes data = random_values(DType::kF32, 100, seed_of(device, 100, 7));
        comm.all_reduce(DeviceGroup{{device}}, data, DType::kF32, ReduceOp::kSum);
        for (int round = 0; round < 20; ++round) {
          for (const Partition& partition : partitions()) {
            comm.all_reduce(partition.group_of(device), data, DType::kF32, ReduceOp::kMax);
          }
        }
        return data;
      },
      DType::kF32, "interleaved groups");
}

TEST(MpiCollectives, MismatchedCallsAreTheSameErrorOnEveryRank) {
  if (!g_check_calls) GTEST_SKIP() << "needs --check-calls (MpiOptions::check_calls)";
  std::string message;
  g_mpi->run([&](int64_t device, sf::Communicator& comm) {
    DeviceGroup everyone;
    for (int64_t d = 0; d < world(); ++d) everyone.devices.push_back(d);
    Bytes data(device == 1 ? 12 : 16);
    try {
      comm.all_reduce(everyone, data, DType::kF32, ReduceOp::kSum);
    } catch (const sf::Error& error) {
      message = error.what();
    }
    // The group stays usable.
    Bytes ok = random_values(DType::kF32, 4, 1);
    comm.all_reduce(everyone, ok, DType::kF32, ReduceOp::kSum);
  });
  EXPECT_EQ(message, "all_reduce over group [" + [] {
    std::string ids;
    for (int64_t d = 0; d < world(); ++d) ids += (d > 0 ? ", " : "") + std::to_string(d);
    return ids;
  }() + "]: device 0 passes 16 input bytes but device 1 passes 12");
}

// ------------------------------------------------------------- kernel threads

// mpiexec binds each rank to a core when there are no more ranks than cores:
// the kernels must not start more threads than the rank may run on (two
// threads on one core take turns, each step waiting on the other).
TEST(MpiRuntime, KernelThreadsFitTheCoresTheRankMayRunOn) {
  EXPECT_GE(sf::kernel_threads(), 1);
  EXPECT_LE(sf::kernel_threads(), sf::available_cores()) << "rank " << rank();
}

// --------------------------------------------------------------- SPMD on MPI

sf::Mesh mesh_of(std::vector<int64_t> shape, std::vector<std::string> names) {
  std::vector<int64_t> ids(static_cast<std::size_t>(world()));
  for (int64_t d = 0; d < world(); ++d) ids[static_cast<std::size_t>(d)] = d;
  return sf::Mesh(ids, std::move(shape), std::move(names));
}

TEST(MpiSpmd, EagerShardsStayOnTheirRankAndValueGathersThem) {
  const sf::Mesh mesh = mesh_of({world()}, {"x"});
  const sf::Tensor global = sf::randn({2 * world() + 1, 3}, 11);  // uneven: padding on the last device
  const std::vector<float> expected = global.to_floats();
  sf::Tensor t = sf::Tensor(global.value());
  sf::mark_sharding(t, mesh, {"x", sf::none});
  const std::vector<sf::LocalShard> shards = t.local_shards();
  ASSERT_EQ(static_cast<int64_t>(shards.size()), world());
  for (int64_t d = 0; d < world(); ++d) {
    EXPECT_EQ(shards[static_cast<std::size_t>(d)].data.defined(), d == rank()) << "shard of device " << d;
  }
  EXPECT_EQ(t.to_floats(), expected);  // a collective read
}

TEST(MpiSpmd, CompiledMegatronMlpMatchesUnsharded) {
  const int64_t model = world() >= 4 ? world() / 2 : world();
  const sf::Mesh mesh = mesh_of({world() / model, model}, {"data", "model"});
  const sf::Tensor x = sf::randn({4, 6, 16}, 1), w1 = sf::randn({16, 8 * model}, 2), w2 = sf::randn({8 * model, 16}, 3);
  const auto mlp = [](const sf::Tensor& a, const sf::Tensor& b, const sf::Tensor& c) {
    return sf::matmul(sf::silu(sf::matmul(a, b)), c);
  };
  const std::vector<float> expected = mlp(x, w1, w2).to_floats();  // one device, on every rank

  sf::Tensor xs(x.value()), w1s(w1.value()), w2s(w2.value());
  sf::mark_sharding(w1s, mesh, {sf::none, "model"});
  sf::mark_sharding(w2s, mesh, {"model", sf::none});
  auto step = sf::compile([&](sf::Tensor input) {
    sf::Tensor h = sf::mark_sharding(input, mesh, {"data", sf::none, sf::none});
    return mlp(h, w1s, w2s);
  });
  for (int call = 0; call < 3; ++call) {
    const std::vector<float> got = step(xs).to_floats();
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-4 * (1 + std::abs(expected[i])));
  }
}

TEST(MpiSpmd, RanksThatTraceDifferentProgramsAreTold) {
  const sf::Mesh mesh = mesh_of({world()}, {"x"});
  // Rank 1 traces a different shape: every rank gets the same error.
  const sf::Tensor input = sf::randn({world() * (rank() == 1 ? 3 : 2), 4}, 5);
  auto step = sf::compile([&](sf::Tensor a) { return sf::relu(sf::mark_sharding(a, mesh, {"x", sf::none})); });
  try {
    step(input);
    ADD_FAILURE() << "no error";
  } catch (const sf::Error& error) {
    EXPECT_NE(std::string(error.what()).find("the MPI ranks traced different programs: rank 1"), std::string::npos)
        << error.what();
  }
}

class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int64_t rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %lld: %s:%d: failure\n%s\n", static_cast<long long>(rank_),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.summary());
  }

 private:
  int64_t rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  sf::MpiOptions options;
  for (int i = 1; i < argc; ++i) options.check_calls |= std::string(argv[i]) == "--check-calls";
  options.collective_timeout_s = 60;
  g_check_calls = options.check_calls;
  sf::Runtime mpi = sf::Runtime::mpi(options);
  g_mpi = &mpi;
  // One report per job: the other ranks print only their failures.
  if (mpi.process_index() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(mpi.process_index()));
  }
  const int status = RUN_ALL_TESTS();
  // Every rank's verdict decides the job's exit status.
  return status;
}
