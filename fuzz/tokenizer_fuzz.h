// What both tokenizer fuzzers do with a tokenizer that loaded: encode a
// short fixed text (ASCII, multi-byte UTF-8 with and without tokens, "▁",
// the <s> and </s> markers, invalid UTF-8 bytes) and decode it again, as a
// sequence and token by token.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "shardflow/models/tokenizer.h"

namespace shardflow_fuzz {

inline void exercise(const shardflow::llama::Tokenizer& tokenizer) {
  static constexpr std::string_view kTexts[] = {
      "Hello world, h\xC3\xA9llo  \xE2\x96\x81x\t12 <s>ab</s> \xF0\x9F\x98\x80 \xFF\xC3 end",
      " leading space",
      "",
  };
  for (const std::string_view text : kTexts) {
    const std::vector<int64_t> ids = tokenizer.encode(text, /*bos=*/true, /*eos=*/true);
    (void)tokenizer.decode(ids);
    int64_t previous = shardflow::llama::Tokenizer::kBos;
    for (const int64_t id : ids) {
      (void)tokenizer.decode(previous, id);
      previous = id;
    }
    (void)tokenizer.encode(text, /*bos=*/false, /*eos=*/false);
  }
  // Every token decodes (the last few ids too, which a file may not use).
  const int64_t n = tokenizer.vocab_size();
  for (int64_t id = n > 8 ? n - 8 : 0; id < n; ++id) (void)tokenizer.decode(-1, id);
}

}  // namespace shardflow_fuzz
