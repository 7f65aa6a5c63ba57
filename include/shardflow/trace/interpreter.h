// Runs a graph on one device with the reference kernels.
#pragma once

#include <span>
#include <vector>

#include "shardflow/ir/graph.h"
#include "shardflow/tensor/dense_tensor.h"

namespace shardflow {

// One value per graph input, in order; returns one per graph output. Each
// intermediate is released after its last use.
std::vector<DenseTensor> run_graph(const Graph& graph, std::span<const DenseTensor> inputs);

}  // namespace shardflow
