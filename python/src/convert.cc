#include "convert.h"

#include <fmt/format.h>

#include "shardflow/base/error.h"

namespace shardflow::python {

static std::string python_type_name(nb::handle value) { return nb::type_name(value.type()).c_str(); }

static void append_ints(nb::handle values, const char* what, int depth, std::vector<int64_t>& out) {
  if (depth > 64) throw Error(fmt::format("{} nests deeper than 64 levels", what));
  if (PyBool_Check(values.ptr())) {
    throw Error(fmt::format("{} must hold ints, got a bool ({})", what, nb::repr(values).c_str()));
  }
  // NumPy arrays and torch tensors (which also have __index__) by their values.
  if (nb::hasattr(values, "tolist") && !nb::isinstance<nb::int_>(values)) {
    append_ints(values.attr("tolist")(), what, depth + 1, out);
    return;
  }
  if (PyIndex_Check(values.ptr())) {
    int overflow = 0;
    nb::object index = nb::steal(PyNumber_Index(values.ptr()));
    if (!index.is_valid()) throw nb::python_error();
    const long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (overflow != 0) throw Error(fmt::format("{}: {} does not fit in 64 bits", what, nb::repr(values).c_str()));
    out.push_back(value);
    return;
  }
  if (nb::isinstance<nb::str>(values) || !PySequence_Check(values.ptr())) {
    throw Error(fmt::format("{} must be a list, tuple or array of ints, got {} ({})", what, python_type_name(values),
                            nb::repr(values).c_str()));
  }
  for (nb::handle item : values) append_ints(item, what, depth + 1, out);
}

std::vector<int64_t> int_list(nb::handle values, const char* what) {
  std::vector<int64_t> out;
  nb::object flat = nb::borrow(values);
  if (nb::hasattr(values, "tolist") && !nb::isinstance<nb::int_>(values)) flat = values.attr("tolist")();
  if (PyIndex_Check(flat.ptr())) {
    throw Error(fmt::format("{} must be a list, tuple or array of ints, got {} ({})", what, python_type_name(values),
                            nb::repr(values).c_str()));
  }
  append_ints(flat, what, 0, out);
  return out;
}

static PyValue literal_at(nb::handle value, const char* what, int depth) {
  if (depth > 64) throw Error(fmt::format("{} nests deeper than 64 levels", what));
  if (value.is_none()) return PyValue::none();
  if (PyBool_Check(value.ptr())) return PyValue::boolean(value.ptr() == Py_True);
  if (nb::isinstance<nb::str>(value)) return PyValue::string(nb::cast<std::string>(value));
  if (PyFloat_Check(value.ptr())) return PyValue::floating(PyFloat_AsDouble(value.ptr()));
  if (PyIndex_Check(value.ptr())) {
    std::vector<int64_t> one;
    append_ints(value, what, depth, one);
    return PyValue::integer(one.front());
  }
  const bool is_tuple = nb::isinstance<nb::tuple>(value);
  if (is_tuple || nb::isinstance<nb::list>(value)) {
    std::vector<PyValue> items;
    for (nb::handle item : value) items.push_back(literal_at(item, what, depth + 1));
    return is_tuple ? PyValue::tuple(std::move(items)) : PyValue::list(std::move(items));
  }
  throw InvalidShardingError(
      fmt::format("Spec type <class '{}'> is not supported in partition spec", python_type_name(value)));
}

PyValue literal_of(nb::handle value, const char* what) { return literal_at(value, what, 0); }

PartitionSpec partition_spec_of(nb::handle spec) {
  if (nb::isinstance<PartitionSpec>(spec)) return nb::cast<PartitionSpec>(spec);
  if (nb::isinstance<nb::str>(spec)) return PartitionSpec::parse(nb::cast<std::string>(spec));
  return PartitionSpec::from_literal(literal_of(spec, "partition_spec"));
}

nb::dict stats_dict(const CompileStats& stats) {
  nb::dict d;
  d["traces"] = stats.traces;
  d["cache_hits"] = stats.cache_hits;
  d["guard_failures"] = stats.guard_failures;
  return d;
}

}  // namespace shardflow::python
