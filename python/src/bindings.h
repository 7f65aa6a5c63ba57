// The parts of the `shardflow._core` module, one per area of the C++ API.
#pragma once
#include <nanobind/nanobind.h>

namespace shardflow::python {

namespace nb = nanobind;

void bind_sharding(nb::module_& m);  // Mesh, PartitionSpec, Sharding, HloSharding, layouts
void bind_tensor(nb::module_& m);    // Tensor, its ops, mark_sharding, compile
void bind_graph(nb::module_& m);     // IR graphs, propagation, partitioning, runtimes, runs
void bind_llama(nb::module_& m);     // the LLaMA 2 model (submodule llama)

}  // namespace shardflow::python
