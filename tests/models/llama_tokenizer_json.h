// A Hugging Face tokenizer.json in LLaMA 2's layout, for tests that need
// one: <unk>, <s>, </s>, the 256 byte tokens, then `pieces` ("▁" for spaces,
// ids from 259), ranked `merges` ("left right"), LLaMA 2's normalizer.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shardflow::llama_test {

inline constexpr const char* kMeta = "\u2581";

// A special token as LLaMA 2's file lists it: matched in the text as written.
inline nlohmann::json special(int64_t id, const std::string& content) {
  return {{"id", id},         {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false},  {"normalized", false}, {"special", true}};
}

inline nlohmann::json llama_style(const std::vector<std::string>& pieces,
                                  const std::vector<std::string>& merges) {
  using json = nlohmann::json;
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  for (std::size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = 259 + i;
  return {
      {"version", "1.0"},
      {"added_tokens", json::array({special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array(
             {{{"type", "Prepend"}, {"prepend", kMeta}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}})}}},
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

}  // namespace shardflow::llama_test
