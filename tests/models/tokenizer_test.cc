// Tests of shardflow::llama::Tokenizer, the llama2.c tokenizer.bin reader and
// BPE-style encoder. Every test writes its own small tokenizer (the 259
// special and byte tokens of llama2.c's file, then a few pieces with scores)
// into ::testing::TempDir(); no real tokenizer.bin is needed.
#include "shardflow/models/tokenizer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "shardflow/base/error.h"
#include "shardflow/base/text.h"

namespace sf = shardflow;
using sf::llama::Tokenizer;

namespace {

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  int64_t add(std::string text, float score) {
    tokens.push_back(std::move(text));
    scores.push_back(score);
    return static_cast<int64_t>(tokens.size()) - 1;
  }
};

// What llama2.c's export writes first: <unk>, BOS and EOS (as "\n<s>\n" and
// "\n</s>\n"), then the byte tokens "<0x00>".."<0xFF>", all with score 0.
Vocab special_vocab() {
  Vocab v;
  v.add("<unk>", 0);
  v.add("\n<s>\n", 0);
  v.add("\n</s>\n", 0);
  for (int b = 0; b < 256; ++b) v.add(fmt::format("<0x{:02X}>", b), 0);
  return v;
}

// The pieces of the hand-worked examples, with their ids. Single characters
// score low (their score only matters as a merge result, which they never are).
constexpr int64_t kSpace = 259, kA = 260, kB = 261, kC = 262, kD = 263, kE = 264, kH = 265,
                  kL = 266, kO = 267, kR = 268, kW = 269, kX = 270, kY = 271, kZ = 272,
                  kEAcute = 273, kNewline = 274, kHe = 275, kEl = 276, kLl = 277, kLo = 278,
                  kLlo = 279, kHello = 280, kSpaceHello = 281, kXy = 282, kYz = 283, kSpaceW = 284,
                  kOr = 285, kSpaceWor = 286, kLd = 287, kSpaceWorld = 288, kTwoSpaces = 289,
                  kTestVocabSize = 290;

Vocab test_vocab() {
  Vocab v = special_vocab();
  for (const char* c : {" ", "a", "b", "c", "d", "e", "h", "l", "o", "r", "w", "x", "y", "z",
                        "\xC3\xA9" /* é */, "\n"}) {
    v.add(c, -100);
  }
  const std::vector<std::pair<std::string, float>> merges = {
      {"he", 3.0f},    {"el", 3.0f},     {"ll", 2.5f}, {"lo", 1.0f},     {"llo", 4.0f},
      {"hello", 5.0f}, {" hello", 6.0f}, {"xy", 1.0f}, {"yz", 2.0f},     {" w", 2.0f},
      {"or", 2.0f},    {" wor", 2.5f},   {"ld", 1.5f}, {" world", 3.0f}, {"  ", 0.5f}};
  for (const auto& [text, score] : merges) v.add(text, score);
  // The constants above name these ids.
  EXPECT_EQ(static_cast<int64_t>(v.tokens.size()), kTestVocabSize);
  const std::vector<std::pair<int64_t, std::string>> named = {{kSpace, " "},
                                                              {kA, "a"},
                                                              {kB, "b"},
                                                              {kC, "c"},
                                                              {kD, "d"},
                                                              {kE, "e"},
                                                              {kH, "h"},
                                                              {kL, "l"},
                                                              {kO, "o"},
                                                              {kR, "r"},
                                                              {kW, "w"},
                                                              {kX, "x"},
                                                              {kY, "y"},
                                                              {kZ, "z"},
                                                              {kEAcute, "\xC3\xA9"},
                                                              {kNewline, "\n"},
                                                              {kHe, "he"},
                                                              {kEl, "el"},
                                                              {kLl, "ll"},
                                                              {kLo, "lo"},
                                                              {kLlo, "llo"},
                                                              {kHello, "hello"},
                                                              {kSpaceHello, " hello"},
                                                              {kXy, "xy"},
                                                              {kYz, "yz"},
                                                              {kSpaceW, " w"},
                                                              {kOr, "or"},
                                                              {kSpaceWor, " wor"},
                                                              {kLd, "ld"},
                                                              {kSpaceWorld, " world"},
                                                              {kTwoSpaces, "  "}};
  for (const auto& [id, text] : named) EXPECT_EQ(v.tokens[id], text) << "id " << id;
  return v;
}

// A file name of this test's own, so parallel test processes never share one.
std::filesystem::path temp_file(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::filesystem::path(::testing::TempDir()) /
         fmt::format("shardflow_tokenizer_{}_{}_{}_{}.bin", info->test_suite_name(), info->name(),
                     tag, getpid());
}

std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// The bytes of `vocab` as Tokenizer::write produces them.
std::vector<std::byte> file_bytes(const Vocab& vocab) {
  const std::filesystem::path path = temp_file("bytes");
  Tokenizer::write(path, vocab.tokens, vocab.scores);
  std::vector<std::byte> bytes = read_bytes(path);
  std::filesystem::remove(path);
  return bytes;
}

Tokenizer load_test_tokenizer() {
  const std::filesystem::path path = temp_file("vocab");
  const Vocab vocab = test_vocab();
  Tokenizer::write(path, vocab.tokens, vocab.scores);
  Tokenizer tokenizer = Tokenizer::load(path, kTestVocabSize);
  std::filesystem::remove(path);
  return tokenizer;
}

// Where record `index` starts in a file of `vocab`.
std::size_t record_offset(const Vocab& vocab, int64_t index) {
  std::size_t offset = 4;
  for (int64_t i = 0; i < index; ++i) offset += 8 + vocab.tokens[i].size();
  return offset;
}

void put_i32(std::vector<std::byte>& bytes, std::size_t offset, int32_t value) {
  const auto bits = std::bit_cast<uint32_t>(value);
  for (std::size_t k = 0; k < 4; ++k) bytes[offset + k] = std::byte((bits >> (8 * k)) & 0xFF);
}

// ---------------------------------------------------------------------------
// A reference encoder written straight from the description, with none of the
// library's machinery: split into code points (validated by decoding them),
// look each up, fall back to bytes, then rescan for the best pair per merge.

// The length of the valid UTF-8 sequence at text[i], or 0.
std::size_t reference_utf8_length(std::string_view text, std::size_t i) {
  const auto u = [&](std::size_t k) {
    return static_cast<uint32_t>(static_cast<unsigned char>(text[k]));
  };
  const uint32_t lead = u(i);
  if (lead < 0x80) return 1;
  std::size_t length = (lead >> 5) == 0x6    ? 2
                       : (lead >> 4) == 0xE  ? 3
                       : (lead >> 3) == 0x1E ? 4
                                             : 0;
  if (length == 0 || i + length > text.size()) return 0;
  uint32_t code = lead & (0x7F >> length);
  for (std::size_t k = 1; k < length; ++k) {
    if ((u(i + k) >> 6) != 0x2) return 0;
    code = (code << 6) | (u(i + k) & 0x3F);
  }
  const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < smallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return length;
}

std::vector<int64_t> reference_encode(const Vocab& vocab, std::string_view text) {
  std::map<std::string, int64_t> ids;  // ordinary tokens only; the first id wins
  for (std::size_t id = 259; id < vocab.tokens.size(); ++id) {
    if (!vocab.tokens[id].empty()) ids.emplace(vocab.tokens[id], static_cast<int64_t>(id));
  }
  std::vector<int64_t> out;
  if (text.empty()) return out;
  const std::string s = " " + std::string(text);
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = reference_utf8_length(s, i);
    const auto it = n == 0 ? ids.end() : ids.find(s.substr(i, n));
    if (it != ids.end()) {
      out.push_back(it->second);
    } else {
      for (std::size_t k = 0; k < std::max<std::size_t>(n, 1); ++k) {
        out.push_back(3 + static_cast<unsigned char>(s[i + k]));
      }
    }
    i += std::max<std::size_t>(n, 1);
  }
  while (true) {
    float best_score = -std::numeric_limits<float>::infinity();
    int64_t best_id = -1;
    std::size_t best_at = 0;
    for (std::size_t i = 0; i + 1 < out.size(); ++i) {
      const auto it = ids.find(vocab.tokens[out[i]] + vocab.tokens[out[i + 1]]);
      if (it != ids.end() && (best_id < 0 || vocab.scores[it->second] > best_score)) {
        best_score = vocab.scores[it->second];
        best_id = it->second;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    out[best_at] = best_id;
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  return out;
}

std::vector<int64_t> with_markers(std::vector<int64_t> ids, bool bos, bool eos) {
  if (bos) ids.insert(ids.begin(), Tokenizer::kBos);
  if (eos) ids.push_back(Tokenizer::kEos);
  return ids;
}

// Random text from pieces chosen to hit merges, byte fallback and every kind
// of invalid UTF-8 (stray continuation bytes, cut sequences, overlong forms,
// surrogates, values past U+10FFFF), and NUL.
std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> kChunks = {"a",
                                                   "b",
                                                   "c",
                                                   "d",
                                                   "e",
                                                   "h",
                                                   "l",
                                                   "o",
                                                   "r",
                                                   "w",
                                                   "x",
                                                   "y",
                                                   "z",
                                                   " ",
                                                   "  ",
                                                   "\n",
                                                   "\t",
                                                   "hello",
                                                   " world",
                                                   "llo",
                                                   "xyz",
                                                   "\xC3\xA9",
                                                   "\xE2\x82\xAC",
                                                   "\xE6\x97\xA5",
                                                   "\xF0\x9F\x98\x80",
                                                   "\xC3",
                                                   "\x80",
                                                   "\xFF",
                                                   "\xE2\x82",
                                                   "\xC0\xAF",
                                                   "\xE0\x80\x80",
                                                   "\xED\xA0\x80",
                                                   "\xF4\x90\x80\x80",
                                                   std::string(1, '\0'),
                                                   "<0x41>",
                                                   "Q"};
  std::uniform_int_distribution<std::size_t> count(0, 24);
  std::uniform_int_distribution<std::size_t> pick(0, kChunks.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string text;
  const std::size_t n = count(rng);
  for (std::size_t i = 0; i < n; ++i) {
    // Mostly chunks, sometimes an arbitrary byte.
    if (byte(rng) < 32) {
      text += static_cast<char>(byte(rng));
    } else {
      text += kChunks[pick(rng)];
    }
  }
  return text;
}

// ---------------------------------------------------------------------------
// The file format.

TEST(TokenizerFile, WriteThenLoadKeepsTokensAndScores) {
  const Vocab vocab = test_vocab();
  const std::vector<std::byte> bytes = file_bytes(vocab);
  // max_token_length is the longest token: "\n</s>\n", "<0x00>", " hello" have 6 bytes.
  EXPECT_EQ(bytes[0], std::byte{6});
  EXPECT_EQ(bytes.size(), record_offset(vocab, kTestVocabSize));
  const Tokenizer tokenizer = load_test_tokenizer();
  ASSERT_EQ(tokenizer.vocab_size(), kTestVocabSize);
  for (int64_t id = 0; id < kTestVocabSize; ++id) {
    EXPECT_EQ(tokenizer.token(id), vocab.tokens[id]) << "id " << id;
    EXPECT_EQ(tokenizer.score(id), vocab.scores[id]) << "id " << id;
  }
}

// ---------------------------------------------------------------------------
// Encoding.

TEST(TokenizerEncode, HandWorkedMerges) {
  const Tokenizer tokenizer = load_test_tokenizer();
  using Ids = std::vector<int64_t>;

  // " hello" starts as ' ' h e l l o. Pairs: he 3.0 and el 3.0 tie, so the
  // leftmost, he, merges: ' ' he l l o. Then ll 2.5: ' ' he ll o. Then llo
  // 4.0: ' ' he llo. Then hello 5.0, then " hello" 6.0. Had the tie gone to
  // el, the result would be ' ' h el lo, since "hel" and "ello" are no tokens.
  EXPECT_EQ(tokenizer.encode("hello", false, false), (Ids{kSpaceHello}));

  // A higher score beats the leftmost pair: yz 2.0 merges, not xy 1.0,
  // and " x" and "xyz" are no tokens.
  EXPECT_EQ(tokenizer.encode("xyz", false, false), (Ids{kSpace, kX, kYz}));

  // " hello world": " hello" forms as above; then " w" 2.0 and or 2.0 tie
  // (the leftmost, " w", first), then " wor" 2.5, ld 1.5, " world" 3.0.
  EXPECT_EQ(tokenizer.encode("hello world", false, false), (Ids{kSpaceHello, kSpaceWorld}));

  // A leading space meets the dummy prefix: ' ' ' ' a -> "  " a.
  EXPECT_EQ(tokenizer.encode(" a", false, false), (Ids{kTwoSpaces, kA}));

  // No merges apply; every character is its own token.
  EXPECT_EQ(tokenizer.encode("bad\n", false, false), (Ids{kSpace, kB, kA, kD, kNewline}));
  EXPECT_EQ(tokenizer.encode("zero", false, false), (Ids{kSpace, kZ, kE, kR, kO}));
  // el 3.0 beats ll 2.5 in " cell", and then neither "cel" nor "ell" is a token.
  EXPECT_EQ(tokenizer.encode("cell", false, false), (Ids{kSpace, kC, kEl, kL}));
}

TEST(TokenizerEncode, ByteFallbackAndInvalidUtf8) {
  const Tokenizer tokenizer = load_test_tokenizer();
  using Ids = std::vector<int64_t>;
  const auto byte = [](int b) { return int64_t{3} + b; };
  // "é" is a token; "€" (E2 82 AC) is not and falls back to its three bytes.
  EXPECT_EQ(tokenizer.encode("\xC3\xA9\xE2\x82\xAC", false, false),
            (Ids{kSpace, kEAcute, byte(0xE2), byte(0x82), byte(0xAC)}));
  // ASCII with no token ('Q') falls back to its byte too.
  EXPECT_EQ(tokenizer.encode("aQ", false, false), (Ids{kSpace, kA, byte('Q')}));
  // Stray bytes are units of their own and never swallow the next character.
  EXPECT_EQ(tokenizer.encode("a\xFF"
                             "b",
                             false, false),
            (Ids{kSpace, kA, byte(0xFF), kB}));
  EXPECT_EQ(tokenizer.encode("\x80"
                             "a",
                             false, false),
            (Ids{kSpace, byte(0x80), kA}));
  // A sequence cut short: C3 followed by 'a' is two units.
  EXPECT_EQ(tokenizer.encode("\xC3"
                             "a",
                             false, false),
            (Ids{kSpace, byte(0xC3), kA}));
  // Overlong "/" (C0 AF) and a surrogate (ED A0 80) are invalid byte by byte.
  EXPECT_EQ(tokenizer.encode("\xC0\xAF", false, false), (Ids{kSpace, byte(0xC0), byte(0xAF)}));
  EXPECT_EQ(tokenizer.encode("\xED\xA0\x80", false, false),
            (Ids{kSpace, byte(0xED), byte(0xA0), byte(0x80)}));
  // NUL is a character like any other (llama2.c's C strings would stop there).
  EXPECT_EQ(tokenizer.encode(std::string("a\0b", 3), false, false), (Ids{kSpace, kA, byte(0), kB}));
  // A literal byte token's text is plain text: it never merges into the byte token.
  EXPECT_EQ(tokenizer.encode("<0x41>", false, false).size(), 7u);
}

TEST(TokenizerEncode, BosEosAndEmptyText) {
  const Tokenizer tokenizer = load_test_tokenizer();
  using Ids = std::vector<int64_t>;
  EXPECT_EQ(tokenizer.encode("hello", true, true),
            (Ids{Tokenizer::kBos, kSpaceHello, Tokenizer::kEos}));
  EXPECT_EQ(tokenizer.encode("hello", true, false), (Ids{Tokenizer::kBos, kSpaceHello}));
  EXPECT_EQ(tokenizer.encode("hello", false, true), (Ids{kSpaceHello, Tokenizer::kEos}));
  // Empty text gets no dummy prefix.
  EXPECT_EQ(tokenizer.encode("", false, false), Ids{});
  EXPECT_EQ(tokenizer.encode("", true, false), (Ids{Tokenizer::kBos}));
  EXPECT_EQ(tokenizer.encode("", true, true), (Ids{Tokenizer::kBos, Tokenizer::kEos}));
  // A single space is not empty: dummy prefix plus the space.
  EXPECT_EQ(tokenizer.encode(" ", false, false), (Ids{kTwoSpaces}));
}

// A vocabulary the size of LLaMA's (32000) with many equal scores, and a text
// long enough that a quadratic merge loop would show: the heap-based merge
// must agree with the rescanning reference and round-trip.
TEST(TokenizerEncode, LargeVocabularyAgreesWithReference) {
  std::mt19937 rng(7);
  Vocab vocab = special_vocab();
  const std::string letters = " abcdefghijklmnop";
  for (const char c : letters) vocab.add(std::string(1, c), -100);
  std::uniform_int_distribution<std::size_t> letter(0, letters.size() - 1);
  std::uniform_int_distribution<int> length(2, 7), score(0, 9);  // few scores, many ties
  std::set<std::string> seen;
  while (vocab.tokens.size() < 32000) {
    std::string piece;
    const int n = length(rng);
    for (int i = 0; i < n; ++i) piece += letters[letter(rng)];
    if (seen.insert(piece).second) vocab.add(piece, static_cast<float>(score(rng)));
  }
  const std::filesystem::path path = temp_file("large");
  Tokenizer::write(path, vocab.tokens, vocab.scores);
  const Tokenizer tokenizer = Tokenizer::load(path, 32000);
  std::filesystem::remove(path);

  std::string text;
  for (int i = 0; i < 20000; ++i) text += letters[letter(rng)];
  const std::vector<int64_t> ids = tokenizer.encode(text, true, false);
  EXPECT_LT(ids.size(), text.size());
  EXPECT_EQ(tokenizer.decode(ids), text);
  for (std::size_t start = 0; start < 20000; start += 7000) {
    const std::string part = text.substr(start, 800);
    EXPECT_EQ(tokenizer.encode(part, false, false), reference_encode(vocab, part))
        << "at " << start;
  }
}

// ---------------------------------------------------------------------------
// Decoding.

TEST(TokenizerDecode, DropsLeadingSpaceOnlyAfterBos) {
  const Tokenizer tokenizer = load_test_tokenizer();
  EXPECT_EQ(tokenizer.decode(Tokenizer::kBos, kSpaceHello), "hello");
  EXPECT_EQ(tokenizer.decode(kSpaceHello, kSpaceWorld), " world");
  EXPECT_EQ(tokenizer.decode(-1, kSpaceHello), " hello");         // previous may be any value
  EXPECT_EQ(tokenizer.decode(Tokenizer::kBos, kTwoSpaces), " ");  // only one space goes
  EXPECT_EQ(tokenizer.decode(Tokenizer::kBos, kHello), "hello");
  // The dummy prefix may have fallen back to the byte token <0x20>; it goes too.
  EXPECT_EQ(tokenizer.decode(Tokenizer::kBos, 3 + 0x20), "");
  EXPECT_EQ(tokenizer.decode(kA, 3 + 0x20), " ");
  // BOS and EOS are markers and print nothing; <unk> prints its text.
  EXPECT_EQ(tokenizer.decode(kA, Tokenizer::kBos), "");
  EXPECT_EQ(tokenizer.decode(kA, Tokenizer::kEos), "");
  EXPECT_EQ(tokenizer.decode(kA, Tokenizer::kUnk), "<unk>");

  // Sequences: the start counts as after BOS, with or without BOS; after EOS
  // the space stays; a BOS in the middle starts a new text.
  const std::vector<int64_t> with_bos = {Tokenizer::kBos, kSpaceHello, kSpaceWorld,
                                         Tokenizer::kEos};
  const std::vector<int64_t> without_bos = {kSpaceHello, kSpaceWorld};
  const std::vector<int64_t> two_texts = {Tokenizer::kBos, kSpaceHello,     Tokenizer::kEos,
                                          kSpaceWorld,     Tokenizer::kBos, kSpaceWorld};
  EXPECT_EQ(tokenizer.decode(with_bos), "hello world");
  EXPECT_EQ(tokenizer.decode(without_bos), "hello world");
  EXPECT_EQ(tokenizer.decode(two_texts), "hello worldworld");
  EXPECT_EQ(tokenizer.decode(std::vector<int64_t>{}), "");
}

TEST(TokenizerDecode, ByteTokensDecodeToRawBytes) {
  const Tokenizer tokenizer = load_test_tokenizer();
  for (int b = 0; b < 256; ++b) {
    const std::string expected(1, static_cast<char>(b));
    EXPECT_EQ(tokenizer.decode(kA, 3 + b), expected) << "byte " << b;
  }
  // The three bytes of "€" decode back to it.
  const std::vector<int64_t> euro = {Tokenizer::kBos, kSpace, 3 + 0xE2, 3 + 0x82, 3 + 0xAC};
  EXPECT_EQ(tokenizer.decode(euro), "\xE2\x82\xAC");
}

TEST(TokenizerDecode, OutOfRangeIdsThrow) {
  const Tokenizer tokenizer = load_test_tokenizer();
  const auto expect_error = [](const std::function<void()>& call, const std::string& message) {
    try {
      call();
      ADD_FAILURE() << "no error; expected: " << message;
    } catch (const sf::Error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  };
  expect_error([&] { tokenizer.decode(Tokenizer::kBos, 290); },
               "token id 290 is out of range for a vocabulary of 290 tokens");
  expect_error([&] { tokenizer.decode(Tokenizer::kBos, -1); },
               "token id -1 is out of range for a vocabulary of 290 tokens");
  expect_error(
      [&] {
        tokenizer.decode(std::vector<int64_t>{kA, 1000});
      },
      "token id 1000 is out of range for a vocabulary of 290 tokens");
  expect_error([&] { tokenizer.token(-7); },
               "token id -7 is out of range for a vocabulary of 290 tokens");
}

// ---------------------------------------------------------------------------
// Round trips: decode(encode(text)) == text, the dummy prefix being dropped.

TEST(TokenizerRoundTrip, SeveralTexts) {
  const Tokenizer tokenizer = load_test_tokenizer();
  const std::vector<std::string> texts = {
      "hello world",
      "hello",
      "a",
      "",
      " ",
      " leading space",
      "two  spaces",
      "trailing ",
      "line\nbreak\n",
      "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC 12 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80",
      "bad \xFF\xFE utf-8 \xC3",
      std::string("nul\0byte", 8),
      "<0x41> stays text"};
  for (const std::string& text : texts) {
    for (const bool bos : {false, true}) {
      for (const bool eos : {false, true}) {
        SCOPED_TRACE(fmt::format("text {} bos {} eos {}", sf::quote_for_message(text), bos, eos));
        const std::vector<int64_t> ids = tokenizer.encode(text, bos, eos);
        EXPECT_EQ(tokenizer.decode(ids), text);
        // Piece by piece, as a generation loop prints: the same text.
        std::string printed;
        int64_t previous = Tokenizer::kBos;
        for (const int64_t id : ids) {
          printed += tokenizer.decode(previous, id);
          previous = id;
        }
        EXPECT_EQ(printed, text);
      }
    }
  }
}

TEST(TokenizerRoundTrip, RandomTextsMatchReferenceEncoder) {
  const Vocab vocab = test_vocab();
  const Tokenizer tokenizer = load_test_tokenizer();
  std::mt19937 rng(1234);
  for (int i = 0; i < 3000; ++i) {
    const std::string text = random_text(rng);
    const bool bos = (i & 1) != 0, eos = (i & 2) != 0;
    SCOPED_TRACE(fmt::format("case {} text {}", i, sf::quote_for_message(text)));
    const std::vector<int64_t> ids = tokenizer.encode(text, bos, eos);
    ASSERT_EQ(ids, with_markers(reference_encode(vocab, text), bos, eos));
    ASSERT_EQ(tokenizer.decode(ids), text);
  }
}

// ---------------------------------------------------------------------------
// Errors. To add a case: add a row with a name, a function that corrupts the
// bytes of the test vocabulary's file (or leaves them), the vocab_size to
// parse with, and a substring the message must contain.

struct BadFile {
  std::string name;
  std::function<void(std::vector<std::byte>&)> corrupt;
  int64_t vocab_size;
  std::string message;
};

TEST(TokenizerErrors, ParseRejectsBadFiles) {
  const Vocab vocab = test_vocab();
  const std::size_t file_size = record_offset(vocab, kTestVocabSize);
  const auto cut = [](std::size_t size) {
    return [size](std::vector<std::byte>& b) { b.resize(size); };
  };
  const auto set_i32 = [](std::size_t offset, int32_t value) {
    return [offset, value](std::vector<std::byte>& b) { put_i32(b, offset, value); };
  };
  const auto none = [](std::vector<std::byte>&) {};
  const std::size_t r5 = record_offset(vocab, 5), r7 = record_offset(vocab, 7);
  const std::size_t r_hello = record_offset(vocab, kSpaceHello);
  const std::size_t r_41 = record_offset(vocab, 3 + 0x41), r_x = record_offset(vocab, kX);
  const std::vector<BadFile> rows = {
      {"empty file", cut(0), 290,
       "test.bin: file has 0 bytes, too few for the 4-byte max_token_length header"},
      {"header cut", cut(3), 290, "file has 3 bytes, too few"},
      {"negative max_token_length", set_i32(0, -1), 290,
       "max_token_length is -1, expected 0..65536"},
      {"absurd max_token_length", set_i32(0, 0x7FFFFFFF), 290, "max_token_length is 2147483647"},
      {"cut in a score", cut(r5 + 2), 290,
       fmt::format("test.bin: token record 5 of 290 is truncated at byte {}: expected 8 bytes of "
                   "score and length, found 2",
                   r5)},
      {"cut in a token's text", cut(r_hello + 8 + 2), 290,
       fmt::format("test.bin: token record 281 of 290 is truncated at byte {}: expected 6 bytes of "
                   "token text, found 2",
                   r_hello + 8)},
      {"vocab_size above the file's", none, 291,
       fmt::format("token record 290 of 291 is truncated at byte {}: expected 8 bytes of score and "
                   "length, found 0",
                   file_size)},
      {"vocab_size below the file's", none, 289,
       "test.bin: 10 bytes follow the last of 289 token records; the tokenizer has more tokens "
       "than vocab_size 289"},
      {"negative length", set_i32(r7 + 4, -5), 290,
       "test.bin: token record 7 has negative length -5"},
      {"absurd length", set_i32(r7 + 4, 0x7FFFFFFF), 290,
       "token record 7 has length 2147483647, longer than max_token_length 6"},
      {"token longer than max_token_length", set_i32(0, 5), 290,
       "test.bin: token record 2 has length 6, longer than max_token_length 5"},
      {"vocab_size zero", none, 0,
       "test.bin: vocab_size 0 is out of range, expected 259..16777216 (<unk>, <s>, </s> and the "
       "256 byte tokens come first)"},
      {"vocab_size negative", none, -3, "vocab_size -3 is out of range"},
      {"vocab_size too small for byte tokens", none, 100, "vocab_size 100 is out of range"},
      {"vocab_size absurd", none, int64_t{1} << 40, "vocab_size 1099511627776 is out of range"},
      {"byte token replaced",
       [r_41](std::vector<std::byte>& b) { b[r_41 + 8 + 4] = std::byte{'2'}; }, 290,
       "test.bin: token 68 is \"<0x42>\", expected the byte token <0x41> (ids 3..258 hold "
       "<0x00>..<0xFF>)"},
      {"NaN score",
       [r_x](std::vector<std::byte>& b) {
         put_i32(b, r_x, std::bit_cast<int32_t>(std::numeric_limits<float>::quiet_NaN()));
       },
       290, "test.bin: token 270 (\"x\") has score nan"},
  };
  const std::vector<std::byte> good = file_bytes(vocab);
  ASSERT_EQ(good.size(), file_size);
  for (const BadFile& row : rows) {
    SCOPED_TRACE(row.name);
    std::vector<std::byte> bytes = good;
    row.corrupt(bytes);
    try {
      Tokenizer::parse(bytes, row.vocab_size, "test.bin");
      ADD_FAILURE() << "no error; expected: " << row.message;
    } catch (const sf::Error& e) {
      EXPECT_NE(std::string(e.what()).find(row.message), std::string::npos)
          << "message: " << e.what() << "\nexpected to contain: " << row.message;
    }
  }
}

TEST(TokenizerErrors, LoadReportsPathAndReason) {
  const std::filesystem::path missing = temp_file("missing");
  try {
    Tokenizer::load(missing, 290);
    ADD_FAILURE() << "loading a missing file succeeded";
  } catch (const sf::Error& e) {
    EXPECT_EQ(
        std::string(e.what()),
        fmt::format("cannot read tokenizer file {}: No such file or directory", missing.string()));
  }
  EXPECT_THROW(Tokenizer::load(::testing::TempDir(), 290), sf::Error);  // a directory

  // Errors inside the file name it.
  const std::filesystem::path path = temp_file("cut");
  const Vocab vocab = test_vocab();
  Tokenizer::write(path, vocab.tokens, vocab.scores);
  std::filesystem::resize_file(path, 100);
  try {
    Tokenizer::load(path, 290);
    ADD_FAILURE() << "loading a truncated file succeeded";
  } catch (const sf::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path.string() + ": token record ", 0), 0u) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(TokenizerErrors, ConstructorChecksVocabulary) {
  Vocab vocab = test_vocab();
  vocab.scores.pop_back();
  EXPECT_THROW(Tokenizer(vocab.tokens, vocab.scores), sf::Error);
  const Vocab special = special_vocab();
  EXPECT_NO_THROW(Tokenizer(special.tokens, special.scores));
  try {
    Tokenizer({"<unk>", "<s>", "</s>"}, {0, 0, 0});
    ADD_FAILURE() << "a vocabulary without byte tokens was accepted";
  } catch (const sf::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tokenizer has 3 tokens, expected 259..16777216 (<unk>, <s>, </s> and the 256 byte "
              "tokens come first)");
  }
  // Byte tokens in lower-case hex are accepted (llama2.c's decoder accepts both).
  Vocab lower = special_vocab();
  lower.tokens[3 + 0xAB] = "<0xab>";
  EXPECT_NO_THROW(Tokenizer(lower.tokens, lower.scores));
}

// ---------------------------------------------------------------------------
// Fuzzing: any bytes either load or throw shardflow::Error, and whatever
// loads encodes and decodes back to the text.

void expect_error_or_round_trip(std::span<const std::byte> bytes, int64_t vocab_size,
                                std::mt19937& rng, int& loaded) {
  std::optional<Tokenizer> tokenizer;
  try {
    tokenizer.emplace(Tokenizer::parse(bytes, vocab_size, "fuzz.bin"));
  } catch (const sf::Error&) {
    return;
  }
  ++loaded;
  for (int i = 0; i < 3; ++i) {
    const std::string text = random_text(rng);
    ASSERT_EQ(tokenizer->decode(tokenizer->encode(text, true, true)), text);
  }
}

TEST(TokenizerFuzz, RandomBytesThrowOrLoad) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<std::size_t> size(0, 96);
  int loaded = 0;
  for (int i = 0; i < 4000; ++i) {
    std::vector<std::byte> bytes(size(rng));
    for (std::byte& b : bytes) b = std::byte(byte(rng));
    const int64_t vocab_size = (i % 3 == 0) ? 259 : static_cast<int64_t>(byte(rng)) * 100 - 1000;
    expect_error_or_round_trip(bytes, vocab_size, rng, loaded);
  }
  EXPECT_EQ(loaded, 0);  // 96 random bytes cannot hold 259 records
}

TEST(TokenizerFuzz, MutatedFilesThrowOrRoundTrip) {
  const Vocab vocab = test_vocab();
  const std::vector<std::byte> good = file_bytes(vocab);
  std::mt19937 rng(2024);
  std::uniform_int_distribution<int> byte(0, 255), mutations(1, 3), kind(0, 4);
  const auto position = [&](std::size_t size) {
    return std::uniform_int_distribution<std::size_t>(0, size - 1)(rng);
  };
  const int32_t interesting[] = {-1,
                                 0,
                                 1,
                                 5,
                                 6,
                                 7,
                                 100,
                                 std::numeric_limits<int32_t>::max(),
                                 std::numeric_limits<int32_t>::min()};
  int loaded = 0;
  for (int i = 0; i < 3000; ++i) {
    std::vector<std::byte> bytes = good;
    const int n = mutations(rng);
    for (int m = 0; m < n && !bytes.empty(); ++m) {
      switch (kind(rng)) {
        case 0:  // one byte anywhere; mostly lands in token text
          bytes[position(bytes.size())] = std::byte(byte(rng));
          break;
        case 1:  // truncate
          bytes.resize(position(bytes.size()));
          break;
        case 2:  // an interesting int32 at a record's score or length
          if (bytes.size() >= 4) {
            put_i32(bytes, position(bytes.size() - 3), interesting[byte(rng) % 9]);
          }
          break;
        case 3:  // insert a few bytes
          bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(position(bytes.size())),
                       static_cast<std::size_t>(byte(rng) % 5 + 1), std::byte(byte(rng)));
          break;
        default: {  // change an ordinary token's text (keeps the file parseable)
          const std::size_t at = record_offset(vocab, 259 + byte(rng) % 31) + 8;
          if (at < bytes.size()) bytes[at] = std::byte(byte(rng));
          break;
        }
      }
    }
    SCOPED_TRACE(fmt::format("case {}", i));
    expect_error_or_round_trip(bytes, kTestVocabSize, rng, loaded);
    if (HasFatalFailure()) return;
  }
  // Both outcomes happen, so the fuzzing reaches past the parser.
  EXPECT_GT(loaded, 100);
  EXPECT_LT(loaded, 3000);
}

}  // namespace
