// Calling ops by name with boxed arguments, checked against the op's schema
// (PyTorch's rules and messages, see ir/binding.h):
//   sf::ops::call("xla::dynamo_mark_sharding", {t, ids, "(4, 1, 2)", "None", "(0, 1, 2)"});
//   sf::ops::call("aten::add", {a, b, sf::kwarg("alpha", 2)});
#pragma once

#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "shardflow/ir/constant.h"
#include "shardflow/sharding/partition_spec.h"
#include "shardflow/trace/tensor.h"

namespace shardflow {

// One argument of a boxed call: a tensor, a list of tensors or a constant,
// optionally by keyword.
struct Arg {
  std::variant<Tensor, std::vector<Tensor>, Constant> value;
  std::string keyword;

  Arg(Tensor t) : value(std::move(t)) {}                             // NOLINT: implicit by design
  Arg(std::vector<Tensor> ts) : value(std::move(ts)) {}              // NOLINT
  Arg(Constant c) : value(std::move(c)) {}                           // NOLINT
  Arg(NoneType) : value(Constant()) {}                               // NOLINT
  Arg(bool v) : value(Constant(v)) {}                                // NOLINT
  Arg(int v) : value(Constant(v)) {}                                 // NOLINT
  Arg(int64_t v) : value(Constant(v)) {}                             // NOLINT
  Arg(double v) : value(Constant(v)) {}                              // NOLINT
  Arg(const char* v) : value(Constant(v)) {}                         // NOLINT
  Arg(std::string v) : value(Constant(std::move(v))) {}              // NOLINT
  Arg(std::vector<int64_t> v) : value(Constant(std::move(v))) {}     // NOLINT
  Arg(const Shape& v) : value(Constant(std::vector<int64_t>(v))) {}  // NOLINT
  Arg(DType v) : value(Constant(v)) {}                               // NOLINT
};

inline Arg kwarg(std::string name, Arg value) {
  value.keyword = std::move(name);
  return value;
}

namespace ops {

// Calls an op ("aten::add" picks the overload the arguments fit;
// "aten::add.Tensor" names one). Eager outside compile(), recorded inside.
std::vector<Tensor> call_multi(std::string_view name, std::vector<Arg> args);
// For ops with one result.
Tensor call(std::string_view name, std::vector<Arg> args);

}  // namespace ops
}  // namespace shardflow
