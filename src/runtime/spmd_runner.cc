#include "shardflow/runtime/spmd_runner.h"

#include <fmt/format.h>

#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"
#include "shardflow/partition/program.h"
#include "shardflow/propagation/propagation.h"
#include "shardflow/runtime/executor.h"

namespace shardflow {

namespace {

struct SpmdPrepared : PreparedGraph {
  SpmdPrepared(PropagationResult s, PartitionedProgram p) : shardings(std::move(s)), program(std::move(p)) {}

  std::string describe(const Graph& graph) const override {
    std::string out = print_with_shardings(graph, shardings);
    out += fmt::format("\n{} collective(s):\n", program.collectives.size());
    for (const CollectiveInfo& info : program.collectives) out += "  " + info.describe(*program.mesh) + "\n";
    for (const std::string& warning : program.warnings) out += "warning: " + warning + "\n";
    return out;
  }

  std::vector<ProgramCollective> collectives() const override {
    std::vector<ProgramCollective> out;
    for (const CollectiveInfo& info : program.collectives) {
      out.push_back({std::string(to_string(info.kind)), info.describe(*program.mesh), info.bytes_per_device});
    }
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
  PartitionedProgram program = partition_graph(graph, shardings);
  return std::make_shared<SpmdPrepared>(std::move(shardings), std::move(program));
}

std::vector<Tensor> SpmdRunner::run(const PreparedGraph& prepared, std::span<const Tensor> inputs) {
  const auto& spmd = dynamic_cast<const SpmdPrepared&>(prepared);
  return run_program(spmd.program, num_devices_, run_on_devices_, inputs);
}

}  // namespace shardflow
