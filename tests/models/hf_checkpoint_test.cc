// Hugging Face checkpoints: config.json, single and sharded safetensors
// files, the rotary conversion of q_proj and k_proj (checked by running the
// model against the reference in Hugging Face's convention), f16 and bf16
// storage, and the errors of broken files.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/llama_reference.h"
#include "shardflow/base/error.h"
#include "shardflow/models/checkpoint.h"
#include "shardflow/runtime/runtime.h"

namespace shardflow::llama {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("hf_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string load_error(const fs::path& dir) {
  try {
    load_hf(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string config_error(const fs::path& dir) {
  try {
    read_hf_config(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A safetensors file split into its JSON header and its data.
struct Container {
  Json header;
  std::string data;
};

Container read_container(const fs::path& path) {
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  return {Json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

void write_container(const fs::path& path, const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  for (std::size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  write_bytes(path, bytes + header + data);
}

// Rewrites the header of a safetensors file, keeping its data.
template <class F>
void edit_header(const fs::path& path, F&& edit) {
  Container c = read_container(path);
  edit(c.header);
  write_container(path, c.header.dump(), c.data);
}

// Rewrites a safetensors file, header and data.
template <class F>
void edit_container(const fs::path& path, F&& edit) {
  Container c = read_container(path);
  edit(c);
  write_container(path, c.header.dump(), c.data);
}

// Drops a tensor's entry and bytes, moving the later tensors' offsets back:
// the file stays well formed.
void drop_tensor(Container& c, const std::string& name) {
  const uint64_t begin = c.header[name]["data_offsets"][0], end = c.header[name]["data_offsets"][1];
  c.header.erase(name);
  c.data.erase(begin, end - begin);
  for (auto& [other, entry] : c.header.items()) {
    if (other == "__metadata__") continue;
    for (auto& offset : entry["data_offsets"]) {
      if (offset.get<uint64_t>() >= end) offset = offset.get<uint64_t>() - (end - begin);
    }
  }
}

// Appends a well-formed tensor of `floats` F32 elements.
void add_tensor(Container& c, const std::string& name, std::size_t floats) {
  const uint64_t begin = c.data.size();
  c.data.append(floats * 4, '\0');
  c.header[name] = {{"dtype", "F32"}, {"shape", {floats}}, {"data_offsets", {begin, begin + floats * 4}}};
}

// Meta's layout of an HF q or k projection: Meta row h*hd + 2i + p is HF row
// h*hd + p*hd/2 + i.
std::vector<float> to_meta_rows(const std::vector<float>& hf, int64_t heads, int64_t head_dim, int64_t columns) {
  std::vector<float> meta(hf.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      for (int64_t p = 0; p < 2; ++p) {
        const int64_t from = h * head_dim + p * head_dim / 2 + i, to = h * head_dim + 2 * i + p;
        std::copy_n(hf.begin() + from * columns, columns, meta.begin() + to * columns);
      }
    }
  }
  return meta;
}

// Applies `round` to every value of the reference weights.
template <class F>
testing::ReferenceWeights map_values(testing::ReferenceWeights w, F&& round) {
  auto apply = [&](std::vector<float>& v) {
    for (float& x : v) x = round(x);
  };
  apply(w.tok_embeddings);
  apply(w.norm);
  apply(w.output);
  for (auto& l : w.layers) {
    for (auto* v : {&l.attention_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w1, &l.w2, &l.w3}) apply(*v);
  }
  return w;
}

// The loaded weights are the written ones, with q and k in Meta's layout.
void expect_loaded(const testing::ReferenceWeights& written, const Weights& loaded) {
  const testing::ReferenceWeights got = testing::reference_weights(loaded);
  const Config& c = written.config;
  EXPECT_EQ(got.tok_embeddings, written.tok_embeddings);
  EXPECT_EQ(got.norm, written.norm);
  EXPECT_EQ(got.output, c.shared_classifier ? written.tok_embeddings : written.output);
  ASSERT_EQ(got.layers.size(), written.layers.size());
  for (std::size_t l = 0; l < got.layers.size(); ++l) {
    const auto &x = written.layers[l], &y = got.layers[l];
    EXPECT_EQ(y.wq, to_meta_rows(x.wq, c.n_heads, c.head_dim(), c.dim)) << "layer " << l;
    EXPECT_EQ(y.wk, to_meta_rows(x.wk, c.n_kv_heads, c.head_dim(), c.dim)) << "layer " << l;
    EXPECT_NE(y.wq, x.wq);  // the permutation is not the identity
    EXPECT_EQ(y.wv, x.wv);
    EXPECT_EQ(y.wo, x.wo);
    EXPECT_EQ(y.w1, x.w1);
    EXPECT_EQ(y.w2, x.w2);
    EXPECT_EQ(y.w3, x.w3);
    EXPECT_EQ(y.attention_norm, x.attention_norm);
    EXPECT_EQ(y.ffn_norm, x.ffn_norm);
  }
}

ShardingPlan megatron_plan(std::vector<int64_t> shape) {
  std::vector<int64_t> ids(8);
  std::iota(ids.begin(), ids.end(), 0);
  return ShardingPlan::megatron(
      std::make_shared<const Mesh>(ids, std::move(shape), std::vector<std::string>{"data", "fsdp", "model"}));
}

// Independent rounding to the nearest f16 / bf16 value (ties to even), by
// scaling to the spacing of the value's binade.
float round_to_format(float x, int mantissa_bits, int min_exponent, double overflow) {
  if (std::isnan(x)) return x;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= overflow) return std::copysign(std::numeric_limits<float>::infinity(), x);
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int spacing = std::max(e - 1 - mantissa_bits, min_exponent - mantissa_bits);
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(a, -spacing)), spacing);
  return static_cast<float>(std::copysign(rounded, static_cast<double>(x)));
}
float round_f16(float x) { return round_to_format(x, 10, -14, 65520.0); }
float round_bf16(float x) { return round_to_format(x, 7, -126, std::ldexp(2.0 - std::ldexp(1.0, -8), 127)); }

// ---------------------------------------------------------------------------

TEST(HfCheckpoint, ConfigRoundTripsAndDefaults) {
  Config config = Config::named("tiny");
  config.rope_theta = 500000;
  config.norm_eps = 1e-6;
  config.shared_classifier = false;
  const fs::path dir = fresh_dir("config");
  write_hf(dir, random_weights(config, 1), DType::kF32, 1);
  const Config read = read_hf_config(dir);
  EXPECT_EQ(read.name, "hf_config");
  EXPECT_EQ(read.dim, config.dim);
  EXPECT_EQ(read.hidden_dim, config.hidden_dim);
  EXPECT_EQ(read.n_layers, config.n_layers);
  EXPECT_EQ(read.n_heads, config.n_heads);
  EXPECT_EQ(read.n_kv_heads, config.n_kv_heads);
  EXPECT_EQ(read.vocab_size, config.vocab_size);
  EXPECT_EQ(read.seq_len, config.seq_len);
  EXPECT_EQ(read.norm_eps, 1e-6);
  EXPECT_EQ(read.rope_theta, 500000);
  EXPECT_FALSE(read.shared_classifier);

  // Llama 2 7B's config.json, which leaves out the defaulted fields.
  write_bytes(dir / "config.json", R"({"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
    "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "pad_token_id": 0, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})");
  const Config llama7b = read_hf_config(dir);
  EXPECT_EQ(llama7b.dim, 4096);
  EXPECT_EQ(llama7b.hidden_dim, 11008);
  EXPECT_EQ(llama7b.n_kv_heads, 32);
  EXPECT_EQ(llama7b.rope_theta, 10000);
  EXPECT_EQ(llama7b.norm_eps, 1e-5);
  EXPECT_FALSE(llama7b.shared_classifier);
  EXPECT_EQ(llama7b.seq_len, 4096);
}

TEST(HfCheckpoint, ConfigErrorsNameTheFieldAndFile) {
  const fs::path dir = fresh_dir("config_errors");
  const std::string file = (dir / "config.json").string();
  const Json good = {{"model_type", "llama"},     {"hidden_size", 48},        {"intermediate_size", 128},
                     {"num_hidden_layers", 2},    {"num_attention_heads", 6}, {"num_key_value_heads", 3},
                     {"vocab_size", 320},         {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5}};
  auto error_with = [&](const std::function<void(Json&)>& edit) {
    Json j = good;
    edit(j);
    write_bytes(dir / "config.json", j.dump());
    return config_error(dir);
  };
  EXPECT_EQ(error_with([](Json&) {}), "(no error)");
  EXPECT_EQ(error_with([](Json& j) { j["model_type"] = "gpt2"; }),
            fmt::format("Hugging Face config '{}' has model_type 'gpt2', expected 'llama' (only LLaMA checkpoints can "
                        "be loaded)",
                        file));
  EXPECT_EQ(error_with([](Json& j) { j.erase("hidden_size"); }),
            fmt::format("Hugging Face config '{}': field 'hidden_size' is missing (expected an integer)", file));
  EXPECT_EQ(error_with([](Json& j) { j["intermediate_size"] = "128"; }),
            fmt::format("Hugging Face config '{}': field 'intermediate_size' is a string, expected an integer", file));
  EXPECT_EQ(error_with([](Json& j) { j["num_hidden_layers"] = 2.5; }),
            fmt::format("Hugging Face config '{}': field 'num_hidden_layers' is a floating-point number, expected an "
                        "integer",
                        file));
  EXPECT_EQ(error_with([](Json& j) { j["rms_norm_eps"] = nullptr; }),
            fmt::format("Hugging Face config '{}': field 'rms_norm_eps' is null, expected a number", file));
  EXPECT_EQ(error_with([](Json& j) { j["tie_word_embeddings"] = 1; }),
            fmt::format("Hugging Face config '{}': field 'tie_word_embeddings' is an integer, expected true or false",
                        file));
  EXPECT_NE(error_with([](Json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; })
                .find("field 'rope_scaling' is set, which is not supported"),
            std::string::npos);
  EXPECT_NE(error_with([](Json& j) { j["hidden_act"] = "gelu"; }).find("field 'hidden_act' is 'gelu', expected 'silu'"),
            std::string::npos);
  EXPECT_NE(error_with([](Json& j) { j["head_dim"] = 16; }).find("field 'head_dim' is 16, expected hidden_size / "
                                                                  "num_attention_heads = 8"),
            std::string::npos);
  const std::string invalid = error_with([](Json& j) { j["num_attention_heads"] = 5; });
  EXPECT_NE(invalid.find(fmt::format("Hugging Face config '{}' is invalid", file)), std::string::npos) << invalid;
  EXPECT_NE(invalid.find("dim 48 is not a multiple of n_heads 5"), std::string::npos) << invalid;

  write_bytes(dir / "config.json", "{\"hidden_size\": 48,");
  EXPECT_NE(config_error(dir).find(fmt::format("Hugging Face config '{}' is not valid JSON", file)), std::string::npos)
      << config_error(dir);
  write_bytes(dir / "config.json", "[48]");
  EXPECT_EQ(config_error(dir), fmt::format("Hugging Face config '{}' is an array, expected a JSON object", file));
  fs::remove(dir / "config.json");
  EXPECT_EQ(config_error(dir), fmt::format("cannot open Hugging Face config '{}': no such file", file));
  EXPECT_EQ(config_error(dir / "nowhere"),
            fmt::format("Hugging Face checkpoint directory '{}' does not exist", (dir / "nowhere").string()));
}

TEST(HfCheckpoint, RoundTripsSingleAndShardedFiles) {
  for (bool shared : {true, false}) {
    for (int64_t files : {1, 3}) {
      Config config = Config::named("tiny");
      config.shared_classifier = shared;
      const Weights written = random_weights(config, 11);
      const fs::path dir = fresh_dir(fmt::format("roundtrip_{}_{}", shared, files));
      write_hf(dir, written, DType::kF32, files);
      EXPECT_EQ(fs::exists(dir / "model.safetensors"), files == 1);
      EXPECT_EQ(fs::exists(dir / "model.safetensors.index.json"), files > 1);
      if (files > 1) {
        const Json index = Json::parse(read_bytes(dir / "model.safetensors.index.json"));
        EXPECT_EQ(index["weight_map"].size(), 2u + 9 * 2 + (shared ? 0 : 1));
        EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], "model-00001-of-00003.safetensors");
        EXPECT_EQ(index["weight_map"]["model.norm.weight"], "model-00003-of-00003.safetensors");
        EXPECT_TRUE(fs::exists(dir / "model-00002-of-00003.safetensors"));
      } else {
        // The header is 8-byte aligned, and the data holds exactly the tensors.
        const Container c = read_container(dir / "model.safetensors");
        const int64_t floats = config.vocab_size * config.dim * (shared ? 1 : 2) + config.dim +
                               config.n_layers * (2 * config.dim + 2 * config.dim * config.dim +
                                                  2 * 24 * config.dim + 3 * config.hidden_dim * config.dim);
        EXPECT_EQ(static_cast<int64_t>(c.data.size()), 4 * floats);
        EXPECT_EQ(c.header["model.layers.1.self_attn.k_proj.weight"]["shape"], Json::array({24, 48}));
        EXPECT_EQ((fs::file_size(dir / "model.safetensors") - c.data.size()) % 8, 0u);
      }
      const Weights loaded = load_hf(dir);
      EXPECT_EQ(loaded.config.shared_classifier, shared);
      expect_loaded(testing::reference_weights(written), loaded);
    }
  }
}

TEST(HfCheckpoint, LoadsStraightIntoShards) {
  const Weights written = random_weights(Config::named("tiny"), 5);
  const fs::path dir = fresh_dir("sharded");
  write_hf(dir, written, DType::kF32, 3);
  Runtime runtime = Runtime::local(8);
  // fsdp splits the columns of wq and wk: place_tensor then asks for pieces of rows.
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 2, 4}, std::vector<int64_t>{2, 1, 4}}) {
    const ShardingPlan plan = megatron_plan(shape);
    const Weights loaded = load_hf(dir, &plan);
    ASSERT_TRUE(loaded.layers[0].wq.sharding().has_value());
    EXPECT_EQ(loaded.layers[0].wq.sharding()->to_readable(), "[{model},{fsdp}]");
    expect_loaded(testing::reference_weights(written), loaded);
  }
}

// Two rows of seven tokens: five prefilled, two decoded.
const std::vector<std::vector<int64_t>> kSequences{{1, 17, 300, 4, 99, 250, 3}, {1, 5, 6, 7, 8, 9, 10}};
constexpr int64_t kPrompt = 5;

// The model built from the loaded weights computes the reference's logits
// for the unconverted weights in Hugging Face's rotary convention.
void expect_hf_logits(Model& model, const testing::ReferenceWeights& hf) {
  std::vector<std::vector<std::vector<float>>> expected;
  for (const auto& seq : kSequences) expected.push_back(testing::reference_logits(hf, seq, /*rotate_half=*/true));
  testing::expect_steps_match(model, kSequences, kPrompt, expected);
}

TEST(HfCheckpoint, LogitsMatchTheReferenceInHuggingFaceConvention) {
  const Weights hf_layout = random_weights(Config::named("tiny"), 21);
  const testing::ReferenceWeights hf = testing::reference_weights(hf_layout);
  // The conventions differ on these weights, so matching one is meaningful.
  const auto meta_logits = testing::reference_logits(hf, kSequences[0], /*rotate_half=*/false);
  const auto half_logits = testing::reference_logits(hf, kSequences[0], /*rotate_half=*/true);
  double difference = 0;
  for (std::size_t v = 0; v < half_logits.back().size(); ++v) {
    difference = std::max(difference, std::abs(static_cast<double>(half_logits.back()[v] - meta_logits.back()[v])));
  }
  EXPECT_GT(difference, 1e-2);

  const fs::path dir = fresh_dir("logits");
  write_hf(dir, hf_layout, DType::kF32, 3);
  {
    Model model(load_hf(dir));
    expect_hf_logits(model, hf);
  }
  {
    Runtime runtime = Runtime::local(8);
    const ShardingPlan plan = megatron_plan({4, 1, 2});
    Weights loaded = load_hf(dir, &plan);
    ASSERT_TRUE(loaded.layers[1].wk.sharding().has_value());
    Model model(std::move(loaded), plan);
    expect_hf_logits(model, hf);
  }
}

TEST(HfCheckpoint, HalfPrecisionFilesHoldTheRoundedValues) {
  Weights written = random_weights(Config::named("tiny"), 8);
  // Values that exercise the edges of f16: overflow, the largest finite,
  // ties, subnormals, underflow to zero, signed zero.
  std::vector<float> special = written.norm.to_floats();
  const std::vector<float> edges{1e30f,           -1e30f,           65504.0f,         65519.0f,
                                 65520.0f,        1.0f + 0x1p-11f,  1.0f + 0x3p-11f,  0x1p-24f,
                                 0x1p-25f,        0x3p-25f,         0x1p-26f,         -0.0f,
                                 6.0e-5f,         -3.1e-6f,         0x1.fffffep-15f,  0x1.01p+0f,
                                 0x1.03p+0f,      3.0e38f,          0x1p-130f,        -7.5e-41f};
  std::copy(edges.begin(), edges.end(), special.begin());
  written.norm = Tensor::from_floats(special, {written.config.dim});
  const testing::ReferenceWeights original = testing::reference_weights(written);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    const fs::path dir = fresh_dir(std::string("half_") + std::string(dtype_name(dtype)));
    write_hf(dir, written, dtype, 2);
    EXPECT_EQ(Json::parse(read_bytes(dir / "config.json"))["torch_dtype"],
              dtype == DType::kF16 ? "float16" : "bfloat16");
    const Weights loaded = load_hf(dir);
    const testing::ReferenceWeights rounded = map_values(original, dtype == DType::kF16 ? round_f16 : round_bf16);
    expect_loaded(rounded, loaded);
    // Spot checks of the rounding itself.
    const std::vector<float> norm = loaded.norm.to_floats();
    if (dtype == DType::kF16) {
      EXPECT_EQ(norm[0], std::numeric_limits<float>::infinity());
      EXPECT_EQ(norm[2], 65504.0f);
      EXPECT_EQ(norm[3], 65504.0f);
      EXPECT_EQ(norm[4], std::numeric_limits<float>::infinity());
      EXPECT_EQ(norm[5], 1.0f);               // a tie rounds to even
      EXPECT_EQ(norm[6], 1.0f + 0x1p-9f);     // a tie rounds to even (up)
      EXPECT_EQ(norm[7], 0x1p-24f);           // the smallest subnormal
      EXPECT_EQ(norm[8], 0.0f);               // half of it: a tie, to even zero
      EXPECT_EQ(norm[9], 0x1p-23f);
      EXPECT_EQ(norm[10], 0.0f);
      EXPECT_TRUE(std::signbit(norm[11]));
    } else {
      EXPECT_EQ(norm[15], 1.0f);              // 1 + 2^-8 ties to even
      EXPECT_EQ(norm[16], 1.0f + 0x1p-6f);    // 1 + 3*2^-8 ties up to even
      EXPECT_EQ(norm[18], 0x1p-130f);         // subnormal f32, exact in bf16
    }
  }
}

TEST(HfCheckpoint, HandKnownBitPatterns) {
  const Weights written = random_weights(Config::named("tiny"), 2);
  struct Case {
    DType dtype;
    std::vector<uint16_t> bits;
    std::vector<float> values;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Case> cases{
      {DType::kF16,
       {0x3C00, 0x0001, 0x7C00, 0xFC00, 0x8000, 0x03FF, 0x0400, 0x7BFF, 0x3555, 0xC000},
       {1.0f, 0x1p-24f, inf, -inf, -0.0f, 1023 * 0x1p-24f, 0x1p-14f, 65504.0f, 0.333251953125f, -2.0f}},
      {DType::kBF16,
       {0x3F80, 0xC000, 0x7F80, 0xFF80, 0x0001, 0x8000, 0x3EAB, 0x7F7F},
       {1.0f, -2.0f, inf, -inf, 0x1p-133f, -0.0f, 0.333984375f, 0x1.fep127f}},
  };
  for (const Case& test : cases) {
    const fs::path dir = fresh_dir(std::string("bits_") + std::string(dtype_name(test.dtype)));
    write_hf(dir, written, test.dtype, 1);
    const fs::path file = dir / "model.safetensors";
    const Container c = read_container(file);
    const uint64_t begin = c.header["model.norm.weight"]["data_offsets"][0];
    std::vector<uint16_t> bits = test.bits;
    bits.push_back(test.dtype == DType::kF16 ? 0x7E00 : 0x7FC0);  // NaN
    std::string bytes = read_bytes(file);
    const std::size_t data_start = bytes.size() - c.data.size();
    std::memcpy(bytes.data() + data_start + begin, bits.data(), 2 * bits.size());
    write_bytes(file, bytes);
    const std::vector<float> norm = load_hf(dir).norm.to_floats();
    for (std::size_t i = 0; i < test.values.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(norm[i]), std::bit_cast<uint32_t>(test.values[i]))
          << dtype_name(test.dtype) << " bits " << std::hex << test.bits[i] << " gave " << norm[i];
    }
    EXPECT_TRUE(std::isnan(norm[test.values.size()]));
  }
}

TEST(HfCheckpoint, BrokenFilesGiveClearErrors) {
  Config untied = Config::named("tiny");
  untied.shared_classifier = false;
  const Weights weights = random_weights(untied, 4);
  const fs::path good = fresh_dir("good");
  write_hf(good, weights, DType::kF32, 1);
  const fs::path dir = fresh_dir("broken");
  const fs::path file = dir / "model.safetensors";
  const std::string f = file.string();
  auto reset = [&] {
    fs::copy(good, dir, fs::copy_options::overwrite_existing | fs::copy_options::recursive);
  };
  const std::string good_bytes = read_bytes(good / "model.safetensors");
  const Container good_container = read_container(good / "model.safetensors");
  const uint64_t header_bytes = good_bytes.size() - 8 - good_container.data.size();

  EXPECT_EQ(load_error(dir / "nowhere"),
            fmt::format("Hugging Face checkpoint directory '{}' does not exist", (dir / "nowhere").string()));
  reset();
  fs::remove(file);
  EXPECT_EQ(load_error(dir), fmt::format("Hugging Face checkpoint directory '{}' has neither model.safetensors nor "
                                         "model.safetensors.index.json",
                                         dir.string()));
  reset();
  fs::remove(dir / "config.json");
  EXPECT_NE(load_error(dir).find("cannot open Hugging Face config"), std::string::npos);

  reset();
  write_bytes(file, "abc");
  EXPECT_EQ(load_error(dir), fmt::format("safetensors file '{}' is too short: it has 3 bytes, the header length "
                                         "field alone needs 8",
                                         f));

  reset();
  std::string bytes = good_bytes;
  bytes[5] = 1;  // the header length becomes about 2^40
  write_bytes(file, bytes);
  EXPECT_NE(load_error(dir).find(fmt::format("safetensors file '{}': the header length {} is larger than the file "
                                             "(expected at most {},",
                                             f, header_bytes + (uint64_t{1} << 40), bytes.size() - 8)),
            std::string::npos)
      << load_error(dir);

  // A length within the file but over the limit, in a sparse file.
  reset();
  write_container(file, std::string(8, ' '), "");
  {
    std::fstream out(file, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t huge = (uint64_t{100} << 20) + 1;
    out.write(reinterpret_cast<const char*>(&huge), 8);
  }
  fs::resize_file(file, (uint64_t{100} << 20) + 100);
  EXPECT_NE(load_error(dir).find(fmt::format("the header length {} exceeds the limit of {} bytes",
                                             (uint64_t{100} << 20) + 1, uint64_t{100} << 20)),
            std::string::npos)
      << load_error(dir);

  reset();
  write_container(file, "{\"model.norm.weight\": {\"dtype\": ", good_container.data);
  EXPECT_NE(load_error(dir).find(fmt::format("safetensors file '{}' has a malformed JSON header (32 bytes): ", f)),
            std::string::npos)
      << load_error(dir);
  write_container(file, "[1, 2]", good_container.data);
  EXPECT_EQ(load_error(dir), fmt::format("safetensors file '{}': the JSON header is an array, expected an object "
                                         "mapping tensor names to entries",
                                         f));

  auto error_after = [&](const std::function<void(Json&)>& edit) {
    reset();
    edit_header(file, edit);
    return load_error(dir);
  };
  auto error_after_editing = [&](const std::function<void(Container&)>& edit) {
    reset();
    edit_container(file, edit);
    return load_error(dir);
  };
  EXPECT_EQ(error_after_editing([](Container& c) { drop_tensor(c, "model.layers.1.mlp.up_proj.weight"); }),
            fmt::format("tensor 'model.layers.1.mlp.up_proj.weight' is missing from safetensors file '{}'", f));
  EXPECT_EQ(error_after_editing([](Container& c) { drop_tensor(c, "lm_head.weight"); }),
            fmt::format("tensor 'lm_head.weight' is missing from Hugging Face checkpoint '{}' (its config has "
                        "tie_word_embeddings false, so the head is not the embedding)",
                        dir.string()));
  EXPECT_EQ(error_after([](Json& h) { h["model.layers.0.self_attn.k_proj.weight"]["shape"] = {48, 24}; }),
            fmt::format("tensor 'model.layers.0.self_attn.k_proj.weight' in safetensors file '{}' has shape [48,24], "
                        "expected [24,48]",
                        f));
  EXPECT_EQ(error_after([](Json& h) { h["model.norm.weight"]["dtype"] = "I32"; }),
            fmt::format("tensor 'model.norm.weight' in safetensors file '{}' has unsupported dtype 'I32', expected "
                        "F32, F16 or BF16",
                        f));
  // The layout rules of the safetensors library: each tensor's bytes are its
  // shape times its dtype's size, and the tensors tile the data in order.
  const uint64_t norm_begin = good_container.header["model.norm.weight"]["data_offsets"][0];
  EXPECT_EQ(error_after([&](Json& h) { h["model.norm.weight"]["data_offsets"] = {norm_begin, norm_begin + 188}; }),
            fmt::format("safetensors file '{}': tensor \"model.norm.weight\": data_offsets [{}, {}] span 188 bytes, "
                        "but shape [48] of F32 takes 192",
                        f, norm_begin, norm_begin + 188));
  EXPECT_EQ(error_after([&](Json& h) { h["model.norm.weight"]["data_offsets"] = {norm_begin - 4, norm_begin + 188}; }),
            fmt::format("safetensors file '{}': tensor \"model.norm.weight\": data_offsets [{}, {}] overlap the "
                        "tensor before it, which ends at {} (tensors must tile the data in order)",
                        f, norm_begin - 4, norm_begin + 188, norm_begin));
  EXPECT_NE(error_after([](Json& h) { h["model.norm.weight"]["dtype"] = "F7"; })
                .find("tensor \"model.norm.weight\" has the dtype \"F7\", which is not a safetensors dtype"),
            std::string::npos);
  EXPECT_EQ(error_after_editing([](Container& c) { c.data += "tail"; }),
            fmt::format("safetensors file '{}': the tensors' data ends at byte {} but the file has {} data bytes (4 "
                        "left over)",
                        f, good_container.data.size(), good_container.data.size() + 4));
  EXPECT_EQ(error_after_editing([](Container& c) {
              c.data.insert(0, 8, '\0');  // a gap before the first tensor
              for (auto& [name, entry] : c.header.items()) {
                for (auto& offset : entry["data_offsets"]) offset = offset.get<uint64_t>() + 8;
              }
            }).find("leave a gap after byte 0 (tensors must tile the data in order)") != std::string::npos,
            true);
  // A tensor the config does not use: the config does not describe the
  // file. A rotary table an exporter saved is recomputed, so it may stay.
  EXPECT_EQ(error_after_editing([](Container& c) { add_tensor(c, "model.layers.2.mlp.up_proj.weight", 3); }),
            fmt::format("Hugging Face checkpoint '{}' has 1 tensor(s) its config does not use: "
                        "\"model.layers.2.mlp.up_proj.weight\" (config.json says 2 layers, hidden_size 48, so it "
                        "does not describe these weights)",
                        dir.string()));
  EXPECT_EQ(error_after_editing([](Container& c) { add_tensor(c, "model.layers.0.self_attn.rotary_emb.inv_freq", 6); }),
            "(no error)");
  const uint64_t data_size = good_container.data.size();
  EXPECT_EQ(error_after([&](Json& h) { h["model.norm.weight"]["data_offsets"] = {data_size, data_size + 192}; }),
            fmt::format("safetensors file '{}': the header entry of tensor 'model.norm.weight': data_offsets [{}, {}] "
                        "lie outside the data (expected 0 <= begin <= end <= {}, the data's size)",
                        f, data_size, data_size + 192, data_size));
  EXPECT_NE(error_after([](Json& h) { h["model.norm.weight"]["data_offsets"] = {-4, 188}; })
                .find("has an array as 'data_offsets', expected [begin, end], two non-negative integers"),
            std::string::npos);
  EXPECT_NE(error_after([](Json& h) { h["model.norm.weight"]["shape"] = Json::array({-48}); })
                .find("has an integer in 'shape', expected non-negative integers"),
            std::string::npos);
  EXPECT_NE(error_after([](Json& h) { h["model.norm.weight"].erase("dtype"); })
                .find("header entry of tensor 'model.norm.weight' has nothing as 'dtype', expected a string"),
            std::string::npos);
  EXPECT_EQ(error_after([](Json& h) { h["__metadata__"] = {{"format", "pt"}, {"note", "ignored"}}; }), "(no error)");

  // A truncated file: the last tensors' offsets now lie past the data.
  reset();
  fs::resize_file(file, good_bytes.size() - 100);
  EXPECT_NE(load_error(dir).find("lie outside the data"), std::string::npos) << load_error(dir);

  // Sharded: a file the index names is missing, a tensor missing from the index.
  const fs::path sharded = fresh_dir("broken_sharded");
  write_hf(sharded, weights, DType::kBF16, 3);
  fs::remove(sharded / "model-00002-of-00003.safetensors");
  const std::string missing = load_error(sharded);
  const std::string index_file = (sharded / "model.safetensors.index.json").string();
  EXPECT_NE(missing.find(fmt::format("safetensors index '{}' maps tensor '", index_file)),
            std::string::npos)
      << missing;
  EXPECT_NE(missing.find(fmt::format("to '{}', which does not exist",
                                     (sharded / "model-00002-of-00003.safetensors").string())),
            std::string::npos)
      << missing;
  write_hf(sharded, weights, DType::kBF16, 3);
  Json index = Json::parse(read_bytes(sharded / "model.safetensors.index.json"));
  index["weight_map"].erase("model.layers.0.self_attn.v_proj.weight");
  write_bytes(sharded / "model.safetensors.index.json", index.dump());
  EXPECT_EQ(load_error(sharded), fmt::format("tensor 'model.layers.0.self_attn.v_proj.weight' is missing from "
                                             "safetensors index '{}'",
                                             index_file));
  index["weight_map"]["model.layers.0.self_attn.v_proj.weight"] = "../elsewhere.safetensors";
  write_bytes(sharded / "model.safetensors.index.json", index.dump());
  EXPECT_NE(load_error(sharded).find("expected a file name in the checkpoint directory"), std::string::npos);
  write_bytes(sharded / "model.safetensors.index.json", "{\"weight_map\": [1]}");
  EXPECT_NE(load_error(sharded).find("has no \"weight_map\" object"), std::string::npos);
}

TEST(HfCheckpoint, WriteChecksItsArguments) {
  const Weights weights = random_weights(Config::named("tiny"), 1);
  const fs::path dir = fresh_dir("write_errors");
  auto error = [&](DType dtype, int64_t files) {
    try {
      write_hf(dir, weights, dtype, files);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error(DType::kI64, 1), "safetensors: cannot store dtype i64; expected f32, f16 or bf16");
  EXPECT_EQ(error(DType::kF32, 0), "write_hf: num_files is 0, expected 1..20 (the number of tensors)");
  EXPECT_EQ(error(DType::kF32, 21), "write_hf: num_files is 21, expected 1..20 (the number of tensors)");
  EXPECT_EQ(error(DType::kF32, 20), "(no error)");
  EXPECT_EQ(load_error(dir), "(no error)");
}

TEST(HfCheckpoint, ArbitraryBytesNeverCrash) {
  const Weights weights = random_weights(Config::named("tiny"), 9);
  const fs::path single = fresh_dir("fuzz_single"), sharded = fresh_dir("fuzz_sharded");
  write_hf(single, weights, DType::kF16, 1);
  write_hf(sharded, weights, DType::kBF16, 2);
  const std::string model = read_bytes(single / "model.safetensors");
  const std::string config = read_bytes(single / "config.json");
  const std::string index = read_bytes(sharded / "model.safetensors.index.json");
  const uint64_t header_end = model.size() - read_container(single / "model.safetensors").data.size();
  const fs::path dir = fresh_dir("fuzz");
  std::mt19937 rng(5);
  auto mutate = [&](std::string bytes, uint64_t hot_end) {
    const int kind = static_cast<int>(rng() % 6);
    if (kind == 0) {  // random bytes
      bytes.assign(rng() % 300, '\0');
      for (char& b : bytes) b = static_cast<char>(rng());
    } else if (kind == 1) {  // truncated
      bytes.resize(rng() % (bytes.size() + 1));
    } else {  // a few bytes changed, mostly where the structure is
      const int changes = 1 + static_cast<int>(rng() % 6);
      for (int i = 0; i < changes && !bytes.empty(); ++i) {
        const uint64_t limit = kind == 5 ? bytes.size() : std::min<uint64_t>(hot_end, bytes.size());
        const std::size_t at = rng() % limit;
        const char choices[] = "0123456789-[]{}\",: .eE";
        bytes[at] = rng() % 2 ? static_cast<char>(rng()) : choices[rng() % (sizeof(choices) - 1)];
      }
    }
    return bytes;
  };
  int loaded = 0;
  for (int trial = 0; trial < 400; ++trial) {
    fs::remove_all(dir);
    const int target = trial % 8;
    if (target < 6) {  // the single file's header, data or length
      fs::create_directories(dir);
      write_bytes(dir / "config.json", config);
      write_bytes(dir / "model.safetensors", mutate(model, header_end));
    } else if (target == 6) {  // the config
      fs::copy(single, dir, fs::copy_options::recursive);
      write_bytes(dir / "config.json", mutate(config, config.size()));
    } else {  // the index
      fs::copy(sharded, dir, fs::copy_options::recursive);
      write_bytes(dir / "model.safetensors.index.json", mutate(index, index.size()));
    }
    try {
      load_hf(dir);
      ++loaded;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(loaded, 0);  // some mutations only touch the data or harmless bytes
}

}  // namespace
}  // namespace shardflow::llama
