// LLaMA 2, written against the public API: the model users copy.
//
//   sf::Runtime rt = sf::Runtime::local(8);
//   auto mesh = std::make_shared<const sf::Mesh>(ids, {4, 1, 2}, {"data", "fsdp", "model"});
//   llama::ShardingPlan plan = llama::ShardingPlan::megatron(mesh);
//   llama::Model model(llama::random_weights(llama::Config::named("stories15M"), /*seed=*/0, &plan), plan);
//   llama::Generation g = llama::generate(model, {{1, 450, 4996}}, {.steps = 32});
//
// Conventions: weights are [out, in] as nn.Linear stores them; rotary
// embedding rotates interleaved pairs (x[2i], x[2i+1]) as Meta's and
// llama2.c's code do (Hugging Face checkpoints are converted at load time).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardflow/sharding/mesh.h"
#include "shardflow/sharding/partition_spec.h"
#include "shardflow/trace/compile.h"
#include "shardflow/trace/tensor.h"

namespace shardflow::llama {

struct Config {
  std::string name = "custom";
  int64_t dim = 0;
  int64_t hidden_dim = 0;  // of the SwiGLU MLP
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // grouped-query attention when < n_heads
  int64_t vocab_size = 0;
  int64_t seq_len = 0;            // the KV cache holds this many positions
  bool shared_classifier = true;  // output head tied to the token embedding
  double norm_eps = 1e-5;
  double rope_theta = 10000;

  int64_t head_dim() const { return dim / n_heads; }
  // tiny, stories15M, stories110M, 7B; an error lists the names.
  static Config named(const std::string& name);
  static std::vector<std::string> names();
  // Errors name the field and the rule it breaks.
  void validate() const;
  std::string to_string() const;
};

struct LayerWeights {
  Tensor attention_norm;  // [dim]
  Tensor wq, wk, wv, wo;  // [n_heads*hd, dim], [n_kv_heads*hd, dim] x2, [dim, n_heads*hd]
  Tensor ffn_norm;        // [dim]
  Tensor w1, w2, w3;      // [hidden, dim], [dim, hidden], [hidden, dim]
};

struct Weights {
  Config config;
  Tensor tok_embeddings;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  Tensor norm;    // [dim]
  Tensor output;  // [vocab, dim] (the embedding itself when tied)
};

// Where each parameter and annotated activation lives on the mesh: data,
// printable and editable, not code spread through the model. Parameter roles:
// tok_embeddings, attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3, norm,
// output. Activation roles: tokens [B,T], kv_cache [B,n_kv_heads,...],
// block_output [B,T,dim] (each decoder block's output, annotated inside the
// compiled step), logits [B,vocab].
struct ShardingPlan {
  std::shared_ptr<const Mesh> mesh;
  std::map<std::string, PartitionSpec> params;
  std::map<std::string, PartitionSpec> activations;

  // Mesh axes data, fsdp, model: batch over data; heads and the MLP hidden
  // dim over model (Megatron: column-split wq/wk/wv/w1/w3, row-split wo/w2);
  // weights' other dim over fsdp; block outputs over all three axes
  // (data, fsdp, model), as PyTorch/XLA's LLaMA 2 SPMD run annotated them.
  static ShardingPlan megatron(std::shared_ptr<const Mesh> mesh);
  const PartitionSpec& param(const std::string& role) const;
  const PartitionSpec* activation(const std::string& role) const;  // nullptr: not annotated
  std::string to_string() const;
  // Throws unless every entry names only axes of `mesh`, each at most once
  // per entry (which entry, and the axes the plan names, in the message).
  // megatron(), Model and the weight loaders call it before using the plan.
  void check() const;
};

// Deterministic random weights for `config` (element i of each tensor is a
// function of the seed, the tensor and i). With a plan, each tensor is laid
// out as the plan says.
Weights random_weights(const Config& config, int64_t seed, const ShardingPlan* plan = nullptr);

// The KV cache, one key and one value tensor per layer, each
// [B, n_kv_heads, seq_len, hd].
struct KVCache {
  std::vector<Tensor> keys, values;
};

class Model {
 public:
  // Weights already laid out by the plan stay where they are; others are laid
  // out now. Without a plan the model runs unannotated (one device).
  Model(Weights weights, std::optional<ShardingPlan> plan = std::nullopt);

  const Config& config() const { return weights_.config; }
  const Weights& weights() const { return weights_; }
  const std::optional<ShardingPlan>& plan() const { return plan_; }

  KVCache new_cache(int64_t batch) const;
  // Runs tokens [B,T] (i64) at positions start..start+T-1 through the model,
  // writing their keys and values into `cache`; returns the logits of the
  // last position, [B, vocab]. T > 1 runs the prefill program, T == 1 the
  // decode program; each is traced once per shape and then reused.
  Tensor forward(const Tensor& tokens, int64_t start, KVCache& cache);

  // Traces both programs for a batch and prompt length without running them.
  void trace(int64_t batch, int64_t prompt_length);
  CompileStats prefill_stats() const;
  CompileStats decode_stats() const;
  // The decode program as partitioned: shardings and collectives with reasons.
  std::string decode_program_text() const;
  // The collectives of one decode step (after the first decode call).
  std::vector<ProgramCollective> decode_collectives() const;
  // Later prefill and decode calls add their op times to these profiles
  // (trace/profile.h); nullptr stops that.
  void set_profiles(std::shared_ptr<OpProfile> prefill, std::shared_ptr<OpProfile> decode);

 private:
  std::vector<Tensor> step(const std::vector<Tensor>& inputs) const;
  Tensor annotate(const Tensor& t, const std::string& role) const;

  Weights weights_;
  std::optional<ShardingPlan> plan_;
  Tensor rope_cos_, rope_sin_;  // [seq_len, hd]: per element of a head, see rotary()
  Tensor rope_pair_swap_;       // [hd] i64: 1, 0, 3, 2, ...
  std::shared_ptr<CompiledFunction> prefill_, decode_;
};

struct SamplingOptions {
  int64_t steps = 16;      // tokens generated after the prompt
  double temperature = 0;  // 0: greedy
  double top_p = 0.9;      // nucleus sampling when temperature > 0 (1: off)
  uint64_t seed = 0;
  bool keep_logits = false;  // record every step's logits (for comparisons)
  // Called after each generated token (for progress displays).
  std::function<void(int64_t generated, int64_t total)> on_token;
};

struct Generation {
  std::vector<std::vector<int64_t>> tokens;  // generated tokens only, one row per batch row
  std::vector<std::vector<float>> logits;    // per step: [B * vocab] (keep_logits)
  double prefill_seconds = 0;                // includes tracing and partitioning
  double decode_seconds = 0;
  int64_t prompt_tokens = 0;  // per row
};

// Greedy or temperature/top-p generation; `prompts` holds one token list per
// batch row, all of the same length (at least 1).
Generation generate(Model& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& options);

// What a generation holds in memory, computed from the config and the
// request before anything is allocated (issue: a small checkpoint with a
// huge seq_len, or --batch 1000000, allocated until the machine died).
struct MemoryNeed {
  std::string what;     // "KV cache"
  uint64_t bytes = 0;   // UINT64_MAX when the product overflows
  std::string formula;  // "batch 4 x 32 layers x ... x 4 bytes"
};

// The weights (f32, each replicated over the mesh's `data` axis), the KV
// cache, the rotary tables, the attention mask and the activations of the
// prefill step, for `batch` rows of `prompt_length` tokens with a cache of
// config.seq_len positions, held by all in-process devices together.
std::vector<MemoryNeed> memory_needs(const Config& config, int64_t batch, int64_t prompt_length,
                                     int64_t data_parallel = 1);
// Throws when a need, or their sum, exceeds `budget_bytes`; the error names
// the largest need, its size and formula, `budget_what` ("the 23 GiB this
// machine has") and `advice` ("pass a smaller --seq-len or --batch").
void check_memory(const std::vector<MemoryNeed>& needs, uint64_t budget_bytes, const std::string& budget_what,
                  const std::string& advice);
// Bytes as "1.5 GiB", "768 KiB", "12 bytes".
std::string format_bytes(uint64_t bytes);

// Samples one token from logits: argmax at temperature 0, else nucleus
// sampling with `coin` uniform in [0, 1).
int64_t sample_token(std::span<const float> logits, double temperature, double top_p, double coin);

}  // namespace shardflow::llama
