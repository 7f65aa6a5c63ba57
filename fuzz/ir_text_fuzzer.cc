// IR text: parse_graph, then verify_graph on what parses, then print_graph
// on what verifies (the printer walks every node and constant).
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/ops.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  shardflow::ops::register_all_ops();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardflow_fuzz::run([&] {
    const shardflow::Graph graph = shardflow::parse_graph(shardflow_fuzz::as_text(data, size));
    shardflow::verify_graph(graph);
    (void)shardflow::print_graph(graph);
  });
  return 0;
}
