// An op, defined in one place: its schema, shape/dtype inference, sharding
// rule and CPU kernel (ops/ holds the definitions; this is the interface).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "shardflow/ir/constant.h"
#include "shardflow/ir/schema.h"
#include "shardflow/ir/sharding_rule.h"
#include "shardflow/ir/types.h"
#include "shardflow/tensor/dense_tensor.h"

namespace shardflow {

// One argument of a call, bound to its schema slot: a constant, one tensor
// input (its index among the call's tensor inputs), or a list of them.
struct BoundArg {
  enum class Kind { kConstant, kTensor, kTensorList };
  Kind kind = Kind::kConstant;
  Constant constant;
  std::vector<int> tensors;  // tensor input indices (one for kTensor)
};

// The arguments of one call, in schema order, with typed accessors. Every
// slot is filled (defaults included).
class OpArgs {
 public:
  OpArgs(const FunctionSchema& schema, std::vector<BoundArg> args) : schema_(&schema), args_(std::move(args)) {}

  const FunctionSchema& schema() const { return *schema_; }
  std::size_t size() const { return args_.size(); }
  const BoundArg& operator[](std::size_t i) const { return args_.at(i); }
  const std::vector<BoundArg>& all() const { return args_; }

  // Accessors by argument name; they assume the binder checked the types.
  const Constant& constant(std::string_view name) const;
  int64_t get_int(std::string_view name) const;
  std::optional<int64_t> get_optional_int(std::string_view name) const;
  double get_number(std::string_view name) const;  // int or float (Scalar)
  bool get_bool(std::string_view name) const;
  const std::string& get_string(std::string_view name) const;
  std::vector<int64_t> get_int_list(std::string_view name) const;  // an int is [int]
  std::optional<std::vector<int64_t>> get_optional_int_list(std::string_view name) const;
  std::optional<DType> get_optional_dtype(std::string_view name) const;
  DType get_dtype(std::string_view name) const;
  // Tensor input index of a Tensor argument; -1 when an optional one is None.
  int tensor(std::string_view name) const;
  const std::vector<int>& tensor_list(std::string_view name) const;

 private:
  const BoundArg& slot(std::string_view name) const;
  const FunctionSchema* schema_;
  std::vector<BoundArg> args_;
};

// Families, used by propagation priorities and by generic lowering.
enum class OpFamily { kElementwise, kMovement, kReduction, kContraction, kIndexing, kCreation, kAnnotation };

using InferFn = std::function<std::vector<TensorType>(const OpArgs&, std::span<const TensorType>)>;
using RuleFn = std::function<OpShardingRule(const OpArgs&, std::span<const TensorType> inputs,
                                            std::span<const TensorType> outputs)>;
using KernelFn = std::function<std::vector<DenseTensor>(const OpArgs&, std::span<const DenseTensor>)>;
using KeepsOrderFn =
    std::function<bool(const OpArgs&, std::span<const TensorType> inputs, std::span<const TensorType> outputs)>;

// A device's shard of an op's indexed dim (FactorKind::kIndexed): the global
// index of its first row, and the dim's global extent (the last shard of an
// uneven dim holds fewer rows than its padded local size).
struct IndexWindow {
  int64_t begin = 0;
  int64_t global_size = 0;
};
using WindowedKernelFn =
    std::function<std::vector<DenseTensor>(const OpArgs&, std::span<const DenseTensor>, const IndexWindow&)>;

// A device's tile of the result of an op whose values depend on their global
// positions (OpDef::position_dependent): per dim, the global index of the
// tile's first element, the tile's (padded) extent and the dim's global
// extent. Elements past the global extent are padding: a kernel fills them
// with zeros.
struct ResultTile {
  std::vector<int64_t> begin;
  Shape shape;
  Shape global_shape;

  // The whole result, as on one device.
  static ResultTile whole(const Shape& shape) { return {std::vector<int64_t>(shape.size(), 0), shape, shape}; }
};
using TiledKernelFn =
    std::function<std::vector<DenseTensor>(const OpArgs&, std::span<const DenseTensor>, const ResultTile&)>;

// How an op treats operands that are unreduced partial sums (the result of
// contracting a sharded dim, before its all-reduce): whether it may compute on
// them, leaving its result unreduced too, so that the reduction waits until a
// consumer needs whole values (as Megatron's row-parallel layers do).
enum class Linearity {
  kNone,      // needs reduced operands (exp, gelu, softmax, add of a number, ...)
  kLinear,    // linear in its one tensor operand (neg, movement ops, sum, mul by a number;
              // not div, whose parts by a zero add to NaN)
  kAdditive,  // add/sub of tensors: fine when every operand is unreduced the same way
  kBilinear,  // mul, matmul: linear in each operand while the others are reduced
};

struct OpDef {
  FunctionSchema schema;
  OpFamily family = OpFamily::kElementwise;
  InferFn infer;
  RuleFn sharding_rule;
  KernelFn kernel;

  // What partitioning needs to know beyond the sharding rule.
  Linearity linearity = Linearity::kNone;
  // The kernel divides by the number of reduced elements (mean): when a
  // reduced dim is sharded, the partitioner rescales the local result.
  bool averages = false;
  // Values depend on global positions (arange, rand, randn): each device
  // computes its own tile of the result with `tiled_kernel` (`kernel` is
  // the whole result's tile), whatever sharding the result takes.
  bool position_dependent = false;
  TiledKernelFn tiled_kernel;
  // The tensor argument added to the result after the contraction (linear's
  // "bias"). A sharded contraction leaves partial sums that would each add
  // it, so the partitioner keeps it on one device per reduction group and
  // zeros it on the others, rather than leaving the contraction whole.
  std::string addend_arg;
  // The tensor argument the op divides by (floor_divide's "other"): an
  // integer zero there is an error, so where a shard of it is padded the
  // partitioner fills the padding with ones before the op.
  std::string divisor_arg;
  // The argument that holds the result's shape (reshape's "shape", expand's
  // "size"): the partitioner rewrites it to the local (per-device) shape.
  std::string output_shape_arg;
  // Movement ops: whether, for these operand and result types, the result
  // holds the operand's elements in the same row-major order (reshape
  // always; transpose when only size-1 dims move). Such a call needs no
  // kernel: the interpreter and the executor give the result the operand's
  // buffer under the result's shape (see reinterprets_operand). Unset: never.
  KeepsOrderFn keeps_element_order;
  // Ops with an indexed factor: the kernel on a shard of the indexed dim.
  // Indices are checked against window.global_size as `kernel` checks them.
  // A lookup: those inside the shard pick its rows, all others give zeros,
  // so the devices' results add up to the whole lookup. A write: those
  // inside the shard write its rows, the others are left to their shards.
  WindowedKernelFn windowed_kernel;

  std::string full_name() const { return schema.full_name(); }
};

// Whether a call of `op` with these tensor types is its one operand's buffer
// under its one result's shape: the op's keeps_element_order says so, and
// the dtypes and element counts agree.
bool reinterprets_operand(const OpDef& op, const OpArgs& args, std::span<const TensorType> inputs,
                          std::span<const TensorType> outputs);

// Every registered op, by full name ("aten::add.Tensor"). Filled by
// ops::register_all_ops(); nothing registers itself at static-init time.
class OpRegistry {
 public:
  // Parses `def.schema` from `schema_text` and stores the op; a second op
  // with the same full name is an error.
  void add(std::string_view schema_text, OpDef def);
  const OpDef* find(std::string_view full_name) const;
  // All overloads of "aten::add" (or the one op when `name` has an overload),
  // in registration order.
  std::vector<const OpDef*> overloads(std::string_view name) const;
  std::vector<const OpDef*> all() const;

 private:
  std::vector<std::unique_ptr<OpDef>> ops_;
  std::unordered_map<std::string, const OpDef*> by_full_name_;
  // Overloads by qualified name ("aten::add"): looked up on every op call.
  std::unordered_map<std::string, std::vector<const OpDef*>> by_qualified_name_;
};

OpRegistry& op_registry();

}  // namespace shardflow
