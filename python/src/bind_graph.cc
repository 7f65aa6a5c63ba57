// IR graphs, sharding propagation, partitioning, runtimes and runs in Python:
// what `shardflow ir`, `partition` and `run --check` do, as objects.
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <optional>
#include <tuple>

#include "arrays.h"
#include "bindings.h"
#include "convert.h"
#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"
#include "shardflow/partition/program.h"
#include "shardflow/propagation/propagation.h"
#include "shardflow/runtime/check.h"
#include "shardflow/runtime/executor.h"
#include "shardflow/runtime/runtime.h"
#include "shardflow/runtime/spmd_runner.h"
#include "shardflow/tensor/gemm.h"
#include "shardflow/trace/compile.h"
#include "shardflow/trace/interpreter.h"
#include "shardflow/trace/profile.h"
#include "shardflow/trace/tensor.h"

namespace shardflow::python {

using namespace nb::literals;

namespace {

struct PyGraph {
  std::shared_ptr<const Graph> graph;

  const Value& value(std::string name) const {
    if (!name.empty() && name.front() == '%') name.erase(0, 1);
    for (const Value* input : graph->inputs()) {
      if (input->name() == name) return *input;
    }
    for (const auto& node : graph->nodes()) {
      for (const Value* output : node->outputs()) {
        if (output->name() == name) return *output;
      }
    }
    throw Error(fmt::format("graph @{} has no value %{}", graph->name(), name));
  }
};

struct PyPropagation {
  PyGraph graph;
  std::shared_ptr<const PropagationResult> result;
};

struct PyProgram {
  PyPropagation shardings;
  std::shared_ptr<const PartitionedProgram> program;
};

// A runtime held by Python. Runtimes must end in reverse order of creation;
// close() (or the end of a `with` block) ends one at a known point.
struct PyRuntime {
  std::optional<Runtime> runtime;
  inline static std::vector<PyRuntime*> open;  // the innermost last

  explicit PyRuntime(Runtime rt) : runtime(std::move(rt)) { open.push_back(this); }
  PyRuntime(const PyRuntime&) = delete;
  PyRuntime& operator=(const PyRuntime&) = delete;
  ~PyRuntime() {
    if (runtime) close();
  }

  Runtime& get() {
    if (!runtime) throw Error("this runtime was closed");
    return *runtime;
  }
  void close() {
    if (!runtime) return;
    if (open.back() != this) {
      throw Error("runtimes end in reverse order of creation: close the runtime created after this one first");
    }
    open.pop_back();
    nb::gil_scoped_release release;  // device threads may let go of arrays (which takes the GIL)
    runtime.reset();
  }
};

// A graph prepared for the current runtime (propagated and partitioned on
// several devices), run on shardflow Tensors: inputs already laid out as
// shards are used as they are, and outputs stay laid out.
struct PyExecutable {
  PyGraph graph;
  std::shared_ptr<const PreparedGraph> prepared;  // null without a runtime
  GraphRunner* runner = nullptr;                  // null: one device, the interpreter
  std::shared_ptr<const GraphInterpreter> interpreter;

  std::vector<Tensor> call(std::vector<Tensor> inputs, OpProfile* profile = nullptr) const {
    if (graph_runner() != runner) {
      throw Error("the runtime this graph was prepared for has ended; prepare it again for the current one");
    }
    if (inputs.size() != graph.graph->inputs().size()) {
      throw Error(fmt::format("graph @{} takes {} input(s), got {}", graph.graph->name(), graph.graph->inputs().size(),
                              inputs.size()));
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const TensorType& want = graph.graph->inputs()[i]->type();
      if (inputs[i].dtype() != want.dtype || inputs[i].shape() != want.shape) {
        throw Error(fmt::format("input {} (%{}) must be {}{}, got {}{}", i, graph.graph->inputs()[i]->name(),
                                dtype_name(want.dtype), shape_to_string(want.shape), dtype_name(inputs[i].dtype()),
                                shape_to_string(inputs[i].shape())));
      }
    }
    if (runner == nullptr) {  // no runtime: one device, sharded inputs read whole
      std::vector<DenseTensor> values;
      for (const Tensor& input : inputs) values.push_back(input.value());
      inputs.clear();  // a donated buffer is then held by `values` alone
      std::vector<Tensor> outputs;
      for (DenseTensor& value : interpreter->run(std::move(values), profile)) outputs.emplace_back(std::move(value));
      return outputs;
    }
    return runner->run(*prepared, std::move(inputs), profile);
  }

  std::string program_text() const { return prepared ? prepared->describe(*graph.graph) : print_graph(*graph.graph); }
  std::vector<ProgramCollective> collectives() const {
    return prepared ? prepared->collectives() : std::vector<ProgramCollective>{};
  }
  std::vector<Sharding> input_shardings() const {
    return prepared ? prepared->input_shardings() : std::vector<Sharding>{};
  }
};

struct RunResult {
  std::vector<DenseTensor> outputs;
  std::optional<CheckResult> check;
};

}  // namespace

static PyPropagation propagate(const PyGraph& graph) {
  nb::gil_scoped_release release;
  return {graph, std::make_shared<const PropagationResult>(propagate_shardings(*graph.graph))};
}

static PyProgram partition(const PyGraph& graph, std::optional<PyPropagation> shardings) {
  PyPropagation p = shardings ? *shardings : propagate(graph);
  if (p.graph.graph != graph.graph) throw Error("partition: the propagation result is of another graph");
  nb::gil_scoped_release release;
  return {p, std::make_shared<const PartitionedProgram>(partition_graph(*graph.graph, *p.result))};
}

static std::vector<ProgramCollective> collectives_of(const PyProgram& p) {
  std::vector<ProgramCollective> out;
  for (const CollectiveInfo& info : p.program->collectives) out.push_back(report_collective(info, *p.program->mesh));
  return out;
}

static std::vector<float> floats_of(const DenseTensor& value) { return Tensor(value).to_floats(); }

static RunResult run(const PyProgram& p, std::optional<std::vector<InputArray>> arrays, int64_t seed, bool check,
                     PyRuntime* runtime) {
  const Graph& graph = *p.shardings.graph.graph;
  std::vector<DenseTensor> inputs;
  if (arrays) {
    if (arrays->size() != graph.inputs().size()) {
      throw Error(
          fmt::format("graph @{} takes {} input(s), got {}", graph.name(), graph.inputs().size(), arrays->size()));
    }
    for (std::size_t i = 0; i < arrays->size(); ++i) {
      DenseTensor value = borrow_array((*arrays)[i]);
      const TensorType& type = graph.inputs()[i]->type();
      if (value.dtype() != type.dtype || value.shape() != type.shape) {
        throw Error(fmt::format("input {} (%{}) must be {}{}, got {}{}", i, graph.inputs()[i]->name(),
                                dtype_name(type.dtype), shape_to_string(type.shape), dtype_name(value.dtype()),
                                shape_to_string(value.shape())));
      }
      inputs.push_back(std::move(value));
    }
  } else {
    inputs = random_inputs(graph, seed);
  }
  const int64_t devices = p.program->mesh->size();
  if (runtime == nullptr && !PyRuntime::open.empty() && PyRuntime::open.back()->get().num_devices() == devices) {
    runtime = PyRuntime::open.back();
  }
  RunResult result;
  nb::gil_scoped_release release;
  std::optional<Runtime> temporary;
  Runtime& rt = runtime != nullptr ? runtime->get() : temporary.emplace(Runtime::local(devices));
  if (rt.num_devices() != devices) {
    throw Error(fmt::format("the program's mesh has {} device(s) but the runtime has {}", devices, rt.num_devices()));
  }
  std::vector<Tensor> tensors(inputs.begin(), inputs.end());
  std::vector<std::vector<float>> got;
  for (const Tensor& output : run_program(*p.program, rt, std::move(tensors))) {
    result.outputs.push_back(output.value());
    if (check) got.push_back(floats_of(result.outputs.back()));
  }
  if (check) {
    std::vector<std::vector<float>> expected;
    for (const DenseTensor& value : run_graph(graph, inputs)) expected.push_back(floats_of(value));
    result.check = compare_with_reference(graph, got, expected);
    if (!result.check->within()) throw Error(result.check->error_message(graph, devices));
  }
  return result;
}

static nb::list numpy_list(const std::vector<DenseTensor>& values) {
  nb::list out;
  for (const DenseTensor& v : values) out.append(to_numpy(v));
  return out;
}

void bind_graph(nb::module_& m) {
  nb::class_<PyGraph>(m, "Graph", "A graph of the IR (docs/ir.md): a function in SSA form over PyTorch-named ops.")
      .def_static(
          "parse",
          [](const std::string& text) {
            Graph graph = parse_graph(text);
            verify_graph(graph);
            return PyGraph{std::make_shared<const Graph>(std::move(graph))};
          },
          "text"_a, "Parses and verifies IR text; errors name the line and column (or the node).")
      .def("verify", [](const PyGraph& g) { verify_graph(*g.graph); })
      .def_prop_ro("name", [](const PyGraph& g) { return g.graph->name(); })
      .def_prop_ro(
          "text", [](const PyGraph& g) { return print_graph(*g.graph); }, "The canonical text.")
      .def_prop_ro("inputs",
                   [](const PyGraph& g) {
                     std::vector<std::string> names;
                     for (const Value* v : g.graph->inputs()) names.push_back("%" + v->name());
                     return names;
                   })
      .def_prop_ro("outputs",
                   [](const PyGraph& g) {
                     std::vector<std::string> names;
                     for (const Value* v : g.graph->outputs()) names.push_back("%" + v->name());
                     return names;
                   })
      .def_prop_ro("num_nodes", [](const PyGraph& g) { return g.graph->nodes().size(); })
      .def(
          "type_of",
          [](const PyGraph& g, const std::string& value) {
            const TensorType& type = g.value(value).type();
            return std::string(dtype_name(type.dtype)) + shape_to_string(type.shape);
          },
          "value"_a, "'f32[8,512]'")
      .def(
          "random_inputs", [](const PyGraph& g, int64_t seed) { return numpy_list(random_inputs(*g.graph, seed)); },
          "seed"_a = 0, "The deterministic inputs `shardflow run` uses (integers valid as indices).")
      .def(
          "run_one_device",
          [](const PyGraph& g, std::vector<InputArray> arrays) {
            std::vector<DenseTensor> inputs;
            for (const InputArray& a : arrays) inputs.push_back(borrow_array(a));
            std::vector<DenseTensor> outputs;
            {
              nb::gil_scoped_release release;
              outputs = run_graph(*g.graph, inputs);
            }
            return numpy_list(outputs);
          },
          "inputs"_a, "Runs the unsharded graph on one device.")
      .def("__str__", [](const PyGraph& g) { return print_graph(*g.graph); })
      .def("__repr__", [](const PyGraph& g) {
        return fmt::format("Graph(@{}, {} inputs, {} nodes)", g.graph->name(), g.graph->inputs().size(),
                           g.graph->nodes().size());
      });

  nb::class_<PyPropagation>(m, "Propagation", "A sharding for every value of a graph, and where each came from.")
      .def_prop_ro("graph", [](const PyPropagation& p) { return p.graph; })
      .def_prop_ro("mesh", [](const PyPropagation& p) { return python_mesh(p.result->mesh()); })
      .def(
          "sharding",
          [](const PyPropagation& p, const std::string& value) { return p.result->sharding(&p.graph.value(value)); },
          "value"_a, "The sharding of a value ('%3').")
      .def(
          "readable",
          [](const PyPropagation& p, const std::string& value) {
            const Value& v = p.graph.value(value);
            return p.result->sharding(&v).to_readable(v.type().shape, dtype_name(v.type().dtype));
          },
          "value"_a, "'f32[8@data,512]'")
      .def(
          "origin",
          [](const PyPropagation& p, const std::string& value, int dim) {
            return p.result->origin(&p.graph.value(value), dim).describe();
          },
          "value"_a, "dim"_a, "Where the axes of a dim came from ('the annotation at %1 through %2 aten::matmul').")
      .def(
          "is_annotated",
          [](const PyPropagation& p, const std::string& value) {
            return p.result->is_annotated(&p.graph.value(value));
          },
          "value"_a)
      .def_prop_ro(
          "warnings", [](const PyPropagation& p) { return p.result->warnings(); },
          "What propagation could not settle (a stage stopped at its round limit while still changing); the "
          "partitioned program repeats these in its warnings.")
      .def_prop_ro(
          "text", [](const PyPropagation& p) { return print_with_shardings(*p.graph.graph, *p.result); },
          "The graph with every value's sharding (readable and XLA V1).")
      .def("__str__", [](const PyPropagation& p) { return print_with_shardings(*p.graph.graph, *p.result); });

  nb::class_<PyProgram>(m, "Program", "The per-device SPMD program of a graph, with its collectives.")
      .def_prop_ro("graph", [](const PyProgram& p) { return p.shardings.graph; })
      .def_prop_ro("shardings", [](const PyProgram& p) { return p.shardings; })
      .def_prop_ro("mesh", [](const PyProgram& p) { return python_mesh(p.program->mesh); })
      .def_prop_ro("num_devices", [](const PyProgram& p) { return p.program->mesh->size(); })
      .def_prop_ro(
          "text", [](const PyProgram& p) { return p.program->to_string(*p.shardings.graph.graph); },
          "One instruction per line, each collective with its reason.")
      .def_prop_ro("collectives", &collectives_of)
      .def_prop_ro(
          "warnings", [](const PyProgram& p) { return p.program->warnings; },
          "Full re-materialisations, with the op that caused them.")
      .def_prop_ro("input_shardings", [](const PyProgram& p) { return p.program->input_shardings; })
      .def_prop_ro("output_shardings", [](const PyProgram& p) { return p.program->output_shardings; })
      .def("__str__", [](const PyProgram& p) { return p.program->to_string(*p.shardings.graph.graph); });

  m.def("propagate", &propagate, "graph"_a, "Propagates the annotations' shardings to every value.");
  m.def("partition", &partition, "graph"_a, "shardings"_a.none() = nb::none(),
        "Partitions a graph into one per-device program (propagating first unless given the result).");

  m.def(
      "_matrix_kernel_check",
      [] {
        const MatrixKernelCheck check = check_matrix_kernels();
        return std::make_tuple(check.kernel_isa, check.cpu_isa, check.note);
      },
      "(the widest ISA of oneDNN's kernels, the CPU's widest, what is wrong and what to do or '').");
  m.def("get_num_threads", &kernel_threads,
        "The threads one device's kernels (GEMM, decode products, attention) split over: OMP_NUM_THREADS, else "
        "OPENBLAS_NUM_THREADS, else the cores this process may run on; 1 while a runtime of several devices exists "
        "(its device threads are the parallelism). Like torch.get_num_threads.");
  m.def(
      "set_num_threads",
      [](int threads) {
        if (threads < 1) {
          throw nb::value_error(
              fmt::format("set_num_threads: expected a positive number of threads, got {}", threads).c_str());
        }
        set_kernel_threads(threads);
      },
      "threads"_a,
      "Sets the threads one device's kernels split over (results are the same bits for any count). Like "
      "torch.set_num_threads.");
  m.def(
      "_runner_id", [] { return reinterpret_cast<std::uintptr_t>(graph_runner()); },
      "Identifies what runs graphs now (the one-device interpreter or a runtime's devices).");
  nb::class_<OpProfile>(m, "OpProfile",
                        "Where compiled programs spend their time: per device, each op kind's calls and seconds.")
      .def(nb::new_([] { return std::make_shared<OpProfile>(); }))
      .def("devices", &OpProfile::devices)
      .def(
          "entries",
          [](const OpProfile& p, int64_t device) {
            nb::list rows;
            for (const OpProfile::Entry& e : p.entries(device)) rows.append(nb::make_tuple(e.op, e.calls, e.seconds));
            return rows;
          },
          "device"_a = 0, "(op, calls, seconds) rows, the most time first.")
      .def_prop_ro("function_calls", &OpProfile::function_calls)
      .def_prop_ro("function_seconds", &OpProfile::function_seconds)
      .def("clear", &OpProfile::clear);
  nb::class_<PyExecutable>(m, "Executable",
                           "A graph prepared for the current runtime: propagated with the inputs' shardings,\n"
                           "partitioned and ready to run on shardflow Tensors (outputs stay laid out as shards).")
      .def(
          "__init__",
          [](PyExecutable* self, const PyGraph& graph, std::vector<std::optional<Sharding>> input_shardings) {
            GraphRunner* runner = graph_runner();
            std::shared_ptr<const PreparedGraph> prepared;
            std::shared_ptr<const GraphInterpreter> interpreter;
            {
              nb::gil_scoped_release release;
              if (runner != nullptr) {
                prepared = runner->prepare(*graph.graph, input_shardings);
              } else {
                interpreter = std::make_shared<const GraphInterpreter>(*graph.graph);
              }
            }
            new (self) PyExecutable{graph, std::move(prepared), runner, std::move(interpreter)};
          },
          "graph"_a, "input_shardings"_a = std::vector<std::optional<Sharding>>{},
          "input_shardings[i]: the layout input i will come in (None: open, propagation decides).")
      .def(
          "__call__",
          [](const PyExecutable& e, std::vector<Tensor> inputs, std::shared_ptr<OpProfile> profile,
             const std::vector<std::size_t>& donate) {
            for (std::size_t position : donate) {
              if (position >= inputs.size()) {
                throw Error(fmt::format("donate: position {} is past the {} input(s)", position, inputs.size()));
              }
              Tensor taken = shardflow::donate(inputs[position], "graph @" + e.graph.graph->name());
              if (taken.defined()) inputs[position] = std::move(taken);  // the buffers' only holder now
            }
            nb::gil_scoped_release release;
            const auto started = std::chrono::steady_clock::now();
            std::vector<Tensor> outputs = e.call(std::move(inputs), profile.get());
            if (profile) {
              profile->add_function_call(
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
            }
            return outputs;
          },
          "inputs"_a, "profile"_a.none() = nb::none(), "donate"_a = std::vector<std::size_t>{},
          "Runs the program; with a profile, each device adds its op times to it.\n"
          "donate: positions of inputs whose buffers (shards, or value) move into the run (jax's\n"
          "donate_argnums), so the program may update them in place (a KV cache written with index_copy);\n"
          "those Tensors are used up, and any later use of them raises. Tensors viewing another library's\n"
          "memory (from_dlpack) are left alone.")
      .def_prop_ro("graph", [](const PyExecutable& e) { return e.graph; })
      .def_prop_ro("program_text", &PyExecutable::program_text,
                   "Every value's sharding, the per-device program and each collective with its reason.")
      .def_prop_ro("collectives", &PyExecutable::collectives)
      .def_prop_ro("input_shardings", &PyExecutable::input_shardings,
                   "The layout each input is fed in: the one given, or the one propagation chose for an open\n"
                   "input (empty without a runtime: one device runs the graph whole).");

  nb::class_<CheckResult>(m, "CheckResult", "A sharded run compared element by element with one device.")
      .def_ro("max_abs_diff", &CheckResult::max_abs_diff)
      .def_ro("max_rel_diff", &CheckResult::max_rel_diff)
      .def_prop_ro("within_tolerance", &CheckResult::within);
  nb::class_<RunResult>(m, "RunResult")
      .def_prop_ro(
          "outputs", [](const RunResult& r) { return numpy_list(r.outputs); },
          "One NumPy array per graph output (global values).")
      .def_ro("check", &RunResult::check, "The comparison with one device, if asked for.");
  m.def(
      "run",
      [](nb::handle target, std::optional<std::vector<InputArray>> inputs, int64_t seed, bool check,
         PyRuntime* runtime) {
        const PyProgram program = nb::isinstance<PyProgram>(target)
                                      ? nb::cast<PyProgram>(target)
                                      : partition(nb::cast<PyGraph>(target), std::nullopt);
        return run(program, std::move(inputs), seed, check, runtime);
      },
      "program"_a, "inputs"_a.none() = nb::none(), "seed"_a = 0, "check"_a = false, "runtime"_a.none() = nb::none(),
      nb::sig("def run(program: Program | Graph, inputs: typing.Sequence[typing.Any] | None = None, seed: int = 0, "
              "check: bool = False, runtime: Runtime | None = None) -> RunResult"),
      "Runs a partitioned program (or a graph, partitioned first) on the runtime (default: the innermost open "
      "runtime with as many devices, else a temporary local one). Inputs default to random_inputs(seed). "
      "check=True also runs the graph on one device and raises shardflow.Error naming the element furthest "
      "over the tolerance (1e-4 * (1 + max |expected|); 4e-3 through f16, 2e-2 through bf16 values).");

  nb::class_<PyRuntime>(m, "Runtime",
                        "Devices that run one program each: threads in this process (local) or MPI ranks (mpi).\n"
                        "While it is open, compile() partitions for its devices and eager ops on sharded tensors\n"
                        "run SPMD. Use it in a `with` block, or close() it; runtimes end in reverse order.")
      .def_static(
          "local", [](int64_t n) { return new PyRuntime(Runtime::local(n)); }, "num_devices"_a,
          "num_devices in-process devices, one thread each; with at least as many devices as the n CPUs this\n"
          "process may use, device d's thread is pinned to the (d mod n)-th (SHARDFLOW_PIN_DEVICES: auto, 1, 0).")
      .def_static(
          "mpi",
          [](double collective_timeout_s) {
            MpiOptions options;
            options.collective_timeout_s = collective_timeout_s;
            return new PyRuntime(Runtime::mpi(options));
          },
          "collective_timeout_s"_a = 300.0,
          "One device per MPI rank (launch with mpirun); every rank runs the same program.")
      .def_static("started_by_mpi_launcher", &Runtime::started_by_mpi_launcher,
                  "Whether mpirun, mpiexec or srun (PMI or PMIx) started this process (OMPI_COMM_WORLD_SIZE,\n"
                  "PMI_SIZE or PMIX_RANK is set). use_spmd() and the shardflow tool then run one device per rank.")
      .def_prop_ro("num_devices", [](PyRuntime& r) { return r.get().num_devices(); })
      .def_prop_ro("process_index", [](PyRuntime& r) { return r.get().process_index(); })
      .def_prop_ro("process_count", [](PyRuntime& r) { return r.get().process_count(); })
      .def_prop_ro(
          "devices_on_this_host", [](PyRuntime& r) { return r.get().devices_on_this_host(); },
          "The devices sharing this host's cores: all of them in process; under MPI the ranks on this host.")
      .def_prop_ro("closed", [](const PyRuntime& r) { return !r.runtime.has_value(); })
      .def("close", &PyRuntime::close)
      .def(
          "__enter__", [](PyRuntime& r) -> PyRuntime& { return r; }, nb::rv_policy::reference)
      .def(
          "__exit__", [](PyRuntime& r, nb::handle, nb::handle, nb::handle) { r.close(); }, nb::arg().none(),
          nb::arg().none(), nb::arg().none())
      .def("__repr__", [](const PyRuntime& r) {
        if (!r.runtime) return std::string("Runtime(closed)");
        return fmt::format("Runtime({} devices, process {} of {})", r.runtime->num_devices(),
                           r.runtime->process_index(), r.runtime->process_count());
      });
}

}  // namespace shardflow::python
