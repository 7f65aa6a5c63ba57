// The GraphRunner of a multi-device runtime: compile()d graphs get their
// shardings propagated, are partitioned into one SPMD program, and run on the
// runtime's devices. The runtime installs it while it exists.
#pragma once

#include "shardflow/runtime/executor.h"
#include "shardflow/trace/compile.h"

namespace shardflow {

// A collective of a partitioned program as compile() reports it.
ProgramCollective report_collective(const CollectiveInfo& info, const Mesh& mesh);

// A runtime whose devices live in several processes: this process's device
// and a communicator that reaches every device.
struct ProcessView {
  int64_t device = 0;
  Communicator* comm = nullptr;
};

class SpmdRunner : public GraphRunner {
 public:
  // alone_kernel_threads: the kernel threads of a program that runs on one
  // device of several (a graph without annotations) while the other devices
  // idle; 0 leaves kernel_threads() as it is.
  SpmdRunner(int64_t num_devices, std::function<void(const DeviceProgram&)> run_on_devices,
             std::optional<ProcessView> process = std::nullopt, int alone_kernel_threads = 0)
      : num_devices_(num_devices),
        run_on_devices_(std::move(run_on_devices)),
        process_(process),
        alone_kernel_threads_(alone_kernel_threads) {}

  std::shared_ptr<const PreparedGraph> prepare(const Graph& graph,
                                               std::span<const std::optional<Sharding>> input_shardings) override;
  std::vector<Tensor> run(const PreparedGraph& prepared, std::vector<Tensor> inputs, OpProfile* profile) override;

  bool is_addressable(int64_t device) const override { return !process_ || device == process_->device; }
  // An all-gather over every device (each contributes its own shard).
  void fetch_shards(std::vector<DenseTensor>& shards, const ShardLayout& layout, DType dtype) override;

 private:
  // Multi-process: every process must have traced the same program; checks
  // that once per prepared graph (a hash of the graph and its shardings).
  void check_processes_agree(const std::string& program_text);
  // The group of every device, made once (check_processes_agree and
  // fetch_shards gather over it).
  const DeviceGroup& all_devices();

  int64_t num_devices_;
  std::function<void(const DeviceProgram&)> run_on_devices_;
  std::optional<ProcessView> process_;
  int alone_kernel_threads_;
  DeviceGroup all_devices_;
};

}  // namespace shardflow
