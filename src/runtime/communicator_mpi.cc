#include "communicator_mpi.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "reduce.h"
#include "shardflow/base/error.h"

namespace shardflow::detail {

namespace {

// A total input over the group up to this many bytes is all-gathered and
// reduced whole by every member (one MPI call); larger ones are split into
// one slice per member (two MPI calls, each member reduces 1/n of the
// data). Measured with OpenMPI's shared-memory transport, whose messages
// above 4 KiB switch to a slower rendezvous protocol: on 2 ranks a 4 KiB
// all-gather took 6 us where alltoall + all-gather of 2 KiB halves took 3.
constexpr std::size_t kGatherReduceMaxBytes = 2 * 1024;

// The tag of a large all_reduce's slices (point to point on the group's
// communicator, which carries nothing else at the time).
constexpr int kSliceTag = 1;

void check_mpi(int code, std::string_view what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(fmt::format("MPI {} failed: {}", what, std::string_view(text, static_cast<std::size_t>(length))));
}

// MPI counts are ints: a larger message is an error, not a silent wrap.
int count_of(std::size_t bytes, CollectiveKind kind) {
  if (bytes > static_cast<std::size_t>(INT_MAX)) {
    throw Error(fmt::format("{}: a message of {} bytes is over MPI's limit of {} bytes per call", collective_name(kind),
                            bytes, INT_MAX));
  }
  return static_cast<int>(bytes);
}

// What one member tells the others about its call (check_calls mode).
struct WireCall {
  uint64_t kind, dtype, op;
  uint64_t input_bytes, output_bytes, input_address, output_address, pairs_hash;
};

uint64_t hash_pairs(const std::vector<std::pair<int64_t, int64_t>>* pairs) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the ids
  if (pairs == nullptr) return hash;
  for (const auto& [source, target] : *pairs) {
    for (int64_t id : {source, target}) {
      hash = (hash ^ static_cast<uint64_t>(id)) * 1099511628211ull;
    }
  }
  return hash;
}

}  // namespace

class MpiCommunicator::Scope {
 public:
  Scope(CollectiveWatch& watch, const GroupComm& group, CollectiveKind kind) : watch_(watch) {
    watch_.kind.store(kind, std::memory_order_relaxed);
    watch_.group.store(&group.group, std::memory_order_relaxed);
    watch_.since_ns.store(CollectiveWatch::now_ns(), std::memory_order_release);
  }
  ~Scope() {
    watch_.since_ns.store(0, std::memory_order_release);
    watch_.calls.fetch_add(1, std::memory_order_relaxed);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  CollectiveWatch& watch_;
};

MpiCommunicator::MpiCommunicator(int64_t world_rank, int64_t world_size, bool check_calls)
    : rank_(world_rank), size_(world_size), check_calls_(check_calls) {}

MpiCommunicator::~MpiCommunicator() {
  for (auto& [devices, group] : groups_) {
    if (group.comm != MPI_COMM_NULL) MPI_Comm_free(&group.comm);
  }
}

MpiCommunicator::GroupComm& MpiCommunicator::comm_of(const DeviceGroup& group, CollectiveKind kind) {
  if (auto it = groups_.find(group.devices); it != groups_.end()) return it->second;
  if (group.devices.empty()) throw Error(fmt::format("{}: the group is empty", collective_name(kind)));
  std::vector<int> ranks;
  for (int64_t device : group.devices) {
    if (device < 0 || device >= size_) {
      throw Error(fmt::format("{} over group {}: device {} does not exist (the MPI job has {} ranks)",
                              collective_name(kind), group.to_string(), device, size_));
    }
    if (std::find(ranks.begin(), ranks.end(), static_cast<int>(device)) != ranks.end()) {
      throw Error(
          fmt::format("{} over group {}: device {} appears twice", collective_name(kind), group.to_string(), device));
    }
    ranks.push_back(static_cast<int>(device));
  }
  GroupComm entry{.group = group, .rank = group.rank_of(rank_)};
  MPI_Group world_group = MPI_GROUP_NULL, sub_group = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
  const int included = MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &sub_group);
  MPI_Group_free(&world_group);
  check_mpi(included, "MPI_Group_incl");
  auto& stored = groups_.emplace(group.devices, std::move(entry)).first->second;
  int created = MPI_SUCCESS;
  {
    const Scope scope(watch_, stored, kind);  // creation waits for every member
    created = MPI_Comm_create_group(MPI_COMM_WORLD, sub_group, /*tag=*/0, &stored.comm);
  }
  MPI_Group_free(&sub_group);
  if (created != MPI_SUCCESS) {
    groups_.erase(group.devices);
    check_mpi(created, "MPI_Comm_create_group");
  }
  MPI_Comm_set_errhandler(stored.comm, MPI_ERRORS_RETURN);
  return stored;
}

void MpiCommunicator::check(const GroupComm& group, const CallInfo& call) {
  const auto n = static_cast<std::size_t>(group.size());
  std::vector<CallInfo>& calls = calls_;
  calls.resize(n);
  if (check_calls_) {
    const WireCall mine{static_cast<uint64_t>(call.kind),
                        static_cast<uint64_t>(call.dtype),
                        static_cast<uint64_t>(call.op),
                        call.input_bytes,
                        call.output_bytes,
                        reinterpret_cast<uintptr_t>(call.input),
                        reinterpret_cast<uintptr_t>(call.output),
                        hash_pairs(call.pairs)};
    std::vector<WireCall> all(n);
    const Scope scope(watch_, group, call.kind);
    check_mpi(MPI_Allgather(&mine, sizeof(WireCall), MPI_BYTE, all.data(), sizeof(WireCall), MPI_BYTE, group.comm),
              "MPI_Allgather (call check)");
    for (std::size_t m = 0; m < n; ++m) {
      const WireCall& wire = all[m];
      if (wire.kind == all[0].kind && wire.pairs_hash != all[0].pairs_hash) {
        throw Error(fmt::format("{} over group {}: device {} and device {} pass different pairs",
                                collective_name(call.kind), group.group.to_string(), group.group.devices[0],
                                group.group.devices[m]));
      }
      calls[m] = CallInfo{.kind = static_cast<CollectiveKind>(
                              std::min<uint64_t>(wire.kind, static_cast<uint64_t>(CollectiveKind::kBarrier))),
                          .dtype = static_cast<DType>(wire.dtype),
                          .op = static_cast<ReduceOp>(wire.op),
                          .input = reinterpret_cast<const std::byte*>(static_cast<uintptr_t>(wire.input_address)),
                          .input_bytes = wire.input_bytes,
                          .output = reinterpret_cast<std::byte*>(static_cast<uintptr_t>(wire.output_address)),
                          .output_bytes = wire.output_bytes,
                          .pairs = call.pairs};
    }
  } else {
    // Only this member's call is known: the others are taken to agree, with
    // no buffers (so that only this member's buffers are checked).
    for (std::size_t m = 0; m < n; ++m) {
      calls[m] = call;
      calls[m].input = nullptr;
      calls[m].output = nullptr;
    }
    calls[static_cast<std::size_t>(group.rank)] = call;
  }
  call_views_.clear();
  for (const CallInfo& c : calls) call_views_.push_back(&c);
  check_calls(group.group, call_views_);
}

void MpiCommunicator::all_reduce(const DeviceGroup& group, std::span<std::byte> data, DType dtype, ReduceOp op) {
  constexpr CollectiveKind kind = CollectiveKind::kAllReduce;
  GroupComm& g = comm_of(group, kind);
  check(g, CallInfo{.kind = kind,
                    .dtype = dtype,
                    .op = op,
                    .input = data.data(),
                    .input_bytes = data.size(),
                    .output = data.data(),
                    .output_bytes = data.size()});
  const std::size_t bytes = data.size();
  const auto n = static_cast<std::size_t>(g.size());
  if (n == 1 || bytes == 0) return;
  const Scope scope(watch_, g, kind);
  std::vector<const std::byte*>& sources = sources_;
  sources.resize(n);
  if (bytes * n <= kGatherReduceMaxBytes) {
    scratch_.resize(bytes * n);
    check_mpi(MPI_Allgather(data.data(), count_of(bytes, kind), MPI_BYTE, scratch_.data(), count_of(bytes, kind),
                            MPI_BYTE, g.comm),
              "MPI_Allgather (all_reduce)");
    for (std::size_t m = 0; m < n; ++m) sources[m] = scratch_.data() + m * bytes;
    std::byte* const destination = data.data();
    reduce_arrays(dtype, op, sources, std::span(&destination, 1), bytes / element_size(dtype));
    return;
  }
  // Member m's slice of every buffer goes to member m, which reduces it and
  // shares the result.
  counts_.assign(n, 0);
  displacements_.assign(n, 0);
  for (std::size_t m = 0; m < n; ++m) {
    const auto [begin, end] = slice_of(bytes, dtype, static_cast<int64_t>(n), static_cast<int64_t>(m));
    counts_[m] = count_of(end - begin, kind);
    displacements_[m] = count_of(begin, kind);
  }
  // Point to point rather than MPI_Alltoall: this member's own slice is
  // reduced where it is instead of being copied to the scratch first.
  const auto mine = static_cast<std::size_t>(g.rank);
  const auto slice = static_cast<std::size_t>(counts_[mine]);
  scratch_.resize(std::max<std::size_t>(slice * n, 1));
  requests_.clear();
  for (std::size_t m = 0; m < n; ++m) {
    if (m == mine) continue;
    requests_.emplace_back();
    check_mpi(MPI_Irecv(scratch_.data() + m * slice, counts_[mine], MPI_BYTE, static_cast<int>(m), kSliceTag, g.comm,
                        &requests_.back()),
              "MPI_Irecv (all_reduce)");
  }
  for (std::size_t step = 1; step < n; ++step) {  // staggered, so that not everyone sends to member 0 first
    const std::size_t m = (mine + step) % n;
    requests_.emplace_back();
    check_mpi(MPI_Isend(data.data() + displacements_[m], counts_[m], MPI_BYTE, static_cast<int>(m), kSliceTag, g.comm,
                        &requests_.back()),
              "MPI_Isend (all_reduce)");
  }
  check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE),
            "MPI_Waitall (all_reduce)");
  for (std::size_t m = 0; m < n; ++m) {
    sources[m] = m == mine ? data.data() + displacements_[mine] : scratch_.data() + m * slice;
  }
  std::byte* const destination = data.data() + displacements_[mine];
  reduce_arrays(dtype, op, sources, std::span(&destination, 1), slice / element_size(dtype));
  const bool even = std::all_of(counts_.begin(), counts_.end(), [&](int c) { return c == counts_[0]; });
  if (even) {  // MPI's plain form is faster than the v form
    check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, data.data(), counts_[0], MPI_BYTE, g.comm),
              "MPI_Allgather (all_reduce)");
  } else {
    check_mpi(
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, data.data(), counts_.data(), displacements_.data(), MPI_BYTE, g.comm),
        "MPI_Allgatherv (all_reduce)");
  }
}

void MpiCommunicator::all_gather(const DeviceGroup& group, std::span<const std::byte> input,
                                 std::span<std::byte> output) {
  constexpr CollectiveKind kind = CollectiveKind::kAllGather;
  GroupComm& g = comm_of(group, kind);
  check(g, CallInfo{.kind = kind,
                    .input = input.data(),
                    .input_bytes = input.size(),
                    .output = output.data(),
                    .output_bytes = output.size()});
  const std::size_t chunk = input.size();
  if (chunk == 0) return;
  const Scope scope(watch_, g, kind);
  const bool in_place = input.data() == output.data() + static_cast<std::size_t>(g.rank) * chunk;
  check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : input.data(), count_of(chunk, kind), MPI_BYTE, output.data(),
                          count_of(chunk, kind), MPI_BYTE, g.comm),
            "MPI_Allgather");
}

void MpiCommunicator::reduce_scatter(const DeviceGroup& group, std::span<const std::byte> input,
                                     std::span<std::byte> output, DType dtype, ReduceOp op) {
  constexpr CollectiveKind kind = CollectiveKind::kReduceScatter;
  GroupComm& g = comm_of(group, kind);
  check(g, CallInfo{.kind = kind,
                    .dtype = dtype,
                    .op = op,
                    .input = input.data(),
                    .input_bytes = input.size(),
                    .output = output.data(),
                    .output_bytes = output.size()});
  const std::size_t chunk = output.size();
  const auto n = static_cast<std::size_t>(g.size());
  if (chunk == 0) return;
  const Scope scope(watch_, g, kind);
  scratch_.resize(chunk * n);
  check_mpi(MPI_Alltoall(input.data(), count_of(chunk, kind), MPI_BYTE, scratch_.data(), count_of(chunk, kind),
                         MPI_BYTE, g.comm),
            "MPI_Alltoall (reduce_scatter)");
  std::vector<const std::byte*>& sources = sources_;
  sources.resize(n);
  for (std::size_t m = 0; m < n; ++m) sources[m] = scratch_.data() + m * chunk;
  std::byte* const destination = output.data();
  reduce_arrays(dtype, op, sources, std::span(&destination, 1), chunk / element_size(dtype));
}

void MpiCommunicator::all_to_all(const DeviceGroup& group, std::span<const std::byte> input,
                                 std::span<std::byte> output) {
  constexpr CollectiveKind kind = CollectiveKind::kAllToAll;
  GroupComm& g = comm_of(group, kind);
  check(g, CallInfo{.kind = kind,
                    .input = input.data(),
                    .input_bytes = input.size(),
                    .output = output.data(),
                    .output_bytes = output.size()});
  const std::size_t chunk = input.size() / static_cast<std::size_t>(g.size());
  if (chunk == 0) return;
  const Scope scope(watch_, g, kind);
  check_mpi(MPI_Alltoall(input.data(), count_of(chunk, kind), MPI_BYTE, output.data(), count_of(chunk, kind), MPI_BYTE,
                         g.comm),
            "MPI_Alltoall");
}

void MpiCommunicator::collective_permute(const DeviceGroup& group,
                                         const std::vector<std::pair<int64_t, int64_t>>& pairs,
                                         std::span<const std::byte> input, std::span<std::byte> output) {
  constexpr CollectiveKind kind = CollectiveKind::kCollectivePermute;
  GroupComm& g = comm_of(group, kind);
  check(g, CallInfo{.kind = kind,
                    .input = input.data(),
                    .input_bytes = input.size(),
                    .output = output.data(),
                    .output_bytes = output.size(),
                    .pairs = &pairs});
  const Scope scope(watch_, g, kind);
  const int count = count_of(input.size(), kind);
  std::vector<MPI_Request> requests;
  bool received = false;
  for (const auto& [source, target] : pairs) {
    if (target == rank_) {
      requests.emplace_back();
      check_mpi(MPI_Irecv(output.data(), count, MPI_BYTE, group.rank_of(source), 0, g.comm, &requests.back()),
                "MPI_Irecv (collective_permute)");
      received = true;
    }
  }
  for (const auto& [source, target] : pairs) {
    if (source == rank_) {
      requests.emplace_back();
      check_mpi(MPI_Isend(input.data(), count, MPI_BYTE, group.rank_of(target), 0, g.comm, &requests.back()),
                "MPI_Isend (collective_permute)");
    }
  }
  if (!received && !output.empty()) std::memset(output.data(), 0, output.size());
  check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
            "MPI_Waitall (collective_permute)");
}

void MpiCommunicator::barrier(const DeviceGroup& group) {
  constexpr CollectiveKind kind = CollectiveKind::kBarrier;
  GroupComm& g = comm_of(group, kind);
  check(g, CallInfo{.kind = kind});
  const Scope scope(watch_, g, kind);
  check_mpi(MPI_Barrier(g.comm), "MPI_Barrier");
}

}  // namespace shardflow::detail
