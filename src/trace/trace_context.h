// The state of one trace of a compiled function (private to trace/).
//
// Recording builds a graph: traced ops become nodes; tensors captured from
// outside become graph inputs; trace-time constants are computed now and
// enter the graph (by their recipe) only when a traced op uses them.
// Replaying checks a later call against a cached graph without building
// anything: every op the function calls must match the next cached node
// (same op, same constants, same operands), and captured tensors must be the
// same tensors. The first difference aborts the replay (ReplayMismatch).
#pragma once

#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "shardflow/ir/graph.h"
#include "tensor_impl.h"

namespace shardflow {

// A tensor the traced function used without computing it from its inputs:
// a tensor from outside (a weight: matched by identity, weakly held so the
// cache does not keep it alive), or a tensor the function built from data
// (matched by value, which is kept).
struct CapturedTensor {
  std::weak_ptr<TensorImpl> tensor;
  std::optional<DenseTensor> by_value;
};

// A cached trace replayed against: the graph and its captured tensors, which
// are the graph inputs after the explicit ones.
struct TraceRecord {
  Graph graph{"traced"};
  std::size_t num_explicit_inputs = 0;
  std::vector<CapturedTensor> captured;
};

struct ReplayMismatch {
  std::string reason;
};

class TraceContext {
 public:
  // Recording into `record` (its graph is empty) or, with `replay`, checking
  // against a cached record.
  TraceContext(TraceRecord& record, bool replay);
  ~TraceContext();
  TraceContext(const TraceContext&) = delete;
  TraceContext& operator=(const TraceContext&) = delete;

  // The trace active on this thread, or nullptr.
  static TraceContext* current();
  uint64_t id() const { return id_; }
  bool replaying() const { return replay_; }

  // The symbolic tensor for explicit input `index` of the function.
  Tensor make_input(const TensorType& type, std::size_t index);

  // Whether a call on these tensors must be recorded (some operand depends
  // on the inputs or comes from outside the trace) rather than computed now.
  bool must_record(std::span<const std::shared_ptr<TensorImpl>> tensors) const;

  // Records (or matches) a node; returns its symbolic outputs.
  std::vector<Tensor> record(const OpDef& op, const OpArgs& args, std::span<const std::shared_ptr<TensorImpl>> tensors,
                             std::vector<TensorType> output_types);

  // mark_sharding inside a trace annotates `tensor` in place: later uses of
  // it in this trace see `annotated`.
  void replace(const std::shared_ptr<TensorImpl>& tensor, Value* annotated);

  // The graph value of a tensor used by a traced op or returned (emitting a
  // constant's recipe or capturing an outside tensor as needed).
  Value* value_of(const std::shared_ptr<TensorImpl>& tensor);

  // Sets the graph outputs (recording) or checks them (replaying).
  void finish(std::span<const Tensor> outputs);

  // Tensors captured from outside, in graph-input order (recording).
  const std::vector<std::shared_ptr<TensorImpl>>& captured() const { return captured_; }

 private:
  [[noreturn]] void mismatch(std::string reason) const;
  Value* capture(const std::shared_ptr<TensorImpl>& tensor);

  TraceRecord& record_;
  bool replay_;
  uint64_t id_;
  TraceContext* previous_;
  std::size_t next_node_ = 0;  // replay cursor
  std::vector<std::shared_ptr<TensorImpl>> captured_;
  // Values of captured, emitted and annotated tensors. The map keeps each
  // tensor alive for the trace, so that its address is never reused.
  struct KnownValue {
    std::shared_ptr<TensorImpl> tensor;
    Value* value;
  };
  std::unordered_map<const TensorImpl*, KnownValue> values_;
};

}  // namespace shardflow
