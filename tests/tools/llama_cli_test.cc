// The `shardflow llama` contract that scripts rely on.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "shardflow/models/checkpoint.h"
#include "models/llama_tokenizer_json.h"
#include "shardflow/models/tokenizer.h"
#include "tools/cli_runner.h"

namespace {

using json = nlohmann::ordered_json;  // keeps the key order

TEST(LlamaCli, JsonContractAndCheck) {
  const CliResult r = run_cli("llama --config tiny --mesh 4,1,2 --prompt-ids 1,7,9 --steps 6 --check --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json out = json::parse(r.out);
  ASSERT_EQ(out["tokens"].size(), 4u);  // --batch defaults to the 'data' axis
  for (const auto& row : out["tokens"]) EXPECT_EQ(row.size(), 6u);  // generated tokens only
  EXPECT_EQ(out["tokens"][0], out["tokens"][3]);                    // greedy, same prompt
  EXPECT_EQ(out["text"].size(), 4u);
  EXPECT_GT(out["prefill_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(out["decode_tokens_per_s"].get<double>(), 0);
  EXPECT_GE(out["compile_ms"].get<double>(), 0);
  EXPECT_EQ(out["traces"], 2);
  EXPECT_EQ(out["cache_hits"], 6);  // both traced ahead of time, then 1 prefill + 5 decode calls
  // Block outputs sharded over 'model': each sublayer reduce-scatters its
  // output (tiny's 3 key/value heads do not split over 2, so it also
  // gathers), and no weight moves.
  EXPECT_EQ(out["collectives_per_decode_step"]["reduce-scatter"].get<int>(), 4);
  EXPECT_GE(out["collectives_per_decode_step"]["all-gather"].get<int>(), 4);
  EXPECT_FALSE(out["collectives_per_decode_step"].contains("all-to-all"));
  EXPECT_LT(out["max_abs_logit_diff"].get<double>(), 1e-2);
  // The cache holds what the run writes (3 prompt tokens + 6 steps - 1), not tiny's 64 positions.
  EXPECT_EQ(out["cache_positions"], 8);
  const std::vector<std::string> keys{"tokens",     "text",        "prefill_tokens_per_s",
                                      "decode_tokens_per_s", "compile_ms", "cache_positions",
                                      "traces",     "cache_hits",  "collectives_per_decode_step",
                                      "max_abs_logit_diff"};
  std::vector<std::string> got;
  for (const auto& [key, value] : out.items()) got.push_back(key);
  EXPECT_EQ(got, keys);
}

TEST(LlamaCli, TextReportsSpeedsAndCollectivesWithReasons) {
  const CliResult r = run_cli("llama --config tiny --devices 2 --prompt-ids 1,2 --steps 3");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("mesh (1, 1, 2) over (data, fsdp, model), batch 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
  EXPECT_NE(r.out.find("reduce-scatter over 'model'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("contracts dim"), std::string::npos) << r.out;
}

// --profile: per op kind, per call, on the first device. Its counts are the
// program's: 7 matrix products per layer and the head, and the collectives
// the report lists.
TEST(LlamaCli, ProfileCountsTheProgramsOpsAndCollectives) {
  const CliResult r = run_cli("llama --config tiny --mesh 4,1,2 --prompt-ids 1,7,9 --steps 4 --profile --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json out = json::parse(r.out);
  ASSERT_TRUE(out.contains("profile")) << r.out;
  const json& profile = out["profile"];
  EXPECT_EQ(profile["prefill"]["calls"], 1);
  EXPECT_EQ(profile["decode"]["calls"], 3);  // the tokens after the prefill's
  for (const char* program : {"prefill", "decode"}) {
    const json& p = profile[program];
    EXPECT_EQ(p["device"], 0);
    std::map<std::string, double> calls;
    double shares = 0;
    for (const json& op : p["ops"]) {
      calls[op["op"].get<std::string>()] = op["calls_per_call"].get<double>();
      EXPECT_GE(op["ms_per_call"].get<double>(), 0);
      shares += op["share"].get<double>();
    }
    EXPECT_EQ(calls["aten::linear"], 2 * 7 + 1) << program;  // tiny has 2 layers
    EXPECT_EQ(calls["aten::scaled_dot_product_attention"], 2) << program;
    shares += p["outside_ops_ms_per_call"].get<double>() / p["ms_per_call"].get<double>();
    EXPECT_NEAR(shares, 1.0, 1e-9) << program;
  }
  for (const auto& [kind, count] : out["collectives_per_decode_step"].items()) {
    double profiled = 0;
    for (const json& op : profile["decode"]["ops"]) {
      if (op["op"] == kind) profiled = op["calls_per_call"].get<double>();
    }
    EXPECT_EQ(profiled, count.get<double>()) << kind;
  }
  const CliResult text = run_cli("llama --config tiny --prompt-ids 1,7,9 --steps 3 --profile");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("decode step profile, device 0:"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("aten::linear"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("(outside ops)"), std::string::npos) << text.out;
  const CliResult plain = run_cli("llama --config tiny --prompt-ids 1,7,9 --steps 3 --format json");
  EXPECT_FALSE(json::parse(plain.out).contains("profile"));  // only when asked for
}

TEST(LlamaCli, TextPromptsAndCheckpoints) {
  const std::string dir = testing::TempDir();
  // A tokenizer whose vocabulary is the tiny config's 320 tokens.
  std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
  std::vector<float> scores(3, 0);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.emplace_back(name);
    scores.push_back(0);
  }
  for (char c = 'a'; c <= 'z'; ++c) {
    tokens.push_back(std::string(1, c));
    scores.push_back(-1);
  }
  tokens.push_back(" ");
  scores.push_back(-1);
  while (tokens.size() < 320) {
    tokens.push_back("x" + std::to_string(tokens.size()));
    scores.push_back(-5);
  }
  shardflow::llama::Tokenizer::write(dir + "tok.bin", tokens, scores);
  shardflow::llama::write_llama2c(dir + "tiny.bin",
                                  shardflow::llama::random_weights(shardflow::llama::Config::named("tiny"), 4));

  const CliResult r = run_cli("llama --weights " + dir + "tiny.bin --tokenizer " + dir +
                              "tok.bin --prompt 'hello there' --steps 4 --devices 2 --check --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_EQ(out["text"][0].get<std::string>().rfind("hello there", 0), 0u) << out["text"];

  const CliResult no_tokenizer = run_cli("llama --config tiny --prompt hi");
  EXPECT_EQ(no_tokenizer.status, 1);
  EXPECT_NE(no_tokenizer.err.find("--prompt needs a tokenizer"), std::string::npos) << no_tokenizer.err;
}

TEST(LlamaCli, BadInputGivesOneErrorLine) {
  const CliResult mismatch = run_cli("llama --config tiny --mesh 2,1,2 --devices 8");
  EXPECT_EQ(mismatch.status, 1);
  EXPECT_NE(mismatch.err.find("--devices 8 does not match the mesh 2,1,2 of 4 devices"), std::string::npos)
      << mismatch.err;
  // A mesh or device count below 1 is refused, not run on one device.
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--mesh 1,1,-2", "--mesh sizes must be at least 1, got -2 in 1,1,-2"},
           {"--mesh 0,1,2", "--mesh sizes must be at least 1, got 0 in 0,1,2"},
           {"--devices -3", "--devices must be at least 1, got -3"},
           {"--devices 0", "--devices must be at least 1, got 0"},
           // A product that wraps 64 bits (2^64 devices read as 0) is refused, not allocated.
           {"--mesh 4294967296,4294967296,1", "--mesh 4294967296,4294967296,1 has more than 2^20 devices"},
           // Checked on one device too, where no plan reads the names.
           {"--axis-names x,y,z", "--axis-names: \"x\" is not an axis of the plan, which uses data, fsdp and model"},
           {"--axis-names data,data,model", "--axis-names names 'data' twice"},
           {"--seq-len 65", "--seq-len 65 is outside 1..64, the model's context (its seq_len)"},
           {"--max-memory 12X", "--max-memory: expected a size such as 8G, 512M or 1073741824 (bytes), got \"12X\""}}) {
    const CliResult bad = run_cli("llama --config tiny " + args);
    EXPECT_EQ(bad.status, 2) << args;
    EXPECT_NE(bad.err.find(message), std::string::npos) << args << ": " << bad.err;
  }
  // A path the filesystem cannot resolve: which path and why, not "internal".
  const std::filesystem::path loop = std::filesystem::path(testing::TempDir()) / "symlink_loop";
  std::filesystem::remove(loop);
  std::filesystem::create_symlink(loop, loop);
  const CliResult looped = run_cli("llama --weights " + loop.string());
  EXPECT_EQ(looped.status, 1);
  EXPECT_EQ(looped.err, "error: cannot access \"" + loop.string() + "\": Too many levels of symbolic links\n");
  // Sizes decided before anything is allocated: what, how much, from which
  // inputs, against which limit (a run on a machine's whole memory used to
  // end in the OOM killer).
  const CliResult weights = run_cli("llama --config stories15M --max-memory 1M");
  EXPECT_EQ(weights.status, 1);
  EXPECT_EQ(weights.err, "error: weights of 58 MiB (15191712 parameters x 4 bytes) exceeds --max-memory 1.0 MiB; pass "
                         "a smaller --seq-len, --batch or prompt, a smaller model, or more devices over MPI\n");
  const CliResult cache = run_cli("llama --config tiny --batch 100000 --seq-len 64 --max-memory 1G");
  EXPECT_EQ(cache.status, 1);
  EXPECT_NE(cache.err.find("error: KV cache of 2.3 GiB (batch 100000 x layers 2 x kv heads 3 x seq_len 64 x head_dim "
                           "8 x 2 x 4 (keys and values, 4 bytes each)) exceeds --max-memory 1.0 GiB"),
            std::string::npos)
      << cache.err;
  const CliResult total = run_cli("llama --config tiny --batch 10000 --seq-len 64 --max-memory 250M");
  EXPECT_EQ(total.status, 1);
  EXPECT_NE(total.err.find("error: the run needs 269 MiB (weights 259 KiB, KV cache 234 MiB, rotary tables 4.0 KiB, "
                           "attention mask 128 bytes, activations of the prefill step 34 MiB), which exceeds "
                           "--max-memory 250 MiB"),
            std::string::npos)
      << total.err;
  // A mesh without one of the plan's axes: which entry, and how to fix it.
  const CliResult two_axes = run_cli("llama --config tiny --axis-names data,model --mesh 4,2");
  EXPECT_EQ(two_axes.status, 1);
  EXPECT_NE(two_axes.err.find("does not fit the mesh (data=4, model=2): Axis name fsdp is not defined in the given "
                              "mesh (the plan names the axes 'data', 'fsdp', 'model'"),
            std::string::npos)
      << two_axes.err;
  const CliResult unknown = run_cli("llama --config huge");
  EXPECT_EQ(unknown.status, 1);
  EXPECT_NE(unknown.err.find("unknown LLaMA config 'huge'; expected one of: tiny, stories15M"), std::string::npos);
  const CliResult token = run_cli("llama --config tiny --prompt-ids 1,999");
  EXPECT_EQ(token.status, 1);
  EXPECT_NE(token.err.find("prompt token 999 is outside the vocabulary 0..319"), std::string::npos) << token.err;
  const CliResult missing = run_cli("llama --weights /nonexistent/model.bin");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("cannot open llama2.c checkpoint"), std::string::npos);
  const CliResult too_long = run_cli("llama --config tiny --prompt-ids 1 --steps 100");
  EXPECT_EQ(too_long.status, 1);
  EXPECT_NE(too_long.err.find("seq_len 64"), std::string::npos) << too_long.err;
  // The largest int64: refused up front, not after generating into a full cache.
  const CliResult largest = run_cli("llama --config tiny --prompt-ids 1 --steps 9223372036854775807");
  EXPECT_EQ(largest.status, 1);
  EXPECT_NE(largest.err.find("9223372036854775807 steps need more than 64 positions, but the model has seq_len 64"),
            std::string::npos)
      << largest.err;
  // Beyond int64: an error, not the nearest int64.
  for (const char* option : {"--steps", "--seed", "--batch", "--devices"}) {
    const CliResult huge = run_cli(std::string("llama --config tiny --prompt-ids 1 ") + option + " 99999999999999999999");
    EXPECT_NE(huge.status, 0) << option;
    EXPECT_NE(huge.err.find("'99999999999999999999' is outside the range of a 64-bit integer"), std::string::npos)
        << option << ": " << huge.err;
  }
  const CliResult infinite = run_cli("llama --config tiny --prompt-ids 1 --temperature inf");
  EXPECT_EQ(infinite.status, 1);
  EXPECT_NE(infinite.err.find("--temperature must be a finite number, 0 or more, got inf"), std::string::npos)
      << infinite.err;
}

}  // namespace

namespace {

TEST(LlamaCli, HuggingFaceCheckpointDirectory) {
  const std::string dir = testing::TempDir() + "hf_tiny";
  shardflow::llama::write_hf(dir, shardflow::llama::random_weights(shardflow::llama::Config::named("tiny"), 9),
                             shardflow::DType::kBF16, 2);
  const CliResult r = run_cli("llama --weights " + dir + " --mesh 2,1,2 --prompt-ids 1,2,3 --steps 4 --check --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["tokens"].size(), 2u);
}

// The checkpoint's own tokenizer.json, LLaMA 2 style: "hello world" in
// pieces, the rest of the tiny config's 320 ids unused.
const std::vector<std::string> kPieces = {"\u2581", "h", "e", "l", "o", "w", "r", "d", "he", "\u2581he", "ll",
                                          "llo", "\u2581hello", "\u2581w", "or", "\u2581wor", "ld", "\u2581world"};
json llama_tokenizer_json() {
  return json(shardflow::llama_test::llama_style(kPieces, {"h e", "\u2581 he", "l l", "ll o", "\u2581he llo", "\u2581 w",
                                                           "o r", "\u2581w or", "l d", "\u2581wor ld"}));
}

TEST(LlamaCli, HuggingFaceTokenizerNextToTheWeights) {
  const std::string dir = testing::TempDir() + "hf_tiny_tokenizer";
  shardflow::llama::write_hf(dir, shardflow::llama::random_weights(shardflow::llama::Config::named("tiny"), 5),
                             shardflow::DType::kF32, 1);
  std::ofstream(dir + "/tokenizer.json") << llama_tokenizer_json().dump();
  const CliResult r = run_cli("llama --weights " + dir + " --prompt 'hello world' --steps 8 --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_EQ(out["text"][0].get<std::string>().rfind("hello world", 0), 0u) << out["text"];
  // The prompt was BOS, "▁hello", "▁world": those ids give the same tokens.
  const CliResult as_ids = run_cli("llama --weights " + dir + " --prompt-ids 1,271,276 --steps 8 --format json");
  ASSERT_EQ(as_ids.status, 0) << as_ids.err;
  EXPECT_EQ(json::parse(as_ids.out)["tokens"], out["tokens"]);
  // --tokenizer names it (or its directory) explicitly; the prompt encodes the same.
  const CliResult named = run_cli("llama --weights " + dir + " --tokenizer " + dir +
                                  " --prompt 'hello world' --steps 8 --format json");
  ASSERT_EQ(named.status, 0) << named.err;
  EXPECT_EQ(json::parse(named.out)["tokens"], out["tokens"]);
  // Byte tokens that spell no character (0xC3 starts a 2-byte one, and
  // another 0xC3 follows) are not UTF-8: JSON output shows U+FFFD for them
  // instead of failing.
  const CliResult cut = run_cli("llama --weights " + dir + " --prompt-ids 1,198,198 --steps 2 --format json");
  ASSERT_EQ(cut.status, 0) << cut.err;
  EXPECT_EQ(json::parse(cut.out)["text"][0].get<std::string>().rfind("\uFFFD", 0), 0u) << cut.out;

  // A tokenizer.json of another kind: ids still work, with a note; text prompts do not.
  json byte_level = llama_tokenizer_json();
  byte_level["pre_tokenizer"] = {{"type", "ByteLevel"}};
  std::ofstream(dir + "/tokenizer.json") << byte_level.dump();
  const CliResult ids = run_cli("llama --weights " + dir + " --prompt-ids 1,2 --steps 2 --format json");
  ASSERT_EQ(ids.status, 0) << ids.err;
  EXPECT_NE(ids.err.find("note: prompts and outputs are token ids: tokenizer '" + dir +
                         "/tokenizer.json': pre_tokenizer is \"ByteLevel\""),
            std::string::npos)
      << ids.err;
  const CliResult text = run_cli("llama --weights " + dir + " --prompt hello --steps 2");
  EXPECT_EQ(text.status, 1);
  EXPECT_NE(text.err.find("give the prompt as --prompt-ids instead"), std::string::npos) << text.err;
}

}  // namespace
