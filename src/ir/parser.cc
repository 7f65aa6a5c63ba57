// Parser of the IR text form.
#include <fmt/format.h>

#include <limits>

#include "lexer.h"
#include "shardflow/base/error.h"
#include "shardflow/ir/binding.h"
#include "shardflow/ir/text.h"

namespace shardflow {

using ir_detail::Lexer;
using ir_detail::Token;
using ir_detail::TokenKind;

namespace {

// A parsed argument before binding: a constant, a value, or a list of values.
struct ParsedArg {
  std::string keyword;
  std::variant<Constant, Value*, std::vector<Value*>> value;
};

class IrParser {
 public:
  explicit IrParser(std::string_view text) : lexer_(text, true) { advance(); }

  Graph parse() {
    skip_newlines();
    expect_identifier("func", "'func' to start the function");
    if (token_.kind != TokenKind::kFuncName) fail("the function name, such as @main");
    Graph graph(token_.text);
    advance();
    expect_punct("(", "'(' to start the parameters");
    while (!is_punct(")")) {
      if (token_.kind != TokenKind::kValueName) fail("a parameter such as %x or ')'");
      const Token name = token_;
      advance();
      expect_punct(":", "':' after the parameter name");
      TensorType type = parse_type();
      if (graph.find_value(name.text)) fail_at(name, fmt::format("value %{} is defined twice", name.text));
      graph.add_input(std::move(type), name.text);
      if (is_punct(",")) {
        advance();
      } else if (!is_punct(")")) {
        fail("',' or ')' after a parameter");
      }
    }
    advance();
    expect_kind(TokenKind::kArrow, "'->' before the result types");
    std::vector<TensorType> result_types;
    expect_punct("(", "'(' to start the result types");
    while (!is_punct(")")) {
      result_types.push_back(parse_type());
      if (is_punct(",")) {
        advance();
      } else if (!is_punct(")")) {
        fail("',' or ')' after a result type");
      }
    }
    advance();
    expect_punct("{", "'{' to start the body");
    expect_newline();
    while (true) {
      skip_newlines();
      if (token_.kind == TokenKind::kIdentifier && token_.text == "return") break;
      parse_node(graph);
      expect_newline();
    }
    const Token return_token = token_;
    advance();
    std::vector<Value*> outputs;
    while (token_.kind == TokenKind::kValueName) {
      outputs.push_back(lookup(graph, token_));
      advance();
      if (!is_punct(",")) break;
      advance();
    }
    if (outputs.size() != result_types.size()) {
      fail_at(return_token,
              fmt::format("the function declares {} result(s) but returns {}", result_types.size(), outputs.size()));
    }
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i]->type() != result_types[i]) {
        fail_at(return_token, fmt::format("result {} is declared {} but %{} is {}", i, result_types[i].to_string(),
                                          outputs[i]->name(), outputs[i]->type().to_string()));
      }
    }
    graph.set_outputs(std::move(outputs));
    expect_newline();
    skip_newlines();
    expect_punct("}", "'}' to end the function");
    skip_newlines();
    if (token_.kind != TokenKind::kEnd) fail("the end of the input after the function");
    return graph;
  }

 private:
  void advance() { token_ = lexer_.next(); }
  bool is_punct(std::string_view p) const { return token_.kind == TokenKind::kPunct && token_.text == p; }
  void skip_newlines() {
    while (token_.kind == TokenKind::kNewline) advance();
  }

  [[noreturn]] void fail_at(const Token& at, std::string_view message) const {
    throw Error(fmt::format("invalid IR at line {}, column {}: {}", at.line, at.column, message));
  }
  [[noreturn]] void fail(std::string_view expected) const {
    fail_at(token_, fmt::format("expected {}, found {}", expected, ir_detail::describe(token_)));
  }

  void expect_identifier(std::string_view word, std::string_view what) {
    if (token_.kind != TokenKind::kIdentifier || token_.text != word) fail(what);
    advance();
  }
  void expect_punct(std::string_view p, std::string_view what) {
    if (!is_punct(p)) fail(what);
    advance();
  }
  void expect_kind(TokenKind kind, std::string_view what) {
    if (token_.kind != kind) fail(what);
    advance();
  }
  void expect_newline() {
    if (token_.kind != TokenKind::kNewline && token_.kind != TokenKind::kEnd) fail("the end of the line");
    advance();
  }

  Value* lookup(const Graph& graph, const Token& name) const {
    Value* value = graph.find_value(name.text);
    if (value == nullptr) fail_at(name, fmt::format("value %{} is not defined before this use", name.text));
    return value;
  }

  // dtype '[' dims ']'
  TensorType parse_type() {
    if (token_.kind != TokenKind::kIdentifier) fail("a tensor type such as f32[8,512]");
    const std::optional<DType> dtype = dtype_from_name(token_.text);
    if (!dtype) fail("a dtype (f32, bf16, f16, i64, i32 or bool)");
    TensorType type{*dtype, {}};
    advance();
    expect_punct("[", "'[' after the dtype");
    while (!is_punct("]")) {
      if (token_.kind != TokenKind::kInt || token_.int_value < 0) fail("a dimension size (an integer >= 0)");
      type.shape.push_back(token_.int_value);
      advance();
      if (is_punct(",")) {
        advance();
      } else if (!is_punct("]")) {
        fail("',' or ']' in the shape");
      }
    }
    advance();
    return type;
  }

  void parse_node(Graph& graph) {
    std::vector<Token> names;
    while (token_.kind == TokenKind::kValueName) {
      names.push_back(token_);
      advance();
      if (!is_punct(",")) break;
      advance();
    }
    if (names.empty()) fail("a node such as '%1 = aten::add.Tensor(%0, %0) : f32[4]' or 'return'");
    expect_punct("=", "'=' after the result names");
    const Token op_token = token_;
    std::string op_name = parse_op_name();
    expect_punct("(", "'(' to start the arguments");
    std::vector<ParsedArg> parsed;
    while (!is_punct(")")) {
      ParsedArg arg;
      if (token_.kind == TokenKind::kIdentifier) {
        // name=value, unless the identifier is a literal (None, true, a dtype).
        Token name = token_;
        advance();
        if (is_punct("=")) {
          advance();
          arg.keyword = name.text;
          arg.value = parse_arg_value(graph);
        } else {
          arg.value = identifier_constant(name);
        }
      } else {
        arg.value = parse_arg_value(graph);
      }
      parsed.push_back(std::move(arg));
      if (is_punct(",")) {
        advance();
      } else if (!is_punct(")")) {
        fail("',' or ')' after an argument");
      }
    }
    advance();
    expect_punct(":", "':' and the result type(s)");
    std::vector<TensorType> types;
    if (is_punct("(")) {
      advance();
      while (!is_punct(")")) {
        types.push_back(parse_type());
        if (is_punct(","))
          advance();
        else if (!is_punct(")"))
          fail("',' or ')' after a result type");
      }
      advance();
    } else {
      types.push_back(parse_type());
    }
    if (types.size() != names.size()) {
      fail_at(names.front(), fmt::format("{} result name(s) but {} result type(s)", names.size(), types.size()));
    }

    // Bind to the schema: tensors become indices into the list of values.
    std::vector<CallArg> call_args;
    std::vector<Value*> tensors;
    std::vector<TensorType> tensor_types;
    for (ParsedArg& arg : parsed) {
      if (auto* constant = std::get_if<Constant>(&arg.value)) {
        call_args.push_back(CallArg::constant_arg(*constant, arg.keyword));
      } else if (auto* value = std::get_if<Value*>(&arg.value)) {
        call_args.push_back(CallArg::tensor_arg(static_cast<int>(tensors.size()), arg.keyword));
        tensors.push_back(*value);
        tensor_types.push_back((*value)->type());
      } else {
        std::vector<int> indices;
        for (Value* element : std::get<std::vector<Value*>>(arg.value)) {
          indices.push_back(static_cast<int>(tensors.size()));
          tensors.push_back(element);
          tensor_types.push_back(element->type());
        }
        call_args.push_back(CallArg::tensor_list_arg(std::move(indices), arg.keyword));
      }
    }
    const OpDef* op = nullptr;
    std::optional<OpArgs> bound;
    try {
      auto resolved = resolve_call(op_name, call_args, tensor_types);
      op = resolved.first;
      bound = std::move(resolved.second);
    } catch (const Error& error) {
      fail_at(op_token, error.what());
    }
    std::vector<NodeArg> node_args = node_args_of(*bound, tensors);
    if (types.size() != op->schema.returns().size()) {
      fail_at(names.front(), fmt::format("{} returns {} value(s) but {} name(s) are given", op->full_name(),
                                         op->schema.returns().size(), names.size()));
    }
    std::vector<std::string> output_names;
    for (const Token& name : names) {
      if (graph.find_value(name.text)) fail_at(name, fmt::format("value %{} is defined twice", name.text));
      output_names.push_back(name.text);
    }
    graph.add_node(*op, std::move(node_args), std::move(types), std::move(output_names))
        ->set_source_line(names.front().line);
  }

  std::string parse_op_name() {
    if (token_.kind != TokenKind::kIdentifier) fail("an op name such as aten::matmul");
    std::string name = token_.text;
    advance();
    expect_kind(TokenKind::kScope, "'::' in the op name");
    if (token_.kind != TokenKind::kIdentifier) fail("the op name after '::'");
    name += "::" + token_.text;
    advance();
    if (is_punct(".")) {
      advance();
      if (token_.kind != TokenKind::kIdentifier) fail("the overload name after '.'");
      name += "." + token_.text;
      advance();
    }
    return name;
  }

  Constant identifier_constant(const Token& word) const {
    if (word.text == "None") return Constant();
    if (word.text == "true" || word.text == "True") return Constant(true);
    if (word.text == "false" || word.text == "False") return Constant(false);
    if (word.text == "inf") return Constant(std::numeric_limits<double>::infinity());
    if (word.text == "nan") return Constant(std::numeric_limits<double>::quiet_NaN());
    if (const std::optional<DType> dtype = dtype_from_name(word.text)) return Constant(*dtype);
    fail_at(word, fmt::format("expected an argument (a %value, a number, a string, a list, None, "
                              "true, false or a dtype), found '{}'",
                              word.text));
  }

  std::variant<Constant, Value*, std::vector<Value*>> parse_arg_value(const Graph& graph) {
    if (token_.kind == TokenKind::kValueName) {
      Value* value = lookup(graph, token_);
      advance();
      return value;
    }
    if (token_.kind == TokenKind::kInt) {
      const int64_t value = token_.int_value;
      advance();
      return Constant(value);
    }
    if (token_.kind == TokenKind::kFloat) {
      const double value = token_.float_value;
      advance();
      return Constant(value);
    }
    if (token_.kind == TokenKind::kString) {
      std::string value = token_.text;
      advance();
      return Constant(std::move(value));
    }
    if (token_.kind == TokenKind::kIdentifier) {
      const Token word = token_;
      advance();
      return identifier_constant(word);
    }
    if (is_punct("[")) return parse_list(graph);
    fail("an argument (a %value, a number, a string, a list, None, true, false or a dtype)");
  }

  // [] / [1, 2] / [0.5, 1] / [%a, %b]
  std::variant<Constant, Value*, std::vector<Value*>> parse_list(const Graph& graph) {
    advance();
    std::vector<Value*> values;
    std::vector<int64_t> ints;
    std::vector<double> floats;
    bool any_float = false;
    while (!is_punct("]")) {
      if (token_.kind == TokenKind::kValueName) {
        if (!ints.empty() || any_float) fail("a number (a list holds numbers or values, not both)");
        values.push_back(lookup(graph, token_));
      } else if (token_.kind == TokenKind::kInt || token_.kind == TokenKind::kFloat) {
        if (!values.empty()) fail("a %value (a list holds numbers or values, not both)");
        const bool is_float = token_.kind == TokenKind::kFloat;
        any_float |= is_float;
        floats.push_back(is_float ? token_.float_value : static_cast<double>(token_.int_value));
        if (!is_float) ints.push_back(token_.int_value);
      } else {
        fail("a list element (a number or a %value)");
      }
      advance();
      if (is_punct(","))
        advance();
      else if (!is_punct("]"))
        fail("',' or ']' in the list");
    }
    advance();
    if (!values.empty()) return values;
    if (any_float) return Constant(std::move(floats));
    return Constant(std::move(ints));
  }

  Lexer lexer_;
  Token token_;
};

}  // namespace

Graph parse_graph(std::string_view text) { return IrParser(text).parse(); }

}  // namespace shardflow
