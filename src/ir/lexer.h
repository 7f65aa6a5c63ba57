// Tokens of the op schema syntax and the IR text form (private to ir/).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shardflow::ir_detail {

enum class TokenKind {
  kEnd,
  kIdentifier,  // letters, digits, '_' (not starting with a digit)
  kInt,         // 12, -3
  kFloat,       // 1.5, -1e-05, inf, -inf, nan (lexed as identifiers, see Lexer)
  kString,      // "..." or '...' with escapes; `text` holds the decoded value
  kPunct,       // one of ( ) [ ] { } , : = ? * . @ % ! < >
  kArrow,       // ->
  kScope,       // ::
  kValueName,   // %x0, %0, %attn_out (text holds the name without '%')
  kFuncName,    // @mlp (text holds the name without '@')
  kNewline,     // only when the lexer is asked to report newlines
  kInvalid,
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string text;  // identifier, punctuation, decoded string, number text
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
  std::string_view raw;  // the source text of the token
};

class Lexer {
 public:
  // `report_newlines`: newlines become tokens (the IR is line-oriented);
  // otherwise they are whitespace. '#' starts a comment to the end of line.
  Lexer(std::string_view text, bool report_newlines);

  Token next();
  std::string_view text() const { return text_; }

 private:
  void skip_space();
  Token make(TokenKind kind, std::size_t start, int line, int column);
  Token lex_number(std::size_t start, int line, int column);
  Token lex_string(std::size_t start, int line, int column);

  std::string_view text_;
  bool report_newlines_;
  std::size_t pos_ = 0;
  int line_ = 1;
  std::size_t line_start_ = 0;
};

// "'x'", "the end of the input", "a newline"; for messages.
std::string describe(const Token& token);

}  // namespace shardflow::ir_detail
