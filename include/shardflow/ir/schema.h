// Op schemas in PyTorch's schema syntax, e.g.
//   aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
//   xla::dynamo_mark_sharding(Tensor t, int[] device_ids, str mesh_shape,
//                             str axis_names, str partition_spec) -> Tensor
// Supported: namespaces, overload names, Tensor, Tensor?, Tensor[], int,
// int[], int[N], int?, SymInt (and lists), float, bool, str, Scalar,
// ScalarType, Layout, Device, MemoryFormat, Generator, alias annotations
// such as Tensor(a!), defaults, keyword-only '*', named and multiple returns.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardflow/ir/constant.h"

namespace shardflow {

struct SchemaType {
  enum class Kind {
    kTensor,
    kInt,
    kSymInt,
    kFloat,
    kBool,
    kStr,
    kScalar,
    kScalarType,
    kLayout,
    kDevice,
    kMemoryFormat,
    kGenerator
  };
  Kind kind = Kind::kTensor;
  bool is_list = false;
  std::optional<int64_t> list_size;  // int[2]
  bool optional = false;             // the '?' (on the list when is_list)
  std::string alias;                 // "a", "a!" from Tensor(a!)

  // "int[]", "Tensor?", "int[1]?", "Tensor(a!)".
  std::string to_string() const;
  // PyTorch's Python type name in messages: "List[int]", "Optional[Tensor]".
  std::string python_name() const;
  bool is_tensor_like() const { return kind == Kind::kTensor; }
};

struct SchemaArgument {
  std::string name;
  SchemaType type;
  std::optional<Constant> default_value;
  std::string default_text;  // as written, for printing the declaration
  bool keyword_only = false;
};

struct SchemaReturn {
  std::string name;  // may be empty
  SchemaType type;
};

class FunctionSchema {
 public:
  // Parses the schema text; errors give the column and what was expected.
  static FunctionSchema parse(std::string_view text);

  const std::string& name_space() const { return namespace_; }
  const std::string& name() const { return name_; }
  const std::string& overload() const { return overload_; }
  // "aten::add"
  std::string qualified_name() const { return namespace_ + "::" + name_; }
  // "aten::add.Tensor" (no '.' when the overload is empty).
  std::string full_name() const;
  const std::vector<SchemaArgument>& arguments() const { return arguments_; }
  const std::vector<SchemaReturn>& returns() const { return returns_; }
  // Index of the argument called `name`, or -1.
  int argument_index(std::string_view name) const;

  // The declaration, normalised: "aten::add.Tensor(Tensor self, Tensor other,
  // *, Scalar alpha=1) -> Tensor".
  std::string to_string() const;

 private:
  std::string namespace_, name_, overload_;
  std::vector<SchemaArgument> arguments_;
  std::vector<SchemaReturn> returns_;
};

}  // namespace shardflow
