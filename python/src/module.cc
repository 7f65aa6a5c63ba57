// `shardflow._core`: the C++ API in Python. The package `shardflow` re-exports
// it (python/shardflow/__init__.py).
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "shardflow/base/error.h"
#include "shardflow/ops/ops.h"

namespace nb = nanobind;

NB_MODULE(_core, m) {
  m.doc() = "shardflow's C++ core: sharding, graphs, partitioning, runtimes and tensors";
  shardflow::ops::register_all_ops();
  // Objects that other libraries' caches still hold when the interpreter
  // ends (compiled graphs in torch.compile's cache) are not leaks of ours.
  nb::set_leak_warnings(false);

  // shardflow.Error carries the C++ message unchanged. Invalid meshes and
  // partition specs are also ValueError (and AssertionError, which
  // PyTorch/XLA raises for most of them), so code written against either
  // catches them.
  // Raw references, kept for the life of the process (no decref after the
  // interpreter is gone).
  static PyObject* error = PyErr_NewExceptionWithDoc(
      "shardflow.Error", "An error reported by shardflow: what was wrong, where, and what was expected.",
      PyExc_RuntimeError, nullptr);
  static PyObject* invalid_sharding = PyErr_NewExceptionWithDoc(
      "shardflow.InvalidShardingError", "An invalid mesh or partition spec (PyTorch/XLA's message).",
      nb::make_tuple(nb::handle(error), nb::handle(PyExc_ValueError), nb::handle(PyExc_AssertionError)).ptr(), nullptr);
  m.attr("Error") = nb::handle(error);
  m.attr("InvalidShardingError") = nb::handle(invalid_sharding);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const shardflow::InvalidShardingError& e) {
      PyErr_SetString(invalid_sharding, e.what());
    } catch (const shardflow::Error& e) {
      PyErr_SetString(error, e.what());
    }
  });

  shardflow::python::bind_sharding(m);
  shardflow::python::bind_tensor(m);
  shardflow::python::bind_graph(m);
  shardflow::python::bind_llama(m);
}
