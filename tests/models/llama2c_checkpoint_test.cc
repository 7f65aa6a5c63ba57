// llama2.c checkpoints: round trips through the file, loading straight into
// shards, and the errors of broken files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cstring>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "models/llama_reference.h"
#include "shardflow/base/error.h"
#include "shardflow/models/checkpoint.h"
#include "shardflow/runtime/runtime.h"

namespace shardflow::llama {
namespace {

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::path(::testing::TempDir()) / name;
}

void expect_same_values(const Weights& a, const Weights& b) {
  const testing::ReferenceWeights x = testing::reference_weights(a), y = testing::reference_weights(b);
  EXPECT_EQ(x.tok_embeddings, y.tok_embeddings);
  EXPECT_EQ(x.norm, y.norm);
  EXPECT_EQ(x.output, y.output);
  ASSERT_EQ(x.layers.size(), y.layers.size());
  for (std::size_t l = 0; l < x.layers.size(); ++l) {
    EXPECT_EQ(x.layers[l].wq, y.layers[l].wq);
    EXPECT_EQ(x.layers[l].wk, y.layers[l].wk);
    EXPECT_EQ(x.layers[l].wv, y.layers[l].wv);
    EXPECT_EQ(x.layers[l].wo, y.layers[l].wo);
    EXPECT_EQ(x.layers[l].w1, y.layers[l].w1);
    EXPECT_EQ(x.layers[l].w2, y.layers[l].w2);
    EXPECT_EQ(x.layers[l].w3, y.layers[l].w3);
    EXPECT_EQ(x.layers[l].attention_norm, y.layers[l].attention_norm);
    EXPECT_EQ(x.layers[l].ffn_norm, y.layers[l].ffn_norm);
  }
}

std::string load_error(const std::filesystem::path& path) {
  try {
    load_llama2c(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Llama2cCheckpoint, RoundTripsTiedAndUntied) {
  for (bool shared : {true, false}) {
    Config config = Config::named("tiny");
    config.shared_classifier = shared;
    const Weights written = random_weights(config, 11);
    const auto path = temp_file(shared ? "tied.bin" : "untied.bin");
    write_llama2c(path, written);
    const int64_t expected_floats =
        config.vocab_size * config.dim * (shared ? 1 : 2) + config.dim +
        config.n_layers * (2 * config.dim + 2 * config.dim * config.dim + 2 * 24 * config.dim +
                           3 * config.hidden_dim * config.dim) +
        config.seq_len * config.head_dim();
    EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(path)), 28 + 4 * expected_floats);
    const Config header = read_llama2c_config(path);
    EXPECT_EQ(header.dim, config.dim);
    EXPECT_EQ(header.n_kv_heads, config.n_kv_heads);
    EXPECT_EQ(header.shared_classifier, shared);
    expect_same_values(written, load_llama2c(path));
  }
}

TEST(Llama2cCheckpoint, LoadsStraightIntoShards) {
  const Weights written = random_weights(Config::named("tiny"), 5);
  const auto path = temp_file("sharded.bin");
  write_llama2c(path, written);
  Runtime runtime = Runtime::local(8);
  std::vector<int64_t> ids(8);
  std::iota(ids.begin(), ids.end(), 0);
  const ShardingPlan plan = ShardingPlan::megatron(
      std::make_shared<const Mesh>(ids, std::vector<int64_t>{2, 1, 4}, std::vector<std::string>{"data", "fsdp", "model"}));
  const Weights loaded = load_llama2c(path, &plan);
  ASSERT_TRUE(loaded.layers[0].wq.sharding().has_value());
  EXPECT_EQ(loaded.layers[0].wq.sharding()->to_readable(), "[{model},{fsdp}]");
  EXPECT_EQ(loaded.layers[1].w2.local_shards()[1].data.shape(), (Shape{48, 32}));
  expect_same_values(written, loaded);
}

TEST(Llama2cCheckpoint, BrokenFilesGiveClearErrors) {
  const Weights written = random_weights(Config::named("tiny"), 5);
  const auto good = temp_file("good.bin");
  write_llama2c(good, written);
  const auto size = std::filesystem::file_size(good);

  EXPECT_NE(load_error(temp_file("missing.bin")).find("cannot open llama2.c checkpoint"), std::string::npos);

  const auto truncated = temp_file("truncated.bin");
  std::filesystem::copy_file(good, truncated, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(truncated, size - 1000);
  const std::string cut = load_error(truncated);
  EXPECT_NE(cut.find(fmt::format("expected {} bytes, found {}", size, size - 1000)), std::string::npos) << cut;
  EXPECT_NE(cut.find("the file ends in 'rope_sin'"), std::string::npos) << cut;

  std::filesystem::resize_file(truncated, 100000);
  EXPECT_NE(load_error(truncated).find("the file ends in 'wo'"), std::string::npos) << load_error(truncated);

  std::filesystem::resize_file(truncated, 10);
  EXPECT_NE(load_error(truncated).find("the header needs 28 bytes, the file has 10"), std::string::npos);

  const auto longer = temp_file("longer.bin");
  std::filesystem::copy_file(good, longer, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(longer, size + 8);
  EXPECT_NE(load_error(longer).find("extra data after the last tensor"), std::string::npos) << load_error(longer);

  // A header whose fields break the config rules: n_heads 5 does not divide dim 48.
  const auto bad_header = temp_file("bad_header.bin");
  std::filesystem::copy_file(good, bad_header, std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream f(bad_header, std::ios::in | std::ios::out | std::ios::binary);
    const int32_t heads = 5;
    f.seekp(12);
    f.write(reinterpret_cast<const char*>(&heads), 4);
  }
  const std::string header_error = load_error(bad_header);
  EXPECT_NE(header_error.find("invalid header"), std::string::npos) << header_error;
  EXPECT_NE(header_error.find("dim 48 is not a multiple of n_heads 5"), std::string::npos) << header_error;
}

TEST(Llama2cCheckpoint, ArbitraryBytesNeverCrash) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<char> bytes(rng() % 200);
    for (char& b : bytes) b = static_cast<char>(rng());
    if (trial % 3 == 0 && bytes.size() >= 28) {  // plausible small headers, garbage sizes
      const int32_t header[7] = {static_cast<int32_t>(rng() % 64), static_cast<int32_t>(rng() % 64), 1,
                                 static_cast<int32_t>(rng() % 4 + 1), 1, static_cast<int32_t>(rng() % 20) - 10, 4};
      std::memcpy(bytes.data(), header, sizeof(header));
    }
    const auto path = temp_file("fuzz.bin");
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    try {
      load_llama2c(path);
    } catch (const Error&) {
    }
  }
}

}  // namespace
}  // namespace shardflow::llama
