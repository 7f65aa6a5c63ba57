// Tests of reading Hugging Face tokenizer.json files (Tokenizer::load_hf and
// friends). Each test writes its own small tokenizer in the layout of LLaMA
// 2's: <unk>, <s>, </s>, the 256 byte tokens, then pieces with "▁" for spaces
// and a ranked list of merges.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "models/llama_tokenizer_json.h"
#include "shardflow/base/error.h"
#include "shardflow/models/tokenizer.h"

namespace sf = shardflow;
using json = nlohmann::json;
using sf::llama::Tokenizer;
using sf::llama_test::llama_style;

namespace {

using sf::llama_test::kMeta;

// Pieces spelling " hello world" and merges that build it, LLaMA style.
const std::vector<std::string> kPieces = {
    "\u2581", "h",        "e",   "l",           "o",       "w",  "r",         "d",  "he",
    "ll",     "\u2581he", "llo", "\u2581hello", "\u2581w", "or", "\u2581wor", "ld", "\u2581world"};
const std::vector<std::string> kMerges = {"h e",      "l l", "\u2581 he",  "ll o", "\u2581he llo",
                                          "\u2581 w", "o r", "\u2581w or", "l d",  "\u2581wor ld"};
constexpr int64_t kVocab = 320;

// The id of `piece` when `pieces` follow the byte tokens.
int64_t piece_id(const std::vector<std::string>& pieces, const std::string& piece) {
  const auto found = std::find(pieces.begin(), pieces.end(), piece);
  EXPECT_NE(found, pieces.end()) << piece;
  return 259 + static_cast<int64_t>(found - pieces.begin());
}

Tokenizer parse(const json& file, int64_t vocab = kVocab) {
  return Tokenizer::parse_hf(file.dump(), vocab, "tok.json");
}

// The error message of parsing `file`, or "" when it parses.
std::string error_of(const json& file, int64_t vocab = kVocab) {
  try {
    parse(file, vocab);
  } catch (const sf::Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfTokenizer, EncodesWithTheListedMergesAndDecodesBack) {
  const Tokenizer t = parse(llama_style(kPieces, kMerges));
  EXPECT_EQ(t.vocab_size(), kVocab);
  EXPECT_EQ(t.token(piece_id(kPieces, "\u2581hello")), " hello");  // "▁" is stored as a space
  EXPECT_EQ(t.encode("hello world", true, false),
            (std::vector<int64_t>{Tokenizer::kBos, piece_id(kPieces, "\u2581hello"),
                                  piece_id(kPieces, "\u2581world")}));
  EXPECT_EQ(t.decode(t.encode("hello world", true, true)), "hello world");
  // "q" has no piece: its byte token stands in.
  EXPECT_EQ(t.encode("hq", false, false),
            (std::vector<int64_t>{piece_id(kPieces, "\u2581"), piece_id(kPieces, "h"),
                                  Tokenizer::kFirstByteToken + 'q'}));
  // Ids the file does not use (the model's vocabulary is larger) decode to nothing.
  EXPECT_EQ(t.token(kVocab - 1), "");
  EXPECT_EQ(t.decode(std::vector<int64_t>{piece_id(kPieces, "\u2581world"), kVocab - 1}), "world");
}

TEST(HfTokenizer, OnlyListedPairsMergeLowestRankFirst) {
  // "ab" and "bc" are both pieces and pair merges; "abc" is only made from "ab" + "c".
  const std::vector<std::string> pieces = {"\u2581", "a", "b", "c", "ab", "bc", "abc", "\u2581a"};
  const auto id = [&](const std::string& p) { return piece_id(pieces, p); };
  // "b c" ranks before "a b": "abc" becomes a + bc, and a + bc is not a listed
  // merge, although llama2.c's rule (any pair whose text is a piece) would make "abc".
  const Tokenizer bc_first = parse(llama_style(pieces, {"b c", "a b", "ab c", "\u2581 a"}));
  EXPECT_EQ(bc_first.encode("abc", false, false), (std::vector<int64_t>{id("\u2581a"), id("bc")}));
  EXPECT_EQ(
      bc_first.encode("xabc", false, false),
      (std::vector<int64_t>{id("\u2581"), Tokenizer::kFirstByteToken + 'x', id("a"), id("bc")}));
  const Tokenizer ab_first = parse(llama_style(pieces, {"a b", "b c", "ab c", "\u2581 a"}));
  EXPECT_EQ(ab_first.encode("xabc", false, false),
            (std::vector<int64_t>{id("\u2581"), Tokenizer::kFirstByteToken + 'x', id("abc")}));
  // Without the listed merge, the pieces of "ab" stay apart, even with no merges at all.
  const Tokenizer unlisted = parse(llama_style(pieces, {"b c"}));
  EXPECT_EQ(unlisted.encode("ab", false, false),
            (std::vector<int64_t>{id("\u2581"), id("a"), id("b")}));
  EXPECT_EQ(parse(llama_style(pieces, {})).encode("ab", false, false),
            (std::vector<int64_t>{id("\u2581"), id("a"), id("b")}));
  // A pair listed twice takes its last rank, as in the tokenizers library.
  const Tokenizer relisted = parse(llama_style(pieces, {"b c", "a b", "ab c", "\u2581 a", "b c"}));
  EXPECT_EQ(relisted.encode("xabc", false, false),
            (std::vector<int64_t>{id("\u2581"), Tokenizer::kFirstByteToken + 'x', id("abc")}));
}

TEST(HfTokenizer, AMetaSpaceInTheTextIsASpace) {
  const Tokenizer t = parse(llama_style(kPieces, kMerges));
  EXPECT_EQ(t.encode("\u2581hello\u2581world", true, false), t.encode(" hello world", true, false));
  EXPECT_EQ(
      t.encode("hello\u2581world", false, false),
      (std::vector<int64_t>{piece_id(kPieces, "\u2581hello"), piece_id(kPieces, "\u2581world")}));
}

TEST(HfTokenizer, MergesAsPairsEqualMergesAsStrings) {
  json pairs = llama_style(kPieces, {});
  for (const std::string& merge : kMerges) {
    const std::size_t space = merge.find(' ');
    pairs["model"]["merges"].push_back({merge.substr(0, space), merge.substr(space + 1)});
  }
  const Tokenizer a = parse(pairs), b = parse(llama_style(kPieces, kMerges));
  for (const char* text : {"hello world", "world hello", "held low", "owl"}) {
    EXPECT_EQ(a.encode(text, true, false), b.encode(text, true, false)) << text;
  }
}

TEST(HfTokenizer, DummyPrefixFollowsTheNormalizerOrPreTokenizer) {
  const int64_t space = piece_id(kPieces, "\u2581"), h = piece_id(kPieces, "h");
  json metaspace = llama_style(kPieces, {});
  metaspace["normalizer"] = nullptr;
  metaspace["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", false}};
  EXPECT_EQ(parse(metaspace).encode("h", false, false), (std::vector<int64_t>{space, h}));
  metaspace["pre_tokenizer"]["prepend_scheme"] = "never";
  const Tokenizer no_prefix = parse(metaspace);
  EXPECT_EQ(no_prefix.encode("h h", false, false), (std::vector<int64_t>{h, space, h}));
  // Without a dummy prefix, decoding keeps a leading space.
  EXPECT_EQ(no_prefix.decode(no_prefix.encode(" h", true, false)), " h");
  json legacy = metaspace;
  legacy["pre_tokenizer"].erase("prepend_scheme");
  legacy["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(parse(legacy).encode("h", false, false), (std::vector<int64_t>{space, h}));
  // Metaspace adds no "▁" before a text that starts with one; Prepend always does.
  metaspace["pre_tokenizer"]["prepend_scheme"] = "first";
  EXPECT_EQ(parse(metaspace).encode(" h", false, false), (std::vector<int64_t>{space, h}));
  EXPECT_EQ(parse(llama_style(kPieces, {})).encode(" h", false, false),
            (std::vector<int64_t>{space, space, h}));
  json replace_only = llama_style(kPieces, {});
  replace_only["normalizer"]["normalizers"].erase(0);
  EXPECT_EQ(parse(replace_only).encode("h", false, false), (std::vector<int64_t>{h}));
}

// An added token as the file lists it: matched in the text as written.
json added(int64_t id, const std::string& content, bool special = true, bool lstrip = false,
           bool rstrip = false) {
  return {{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", false}, {"special", special}};
}

// kPieces take ids 259..276; these added tokens follow.
constexpr int64_t kX = 277, kXy = 278, kM = 279, kN = 280;

json with_added_tokens(json file) {
  file["added_tokens"].push_back(added(kX, "<x>"));
  file["added_tokens"].push_back(added(kXy, "<x>y", /*special=*/false));
  file["added_tokens"].push_back(added(kM, "<m>", true, /*lstrip=*/true, /*rstrip=*/true));
  return file;
}

std::vector<int64_t> join(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

TEST(HfTokenizer, AddedTokensAreCutOutOfTheTextBeforeBpe) {
  const auto id = [](const std::string& p) { return piece_id(kPieces, p); };
  // LLaMA 2's legacy layout: the Prepend normalizer runs on each piece
  // between added tokens, so each gets a "▁".
  const Tokenizer legacy = parse(with_added_tokens(llama_style(kPieces, kMerges)));
  EXPECT_EQ(legacy.encode("<s>hello</s> world", false, false),
            (std::vector<int64_t>{1, id("\u2581hello"), 2, id("\u2581"), id("\u2581world")}));
  EXPECT_EQ(legacy.encode("<s>", true, false), (std::vector<int64_t>{1, 1}));  // as the library does
  // Leftmost first, then the longest; an added token need not be special.
  EXPECT_EQ(legacy.encode("h<x>yd<x>", false, false),
            (std::vector<int64_t>{id("\u2581"), id("h"), kXy, id("\u2581"), id("d"), kX}));
  EXPECT_EQ(legacy.encode("<<x><x", false, false),
            join({legacy.encode("<", false, false), {kX}, legacy.encode("<x", false, false)}));
  // lstrip / rstrip take the white space around (Unicode's, such as U+3000),
  // but not what an earlier match took.
  EXPECT_EQ(legacy.encode("he \u3000<m>\n lo", false, false),
            join({{id("\u2581he")}, {kM}, legacy.encode("lo", false, false)}));
  EXPECT_EQ(legacy.encode("<m> <m>", false, false), (std::vector<int64_t>{kM, kM}));
  EXPECT_EQ(legacy.encode("<x> <m>", false, false), (std::vector<int64_t>{kX, kM}));
  // Metaspace with prepend_scheme first: only the piece at the start of the
  // text gets the "▁"; with always, every piece.
  json metaspace = with_added_tokens(llama_style(kPieces, kMerges));
  metaspace["normalizer"] = nullptr;
  metaspace["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", true}};
  const Tokenizer first = parse(metaspace);
  EXPECT_EQ(first.encode("hello<s>hello", false, false),
            (std::vector<int64_t>{id("\u2581hello"), 1, id("he"), id("llo")}));
  EXPECT_EQ(first.encode("<s> hello", false, false), (std::vector<int64_t>{1, id("\u2581hello")}));
  metaspace["pre_tokenizer"]["prepend_scheme"] = "always";
  EXPECT_EQ(parse(metaspace).encode("hello<s>hello", false, false),
            (std::vector<int64_t>{id("\u2581hello"), 1, id("\u2581hello")}));
  // Decoding: BOS and EOS are markers; other added tokens print their text;
  // only the text's first space is the dummy prefix.
  EXPECT_EQ(legacy.decode(legacy.encode("hello<x>", true, false)), "hello<x>");
  EXPECT_EQ(first.decode(first.encode("hello<s> hello", true, false)), "hello hello");
  // normalized: true (the default of non-special tokens) is looked for in
  // each piece after the normalizer, in its normalized form: with Prepend,
  // "▁<n>", so not inside a word.
  json with_normalized = with_added_tokens(llama_style(kPieces, kMerges));
  with_normalized["added_tokens"].push_back({{"id", kN}, {"content", "<n>"}, {"special", false}});
  const Tokenizer normalized = parse(with_normalized);
  EXPECT_EQ(normalized.encode("he <n>lo", false, false),
            join({{id("\u2581he"), kN}, {id("l"), id("o")}}));
  EXPECT_EQ(normalized.encode("<n>lo", false, false), (std::vector<int64_t>{kN, id("l"), id("o")}));
  const std::vector<int64_t> inside_a_word = normalized.encode("he<n>", false, false);
  EXPECT_EQ(std::count(inside_a_word.begin(), inside_a_word.end(), kN), 0);
}

// Random texts of added tokens, white space and letters against a slow
// splitter: at each position the longest added token matched as written,
// white space taken by lstrip/rstrip; then each piece between normalized
// and split at the normalized added token; each part encoded on its own.
// 100k copies of one added token (a 2.7 MB file took 69 s when each one
// re-sorted the set): the first copy is the one that matches, so the copies
// are dropped and the set is sorted once.
TEST(HfTokenizer, RepeatedAddedTokensMatchAsTheFirstAndLoadInLinearTime) {
  json repeated = with_added_tokens(llama_style(kPieces, kMerges));
  for (int copy = 0; copy < 100000; ++copy) repeated["added_tokens"].push_back(added(kN, "<x>"));
  const Tokenizer once = parse(with_added_tokens(llama_style(kPieces, kMerges)));
  const Tokenizer many = parse(repeated);
  for (const char* text : {"h<x>yd<x>", "<<x><x", "he <m> <x>y"}) {
    EXPECT_EQ(many.encode(text, true, false), once.encode(text, true, false)) << text;
  }
}

TEST(HfTokenizer, RandomTextsSplitAtAddedTokensAsTheReference) {
  const std::vector<std::string> fragments = {"<x>", "<x>y", "<m>", "<n>", " ", "\u3000", "\n", "h",
                                              "e",   "l",    "o",   "<",   "x", ">",      "y"};
  struct Reference {
    std::string content;
    int64_t id;
    bool strip;
  };
  const std::vector<Reference> as_written = {{"<x>y", kXy, false}, {"<x>", kX, false}, {"<m>", kM, true}};
  const auto white_at = [](const std::string& t, std::size_t i) -> std::size_t {
    if (t.compare(i, 3, "\u3000") == 0) return 3;
    return i < t.size() && (t[i] == ' ' || t[i] == '\n') ? 1 : 0;
  };
  // Parts of `text` between the matches of `patterns` (leftmost, longest,
  // no stripping), each with whether it starts `text`, and the match ids.
  const auto split = [&](const std::string& text, const std::vector<Reference>& patterns, auto&& part,
                         auto&& token) {
    std::size_t part_start = 0, at = 0;
    while (at < text.size()) {
      const Reference* hit = nullptr;
      for (const Reference& r : patterns) {
        if (text.compare(at, r.content.size(), r.content) == 0) {
          hit = &r;
          break;
        }
      }
      if (hit == nullptr) {
        ++at;
        continue;
      }
      std::size_t begin = at, end = at + hit->content.size();
      while (hit->strip && begin > part_start) {
        std::size_t length = 0;
        for (std::size_t l : {1, 3}) {
          if (begin >= l && white_at(text, begin - l) == l) length = l;
        }
        if (length == 0) break;
        begin -= length;
      }
      while (hit->strip && white_at(text, end) > 0) end += white_at(text, end);
      if (begin > part_start) part(text.substr(part_start, begin - part_start), part_start == 0);
      token(hit->id);
      part_start = at = end;
    }
    if (text.size() > part_start) part(text.substr(part_start), part_start == 0);
  };
  for (const bool legacy : {true, false}) {
    json file = with_added_tokens(llama_style(kPieces, kMerges));
    file["added_tokens"].push_back(added(kN, "<n>", false));
    file["added_tokens"].back()["normalized"] = true;
    // Encoders of normalized text: from the text's start, and elsewhere
    // (legacy: no prefix of their own, the normalizer put it there).
    json at_start = llama_style(kPieces, kMerges), elsewhere = at_start;
    if (legacy) {
      at_start["normalizer"]["normalizers"].erase(0);
      elsewhere = at_start;
    } else {
      for (json* f : {&file, &at_start, &elsewhere}) {
        (*f)["normalizer"] = nullptr;
        (*f)["pre_tokenizer"] = {
            {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", true}};
      }
      elsewhere["pre_tokenizer"]["prepend_scheme"] = "never";
    }
    const std::vector<Reference> normalized = {{legacy ? " <n>" : "<n>", kN, false}};
    const Tokenizer tokenizer = parse(file), first = parse(at_start), later = parse(elsewhere);
    std::mt19937 rng(11);
    for (int round = 0; round < 400; ++round) {
      std::string text;
      for (int n = static_cast<int>(rng() % 12); n-- > 0;) text += fragments[rng() % fragments.size()];
      std::vector<int64_t> want;
      const auto token = [&](int64_t id) { want.push_back(id); };
      split(text, as_written, [&](const std::string& piece, bool piece_starts) {
        split((legacy ? " " : "") + piece, normalized, [&](const std::string& part, bool part_starts) {
          const auto ids = (piece_starts && part_starts ? first : later).encode(part, false, false);
          want.insert(want.end(), ids.begin(), ids.end());
        }, token);
      }, token);
      ASSERT_EQ(tokenizer.encode(text, false, false), want) << (legacy ? "legacy" : "first") << ": " << text;
    }
  }
}

TEST(HfTokenizer, MetaspaceSplitKeepsMergesInsideWords) {
  const std::vector<std::string> pieces = {"\u2581",  "a",       "b",
                                           "\u2581a", "\u2581b", "\u2581\u2581"};
  const auto id = [&](const std::string& p) { return piece_id(pieces, p); };
  json file = llama_style(pieces, {"\u2581 \u2581", "\u2581 a", "\u2581 b"});
  file["normalizer"] = nullptr;
  file["pre_tokenizer"] = {{"type", "Metaspace"},
                           {"replacement", kMeta},
                           {"prepend_scheme", "always"},
                           {"split", false}};
  // One word: the two spaces merge first, and "▁▁" + "b" is no merge.
  EXPECT_EQ(parse(file).encode("a  b", false, false),
            (std::vector<int64_t>{id("\u2581a"), id("\u2581\u2581"), id("b")}));
  // Words "▁a", "▁", "▁b": each space starts one, so the spaces stay apart.
  file["pre_tokenizer"]["split"] = true;
  EXPECT_EQ(parse(file).encode("a  b", false, false),
            (std::vector<int64_t>{id("\u2581a"), id("\u2581"), id("\u2581b")}));
  file["pre_tokenizer"].erase("split");  // before tokenizers 0.14 Metaspace always split
  EXPECT_EQ(parse(file).encode("a  b", false, false),
            (std::vector<int64_t>{id("\u2581a"), id("\u2581"), id("\u2581b")}));
}

// The tokenizers library's BPE, written the slow way: merge the adjacent pair
// with the lowest rank (leftmost on ties) until no listed pair is adjacent.
std::vector<int64_t> reference_merge(
    std::vector<int64_t> ids,
    const std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>>& ranked) {
  for (;;) {
    std::size_t best = ids.size();
    int64_t best_rank = 0, merged = 0;
    for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
      const auto it = ranked.find({ids[i], ids[i + 1]});
      if (it != ranked.end() && (best == ids.size() || it->second.first < best_rank)) {
        best = i;
        best_rank = it->second.first;
        merged = it->second.second;
      }
    }
    if (best == ids.size()) return ids;
    ids[best] = merged;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

TEST(HfTokenizer, RandomMergeTablesMatchTheReferenceAndRoundTrip) {
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"\u2581", "a",      "b",
                                             "c",      "\u00e9", "\u4e2d"};  // ▁, a, b, c, é, 中
  for (int round = 0; round < 20; ++round) {
    // Pieces: the alphabet, then merges of random earlier pieces, in rank order.
    std::vector<std::string> pieces = alphabet;
    std::vector<std::string> merges;
    std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>>
        ranked;  // (left, right) -> (rank, merged)
    std::set<std::string> known(pieces.begin(), pieces.end());
    while (merges.size() < 40) {
      const auto l = static_cast<int64_t>(rng() % pieces.size()),
                 r = static_cast<int64_t>(rng() % pieces.size());
      const std::string text = pieces[l] + pieces[r];
      if (text.size() > 12 || ranked.count({259 + l, 259 + r})) continue;
      if (known.insert(text).second) pieces.push_back(text);
      const auto merged = 259 + static_cast<int64_t>(std::find(pieces.begin(), pieces.end(), text) -
                                                     pieces.begin());
      ranked[{259 + l, 259 + r}] = {static_cast<int64_t>(merges.size()), merged};
      merges.push_back(pieces[l] + " " + pieces[r]);
    }
    const Tokenizer t =
        parse(llama_style(pieces, merges), 259 + static_cast<int64_t>(pieces.size()));
    for (int sample = 0; sample < 30; ++sample) {
      // Text of alphabet characters, spaces and a few that have no piece ('x', an invalid byte).
      std::string text;
      const std::vector<std::string> letters = {" ",      "a",      "b", "c",
                                                "\u00e9", "\u4e2d", "x", "\xff"};
      for (std::size_t n = rng() % 16; n > 0; --n) text += letters[rng() % letters.size()];
      // The pieces before merging: characters ("▁" for spaces, with the dummy prefix) or their
      // bytes.
      std::vector<int64_t> start;
      const std::string spaced = text.empty() ? text : " " + text;  // no dummy prefix for no text
      for (std::size_t i = 0; i < spaced.size();) {
        std::size_t length = 1;
        for (const std::string& c : alphabet) {
          if (c != "\u2581" && spaced.compare(i, c.size(), c) == 0) length = c.size();
        }
        const std::string c =
            spaced.substr(i, length) == " " ? std::string(kMeta) : spaced.substr(i, length);
        const auto found = std::find(pieces.begin(), pieces.end(), c);
        if (found != pieces.end()) {
          start.push_back(259 + (found - pieces.begin()));
        } else {
          for (const char byte : c)
            start.push_back(Tokenizer::kFirstByteToken + static_cast<unsigned char>(byte));
        }
        i += length;
      }
      EXPECT_EQ(t.encode(text, false, false), reference_merge(start, ranked))
          << "round " << round << ": " << text;
      EXPECT_EQ(t.decode(t.encode(text, true, false)), text) << text;
    }
  }
}

TEST(HfTokenizer, LoadAnyPicksTheFormatByPath) {
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "hf_tokenizer_dir";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << llama_style(kPieces, kMerges).dump();
  const std::vector<int64_t> expected = {piece_id(kPieces, "\u2581hello")};
  EXPECT_EQ(Tokenizer::load_any(dir, kVocab).encode("hello", false, false), expected);
  EXPECT_EQ(Tokenizer::load_any(dir / "tokenizer.json", kVocab).encode("hello", false, false),
            expected);
  EXPECT_EQ(Tokenizer::load_hf(dir / "tokenizer.json", kVocab).encode("hello", false, false),
            expected);
  // Anything else is read as llama2.c's tokenizer.bin.
  try {
    Tokenizer::load_any(dir / "tokenizer.bin", kVocab);
    ADD_FAILURE() << "a missing tokenizer.bin loaded";
  } catch (const sf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read tokenizer file"), std::string::npos)
        << e.what();
  }
  try {
    Tokenizer::load_any(dir / "tokenizer.model", kVocab);
    ADD_FAILURE() << "a sentencepiece model loaded";
  } catch (const sf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sentencepiece .model files are not read"),
              std::string::npos)
        << e.what();
  }
  try {
    Tokenizer::load_any(std::filesystem::path(testing::TempDir()) / "no_such_dir" / "x.json",
                        kVocab);
    ADD_FAILURE() << "a missing tokenizer.json loaded";
  } catch (const sf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos) << e.what();
  }
}

TEST(HfTokenizer, UnsupportedOrInconsistentFilesNameTheField) {
  const json good = llama_style(kPieces, kMerges);
  ASSERT_EQ(error_of(good), "");
  struct Case {
    std::function<void(json&)> change;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["model"]["type"] = "Unigram"; }, "model.type is \"Unigram\", expected BPE"},
      {[](json& j) { j["model"]["byte_fallback"] = false; }, "model.byte_fallback is not true"},
      {[](json& j) { j["model"]["ignore_merges"] = true; }, "model.ignore_merges is not false"},
      {[](json& j) { j["model"].erase("vocab"); }, "model.vocab is missing, expected an object"},
      {[](json& j) { j["model"]["merges"] = 3; }, "model.merges is an integer, expected an array"},
      {[](json& j) { j["model"]["merges"].push_back("h e l"); },
       "model.merges[10] is \"h e l\", expected two pieces"},
      {[](json& j) { j["model"]["merges"].push_back("h q"); },
       "model.merges[10] names \"q\", which is not in the vocabulary"},
      {[](json& j) { j["model"]["merges"].push_back("d h"); },
       "merge 10 (\"d\" + \"h\") makes \"dh\", which is not an ordinary token"},
      {[](json& j) { j["model"]["merges"].push_back(json::array({"h"})); },
       "model.merges[10] is an array, expected"},
      {[](json& j) { j["model"]["vocab"]["zz"] = 4000; },
       "model.vocab[\"zz\"] is 4000, outside the model's vocabulary of 320"},
      // 2^63 is past int64: out of range, not read as a negative id.
      {[](json& j) { j["model"]["vocab"]["zz"] = uint64_t{1} << 63; },
       "model.vocab[\"zz\"] is 9223372036854775808, outside the model's vocabulary of 320"},
      {[](json& j) { j["model"]["vocab"]["zz"] = "5"; },
       "model.vocab[\"zz\"] is a string, expected an integer id"},
      {[](json& j) { j["model"]["vocab"]["zz"] = 260; },
       "gives id 260 to \"zz\", which \"h\" already has"},
      {[](json& j) { j["model"]["vocab"]["zz"] = 300; }, "has no token with id 277"},
      {[](json& j) {
         j["model"]["vocab"].erase("<s>");
         j["model"]["vocab"]["<bos>"] = 1;
         j["added_tokens"].erase(1);
       },
       "has \"<bos>\" at id 1, expected <s>"},
      {[](json& j) {
         j["model"]["vocab"].erase("<0x41>");
         j["model"]["vocab"]["A"] = 68;
       },
       "token 68 is \"A\", expected the byte token <0x41>"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "ByteLevel"}};
       },
       "pre_tokenizer is \"ByteLevel\", expected null or Metaspace"},
      {[](json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       "normalizer.type is \"NFKC\", expected Prepend or Replace"},
      {[](json& j) { j["normalizer"]["normalizers"].erase(1); }, "does not replace \" \" by"},
      {[](json& j) {
         j["added_tokens"].push_back({{"id", 5}});
       },
       "added_tokens[3].content is missing"},
      {[](json& j) { j = json::array(); }, "the file is an array, expected a JSON object"},
      {[](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout is 0.1, expected null"},
      {[](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; },
       "model.end_of_word_suffix is \"</w>\", expected null"},
      {[](json& j) { j["model"]["vocab"]["a b"] = 277; },
       "model.vocab[\"a b\"] holds a plain space"},
      {[](json& j) {
         j["added_tokens"].push_back(
             {{"id", 277}, {"content", "<x>"}, {"special", true}, {"single_word", true}});
       },
       "added_tokens[3].single_word is true for \"<x>\" (matched only as a whole word)"},
      {[](json& j) {
         j["added_tokens"].push_back({{"id", 277}, {"content", "<x>"}, {"normalized", 1}});
       },
       "added_tokens[3].normalized is an integer, expected true or false"},
      {[](json& j) {
         j["added_tokens"].push_back({{"id", 277}, {"content", "<x>"}, {"special", true}, {"lstrip", "yes"}});
       },
       "added_tokens[3].lstrip is a string, expected true or false"},
      {[](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"split", "no"}};
       },
       "pre_tokenizer.split is a string, expected true or false"},
      {[](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"add_prefix_space", 1}};
       },
       "pre_tokenizer.add_prefix_space is an integer, expected true or false"},
  };
  for (const Case& c : cases) {
    json changed = good;
    c.change(changed);
    const std::string message = error_of(changed);
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << "expected: " << c.expected << "\ngot: " << message;
    EXPECT_EQ(message.rfind("tokenizer 'tok.json'", 0), 0u) << message;
  }
  EXPECT_NE(error_of(good, 100).find("vocab_size 100 is out of range"), std::string::npos);
  try {
    Tokenizer::parse_hf("{\"model\": [", kVocab, "tok.json");
    ADD_FAILURE() << "truncated JSON parsed";
  } catch (const sf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer 'tok.json' is not valid JSON"),
              std::string::npos)
        << e.what();
  }
  // Text over the JSON size limit (64 MiB) is refused before parsing.
  try {
    Tokenizer::parse_hf(std::string((std::size_t{64} << 20) + 1, ' '), kVocab, "tok.json");
    ADD_FAILURE() << "oversized JSON parsed";
  } catch (const sf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer 'tok.json' has 67108865 bytes, more than the limit"),
              std::string::npos)
        << e.what();
  }
}

// Every value of `j` in document order, for picking one at random.
void collect_values(json& j, std::vector<json*>& out) {
  out.push_back(&j);
  if (j.is_structured()) {
    for (auto& child : j) collect_values(child, out);
  }
}

TEST(HfTokenizer, ValuesOfAnyTypeGiveErrorsNotCrashes) {
  const json good = llama_style(kPieces, kMerges);
  const std::vector<json> replacements = {
      nullptr, -1,  1e300,   json(18446744073709551615ull), json::array(), json::object(), "x",
      true,    277, "\u2581"};
  std::mt19937 rng(5);
  int loaded = 0;
  for (int round = 0; round < 600; ++round) {
    json changed = good;
    std::vector<json*> values;
    collect_values(changed, values);
    for (int n = 0; n < 1 + round % 3; ++n) {
      *values[rng() % values.size()] = replacements[rng() % replacements.size()];
      values.clear();
      collect_values(changed, values);
    }
    try {
      const Tokenizer t = parse(changed);
      t.decode(t.encode("hello world", true, true));
      ++loaded;
    } catch (const sf::Error&) {
    }
  }
  // Both outcomes occur: some replacements are harmless, most are refused.
  EXPECT_GT(loaded, 0);
  EXPECT_LT(loaded, 600);
}

TEST(HfTokenizer, ArbitraryBytesGiveErrorsNotCrashes) {
  const std::string good = llama_style(kPieces, kMerges).dump();
  std::mt19937 rng(11);
  int loaded = 0;
  for (int round = 0; round < 400; ++round) {
    std::string text = good;
    if (round % 4 == 0) text.resize(1 + rng() % (text.size() - 1));  // truncated
    for (std::size_t n = 1 + rng() % 4; n > 0; --n)
      text[rng() % text.size()] = static_cast<char>(rng() % 256);
    try {
      const Tokenizer t = Tokenizer::parse_hf(text, kVocab, "fuzz.json");
      t.decode(t.encode("hello world", true, true));
      ++loaded;
    } catch (const sf::Error&) {
    }
  }
  EXPECT_LT(loaded, 400);  // most mutations break the file
}

}  // namespace
