// Binding a call's arguments to an op schema, with PyTorch's checks and
// messages, e.g.
//   xla::dynamo_mark_sharding() Expected a value of type 'List[int]' for
//   argument 'device_ids' but instead found type 'str'.
//   Position: 1
//   Value: "0,1"
//   Declaration: xla::dynamo_mark_sharding(Tensor t, int[] device_ids, ...) -> Tensor
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardflow/ir/op_def.h"

namespace shardflow {

// An argument as given by the caller, before binding.
struct CallArg {
  enum class Kind { kConstant, kTensor, kTensorList };
  Kind kind = Kind::kConstant;
  Constant constant;
  std::vector<int> tensors;  // indices into the call's tensor list
  std::string keyword;       // non-empty for name=value arguments
  // For a tensor whose values are known (a trace-time constant), its values
  // as a list of ints, so it can stand where an int[] is expected.
  std::optional<std::vector<int64_t>> known_int_values;
  // For a tensor that depends on traced data: how it was computed, for the
  // error when it is used where a constant is needed.
  std::string traced_origin;

  static CallArg constant_arg(Constant value, std::string keyword = {});
  static CallArg tensor_arg(int index, std::string keyword = {});
  static CallArg tensor_list_arg(std::vector<int> indices, std::string keyword = {});
};

// Checks the arguments against the schema and fills in defaults. Throws
// shardflow::Error with PyTorch's wording on a missing, extra, repeated or
// mistyped argument. `tensor_types` describe the call's tensors (for values
// in messages).
OpArgs bind_arguments(const OpDef& op, std::span<const CallArg> args, std::span<const TensorType> tensor_types);

// Like bind_arguments, but returns nullopt instead of throwing (for picking an
// overload).
std::optional<OpArgs> try_bind_arguments(const OpDef& op, std::span<const CallArg> args,
                                         std::span<const TensorType> tensor_types);

// Picks the overload of `name` ("aten::add" or "aten::add.Tensor") that
// accepts the arguments; the error of the best match otherwise.
std::pair<const OpDef*, OpArgs> resolve_call(std::string_view name, std::span<const CallArg> args,
                                             std::span<const TensorType> tensor_types);

}  // namespace shardflow
