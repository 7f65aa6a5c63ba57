// HloSharding strings: HloSharding::parse, then the printer on what parses,
// and the parser again on the printed text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "shardflow/sharding/hlo_sharding.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardflow_fuzz::run([&] {
    const shardflow::HloSharding sharding = shardflow::HloSharding::parse(shardflow_fuzz::as_text(data, size));
    const std::string printed = sharding.to_string();
    (void)sharding.num_data_dims();
    // Printed text is meant to parse again (two known cycles are not fixed
    // points, so only parsing is exercised, not equality).
    (void)shardflow::HloSharding::parse(printed);
  });
  return 0;
}
