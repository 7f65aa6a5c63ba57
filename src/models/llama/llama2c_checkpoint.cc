// llama2.c checkpoint files (see checkpoint.h for the layout).
#include <fmt/format.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "placement.h"
#include "shardflow/base/error.h"
#include "shardflow/models/checkpoint.h"

namespace shardflow::llama {

namespace {

constexpr int64_t kHeaderBytes = 7 * 4;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_file(const std::filesystem::path& path, const char* mode) {
  File file(std::fopen(path.c_str(), mode));
  if (!file) throw Error(fmt::format("cannot open llama2.c checkpoint '{}': {}", path.string(), std::strerror(errno)));
  return file;
}

int32_t little_endian_i32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

Config parse_header(std::FILE* file, const std::filesystem::path& path) {
  std::array<unsigned char, kHeaderBytes> header{};
  const std::size_t got = std::fread(header.data(), 1, header.size(), file);
  if (got >= 4 && little_endian_i32(header.data()) == 0x616b3432) {
    throw Error(
        fmt::format("'{}' is a llama2.c checkpoint of a later export version (magic \"ak42\"); "
                    "only the legacy version-0 format (export with --version 0) is supported",
                    path.string()));
  }
  if (got < header.size()) {
    throw Error(fmt::format("llama2.c checkpoint '{}' is truncated: the header needs {} bytes, the file has {}",
                            path.string(), kHeaderBytes, got));
  }
  int32_t fields[7];
  for (int i = 0; i < 7; ++i) fields[i] = little_endian_i32(header.data() + 4 * i);
  Config c;
  c.name = path.filename().string();
  c.dim = fields[0];
  c.hidden_dim = fields[1];
  c.n_layers = fields[2];
  c.n_heads = fields[3];
  c.n_kv_heads = fields[4];
  c.shared_classifier = fields[5] > 0;
  c.vocab_size = std::abs(static_cast<int64_t>(fields[5]));
  c.seq_len = fields[6];
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(fmt::format("llama2.c checkpoint '{}' has an invalid header: {}", path.string(), e.what()));
  }
  return c;
}

// One tensor of the file: where it starts and its shape (per layer for
// stacked tensors).
struct Entry {
  const char* name;
  int64_t offset;  // bytes from the start of the file
  Shape shape;     // of one layer's slice when stacked
  int64_t layers;  // 1 when not stacked
  int64_t bytes() const { return numel(shape) * layers * 4; }
};

struct FileLayout {
  std::vector<Entry> entries;
  int64_t total_bytes = kHeaderBytes;
  const Entry& at(const char* name) const {
    for (const Entry& e : entries) {
      if (std::strcmp(e.name, name) == 0) return e;
    }
    throw Error(std::string("internal: no llama2.c entry ") + name);
  }
};

FileLayout file_layout(const Config& c) {
  const int64_t hd = c.head_dim(), q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd, L = c.n_layers;
  FileLayout f;
  auto add = [&](const char* name, Shape shape, int64_t layers) {
    f.entries.push_back({name, f.total_bytes, std::move(shape), layers});
    f.total_bytes += f.entries.back().bytes();
  };
  add("token_embedding", {c.vocab_size, c.dim}, 1);
  add("attention_norm", {c.dim}, L);
  add("wq", {q_dim, c.dim}, L);
  add("wk", {kv_dim, c.dim}, L);
  add("wv", {kv_dim, c.dim}, L);
  add("wo", {c.dim, q_dim}, L);
  add("ffn_norm", {c.dim}, L);
  add("w1", {c.hidden_dim, c.dim}, L);
  add("w2", {c.dim, c.hidden_dim}, L);
  add("w3", {c.hidden_dim, c.dim}, L);
  add("final_norm", {c.dim}, 1);
  add("rope_cos", {c.seq_len, hd / 2}, 1);
  add("rope_sin", {c.seq_len, hd / 2}, 1);
  if (!c.shared_classifier) add("classifier", {c.vocab_size, c.dim}, 1);
  return f;
}

int64_t file_size(std::FILE* file) {
  if (std::fseek(file, 0, SEEK_END) != 0) return -1;
  return static_cast<int64_t>(std::ftell(file));
}

}  // namespace

Config read_llama2c_config(const std::filesystem::path& path) {
  File file = open_file(path, "rb");
  return parse_header(file.get(), path);
}

Weights load_llama2c(const std::filesystem::path& path, const ShardingPlan* plan) {
  if (plan != nullptr) plan->check();
  File file = open_file(path, "rb");
  const Config config = parse_header(file.get(), path);
  const FileLayout layout = file_layout(config);
  const int64_t size = file_size(file.get());
  if (size != layout.total_bytes) {
    std::string where = "after the last tensor";
    for (const Entry& e : layout.entries) {
      if (size < e.offset + e.bytes()) {
        where = fmt::format("in '{}' (bytes {}..{})", e.name, e.offset, e.offset + e.bytes());
        break;
      }
    }
    throw Error(
        fmt::format("llama2.c checkpoint '{}' does not match its header ({}): expected {} bytes, found {} "
                    "({} {})",
                    path.string(), config.to_string(), layout.total_bytes, size,
                    size < layout.total_bytes ? "the file ends" : "extra data", where));
  }
  std::FILE* raw = file.get();
  auto load = [&](const char* name, int64_t layer, const std::string& role) {
    const Entry& e = layout.at(name);
    const int64_t base = e.offset + layer * numel(e.shape) * 4;
    ElementSource source = [raw, base, name, &path](int64_t offset, int64_t count, float* dst) {
      if (std::fseek(raw, static_cast<long>(base + offset * 4), SEEK_SET) != 0 ||
          std::fread(dst, 4, static_cast<std::size_t>(count), raw) != static_cast<std::size_t>(count)) {
        throw Error(fmt::format("cannot read '{}' from llama2.c checkpoint '{}'", name, path.string()));
      }
      // The format is little-endian f32, as this machine is (checked at build).
    };
    return place_tensor(e.shape, source, plan, role);
  };
  static_assert(std::endian::native == std::endian::little, "llama2.c files are read as native f32");
  Weights w;
  w.config = config;
  w.tok_embeddings = load("token_embedding", 0, "tok_embeddings");
  for (int64_t l = 0; l < config.n_layers; ++l) {
    LayerWeights layer;
    layer.attention_norm = load("attention_norm", l, "attention_norm");
    layer.wq = load("wq", l, "wq");
    layer.wk = load("wk", l, "wk");
    layer.wv = load("wv", l, "wv");
    layer.wo = load("wo", l, "wo");
    layer.ffn_norm = load("ffn_norm", l, "ffn_norm");
    layer.w1 = load("w1", l, "w1");
    layer.w2 = load("w2", l, "w2");
    layer.w3 = load("w3", l, "w3");
    w.layers.push_back(std::move(layer));
  }
  w.norm = load("final_norm", 0, "norm");
  // A tied head is the embedding, or read again where its layout differs.
  if (config.shared_classifier && tied_head_shares_embedding(plan)) {
    w.output = w.tok_embeddings;
  } else {
    w.output = load(config.shared_classifier ? "token_embedding" : "classifier", 0, "output");
  }
  return w;
}

void write_llama2c(const std::filesystem::path& path, const Weights& weights) {
  const Config& c = weights.config;
  c.validate();
  File file = open_file(path, "wb");
  const int32_t header[7] = {
      static_cast<int32_t>(c.dim),        static_cast<int32_t>(c.hidden_dim),
      static_cast<int32_t>(c.n_layers),   static_cast<int32_t>(c.n_heads),
      static_cast<int32_t>(c.n_kv_heads), static_cast<int32_t>(c.shared_classifier ? c.vocab_size : -c.vocab_size),
      static_cast<int32_t>(c.seq_len)};
  auto put = [&](std::span<const float> values) {
    if (std::fwrite(values.data(), 4, values.size(), file.get()) != values.size()) {
      throw Error(fmt::format("cannot write llama2.c checkpoint '{}'", path.string()));
    }
  };
  if (std::fwrite(header, 4, 7, file.get()) != 7) throw Error(fmt::format("cannot write '{}'", path.string()));
  put(weights.tok_embeddings.to_floats());
  auto per_layer = [&](Tensor LayerWeights::*member) {
    for (const LayerWeights& l : weights.layers) put((l.*member).to_floats());
  };
  per_layer(&LayerWeights::attention_norm);
  per_layer(&LayerWeights::wq);
  per_layer(&LayerWeights::wk);
  per_layer(&LayerWeights::wv);
  per_layer(&LayerWeights::wo);
  per_layer(&LayerWeights::ffn_norm);
  per_layer(&LayerWeights::w1);
  per_layer(&LayerWeights::w2);
  per_layer(&LayerWeights::w3);
  put(weights.norm.to_floats());
  const int64_t half = c.head_dim() / 2;
  std::vector<float> cos_values, sin_values;  // the legacy tables, for readers that still expect them
  for (int64_t pos = 0; pos < c.seq_len; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) *
                           std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim()));
      cos_values.push_back(static_cast<float>(std::cos(angle)));
      sin_values.push_back(static_cast<float>(std::sin(angle)));
    }
  }
  put(cos_values);
  put(sin_values);
  if (!c.shared_classifier) put(weights.output.to_floats());
  if (std::fflush(file.get()) != 0) throw Error(fmt::format("cannot write llama2.c checkpoint '{}'", path.string()));
}

}  // namespace shardflow::llama
