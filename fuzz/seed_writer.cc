// Writes the seeds of the binary and generated corpora with shardflow's own
// writers (write_llama2c, write_hf, Tokenizer::write), plus broken variants
// of each; the text corpora (IR, HloSharding, literals, ...) are written by
// hand. Usage: fuzz_seed_writer <fuzz/corpus directory>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model_fixture.h"
#include "shardflow/base/error.h"
#include "shardflow/models/checkpoint.h"
#include "shardflow/models/tokenizer.h"
#include "shardflow/shardflow.h"

namespace fs = std::filesystem;
namespace llama = shardflow::llama;
using Json = nlohmann::ordered_json;

namespace {

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw shardflow::Error("cannot write " + path.string());
}

void put_u32(std::string& bytes, std::size_t at, uint32_t value) {
  for (std::size_t k = 0; k < 4; ++k) bytes[at + k] = static_cast<char>(value >> (8 * k));
}

// A safetensors file split into its 8-byte length, JSON header and data.
struct Container {
  Json header;
  std::string data;
};

Container split(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  return {Json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

std::string join(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (std::size_t i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  return out + header + data;
}

void llama2c_seeds(const fs::path& out, const fs::path& tmp) {
  const fs::path dir = out / "llama2c_checkpoint";
  for (const bool tied : {true, false}) {
    const fs::path file = tmp / "model.bin";
    llama::write_llama2c(file, llama::random_weights(shardflow_fuzz::fixture_config(tied), 3));
    const std::string valid = read(file);
    const std::string name = tied ? "valid_shared" : "valid_separate_classifier";
    write(dir / (name + ".bin"), valid);
    if (!tied) continue;
    write(dir / "truncated_in_tensor.bin", valid.substr(0, valid.size() - 6));
    write(dir / "extra_bytes.bin", valid + std::string(4, '\0'));
    write(dir / "header_only.bin", valid.substr(0, 28));
    write(dir / "short_header.bin", valid.substr(0, 17));
    std::string odd_head = valid;
    put_u32(odd_head, 0, 6);  // dim 6 on 2 heads: head dim 3, odd
    write(dir / "odd_head_dim.bin", odd_head);
    std::string huge = valid.substr(0, 28);
    put_u32(huge, 0, 1 << 16);
    put_u32(huge, 4, 1 << 18);
    put_u32(huge, 8, 1024);
    put_u32(huge, 12, 1024);
    put_u32(huge, 16, 1024);
    put_u32(huge, 20, 1 << 22);
    put_u32(huge, 24, 1 << 20);
    write(dir / "largest_valid_header.bin", huge);
    write(dir / "magic_ak42.bin", "ak42" + valid.substr(4, 60));
  }
}

void safetensors_seeds(const fs::path& out, const fs::path& tmp) {
  const fs::path dir = out / "safetensors";
  const std::pair<shardflow::DType, const char*> dtypes[] = {
      {shardflow::DType::kF32, "f32"}, {shardflow::DType::kF16, "f16"}, {shardflow::DType::kBF16, "bf16"}};
  for (const auto& [dtype, name] : dtypes) {
    const fs::path d = tmp / fmt::format("st_{}", name);
    fs::remove_all(d);
    shardflow_fuzz::write_fixture(d, 1, dtype);
    write(dir / fmt::format("valid_{}.safetensors", name), read(d / "model.safetensors"));
  }
  const std::string valid = read(dir / "valid_f32.safetensors");
  Container c = split(valid);
  write(dir / "empty_header.safetensors", join("{}", ""));
  write(dir / "header_longer_than_file.safetensors", valid.substr(0, 8) + "{}");
  write(dir / "not_json.safetensors", join("{\"a\":", ""));
  write(dir / "header_array.safetensors", join("[1,2]", ""));
  {
    Container bad = c;
    bad.header["model.norm.weight"]["data_offsets"] = Json::array({0, 1u << 30});
    write(dir / "offsets_outside.safetensors", join(bad.header.dump(), bad.data));
  }
  {
    Container bad = c;
    bad.header["model.norm.weight"]["dtype"] = "I64";
    write(dir / "dtype_i64.safetensors", join(bad.header.dump(), bad.data));
  }
  {
    Container bad = c;
    bad.header["model.norm.weight"]["shape"] = Json::array({2, 2});
    write(dir / "wrong_shape.safetensors", join(bad.header.dump(), bad.data));
  }
  {
    Container bad = c;
    bad.header["model.layers.1.mlp.up_proj.weight"] = {
        {"dtype", "F32"}, {"shape", Json::array({0})}, {"data_offsets", Json::array({c.data.size(), c.data.size()})}};
    write(dir / "unused_tensor.safetensors", join(bad.header.dump(), bad.data));
  }
  {
    Container bad = c;
    bad.header.erase("model.norm.weight");
    write(dir / "missing_tensor.safetensors", join(bad.header.dump(), bad.data));
  }
  write(dir / "trailing_data.safetensors", join(c.header.dump(), c.data + "xxxx"));
}

void safetensors_index_seeds(const fs::path& out, const fs::path& tmp) {
  const fs::path dir = out / "safetensors_index";
  const fs::path d = tmp / "index";
  fs::remove_all(d);
  shardflow_fuzz::write_fixture(d, 2);
  const std::string valid = read(d / "model.safetensors.index.json");
  write(dir / "valid.json", valid);
  Json index = Json::parse(valid);
  {
    Json bad = index;
    bad["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";  // the wrong file
    write(dir / "tensor_in_wrong_file.json", bad.dump(1));
  }
  {
    Json bad = index;
    bad["weight_map"]["model.norm.weight"] = "missing.safetensors";
    write(dir / "missing_file.json", bad.dump(1));
  }
  {
    Json bad = index;
    bad["weight_map"]["model.norm.weight"] = "../config.json";
    write(dir / "path_outside.json", bad.dump(1));
  }
  {
    Json bad = index;
    bad["weight_map"]["model.norm.weight"] = "config.json";
    write(dir / "not_safetensors.json", bad.dump(1));
  }
  {
    Json bad = index;
    bad["weight_map"]["model.norm.weight"] = 3;
    write(dir / "file_not_string.json", bad.dump(1));
  }
  {
    Json bad = index;
    bad["weight_map"].erase("model.norm.weight");
    write(dir / "tensor_not_mapped.json", bad.dump(1));
  }
  write(dir / "no_weight_map.json", "{\"metadata\": {\"total_size\": 0}}");
  write(dir / "array.json", "[]");
}

void hf_config_seeds(const fs::path& out, const fs::path& tmp) {
  const fs::path dir = out / "hf_config";
  const fs::path d = tmp / "config";
  fs::remove_all(d);
  shardflow_fuzz::write_fixture(d, 1, shardflow::DType::kBF16, /*tied=*/false);
  const std::string valid = read(d / "config.json");
  write(dir / "valid.json", valid);
  const Json config = Json::parse(valid);
  auto variant = [&](const std::string& name, auto&& edit) {
    Json c = config;
    edit(c);
    write(dir / (name + ".json"), c.dump(1));
  };
  variant("minimal", [](Json& c) {
    for (const char* key : {"architectures", "model_type", "num_key_value_heads", "rope_theta", "tie_word_embeddings",
                            "hidden_act", "torch_dtype"}) {
      c.erase(key);
    }
  });
  variant("head_dim", [](Json& c) { c["head_dim"] = 2; });
  variant("wrong_head_dim", [](Json& c) { c["head_dim"] = 3; });
  variant("rope_scaling", [](Json& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; });
  variant("mistral", [](Json& c) { c["model_type"] = "mistral"; });
  variant("gelu", [](Json& c) { c["hidden_act"] = "gelu"; });
  variant("bias", [](Json& c) { c["attention_bias"] = true; });
  variant("nulls", [](Json& c) {
    c["num_key_value_heads"] = nullptr;
    c["rope_theta"] = nullptr;
  });
  variant("float_size", [](Json& c) { c["hidden_size"] = 4.0; });
  variant("huge_size", [](Json& c) { c["hidden_size"] = std::numeric_limits<uint64_t>::max(); });
  variant("negative_heads", [](Json& c) { c["num_attention_heads"] = -2; });
  variant("zero_eps", [](Json& c) { c["rms_norm_eps"] = 0; });
  write(dir / "array.json", "[1, 2]");
}

void tokenizer_bin_seeds(const fs::path& out, const fs::path& tmp) {
  const fs::path dir = out / "tokenizer_bin";
  std::vector<std::string> tokens = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) tokens.push_back(fmt::format("<0x{:02X}>", b));
  std::vector<float> scores(tokens.size(), 0.0f);
  const std::vector<std::string> pieces = {" ",  "e",  "l",      "o",        "h",         "w",      "r",
                                           "d",  "he", "ll",     "llo",      " h",        " hello", " w",
                                           "or", "ld", " world", "\xC3\xA9", "h\xC3\xA9", "12"};
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    tokens.push_back(pieces[i]);
    scores.push_back(-static_cast<float>(i));
  }
  const fs::path file = tmp / "tokenizer.bin";
  llama::Tokenizer::write(file, tokens, scores);
  const std::string valid = read(file);
  write(dir / "valid.bin", valid);
  {
    std::vector<std::string> t(tokens.begin(), tokens.begin() + 259);
    llama::Tokenizer::write(file, t, std::vector<float>(259, 0.0f));
    write(dir / "bytes_only.bin", read(file));
  }
  {
    std::vector<float> s = scores;
    s.back() = std::nanf("");
    llama::Tokenizer::write(file, tokens, s);
    write(dir / "nan_score.bin", read(file));
  }
  {
    std::vector<std::string> t = tokens;
    t[3 + 65] = "A";  // not the byte token <0x41>
    llama::Tokenizer::write(file, t, scores);
    write(dir / "byte_token_wrong.bin", read(file));
  }
  write(dir / "truncated.bin", valid.substr(0, valid.size() - 3));
  write(dir / "partial_record_left.bin", valid + std::string("\0\0\0\0\x05", 5));
  std::string negative_max = valid;
  put_u32(negative_max, 0, 0xFFFFFFFFu);
  write(dir / "negative_max_length.bin", negative_max);
  write(dir / "tiny.bin", std::string("\x01\0\0", 3));
}

Json special(int64_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

// LLaMA 2's layout (as tests/models/llama_tokenizer_json.h), with `pieces`
// ("▁" for spaces) from id 259 and ranked `merges`.
Json llama_style(const std::vector<std::string>& pieces, const std::vector<std::string>& merges) {
  Json vocab = Json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  for (std::size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = 259 + i;
  const char* meta = "\xE2\x96\x81";
  return {
      {"version", "1.0"},
      {"added_tokens", Json::array({special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", Json::array({{{"type", "Prepend"}, {"prepend", meta}},
                                     {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", meta}}})}}},
      {"pre_tokenizer", nullptr},
      {"decoder", {{"type", "Sequence"}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", merges}}},
  };
}

void tokenizer_json_seeds(const fs::path& out) {
  const fs::path dir = out / "tokenizer_json";
  const std::string m = "\xE2\x96\x81";
  const std::vector<std::string> pieces = {m,    "h",  "e",   "l",     "o",        "w",     "r",
                                           "d",  "he", "ll",  "llo",   "hello",    m + "h", m + "hello",
                                           "or", "ld", "wor", "world", m + "world"};
  const std::vector<std::string> merges = {"h e", "l l", "ll o", "he llo", m + " h",    m + " hello",
                                           "o r", "l d", "w or", "wor ld", m + " world"};
  const Json base = llama_style(pieces, merges);
  write(dir / "llama2_prepend.json", base.dump());
  {
    Json t = base;
    t["normalizer"] = nullptr;
    t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "first"}, {"split", false}};
    write(dir / "metaspace_first.json", t.dump(1));
  }
  {
    Json t = base;
    t["normalizer"] = nullptr;
    t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", m}, {"add_prefix_space", true}};
    write(dir / "metaspace_legacy.json", t.dump());
  }
  {
    Json t = base;
    Json array_merges = Json::array();
    for (const std::string& merge : merges) {
      const std::size_t space = merge.find(' ');
      array_merges.push_back(Json::array({merge.substr(0, space), merge.substr(space + 1)}));
    }
    t["model"]["merges"] = array_merges;
    t["added_tokens"].push_back({{"id", 278},
                                 {"content", "<|end|>"},
                                 {"lstrip", true},
                                 {"rstrip", true},
                                 {"normalized", true},
                                 {"special", false}});
    t["model"]["vocab"]["<|end|>"] = 278;
    write(dir / "array_merges_added_token.json", t.dump());
  }
  {
    Json t = base;
    t["model"]["byte_fallback"] = false;
    write(dir / "no_byte_fallback.json", t.dump());
  }
  {
    Json t = base;
    t["pre_tokenizer"] = {{"type", "ByteLevel"}};
    write(dir / "byte_level.json", t.dump());
  }
  {
    Json t = base;
    t["model"]["merges"].push_back("x y");
    write(dir / "merge_not_in_vocab.json", t.dump());
  }
  write(dir / "not_json.json", "{\"model\": ");
}

// IR text printed from traced programs: a decoder block touching most op
// families (with an annotation), and a graph with indexing and creation ops.
void ir_text_seeds(const fs::path& out) {
  namespace sf = shardflow;
  const fs::path dir = out / "ir_text";
  const sf::Mesh mesh({0, 1, 2, 3}, {2, 2}, {"data", "model"});
  const sf::Tensor wq = sf::randn({8, 8}, 1), wk = sf::randn({4, 8}, 2), norm = sf::ones({8});
  auto block = sf::compile([&](sf::Tensor x) {
    sf::Tensor h = sf::rms_norm(x, {8}, norm, 1e-5);
    h = sf::mark_sharding(h, mesh, {"data", sf::none, sf::none});
    const sf::Tensor q = sf::transpose(sf::reshape(sf::linear(h, wq), {2, 3, 2, 4}), 1, 2);
    const sf::Tensor k = sf::transpose(sf::reshape(sf::linear(h, wk), {2, 3, 1, 4}), 1, 2);
    const sf::Tensor kk = sf::expand(k, {2, 2, 3, 4});
    sf::Tensor a = sf::scaled_dot_product_attention(q, kk, kk, std::nullopt, true);
    a = sf::reshape(sf::transpose(a, 1, 2), {2, 3, 8});
    sf::Tensor y = sf::add(x, sf::silu(a) * sf::sigmoid(a), 0.5);
    return sf::softmax(sf::gelu(y, "tanh"), -1);
  });
  write(dir / "traced_block.ir", sf::print_graph(block.trace(sf::randn({2, 3, 8}, 3))));
  const sf::Tensor table = sf::randn({10, 4}, 4);
  auto indexing = sf::compile([&](sf::Tensor tokens) {
    const sf::Tensor e = sf::embedding(table, tokens);
    const sf::Tensor s = sf::sum(e, {-1}, true);
    const sf::Tensor c = sf::cat({e, sf::log_softmax(e, 2)}, 2);
    const sf::Tensor t = sf::tril(sf::select(c, 0, 1));
    const sf::Tensor w = sf::where(sf::gt(s, sf::zeros({})), s, sf::neg(s));
    return std::vector<sf::Tensor>{sf::slice(t, 1, 0, 4, 2), sf::argmax(sf::flatten(w)),
                                   sf::stack({sf::amax(e, {0}), sf::mean(e, {0})}, 1),
                                   sf::index_select(e, 1, sf::arange(2))};
  });
  const sf::Tensor tokens = sf::Tensor(sf::DenseTensor::zeros(sf::DType::kI64, {2, 3}));
  write(dir / "traced_indexing.ir", sf::print_graph(indexing.trace(tokens)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <fuzz/corpus directory>\n", argv[0]);
    return 2;
  }
  try {
    const fs::path out = argv[1];
    const fs::path tmp = fs::temp_directory_path() / fmt::format("shardflow-fuzz-seeds-{}", ::getpid());
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    llama2c_seeds(out, tmp);
    safetensors_seeds(out, tmp);
    safetensors_index_seeds(out, tmp);
    hf_config_seeds(out, tmp);
    tokenizer_bin_seeds(out, tmp);
    tokenizer_json_seeds(out);
    ir_text_seeds(out);
    fs::remove_all(tmp);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
