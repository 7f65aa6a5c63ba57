// Python literals as the annotation op carries them: parse_python_literal
// (and repr() of what parses), PartitionSpec::parse (and its to_string()),
// and Mesh::from_string (the dict literal a Mesh prints as). With
// SHARDFLOW_FUZZ_ROUNDTRIP=1 each printed form must parse back to an equal
// value (literals holding inf or nan excepted: like Python's, their repr()
// is not a literal).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "shardflow/base/python_literal.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/sharding/partition_spec.h"

namespace {

bool all_finite(const shardflow::PyValue& value) {
  switch (value.kind()) {
    case shardflow::PyValue::Kind::kFloat:
      return std::isfinite(value.as_float());
    case shardflow::PyValue::Kind::kTuple:
    case shardflow::PyValue::Kind::kList:
      for (const shardflow::PyValue& item : value.items()) {
        if (!all_finite(item)) return false;
      }
      return true;
    case shardflow::PyValue::Kind::kDict:
      for (const auto& [key, item] : value.entries()) {
        if (!all_finite(key) || !all_finite(item)) return false;
      }
      return true;
    default:
      return true;
  }
}

// Parses `printed` again with `parse`; it must give a value equal to `value`.
template <class T, class Parse>
void check_round_trip(const char* what, const T& value, const std::string& printed, Parse&& parse) {
  if (!shardflow_fuzz::roundtrip()) return;
  try {
    if (!(parse(printed) == value)) shardflow_fuzz::invariant_failed(what, printed, "parses to another value");
  } catch (const shardflow::Error& e) {
    shardflow_fuzz::invariant_failed(what, printed, e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto text = shardflow_fuzz::as_text(data, size);
  shardflow_fuzz::run([&] {
    const shardflow::PyValue value = shardflow::parse_python_literal(text);
    (void)value.type_name();
    const std::string repr = value.repr();
    if (!all_finite(value)) return;
    check_round_trip("repr() of a literal", value, repr,
                     [](const std::string& t) { return shardflow::parse_python_literal(t); });
  });
  shardflow_fuzz::run([&] {
    const shardflow::PartitionSpec spec = shardflow::PartitionSpec::parse(text);
    (void)spec.to_string();
    if (shardflow_fuzz::roundtrip() && !all_finite(shardflow::parse_python_literal(text))) return;
    check_round_trip("PartitionSpec::to_string", spec, spec.to_string(),
                     [](const std::string& t) { return shardflow::PartitionSpec::parse(t); });
  });
  shardflow_fuzz::run([&] {
    const shardflow::Mesh mesh = shardflow::Mesh::from_string(text);
    check_round_trip("Mesh::to_string", mesh, mesh.to_string(),
                     [](const std::string& t) { return shardflow::Mesh::from_string(t); });
  });
  return 0;
}
