// compile(): trace a function once into a graph, then reuse it.
//
//   auto step = sf::compile([&](sf::Tensor x) {
//     sf::Tensor h = sf::matmul(x, w);                       // w: captured weight
//     h = sf::mark_sharding(h, mesh, {"data", sf::none});   // recorded as the custom op
//     return sf::silu(h);
//   });
//   sf::Tensor y = step(x);          // first call: trace, then run the graph
//   y = step(x2);                    // same types: the cached graph runs
//   std::cout << step.graph_text();
//
// What a trace specialises on, and re-checks (guards) on every call: the
// inputs' dtypes, shapes and shardings; the tensors the function captured
// (the same tensor objects, with the same shardings); and every op the
// function calls with its constant arguments (meshes and specs included).
// The check runs the function on symbolic tensors and matches each op
// against the cached graph without computing anything; a difference makes a
// new trace. Tensors the function computes without its inputs (arange(8) for
// device ids, say) are computed while tracing, so their values are known.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardflow/ir/graph.h"
#include "shardflow/sharding/sharding.h"
#include "shardflow/trace/tensor.h"

namespace shardflow {

class OpProfile;  // trace/profile.h

// What runs a traced graph. Without one, compile() runs graphs on one device
// with the reference kernels; a multi-device runtime installs one that
// propagates shardings, partitions the graph and runs it on its devices.
// (This keeps compile() free of the later pipeline stages.)
// One collective of a prepared program, for reports.
struct ProgramCollective {
  std::string kind;                          // all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute
  std::string description;                   // "all-reduce over 'model' (2 MiB/device): <reason>"
  int64_t bytes_per_device = 0;              // as CollectiveInfo (partition/program.h)
  int64_t group_size = 1;                    // devices in each group it runs in
  std::vector<std::string> axes;             // the mesh axes it runs over (names, or indices on unnamed meshes)
  std::vector<std::vector<int64_t>> groups;  // the device groups it runs in
  std::string value;                         // the graph value it moves ("%5")
  std::string reason;                        // why it is there, with the origin of the sharding
};

class PreparedGraph {
 public:
  virtual ~PreparedGraph() = default;
  // The graph with each value's sharding, and the collectives with their reasons.
  virtual std::string describe(const Graph& graph) const = 0;
  // The collectives one run executes, in program order (none on one device).
  virtual std::vector<ProgramCollective> collectives() const { return {}; }
  // The layout each graph input is fed in: the one it came with, or for an
  // open input the one propagation chose (none when nothing was propagated).
  virtual std::vector<Sharding> input_shardings() const { return {}; }
};

class GraphRunner {
 public:
  virtual ~GraphRunner() = default;
  // Once per cached trace: `input_shardings[i]` is the eager layout of graph
  // input i (explicit inputs, then captured tensors), if any.
  virtual std::shared_ptr<const PreparedGraph> prepare(const Graph& graph,
                                                       std::span<const std::optional<Sharding>> input_shardings) = 0;
  // Every call: one tensor per graph input; returns one per graph output.
  // A handle in `inputs` that is the only one of its tensor (a donated
  // input) lets the run update its buffers in place. With a profile, each
  // device adds its op times to it.
  virtual std::vector<Tensor> run(const PreparedGraph& prepared, std::vector<Tensor> inputs, OpProfile* profile) = 0;

  // Multi-process runtimes (MPI): whether this process holds the data of
  // `device`. Shards of other processes' devices are left undefined in
  // tensors (LocalShard::data), as in jax.Array's addressable shards.
  virtual bool is_addressable(int64_t device) const {
    (void)device;
    return true;
  }
  // Fills the undefined entries of `shards` (one per entry of
  // `layout.shards`, of `dtype`) with the other processes' data.
  // Collective: every process calls it at the same point for the same tensor.
  virtual void fetch_shards(std::vector<DenseTensor>& shards, const ShardLayout& layout, DType dtype);
};

GraphRunner* graph_runner();
// Whether this process holds `device`'s data: always, unless the installed
// runtime spans several processes (Runtime::mpi: only the rank's own device).
bool is_addressable_device(int64_t device);
// The shards of `layout` this process holds (undefined for other processes'
// devices): `make(i)` builds layout.shards[i]'s buffer once per tile, and
// the replicas of a tile share it (kernels never write a buffer another
// holder shares), so replicated data is held once, not once per device.
std::vector<DenseTensor> addressable_tiles(const ShardLayout& layout,
                                           const std::function<DenseTensor(std::size_t)>& make);
// Installs `runner` (nullptr: the one-device interpreter); returns the previous one.
GraphRunner* set_graph_runner(GraphRunner* runner);

struct CompileStats {
  int64_t traces = 0;          // full traces (graphs built)
  int64_t cache_hits = 0;      // calls that reused a cached graph
  int64_t guard_failures = 0;  // calls that no cached graph fit (then traced)
};

// How a call decides that a cached trace fits it.
enum class GuardMode {
  // Re-run the function on symbolic tensors and match every op and constant
  // against the trace: host-side logic that changes the ops is caught.
  kReplay,
  // Only the inputs' dtypes, shapes and shardings, and the captured tensors
  // (the same objects, alive, with the same shardings). For functions whose
  // ops depend on nothing else (jax.jit's contract); it saves re-running the
  // function on every call, which matters for small steps such as decoding
  // one token. A function that branches on other host state would silently
  // reuse a stale graph: use kReplay for those.
  kSignature,
};

// The type-erased core; use compile() below.
class CompiledFunction {
 public:
  using Body = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

  explicit CompiledFunction(Body body, std::string name = "main", GuardMode guards = GuardMode::kReplay);

  // Traces or reuses a graph for these inputs, then runs it.
  std::vector<Tensor> call(const std::vector<Tensor>& inputs);

  // Donates the explicit inputs at these positions to every later call
  // (jax.jit's donate_argnums): when the Tensor passed there is the only
  // handle to its data (moved into the input vector, no other copies or
  // views), the call may reuse its buffer for an output, so a state updated
  // in the step (a KV cache written with index_copy) is not copied. The
  // tensor is then used up: reading it later is an error that names this
  // function. Inputs that are shared are left alone (no donation). A laid
  // out tensor is donated shard by shard: each device updates its own shard
  // in place, unless replicas share that buffer.
  void donate_inputs(std::vector<std::size_t> positions);
  // Traces or reuses a graph without running it (inputs may be shape-only);
  // on a multi-device runtime also propagates and partitions it, so that the
  // next call with such inputs only runs.
  const Graph& trace(const std::vector<Tensor>& inputs);

  // The graph of the most recent call; an error before the first.
  const Graph& graph() const;
  std::string graph_text() const;
  // The graph as the runner prepared it: shardings of every value and the
  // collectives with their reasons (the plain graph on one device).
  std::string program_text() const;
  // The collectives of the most recent call's program.
  std::vector<ProgramCollective> collectives() const;
  void save_graph(const std::filesystem::path& path) const;
  const CompileStats& stats() const;
  // Every later call adds its op times, per device, and its run time to
  // `profile` (trace/profile.h); nullptr stops that.
  void set_profile(std::shared_ptr<OpProfile> profile);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

namespace detail {
inline void append_outputs(std::vector<Tensor>& out, const Tensor& t) { out.push_back(t); }
inline void append_outputs(std::vector<Tensor>& out, const std::vector<Tensor>& ts) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <class... Ts>
void append_outputs(std::vector<Tensor>& out, const std::tuple<Ts...>& ts) {
  std::apply([&](const auto&... t) { (append_outputs(out, t), ...); }, ts);
}
template <class R>
R rebuild_outputs(const std::vector<Tensor>& flat, std::size_t& next) {
  if constexpr (std::is_same_v<R, Tensor>) {
    return flat.at(next++);
  } else if constexpr (std::is_same_v<R, std::vector<Tensor>>) {
    R result(flat.begin() + static_cast<std::ptrdiff_t>(next), flat.end());
    next = flat.size();
    return result;
  } else {
    return std::apply([&](auto... parts) { return R{rebuild_outputs<decltype(parts)>(flat, next)...}; }, R{});
  }
}
}  // namespace detail

// A compiled function with the signature of the traced one: Tensors in; a
// Tensor, std::vector<Tensor> or std::tuple of Tensors out. Copies share one
// cache.
template <class F>
class Compiled {
 public:
  Compiled(F fn, std::string name) : shared_(std::make_shared<Shared>(std::move(fn), std::move(name))) {}

  template <class... Ts>
  auto operator()(const Ts&... inputs) {
    using R = std::invoke_result_t<F&, const Ts&...>;
    const std::vector<Tensor> flat = core<Ts...>().call({inputs...});
    std::size_t next = 0;
    return detail::rebuild_outputs<R>(flat, next);
  }
  // Traces (or checks the cache) without running, e.g. on shape-only inputs.
  template <class... Ts>
  const Graph& trace(const Ts&... inputs) {
    return core<Ts...>().trace({inputs...});
  }

  const Graph& graph() const { return checked_core().graph(); }
  std::string graph_text() const { return checked_core().graph_text(); }
  std::string program_text() const { return checked_core().program_text(); }
  void save_graph(const std::filesystem::path& path) const { checked_core().save_graph(path); }
  CompileStats stats() const { return shared_->core ? shared_->core->stats() : CompileStats{}; }
  // As CompiledFunction::set_profile; may come before the first call.
  void set_profile(std::shared_ptr<OpProfile> profile) {
    shared_->profile = profile;
    if (shared_->core) shared_->core->set_profile(std::move(profile));
  }

 private:
  struct Shared {
    Shared(F f, std::string n) : fn(std::move(f)), name(std::move(n)) {}
    F fn;
    std::string name;
    std::unique_ptr<CompiledFunction> core;
    std::shared_ptr<OpProfile> profile;
  };

  template <class... Ts>
  CompiledFunction& core() {
    if (!shared_->core) {
      shared_->core = std::make_unique<CompiledFunction>(make_body(std::index_sequence_for<Ts...>{}), shared_->name);
      shared_->core->set_profile(shared_->profile);
    }
    return *shared_->core;
  }
  template <std::size_t... I>
  CompiledFunction::Body make_body(std::index_sequence<I...>) {
    Shared* shared = shared_.get();
    return [shared](const std::vector<Tensor>& in) {
      std::vector<Tensor> out;
      detail::append_outputs(out, std::invoke(shared->fn, in.at(I)...));
      return out;
    };
  }
  const CompiledFunction& checked_core() const {
    if (!shared_->core) throw_not_called();
    return *shared_->core;
  }
  [[noreturn]] static void throw_not_called();

  std::shared_ptr<Shared> shared_;
};

[[noreturn]] void throw_compiled_not_called();
template <class F>
void Compiled<F>::throw_not_called() {
  throw_compiled_not_called();
}

template <class F>
Compiled<F> compile(F fn, std::string name = "main") {
  return Compiled<F>(std::move(fn), std::move(name));
}

// The graph of a compiled function's most recent call.
template <class F>
const Graph& compiled_graph(const Compiled<F>& fn) {
  return fn.graph();
}

// Moves a tensor's buffers (its shards when laid out, else its value) into a
// new handle, so that a run fed that handle alone may update them in place
// (a donated KV cache). `tensor` is used up: any later use of it is an error
// naming `to`. An undefined Tensor (nothing taken) when `tensor` has no
// buffers it may give (shape-only, traced, or viewing another library's memory read-only).
Tensor donate(const Tensor& tensor, const std::string& to);

}  // namespace shardflow
