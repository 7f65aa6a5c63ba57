// Sharding propagation: a sharding for every value of a graph.
//
// Input: a graph whose xla::dynamo_mark_sharding nodes and (optionally) inputs
// carry shardings. Output: an axis-based sharding for every value, and for
// every sharded dim the origin of its axes (which annotation, through which
// ops), used to explain collectives.
//
// The algorithm is generic over the ops' factor rules (as in Shardy): project
// the shardings of an op's operands and results onto its factors, agree per
// factor on a list of mesh axes, project back onto the tensors that can take
// more axes. A worklist holds the ops to visit: first all of them, then the
// producers and users of each value that changed. It is worked through in
// rounds of a forward pass in graph order and a backward pass in reverse,
// first over pass-through ops (elementwise, movement, annotations) only, then
// over all ops; a stage that still changes after 64 rounds stops there with a
// warning (PropagationResult::warnings). It is monotone: a dim only ever
// gains axes at its minor end; annotated values and input shardings are
// never changed; uneven shardings are kept as they are (the partitioner pads
// them), never turned into replication.
//
// Example: for %2 = aten::matmul(%0, %1) with %1 annotated (None, 'model'),
// the result gets [{},{model}] (origin: the annotation at %1, through %2).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "shardflow/ir/graph.h"
#include "shardflow/sharding/sharding.h"

namespace shardflow {

// Where a dim's axes came from.
struct ShardingOrigin {
  // One op the sharding flowed through, and the steps before it: shared
  // with the origins of the values it came from, so a chain of n ops keeps
  // n steps, not n copies of a growing path.
  struct Step {
    const Node* node = nullptr;
    mutable std::shared_ptr<const Step> previous;  // mutable: taken apart by ~Step

    // Releases a chain only this step holds one step at a time: a recursive
    // release of a chain of 100k ops would overflow the stack.
    ~Step() {
      std::shared_ptr<const Step> next = std::move(previous);
      while (next && next.use_count() == 1) next = std::move(next->previous);
    }
  };

  const Value* source = nullptr;     // an annotation's result or a graph input
  std::shared_ptr<const Step> last;  // the last op the sharding flowed through (null: none)

  // The ops the sharding flowed through, in order.
  std::vector<const Node*> through() const;
  // "the annotation at %3", "the sharding of input %w", "... through %5
  // aten::transpose.int"; a long path names its first and last few ops.
  std::string describe() const;
};

class PropagationResult {
 public:
  PropagationResult(std::shared_ptr<const Mesh> mesh) : mesh_(std::move(mesh)) {}

  // The mesh every sharding of the graph is on (the annotations' mesh; a
  // one-device mesh when the graph has no annotation).
  const std::shared_ptr<const Mesh>& mesh() const { return mesh_; }
  const Sharding& sharding(const Value* value) const;
  // The origin of the axes of `dim` of `value` (source null: no sharding).
  const ShardingOrigin& origin(const Value* value, int dim) const;
  // Whether the value's sharding was fixed by the user (annotation or input).
  bool is_annotated(const Value* value) const;
  // What users should know about the result: a stage that stopped at its
  // round limit while still changing, naming a value it changed last. The
  // partitioner passes these on in its program's warnings.
  const std::vector<std::string>& warnings() const { return warnings_; }
  std::vector<std::string>& warnings() { return warnings_; }

  // Filled by propagate_shardings.
  struct Entry {
    Sharding sharding;
    std::vector<ShardingOrigin> dim_origins;
    bool annotated = false;
  };
  std::unordered_map<const Value*, Entry>& entries() { return entries_; }
  const std::unordered_map<const Value*, Entry>& entries() const { return entries_; }

 private:
  std::shared_ptr<const Mesh> mesh_;
  std::unordered_map<const Value*, Entry> entries_;
  std::vector<std::string> warnings_;
};

// `input_shardings[i]` is the sharding of graph input i (e.g. a captured
// weight laid out by an eager mark_sharding); nullopt or shorter: open.
// Errors: annotations on different meshes; an input sharding on another mesh.
PropagationResult propagate_shardings(const Graph& graph,
                                      std::span<const std::optional<Sharding>> input_shardings = {});

// The graph text with each value's sharding as a comment: readable form and
// XLA V1 string ("# [{data},{}] {devices=[2,1,4]0,1,... last_tile_dim_replicate}").
std::string print_with_shardings(const Graph& graph, const PropagationResult& result);

}  // namespace shardflow
