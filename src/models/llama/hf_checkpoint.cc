// Hugging Face LLaMA checkpoints (see checkpoint.h): config.json and
// safetensors files, with q_proj and k_proj converted to Meta's rotary
// layout on the way in.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <set>

#include "json_file.h"
#include "placement.h"
#include "safetensors.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"
#include "shardflow/models/checkpoint.h"

namespace shardflow::llama {

namespace {

constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

void check_directory(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw Error(fmt::format("Hugging Face checkpoint directory '{}' {}", dir.string(),
                            std::filesystem::exists(dir, ec) ? "is not a directory" : "does not exist"));
  }
}

// The fields of config.json, with errors naming the file and the field.
class ConfigFields {
 public:
  ConfigFields(const Json& json, std::filesystem::path path) : json_(json), path_(std::move(path)) {}

  // nullptr when absent or null (null is what Python writes for "not set").
  const Json* find(const char* field) const {
    const auto it = json_.find(field);
    return it == json_.end() || it->is_null() ? nullptr : &*it;
  }

  int64_t integer(const char* field, std::optional<int64_t> fallback = std::nullopt) const {
    const Json* value = required(field, "an integer", fallback.has_value());
    if (value == nullptr) return *fallback;
    if (value->is_number_unsigned() && value->get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
      fail(field, fmt::format("is {}, too large", value->get<uint64_t>()));
    }
    if (!value->is_number_integer()) mistyped(field, *value, "an integer");
    return value->get<int64_t>();
  }

  double number(const char* field, std::optional<double> fallback = std::nullopt) const {
    const Json* value = required(field, "a number", fallback.has_value());
    if (value == nullptr) return *fallback;
    if (!value->is_number()) mistyped(field, *value, "a number");
    return value->get<double>();
  }

  bool boolean(const char* field, bool fallback) const {
    const Json* value = find(field);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) mistyped(field, *value, "true or false");
    return value->get<bool>();
  }

  std::optional<std::string> string(const char* field) const {
    const Json* value = find(field);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) mistyped(field, *value, "a string");
    return value->get<std::string>();
  }

  [[noreturn]] void fail(const char* field, const std::string& problem) const {
    throw Error(fmt::format("Hugging Face config '{}': field '{}' {}", path_.string(), field, problem));
  }

 private:
  const Json* required(const char* field, const char* expected, bool optional) const {
    const auto it = json_.find(field);
    if (it == json_.end()) {
      if (optional) return nullptr;
      fail(field, fmt::format("is missing (expected {})", expected));
    }
    if (it->is_null() && optional) return nullptr;
    return &*it;
  }

  [[noreturn]] void mistyped(const char* field, const Json& value, const char* expected) const {
    fail(field, fmt::format("is {}, expected {}", describe(value), expected));
  }

  const Json& json_;
  std::filesystem::path path_;
};

// Meta's row `row` of a q or k projection is the file's row hf_row(row):
// Meta rotates rows (2i, 2i+1) of each head together, Hugging Face rows
// (i, i + hd/2).
int64_t hf_row(int64_t row, int64_t head_dim) {
  const int64_t head = row / head_dim, within = row % head_dim;
  return head * head_dim + (within % 2) * (head_dim / 2) + within / 2;
}

// Calls f(name, role, shape, rotary_heads, tensor) for every tensor of the
// Hugging Face layout, in the order files list them; rotary_heads is the
// number of heads of q_proj and k_proj (whose rows are permuted), else 0.
// The head is visited only when it is not tied.
template <class W, class F>
void for_each_tensor(W& w, F&& f) {
  const Config& c = w.config;
  const int64_t hd = c.head_dim(), q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  f("model.embed_tokens.weight", "tok_embeddings", Shape{c.vocab_size, c.dim}, 0, w.tok_embeddings);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto& layer = w.layers[static_cast<std::size_t>(l)];
    const std::string prefix = fmt::format("model.layers.{}.", l);
    f(prefix + "input_layernorm.weight", "attention_norm", Shape{c.dim}, 0, layer.attention_norm);
    f(prefix + "self_attn.q_proj.weight", "wq", Shape{q_dim, c.dim}, c.n_heads, layer.wq);
    f(prefix + "self_attn.k_proj.weight", "wk", Shape{kv_dim, c.dim}, c.n_kv_heads, layer.wk);
    f(prefix + "self_attn.v_proj.weight", "wv", Shape{kv_dim, c.dim}, 0, layer.wv);
    f(prefix + "self_attn.o_proj.weight", "wo", Shape{c.dim, q_dim}, 0, layer.wo);
    f(prefix + "post_attention_layernorm.weight", "ffn_norm", Shape{c.dim}, 0, layer.ffn_norm);
    f(prefix + "mlp.gate_proj.weight", "w1", Shape{c.hidden_dim, c.dim}, 0, layer.w1);
    f(prefix + "mlp.up_proj.weight", "w3", Shape{c.hidden_dim, c.dim}, 0, layer.w3);
    f(prefix + "mlp.down_proj.weight", "w2", Shape{c.dim, c.hidden_dim}, 0, layer.w2);
  }
  f("model.norm.weight", "norm", Shape{c.dim}, 0, w.norm);
  if (!c.shared_classifier) f("lm_head.weight", "output", Shape{c.vocab_size, c.dim}, 0, w.output);
}

// The safetensors files of a checkpoint directory, each opened once.
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& dir) {
    std::error_code ec;
    if (std::filesystem::exists(dir / kSingleFile, ec)) {
      readers_.push_back(std::make_unique<safetensors::Reader>(dir / kSingleFile));
      return;
    }
    index_ = dir / kIndexFile;
    if (!std::filesystem::exists(index_, ec)) {
      throw Error(fmt::format("Hugging Face checkpoint directory '{}' has neither {} nor {}", dir.string(), kSingleFile,
                              kIndexFile));
    }
    const Json index = read_json(index_, "safetensors index");
    const auto map = index.is_object() ? index.find("weight_map") : index.end();
    if (map == index.end() || !map->is_object()) {
      throw Error(fmt::format("safetensors index '{}' has no \"weight_map\" object (tensor name -> file name)",
                              index_.string()));
    }
    std::map<std::string, const safetensors::Reader*> by_file;
    for (const auto& [tensor, file] : map->items()) {
      if (!file.is_string()) {
        throw Error(fmt::format("safetensors index '{}' maps tensor '{}' to {}, expected a file name", index_.string(),
                                tensor, describe(file)));
      }
      const std::string name = file.get<std::string>();
      auto it = by_file.find(name);
      if (it == by_file.end()) {
        const std::filesystem::path path = dir / name;
        if (name.empty() || std::filesystem::path(name).filename() != name) {
          throw Error(
              fmt::format("safetensors index '{}' maps tensor '{}' to '{}', expected a file name in the "
                          "checkpoint directory",
                          index_.string(), tensor, name));
        }
        if (!std::filesystem::exists(path, ec)) {
          throw Error(fmt::format("safetensors index '{}' maps tensor '{}' to '{}', which does not exist",
                                  index_.string(), tensor, path.string()));
        }
        readers_.push_back(std::make_unique<safetensors::Reader>(path));
        it = by_file.emplace(name, readers_.back().get()).first;
      }
      by_tensor_.emplace(tensor, it->second);
    }
  }

  bool contains(const std::string& name) const {
    return index_.empty() ? readers_.front()->contains(name) : by_tensor_.count(name) != 0;
  }
  // Every tensor the checkpoint has (the index's, or the one file's).
  std::vector<std::string> names() const {
    if (index_.empty()) return readers_.front()->names();
    std::vector<std::string> out;
    for (const auto& [name, reader] : by_tensor_) out.push_back(name);
    return out;
  }

  // The tensor `name` of shape `shape` laid out for `role`; rotary_heads > 0
  // permutes its rows from Hugging Face's rotary layout to Meta's.
  Tensor load(const std::string& name, const Shape& shape, const std::string& role, int64_t rotary_heads,
              const ShardingPlan* plan) const {
    const safetensors::Reader* reader = readers_.empty() ? nullptr : readers_.front().get();
    if (!index_.empty()) {
      const auto it = by_tensor_.find(name);
      if (it == by_tensor_.end()) {
        throw Error(fmt::format("tensor '{}' is missing from safetensors index '{}'", name, index_.string()));
      }
      reader = it->second;
    }
    const safetensors::TensorView view = reader->tensor(name, shape);
    if (rotary_heads == 0) {
      return place_tensor(
          shape, [reader, &view](int64_t first, int64_t count, float* dst) { reader->read(view, first, count, dst); },
          plan, role);
    }
    const int64_t columns = shape[1], head_dim = shape[0] / rotary_heads;
    // place_tensor asks for runs within one row when it shards, but for the
    // whole tensor at once when it does not: map each row's piece.
    return place_tensor(
        shape,
        [reader, &view, columns, head_dim](int64_t first, int64_t count, float* dst) {
          while (count > 0) {
            const int64_t row = first / columns, column = first % columns;
            const int64_t n = std::min(count, columns - column);
            reader->read(view, hf_row(row, head_dim) * columns + column, n, dst);
            first += n;
            count -= n;
            dst += n;
          }
        },
        plan, role);
  }

 private:
  std::vector<std::unique_ptr<safetensors::Reader>> readers_;
  std::filesystem::path index_;  // empty for a single file
  std::map<std::string, const safetensors::Reader*> by_tensor_;
};

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) throw Error(fmt::format("cannot write '{}'", path.string()));
}

std::string torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    default:
      return "float32";
  }
}

}  // namespace

Config read_hf_config(const std::filesystem::path& dir) {
  check_directory(dir);
  const std::filesystem::path path = dir / kConfigFile;
  const Json json = read_json(path, "Hugging Face config");
  if (!json.is_object()) {
    throw Error(fmt::format("Hugging Face config '{}' is {}, expected a JSON object", path.string(), describe(json)));
  }
  const ConfigFields fields(json, path);
  if (const auto type = fields.string("model_type"); type && *type != "llama") {
    throw Error(
        fmt::format("Hugging Face config '{}' has model_type '{}', expected 'llama' (only LLaMA "
                    "checkpoints can be loaded)",
                    path.string(), *type));
  }
  Config c;
  c.name = (dir.has_filename() ? dir.filename() : dir.parent_path().filename()).string();
  c.dim = fields.integer("hidden_size");
  c.hidden_dim = fields.integer("intermediate_size");
  c.n_layers = fields.integer("num_hidden_layers");
  c.n_heads = fields.integer("num_attention_heads");
  c.n_kv_heads = fields.integer("num_key_value_heads", c.n_heads);
  c.vocab_size = fields.integer("vocab_size");
  c.seq_len = fields.integer("max_position_embeddings");
  c.norm_eps = fields.number("rms_norm_eps");
  c.rope_theta = fields.number("rope_theta", 10000.0);
  c.shared_classifier = fields.boolean("tie_word_embeddings", false);
  // Settings the model would silently ignore.
  if (const auto act = fields.string("hidden_act"); act && *act != "silu") {
    fields.fail("hidden_act", fmt::format("is '{}', expected 'silu' (the model's SwiGLU MLP)", *act));
  }
  if (fields.find("rope_scaling") != nullptr) {
    fields.fail("rope_scaling", "is set, which is not supported (expected null or absent)");
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (fields.boolean(bias, false)) fields.fail(bias, "is true, which is not supported (the model has no biases)");
  }
  if (fields.find("head_dim") != nullptr && c.n_heads > 0) {
    const int64_t head_dim = fields.integer("head_dim");
    if (head_dim != c.dim / c.n_heads) {
      fields.fail("head_dim",
                  fmt::format("is {}, expected hidden_size / num_attention_heads = {}", head_dim, c.dim / c.n_heads));
    }
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(fmt::format("Hugging Face config '{}' is invalid: {}", path.string(), e.what()));
  }
  return c;
}

// A tensor the config does not read means the config does not describe the
// file (fewer layers than it holds, another architecture): refused rather
// than ignored. Rotary tables some exporters save (rotary_emb.inv_freq) are
// recomputed from the config, so they may be there.
static void check_all_used(const std::vector<std::string>& names, const std::set<std::string>& used,
                           const std::filesystem::path& dir, const Config& c) {
  std::vector<std::string> unused;
  for (const std::string& name : names) {
    if (!used.count(name) && !name.ends_with(".rotary_emb.inv_freq")) {
      unused.push_back(name);
    }
  }
  if (unused.empty()) return;
  std::string listed;
  for (std::size_t i = 0; i < unused.size() && i < 3; ++i) listed += (i ? ", " : "") + quote_for_message(unused[i], 80);
  throw Error(
      fmt::format("Hugging Face checkpoint '{}' has {} tensor(s) its config does not use: {}{} (config.json "
                  "says {} layers, hidden_size {}, so it does not describe these weights)",
                  dir.string(), unused.size(), listed, unused.size() > 3 ? ", ..." : "", c.n_layers, c.dim));
}

Weights load_hf(const std::filesystem::path& dir, const ShardingPlan* plan) {
  if (plan != nullptr) plan->check();
  Weights w;
  w.config = read_hf_config(dir);
  const Config& c = w.config;
  const Checkpoint checkpoint(dir);
  if (!c.shared_classifier && !checkpoint.contains("lm_head.weight")) {
    throw Error(
        fmt::format("tensor 'lm_head.weight' is missing from Hugging Face checkpoint '{}' (its config has "
                    "tie_word_embeddings false, so the head is not the embedding)",
                    dir.string()));
  }
  w.layers.resize(static_cast<std::size_t>(c.n_layers));
  std::set<std::string> used;
  for_each_tensor(
      w, [&](const std::string& name, const char* role, const Shape& shape, int64_t rotary_heads, Tensor& slot) {
        used.insert(name);
        slot = checkpoint.load(name, shape, role, rotary_heads, plan);
      });
  check_all_used(checkpoint.names(), used, dir, c);
  // A tied head is the embedding, or read again where its layout differs.
  if (c.shared_classifier && tied_head_shares_embedding(plan)) {
    w.output = w.tok_embeddings;
  } else if (c.shared_classifier) {
    w.output = checkpoint.load("model.embed_tokens.weight", {c.vocab_size, c.dim}, "output", 0, plan);
  }
  return w;
}

void write_hf(const std::filesystem::path& dir, const Weights& hf_layout_weights, DType dtype, int64_t num_files) {
  const Weights& w = hf_layout_weights;
  const Config& c = w.config;
  c.validate();
  safetensors::dtype_tag(dtype);  // checks the dtype before anything is written
  if (static_cast<int64_t>(w.layers.size()) != c.n_layers) {
    throw Error(fmt::format("write_hf: the weights have {} layers, their config {}", w.layers.size(), c.n_layers));
  }
  std::vector<safetensors::NamedTensor> tensors;
  for_each_tensor(w, [&](const std::string& name, const char*, const Shape& shape, int64_t, const Tensor& t) {
    if (!t.defined() || t.shape() != shape) {
      throw Error(fmt::format("write_hf: tensor '{}' has shape {}, expected {}", name,
                              t.defined() ? shape_to_string(t.shape()) : "(undefined)", shape_to_string(shape)));
    }
    tensors.push_back({name, &t});
  });
  const auto count = static_cast<int64_t>(tensors.size());
  if (num_files < 1 || num_files > count) {
    throw Error(fmt::format("write_hf: num_files is {}, expected 1..{} (the number of tensors)", num_files, count));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create directory '{}': {}", dir.string(), ec.message()));

  nlohmann::ordered_json config = {{"architectures", Json::array({"LlamaForCausalLM"})},
                                   {"model_type", "llama"},
                                   {"hidden_size", c.dim},
                                   {"intermediate_size", c.hidden_dim},
                                   {"num_hidden_layers", c.n_layers},
                                   {"num_attention_heads", c.n_heads},
                                   {"num_key_value_heads", c.n_kv_heads},
                                   {"vocab_size", c.vocab_size},
                                   {"max_position_embeddings", c.seq_len},
                                   {"rms_norm_eps", c.norm_eps},
                                   {"rope_theta", c.rope_theta},
                                   {"tie_word_embeddings", c.shared_classifier},
                                   {"hidden_act", "silu"},
                                   {"torch_dtype", torch_dtype(dtype)}};
  write_text(dir / kConfigFile, config.dump(2) + "\n");

  // Stale files of the other layout would take precedence or mislead.
  std::filesystem::remove(dir / (num_files == 1 ? kIndexFile : kSingleFile), ec);
  if (num_files == 1) {
    safetensors::write(dir / kSingleFile, tensors, dtype);
    return;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (int64_t f = 0; f < num_files; ++f) {
    const std::string file = fmt::format("model-{:05}-of-{:05}.safetensors", f + 1, num_files);
    std::vector<safetensors::NamedTensor> part;
    for (int64_t i = 0; i < count; ++i) {
      if (i * num_files / count == f) part.push_back(tensors[static_cast<std::size_t>(i)]);
    }
    for (const safetensors::NamedTensor& t : part) weight_map[t.name] = file;
    total += safetensors::write(dir / file, part, dtype);
  }
  const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text(dir / kIndexFile, index.dump(2) + "\n");
}

}  // namespace shardflow::llama
