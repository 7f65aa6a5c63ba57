// What a Tensor handle points to (private to trace/).
//
// A tensor is one of:
//  - concrete: a value, possibly laid out across devices by mark_sharding;
//  - meta: a type only;
//  - traced: a value of the graph being traced (it depends on the traced
//    function's inputs), with no data.
// A concrete tensor created while tracing (a trace-time constant, such as
// arange(8) inside the function) also remembers how it was computed, so the
// tracer can put that computation in the graph if a traced op uses it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardflow/ir/graph.h"
#include "shardflow/sharding/shard_layout.h"
#include "shardflow/sharding/sharding.h"
#include "shardflow/trace/tensor.h"

namespace shardflow {

// How a trace-time constant was computed: the op and its arguments, with
// tensor arguments as the impls they were.
struct ConstantRecipe {
  const OpDef* op = nullptr;
  std::vector<BoundArg> args;                       // tensor indices refer to `inputs`
  std::vector<std::shared_ptr<TensorImpl>> inputs;  // the call's tensors
  int output_index = 0;
};

struct TensorImpl {
  TensorType type;
  bool meta = false;

  // Concrete value; empty while laid out as shards (see `shards`).
  std::optional<DenseTensor> value;
  // Eager sharding (mark_sharding on a concrete tensor): one padded buffer
  // per device in `layout.shards` order.
  std::optional<Sharding> sharding;
  std::optional<ShardLayout> layout;
  std::vector<DenseTensor> shards;

  // Tracing: the id of the trace that created this tensor (0: none), and its
  // graph value when it depends on the traced inputs (it then has no data).
  uint64_t trace_id = 0;
  Value* traced_value = nullptr;
  std::optional<ConstantRecipe> recipe;  // trace-time constants only

  // Set when a compiled function took this tensor's buffers (a donated
  // input): its name, for the error on any later use.
  std::string donated_to;

  bool is_concrete() const { return !meta && traced_value == nullptr; }
};

// Makes a concrete impl.
std::shared_ptr<TensorImpl> make_concrete_impl(DenseTensor value);
// Throws the error of a use of a donated tensor.
[[noreturn]] void throw_donated(const TensorImpl& impl);
// The tensor's value, assembled from its shards when it is laid out.
DenseTensor gather_value(const TensorImpl& impl);

}  // namespace shardflow
