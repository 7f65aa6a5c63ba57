// Parser and printer of PyTorch schema strings.
#include "shardflow/ir/schema.h"

#include <fmt/format.h>

#include "lexer.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"

namespace shardflow {

using ir_detail::Lexer;
using ir_detail::Token;
using ir_detail::TokenKind;

namespace {

struct TypeName {
  std::string_view schema;
  std::string_view python;
  SchemaType::Kind kind;
};

constexpr TypeName kTypeNames[] = {
    {"Tensor", "Tensor", SchemaType::Kind::kTensor},
    {"int", "int", SchemaType::Kind::kInt},
    {"SymInt", "int", SchemaType::Kind::kSymInt},
    {"float", "float", SchemaType::Kind::kFloat},
    {"bool", "bool", SchemaType::Kind::kBool},
    {"str", "str", SchemaType::Kind::kStr},
    {"Scalar", "number", SchemaType::Kind::kScalar},
    {"ScalarType", "int", SchemaType::Kind::kScalarType},
    {"Layout", "Layout", SchemaType::Kind::kLayout},
    {"Device", "Device", SchemaType::Kind::kDevice},
    {"MemoryFormat", "MemoryFormat", SchemaType::Kind::kMemoryFormat},
    {"Generator", "Generator", SchemaType::Kind::kGenerator},
};

const TypeName& type_name_of(SchemaType::Kind kind) {
  for (const TypeName& name : kTypeNames) {
    if (name.kind == kind) return name;
  }
  return kTypeNames[0];
}

class SchemaParser {
 public:
  explicit SchemaParser(std::string_view text) : text_(text), lexer_(text, false) { advance(); }

  void parse(std::string& ns, std::string& name, std::string& overload, std::vector<SchemaArgument>& arguments,
             std::vector<SchemaReturn>& returns) {
    ns = expect_identifier("a namespace such as 'aten'");
    expect_kind(TokenKind::kScope, "'::' after the namespace");
    name = expect_identifier("the op name");
    if (is_punct(".")) {
      advance();
      overload = expect_identifier("the overload name after '.'");
    }
    expect_punct("(", "'(' to start the arguments");
    bool keyword_only = false;
    if (!is_punct(")")) {
      while (true) {
        if (is_punct("*")) {
          if (keyword_only) fail("an argument ('*' appears twice)");
          advance();
          keyword_only = true;
        } else {
          SchemaArgument argument;
          argument.type = parse_type();
          argument.name = expect_identifier("an argument name");
          argument.keyword_only = keyword_only;
          if (is_punct("=")) {
            advance();
            parse_default(argument);
          }
          for (const SchemaArgument& other : arguments) {
            if (other.name == argument.name) fail_here(fmt::format("argument '{}' is declared twice", argument.name));
          }
          arguments.push_back(std::move(argument));
        }
        if (!is_punct(",")) break;
        advance();
      }
    }
    expect_punct(")", "',' or ')' after an argument");
    expect_kind(TokenKind::kArrow, "'->' before the return type");
    if (is_punct("(")) {
      advance();
      if (!is_punct(")")) {
        while (true) {
          returns.push_back(parse_return());
          if (!is_punct(",")) break;
          advance();
        }
      }
      expect_punct(")", "',' or ')' after a return type");
    } else {
      returns.push_back(parse_return());
    }
    if (token_.kind != TokenKind::kEnd) fail("the end of the schema");
  }

 private:
  void advance() { token_ = lexer_.next(); }
  bool is_punct(std::string_view p) const { return token_.kind == TokenKind::kPunct && token_.text == p; }

  [[noreturn]] void fail(std::string_view expected) const {
    throw Error(fmt::format("invalid schema {} at column {}: expected {}, found {}", quote_for_message(text_, 120),
                            token_.column, expected, ir_detail::describe(token_)));
  }
  [[noreturn]] void fail_here(std::string_view message) const {
    throw Error(
        fmt::format("invalid schema {} at column {}: {}", quote_for_message(text_, 120), token_.column, message));
  }

  std::string expect_identifier(std::string_view what) {
    if (token_.kind != TokenKind::kIdentifier) fail(what);
    std::string text = token_.text;
    advance();
    return text;
  }
  void expect_punct(std::string_view p, std::string_view what) {
    if (!is_punct(p)) fail(what);
    advance();
  }
  void expect_kind(TokenKind kind, std::string_view what) {
    if (token_.kind != kind) fail(what);
    advance();
  }

  SchemaType parse_type() {
    SchemaType type;
    if (token_.kind != TokenKind::kIdentifier) fail("a type (Tensor, int, float, bool, str, ...)");
    bool known = false;
    for (const TypeName& name : kTypeNames) {
      if (name.schema == token_.text) {
        type.kind = name.kind;
        known = true;
      }
    }
    if (!known) fail("a type (Tensor, int, SymInt, float, bool, str, Scalar, ScalarType, ...)");
    advance();
    if (is_punct("(")) {  // alias annotation: Tensor(a), Tensor(a!)
      advance();
      type.alias = expect_identifier("an alias name such as 'a'");
      if (is_punct("!")) {
        advance();
        type.alias += "!";
      }
      expect_punct(")", "')' to end the alias annotation");
    }
    if (is_punct("?")) {
      advance();
      type.optional = true;
    }
    if (is_punct("[")) {
      if (type.optional) fail_here("lists of optional elements (such as Tensor?[]) are not supported");
      advance();
      type.is_list = true;
      if (token_.kind == TokenKind::kInt) {
        if (token_.int_value < 0) fail("a non-negative list size");
        type.list_size = token_.int_value;
        advance();
      }
      expect_punct("]", "']' to end the list type");
      if (is_punct("?")) {
        advance();
        type.optional = true;
      }
    }
    return type;
  }

  SchemaReturn parse_return() {
    SchemaReturn result;
    result.type = parse_type();
    if (token_.kind == TokenKind::kIdentifier) {
      result.name = token_.text;
      advance();
    }
    return result;
  }

  // A default value: a number, True/False, None, a string, a list of numbers,
  // or a bare identifier (such as contiguous_format), kept as text.
  void parse_default(SchemaArgument& argument) {
    const std::size_t start = token_.raw.data() - text_.data();
    if (token_.kind == TokenKind::kInt) {
      argument.default_value = Constant(token_.int_value);
      advance();
    } else if (token_.kind == TokenKind::kFloat) {
      argument.default_value = Constant(token_.float_value);
      advance();
    } else if (token_.kind == TokenKind::kString) {
      argument.default_value = Constant(token_.text);
      advance();
    } else if (token_.kind == TokenKind::kIdentifier) {
      const std::string word = token_.text;
      if (word == "True" || word == "False") {
        argument.default_value = Constant(word == "True");
      } else if (word == "None") {
        argument.default_value = Constant();
      } else if (word == "inf") {
        argument.default_value = Constant(std::numeric_limits<double>::infinity());
      } else {
        argument.default_value = Constant(word);
      }
      advance();
    } else if (is_punct("[")) {
      advance();
      std::vector<int64_t> ints;
      std::vector<double> floats;
      bool any_float = false;
      while (!is_punct("]")) {
        if (token_.kind == TokenKind::kInt) {
          ints.push_back(token_.int_value);
          floats.push_back(static_cast<double>(token_.int_value));
        } else if (token_.kind == TokenKind::kFloat) {
          any_float = true;
          floats.push_back(token_.float_value);
        } else {
          fail("a number in the default list");
        }
        advance();
        if (is_punct(","))
          advance();
        else if (!is_punct("]"))
          fail("',' or ']' in the default list");
      }
      advance();
      argument.default_value = any_float ? Constant(floats) : Constant(ints);
    } else {
      fail("a default value");
    }
    const std::size_t end = token_.raw.data() - text_.data();
    std::string_view raw = text_.substr(start, end - start);
    while (!raw.empty() && raw.back() == ' ') raw.remove_suffix(1);
    argument.default_text = std::string(raw);
  }

  std::string_view text_;
  Lexer lexer_;
  Token token_;
};

}  // namespace

std::string SchemaType::to_string() const {
  std::string out(type_name_of(kind).schema);
  if (!alias.empty()) out += "(" + alias + ")";
  if (is_list) out += list_size ? fmt::format("[{}]", *list_size) : "[]";
  if (optional) out += "?";
  return out;
}

std::string SchemaType::python_name() const {
  std::string out(type_name_of(kind).python);
  if (is_list) out = "List[" + out + "]";
  if (optional) out = "Optional[" + out + "]";
  return out;
}

FunctionSchema FunctionSchema::parse(std::string_view text) {
  FunctionSchema schema;
  SchemaParser(text).parse(schema.namespace_, schema.name_, schema.overload_, schema.arguments_, schema.returns_);
  return schema;
}

std::string FunctionSchema::full_name() const {
  return overload_.empty() ? qualified_name() : qualified_name() + "." + overload_;
}

int FunctionSchema::argument_index(std::string_view name) const {
  for (std::size_t i = 0; i < arguments_.size(); ++i) {
    if (arguments_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::string FunctionSchema::to_string() const {
  std::string out = full_name() + "(";
  bool keyword_marker = false;
  for (std::size_t i = 0; i < arguments_.size(); ++i) {
    const SchemaArgument& argument = arguments_[i];
    if (i > 0) out += ", ";
    if (argument.keyword_only && !keyword_marker) {
      out += "*, ";
      keyword_marker = true;
    }
    out += argument.type.to_string() + " " + argument.name;
    if (argument.default_value) out += "=" + argument.default_text;
  }
  out += ") -> ";
  const auto return_text = [](const SchemaReturn& r) {
    return r.name.empty() ? r.type.to_string() : r.type.to_string() + " " + r.name;
  };
  if (returns_.size() == 1 && returns_[0].name.empty()) {
    out += return_text(returns_[0]);
  } else {
    out += "(";
    for (std::size_t i = 0; i < returns_.size(); ++i) {
      if (i > 0) out += ", ";
      out += return_text(returns_[i]);
    }
    out += ")";
  }
  return out;
}

}  // namespace shardflow
