#include "lexer.h"

#include <charconv>
#include <cstdlib>
#include <limits>

#include "shardflow/base/text.h"

namespace shardflow::ir_detail {

Lexer::Lexer(std::string_view text, bool report_newlines) : text_(text), report_newlines_(report_newlines) {}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_identifier_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

void Lexer::skip_space() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c == '\n') {
      if (report_newlines_) return;
      ++pos_;
      ++line_;
      line_start_ = pos_;
    } else if (c == ' ' || c == '\t' || c == '\r') {
      ++pos_;
    } else if (c == '#') {
      while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
    } else {
      return;
    }
  }
}

Token Lexer::make(TokenKind kind, std::size_t start, int line, int column) {
  Token token;
  token.kind = kind;
  token.line = line;
  token.column = column;
  token.raw = text_.substr(start, pos_ - start);
  token.text = std::string(token.raw);
  return token;
}

Token Lexer::next() {
  skip_space();
  const std::size_t start = pos_;
  const int line = line_;
  const int column = static_cast<int>(pos_ - line_start_) + 1;
  if (pos_ >= text_.size()) return make(TokenKind::kEnd, start, line, column);
  const char c = text_[pos_];
  if (c == '\n') {
    ++pos_;
    Token token = make(TokenKind::kNewline, start, line, column);
    ++line_;
    line_start_ = pos_;
    return token;
  }
  const auto peek = [&](std::size_t offset) { return pos_ + offset < text_.size() ? text_[pos_ + offset] : '\0'; };
  if (c == '-' && peek(1) == '>') {
    pos_ += 2;
    return make(TokenKind::kArrow, start, line, column);
  }
  if (c == ':' && peek(1) == ':') {
    pos_ += 2;
    return make(TokenKind::kScope, start, line, column);
  }
  if (is_digit(c) || (c == '-' && (is_digit(peek(1)) || peek(1) == '.'))) {
    return lex_number(start, line, column);
  }
  if (c == '-' && text_.substr(pos_, 4) == "-inf") {
    pos_ += 4;
    Token token = make(TokenKind::kFloat, start, line, column);
    token.float_value = -std::numeric_limits<double>::infinity();
    return token;
  }
  if (c == '"' || c == '\'') return lex_string(start, line, column);
  if ((c == '%' || c == '@') && (is_identifier_start(peek(1)) || is_digit(peek(1)))) {
    ++pos_;
    while (pos_ < text_.size() && (is_identifier_start(text_[pos_]) || is_digit(text_[pos_]))) ++pos_;
    Token token = make(c == '%' ? TokenKind::kValueName : TokenKind::kFuncName, start, line, column);
    token.text = token.text.substr(1);
    return token;
  }
  if (is_identifier_start(c)) {
    while (pos_ < text_.size() && (is_identifier_start(text_[pos_]) || is_digit(text_[pos_]))) ++pos_;
    return make(TokenKind::kIdentifier, start, line, column);
  }
  static constexpr std::string_view kPunctuation = "()[]{},:=?*.@%!<>";
  ++pos_;
  if (kPunctuation.find(c) != std::string_view::npos) return make(TokenKind::kPunct, start, line, column);
  return make(TokenKind::kInvalid, start, line, column);
}

Token Lexer::lex_number(std::size_t start, int line, int column) {
  if (text_[pos_] == '-') ++pos_;
  bool is_float = false;
  while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
  if (pos_ < text_.size() && text_[pos_] == '.' && pos_ + 1 < text_.size() &&
      (is_digit(text_[pos_ + 1]) || text_[pos_ + 1] == 'e' || text_[pos_ + 1] == 'E' ||
       !is_identifier_start(text_[pos_ + 1]))) {
    is_float = true;
    ++pos_;
    while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
  }
  if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    std::size_t at = pos_ + 1;
    if (at < text_.size() && (text_[at] == '+' || text_[at] == '-')) ++at;
    if (at < text_.size() && is_digit(text_[at])) {
      is_float = true;
      pos_ = at;
      while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
    }
  }
  Token token = make(is_float ? TokenKind::kFloat : TokenKind::kInt, start, line, column);
  if (is_float) {
    char* end = nullptr;
    token.float_value = std::strtod(token.text.c_str(), &end);
    if (end != token.text.c_str() + token.text.size()) token.kind = TokenKind::kInvalid;
  } else {
    const auto [end, ec] = std::from_chars(token.text.data(), token.text.data() + token.text.size(), token.int_value);
    if (ec != std::errc() || end != token.text.data() + token.text.size()) {
      token.kind = TokenKind::kInvalid;  // out of the 64-bit range
    }
  }
  return token;
}

Token Lexer::lex_string(std::size_t start, int line, int column) {
  const char quote = text_[pos_++];
  std::string value;
  while (pos_ < text_.size() && text_[pos_] != quote && text_[pos_] != '\n') {
    char c = text_[pos_++];
    if (c == '\\' && pos_ < text_.size()) {
      const char e = text_[pos_++];
      switch (e) {
        case 'n':
          c = '\n';
          break;
        case 't':
          c = '\t';
          break;
        case 'r':
          c = '\r';
          break;
        case '0':
          c = '\0';
          break;
        case 'x': {
          int code = 0;
          for (int k = 0; k < 2 && pos_ < text_.size(); ++k) {
            const char h = text_[pos_];
            const int digit = is_digit(h)                                ? h - '0'
                              : ((h | 0x20) >= 'a' && (h | 0x20) <= 'f') ? (h | 0x20) - 'a' + 10
                                                                         : -1;
            if (digit < 0) break;
            code = code * 16 + digit;
            ++pos_;
          }
          c = static_cast<char>(code);
          break;
        }
        default:
          c = e;
          break;  // \\ \" \' and anything else: the character itself
      }
    }
    value += c;
  }
  if (pos_ >= text_.size() || text_[pos_] != quote) {
    Token token = make(TokenKind::kInvalid, start, line, column);
    token.text = "an unterminated string";
    return token;
  }
  ++pos_;
  Token token = make(TokenKind::kString, start, line, column);
  token.text = std::move(value);
  return token;
}

std::string describe(const Token& token) {
  switch (token.kind) {
    case TokenKind::kEnd:
      return "the end of the input";
    case TokenKind::kNewline:
      return "the end of the line";
    case TokenKind::kString:
      return quote_for_message(token.raw, 40);
    case TokenKind::kInvalid:
      if (token.text == "an unterminated string") return token.text;
      return quote_for_message(token.raw, 40);
    default:
      return "'" + std::string(token.raw.substr(0, 40)) + "'";
  }
}

}  // namespace shardflow::ir_detail
