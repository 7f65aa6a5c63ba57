// IR text: parse_graph, then verify_graph on what parses, then print_graph
// on what verifies (the printer walks every node and constant). With
// SHARDFLOW_FUZZ_ROUNDTRIP=1, the printed text must parse and verify again
// and print the same.
#include <cstddef>
#include <cstdint>
#include <string>

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
    const std::string printed = shardflow::print_graph(graph);
    if (!shardflow_fuzz::roundtrip()) return;
    std::string again;
    try {
      const shardflow::Graph reparsed = shardflow::parse_graph(printed);
      shardflow::verify_graph(reparsed);
      again = shardflow::print_graph(reparsed);
    } catch (const shardflow::Error& e) {
      shardflow_fuzz::invariant_failed("printed IR does not parse and verify", printed, e.what());
    }
    if (again != printed) shardflow_fuzz::invariant_failed("printed IR prints differently", printed, again);
  });
  return 0;
}
