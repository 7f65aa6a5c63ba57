// The IR text form: printer, parser and verifier. Documented with examples in
// docs/ir.md.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "shardflow/ir/graph.h"

namespace shardflow {

struct PrintOptions {
  // Extra text after a value's type, e.g. its sharding (empty: nothing).
  std::function<std::string(const Value&)> annotate_value;
};

// The canonical text: one line per node; positional arguments up to the last
// that differs from its default; keyword-only arguments as name=value when
// they differ from their default. Parsing it and printing again gives the
// same text.
std::string print_graph(const Graph& graph, const PrintOptions& options = {});

// The text of one node, as in print_graph ("%2 = aten::add.Tensor(%0, %1) : f32[4]").
std::string print_node(const Node& node);
// The arguments of a call as print_node writes them: schema order, trailing
// positional defaults and default keywords left out, keywords as name=value.
// text_of(i) is argument i's text; constant_of(i) its value if a constant.
std::string print_arguments(const FunctionSchema& schema, const std::function<std::string(std::size_t)>& text_of,
                            const std::function<const Constant*(std::size_t)>& constant_of);

// Parses IR text. Op names may omit the overload when the arguments pick
// one. Errors: "invalid IR at line L, column C: expected X, found Y".
Graph parse_graph(std::string_view text);

// Checks that every node's arguments conform to its schema and that the
// output types equal the op's inference; graph outputs must be defined.
// Throws shardflow::Error naming the node.
void verify_graph(const Graph& graph);

}  // namespace shardflow
