// Recursive-descent parser for Python literals (the subset ast.literal_eval
// accepts that shardflow needs), and Python-style printing of the values.
#include "shardflow/base/python_literal.h"

#include <fmt/format.h>

#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "shardflow/base/error.h"
#include "shardflow/base/text.h"

namespace shardflow {

// ---------------------------------------------------------------- values

PyValue PyValue::boolean(bool value) {
  PyValue v;
  v.kind_ = Kind::kBool;
  v.bool_ = value;
  return v;
}

PyValue PyValue::integer(int64_t value) {
  PyValue v;
  v.kind_ = Kind::kInt;
  v.int_ = value;
  return v;
}

PyValue PyValue::floating(double value) {
  PyValue v;
  v.kind_ = Kind::kFloat;
  v.float_ = value;
  return v;
}

PyValue PyValue::string(std::string value) {
  PyValue v;
  v.kind_ = Kind::kString;
  v.string_ = std::move(value);
  return v;
}

PyValue PyValue::tuple(std::vector<PyValue> items) {
  PyValue v;
  v.kind_ = Kind::kTuple;
  v.items_ = std::move(items);
  return v;
}

PyValue PyValue::list(std::vector<PyValue> items) {
  PyValue v;
  v.kind_ = Kind::kList;
  v.items_ = std::move(items);
  return v;
}

PyValue PyValue::dict(std::vector<std::pair<PyValue, PyValue>> entries) {
  PyValue v;
  v.kind_ = Kind::kDict;
  v.entries_ = std::move(entries);
  return v;
}

bool PyValue::as_bool() const {
  assert(kind_ == Kind::kBool && "PyValue::as_bool on a non-bool");
  return bool_;
}

int64_t PyValue::as_int() const {
  assert(kind_ == Kind::kInt && "PyValue::as_int on a non-int");
  return int_;
}

double PyValue::as_float() const {
  assert(kind_ == Kind::kFloat && "PyValue::as_float on a non-float");
  return float_;
}

const std::string& PyValue::as_string() const {
  assert(kind_ == Kind::kString && "PyValue::as_string on a non-str");
  return string_;
}

const std::vector<PyValue>& PyValue::items() const {
  assert(is_sequence() && "PyValue::items on a non-sequence");
  return items_;
}

const std::vector<std::pair<PyValue, PyValue>>& PyValue::entries() const {
  assert(kind_ == Kind::kDict && "PyValue::entries on a non-dict");
  return entries_;
}

const PyValue* PyValue::find(std::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (const auto& [k, v] : entries_) {
    if (k.kind_ == Kind::kString && k.string_ == key) return &v;
  }
  return nullptr;
}

std::string_view PyValue::type_name() const {
  switch (kind_) {
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kTuple:
      return "tuple";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
  }
  return "?";
}

static std::string float_repr(double value) {
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (std::isnan(value)) return "nan";
  // Shortest text that reads back to the same double, as Python prints it.
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

std::string PyValue::repr() const {
  switch (kind_) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return float_repr(float_);
    case Kind::kString:
      return python_repr(string_);
    case Kind::kTuple:
    case Kind::kList: {
      const bool is_tuple = kind_ == Kind::kTuple;
      std::string out = is_tuple ? "(" : "[";
      for (std::size_t i = 0; i < items_.size(); ++i) {
        if (i > 0) out += ", ";
        out += items_[i].repr();
      }
      if (is_tuple && items_.size() == 1) out += ",";
      out += is_tuple ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = "{";
      for (std::size_t i = 0; i < entries_.size(); ++i) {
        if (i > 0) out += ", ";
        out += entries_[i].first.repr() + ": " + entries_[i].second.repr();
      }
      return out + "}";
    }
  }
  return "?";
}

bool operator==(const PyValue& a, const PyValue& b) {
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case PyValue::Kind::kNone:
      return true;
    case PyValue::Kind::kBool:
      return a.bool_ == b.bool_;
    case PyValue::Kind::kInt:
      return a.int_ == b.int_;
    case PyValue::Kind::kFloat:
      return a.float_ == b.float_;
    case PyValue::Kind::kString:
      return a.string_ == b.string_;
    case PyValue::Kind::kTuple:
    case PyValue::Kind::kList:
      return a.items_ == b.items_;
    case PyValue::Kind::kDict:
      return a.entries_ == b.entries_;
  }
  return false;
}

// ---------------------------------------------------------------- parser

namespace {

constexpr int kMaxDepth = 64;

class LiteralParser {
 public:
  explicit LiteralParser(std::string_view text) : text_(text) {}

  PyValue parse_top_level() {
    // Python source is UTF-8: a stray byte would parse into a str that repr()
    // prints as an escape, which reads back as another value.
    for (std::size_t i = 0; i < text_.size(); ++i) {
      if (static_cast<unsigned char>(text_[i]) < 0x80) continue;
      const CodePoint code = decode_utf8(text_, i);
      if (code.length == 0) {
        fail_message(i, fmt::format("the text is not UTF-8 (byte 0x{:02x})", static_cast<unsigned char>(text_[i])));
      }
      i += code.length - 1;
    }
    skip_space();
    PyValue first = parse_value(0);
    skip_space();
    if (peek() == ',') {
      // A bare "a, b" at the top level is a tuple, as in Python.
      std::vector<PyValue> items{std::move(first)};
      while (peek() == ',') {
        ++pos_;
        skip_space();
        if (at_end()) break;
        items.push_back(parse_value(0));
        skip_space();
      }
      first = PyValue::tuple(std::move(items));
    }
    if (!at_end()) fail("the end of the literal");
    return first;
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_space() {
    while (!at_end()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
        ++pos_;
      } else {
        return;
      }
    }
  }

  [[noreturn]] void fail(std::string_view expected) const { fail_at(pos_, expected); }

  [[noreturn]] void fail_at(std::size_t pos, std::string_view expected) const {
    std::string found = "the end of the input";
    if (pos < text_.size()) {
      std::string quoted = quote_for_message(text_.substr(pos, 1));
      found = "'" + quoted.substr(1, quoted.size() - 2) + "'";
    }
    throw Error(fmt::format("invalid Python literal {} at column {}: expected {}, found {}", quote_for_message(text_),
                            pos + 1, expected, found));
  }

  [[noreturn]] void fail_message(std::size_t pos, std::string_view message) const {
    throw Error(fmt::format("invalid Python literal {} at column {}: {}", quote_for_message(text_), pos + 1, message));
  }

  PyValue parse_value(int depth) {
    skip_space();
    const char c = peek();
    if ((c == '(' || c == '[' || c == '{') && depth >= kMaxDepth) {
      fail_message(pos_, fmt::format("containers nested deeper than {} levels", kMaxDepth));
    }
    if (c == '(') return parse_parenthesised(depth);
    if (c == '[') return parse_list(depth);
    if (c == '{') return parse_dict(depth);
    if (c == '\'' || c == '"' || !string_prefix().empty()) return parse_strings();
    if (c == '-' || c == '+') return parse_signed();
    if (is_digit(c) || c == '.') return parse_number(false);
    if (is_identifier_start(c)) return parse_name();
    fail("a value (None, True, False, a number, a string, a tuple, a list or a dict)");
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_identifier_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

  PyValue parse_name() {
    const std::size_t start = pos_;
    while (!at_end() && (is_identifier_start(peek()) || is_digit(peek()))) ++pos_;
    const std::string_view name = text_.substr(start, pos_ - start);
    if (name == "None") return PyValue::none();
    if (name == "True") return PyValue::boolean(true);
    if (name == "False") return PyValue::boolean(false);
    fail_message(start, fmt::format("the name '{}' is not a literal (expected None, True, False, "
                                    "a number, a string, a tuple, a list or a dict)",
                                    name));
  }

  // One unary sign ("-1", "- 2", "+4") in front of a number; ast.literal_eval
  // rejects "--1", and so does this parser.
  PyValue parse_signed() {
    const bool negative = peek() == '-';
    ++pos_;
    skip_space();
    if (!is_digit(peek()) && peek() != '.') fail("a number after the sign");
    return parse_number(negative);
  }

  PyValue parse_number(bool negative) {
    const std::size_t start = pos_;
    if (peek() == '0' && pos_ + 1 < text_.size()) {
      const char prefix = static_cast<char>(text_[pos_ + 1] | 0x20);
      if (prefix == 'x') return parse_radix_int(start, 16, negative);
      if (prefix == 'o') return parse_radix_int(start, 8, negative);
      if (prefix == 'b') return parse_radix_int(start, 2, negative);
    }
    std::string digits;
    bool is_float = false;
    const auto take_digit_run = [&](bool required) {
      const std::size_t run_start = pos_;
      while (!at_end() && (is_digit(peek()) || peek() == '_')) {
        if (peek() == '_') {
          const bool between_digits =
              pos_ > run_start && is_digit(text_[pos_ - 1]) && pos_ + 1 < text_.size() && is_digit(text_[pos_ + 1]);
          if (!between_digits) fail_message(pos_, "'_' must separate two digits in a number");
        } else {
          digits += peek();
        }
        ++pos_;
      }
      if (required && pos_ == run_start) fail("a digit");
      return pos_ > run_start;
    };
    const bool has_int_part = take_digit_run(false);
    if (peek() == '.') {
      is_float = true;
      digits += '.';
      ++pos_;
      const bool has_fraction = take_digit_run(false);
      if (!has_int_part && !has_fraction) fail_at(start, "a number");
    }
    if (peek() == 'e' || peek() == 'E') {
      is_float = true;
      digits += 'e';
      ++pos_;
      if (peek() == '+' || peek() == '-') digits += text_[pos_++];
      take_digit_run(true);
    }
    if (!at_end() && (is_identifier_start(peek()))) {
      fail("a separator after the number");
    }
    if (is_float) {
      // strtod gives 0 on underflow and infinity on overflow, as Python does.
      char* end = nullptr;
      const double value = std::strtod(digits.c_str(), &end);
      if (end != digits.c_str() + digits.size()) fail_at(start, "a number");
      return PyValue::floating(negative ? -value : value);
    }
    if (digits.size() > 1 && digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos) {
      fail_message(start, "leading zeros in decimal integer literals are not permitted");
    }
    return PyValue::integer(to_int(digits, 10, start, negative));
  }

  PyValue parse_radix_int(std::size_t start, int radix, bool negative) {
    pos_ += 2;
    std::string digits;
    const auto is_radix_digit = [radix](char c) {
      if (radix == 16) return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
      return c >= '0' && c < static_cast<char>('0' + radix);
    };
    // Python allows one '_' before each digit, including right after the prefix.
    while (!at_end() && (is_radix_digit(peek()) || peek() == '_')) {
      if (peek() == '_') {
        if (pos_ + 1 >= text_.size() || !is_radix_digit(text_[pos_ + 1])) {
          fail_message(pos_, "'_' must be followed by a digit in a number");
        }
      } else {
        digits += peek();
      }
      ++pos_;
    }
    if (digits.empty()) fail(radix == 16 ? "a hexadecimal digit" : "a digit of the given base");
    if (!at_end() && (is_identifier_start(peek()) || is_digit(peek()))) {
      fail("a separator after the number");
    }
    return PyValue::integer(to_int(digits, radix, start, negative));
  }

  int64_t to_int(const std::string& digits, int radix, std::size_t start, bool negative) const {
    // Parse the magnitude unsigned so that -9223372036854775808 fits.
    uint64_t magnitude = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, radix);
    const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
    if (ec != std::errc() || end != digits.data() + digits.size() || magnitude > limit) {
      fail_message(start, "integer literal out of the 64-bit range");
    }
    if (negative)
      return magnitude == (uint64_t{1} << 63) ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(magnitude);
    return static_cast<int64_t>(magnitude);
  }

  // The string prefix (r, u, b, f and their pairs, any case) right before a
  // quote at the current position, in lower case; "" if there is none.
  std::string string_prefix() const {
    std::size_t n = 0;
    while (pos_ + n < text_.size() && n < 2 &&
           std::string_view("rRuUbBfF").find(text_[pos_ + n]) != std::string_view::npos) {
      ++n;
    }
    if (n == 0 || pos_ + n >= text_.size() || (text_[pos_ + n] != '\'' && text_[pos_ + n] != '"')) return "";
    std::string prefix;
    for (std::size_t i = 0; i < n; ++i) prefix += static_cast<char>(text_[pos_ + i] | 0x20);
    for (std::string_view valid : {"r", "u", "b", "f", "br", "rb", "fr", "rf"}) {
      if (prefix == valid) return prefix;
    }
    return "";
  }

  // One or more adjacent string literals, concatenated as Python does.
  PyValue parse_strings() {
    std::string value = parse_one_string();
    skip_space();
    while (peek() == '\'' || peek() == '"' || !string_prefix().empty()) {
      value += parse_one_string();
      skip_space();
    }
    return PyValue::string(std::move(value));
  }

  std::string parse_one_string() {
    const std::size_t start = pos_;
    const std::string prefix = string_prefix();
    if (prefix.find('b') != std::string::npos) {
      fail_message(start, "bytes literals (b'...') are not supported here; write a str");
    }
    if (prefix.find('f') != std::string::npos) fail_message(start, "an f-string is not a literal");
    const bool raw = prefix.find('r') != std::string::npos;
    pos_ += prefix.size();
    const char quote = peek();
    ++pos_;
    std::string out;
    while (true) {
      if (at_end()) fail_message(start, "unterminated string literal");
      const char c = text_[pos_];
      if (c == quote) {
        ++pos_;
        return out;
      }
      if (c == '\n') fail_message(start, "unterminated string literal (a newline inside quotes)");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) fail_message(start, "unterminated string literal");
      if (raw) {
        // A backslash stays, and keeps the next character (a quote or a
        // newline too) from ending the string.
        out += '\\';
        out += text_[pos_++];  // a newline too: Python keeps both
        continue;
      }
      read_escape(out);
    }
  }

  void read_escape(std::string& out) {
    const std::size_t escape_pos = pos_ - 1;
    const char c = text_[pos_++];
    switch (c) {
      case '\n':
        return;  // line continuation
      case '\\':
        out += '\\';
        return;
      case '\'':
        out += '\'';
        return;
      case '"':
        out += '"';
        return;
      case 'a':
        out += '\a';
        return;
      case 'b':
        out += '\b';
        return;
      case 'f':
        out += '\f';
        return;
      case 'n':
        out += '\n';
        return;
      case 'r':
        out += '\r';
        return;
      case 't':
        out += '\t';
        return;
      case 'v':
        out += '\v';
        return;
      case 'x':
        append_code_point(out, read_hex(2, escape_pos), escape_pos);
        return;
      case 'u':
        append_code_point(out, read_hex(4, escape_pos), escape_pos);
        return;
      case 'U':
        append_code_point(out, read_hex(8, escape_pos), escape_pos);
        return;
      case 'N':  // Python looks the name up in the Unicode database
        fail_message(escape_pos,
                     "\\N{...} escapes (Unicode character names) are not supported; write the "
                     "character itself or a \\u escape");
      default:
        break;
    }
    if (c >= '0' && c <= '7') {
      uint32_t code = static_cast<uint32_t>(c - '0');
      for (int k = 0; k < 2 && !at_end() && peek() >= '0' && peek() <= '7'; ++k) {
        code = code * 8 + static_cast<uint32_t>(text_[pos_++] - '0');
      }
      append_code_point(out, code, escape_pos);
      return;
    }
    // Python keeps unknown escapes verbatim.
    out += '\\';
    out += c;
  }

  uint32_t read_hex(int count, std::size_t escape_pos) {
    uint32_t code = 0;
    for (int k = 0; k < count; ++k) {
      if (at_end()) fail_message(escape_pos, fmt::format("truncated escape: expected {} hex digits", count));
      const char c = peek();
      int digit = -1;
      if (is_digit(c)) digit = c - '0';
      if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') digit = (c | 0x20) - 'a' + 10;
      if (digit < 0) fail(fmt::format("a hex digit in the escape at column {}", escape_pos + 1));
      code = code * 16 + static_cast<uint32_t>(digit);
      ++pos_;
    }
    return code;
  }

  void append_code_point(std::string& out, uint32_t code, std::size_t escape_pos) const {
    if (code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      fail_message(escape_pos, fmt::format("escape U+{:X} is not a valid Unicode code point", code));
    }
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  // "(" value ")" is the value itself; "()" and "(a,)" / "(a, b)" are tuples.
  PyValue parse_parenthesised(int depth) {
    ++pos_;
    skip_space();
    if (peek() == ')') {
      ++pos_;
      return PyValue::tuple({});
    }
    PyValue first = parse_value(depth + 1);
    skip_space();
    if (peek() == ')') {
      ++pos_;
      return first;
    }
    if (peek() != ',') fail("',' or ')'");
    std::vector<PyValue> items{std::move(first)};
    parse_sequence_tail(items, ')', depth);
    return PyValue::tuple(std::move(items));
  }

  PyValue parse_list(int depth) {
    ++pos_;
    skip_space();
    std::vector<PyValue> items;
    if (peek() == ']') {
      ++pos_;
      return PyValue::list({});
    }
    items.push_back(parse_value(depth + 1));
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return PyValue::list(std::move(items));
    }
    if (peek() != ',') fail("',' or ']'");
    parse_sequence_tail(items, ']', depth);
    return PyValue::list(std::move(items));
  }

  // After the first item, at a ','; reads ", item" pairs up to the closer.
  void parse_sequence_tail(std::vector<PyValue>& items, char closer, int depth) {
    const std::string expected = fmt::format("',' or '{}'", closer);
    while (peek() == ',') {
      ++pos_;
      skip_space();
      if (peek() == closer) break;
      items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() != ',' && peek() != closer) fail(expected);
    }
    if (peek() != closer) fail(expected);
    ++pos_;
  }

  PyValue parse_dict(int depth) {
    ++pos_;
    skip_space();
    std::vector<std::pair<PyValue, PyValue>> entries;
    while (peek() != '}') {
      const std::size_t key_pos = pos_;
      PyValue key = parse_value(depth + 1);
      if (key.kind() == PyValue::Kind::kList || key.kind() == PyValue::Kind::kDict) {
        fail_message(key_pos, fmt::format("unhashable type: '{}' cannot be a dict key", key.type_name()));
      }
      skip_space();
      if (peek() != ':') fail("':' after a dict key (set literals are not supported)");
      ++pos_;
      PyValue value = parse_value(depth + 1);
      // A repeated key keeps the last value, as in Python.
      bool replaced = false;
      for (auto& entry : entries) {
        if (entry.first == key) {
          entry.second = value;
          replaced = true;
        }
      }
      if (!replaced) entries.emplace_back(std::move(key), std::move(value));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("',' or '}'");
      }
    }
    ++pos_;
    return PyValue::dict(std::move(entries));
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

PyValue parse_python_literal(std::string_view text) { return LiteralParser(text).parse_top_level(); }

}  // namespace shardflow
