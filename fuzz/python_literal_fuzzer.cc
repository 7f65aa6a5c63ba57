// Python literals as the annotation op carries them: parse_python_literal
// (and repr() of what parses), PartitionSpec::parse (and its to_string()),
// and Mesh::from_string (the dict literal a Mesh prints as).
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "shardflow/base/python_literal.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/sharding/partition_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto text = shardflow_fuzz::as_text(data, size);
  shardflow_fuzz::run([&] {
    const shardflow::PyValue value = shardflow::parse_python_literal(text);
    (void)value.repr();
    (void)value.type_name();
  });
  shardflow_fuzz::run([&] {
    const shardflow::PartitionSpec spec = shardflow::PartitionSpec::parse(text);
    (void)spec.to_string();
  });
  shardflow_fuzz::run([&] {
    const shardflow::Mesh mesh = shardflow::Mesh::from_string(text);
    (void)mesh.to_string();
  });
  return 0;
}
