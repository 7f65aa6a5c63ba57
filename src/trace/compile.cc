// compile(): the guard cache, tracing, replaying and running.
#include "shardflow/trace/compile.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <utility>

#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/ops.h"
#include "shardflow/tensor/device_memory.h"
#include "shardflow/trace/interpreter.h"
#include "shardflow/trace/profile.h"
#include "tensor_impl.h"
#include "trace_context.h"

namespace shardflow {

static std::atomic<GraphRunner*> g_runner{nullptr};

GraphRunner* graph_runner() { return g_runner.load(); }

GraphRunner* set_graph_runner(GraphRunner* runner) { return g_runner.exchange(runner); }

bool is_addressable_device(int64_t device) {
  GraphRunner* runner = graph_runner();
  return runner == nullptr || runner->is_addressable(device);
}

std::vector<DenseTensor> addressable_tiles(const ShardLayout& layout,
                                           const std::function<DenseTensor(std::size_t)>& make) {
  std::map<std::vector<int64_t>, DenseTensor> tiles;
  std::vector<DenseTensor> shards(layout.shards.size());
  for (std::size_t i = 0; i < layout.shards.size(); ++i) {
    if (!is_addressable_device(layout.shards[i].device)) continue;
    auto [tile, fresh] = tiles.try_emplace(layout.shards[i].tile_index);
    if (fresh) tile->second = make(i);
    shards[i] = tile->second;
  }
  return shards;
}

void GraphRunner::fetch_shards(std::vector<DenseTensor>& shards, const ShardLayout& layout, DType dtype) {
  (void)layout;
  (void)dtype;
  for (const DenseTensor& shard : shards) {
    if (!shard.defined()) throw Error("internal: a shard is missing, but this runtime has only one process");
  }
}

void throw_compiled_not_called() { throw Error("the compiled function has not been called yet, so it has no graph"); }

namespace {

// What an input's sharding guard compares: the V1 string ("" when none).
std::string sharding_key(const TensorImpl& impl) {
  return impl.sharding ? impl.sharding->to_hlo_v1().to_string() : std::string();
}

struct CacheEntry {
  TraceRecord record;
  std::vector<TensorType> input_types;
  std::vector<std::string> input_shardings;
  std::vector<std::string> captured_shardings;
  // For GuardMode::kSignature: the captured tensors' shardings when traced.
  std::vector<std::optional<Sharding>> captured_sharding_values;
  // What the runner made of the graph, and which runner.
  std::shared_ptr<const PreparedGraph> prepared;
  GraphRunner* prepared_by = nullptr;
  // Without a runner: the graph ready to interpret, made at its first run.
  std::unique_ptr<GraphInterpreter> interpreter;
};

}  // namespace

struct CompiledFunction::State {
  Body body;
  std::string name;
  GuardMode guards = GuardMode::kReplay;
  std::vector<bool> donated;  // by explicit input position
  bool is_donated(std::size_t position) const { return position < donated.size() && donated[position]; }
  std::vector<std::unique_ptr<CacheEntry>> entries;  // most recently used first
  CacheEntry* last = nullptr;
  CompileStats stats;
  std::shared_ptr<OpProfile> profile;

  static constexpr std::size_t kMaxEntries = 8;

  // Runs the body on symbolic inputs against `record` (replaying or
  // recording); returns the captured tensors.
  std::vector<std::shared_ptr<TensorImpl>> run_body(TraceRecord& record, bool replay,
                                                    const std::vector<TensorType>& types) {
    TraceContext trace(record, replay);
    std::vector<Tensor> symbolic;
    for (std::size_t i = 0; i < types.size(); ++i) symbolic.push_back(trace.make_input(types[i], i));
    const std::vector<Tensor> outputs = body(symbolic);
    trace.finish(outputs);
    return trace.captured();
  }

  // kSignature: the captured tensors are alive and laid out as when traced
  // (those kept by value need nothing).
  static bool signature_fits(const CacheEntry& entry, std::vector<std::shared_ptr<TensorImpl>>& captured) {
    for (std::size_t c = 0; c < entry.record.captured.size(); ++c) {
      const CapturedTensor& kept = entry.record.captured[c];
      std::shared_ptr<TensorImpl> impl = kept.tensor.lock();
      if (!kept.by_value && (!impl || impl->sharding != entry.captured_sharding_values[c])) return false;
      captured.push_back(std::move(impl));
    }
    return true;
  }

  // The cache entry for these inputs (tracing a new one if needed) and the
  // captured tensors of this call.
  std::pair<CacheEntry*, std::vector<std::shared_ptr<TensorImpl>>> lookup(const std::vector<Tensor>& inputs) {
    ops::register_all_ops();
    std::vector<TensorType> types;
    std::vector<std::string> shardings;
    for (const Tensor& input : inputs) {
      if (!input.defined()) throw Error("compile(): an input tensor is undefined");
      types.push_back(input.type());
      shardings.push_back(sharding_key(*input.impl()));
    }
    for (std::size_t e = 0; e < entries.size(); ++e) {
      CacheEntry& entry = *entries[e];
      if (entry.input_types != types || entry.input_shardings != shardings) continue;
      std::vector<std::shared_ptr<TensorImpl>> captured;
      if (guards == GuardMode::kSignature) {
        if (!signature_fits(entry, captured)) continue;
        ++stats.cache_hits;
        std::rotate(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(e),
                    entries.begin() + static_cast<std::ptrdiff_t>(e) + 1);
        last = entries.front().get();
        return {last, std::move(captured)};
      }
      try {
        captured = run_body(entry.record, /*replay=*/true, types);
      } catch (const ReplayMismatch&) {
        continue;
      }
      bool same_shardings = true;
      for (std::size_t c = 0; c < captured.size(); ++c) {
        same_shardings = same_shardings && sharding_key(*captured[c]) == entry.captured_shardings[c];
      }
      if (!same_shardings) continue;
      ++stats.cache_hits;
      std::rotate(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(e),
                  entries.begin() + static_cast<std::ptrdiff_t>(e) + 1);
      last = entries.front().get();
      return {last, std::move(captured)};
    }
    if (!entries.empty()) ++stats.guard_failures;
    auto entry = std::make_unique<CacheEntry>();
    entry->record.graph = Graph(name);
    entry->record.num_explicit_inputs = inputs.size();
    entry->input_types = types;
    entry->input_shardings = shardings;
    std::vector<std::shared_ptr<TensorImpl>> captured = run_body(entry->record, /*replay=*/false, types);
    verify_graph(entry->record.graph);
    for (const auto& tensor : captured) {
      entry->captured_shardings.push_back(sharding_key(*tensor));
      entry->captured_sharding_values.push_back(tensor->sharding);
    }
    ++stats.traces;
    entries.insert(entries.begin(), std::move(entry));
    if (entries.size() > kMaxEntries) entries.pop_back();
    last = entries.front().get();
    return {last, std::move(captured)};
  }
};

CompiledFunction::CompiledFunction(Body body, std::string name, GuardMode guards) : state_(std::make_shared<State>()) {
  state_->body = std::move(body);
  state_->name = std::move(name);
  state_->guards = guards;
}

void CompiledFunction::donate_inputs(std::vector<std::size_t> positions) {
  for (std::size_t position : positions) {
    if (position >= state_->donated.size()) state_->donated.resize(position + 1, false);
    state_->donated[position] = true;
  }
}

namespace {

// The graph's inputs for the runner: the explicit ones, then the captured.
std::vector<Tensor> runner_inputs(const CacheEntry& entry, const std::vector<Tensor>& inputs,
                                  const std::vector<std::shared_ptr<TensorImpl>>& captured) {
  std::vector<Tensor> all_inputs = inputs;
  for (std::size_t c = 0; c < captured.size(); ++c) {
    const CapturedTensor& kept = entry.record.captured[c];
    all_inputs.push_back(kept.by_value ? Tensor(*kept.by_value) : Tensor(captured[c]));
  }
  return all_inputs;
}

void prepare_for(GraphRunner& runner, CacheEntry& entry, std::span<const Tensor> all_inputs) {
  if (entry.prepared_by == &runner) return;
  std::vector<std::optional<Sharding>> shardings;
  for (const Tensor& input : all_inputs) shardings.push_back(input.sharding());
  entry.prepared = runner.prepare(entry.record.graph, shardings);
  entry.prepared_by = &runner;
}

}  // namespace

std::vector<Tensor> CompiledFunction::call(const std::vector<Tensor>& inputs) {
  OpProfile* profile = state_->profile.get();
  using Clock = std::chrono::steady_clock;
  // A call's time includes its guard check, but not tracing or preparing.
  Clock::time_point start = profile ? Clock::now() : Clock::time_point();
  const int64_t traces_before = state_->stats.traces;
  auto [entry, captured] = state_->lookup(inputs);
  bool restart_clock = profile && state_->stats.traces != traces_before;
  const auto add_call = [&] {
    if (profile) profile->add_function_call(std::chrono::duration<double>(Clock::now() - start).count());
  };
  if (GraphRunner* runner = graph_runner()) {
    std::vector<std::shared_ptr<TensorImpl>> taken(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      // Only a handle that is the tensor's last one is donated here.
      if (state_->is_donated(i) && inputs[i].impl().use_count() == 1) {
        taken[i] = donate(inputs[i], state_->name).impl();
      }
    }
    std::vector<Tensor> all_inputs = runner_inputs(*entry, inputs, captured);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (taken[i]) all_inputs[i] = Tensor(std::move(taken[i]));  // the shards' only holder
    }
    restart_clock = restart_clock || (profile && entry->prepared_by != runner);
    prepare_for(*runner, *entry, all_inputs);
    if (restart_clock) start = Clock::now();
    std::vector<Tensor> outputs = runner->run(*entry->prepared, std::move(all_inputs), profile);
    add_call();
    return outputs;
  }
  std::vector<DenseTensor> values;
  const auto value_of = [&](const Tensor& tensor, const Value& input) {
    if (tensor.is_meta()) {
      throw Error(
          fmt::format("compile(): input %{} is shape-only (meta), so the graph cannot run; "
                      "use trace() to trace without running",
                      input.name()));
    }
    return tensor.value();
  };
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::shared_ptr<TensorImpl>& impl = inputs[i].impl();
    if (state_->is_donated(i) && impl.use_count() == 1 && impl->value && !impl->sharding &&
        impl->value->is_sole_owner()) {
      values.push_back(std::move(*impl->value));  // the buffer now belongs to the call
      impl->value.reset();
      impl->donated_to = state_->name;
      continue;
    }
    values.push_back(value_of(inputs[i], *entry->record.graph.inputs()[i]));
  }
  for (std::size_t c = 0; c < captured.size(); ++c) {
    const CapturedTensor& kept = entry->record.captured[c];
    values.push_back(kept.by_value ? *kept.by_value
                                   : value_of(Tensor(captured[c]), *entry->record.graph.inputs()[inputs.size() + c]));
  }
  std::vector<Tensor> outputs;
  if (!entry->interpreter) {  // preparing, like partitioning: not part of the call's time
    entry->interpreter = std::make_unique<GraphInterpreter>(entry->record.graph);
    restart_clock = profile != nullptr;
  }
  if (restart_clock) start = Clock::now();
  const DeviceMemoryScope memory_scope(0);  // the one device
  for (DenseTensor& value : entry->interpreter->run(std::move(values), profile)) outputs.emplace_back(std::move(value));
  add_call();
  return outputs;
}

const Graph& CompiledFunction::trace(const std::vector<Tensor>& inputs) {
  auto [entry, captured] = state_->lookup(inputs);
  if (GraphRunner* runner = graph_runner()) prepare_for(*runner, *entry, runner_inputs(*entry, inputs, captured));
  return entry->record.graph;
}

const Graph& CompiledFunction::graph() const {
  if (state_->last == nullptr) throw_compiled_not_called();
  return state_->last->record.graph;
}

std::string CompiledFunction::graph_text() const { return print_graph(graph()); }

std::string CompiledFunction::program_text() const {
  if (state_->last == nullptr) throw_compiled_not_called();
  if (state_->last->prepared) return state_->last->prepared->describe(state_->last->record.graph);
  return graph_text();
}

std::vector<ProgramCollective> CompiledFunction::collectives() const {
  if (state_->last == nullptr) throw_compiled_not_called();
  return state_->last->prepared ? state_->last->prepared->collectives() : std::vector<ProgramCollective>{};
}

void CompiledFunction::save_graph(const std::filesystem::path& path) const {
  std::ofstream file(path);
  file << graph_text();
  if (!file) throw Error(fmt::format("cannot write the graph to {}", path.string()));
}

const CompileStats& CompiledFunction::stats() const { return state_->stats; }

void CompiledFunction::set_profile(std::shared_ptr<OpProfile> profile) { state_->profile = std::move(profile); }

Tensor donate(const Tensor& tensor, const std::string& to) {
  const std::shared_ptr<TensorImpl>& impl = tensor.impl();
  if (!impl || !impl->is_concrete() || !impl->donated_to.empty()) return Tensor();
  auto taken = std::make_shared<TensorImpl>();
  taken->type = impl->type;
  if (impl->sharding && !impl->shards.empty()) {
    taken->sharding = impl->sharding;
    taken->layout = impl->layout;
    taken->shards = std::exchange(impl->shards, {});
  } else if (impl->value && impl->value->is_writable()) {
    taken->value = std::exchange(impl->value, std::nullopt);
  } else {
    return Tensor();  // nothing of its own to give (another library's memory, read-only)
  }
  impl->donated_to = to;
  return Tensor(std::move(taken));
}

}  // namespace shardflow
