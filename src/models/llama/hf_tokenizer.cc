// Hugging Face tokenizer.json files of the sentencepiece-BPE family (see
// tokenizer.h), checked against what Tokenizer implements: anything that
// would tokenize differently (another model type, byte-level BPE, other
// normalizers or pre-tokenizers) is refused with the field that says so,
// rather than loaded and tokenized wrongly.
#include <fmt/format.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "json_file.h"
#include "meta_space.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"
#include "shardflow/models/tokenizer.h"

namespace shardflow::llama {

namespace {

class TokenizerJson {
 public:
  TokenizerJson(Json root, std::string source) : root_(std::move(root)), source_(std::move(source)) {}

  [[noreturn]] void fail(std::string_view field, std::string_view problem) const {
    throw Error(fmt::format("tokenizer '{}': {} {}", source_, field, problem));
  }

  const Json& object(const Json& parent, const char* key, std::string_view field) const {
    const auto it = parent.find(key);
    if (it == parent.end() || !it->is_object()) {
      fail(field, it == parent.end() ? "is missing, expected an object"
                                     : fmt::format("is {}, expected an object", describe(*it)));
    }
    return *it;
  }

  // The bool at `key`, or `fallback` when absent or null.
  bool optional_bool(const Json& parent, const char* key, std::string_view field, bool fallback) const {
    const auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(field, fmt::format("is {}, expected true or false", describe(*it)));
    return it->get<bool>();
  }

  // The string at `key`, or nullopt when absent or null.
  std::optional<std::string> optional_string(const Json& parent, const char* key, std::string_view field) const {
    const auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) fail(field, fmt::format("is {}, expected a string", describe(*it)));
    return it->get<std::string>();
  }

  // The dummy prefix and word splitting, from the normalizer and the
  // pre-tokenizer; refuses steps that would change the pieces otherwise.
  Tokenizer::RankedOptions options() const {
    bool prepend = false, spaces_replaced = false, split = false;
    std::string scheme = "never";  // Metaspace's prepend_scheme
    const auto normalizer = [&](const Json& step, const std::string& field) {
      if (!step.is_object()) fail(field, fmt::format("is {}, expected an object", describe(step)));
      const std::string type = optional_string(step, "type", field + ".type").value_or("");
      if (type == "Prepend") {
        if (optional_string(step, "prepend", field + ".prepend") != std::string(kMetaSpace)) {
          fail(field + ".prepend", "is not \"\u2581\"; only the sentencepiece dummy prefix is supported");
        }
        prepend = true;
      } else if (type == "Replace") {
        const auto pattern = step.find("pattern");
        const bool space = pattern != step.end() && pattern->is_object() && pattern->contains("String") &&
                           pattern->at("String") == " ";
        if (!space || optional_string(step, "content", field + ".content") != std::string(kMetaSpace)) {
          fail(field,
               "replaces something other than \" \" by \"\u2581\"; no other replacement is "
               "supported");
        }
        spaces_replaced = true;
      } else {
        fail(field + ".type", fmt::format("is {}, expected Prepend or Replace (sentencepiece-style "
                                          "normalization; other normalizers are not supported)",
                                          quote_for_message(type, 40)));
      }
    };
    if (const auto it = root_.find("normalizer"); it != root_.end() && !it->is_null()) {
      if (it->is_object() && it->value("type", Json()) == "Sequence") {
        const auto steps = it->find("normalizers");
        if (steps == it->end() || !steps->is_array()) fail("normalizer.normalizers", "is not an array");
        for (std::size_t i = 0; i < steps->size(); ++i) {
          normalizer((*steps)[i], fmt::format("normalizer.normalizers[{}]", i));
        }
      } else {
        normalizer(*it, "normalizer");
      }
    }
    if (const auto it = root_.find("pre_tokenizer"); it != root_.end() && !it->is_null()) {
      const std::string type = it->is_object() ? optional_string(*it, "type", "pre_tokenizer.type").value_or("") : "";
      if (type != "Metaspace") {
        fail("pre_tokenizer", fmt::format("is {}, expected null or Metaspace (byte-level BPE, as in LLaMA 3 and "
                                          "GPT-2, and word splitting are not supported)",
                                          type.empty() ? describe(*it) : quote_for_message(type, 40)));
      }
      if (optional_string(*it, "replacement", "pre_tokenizer.replacement").value_or(std::string(kMetaSpace)) !=
          kMetaSpace) {
        fail("pre_tokenizer.replacement", "is not \"\u2581\"");
      }
      // prepend_scheme since tokenizers 0.14, add_prefix_space before.
      scheme = optional_string(*it, "prepend_scheme", "pre_tokenizer.prepend_scheme")
                   .value_or(optional_bool(*it, "add_prefix_space", "pre_tokenizer.add_prefix_space", true) ? "always"
                                                                                                            : "never");
      if (scheme != "first" && scheme != "always" && scheme != "never") {
        fail("pre_tokenizer.prepend_scheme",
             fmt::format("is {}, expected first, always or never", quote_for_message(scheme, 40)));
      }
      spaces_replaced = true;
      // Before tokenizers 0.14 Metaspace always split; since, "split" says.
      split = optional_bool(*it, "split", "pre_tokenizer.split", true);
    }
    if (!spaces_replaced) {
      fail("normalizer",
           "does not replace \" \" by \"\u2581\" and there is no Metaspace pre_tokenizer; "
           "the sentencepiece-style vocabulary would never see a space");
    }
    // The normalizer runs first: after Prepend, Metaspace finds its "▁" there.
    using Prefix = Tokenizer::DummyPrefix;
    Tokenizer::RankedOptions ranked;
    ranked.dummy_prefix = prepend              ? Prefix::kAlways
                          : scheme == "always" ? Prefix::kUnlessLeadingSpace
                          : scheme == "first"  ? Prefix::kAtTextStartUnlessLeadingSpace
                                               : Prefix::kNever;
    ranked.split_at_spaces = split;
    return ranked;
  }

  Tokenizer build(int64_t vocab_size) const {
    if (vocab_size < Tokenizer::kMinVocabSize || vocab_size > Tokenizer::kMaxVocabSize) {
      throw Error(fmt::format("tokenizer '{}': vocab_size {} is out of range, expected {}..{}", source_, vocab_size,
                              Tokenizer::kMinVocabSize, Tokenizer::kMaxVocabSize));
    }
    try {
      return build_checked(vocab_size);
    } catch (const Json::exception& e) {  // a field of an unexpected type that a check above missed
      throw Error(fmt::format("tokenizer '{}': {}", source_, e.what()));
    }
  }

 private:
  Tokenizer build_checked(int64_t vocab_size) const {
    if (!root_.is_object()) fail("the file", fmt::format("is {}, expected a JSON object", describe(root_)));
    const Json& model = object(root_, "model", "model");
    const std::string type = optional_string(model, "type", "model.type").value_or("BPE");
    if (type != "BPE") {
      fail("model.type",
           fmt::format("is {}, expected BPE (sentencepiece-style, as LLaMA 1 and 2 use)", quote_for_message(type, 40)));
    }
    if (model.value("byte_fallback", Json(false)) != true) {
      fail("model.byte_fallback",
           "is not true; the byte tokens <0x00>..<0xFF> must stand in for unknown "
           "characters (sentencepiece-style BPE)");
    }
    // Options of the tokenizers library's BPE that change the pieces.
    for (const char* option : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
      const auto it = model.find(option);
      if (it != model.end() && !it->is_null() && *it != "" && *it != 0) {
        fail(fmt::format("model.{}", option), fmt::format("is {}, expected null (not supported)", it->dump()));
      }
    }
    if (model.value("ignore_merges", Json(false)) != false) {
      fail("model.ignore_merges",
           "is not false; whole words are not looked up before merging (LLaMA 3's "
           "byte-level tokenizers do that)");
    }
    Tokenizer::RankedOptions ranked = options();

    // Ids of the vocabulary and the added tokens, by their text as written.
    std::vector<std::optional<std::string>> texts;
    std::unordered_map<std::string, int64_t> ids;
    const auto add = [&](const std::string& text, const Json& id_value, const std::string& field) -> int64_t {
      if (!id_value.is_number_integer()) fail(field, fmt::format("is {}, expected an integer id", describe(id_value)));
      // An unsigned id past int64's range is out of range too, not negative.
      if (id_value.is_number_unsigned() && id_value.get<uint64_t>() >= static_cast<uint64_t>(vocab_size)) {
        fail(field, fmt::format("is {}, outside the model's vocabulary of {} tokens (vocab_size)",
                                id_value.get<uint64_t>(), vocab_size));
      }
      const auto id = id_value.get<int64_t>();
      if (id < 0 || id >= vocab_size) {
        fail(field, fmt::format("is {}, outside the model's vocabulary of {} tokens (vocab_size)", id, vocab_size));
      }
      const auto index = static_cast<std::size_t>(id);
      if (texts.size() <= index) texts.resize(index + 1);
      std::optional<std::string>& slot = texts[index];
      if (slot && *slot != text) {
        fail(field, fmt::format("gives id {} to {}, which {} already has", id, quote_for_message(text, 40),
                                quote_for_message(*slot, 40)));
      }
      slot = text;
      ids.try_emplace(text, id);
      return id;
    };
    const Json& vocab = object(model, "vocab", "model.vocab");
    for (const auto& [text, id] : vocab.items()) {
      const std::string field = fmt::format("model.vocab[{}]", quote_for_message(text, 40));
      // Spaces are written "▁" and stored as spaces: a plain one would collide.
      if (text.find(' ') != std::string::npos) fail(field, "holds a plain space; spaces are written \"\u2581\"");
      add(text, id, field);
    }
    if (const auto added = root_.find("added_tokens"); added != root_.end() && !added->is_null()) {
      if (!added->is_array()) fail("added_tokens", fmt::format("is {}, expected an array", describe(*added)));
      for (std::size_t i = 0; i < added->size(); ++i) {
        const Json& entry = (*added)[i];
        const std::string field = fmt::format("added_tokens[{}]", i);
        if (!entry.is_object()) fail(field, fmt::format("is {}, expected an object", describe(entry)));
        const auto content = optional_string(entry, "content", field + ".content");
        if (!content) fail(field + ".content", "is missing");
        const int64_t id = add(*content, entry.value("id", Json()), field + ".id");
        // The tokenizers library cuts added tokens out of the text before
        // BPE; single_word ones only where they stand between words.
        if (optional_bool(entry, "single_word", field + ".single_word", false)) {
          fail(field + ".single_word",
               fmt::format("is true for {} (matched only as a whole word), which shardflow does "
                           "not implement",
                           quote_for_message(*content, 40)));
        }
        if (content->empty()) continue;  // a token no text matches, as in the tokenizers library
        const bool special = optional_bool(entry, "special", field + ".special", false);
        ranked.added_tokens.push_back({*content, id, optional_bool(entry, "lstrip", field + ".lstrip", false),
                                       optional_bool(entry, "rstrip", field + ".rstrip", false),
                                       // Absent, the library's default: special tokens as written.
                                       optional_bool(entry, "normalized", field + ".normalized", !special)});
      }
    }
    for (std::size_t id = 0; id < texts.size(); ++id) {
      if (!texts[id]) fail("model.vocab", fmt::format("has no token with id {} (ids must run from 0 up)", id));
    }
    const std::pair<int64_t, const char*> specials[] = {
        {Tokenizer::kUnk, "<unk>"}, {Tokenizer::kBos, "<s>"}, {Tokenizer::kEos, "</s>"}};
    for (const auto& [id, text] : specials) {
      if (texts.size() <= static_cast<std::size_t>(id) || *texts[static_cast<std::size_t>(id)] != text) {
        fail("model.vocab", fmt::format("has {} at id {}, expected {} (LLaMA's <unk>, <s>, </s> at ids 0, 1, 2)",
                                        texts.size() > static_cast<std::size_t>(id)
                                            ? quote_for_message(*texts[static_cast<std::size_t>(id)], 40)
                                            : std::string("nothing"),
                                        id, text));
      }
    }

    // Ranked merges: "left right" (tokenizers < 0.20) or ["left", "right"].
    std::vector<Tokenizer::Merge> merges;
    const auto listed = model.find("merges");
    if (listed == model.end()) fail("model.merges", "is missing, expected an array");
    if (!listed->is_array()) fail("model.merges", fmt::format("is {}, expected an array", describe(*listed)));
    merges.reserve(listed->size());
    for (std::size_t rank = 0; rank < listed->size(); ++rank) {
      const Json& entry = (*listed)[rank];
      const std::string field = fmt::format("model.merges[{}]", rank);
      std::string left, right;
      if (entry.is_string()) {
        const std::string& text = entry.get_ref<const std::string&>();
        const std::size_t space = text.find(' ');
        if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
          fail(field, fmt::format("is {}, expected two pieces separated by one space", quote_for_message(text, 40)));
        }
        left = text.substr(0, space);
        right = text.substr(space + 1);
      } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
        left = entry[0].get<std::string>();
        right = entry[1].get<std::string>();
      } else {
        fail(field, fmt::format("is {}, expected \"left right\" or [\"left\", \"right\"]", describe(entry)));
      }
      const auto piece = [&](const std::string& text) {
        const auto it = ids.find(text);
        if (it == ids.end())
          fail(field, fmt::format("names {}, which is not in the vocabulary", quote_for_message(text, 40)));
        return it->second;
      };
      merges.push_back({piece(left), piece(right)});
    }

    std::vector<std::string> tokens(static_cast<std::size_t>(vocab_size));
    for (std::size_t id = 0; id < texts.size(); ++id) tokens[id] = spaces_for_meta_spaces(*texts[id]);
    try {
      return Tokenizer(std::move(tokens), merges, ranked);
    } catch (const Error& e) {
      throw Error(fmt::format("tokenizer '{}': {}", source_, e.what()));
    }
  }

  Json root_;
  std::string source_;
};

}  // namespace

Tokenizer Tokenizer::parse_hf(std::string_view json, int64_t vocab_size, const std::string& source_name) {
  return TokenizerJson(parse_json(json, "tokenizer", source_name), source_name).build(vocab_size);
}

Tokenizer Tokenizer::load_hf(const std::filesystem::path& path, int64_t vocab_size) {
  return TokenizerJson(read_json(path, "tokenizer"), path.string()).build(vocab_size);
}

}  // namespace shardflow::llama
