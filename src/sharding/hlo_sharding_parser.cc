// Parser of XLA's HloSharding text (the grammar of sharding-semantics §5.2).
//
// The lexer follows XLA's: whitespace and /* */ or // comments are skipped,
// an identifier directly followed by '=' is an attribute name ("devices="),
// integers may be negative. Semantic checks keep XLA's messages and add the
// ones XLA leaves to later passes (device counts, duplicate ids).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "shardflow/base/error.h"
#include "shardflow/base/text.h"
#include "shardflow/sharding/hlo_sharding.h"

namespace shardflow {

namespace {

enum class TokenKind {
  kEnd,
  kLBrace,
  kRBrace,
  kLBracket,
  kRBracket,
  kLParen,
  kRParen,
  kComma,
  kLessEqual,
  kInt,
  kIdentifier,
  kAttribute,
  kString,
  kInvalid
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::size_t pos = 0;
  std::string_view text;  // identifier / attribute name (without '=') / raw text
  int64_t value = 0;      // kInt
};

class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}

  std::string_view text() const { return text_; }
  std::size_t pos() const { return pos_; }
  void set_pos(std::size_t pos) { pos_ = pos; }

  Token next() {
    skip_space_and_comments();
    Token token;
    token.pos = pos_;
    if (pos_ >= text_.size()) return token;
    const char c = text_[pos_];
    const auto single = [&](TokenKind kind) {
      token.kind = kind;
      token.text = text_.substr(pos_, 1);
      ++pos_;
      return token;
    };
    switch (c) {
      case '{':
        return single(TokenKind::kLBrace);
      case '}':
        return single(TokenKind::kRBrace);
      case '[':
        return single(TokenKind::kLBracket);
      case ']':
        return single(TokenKind::kRBracket);
      case '(':
        return single(TokenKind::kLParen);
      case ')':
        return single(TokenKind::kRParen);
      case ',':
        return single(TokenKind::kComma);
      default:
        break;
    }
    if (c == '<' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '=') {
      token.kind = TokenKind::kLessEqual;
      token.text = text_.substr(pos_, 2);
      pos_ += 2;
      return token;
    }
    if (c == '-' || is_digit(c)) return lex_int(token);
    if (c == '"') return lex_string(token);
    if (is_identifier_start(c)) {
      const std::size_t start = pos_;
      while (pos_ < text_.size() && is_identifier_char(text_[pos_])) ++pos_;
      token.text = text_.substr(start, pos_ - start);
      token.kind = TokenKind::kIdentifier;
      if (pos_ < text_.size() && text_[pos_] == '=') {
        ++pos_;
        token.kind = TokenKind::kAttribute;
      }
      return token;
    }
    token.kind = TokenKind::kInvalid;
    token.text = text_.substr(pos_, 1);
    return token;
  }

 private:
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_identifier_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
  static bool is_identifier_char(char c) { return is_identifier_start(c) || is_digit(c) || c == '.' || c == '-'; }

  void skip_space_and_comments() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (text_.substr(pos_, 2) == "/*") {
        const std::size_t end = text_.find("*/", pos_ + 2);
        if (end == std::string_view::npos) return;  // reported as an invalid token
        pos_ = end + 2;
      } else if (text_.substr(pos_, 2) == "//") {
        const std::size_t end = text_.find('\n', pos_);
        pos_ = end == std::string_view::npos ? text_.size() : end + 1;
      } else {
        return;
      }
    }
  }

  Token lex_int(Token& token) {
    const std::size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    const std::size_t digits_start = pos_;
    while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
    token.text = text_.substr(start, pos_ - start);
    if (pos_ == digits_start) {
      token.kind = TokenKind::kInvalid;
      return token;
    }
    const auto [end, ec] = std::from_chars(text_.data() + start, text_.data() + pos_, token.value);
    token.kind = (ec == std::errc() && end == text_.data() + pos_) ? TokenKind::kInt : TokenKind::kInvalid;
    return token;
  }

  Token lex_string(Token& token) {
    const std::size_t start = pos_++;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      pos_ += text_[pos_] == '\\' ? 2 : 1;
    }
    if (pos_ >= text_.size()) {
      pos_ = text_.size();
      token.kind = TokenKind::kInvalid;
      token.text = text_.substr(start);
      return token;
    }
    ++pos_;
    token.kind = TokenKind::kString;
    token.text = text_.substr(start, pos_ - start);
    return token;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

class HloShardingParser {
 public:
  explicit HloShardingParser(std::string_view text) : lexer_(text) { advance(); }

  HloSharding parse() {
    expect(TokenKind::kLBrace, "'{' to start sharding attribute");
    HloSharding result;
    if (token_.kind == TokenKind::kLBrace || token_.kind == TokenKind::kRBrace) {
      std::vector<HloSharding> elements;
      while (token_.kind == TokenKind::kLBrace) {
        advance();
        elements.push_back(parse_single());
        if (token_.kind != TokenKind::kComma) break;
        advance();
        if (token_.kind != TokenKind::kLBrace) fail("'{' to start the next tuple element");
      }
      expect(TokenKind::kRBrace, "'}' to end sharding attribute");
      result = HloSharding::tuple(std::move(elements));
    } else {
      result = parse_single();
    }
    if (token_.kind != TokenKind::kEnd) fail("the end of the text (extra content after sharding)");
    return result;
  }

 private:
  void advance() { token_ = lexer_.next(); }

  std::string describe(const Token& token) const {
    switch (token.kind) {
      case TokenKind::kEnd:
        return "the end of the text";
      case TokenKind::kAttribute:
        return fmt::format("'{}='", token.text);
      case TokenKind::kInvalid:
        if (lexer_.text().substr(token.pos, 2) == "/*") return "an unterminated /* comment";
        return quote_for_message(token.text);
      default:
        return fmt::format("'{}'", token.text);
    }
  }

  [[noreturn]] void fail_at(std::size_t pos, std::string_view message) const {
    throw Error(
        fmt::format("invalid sharding {} at column {}: {}", quote_for_message(lexer_.text()), pos + 1, message));
  }

  [[noreturn]] void fail(std::string_view expected) const {
    fail_at(token_.pos, fmt::format("expected {}, found {}", expected, describe(token_)));
  }

  void expect(TokenKind kind, std::string_view expected) {
    if (token_.kind != kind) fail(expected);
    advance();
  }

  int64_t expect_int(std::string_view what) {
    if (token_.kind != TokenKind::kInt) fail(what);
    const int64_t value = token_.value;
    advance();
    return value;
  }

  // '[' INT (',' INT)* ']'
  std::vector<int64_t> parse_int_list(std::string_view what) {
    expect(TokenKind::kLBracket, fmt::format("'[' to start sharding {}", what));
    std::vector<int64_t> values{expect_int("an integer")};
    while (token_.kind == TokenKind::kComma) {
      advance();
      values.push_back(expect_int("an integer"));
    }
    expect(TokenKind::kRBracket, fmt::format("']' to end sharding {}", what));
    return values;
  }

  struct Items {
    bool replicated = false, manual = false, maximal = false, unknown = false, unreduced = false,
         last_tile_dim_replicate = false;
    std::optional<std::vector<int64_t>> tile_dims;
    std::vector<int64_t> devices;
    std::optional<std::vector<int64_t>> iota_reshape, iota_perm;
    std::vector<SubgroupType> last_tile_dims;
    std::optional<int64_t> shard_as, shard_like;
    std::string metadata;
  };

  void parse_devices(Items& items) {
    if (items.tile_dims) fail_at(token_.pos, "devices= is given twice");
    items.tile_dims = parse_int_list("devices shape");
    if (token_.kind == TokenKind::kLessEqual) {
      advance();
      items.iota_reshape = parse_int_list("iota_reshape_dims");
      if (items.iota_reshape->size() == 1) {
        items.iota_perm = std::vector<int64_t>{0};
        return;
      }
      if (token_.kind != TokenKind::kIdentifier || token_.text != "T") {
        fail("'T(' to start sharding devices iota_transpose_perm");
      }
      advance();
      expect(TokenKind::kLParen, "'T(' to start sharding devices iota_transpose_perm");
      std::vector<int64_t> perm{expect_int("an integer")};
      while (token_.kind == TokenKind::kComma) {
        advance();
        perm.push_back(expect_int("an integer"));
      }
      expect(TokenKind::kRParen, "')' to end sharding devices iota_transpose_perm");
      items.iota_perm = std::move(perm);
      return;
    }
    items.devices.push_back(expect_int("the device ids or '<=[' after the devices shape"));
    while (token_.kind == TokenKind::kComma) {
      advance();
      items.devices.push_back(expect_int("a device id"));
    }
  }

  void parse_last_tile_dims(Items& items) {
    expect(TokenKind::kLBrace, "'{' to start sharding type list");
    while (token_.kind == TokenKind::kIdentifier) {
      const std::string_view name = token_.text;
      if (name == "replicated") {
        items.last_tile_dims.push_back(SubgroupType::kReplicated);
      } else if (name == "manual") {
        items.last_tile_dims.push_back(SubgroupType::kManual);
      } else if (name == "maximal") {
        items.last_tile_dims.push_back(SubgroupType::kMaximal);
      } else if (name == "unreduced") {
        items.last_tile_dims.push_back(SubgroupType::kUnreduced);
      } else {
        fail("a subgroup type (replicated, manual, maximal or unreduced)");
      }
      advance();
      if (token_.kind != TokenKind::kComma) break;
      advance();
    }
    expect(TokenKind::kRBrace, "'}' to end sharding type list");
  }

  // metadata={...} or metadata={{...}, {...}}: kept verbatim, braces balanced.
  void parse_metadata(Items& items) {
    if (token_.kind != TokenKind::kLBrace) fail("'{' to start metadata list");
    const std::size_t start = token_.pos;
    std::size_t end = start;
    int depth = 0;
    do {
      if (token_.kind == TokenKind::kEnd || token_.kind == TokenKind::kInvalid) {
        fail("'}' to end metadata list");
      }
      if (token_.kind == TokenKind::kLBrace) ++depth;
      if (token_.kind == TokenKind::kRBrace) --depth;
      end = token_.pos + token_.text.size();
      advance();
    } while (depth > 0);
    items.metadata = std::string(lexer_.text().substr(start, end - start));
  }

  HloSharding parse_single() {
    const std::size_t start = token_.pos;
    Items items;
    while (token_.kind != TokenKind::kRBrace) {
      const Token token = token_;
      if (token.kind == TokenKind::kIdentifier) {
        advance();
        if (token.text == "replicated") {
          items.replicated = true;
        } else if (token.text == "manual") {
          items.manual = true;
        } else if (token.text == "maximal") {
          items.maximal = true;
        } else if (token.text == "unknown") {
          items.unknown = true;
        } else if (token.text == "unreduced") {
          items.unreduced = true;
        } else if (token.text == "last_tile_dim_replicate") {
          items.last_tile_dim_replicate = true;
        } else if (token.text == "shard_as") {
          items.shard_as = expect_int("a shard group id after shard_as");
        } else if (token.text == "shard_like") {
          items.shard_like = expect_int("a shard group id after shard_like");
        } else {
          fail_at(token.pos, fmt::format("unexpected token {}", describe(token)));
        }
      } else if (token.kind == TokenKind::kAttribute) {
        advance();
        if (token.text == "device") {
          if (token_.kind != TokenKind::kInt) fail("an integer (device= attribute must be an integer)");
          items.devices = {token_.value};  // as in XLA, the last device= wins
          advance();
        } else if (token.text == "devices") {
          parse_devices(items);
        } else if (token.text == "last_tile_dims") {
          parse_last_tile_dims(items);
        } else if (token.text == "metadata") {
          parse_metadata(items);
        } else {
          fail_at(token.pos,
                  "unknown attribute in sharding: expected device=, devices=, "
                  "metadata= or last_tile_dims=");
        }
      } else {
        fail(token.kind == TokenKind::kEnd ? "'}' to end the sharding"
                                           : "a sharding item (replicated, manual, maximal, "
                                             "devices=..., last_tile_dim_replicate, ...)");
      }
    }
    advance();  // '}'
    HloSharding sharding = build(items, start);
    sharding.shard_as_ = items.shard_as;
    if (!items.shard_as) sharding.shard_like_ = items.shard_like;
    sharding.metadata_ = std::move(items.metadata);
    return sharding;
  }

  HloSharding build(const Items& items, std::size_t start) const {
    // As XLA, only an explicit id list counts as assigned devices here.
    const auto no_devices = [&](std::string_view kind) {
      if (!items.devices.empty()) {
        fail_at(start, fmt::format("{} shardings should not have any devices assigned", kind));
      }
    };
    if (items.replicated) {
      no_devices("replicated");
      return HloSharding::replicate();
    }
    if (items.maximal) {
      if (items.devices.size() != 1 || items.iota_reshape) {
        fail_at(start, "maximal shardings should have exactly one device assigned");
      }
      check_device_ids(items.devices, start);
      return HloSharding::maximal(items.devices[0]);
    }
    if (items.manual) {
      no_devices("manual");
      return HloSharding::manual();
    }
    if (items.unknown) {
      no_devices("unknown");
      return HloSharding::unknown();
    }
    if (items.unreduced) {
      no_devices("unreduced");
      return HloSharding::subgroup(TileAssignment(IotaTileAssignment::create({1})), {SubgroupType::kUnreduced});
    }
    if (!items.tile_dims) {
      fail_at(start, "non-maximal shardings must have a tile assignment list including dimensions");
    }
    if (items.last_tile_dim_replicate && !items.last_tile_dims.empty()) {
      fail_at(start, "last_tile_dim_replicate cannot be combined with a non-empty last_tile_dims");
    }
    try {
      std::optional<TileAssignment> tiles;
      if (items.iota_reshape) {
        if (items.iota_perm->size() != items.iota_reshape->size()) {
          fail_at(start, fmt::format("iota_transpose_perm should have the same rank as "
                                     "iota_reshape_dims : expected {}, saw {}.",
                                     items.iota_reshape->size(), items.iota_perm->size()));
        }
        for (int64_t p : *items.iota_perm) {
          if (p < 0 || p >= static_cast<int64_t>(items.iota_reshape->size())) {
            fail_at(start, fmt::format("Out of range iota minor_to_major value {}.", p));
          }
        }
        tiles.emplace(IotaTileAssignment::create(*items.tile_dims, *items.iota_reshape, *items.iota_perm));
      } else {
        if (items.devices.size() <= 1) {
          fail_at(start, "non-maximal shardings must have more than one device assigned");
        }
        check_device_ids(items.devices, start);
        tiles.emplace(*items.tile_dims, items.devices);
      }
      std::vector<SubgroupType> types = items.last_tile_dims;
      if (items.last_tile_dim_replicate) types = {SubgroupType::kReplicated};
      return HloSharding::subgroup(std::move(*tiles), std::move(types));
    } catch (const Error& error) {
      // Tile assignment errors say what is wrong; add where.
      if (std::string_view(error.what()).starts_with("invalid sharding")) throw;
      fail_at(start, error.what());
    }
  }

  void check_device_ids(const std::vector<int64_t>& devices, std::size_t start) const {
    std::vector<int64_t> sorted = devices;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.front() < 0) fail_at(start, fmt::format("device id {} is negative", sorted.front()));
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) fail_at(start, fmt::format("device {} is assigned twice", *dup));
  }

  Lexer lexer_;
  Token token_;
};

HloSharding HloSharding::parse(std::string_view text) { return HloShardingParser(text).parse(); }

}  // namespace shardflow
