// Runs a graph on one device with the reference kernels.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "shardflow/ir/graph.h"
#include "shardflow/tensor/dense_tensor.h"

namespace shardflow {

class OpProfile;

// A graph made ready for repeated runs: each node's operand and result
// slots, its bound arguments, and the values it is the last reader of, found
// once instead of on every run (a decode step runs a few hundred small ops,
// where that bookkeeping was a visible share of the time). The graph must
// outlive the interpreter.
class GraphInterpreter {
 public:
  explicit GraphInterpreter(const Graph& graph);

  // One value per graph input, in order; returns one per graph output. Each
  // value is released after its last use, and handed to that last reader
  // (so a kernel may update a buffer that nothing else holds in place).
  // With a profile, each op's time is added to it (as device 0).
  std::vector<DenseTensor> run(std::vector<DenseTensor> inputs, OpProfile* profile = nullptr) const;

 private:
  // One node, ready to run. The slot lists of all steps share one array,
  // read front to back: a step touches a few adjacent cache lines instead of
  // separate heap blocks per list (after each matrix-vector product of a
  // decode step streamed its weights through the caches, every line the
  // next small op touches is a miss).
  struct Step {
    const Node* node;
    const KernelFn* kernel;
    OpArgs args;
    // Into slot_lists_: operands as (slot << 1) | handed_over, where
    // handed_over means this is the slot's last reader and reads it once;
    // then results; then the slots whose last reader this is.
    uint32_t first_operand, num_operands, num_results, num_releases;
    // Into new_shapes_ when the node only reinterprets its operand
    // (reinterprets_operand): the result is the operand's buffer under that
    // shape and the kernel is not called. -1 otherwise.
    int32_t new_shape;
  };

  const Graph& graph_;
  std::vector<Step> steps_;
  std::vector<Shape> new_shapes_;
  std::vector<int> slot_lists_;
  std::vector<int> output_slots_;
  std::size_t num_slots_ = 0;
};

// The same, once.
std::vector<DenseTensor> run_graph(const Graph& graph, std::span<const DenseTensor> inputs);

}  // namespace shardflow
