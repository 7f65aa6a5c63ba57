// Python values into the C++ API's argument types, with the errors users
// expect (PyTorch/XLA's messages for partition specs).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardflow/base/python_literal.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/sharding/partition_spec.h"
#include "shardflow/trace/compile.h"

namespace shardflow::python {

namespace nb = nanobind;

// A flat list of ints from a list, tuple, range, NumPy array or torch tensor
// (nested sequences are flattened row-major). `what` names the argument.
std::vector<int64_t> int_list(nb::handle values, const char* what);

// A Python value as the literal tree the C++ side parses from text: None,
// bools, ints, floats, strings, tuples and lists (and objects with
// __index__, such as NumPy ints).
PyValue literal_of(nb::handle value, const char* what);

// A partition spec from a PartitionSpec, a tuple or list of entries, or its
// text ("('data', None)").
PartitionSpec partition_spec_of(nb::handle spec);

// Meshes are immutable; Python holds them as shared_ptr<Mesh> (nanobind
// shares ownership of non-const objects only).
inline std::shared_ptr<Mesh> python_mesh(const std::shared_ptr<const Mesh>& mesh) {
  return std::const_pointer_cast<Mesh>(mesh);
}

// {'traces': ..., 'cache_hits': ..., 'guard_failures': ...}
nb::dict stats_dict(const CompileStats& stats);

}  // namespace shardflow::python
