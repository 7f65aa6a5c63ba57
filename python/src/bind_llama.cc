// LLaMA 2 (shardflow::llama) in Python: configs, weights, the sharding plan
// as data, the model, generation and tokenizers.
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "arrays.h"
#include "bindings.h"
#include "convert.h"
#include "shardflow/base/error.h"
#include "shardflow/models/checkpoint.h"
#include "shardflow/models/llama.h"
#include "shardflow/models/tokenizer.h"

namespace shardflow::python {

using namespace nb::literals;
using namespace shardflow::llama;

static std::map<std::string, PartitionSpec> specs_of(nb::handle mapping, const char* what) {
  std::map<std::string, PartitionSpec> specs;
  if (mapping.is_none()) return specs;
  if (!nb::isinstance<nb::dict>(mapping)) throw Error(fmt::format("{} must be a dict of role -> partition spec", what));
  for (auto [role, spec] : nb::cast<nb::dict>(mapping)) {
    specs.emplace(nb::cast<std::string>(role), partition_spec_of(spec));
  }
  return specs;
}

static void bind_config(nb::module_& m) {
  nb::class_<Config>(m, "Config", "A LLaMA 2 shape: Config.named('stories15M'), or Config(dim=..., ...).")
      .def(
          "__init__",
          [](Config* self, const std::string& name, int64_t dim, int64_t hidden_dim, int64_t n_layers, int64_t n_heads,
             std::optional<int64_t> n_kv_heads, int64_t vocab_size, int64_t seq_len, bool shared_classifier,
             double norm_eps, double rope_theta) {
            new (self) Config{name,       dim,     hidden_dim,        n_layers, n_heads,   n_kv_heads.value_or(n_heads),
                              vocab_size, seq_len, shared_classifier, norm_eps, rope_theta};
            self->validate();
          },
          nb::kw_only(), "name"_a = "custom", "dim"_a, "hidden_dim"_a, "n_layers"_a, "n_heads"_a,
          "n_kv_heads"_a.none() = nb::none(), "vocab_size"_a, "seq_len"_a, "shared_classifier"_a = true,
          "norm_eps"_a = 1e-5, "rope_theta"_a = 10000.0)
      .def_static("named", &Config::named, "name"_a, "tiny, stories15M, stories110M or 7B.")
      .def_static("names", &Config::names)
      .def_rw("name", &Config::name)
      .def_rw("dim", &Config::dim)
      .def_rw("hidden_dim", &Config::hidden_dim)
      .def_rw("n_layers", &Config::n_layers)
      .def_rw("n_heads", &Config::n_heads)
      .def_rw("n_kv_heads", &Config::n_kv_heads)
      .def_rw("vocab_size", &Config::vocab_size)
      .def_rw("seq_len", &Config::seq_len)
      .def_rw("shared_classifier", &Config::shared_classifier)
      .def_rw("norm_eps", &Config::norm_eps)
      .def_rw("rope_theta", &Config::rope_theta)
      .def_prop_ro("head_dim", &Config::head_dim)
      .def("validate", &Config::validate)
      .def("__repr__", &Config::to_string);
}

static void bind_weights(nb::module_& m) {
  nb::class_<LayerWeights>(m, "LayerWeights", "One decoder block's parameters ([out, in] as nn.Linear stores them).")
      .def_rw("attention_norm", &LayerWeights::attention_norm)
      .def_rw("wq", &LayerWeights::wq)
      .def_rw("wk", &LayerWeights::wk)
      .def_rw("wv", &LayerWeights::wv)
      .def_rw("wo", &LayerWeights::wo)
      .def_rw("ffn_norm", &LayerWeights::ffn_norm)
      .def_rw("w1", &LayerWeights::w1)
      .def_rw("w2", &LayerWeights::w2)
      .def_rw("w3", &LayerWeights::w3);
  nb::class_<Weights>(m, "Weights", "A model's parameters, each a shardflow Tensor (laid out by the plan if given).")
      .def_rw("config", &Weights::config)
      .def_rw("tok_embeddings", &Weights::tok_embeddings)
      .def_rw("layers", &Weights::layers)
      .def_rw("norm", &Weights::norm)
      .def_rw("output", &Weights::output);
  m.def("random_weights", &random_weights, "config"_a, "seed"_a = 0, "plan"_a.none() = nb::none(),
        nb::call_guard<nb::gil_scoped_release>(),
        "Deterministic random weights of a config, laid out as the plan says.");
  m.def("load_llama2c", &load_llama2c, "path"_a, "plan"_a.none() = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
        "A llama2.c checkpoint (.bin), each tensor read straight into its device shards.");
  m.def("read_llama2c_config", &read_llama2c_config, "path"_a);
  m.def("write_llama2c", &write_llama2c, "path"_a, "weights"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("load_hf", &load_hf, "path"_a, "plan"_a.none() = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
        "A Hugging Face checkpoint directory (config.json and safetensors).");
  m.def("read_hf_config", &read_hf_config, "path"_a);
}

static void bind_plan(nb::module_& m) {
  nb::class_<ShardingPlan>(m, "ShardingPlan",
                           "Where each parameter and annotated activation lives on the mesh, as data.\n\n"
                           "Parameter roles: tok_embeddings, attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3,\n"
                           "norm, output. Activation roles: tokens, kv_cache, block_output, logits.")
      .def(
          "__init__",
          [](ShardingPlan* self, std::shared_ptr<Mesh> mesh, nb::handle params, nb::handle activations) {
            new (self) ShardingPlan{std::move(mesh), specs_of(params, "params"), specs_of(activations, "activations")};
            self->check();
          },
          "mesh"_a, "params"_a, "activations"_a.none() = nb::none())
      .def_static(
          "megatron", [](std::shared_ptr<Mesh> mesh) { return ShardingPlan::megatron(std::move(mesh)); }, "mesh"_a,
          "Batch over 'data', heads and the MLP hidden dim over 'model', weights' other dim over 'fsdp', "
          "block outputs annotated ('data', 'fsdp', 'model').")
      .def_prop_ro("mesh", [](const ShardingPlan& p) { return python_mesh(p.mesh); })
      .def_prop_ro(
          "params", [](const ShardingPlan& p) { return p.params; }, "role -> PartitionSpec (a copy)")
      .def_prop_ro(
          "activations", [](const ShardingPlan& p) { return p.activations; }, "role -> PartitionSpec (a copy)")
      .def(
          "with_param",
          [](const ShardingPlan& p, const std::string& role, nb::handle spec) {
            ShardingPlan copy = p;
            copy.params[role] = partition_spec_of(spec);
            copy.check();
            return copy;
          },
          "role"_a, "spec"_a, "A copy of the plan with one parameter's spec replaced.")
      .def(
          "with_activation",
          [](const ShardingPlan& p, const std::string& role, nb::handle spec) {
            ShardingPlan copy = p;
            if (spec.is_none())
              copy.activations.erase(role);
            else
              copy.activations[role] = partition_spec_of(spec);
            copy.check();
            return copy;
          },
          "role"_a, "spec"_a.none(), "A copy with one activation annotated as given (None: not annotated).")
      .def("__str__", &ShardingPlan::to_string);
}

static void bind_model(nb::module_& m) {
  nb::class_<Generation>(m, "Generation")
      .def_ro("tokens", &Generation::tokens, "The generated tokens, one list per batch row.")
      .def_prop_ro(
          "logits",
          [](const Generation& g) {
            nb::list steps;
            for (const std::vector<float>& step : g.logits) {
              nb::object array = nb::module_::import_("numpy").attr("array")(nb::cast(step), "float32");
              steps.append(array);
            }
            return steps;
          },
          "Per step, the logits [batch * vocab] (keep_logits=True).")
      .def_ro("prefill_seconds", &Generation::prefill_seconds, "Includes tracing and partitioning.")
      .def_ro("decode_seconds", &Generation::decode_seconds)
      .def_ro("prompt_tokens", &Generation::prompt_tokens);
  nb::class_<Model>(m, "Model", "LLaMA 2 with one compiled program for the prefill and one for decoding.")
      .def(nb::init<Weights, std::optional<ShardingPlan>>(), "weights"_a, "plan"_a.none() = nb::none(),
           nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("config", &Model::config)
      .def_prop_ro("plan", &Model::plan)
      .def("trace", &Model::trace, "batch"_a, "prompt_length"_a, nb::call_guard<nb::gil_scoped_release>(),
           "Traces and partitions both programs without running them.")
      .def_prop_ro("decode_program_text", &Model::decode_program_text)
      .def("decode_collectives", &Model::decode_collectives,
           "The collectives of one decode step (after the first decode), each with its reason.")
      .def_prop_ro("prefill_stats", [](const Model& model) { return stats_dict(model.prefill_stats()); })
      .def_prop_ro("decode_stats", [](const Model& model) { return stats_dict(model.decode_stats()); });
  m.def(
      "generate",
      [](Model& model, const std::vector<std::vector<int64_t>>& prompts, int64_t steps, double temperature,
         double top_p, uint64_t seed, bool keep_logits) {
        SamplingOptions options;
        options.steps = steps;
        options.temperature = temperature;
        options.top_p = top_p;
        options.seed = seed;
        options.keep_logits = keep_logits;
        nb::gil_scoped_release release;
        return generate(model, prompts, options);
      },
      "model"_a, "prompts"_a, "steps"_a = 16, "temperature"_a = 0.0, "top_p"_a = 0.9, "seed"_a = 0,
      "keep_logits"_a = false,
      "Greedy (temperature 0) or nucleus sampling; one prompt (token ids) per batch row, all of one length.");

  nb::class_<Tokenizer>(m, "Tokenizer",
                        "llama2.c's tokenizer.bin or a Hugging Face tokenizer.json (sentencepiece BPE).")
      .def_static("load", &Tokenizer::load_any, "path"_a, "vocab_size"_a,
                  "tokenizer.bin, tokenizer.json, or a directory holding one.")
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def("encode", &Tokenizer::encode, "text"_a, "bos"_a = true, "eos"_a = false)
      .def(
          "decode", [](const Tokenizer& t, const std::vector<int64_t>& tokens) { return t.decode(tokens); }, "tokens"_a)
      .def("token", &Tokenizer::token, "id"_a);
}

void bind_llama(nb::module_& m) {
  nb::module_ llama = m.def_submodule("llama", "LLaMA 2 written against shardflow's API (shardflow::llama).");
  bind_config(llama);
  bind_weights(llama);
  bind_plan(llama);
  bind_model(llama);
}

}  // namespace shardflow::python
