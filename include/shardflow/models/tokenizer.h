// The LLaMA 2 tokenizer: sentencepiece-style BPE with byte fallback, read
// from either of two files.
//
// llama2.c's `tokenizer.bin`: the vocabulary flattened to token strings and
// merge scores, encoded by greedy highest-score pair merging. Format
// (little-endian, no vocabulary count: that is the model's vocab_size):
//
//   int32 max_token_length
//   vocab_size times: float32 score, int32 length, `length` bytes of token text
//
// Hugging Face's `tokenizer.json` of the same family (LLaMA 1 and 2,
// Mistral, TinyLlama, ...): a BPE model with byte_fallback, a vocabulary and
// a ranked list of merges, spaces written as U+2581 ("▁"), which this class
// stores as plain spaces, as llama2.c's export does. Encoding applies the
// listed merges, lowest rank first, as the tokenizers library does.
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
#include <unordered_set>
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
  static Tokenizer parse(std::span<const std::byte> bytes, int64_t vocab_size, const std::string& source_name);
  // Reads a Hugging Face tokenizer.json for a model of `vocab_size` tokens
  // (ids the file does not use decode to nothing). Throws shardflow::Error,
  // naming the file and the field, when it is missing, not JSON, or not a
  // BPE tokenizer of this family: byte fallback, ids 0..2 <unk>, <s>, </s>,
  // spaces as "▁", no normalizer or pre-tokenizer beyond prepending and
  // replacing "▁" (byte-level BPE such as LLaMA 3's is not supported), and
  // added tokens that may match inside words (not single_word: true).
  static Tokenizer load_hf(const std::filesystem::path& path, int64_t vocab_size);
  static Tokenizer parse_hf(std::string_view json, int64_t vocab_size, const std::string& source_name);
  // A directory's tokenizer.json, a file named *.json, or else a tokenizer.bin
  // (a sentencepiece *.model is refused with a pointer to those).
  static Tokenizer load_any(const std::filesystem::path& path, int64_t vocab_size);

  // Writes `tokens` and `scores` in the llama2.c format, max_token_length being the
  // longest token.
  static void write(const std::filesystem::path& path, const std::vector<std::string>& tokens,
                    const std::vector<float>& scores);

  // Throws shardflow::Error unless tokens and scores have the same size of at
  // least kMinVocabSize, ids 3..258 are the byte tokens and no score is NaN.
  Tokenizer(std::vector<std::string> tokens, std::vector<float> scores);

  // One listed merge of Hugging Face BPE: the ids of its left and right piece.
  struct Merge {
    int64_t left;
    int64_t right;
  };
  // When encode() puts the sentencepiece dummy prefix (a space) before a
  // non-empty text; decode() drops a leading space after BOS unless kNever.
  // Text cut into pieces at added tokens gets it per piece, as the
  // tokenizers library normalizes and pre-tokenizes each piece on its own.
  enum class DummyPrefix {
    kNever,
    kAlways,              // llama2.c, and tokenizers' Prepend normalizer
    kUnlessLeadingSpace,  // tokenizers' Metaspace pre-tokenizer (prepend_scheme always)
    // Metaspace with prepend_scheme first: only the piece that starts the text.
    kAtTextStartUnlessLeadingSpace,
  };
  // A token that is cut out of the text before BPE wherever its content
  // appears (tokenizers' added tokens): <s>, </s>, chat markers. Of
  // overlapping ones the leftmost wins, then the longest. Those matched as
  // written are cut out first; the pieces left are then normalized (the
  // Prepend normalizer's "▁", for kAlways) and searched for the normalized
  // ones, whose content is normalized the same way.
  struct AddedToken {
    std::string content;
    int64_t id = 0;
    bool strip_left = false;   // also takes the white space before it (lstrip)
    bool strip_right = false;  // and after it (rstrip)
    bool normalized = false;   // matched in the normalized text
  };
  struct RankedOptions {
    DummyPrefix dummy_prefix = DummyPrefix::kAlways;
    // Each space starts a new word and no merge joins two words, as
    // tokenizers' Metaspace pre-tokenizer with split=true does.
    bool split_at_spaces = false;
    std::vector<AddedToken> added_tokens;
  };
  // A tokenizer that merges by rank: merges[r] has rank r. Throws
  // shardflow::Error as above, and when a merge names an id out of range or
  // its pieces' concatenation is not an ordinary token. score() is 0 for
  // every token.
  Tokenizer(std::vector<std::string> tokens, const std::vector<Merge>& merges, RankedOptions options);

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  // The stored text of a token (throws when `id` is out of range).
  const std::string& token(int64_t id) const;
  float score(int64_t id) const;

  // llama2.c's encode: optional BOS; for non-empty text a leading space (the
  // sentencepiece dummy prefix; always for tokenizer.bin, as its file says
  // for tokenizer.json); each UTF-8 code point becomes its token, or
  // its byte tokens when it has none (bytes that are not valid UTF-8 always
  // become byte tokens); then the adjacent pair whose concatenation is a token
  // with the highest score (the leftmost on ties) is merged until no pair
  // merges; optional EOS. Merges never produce <unk>, BOS, EOS or byte tokens.
  // A tokenizer with ranked merges instead merges the adjacent pair that is
  // a listed merge of the lowest rank (the leftmost on ties), so a pair whose
  // concatenation is a token but not a listed merge stays apart; and it reads
  // a "▁" in the text as the space it stands for, as the tokenizers library does;
  // and it first cuts its added tokens out of the text, encoding the pieces
  // between them on their own.
  std::vector<int64_t> encode(std::string_view text, bool bos, bool eos) const;

  // The text of `token` printed after `previous`: BOS and EOS are markers and
  // print nothing; "<0xHH>" prints that raw byte; after BOS a leading space
  // (the dummy prefix, when the tokenizer adds one) is dropped, also when it
  // comes from the byte token <0x20>.
  // `previous` is only compared with BOS, so any value (such as -1) may be passed.
  std::string decode(int64_t previous, int64_t token) const;

  // A whole sequence. The start of the sequence counts as after BOS, so
  // decode(encode(text, bos, eos)) == text whatever bos and eos are, for
  // text without added tokens (BOS and EOS written in the text print nothing,
  // and a dummy prefix may space the piece after one). A tokenizer.json
  // tokenizer drops the dummy prefix only at the start of the sequence, as
  // its decoder does; llama2.c's after every BOS.
  std::string decode(std::span<const int64_t> tokens) const;

 private:
  // Hashes std::string and std::string_view alike so lookups need no copy.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };

  // The ranked merge of a pair of ids, for tokenizers that have them.
  struct RankedMerge {
    int64_t rank;
    int64_t merged;
  };
  static uint64_t pair_key(int64_t left, int64_t right) {
    return static_cast<uint64_t>(left) << 32 | static_cast<uint64_t>(right);
  }

  // The checks both constructors share, and the text -> id table.
  void index_tokens();
  void check_id(int64_t id, std::string_view what) const;
  // The id of the token with exactly this text that merges may produce, or -1.
  int64_t lookup(std::string_view text) const;
  void merge_pairs(std::vector<int64_t>& ids) const;
  // Appends the ids of a piece of text between added tokens matched as
  // written; `at_text_start`: it starts the text.
  void encode_piece(std::string_view piece, bool at_text_start, std::vector<int64_t>& ids) const;
  // Appends the BPE ids of normalized text (spaces stored as spaces).
  void encode_normalized(std::string text, bool at_text_start, std::vector<int64_t>& ids) const;

  // Added tokens to look for in a text: where each is, leftmost then longest.
  struct AddedMatch {
    std::size_t begin, end;
    int64_t id;
  };
  class AddedTokenSet {
   public:
    // A token whose content is already in the set is dropped: the first one
    // always matches before it. Call sort() once all are added.
    void add(AddedToken token);
    // Orders each first byte's candidates longest first (ties: as added),
    // once, instead of on every add (100k added tokens took a minute).
    void sort();
    // Appends to `ids` the id of each match in `text`, and between them
    // what encode_part(part, whether it starts `text`) appends.
    template <class EncodePart>
    void split(std::string_view text, std::vector<int64_t>& ids, EncodePart&& encode_part) const;

   private:
    std::vector<AddedMatch> find(std::string_view text) const;

    std::vector<AddedToken> tokens_;
    std::unordered_set<std::string, StringHash, std::equal_to<>> contents_;
    // Per first byte: indices into tokens_, the longest content first.
    std::unordered_map<unsigned char, std::vector<std::size_t>> by_first_byte_;
  };

  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  // Text -> id for every ordinary token (not ids 0..258); built once.
  std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>> ids_;
  std::size_t longest_token_ = 0;
  // False for tokenizer.bin, which merges by score.
  bool ranked_ = false;
  std::unordered_map<uint64_t, RankedMerge> ranked_merges_;
  DummyPrefix dummy_prefix_ = DummyPrefix::kAlways;
  bool split_at_spaces_ = false;
  AddedTokenSet added_as_written_, added_normalized_;
};

}  // namespace shardflow::llama
