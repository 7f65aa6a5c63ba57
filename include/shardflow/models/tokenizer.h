// The LLaMA 2 tokenizer in llama2.c's `tokenizer.bin` form: a sentencepiece
// vocabulary flattened to token strings and merge scores, encoded with greedy
// highest-score pair merging and byte fallback.
//
// File format (little-endian, no vocabulary count: that is the model's vocab_size):
//
//   int32 max_token_length
//   vocab_size times: float32 score, int32 length, `length` bytes of token text
//
// Ids 0, 1, 2 are <unk>, BOS and EOS; ids 3..258 are the byte tokens
// "<0x00>".."<0xFF>" (checked on construction, since byte fallback relies on them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace shardflow::llama {

class Tokenizer {
 public:
  static constexpr int64_t kUnk = 0, kBos = 1, kEos = 2;
  // Byte b is token id b + kFirstByteToken.
  static constexpr int64_t kFirstByteToken = 3;
  // <unk>, BOS, EOS and the 256 byte tokens.
  static constexpr int64_t kMinVocabSize = 259;
  // Limits that only guard against corrupt files (real ones: 32000 tokens of at most 27 bytes).
  static constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
  static constexpr int64_t kMaxTokenLength = int64_t{1} << 16;

  // Reads a tokenizer.bin with `vocab_size` records; throws shardflow::Error
  // when the file is missing, truncated, corrupt, or has bytes after the last record.
  static Tokenizer load(const std::filesystem::path& path, int64_t vocab_size);
  // The same from bytes in memory; `source_name` starts every error message.
  static Tokenizer parse(std::span<const std::byte> bytes, int64_t vocab_size,
                         const std::string& source_name);
  // Writes `tokens` and `scores` in the same format, max_token_length being the
  // longest token.
  static void write(const std::filesystem::path& path, const std::vector<std::string>& tokens,
                    const std::vector<float>& scores);

  // Throws shardflow::Error unless tokens and scores have the same size of at
  // least kMinVocabSize, ids 3..258 are the byte tokens and no score is NaN.
  Tokenizer(std::vector<std::string> tokens, std::vector<float> scores);

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  // The stored text of a token (throws when `id` is out of range).
  const std::string& token(int64_t id) const;
  float score(int64_t id) const;

  // llama2.c's encode: optional BOS; for non-empty text a leading space (the
  // sentencepiece dummy prefix); each UTF-8 code point becomes its token, or
  // its byte tokens when it has none (bytes that are not valid UTF-8 always
  // become byte tokens); then the adjacent pair whose concatenation is a token
  // with the highest score (the leftmost on ties) is merged until no pair
  // merges; optional EOS. Merges never produce <unk>, BOS, EOS or byte tokens.
  std::vector<int64_t> encode(std::string_view text, bool bos, bool eos) const;

  // The text of `token` printed after `previous`: BOS and EOS are markers and
  // print nothing; "<0xHH>" prints that raw byte; after BOS a leading space
  // (the dummy prefix) is dropped, also when it comes from the byte token <0x20>.
  // `previous` is only compared with BOS, so any value (such as -1) may be passed.
  std::string decode(int64_t previous, int64_t token) const;

  // A whole sequence. The start of the sequence counts as after BOS, so
  // decode(encode(text, bos, eos)) == text whatever bos and eos are.
  std::string decode(std::span<const int64_t> tokens) const;

 private:
  // Hashes std::string and std::string_view alike so lookups need no copy.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view text) const {
      return std::hash<std::string_view>{}(text);
    }
  };

  void check_id(int64_t id, std::string_view what) const;
  // The id of the token with exactly this text that merges may produce, or -1.
  int64_t lookup(std::string_view text) const;
  void merge_pairs(std::vector<int64_t>& ids) const;

  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  // Text -> id for every ordinary token (not ids 0..258); built once.
  std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>> ids_;
  std::size_t longest_token_ = 0;
};

}  // namespace shardflow::llama
