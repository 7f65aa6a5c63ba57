// The GraphRunner of a multi-device runtime: compile()d graphs get their
// shardings propagated, are partitioned into one SPMD program, and run on the
// runtime's devices. The runtime installs it while it exists.
#pragma once

#include "shardflow/runtime/executor.h"
#include "shardflow/trace/compile.h"

namespace shardflow {

class SpmdRunner : public GraphRunner {
 public:
  SpmdRunner(int64_t num_devices, std::function<void(const DeviceProgram&)> run_on_devices)
      : num_devices_(num_devices), run_on_devices_(std::move(run_on_devices)) {}

  std::shared_ptr<const PreparedGraph> prepare(const Graph& graph,
                                               std::span<const std::optional<Sharding>> input_shardings) override;
  std::vector<Tensor> run(const PreparedGraph& prepared, std::span<const Tensor> inputs) override;

 private:
  int64_t num_devices_;
  std::function<void(const DeviceProgram&)> run_on_devices_;
};

}  // namespace shardflow
