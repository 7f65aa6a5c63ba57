// `shardflow llama`: generation with the LLaMA model on in-process devices.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "cli_util.h"
#include "commands.h"
#include "profile_report.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"
#include "shardflow/models/checkpoint.h"
#include "shardflow/models/llama.h"
#include "shardflow/models/tokenizer.h"
#include "shardflow/runtime/runtime.h"
#include "shardflow/sharding/mesh.h"

namespace shardflow::cli {

namespace {

using llama::Config;

// --check: logits of every step within this times (1 + the step's largest
// |logit|) of the one-device run.
constexpr double kLogitTolerance = 1e-3;

struct RunOutcome {
  llama::Generation generation;
  double compile_ms = 0;
  CompileStats prefill, decode;
  std::vector<ProgramCollective> decode_collectives;
  std::string plan_text;
  std::shared_ptr<OpProfile> prefill_profile, decode_profile;  // --profile
};

struct Setup {
  Config config;
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> axis_names;
  int64_t devices = 1;
  int64_t batch = 1;
  int64_t data_parallel = 1;    // the size of the 'data' axis: weights are replicated over it
  int64_t cache_positions = 0;  // the KV cache's positions (at most config.seq_len)
  std::vector<int64_t> prompt;
  std::optional<llama::Tokenizer> tokenizer;
};

// --tokenizer, or else a Hugging Face checkpoint's own tokenizer.json. That
// one is optional: when it is of a kind shardflow does not read, ids are
// printed instead, unless the prompt is text.
std::optional<llama::Tokenizer> load_tokenizer(const LlamaOptions& o, const Config& config) {
  if (o.tokenizer) return llama::Tokenizer::load_any(*o.tokenizer, config.vocab_size);
  if (!o.weights || !std::filesystem::is_directory(*o.weights)) return std::nullopt;
  const std::filesystem::path own = std::filesystem::path(*o.weights) / "tokenizer.json";
  if (!std::filesystem::exists(own)) return std::nullopt;
  try {
    return llama::Tokenizer::load_hf(own, config.vocab_size);
  } catch (const Error& e) {
    if (o.prompt) throw Error(fmt::format("{}; give the prompt as --prompt-ids instead", e.what()));
    if (mpi_runtime() == nullptr || mpi_runtime()->process_index() == 0) {
      std::cerr << fmt::format("note: prompts and outputs are token ids: {}\n", e.what());
    }
    return std::nullopt;
  }
}

// The cache holds the positions the run writes (prompt + steps - 1), not
// the checkpoint's whole context: a 2^20-position checkpoint does not make a
// 2^20-position cache (and mask) for a 2-token prompt. --seq-len sets it.
void size_cache(const LlamaOptions& o, Setup& s) {
  const int64_t context = s.config.seq_len;
  s.cache_positions = context;
  if (o.seq_len) {
    if (*o.seq_len < 1 || *o.seq_len > context) {
      throw UsageError(
          fmt::format("--seq-len {} is outside 1..{}, the model's context (its seq_len)", *o.seq_len, context));
    }
    s.cache_positions = *o.seq_len;
    return;
  }
  const auto prompt = static_cast<int64_t>(s.prompt.size());
  if (o.steps >= 1 && o.steps <= context && prompt <= context)
    s.cache_positions = std::min(context, prompt + o.steps - 1);
}

// Everything the run holds, from the config and the request, against the
// memory it may use, before any of it is allocated.
void check_run_memory(const LlamaOptions& o, const Setup& s) {
  uint64_t budget = available_memory_bytes();
  std::string budget_what = fmt::format("the {} this machine has available", llama::format_bytes(budget));
  if (o.max_memory) {
    budget = parse_byte_size("--max-memory", *o.max_memory);
    budget_what = fmt::format("--max-memory {}", llama::format_bytes(budget));
  }
  llama::Config cached = s.config;
  cached.seq_len = s.cache_positions;
  std::vector<llama::MemoryNeed> needs =
      llama::memory_needs(cached, s.batch, static_cast<int64_t>(s.prompt.size()), s.data_parallel);
  if (mpi_runtime() != nullptr) {  // each process holds its devices' share
    for (llama::MemoryNeed& need : needs) {
      need.bytes /= static_cast<uint64_t>(s.devices);
      need.formula += fmt::format(", / {} processes", s.devices);
    }
  }
  llama::check_memory(needs, budget, budget_what,
                      "pass a smaller --seq-len, --batch or prompt, a smaller model, or more devices over MPI");
}

Setup make_setup(const LlamaOptions& o) {
  Setup s;
  if (o.weights && o.config) throw UsageError("--weights and --config exclude each other");
  if (o.weights) {
    s.config = std::filesystem::is_directory(*o.weights) ? llama::read_hf_config(*o.weights)
                                                         : llama::read_llama2c_config(*o.weights);
  } else {
    s.config = Config::named(o.config.value_or("stories15M"));
  }
  s.axis_names = parse_name_list("--axis-names", o.axis_names);
  // Checked on one device too, where no plan would notice.
  for (std::size_t a = 0; a < s.axis_names.size(); ++a) {
    const std::string& name = s.axis_names[a];
    if (name != "data" && name != "fsdp" && name != "model") {
      throw UsageError(fmt::format("--axis-names: {} is not an axis of the plan, which uses data, fsdp and model",
                                   quote_for_message(name, 40)));
    }
    if (std::find(s.axis_names.begin(), s.axis_names.begin() + static_cast<std::ptrdiff_t>(a), name) !=
        s.axis_names.begin() + static_cast<std::ptrdiff_t>(a)) {
      throw UsageError(fmt::format("--axis-names names '{}' twice", name));
    }
  }
  if (o.devices && *o.devices < 1) throw UsageError(fmt::format("--devices must be at least 1, got {}", *o.devices));
  if (o.mesh) {
    s.mesh_shape = parse_int_list("--mesh", *o.mesh);
    for (int64_t size : s.mesh_shape) {
      if (size < 1) throw UsageError(fmt::format("--mesh sizes must be at least 1, got {} in {}", size, *o.mesh));
    }
  } else {
    const int64_t devices = o.devices.value_or(1);
    s.mesh_shape.assign(s.axis_names.size(), 1);
    for (std::size_t a = 0; a < s.axis_names.size(); ++a) {
      if (s.axis_names[a] == "model") s.mesh_shape[a] = devices;
    }
  }
  if (s.mesh_shape.size() != s.axis_names.size()) {
    throw UsageError(
        fmt::format("--mesh has {} axes but --axis-names names {}", s.mesh_shape.size(), s.axis_names.size()));
  }
  s.devices = 1;
  for (int64_t size : s.mesh_shape) {
    if (size > kMaxMeshSize / s.devices) {
      throw UsageError(fmt::format("--mesh {} has more than 2^20 devices", fmt::join(s.mesh_shape, ",")));
    }
    s.devices *= size;
  }
  if (o.devices && *o.devices != s.devices) {
    throw Error(fmt::format("--devices {} does not match the mesh {} of {} devices", *o.devices,
                            fmt::join(s.mesh_shape, ","), s.devices));
  }
  s.batch = 1;
  for (std::size_t a = 0; a < s.axis_names.size(); ++a) {
    if (s.axis_names[a] == "data") s.batch = s.data_parallel = s.mesh_shape[a];
  }
  if (o.batch) s.batch = *o.batch;
  if (s.batch < 1) throw Error(fmt::format("--batch must be at least 1, got {}", s.batch));
  s.tokenizer = load_tokenizer(o, s.config);
  if (o.prompt) {
    if (!s.tokenizer) {
      throw Error(
          "--prompt needs a tokenizer to encode the text (--tokenizer, or a tokenizer.json in the --weights "
          "directory); or give token ids with --prompt-ids");
    }
    s.prompt = s.tokenizer->encode(*o.prompt, /*bos=*/true, /*eos=*/false);
  } else if (o.prompt_ids) {
    s.prompt = parse_int_list("--prompt-ids", *o.prompt_ids);
  } else {
    s.prompt = {llama::Tokenizer::kBos};
  }
  if (s.prompt.empty()) throw Error("the prompt is empty; give at least one token");
  size_cache(o, s);
  check_run_memory(o, s);
  return s;
}

llama::Weights load_weights(const LlamaOptions& o, const Setup& s, const llama::ShardingPlan* plan) {
  if (!o.weights) return llama::random_weights(s.config, o.seed, plan);
  return std::filesystem::is_directory(*o.weights) ? llama::load_hf(*o.weights, plan)
                                                   : llama::load_llama2c(*o.weights, plan);
}

// A progress line on stderr, only when it is a terminal.
class Progress {
 public:
  explicit Progress(std::string label)
      : label_(std::move(label)),
        on_(isatty(STDERR_FILENO) != 0 && (mpi_runtime() == nullptr || mpi_runtime()->process_index() == 0)) {}
  void update(int64_t done, int64_t total) {
    if (!on_) return;
    const int64_t width = 30, filled = total > 0 ? done * width / total : width;
    std::cerr << fmt::format("\r{} [{:<{}}] {}/{}", label_, std::string(static_cast<std::size_t>(filled), '#'), width,
                             done, total)
              << std::flush;
  }
  void done() {
    if (on_) std::cerr << "\r\033[K" << std::flush;
  }

 private:
  std::string label_;
  bool on_;
};

RunOutcome generate_once(const LlamaOptions& o, const Setup& s, bool sharded, bool keep_logits) {
  RunOutcome out;
  std::optional<Runtime> runtime;
  std::optional<llama::ShardingPlan> plan;
  // One device needs no runtime: the compiled programs run on the caller's thread.
  if (sharded && (s.devices > 1 || mpi_runtime() != nullptr)) {
    // Under --backend mpi the job's runtime serves both runs; the one-device
    // run then happens on every rank.
    if (mpi_runtime() == nullptr) runtime.emplace(Runtime::local(s.devices));
    std::vector<int64_t> ids(static_cast<std::size_t>(s.devices));
    std::iota(ids.begin(), ids.end(), 0);
    plan = llama::ShardingPlan::megatron(std::make_shared<const Mesh>(ids, s.mesh_shape, s.axis_names));
    out.plan_text = plan->to_string();
  }
  Progress progress(sharded ? fmt::format("{} devices", s.devices) : "1 device");
  progress.update(0, o.steps);
  {
    llama::Weights weights = load_weights(o, s, plan ? &*plan : nullptr);
    weights.config.seq_len = s.cache_positions;  // the cache size make_setup chose
    llama::Model model(std::move(weights), plan);
    const auto started = std::chrono::steady_clock::now();
    model.trace(s.batch, static_cast<int64_t>(s.prompt.size()));
    out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    llama::SamplingOptions sampling;
    sampling.steps = o.steps;
    sampling.temperature = o.temperature;
    sampling.top_p = o.top_p;
    sampling.seed = static_cast<uint64_t>(o.seed);
    sampling.keep_logits = keep_logits;
    sampling.on_token = [&](int64_t done, int64_t total) { progress.update(done, total); };
    if (o.profile && sharded) {
      out.prefill_profile = std::make_shared<OpProfile>();
      out.decode_profile = std::make_shared<OpProfile>();
      model.set_profiles(out.prefill_profile, out.decode_profile);
    }
    std::vector<std::vector<int64_t>> prompts(static_cast<std::size_t>(s.batch), s.prompt);
    out.generation = llama::generate(model, prompts, sampling);
    out.prefill = model.prefill_stats();
    out.decode = model.decode_stats();
    if (o.steps >= 2 || s.prompt.size() == 1) out.decode_collectives = model.decode_collectives();
  }
  progress.done();
  return out;
}

struct Comparison {
  double max_abs_logit_diff = 0;
  bool tokens_equal = true;
  bool within = true;
  std::string first_problem;
};

Comparison compare(const llama::Generation& got, const llama::Generation& want) {
  Comparison c;
  c.tokens_equal = got.tokens == want.tokens;
  // Logits are comparable up to the first step whose tokens differ.
  for (std::size_t step = 0; step < got.logits.size() && step < want.logits.size(); ++step) {
    double scale = 0, diff = 0;
    for (float v : want.logits[step]) scale = std::max(scale, std::abs(static_cast<double>(v)));
    for (std::size_t i = 0; i < got.logits[step].size(); ++i) {
      double d = std::abs(static_cast<double>(got.logits[step][i]) - want.logits[step][i]);
      if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
      diff = std::max(diff, d);
    }
    c.max_abs_logit_diff = std::max(c.max_abs_logit_diff, diff);
    if (diff > kLogitTolerance * (1 + scale) && c.within) {
      c.within = false;
      c.first_problem = fmt::format("the logits of step {} differ by {:.3g} (tolerance {:.3g})", step, diff,
                                    kLogitTolerance * (1 + scale));
    }
    bool same_tokens = true;
    for (std::size_t b = 0; b < got.tokens.size(); ++b)
      same_tokens = same_tokens && got.tokens[b][step] == want.tokens[b][step];
    if (!same_tokens) {
      if (c.first_problem.empty()) c.first_problem = fmt::format("the tokens of step {} differ", step);
      break;
    }
  }
  return c;
}

std::string row_text(const Setup& s, const std::vector<int64_t>& generated) {
  if (!s.tokenizer) return fmt::format("{}", fmt::join(generated, " "));
  std::vector<int64_t> all = s.prompt;
  all.insert(all.end(), generated.begin(), generated.end());
  return s.tokenizer->decode(all);
}

}  // namespace

int run_llama_command(const LlamaOptions& o) {
  if (o.steps < 1) throw Error(fmt::format("--steps must be at least 1, got {}", o.steps));
  if (!(o.temperature >= 0) || std::isinf(o.temperature)) {
    throw Error(fmt::format("--temperature must be a finite number, 0 or more, got {}", o.temperature));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) throw Error(fmt::format("--top-p must be in (0, 1], got {}", o.top_p));
  const Setup s = make_setup(o);
  check_mpi_ranks(s.devices, fmt::format("the mesh ({})", fmt::join(s.mesh_shape, ", ")));
  const RunOutcome run = generate_once(o, s, /*sharded=*/true, /*keep_logits=*/o.check);
  std::optional<Comparison> check;
  if (o.check) check = compare(run.generation, generate_once(o, s, /*sharded=*/false, true).generation);

  const llama::Generation& g = run.generation;
  const double prefill_tps = static_cast<double>(s.batch * g.prompt_tokens) / std::max(g.prefill_seconds, 1e-9);
  const double decode_tps =
      o.steps > 1 ? static_cast<double>(s.batch * (o.steps - 1)) / std::max(g.decode_seconds, 1e-9) : 0.0;
  std::map<std::string, int64_t> per_kind;
  for (const ProgramCollective& c : run.decode_collectives) ++per_kind[c.kind];
  const int64_t traces = run.prefill.traces + run.decode.traces;
  const int64_t cache_hits = run.prefill.cache_hits + run.decode.cache_hits;
  const std::optional<ProfileReport> prefill_report = report_of(run.prefill_profile);
  const std::optional<ProfileReport> decode_report = report_of(run.decode_profile);

  if (o.format == "json") {
    nlohmann::ordered_json out;
    out["tokens"] = g.tokens;
    nlohmann::ordered_json texts = nlohmann::ordered_json::array();
    for (const auto& row : g.tokens) texts.push_back(row_text(s, row));
    out["text"] = texts;
    out["prefill_tokens_per_s"] = prefill_tps;
    out["decode_tokens_per_s"] = decode_tps;
    out["compile_ms"] = run.compile_ms;
    out["cache_positions"] = s.cache_positions;
    out["traces"] = traces;
    out["cache_hits"] = cache_hits;
    out["collectives_per_decode_step"] = per_kind;
    if (check) out["max_abs_logit_diff"] = check->max_abs_logit_diff;
    if (o.profile) {
      nlohmann::ordered_json profile = nlohmann::ordered_json::object();
      if (prefill_report) profile["prefill"] = profile_json(*prefill_report);
      if (decode_report) profile["decode"] = profile_json(*decode_report);
      out["profile"] = profile;
    }
    // A text cut inside a character, or byte tokens that spell none, is not
    // UTF-8: such bytes print as U+FFFD rather than failing the output.
    std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  } else {
    for (std::size_t b = 0; b < g.tokens.size(); ++b) {
      std::cout << (g.tokens.size() > 1 ? fmt::format("[{}] ", b) : "") << row_text(s, g.tokens[b]) << "\n";
    }
    std::cout << fmt::format(
        "\n{} on {} device(s), mesh ({}) over ({}), batch {}, {} prompt token(s), "
        "a cache of {} positions\n",
        s.config.to_string(), s.devices, fmt::join(s.mesh_shape, ", "), fmt::join(s.axis_names, ", "), s.batch,
        g.prompt_tokens, s.cache_positions);
    if (!run.plan_text.empty()) std::cout << "sharding plan: " << run.plan_text;
    std::cout << fmt::format(
        "prefill {:.1f} tokens/s, decode {:.1f} tokens/s, compile {:.0f} ms, "
        "{} traces, {} cache hits\n",
        prefill_tps, decode_tps, run.compile_ms, traces, cache_hits);
    std::cout << fmt::format("{} collective(s) per decode step", run.decode_collectives.size());
    for (const auto& [kind, n] : per_kind) std::cout << fmt::format(", {} {}", n, kind);
    std::cout << "\n";
    for (const ProgramCollective& c : run.decode_collectives) std::cout << "  " << c.description << "\n";
    if (prefill_report) std::cout << profile_text("prefill", *prefill_report);
    if (decode_report) std::cout << profile_text("decode step", *decode_report);
    if (check) {
      std::cout << fmt::format("check against one device: tokens {}, max abs logit diff {:.3g} ({})\n",
                               check->tokens_equal ? "identical" : "DIFFERENT", check->max_abs_logit_diff,
                               check->within ? "within tolerance" : "OUT OF TOLERANCE");
    }
  }
  if (check && (!check->tokens_equal || !check->within)) {
    std::cerr << fmt::format("error: the {}-device generation differs from the one-device generation: {}\n", s.devices,
                             check->first_problem);
    return 1;
  }
  return 0;
}

}  // namespace shardflow::cli
