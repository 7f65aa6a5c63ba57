// Sentencepiece writes spaces as U+2581 ("▁"); Tokenizer stores and reads
// them as plain spaces, as llama2.c's export does.
#pragma once

#include <string>
#include <string_view>

namespace shardflow::llama {

inline constexpr std::string_view kMetaSpace = "\u2581";

inline std::string spaces_for_meta_spaces(std::string_view text) {
  std::string out;
  std::size_t from = 0;
  for (std::size_t at = text.find(kMetaSpace); at != std::string_view::npos; at = text.find(kMetaSpace, from)) {
    out.append(text.substr(from, at - from)).push_back(' ');
    from = at + kMetaSpace.size();
  }
  return out.append(text.substr(from));
}

}  // namespace shardflow::llama
