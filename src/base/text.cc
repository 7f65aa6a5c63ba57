#include "shardflow/base/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace shardflow {

CodePoint decode_utf8(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  std::size_t length = 0;
  uint32_t code = 0;
  if (lead < 0x80) return {lead, 1};
  // C0, C1 and F5..FF never start a sequence; 80..BF are continuation bytes.
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code = lead & 0x07;
  } else {
    return {};
  }
  if (i + length > text.size()) return {};
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return {};
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  const bool overlong = (length == 3 && code < 0x800) || (length == 4 && code < 0x10000);
  const bool surrogate = code >= 0xD800 && code <= 0xDFFF;
  if (overlong || surrogate || code > 0x10FFFF) return {};
  return {code, length};
}

// Code points Python's repr() escapes: controls, format characters, line and
// paragraph separators, spaces other than ' ', private use. (Unassigned code
// points, which Python also escapes, are printed as they are.)
static bool is_printable(uint32_t code) {
  struct Range {
    uint32_t first, last;
  };
  static constexpr Range kNotPrintable[] = {
      {0x80, 0xA0},     {0xAD, 0xAD},     {0x600, 0x605},   {0x61C, 0x61C},   {0x6DD, 0x6DD},     {0x70F, 0x70F},
      {0x1680, 0x1680}, {0x180E, 0x180E}, {0x2000, 0x200F}, {0x2028, 0x202F}, {0x205F, 0x2064},   {0x2066, 0x206F},
      {0x3000, 0x3000}, {0xE000, 0xF8FF}, {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB}, {0xF0000, 0x10FFFF}};
  for (const Range& range : kNotPrintable) {
    if (code >= range.first && code <= range.last) return false;
  }
  return true;
}

static void append_escaped(std::string& out, std::string_view text, std::size_t max_bytes, char quote) {
  for (std::size_t i = 0; i < text.size() && i < max_bytes; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\' || c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (const CodePoint code = decode_utf8(text, i); code.length > 0) {
      if (is_printable(code.value)) {
        out.append(text.substr(i, code.length));
      } else if (code.value < 0x100) {
        out += fmt::format("\\x{:02x}", code.value);
      } else if (code.value < 0x10000) {
        out += fmt::format("\\u{:04x}", code.value);
      } else {
        out += fmt::format("\\U{:08x}", code.value);
      }
      i += code.length - 1;
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
}

std::string python_repr(std::string_view text) {
  const bool has_single = text.find('\'') != std::string_view::npos;
  const bool has_double = text.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  append_escaped(out, text, text.size(), quote);
  out += quote;
  return out;
}

std::string quote_for_message(std::string_view text, std::size_t max_bytes) {
  std::string out = "\"";
  append_escaped(out, text, max_bytes, '"');
  if (text.size() > max_bytes) out += "...";
  out += '"';
  return out;
}

std::string join_ints(std::span<const int64_t> values, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += separator;
    out += std::to_string(values[i]);
  }
  return out;
}

std::string python_int_tuple(std::span<const int64_t> values) {
  if (values.size() == 1) return fmt::format("({},)", values[0]);
  return "(" + join_ints(values, ", ") + ")";
}

std::string numpy_int_array(std::span<const int64_t> values) {
  // numpy's str(): elements right-aligned to a common width, lines wrapped at
  // 75 columns with a one-space hanging indent, and arrays of more than 1000
  // elements summarised as "first 3 ... last 3".
  if (values.empty()) return "[]";
  constexpr std::size_t kEdgeItems = 3;
  const bool summarise = values.size() > 1000;
  std::vector<std::string> words;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (summarise && i == kEdgeItems) {
      words.emplace_back("...");
      i = values.size() - kEdgeItems;
    }
    words.push_back(std::to_string(values[i]));
  }
  std::size_t width = 0;
  for (const std::string& word : words) {
    if (word != "...") width = std::max(width, word.size());
  }
  constexpr std::size_t kLineWidth = 74;  // 75 minus the closing bracket
  const std::string indent = " ";
  std::string text;
  std::string line = indent;
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::string word = words[i] == "..." ? words[i] : std::string(width - words[i].size(), ' ') + words[i];
    if (line.size() + word.size() > kLineWidth && line.size() > indent.size()) {
      text += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
      line = indent;
    }
    line += word;
    if (i + 1 < words.size()) line += ' ';
  }
  text += line;
  return "[" + text.substr(indent.size()) + "]";
}

}  // namespace shardflow
