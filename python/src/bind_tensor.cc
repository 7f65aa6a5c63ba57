// Tensor, its ops, mark_sharding and compile() in Python.
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>

#include "arrays.h"
#include "bindings.h"
#include "convert.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"
#include "shardflow/ir/op_def.h"
#include "shardflow/ops/in_place.h"
#include "shardflow/sharding/shard_layout.h"
#include "shardflow/trace/call.h"
#include "shardflow/trace/compile.h"
#include "shardflow/trace/mark_sharding.h"
#include "shardflow/trace/ops.h"
#include "shardflow/trace/tensor.h"

namespace shardflow::python {

using namespace nb::literals;
using Release = nb::call_guard<nb::gil_scoped_release>;

// A dtype from a shardflow DType, a name ("float32", "f32", "bf16"), a NumPy
// dtype or a torch dtype ("torch.float32").
static DType dtype_of(nb::handle value) {
  if (nb::isinstance<DType>(value)) return nb::cast<DType>(value);
  const std::string name = nb::isinstance<nb::str>(value) ? nb::cast<std::string>(value) : nb::str(value).c_str();
  if (const std::optional<DType> dtype = dtype_from_name(name)) return *dtype;
  throw Error(fmt::format("unknown dtype {}: shardflow has float32, bfloat16, float16, int64, int32 and bool",
                          nb::repr(value).c_str()));
}

static Shape shape_of(nb::handle value) { return Shape(int_list(value, "shape")); }

static std::vector<int64_t> dims_of(nb::handle value) {
  if (value.is_none()) return {};
  if (PyIndex_Check(value.ptr())) return int_list(nb::make_tuple(value), "dim");
  return int_list(value, "dim");
}

// An op argument from Python: tensors, lists of tensors, or constants.
static Arg arg_of(nb::handle value) {
  if (nb::isinstance<Tensor>(value)) return nb::cast<Tensor>(value);
  if (value.is_none()) return Arg(none);
  if (PyBool_Check(value.ptr())) return Arg(value.ptr() == Py_True);
  if (nb::isinstance<DType>(value)) return Arg(nb::cast<DType>(value));
  if (nb::isinstance<nb::str>(value)) return Arg(nb::cast<std::string>(value));
  if (PyFloat_Check(value.ptr())) return Arg(PyFloat_AsDouble(value.ptr()));
  if (PyIndex_Check(value.ptr())) return Arg(int_list(nb::make_tuple(value), "argument").front());
  if (nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value)) {
    std::vector<Tensor> tensors;
    bool all_tensors = nb::len(value) > 0;
    for (nb::handle item : value) {
      if (!nb::isinstance<Tensor>(item)) {
        all_tensors = false;
        break;
      }
      tensors.push_back(nb::cast<Tensor>(item));
    }
    if (all_tensors) return Arg(std::move(tensors));
    bool all_ints = true;
    for (nb::handle item : value) all_ints = all_ints && PyIndex_Check(item.ptr()) && !PyBool_Check(item.ptr());
    if (all_ints) return Arg(int_list(value, "argument"));
    std::vector<double> floats;
    for (nb::handle item : value) {
      if (!PyFloat_Check(item.ptr()) && !PyIndex_Check(item.ptr())) {
        throw Error(
            fmt::format("cannot pass {} to an op: lists hold tensors, ints or floats", nb::repr(value).c_str()));
      }
      floats.push_back(nb::cast<double>(item));
    }
    return Arg(Constant(std::move(floats)));
  }
  if (nb::hasattr(value, "__dlpack__") || PyObject_CheckBuffer(value.ptr())) {
    return Tensor(borrow_array(nb::cast<InputArray>(value)));
  }
  throw Error(
      fmt::format("cannot pass {} ({}) to an op", nb::repr(value).c_str(), nb::type_name(value.type()).c_str()));
}

// The other operand of an arithmetic operator: a Tensor or a Python number.
static Tensor binary(const char* tensor_op, const char* scalar_op_name, const Tensor& a, nb::handle b, bool swap) {
  if (nb::isinstance<Tensor>(b)) {
    const Tensor& other = nb::cast<const Tensor&>(b);
    return swap ? ops::call(tensor_op, {other, a}) : ops::call(tensor_op, {a, other});
  }
  Constant number;
  if (PyBool_Check(b.ptr()))
    number = Constant(b.ptr() == Py_True);
  else if (PyFloat_Check(b.ptr()))
    number = Constant(PyFloat_AsDouble(b.ptr()));
  else if (PyIndex_Check(b.ptr()))
    number = Constant(int_list(nb::make_tuple(b), "operand").front());
  else
    throw nb::type_error("unsupported operand: expected a shardflow.Tensor or a number");
  if (!swap) return scalar_op(scalar_op_name, a, number);
  // number - tensor, number / tensor: the tensor form with a 0-d operand.
  const bool is_float = number.kind() == Constant::Kind::kFloat;
  const Tensor scalar = Tensor::scalar(number.as_number(), is_float ? DType::kF32 : a.dtype());
  return ops::call(tensor_op, {scalar, a});
}

// The tensor's value; gathering a sharded one runs on the devices, without
// the GIL.
static DenseTensor value_of(const Tensor& t) {
  nb::gil_scoped_release release;
  return t.value();
}

// Where each shard of `layout` starts, when every shard can be a view of
// the tensor's memory (contiguous_shard_offsets) and there is memory to view.
static std::optional<std::vector<int64_t>> viewable_shard_offsets(const ShardLayout& layout) {
  const auto& shape = layout.global_shape;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return std::nullopt;
  return contiguous_shard_offsets(layout);
}

struct PyLocalShard {
  LocalShard shard;
};

// compile(fn): a Python function over shardflow Tensors, traced into a graph.
class PyCompiled {
 public:
  PyCompiled(nb::object fn, std::string name, GuardMode guards)
      : fn_(std::make_shared<nb::object>(std::move(fn))),
        structure_(std::make_shared<Structure>()),
        compiled_(make_body(fn_, structure_), std::move(name), guards) {}

  // Garbage-collector support: the function usually refers back to the
  // compiled object (through the globals of its module).
  static int traverse(PyObject* self, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(self));
    if (!nb::inst_ready(self)) return 0;
    const PyCompiled* compiled = nb::inst_ptr<PyCompiled>(self);
    Py_VISIT(compiled->fn_->ptr());
    return 0;
  }
  static int clear(PyObject* self) {
    nb::inst_ptr<PyCompiled>(self)->fn_->reset();
    return 0;
  }

  nb::object call(nb::args args) {
    std::vector<Tensor> inputs = tensors_of(args);
    std::vector<Tensor> outputs;
    {
      nb::gil_scoped_release release;
      outputs = compiled_.call(inputs);
    }
    return rebuild(outputs);
  }

  void trace(nb::args args) {
    std::vector<Tensor> inputs = tensors_of(args);
    nb::gil_scoped_release release;
    compiled_.trace(inputs);
  }

  CompiledFunction& core() { return compiled_; }

 private:
  // How the function returned its tensors: one, or a tuple/list of them.
  struct Structure {
    enum class Kind { kOne, kTuple, kList } kind = Kind::kOne;
  };

  static std::vector<Tensor> tensors_of(const nb::args& args) {
    std::vector<Tensor> inputs;
    for (nb::handle arg : args) {
      if (!nb::isinstance<Tensor>(arg)) {
        throw Error(
            fmt::format("a compiled function takes shardflow Tensors; argument {} is {} (wrap arrays with "
                        "shardflow.from_dlpack or shardflow.tensor)",
                        inputs.size(), nb::type_name(arg.type()).c_str()));
      }
      inputs.push_back(nb::cast<Tensor>(arg));
    }
    return inputs;
  }

  static CompiledFunction::Body make_body(std::shared_ptr<nb::object> fn_holder, std::shared_ptr<Structure> structure) {
    return [fn_holder, structure](const std::vector<Tensor>& inputs) {
      nb::gil_scoped_acquire gil;
      const nb::object& fn = *fn_holder;
      if (!fn.is_valid()) throw Error("this compiled function was cleared by the garbage collector");
      nb::list args;
      for (const Tensor& t : inputs) args.append(nb::cast(t));
      nb::object result = fn(*nb::tuple(args));
      std::vector<Tensor> outputs;
      if (nb::isinstance<Tensor>(result)) {
        structure->kind = Structure::Kind::kOne;
        outputs.push_back(nb::cast<Tensor>(result));
        return outputs;
      }
      if (!nb::isinstance<nb::tuple>(result) && !nb::isinstance<nb::list>(result)) {
        throw Error(
            fmt::format("a compiled function must return a shardflow Tensor or a tuple or list of them, "
                        "got {}",
                        nb::type_name(result.type()).c_str()));
      }
      structure->kind = nb::isinstance<nb::tuple>(result) ? Structure::Kind::kTuple : Structure::Kind::kList;
      for (nb::handle item : result) {
        if (!nb::isinstance<Tensor>(item)) {
          throw Error(fmt::format("a compiled function must return shardflow Tensors; output {} is {}", outputs.size(),
                                  nb::type_name(item.type()).c_str()));
        }
        outputs.push_back(nb::cast<Tensor>(item));
      }
      return outputs;
    };
  }

  nb::object rebuild(const std::vector<Tensor>& outputs) const {
    if (structure_->kind == Structure::Kind::kOne && outputs.size() == 1) return nb::cast(outputs.front());
    nb::list list;
    for (const Tensor& t : outputs) list.append(nb::cast(t));
    if (structure_->kind == Structure::Kind::kList) return list;
    return nb::tuple(list);
  }

  std::shared_ptr<nb::object> fn_;
  std::shared_ptr<Structure> structure_;
  CompiledFunction compiled_;
};

static void bind_tensor_class(nb::module_& m) {
  nb::class_<Tensor> tensor(m, "Tensor",
                            "shardflow's tensor: eager ops run at once (SPMD on sharded tensors while a runtime\n"
                            "exists); inside compile() they are recorded into a graph.");
  tensor
      .def_static(
          "meta", [](nb::handle dtype, nb::handle shape) { return Tensor::meta(dtype_of(dtype), shape_of(shape)); },
          "dtype"_a, "shape"_a, "A shape-only tensor (like PyTorch's meta device).")
      .def_prop_ro("shape", [](const Tensor& t) { return nb::tuple(nb::cast(std::vector<int64_t>(t.shape()))); })
      .def(
          "size",
          [](const Tensor& t, std::optional<int64_t> dim) -> nb::object {
            if (dim) return nb::int_(t.size(*dim));
            return nb::tuple(nb::cast(std::vector<int64_t>(t.shape())));
          },
          "dim"_a.none() = nb::none())
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("ndim", &Tensor::rank)
      .def("dim", &Tensor::rank)
      .def("numel", &Tensor::numel)
      .def_prop_ro("is_meta", &Tensor::is_meta)
      .def_prop_ro("is_traced", &Tensor::is_traced, "True while tracing for values that depend on the inputs.")
      .def(
          "numpy", [](const Tensor& t) { return to_numpy(value_of(t)); },
          "The value as a read-only NumPy array; no copy unless the tensor is sharded (then it is gathered).")
      .def(
          "__array__",
          [](const Tensor& t, nb::handle dtype, nb::handle copy) {
            nb::object array = to_numpy(value_of(t));
            if (!dtype.is_none())
              array = array.attr("astype")(dtype);
            else if (!copy.is_none() && nb::cast<bool>(copy))
              array = array.attr("copy")();
            return array;
          },
          "dtype"_a.none() = nb::none(), "copy"_a.none() = nb::none())
      .def(
          "__dlpack__",
          [](const Tensor& t, nb::kwargs kwargs) { return to_array_api(value_of(t)).attr("__dlpack__")(**kwargs); },
          "The value through DLPack (torch.from_dlpack, np.from_dlpack), without a copy unless sharded.")
      .def("__dlpack_device__", [](const Tensor&) { return nb::make_tuple(1, 0); })
      .def("item", &Tensor::item)
      .def("tolist", [](const Tensor& t) { return to_numpy(value_of(t)).attr("tolist")(); })
      .def_prop_ro("sharding", &Tensor::sharding, "The eager sharding laid out by mark_sharding, or None.")
      .def_prop_ro("sharding_spec", &Tensor::sharding_spec,
                   "The XLA V1 string ('' when not sharded), as torch_xla._XLAC._get_xla_sharding_spec.")
      .def_prop_ro("sharding_type",
                   [](const Tensor& t) -> std::optional<std::string> {
                     const std::optional<Sharding> s = t.sharding();
                     if (!s) return std::nullopt;
                     return std::string(to_string(s->type()));
                   })
      .def_prop_ro(
          "local_shards",
          [](const Tensor& t) {
            std::vector<PyLocalShard> shards;
            for (LocalShard& s : t.local_shards()) shards.push_back({std::move(s)});
            return shards;
          },
          "Each device's shard, by device id: device, replica_id, indices and data.")
      .def("__repr__", &Tensor::to_string)
      .def("__len__", [](const Tensor& t) {
        if (t.rank() == 0) throw nb::type_error("len() of a 0-d tensor");
        return t.size(0);
      });

  // Methods that are ops (the same ops as the module-level functions).
  tensor.def("matmul", &Tensor::matmul, "other"_a, Release())
      .def("reshape",
           [](const Tensor& t, nb::args shape) {
             return t.reshape(shape_of(nb::len(shape) == 1 && !PyIndex_Check(shape[0].ptr()) ? shape[0] : shape));
           })
      .def("view",
           [](const Tensor& t, nb::args shape) {
             return t.view(shape_of(nb::len(shape) == 1 && !PyIndex_Check(shape[0].ptr()) ? shape[0] : shape));
           })
      .def("transpose", &Tensor::transpose, "dim0"_a, "dim1"_a, Release())
      .def("permute", [](const Tensor& t, nb::args dims) { return t.permute(int_list(dims, "dims")); })
      .def("unsqueeze", &Tensor::unsqueeze, "dim"_a, Release())
      .def("squeeze", &Tensor::squeeze, "dim"_a, Release())
      .def("flatten", &Tensor::flatten, "start_dim"_a = 0, "end_dim"_a = -1, Release())
      .def("expand",
           [](const Tensor& t, nb::args size) {
             return t.expand(shape_of(nb::len(size) == 1 && !PyIndex_Check(size[0].ptr()) ? size[0] : size));
           })
      .def("select", &Tensor::select, "dim"_a, "index"_a, Release())
      .def(
          "sum", [](const Tensor& t, nb::handle dim, bool keepdim) { return t.sum(dims_of(dim), keepdim); },
          "dim"_a.none() = nb::none(), "keepdim"_a = false)
      .def(
          "mean", [](const Tensor& t, nb::handle dim, bool keepdim) { return t.mean(dims_of(dim), keepdim); },
          "dim"_a.none() = nb::none(), "keepdim"_a = false)
      .def(
          "amax", [](const Tensor& t, nb::handle dim, bool keepdim) { return t.amax(dims_of(dim), keepdim); },
          "dim"_a.none() = nb::none(), "keepdim"_a = false)
      .def("argmax", &Tensor::argmax, "dim"_a.none() = nb::none(), "keepdim"_a = false, Release())
      .def("softmax", &Tensor::softmax, "dim"_a, Release())
      .def(
          "to", [](const Tensor& t, nb::handle dtype) { return t.to(dtype_of(dtype)); }, "dtype"_a)
      .def(
          "pow", [](const Tensor& t, double exponent) { return t.pow(exponent); }, "exponent"_a)
      .def("__matmul__", &Tensor::matmul, Release())
      .def(
          "__neg__", [](const Tensor& t) { return -t; }, Release())
      .def("__add__",
           [](const Tensor& a, nb::handle b) { return binary("aten::add.Tensor", "aten::add.Scalar", a, b, false); })
      .def("__radd__",
           [](const Tensor& a, nb::handle b) { return binary("aten::add.Tensor", "aten::add.Scalar", a, b, false); })
      .def("__sub__",
           [](const Tensor& a, nb::handle b) { return binary("aten::sub.Tensor", "aten::sub.Scalar", a, b, false); })
      .def("__rsub__",
           [](const Tensor& a, nb::handle b) { return binary("aten::sub.Tensor", "aten::sub.Scalar", a, b, true); })
      .def("__mul__",
           [](const Tensor& a, nb::handle b) { return binary("aten::mul.Tensor", "aten::mul.Scalar", a, b, false); })
      .def("__rmul__",
           [](const Tensor& a, nb::handle b) { return binary("aten::mul.Tensor", "aten::mul.Scalar", a, b, false); })
      .def("__truediv__",
           [](const Tensor& a, nb::handle b) { return binary("aten::div.Tensor", "aten::div.Scalar", a, b, false); })
      .def("__rtruediv__",
           [](const Tensor& a, nb::handle b) { return binary("aten::div.Tensor", "aten::div.Scalar", a, b, true); });

  nb::class_<PyLocalShard>(m, "LocalShard", "One device's piece of an eagerly sharded tensor.")
      .def_prop_ro("device", [](const PyLocalShard& s) { return s.shard.device; })
      .def_prop_ro("replica_id", [](const PyLocalShard& s) { return s.shard.replica_id; })
      .def_prop_ro(
          "indices",
          [](const PyLocalShard& s) -> nb::object {
            if (s.shard.whole) return nb::ellipsis();
            nb::list indices;
            for (const DimSlice& d : s.shard.slices)
              indices.append(nb::slice(nb::int_(d.start), nb::int_(d.stop), nb::none()));
            return nb::tuple(indices);
          },
          "Python slices into the global tensor (Ellipsis when the device holds all of it).")
      .def_prop_ro(
          "data",
          [](const PyLocalShard& s) -> nb::object {
            if (!s.shard.data.defined() && s.shard.data.numel() > 0) return nb::none();
            return to_numpy(s.shard.data);
          },
          "The padded shard as a read-only NumPy array viewing the device's buffer (None for devices of "
          "other processes).")
      .def("__repr__", [](const PyLocalShard& s) {
        return fmt::format("LocalShard(device={}, replica_id={}, shape={})", s.shard.device, s.shard.replica_id,
                           shape_to_string(s.shard.data.shape()));
      });
}

static void bind_ops(nb::module_& m) {
  const auto unary = [&](const char* name, Tensor (*fn)(const Tensor&)) { m.def(name, fn, "input"_a, Release()); };
  unary("neg", &neg);
  unary("abs", &abs);
  unary("exp", &exp);
  unary("log", &log);
  unary("sqrt", &sqrt);
  unary("rsqrt", &rsqrt);
  unary("sin", &sin);
  unary("cos", &cos);
  unary("tanh", &tanh);
  unary("sigmoid", &sigmoid);
  unary("relu", &relu);
  unary("silu", &silu);
  m.def(
      "gelu", [](const Tensor& x, const std::string& approximate) { return gelu(x, approximate.c_str()); }, "input"_a,
      "approximate"_a = "none", Release());
  const auto binary_fn = [&](const char* name, Tensor (*fn)(const Tensor&, const Tensor&)) {
    m.def(name, fn, "input"_a, "other"_a, Release());
  };
  binary_fn("mul", &mul);
  binary_fn("div", &div);
  binary_fn("maximum", &maximum);
  binary_fn("minimum", &minimum);
  binary_fn("eq", &eq);
  binary_fn("ne", &ne);
  binary_fn("lt", &lt);
  binary_fn("le", &le);
  binary_fn("gt", &gt);
  binary_fn("ge", &ge);
  binary_fn("matmul", &matmul);
  m.def("add", &add, "input"_a, "other"_a, "alpha"_a = 1.0, Release());
  m.def("sub", &sub, "input"_a, "other"_a, "alpha"_a = 1.0, Release());
  m.def("pow", nb::overload_cast<const Tensor&, const Tensor&>(&pow), "input"_a, "exponent"_a, Release());
  m.def("pow", nb::overload_cast<const Tensor&, double>(&pow), "input"_a, "exponent"_a, Release());
  m.def("where", &where, "condition"_a, "input"_a, "other"_a, Release());
  const auto reduction = [&](const char* name, Tensor (*fn)(const Tensor&, std::vector<int64_t>, bool)) {
    m.def(
        name, [fn](const Tensor& x, nb::handle dim, bool keepdim) { return fn(x, dims_of(dim), keepdim); }, "input"_a,
        "dim"_a.none() = nb::none(), "keepdim"_a = false);
  };
  reduction("sum", &sum);
  reduction("mean", &mean);
  reduction("amax", &amax);
  reduction("amin", &amin);
  m.def("argmax", &argmax, "input"_a, "dim"_a.none() = nb::none(), "keepdim"_a = false, Release());
  m.def("softmax", &softmax, "input"_a, "dim"_a, Release());
  m.def("log_softmax", &log_softmax, "input"_a, "dim"_a, Release());
  m.def(
      "rms_norm",
      [](const Tensor& x, nb::handle normalized_shape, std::optional<Tensor> weight, std::optional<double> eps) {
        return rms_norm(x, shape_of(normalized_shape), std::move(weight), eps);
      },
      "input"_a, "normalized_shape"_a, "weight"_a.none() = nb::none(), "eps"_a.none() = nb::none());
  m.def("linear", &linear, "input"_a, "weight"_a, "bias"_a.none() = nb::none(), Release());
  m.def("scaled_dot_product_attention", &scaled_dot_product_attention, "query"_a, "key"_a, "value"_a,
        "attn_mask"_a.none() = nb::none(), "is_causal"_a = false, "scale"_a.none() = nb::none(), Release());
  m.def(
      "reshape", [](const Tensor& x, nb::handle shape) { return reshape(x, shape_of(shape)); }, "input"_a, "shape"_a);
  m.def(
      "permute", [](const Tensor& x, nb::handle dims) { return permute(x, int_list(dims, "dims")); }, "input"_a,
      "dims"_a);
  m.def("transpose", &transpose, "input"_a, "dim0"_a, "dim1"_a, Release());
  m.def("unsqueeze", &unsqueeze, "input"_a, "dim"_a, Release());
  m.def("squeeze", &squeeze, "input"_a, "dim"_a, Release());
  m.def(
      "expand", [](const Tensor& x, nb::handle size) { return expand(x, shape_of(size)); }, "input"_a, "size"_a);
  m.def("slice", &slice, "input"_a, "dim"_a, "start"_a.none() = nb::none(), "end"_a.none() = nb::none(), "step"_a = 1,
        Release());
  m.def("select", &select, "input"_a, "dim"_a, "index"_a, Release());
  m.def("cat", &cat, "tensors"_a, "dim"_a = 0, Release());
  m.def("stack", &stack, "tensors"_a, "dim"_a = 0, Release());
  m.def("flatten", &flatten, "input"_a, "start_dim"_a = 0, "end_dim"_a = -1, Release());
  m.def("embedding", &embedding, "weight"_a, "indices"_a, Release());
  m.def("index_select", &index_select, "input"_a, "dim"_a, "index"_a, Release());
  m.def("index_copy", &index_copy, "input"_a, "dim"_a, "index"_a, "source"_a, Release());
  m.def("gather", &gather, "input"_a, "dim"_a, "index"_a, Release());
  m.def("triu", &triu, "input"_a, "diagonal"_a = 0, Release());
  m.def("tril", &tril, "input"_a, "diagonal"_a = 0, Release());
  m.def(
      "arange",
      [](nb::handle start, nb::handle end, nb::handle step, nb::handle dtype) {
        // PyTorch's rule: integers only give int64, any float gives float32.
        const auto is_int = [](nb::handle v) {
          return v.is_none() || (PyIndex_Check(v.ptr()) && !PyFloat_Check(v.ptr()));
        };
        std::optional<DType> d;
        if (!dtype.is_none())
          d = dtype_of(dtype);
        else if (is_int(start) && is_int(end) && is_int(step))
          d = DType::kI64;
        const auto number = [](nb::handle v, double fallback) { return v.is_none() ? fallback : nb::cast<double>(v); };
        if (end.is_none()) return arange(0, number(start, 0), number(step, 1), d);
        return arange(number(start, 0), number(end, 0), number(step, 1), d);
      },
      "start"_a, "end"_a.none() = nb::none(), "step"_a.none() = nb::none(), "dtype"_a.none() = nb::none(),
      nb::sig("def arange(start: float, end: float | None = None, step: float | None = None, dtype: typing.Any = None) "
              "-> Tensor"),
      "arange(end) or arange(start, end, step), with PyTorch's dtype rules.");
  m.def(
      "full",
      [](nb::handle size, double value, nb::handle dtype) { return full(shape_of(size), value, dtype_of(dtype)); },
      "size"_a, "fill_value"_a, "dtype"_a = "float32");
  m.def(
      "zeros", [](nb::handle size, nb::handle dtype) { return zeros(shape_of(size), dtype_of(dtype)); }, "size"_a,
      "dtype"_a = "float32");
  m.def(
      "ones", [](nb::handle size, nb::handle dtype) { return ones(shape_of(size), dtype_of(dtype)); }, "size"_a,
      "dtype"_a = "float32");
  m.def(
      "randn",
      [](nb::handle size, int64_t seed, nb::handle dtype) { return randn(shape_of(size), seed, dtype_of(dtype)); },
      "size"_a, "seed"_a, "dtype"_a = "float32", "Deterministic per (seed, element).");
  m.def(
      "rand",
      [](nb::handle size, int64_t seed, nb::handle dtype) { return rand(shape_of(size), seed, dtype_of(dtype)); },
      "size"_a, "seed"_a, "dtype"_a = "float32", "Deterministic per (seed, element).");
  m.def(
      "op_schemas",
      [] {
        nb::dict schemas;
        for (const OpDef* op : op_registry().all()) {
          schemas[nb::str(op->schema.full_name().c_str())] = op->schema.to_string();
        }
        return schemas;
      },
      "Every registered op: full name ('aten::add.Tensor') -> its PyTorch schema.");
  m.def(
      "call",
      [](const std::string& name, nb::args args, nb::kwargs kwargs) {
        std::vector<Arg> boxed;
        for (nb::handle a : args) boxed.push_back(arg_of(a));
        for (auto [key, value] : kwargs) boxed.push_back(kwarg(nb::cast<std::string>(key), arg_of(value)));
        std::vector<Tensor> results;
        {
          nb::gil_scoped_release release;
          results = ops::call_multi(name, std::move(boxed));
        }
        if (results.size() == 1) return nb::cast(results.front());
        return nb::object(nb::tuple(nb::cast(results)));
      },
      "name"_a, "args"_a, "kwargs"_a,
      "Calls any registered op by name ('aten::add', 'aten::sum.dim_IntList', ...), checked against its schema "
      "like PyTorch.");
}

void bind_tensor(nb::module_& m) {
  nb::enum_<DType>(m, "DType", "Element types.")
      .value("float32", DType::kF32)
      .value("bfloat16", DType::kBF16)
      .value("float16", DType::kF16)
      .value("int64", DType::kI64)
      .value("int32", DType::kI32)
      .value("bool", DType::kBool)
      .def_prop_ro("itemsize", [](DType d) { return element_size(d); })
      .def_prop_ro("is_floating_point", [](DType d) { return is_floating(d); })
      .def("__str__", [](nb::handle d) { return "shardflow." + std::string(nb::str(d.attr("name")).c_str()); });

  bind_tensor_class(m);
  bind_ops(m);

  m.def(
      "from_dlpack", [](const InputArray& array) { return Tensor(borrow_array(array)); }, "array"_a,
      "A tensor viewing the memory of a NumPy array, torch CPU tensor or any DLPack / buffer-protocol array, "
      "without a copy (arrays that are not row-major are copied once).");
  m.def(
      "_from_dlpack_writable",
      [](const InputArray& array) { return Tensor(borrow_array(array, DenseTensor::Access::kWritable)); }, "array"_a,
      "from_dlpack, but a program this tensor is donated to may write its results into the memory it views (the "
      "torch bridge's in-place update of a KV cache on one device).");
  m.def(
      "_shards_are_runs",
      [](const Sharding& sharding, const std::vector<int64_t>& shape) {
        return viewable_shard_offsets(shard_layout(sharding, shape)).has_value();
      },
      "sharding"_a, "shape"_a,
      "Whether each device's shard of a row-major tensor of `shape` (not empty) is one run of its elements, "
      "unpadded and held by that device alone (contiguous_shard_offsets): then it can view the tensor's memory.");
  m.def(
      "_writable_shards",
      [](const InputArray& array, const Sharding& sharding) {
        const DenseTensor whole = borrow_array(array, DenseTensor::Access::kWritable);
        const ShardLayout layout = shard_layout(sharding, whole.shape());
        const std::optional<std::vector<int64_t>> offsets = viewable_shard_offsets(layout);
        if (!offsets) {
          throw Error("_writable_shards: the shards of " + sharding.to_readable() + " over a tensor of shape " +
                      python_int_tuple(whole.shape()) + " are not each one run of its memory");
        }
        const std::size_t element = element_size(whole.dtype());
        std::vector<DenseTensor> shards;
        for (int64_t offset : *offsets) {
          // A holder per shard (a kernel writes in place only into a buffer
          // nothing else holds), each keeping the array alive.
          std::shared_ptr<std::byte> first(const_cast<std::byte*>(whole.data()) + offset * element,
                                           [whole](std::byte*) {});
          shards.push_back(
              DenseTensor::borrow(whole.dtype(), layout.shard_shape, std::move(first), DenseTensor::Access::kWritable));
        }
        return Tensor::from_shards(whole.dtype(), whole.shape(), sharding, std::move(shards));
      },
      "array"_a, "sharding"_a,
      "The array laid out with `sharding`, each device's shard a writable view of its run of the array's memory "
      "(see _shards_are_runs): a program this tensor is donated to writes its results there (the torch bridge's "
      "in-place update of a KV cache split across devices).");
  m.def(
      "_lies_in",
      [](const Tensor& t, uintptr_t address) { return t.lies_in(reinterpret_cast<const std::byte*>(address)); }, "t"_a,
      "address"_a,
      "Whether t's values lie in the row-major memory starting at `address`: t held whole there, or each "
      "device's shard at its run of it (as _writable_shards lays them).");
  m.def(
      "_collapse_into_huge_pages",
      [](const Tensor& t) {
        if (t.is_meta() || t.is_traced() || t.sharding()) return false;
        const DenseTensor value = t.value();
        nb::gil_scoped_release release;  // the kernel copies every page it collapses
        return value.collapse_into_huge_pages();
      },
      "t"_a,
      "Moves the memory of a tensor held whole in one buffer (from_dlpack of a torch tensor) onto 2 MiB pages, "
      "in place; whether the kernel did (see DenseTensor::collapse_into_huge_pages).");
  m.def(
      "_put_rows_into",
      [](const std::vector<std::tuple<Tensor, int64_t, Tensor, Tensor>>& writes) {
        nb::gil_scoped_release release;  // sharded operands are gathered on the devices
        for (const auto& [target, dim, index, source] : writes) {
          DenseTensor memory = target.sharding() ? DenseTensor() : target.value();
          if (!memory.is_borrowed()) {
            throw Error("_put_rows_into writes only into memory viewed with from_dlpack (another library's), got " +
                        target.to_string());
          }
          ops::put_rows_into(memory, dim, index.value(), source.value());
        }
      },
      "writes"_a,
      "For each (target, dim, index, source), in order: target[..., index, ...] = source along dim, written into "
      "the memory target views (from_dlpack of a torch tensor). How the torch bridge brings a tensor a compiled "
      "graph wrote in place up to date.");
  m.def(
      "mark_sharding",
      [](const Tensor& t, const Mesh& mesh, nb::handle spec) {
        const PartitionSpec partition_spec = partition_spec_of(spec);
        nb::gil_scoped_release release;
        return mark_sharding(t, mesh, partition_spec);
      },
      "t"_a, "mesh"_a, "partition_spec"_a,
      nb::sig("def mark_sharding(t: Tensor, mesh: Mesh, partition_spec: PartitionSpec | tuple | list | str) -> Tensor"),
      "Eagerly: lays the tensor out as device shards. Inside compile(): records xla::dynamo_mark_sharding. "
      "Returns the tensor.");
  m.def("clear_sharding", &clear_sharding, "t"_a, Release(), "Gathers an eagerly sharded tensor back into one value.");

  nb::enum_<GuardMode>(m, "GuardMode", "How a call decides that a cached trace fits it.")
      .value("replay", GuardMode::kReplay, "re-run the function symbolically and match every op")
      .value("signature", GuardMode::kSignature, "only input types, shardings and captured tensors");
  nb::class_<ProgramCollective>(m, "Collective", "One collective of a partitioned program, and why it is there.")
      .def_ro("kind", &ProgramCollective::kind,
              "all-reduce, all-gather, reduce-scatter, all-to-all or collective-permute")
      .def_ro("axes", &ProgramCollective::axes, "The mesh axes it runs over.")
      .def_ro("groups", &ProgramCollective::groups, "The device groups it runs in.")
      .def_ro("group_size", &ProgramCollective::group_size)
      .def_ro("bytes_per_device", &ProgramCollective::bytes_per_device,
              "The larger local buffer: what a reduction takes in, what an all-gather puts out.")
      .def_ro("value", &ProgramCollective::value, "The graph value it moves ('%5').")
      .def_ro("reason", &ProgramCollective::reason)
      .def_ro("description", &ProgramCollective::description)
      .def("__str__", [](const ProgramCollective& c) { return c.description; })
      .def("__repr__", [](const ProgramCollective& c) {
        return fmt::format("Collective({}, axes={}, bytes_per_device={}, value={})", c.kind,
                           nb::repr(nb::cast(c.axes)).c_str(), c.bytes_per_device, c.value);
      });
  static PyType_Slot compiled_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(&PyCompiled::traverse)},
                                         {Py_tp_clear, reinterpret_cast<void*>(&PyCompiled::clear)},
                                         {0, nullptr}};
  nb::class_<PyCompiled>(m, "CompiledFunction", "A function traced once into a graph and reused while its guards hold.",
                         nb::type_slots(compiled_slots))
      .def("__call__", &PyCompiled::call)
      .def("trace", &PyCompiled::trace,
           "Traces (and partitions) for these inputs without running; "
           "Tensor.meta inputs work.")
      .def_prop_ro(
          "graph_text", [](PyCompiled& f) { return f.core().graph_text(); }, "The traced IR.")
      .def_prop_ro(
          "program_text", [](PyCompiled& f) { return f.core().program_text(); },
          "Every value's sharding, the per-device program and each collective with its reason.")
      .def_prop_ro("collectives", [](PyCompiled& f) { return f.core().collectives(); })
      .def_prop_ro("stats", [](PyCompiled& f) { return stats_dict(f.core().stats()); })
      .def(
          "save_graph", [](PyCompiled& f, const std::string& path) { f.core().save_graph(path); }, "path"_a)
      .def(
          "donate_inputs",
          [](PyCompiled& f, std::vector<std::size_t> positions) { f.core().donate_inputs(std::move(positions)); },
          "positions"_a);
  m.def(
      "compile",
      [](nb::object fn, std::optional<std::string> name, GuardMode guards) {
        std::string fn_name = name ? *name : nb::cast<std::string>(nb::getattr(fn, "__name__", nb::str("main")));
        return new PyCompiled(std::move(fn), std::move(fn_name), guards);
      },
      "fn"_a, "name"_a.none() = nb::none(), "guards"_a = GuardMode::kReplay,
      "Traces fn (shardflow Tensors in; a Tensor, tuple or list out) on its first call; later calls reuse the "
      "graph while the guards hold.");
}

}  // namespace shardflow::python
