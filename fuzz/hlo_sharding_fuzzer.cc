// HloSharding strings: HloSharding::parse, then the printer on what parses,
// and the parser again on the printed text. With SHARDFLOW_FUZZ_ROUNDTRIP=1
// the printed text must also print the same and parse to an equal sharding
// (except the two cycles tests/sharding/hlo_sharding_parser_test.cc pins as
// known quirks).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "shardflow/sharding/hlo_sharding.h"

namespace {

// As has_known_quirk in tests/sharding/hlo_sharding_parser_test.cc.
bool has_known_quirk(const shardflow::HloSharding& s) {
  if (s.kind() == shardflow::HloSharding::Kind::kTuple) {
    return std::any_of(s.tuple_elements().begin(), s.tuple_elements().end(), has_known_quirk);
  }
  if (!s.is_tiled()) return false;
  if (s.tile_assignment().num_dims() == 0) return true;
  int64_t data_tiles = 1;
  for (int d = 0; d < s.num_data_dims(); ++d) data_tiles *= s.tile_assignment().dim(d);
  return data_tiles == 1 && s.subgroup_types() == std::vector{shardflow::SubgroupType::kUnreduced};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardflow_fuzz::run([&] {
    const shardflow::HloSharding sharding = shardflow::HloSharding::parse(shardflow_fuzz::as_text(data, size));
    const std::string printed = sharding.to_string();
    (void)sharding.num_data_dims();
    if (!shardflow_fuzz::roundtrip()) {
      (void)shardflow::HloSharding::parse(printed);
      return;
    }
    try {
      const shardflow::HloSharding again = shardflow::HloSharding::parse(printed);
      if (has_known_quirk(sharding)) return;
      if (again.to_string() != printed) {
        shardflow_fuzz::invariant_failed("printed sharding prints differently", printed, again.to_string());
      }
      if (!(again == sharding)) shardflow_fuzz::invariant_failed("printed sharding parses to another", printed);
    } catch (const shardflow::Error& e) {
      shardflow_fuzz::invariant_failed("printed sharding does not parse", printed, e.what());
    }
  });
  return 0;
}
