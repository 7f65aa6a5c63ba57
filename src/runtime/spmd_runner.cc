#include "shardflow/runtime/spmd_runner.h"

#include <fmt/format.h>

#include <cstring>
#include <optional>

#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"
#include "shardflow/partition/program.h"
#include "shardflow/propagation/propagation.h"
#include "shardflow/runtime/executor.h"
#include "shardflow/tensor/gemm.h"

namespace shardflow {

ProgramCollective report_collective(const CollectiveInfo& info, const Mesh& mesh) {
  ProgramCollective report;
  report.kind = to_string(info.kind);
  report.description = info.describe(mesh);
  report.bytes_per_device = info.bytes_per_device;
  for (int axis : info.axes) {
    report.group_size *= mesh.axis_size(axis);
    report.axes.push_back(mesh.axis_label(axis));
  }
  report.groups = info.groups(mesh);
  report.value = info.value != nullptr ? "%" + info.value->name() : "";
  report.reason = info.reason;
  return report;
}

namespace {

struct SpmdPrepared : PreparedGraph {
  SpmdPrepared(PropagationResult s, PartitionedProgram p) : shardings(std::move(s)), program(std::move(p)) {}

  std::string describe(const Graph& graph) const override {
    std::string out = print_with_shardings(graph, shardings) + "\n" + program.to_string(graph);
    out += fmt::format("\n{} collective(s):\n", program.collectives.size());
    for (const CollectiveInfo& info : program.collectives) out += "  " + info.describe(*program.mesh) + "\n";
    for (const std::string& warning : program.warnings) out += "warning: " + warning + "\n";
    return out;
  }

  std::vector<Sharding> input_shardings() const override { return program.input_shardings; }

  std::vector<ProgramCollective> collectives() const override {
    std::vector<ProgramCollective> out;
    for (const CollectiveInfo& info : program.collectives) out.push_back(report_collective(info, *program.mesh));
    return out;
  }

  PropagationResult shardings;
  PartitionedProgram program;
};

}  // namespace

std::shared_ptr<const PreparedGraph> SpmdRunner::prepare(const Graph& graph,
                                                         std::span<const std::optional<Sharding>> input_shardings) {
  // Eager layouts on another mesh than the graph's (or on a one-device mesh)
  // are not constraints: such inputs are fed as plain values.
  PropagationResult shardings = propagate_shardings(graph, input_shardings);
  if (process_) check_processes_agree(print_with_shardings(graph, shardings));
  PartitionedProgram program = partition_graph(graph, shardings);
  return std::make_shared<SpmdPrepared>(std::move(shardings), std::move(program));
}

const DeviceGroup& SpmdRunner::all_devices() {
  if (all_devices_.devices.empty()) {
    for (int64_t d = 0; d < num_devices_; ++d) all_devices_.devices.push_back(d);
  }
  return all_devices_;
}

void SpmdRunner::check_processes_agree(const std::string& program_text) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (char c : program_text) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  std::vector<uint64_t> hashes(static_cast<std::size_t>(num_devices_));
  process_->comm->all_gather(all_devices(), std::as_bytes(std::span(&hash, 1)),
                             std::as_writable_bytes(std::span(hashes)));
  for (std::size_t rank = 1; rank < hashes.size(); ++rank) {
    if (hashes[rank] != hashes[0]) {
      throw Error(fmt::format(
          "the MPI ranks traced different programs: rank {}'s graph (or its shapes or shardings) differs from "
          "rank 0's; every rank must run the same program on the same shapes (same arguments and inputs)",
          rank));
    }
  }
}

void SpmdRunner::fetch_shards(std::vector<DenseTensor>& shards, const ShardLayout& layout, DType dtype) {
  if (!process_) {
    GraphRunner::fetch_shards(shards, layout, dtype);
    return;
  }
  // Every process contributes the shard of its device (zeros when the
  // layout does not include it) and takes the ones it lacks.
  const Shape shard_shape = layout.shard_shape;
  DenseTensor mine = DenseTensor::zeros(dtype, shard_shape);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (layout.shards[i].device == process_->device && shards[i].defined()) mine = shards[i];
  }
  Shape all_shape = shard_shape;
  all_shape.insert(all_shape.begin(), num_devices_);
  DenseTensor all = DenseTensor::empty(dtype, all_shape);
  process_->comm->all_gather(all_devices(), mine.bytes(), {all.data(), all.nbytes()});
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].defined()) continue;
    const auto device = static_cast<std::size_t>(layout.shards[i].device);
    shards[i] = DenseTensor::empty(dtype, shard_shape);
    std::memcpy(shards[i].data(), all.data() + device * mine.nbytes(), mine.nbytes());
  }
}

std::vector<Tensor> SpmdRunner::run(const PreparedGraph& prepared, std::vector<Tensor> inputs, OpProfile* profile) {
  const auto& spmd = dynamic_cast<const SpmdPrepared&>(prepared);
  // A program on one device while the others idle: its kernels get their
  // cores (a graph without annotations on 2 in-process devices decoded
  // stories15M at 200 tokens/s on one kernel thread, 330 on one device).
  // The bits do not depend on the thread count.
  std::optional<ScopedKernelThreads> threads;
  if (spmd.program.mesh->size() == 1 && num_devices_ > 1 && alone_kernel_threads_ > 0) {
    threads.emplace(alone_kernel_threads_);
  }
  return run_program(spmd.program, num_devices_, run_on_devices_, std::move(inputs), profile);
}

}  // namespace shardflow
