// The LLaMA tokenizer: reading and writing tokenizer.bin, encoding by
// greedy pair merges, decoding with the dummy-prefix and byte-token rules
// (tokenizer.json is read in hf_tokenizer.cc).
//
// Encoding is llama2.c's algorithm (merge the best-scoring adjacent pair,
// leftmost on ties, until none merges), or with ranked merges the tokenizers
// library's (the lowest-ranked listed pair, leftmost on ties), done with a
// heap instead of a rescan per merge, so a long prompt costs O(n log n)
// lookups rather than O(n^2).
#include "shardflow/models/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <queue>
#include <system_error>
#include <utility>

#include "meta_space.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"

namespace shardflow::llama {

// Guards against reading a weights file or similar by mistake (a real
// tokenizer.bin is about 0.5 MB).
static constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t{1} << 30;

// The byte value of a byte token's text "<0xHH>" (either hex case), or -1.
static int byte_token_value(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (const char c : text.substr(3, 2)) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// ---------------------------------------------------------------------------
// Construction and the file format.

Tokenizer::Tokenizer(std::vector<std::string> tokens, std::vector<float> scores)
    : tokens_(std::move(tokens)), scores_(std::move(scores)) {
  if (tokens_.size() != scores_.size()) {
    throw Error(fmt::format("tokenizer has {} tokens but {} scores", tokens_.size(), scores_.size()));
  }
  index_tokens();
}

Tokenizer::Tokenizer(std::vector<std::string> tokens, const std::vector<Merge>& merges, RankedOptions options)
    : tokens_(std::move(tokens)),
      ranked_(true),
      dummy_prefix_(options.dummy_prefix),
      split_at_spaces_(options.split_at_spaces) {
  scores_.assign(tokens_.size(), 0.0f);
  index_tokens();
  ranked_merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const Merge& m = merges[rank];
    check_id(m.left, fmt::format("merge {}: left piece", rank));
    check_id(m.right, fmt::format("merge {}: right piece", rank));
    const std::string merged_text = tokens_[m.left] + tokens_[m.right];
    const int64_t merged = lookup(merged_text);
    if (merged < 0) {
      throw Error(fmt::format("merge {} ({} + {}) makes {}, which is not an ordinary token", rank,
                              quote_for_message(tokens_[m.left], 40), quote_for_message(tokens_[m.right], 40),
                              quote_for_message(merged_text, 40)));
    }
    // A pair listed twice gets its last rank, as in the tokenizers library.
    ranked_merges_.insert_or_assign(pair_key(m.left, m.right), RankedMerge{static_cast<int64_t>(rank), merged});
  }
  for (AddedToken& added : options.added_tokens) {
    check_id(added.id, fmt::format("added token {}", quote_for_message(added.content, 40)));
    if (added.content.empty()) throw Error(fmt::format("added token {} has no text", added.id));
    if (!added.normalized) {
      added_as_written_.add(std::move(added));
      continue;
    }
    // Looked for in normalized text, so normalized as that is: spaces
    // stored as spaces, and the Prepend normalizer's prefix.
    added.content = spaces_for_meta_spaces(added.content);
    if (dummy_prefix_ == DummyPrefix::kAlways) added.content.insert(added.content.begin(), ' ');
    added_normalized_.add(std::move(added));
  }
  added_as_written_.sort();
  added_normalized_.sort();
}

void Tokenizer::index_tokens() {
  if (vocab_size() < kMinVocabSize || vocab_size() > kMaxVocabSize) {
    throw Error(
        fmt::format("tokenizer has {} tokens, expected {}..{} (<unk>, <s>, </s> and the "
                    "256 byte tokens come first)",
                    tokens_.size(), kMinVocabSize, kMaxVocabSize));
  }
  // Byte fallback emits ids 3..258 blindly, so they must really be the bytes.
  for (int b = 0; b < 256; ++b) {
    const std::string& text = tokens_[kFirstByteToken + b];
    if (byte_token_value(text) != b) {
      throw Error(
          fmt::format("token {} is {}, expected the byte token <0x{:02X}> (ids 3..258 "
                      "hold <0x00>..<0xFF>)",
                      kFirstByteToken + b, quote_for_message(text, 40), b));
    }
  }
  // NaN would break the heap's ordering during merges.
  for (std::size_t i = 0; i < scores_.size(); ++i) {
    if (std::isnan(scores_[i])) {
      throw Error(fmt::format("token {} ({}) has score nan", i, quote_for_message(tokens_[i], 40)));
    }
  }
  // Only ordinary tokens are merge results: sentencepiece never produces
  // <unk>, control or byte pieces from text, and excluding them keeps a
  // literal "<0x41>" in the text from decoding to "A". When a text repeats,
  // the lowest id wins.
  ids_.reserve(tokens_.size() - kMinVocabSize);
  for (std::size_t id = kMinVocabSize; id < tokens_.size(); ++id) {
    const std::string& text = tokens_[id];
    if (text.empty()) continue;
    ids_.try_emplace(text, static_cast<int64_t>(id));
    longest_token_ = std::max(longest_token_, text.size());
  }
}

// Little-endian, whatever the host, since llama2.c files come from x86 and ARM.
static uint32_t read_u32(std::span<const std::byte> bytes, std::size_t offset) {
  uint32_t value = 0;
  for (std::size_t k = 0; k < 4; ++k) {
    value |= static_cast<uint32_t>(bytes[offset + k]) << (8 * k);
  }
  return value;
}

static void append_u32(std::string& out, uint32_t value) {
  for (std::size_t k = 0; k < 4; ++k) out.push_back(static_cast<char>((value >> (8 * k)) & 0xFF));
}

Tokenizer Tokenizer::parse(std::span<const std::byte> bytes, int64_t vocab_size, const std::string& source_name) {
  const std::string& src = source_name;
  if (vocab_size < kMinVocabSize || vocab_size > kMaxVocabSize) {
    throw Error(
        fmt::format("{}: vocab_size {} is out of range, expected {}..{} (<unk>, <s>, "
                    "</s> and the 256 byte tokens come first)",
                    src, vocab_size, kMinVocabSize, kMaxVocabSize));
  }
  if (bytes.size() < 4) {
    throw Error(
        fmt::format("{}: file has {} bytes, too few for the 4-byte max_token_length header", src, bytes.size()));
  }
  const auto max_token_length = std::bit_cast<int32_t>(read_u32(bytes, 0));
  if (max_token_length < 0 || max_token_length > kMaxTokenLength) {
    throw Error(fmt::format("{}: max_token_length is {}, expected 0..{}", src, max_token_length, kMaxTokenLength));
  }

  std::vector<std::string> tokens;
  std::vector<float> scores;
  // Every record takes at least 8 bytes; do not trust vocab_size for the reservation.
  const std::size_t records = std::min<std::size_t>(vocab_size, (bytes.size() - 4) / 8);
  tokens.reserve(records);
  scores.reserve(records);
  std::size_t offset = 4;
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (bytes.size() - offset < 8) {
      throw Error(
          fmt::format("{}: token record {} of {} is truncated at byte {}: expected 8 bytes "
                      "of score and length, found {}",
                      src, i, vocab_size, offset, bytes.size() - offset));
    }
    const auto score = std::bit_cast<float>(read_u32(bytes, offset));
    const auto length = std::bit_cast<int32_t>(read_u32(bytes, offset + 4));
    offset += 8;
    if (length < 0) {
      throw Error(fmt::format("{}: token record {} has negative length {}", src, i, length));
    }
    if (length > max_token_length) {
      throw Error(fmt::format("{}: token record {} has length {}, longer than max_token_length {}", src, i, length,
                              max_token_length));
    }
    if (bytes.size() - offset < static_cast<std::size_t>(length)) {
      throw Error(
          fmt::format("{}: token record {} of {} is truncated at byte {}: expected {} bytes "
                      "of token text, found {}",
                      src, i, vocab_size, offset, length, bytes.size() - offset));
    }
    tokens.emplace_back(reinterpret_cast<const char*>(bytes.data() + offset), length);
    scores.push_back(score);
    offset += length;
  }
  // Left-over bytes mean the model and the tokenizer disagree on the vocabulary.
  if (offset != bytes.size()) {
    throw Error(
        fmt::format("{}: {} bytes follow the last of {} token records; the tokenizer has "
                    "more tokens than vocab_size {}",
                    src, bytes.size() - offset, vocab_size, vocab_size));
  }
  try {
    return Tokenizer(std::move(tokens), std::move(scores));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", src, e.what()));
  }
}

Tokenizer Tokenizer::load(const std::filesystem::path& path, int64_t vocab_size) {
  std::error_code error;
  const std::uintmax_t size = std::filesystem::file_size(path, error);
  if (error) {
    throw Error(fmt::format("cannot read tokenizer file {}: {}", path.string(), error.message()));
  }
  if (size > kMaxFileBytes) {
    throw Error(fmt::format("tokenizer file {} has {} bytes, more than the {} a tokenizer can have", path.string(),
                            size, kMaxFileBytes));
  }
  std::vector<std::byte> bytes(size);
  std::ifstream file(path, std::ios::binary);
  file.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (!file || static_cast<std::uintmax_t>(file.gcount()) != size) {
    throw Error(fmt::format("cannot read tokenizer file {}: read {} of {} bytes", path.string(), file.gcount(), size));
  }
  return parse(bytes, vocab_size, path.string());
}

Tokenizer Tokenizer::load_any(const std::filesystem::path& path, int64_t vocab_size) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) return load_hf(path / "tokenizer.json", vocab_size);
  if (path.extension() == ".json") return load_hf(path, vocab_size);
  // Its protobuf would otherwise be misread as a tokenizer.bin header.
  if (path.extension() == ".model") {
    throw Error(
        fmt::format("tokenizer '{}': sentencepiece .model files are not read; give the tokenizer.json "
                    "that Hugging Face checkpoints have next to it, or llama2.c's tokenizer.bin",
                    path.string()));
  }
  return load(path, vocab_size);
}

void Tokenizer::write(const std::filesystem::path& path, const std::vector<std::string>& tokens,
                      const std::vector<float>& scores) {
  if (tokens.size() != scores.size()) {
    throw Error(
        fmt::format("cannot write tokenizer {}: {} tokens but {} scores", path.string(), tokens.size(), scores.size()));
  }
  std::size_t max_token_length = 0;
  for (const std::string& token : tokens) max_token_length = std::max(max_token_length, token.size());
  if (max_token_length > static_cast<std::size_t>(kMaxTokenLength)) {
    throw Error(fmt::format("cannot write tokenizer {}: a token has {} bytes, more than {}", path.string(),
                            max_token_length, kMaxTokenLength));
  }
  std::string out;
  append_u32(out, static_cast<uint32_t>(max_token_length));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    append_u32(out, std::bit_cast<uint32_t>(scores[i]));
    append_u32(out, static_cast<uint32_t>(tokens[i].size()));
    out += tokens[i];
  }
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(out.data(), static_cast<std::streamsize>(out.size()));
  if (!file) throw Error(fmt::format("cannot write tokenizer {}", path.string()));
}

// ---------------------------------------------------------------------------
// Lookup, encoding and decoding.

void Tokenizer::check_id(int64_t id, std::string_view what) const {
  if (id < 0 || id >= vocab_size()) {
    throw Error(fmt::format("{} id {} is out of range for a vocabulary of {} tokens", what, id, vocab_size()));
  }
}

const std::string& Tokenizer::token(int64_t id) const {
  check_id(id, "token");
  return tokens_[id];
}

float Tokenizer::score(int64_t id) const {
  check_id(id, "token");
  return scores_[id];
}

int64_t Tokenizer::lookup(std::string_view text) const {
  const auto it = ids_.find(text);
  return it == ids_.end() ? -1 : it->second;
}

namespace {

// Unicode's White_Space code points: what the tokenizers library's lstrip
// and rstrip take (its regex \s).
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The length of the White_Space code point at text[i], or 0.
std::size_t white_space_at(std::string_view text, std::size_t i) {
  if (i >= text.size()) return 0;
  const CodePoint c = decode_utf8(text, i);
  return c.length > 0 && is_white_space(c.value) ? c.length : 0;
}

// The length of the White_Space code point that ends just before text[end], or 0.
std::size_t white_space_before(std::string_view text, std::size_t end) {
  for (std::size_t length = 1; length <= 3 && length <= end; ++length) {
    if (white_space_at(text, end - length) == length) return length;
  }
  return 0;
}

}  // namespace

void Tokenizer::AddedTokenSet::add(AddedToken token) {
  if (!contents_.insert(token.content).second) return;
  by_first_byte_[static_cast<unsigned char>(token.content.front())].push_back(tokens_.size());
  tokens_.push_back(std::move(token));
}

void Tokenizer::AddedTokenSet::sort() {
  for (auto& [first_byte, candidates] : by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(), [&](std::size_t a, std::size_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

std::vector<Tokenizer::AddedMatch> Tokenizer::AddedTokenSet::find(std::string_view text) const {
  std::vector<AddedMatch> matches;
  if (tokens_.empty()) return matches;
  std::size_t covered = 0;  // the end of the last match
  for (std::size_t at = 0; at < text.size();) {
    const auto candidates = by_first_byte_.find(static_cast<unsigned char>(text[at]));
    const AddedToken* found = nullptr;
    if (candidates != by_first_byte_.end()) {
      for (std::size_t index : candidates->second) {
        if (text.substr(at).starts_with(tokens_[index].content)) {
          found = &tokens_[index];  // the longest that fits: they are in that order
          break;
        }
      }
    }
    if (found == nullptr) {
      ++at;
      continue;
    }
    std::size_t begin = at, end = at + found->content.size();
    if (found->strip_left) {
      while (begin > covered) {
        const std::size_t length = white_space_before(text, begin);
        if (length == 0 || begin - length < covered) break;
        begin -= length;
      }
    }
    // The library resumes its search at the end of the content, not of the
    // white space rstrip took: a token that starts with white space could
    // still match there. Here the search resumes after it.
    if (found->strip_right) {
      while (const std::size_t length = white_space_at(text, end)) end += length;
    }
    matches.push_back({begin, end, found->id});
    covered = at = end;
  }
  return matches;
}

template <class EncodePart>
void Tokenizer::AddedTokenSet::split(std::string_view text, std::vector<int64_t>& ids, EncodePart&& encode_part) const {
  std::size_t done = 0;
  for (const AddedMatch& match : find(text)) {
    encode_part(text.substr(done, match.begin - done), done == 0);
    ids.push_back(match.id);
    done = match.end;
  }
  encode_part(text.substr(done), done == 0);
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool bos, bool eos) const {
  std::vector<int64_t> ids;
  if (bos) ids.push_back(kBos);
  added_as_written_.split(text, ids, [&](std::string_view piece, bool starts) { encode_piece(piece, starts, ids); });
  if (eos) ids.push_back(kEos);
  return ids;
}

void Tokenizer::encode_piece(std::string_view piece, bool at_text_start, std::vector<int64_t>& ids) const {
  if (piece.empty()) return;
  // Normalizing: the vocabulary's "▁" is stored as a space, so with a
  // tokenizer.json one in the text is too; the Prepend normalizer's dummy
  // prefix (kAlways) comes before the normalized added tokens are looked for.
  std::string spaced = ranked_ ? spaces_for_meta_spaces(piece) : std::string(piece);
  if (dummy_prefix_ == DummyPrefix::kAlways) spaced.insert(spaced.begin(), ' ');
  added_normalized_.split(spaced, ids, [&](std::string_view part, bool starts) {
    encode_normalized(std::string(part), at_text_start && starts, ids);
  });
}

void Tokenizer::encode_normalized(std::string text, bool at_text_start, std::vector<int64_t>& ids) const {
  if (text.empty()) return;
  // The pre-tokenizer's dummy prefix: sentencepiece sees " hello", so the
  // first word gets the same tokens as a word inside the text.
  const bool leading_space = text.front() == ' ';
  if ((dummy_prefix_ == DummyPrefix::kUnlessLeadingSpace && !leading_space) ||
      (dummy_prefix_ == DummyPrefix::kAtTextStartUnlessLeadingSpace && at_text_start && !leading_space)) {
    text.insert(text.begin(), ' ');
  }
  std::vector<int64_t> piece_ids;
  piece_ids.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = decode_utf8(text, i).length;
    const int64_t id = length == 0 ? -1 : lookup(std::string_view(text).substr(i, length));
    if (id >= 0) {
      piece_ids.push_back(id);
    } else {
      // Byte fallback; an invalid byte is a unit of its own.
      const std::size_t unit = std::max<std::size_t>(length, 1);
      for (std::size_t k = 0; k < unit; ++k) {
        piece_ids.push_back(kFirstByteToken + static_cast<unsigned char>(text[i + k]));
      }
    }
    i += std::max<std::size_t>(length, 1);
  }
  merge_pairs(piece_ids);
  ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
}

namespace {

// A possible merge of the pieces at positions `left` and `right`, valid while
// they are still adjacent and still hold `left_id` and `right_id`.
struct Candidate {
  double priority;  // the merged token's score, or minus the merge's rank
  std::size_t left;
  std::size_t right;
  int64_t left_id;
  int64_t right_id;
  int64_t merged_id;
};

// Heap order: higher priority first, then the leftmost pair, as llama2.c's
// scan and the tokenizers library pick.
struct WorseCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.left > b.left;
  }
};

}  // namespace

// Invariants: the live pieces form a linked list in text order (positions
// only ever lose pieces, so a smaller position is further left); every
// mergeable adjacent pair has a current entry in the heap. Stale entries,
// left behind when a merge changes a neighbour, are skipped when popped.
void Tokenizer::merge_pairs(std::vector<int64_t>& ids) const {
  constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  const std::size_t n = ids.size();
  std::vector<std::size_t> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 < n ? i + 1 : kNone;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, WorseCandidate> heap;
  std::string pair;
  const auto consider = [&](std::size_t left, std::size_t right) {
    if (ranked_) {
      // Within a word a space only starts a piece, so a right piece that
      // starts with one starts the next word.
      if (split_at_spaces_ && tokens_[ids[right]].starts_with(' ')) return;
      const auto it = ranked_merges_.find(pair_key(ids[left], ids[right]));
      if (it != ranked_merges_.end()) {
        heap.push({-static_cast<double>(it->second.rank), left, right, ids[left], ids[right], it->second.merged});
      }
      return;
    }
    const std::string& a = tokens_[ids[left]];
    const std::string& b = tokens_[ids[right]];
    if (a.size() + b.size() > longest_token_) return;  // cannot be a token; skip the hash
    pair.assign(a);
    pair += b;
    const int64_t merged = lookup(pair);
    if (merged >= 0) heap.push({scores_[merged], left, right, ids[left], ids[right], merged});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) consider(i, i + 1);

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const bool current = alive[c.left] && alive[c.right] && next[c.left] == c.right && ids[c.left] == c.left_id &&
                         ids[c.right] == c.right_id;
    if (!current) continue;
    // The left piece becomes the merged token; the right one leaves the list.
    ids[c.left] = c.merged_id;
    alive[c.right] = 0;
    next[c.left] = next[c.right];
    if (next[c.left] != kNone) prev[next[c.left]] = c.left;
    if (prev[c.left] != kNone) consider(prev[c.left], c.left);
    if (next[c.left] != kNone) consider(c.left, next[c.left]);
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (alive[i]) ids[kept++] = ids[i];
  }
  ids.resize(kept);
}

std::string Tokenizer::decode(int64_t previous, int64_t token) const {
  check_id(token, "token");
  if (token == kBos || token == kEos) return {};
  std::string piece = token >= kFirstByteToken && token < kMinVocabSize
                          ? std::string(1, static_cast<char>(token - kFirstByteToken))
                          : tokens_[token];
  // Drop the dummy prefix encode() added. Checking after the byte conversion
  // keeps round trips exact when the space itself fell back to <0x20>.
  if (dummy_prefix_ != DummyPrefix::kNever && previous == kBos && !piece.empty() && piece.front() == ' ')
    piece.erase(0, 1);
  return piece;
}

std::string Tokenizer::decode(std::span<const int64_t> tokens) const {
  std::string text;
  int64_t previous = kBos;  // text starts as if after BOS, whether or not BOS is there
  bool at_start = true;     // only BOS so far
  for (const int64_t token : tokens) {
    // A tokenizer.json's decoder strips the first space of the text only.
    text += decode(ranked_ && !at_start && previous == kBos ? -1 : previous, token);
    at_start = at_start && token == kBos;
    previous = token;
  }
  return text;
}

}  // namespace shardflow::llama
