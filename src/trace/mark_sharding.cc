#include "shardflow/trace/mark_sharding.h"

#include <fmt/format.h>

#include "shardflow/base/error.h"
#include "shardflow/ops/annotation.h"
#include "shardflow/trace/call.h"
#include "shardflow/trace/compile.h"
#include "trace_context.h"

namespace shardflow {

// Inside a trace: record the op and make later uses of `tensor` see it.
static void annotate_in_trace(TraceContext& trace, const Tensor& tensor, const Mesh& mesh, const PartitionSpec& spec) {
  // A shape-only tensor made in this trace has no recipe to annotate: it
  // becomes a graph input, whose annotation is recorded like any other.
  if (tensor.impl()->meta) trace.value_of(tensor.impl());
  const ops::MarkShardingStrings strings = ops::encode_mark_sharding(mesh, spec);
  const Tensor annotated = ops::call(ops::kMarkShardingOp, {tensor, strings.device_ids, strings.mesh_shape,
                                                            strings.axis_names, strings.partition_spec});
  TensorImpl& impl = *tensor.impl();
  if (annotated.impl()->traced_value != nullptr) {
    trace.replace(tensor.impl(), annotated.impl()->traced_value);
    return;
  }
  // A trace-time constant: its recipe becomes the annotation of its former self.
  auto before = std::make_shared<TensorImpl>(impl);
  ConstantRecipe recipe = *annotated.impl()->recipe;
  recipe.inputs[0] = std::move(before);
  impl.recipe = std::move(recipe);
}

Tensor mark_sharding(const Tensor& tensor, const Mesh& mesh, const PartitionSpec& spec) {
  check_partition_spec_rank(spec, tensor.rank());
  const Sharding sharding = Sharding::from_spec(std::make_shared<const Mesh>(mesh), spec);
  TensorImpl& impl = *tensor.impl();
  if (TraceContext* trace = TraceContext::current();
      trace != nullptr && (impl.trace_id == trace->id() || trace->must_record(std::span(&tensor.impl(), 1)))) {
    annotate_in_trace(*trace, tensor, mesh, spec);
    return tensor;
  }
  const HloSharding wanted = sharding.to_hlo_v1();
  if (impl.sharding) {
    const HloSharding existing = impl.sharding->to_hlo_v1();
    if (existing == wanted) return tensor;  // the same annotation again: nothing to do
    if (existing.kind() != HloSharding::Kind::kReplicated) {
      throw Error("Existing annotation must be cleared first: " + existing.to_string());
    }
  }
  ShardLayout layout = shard_layout(sharding, tensor.shape());
  std::vector<DenseTensor> shards;
  if (!impl.meta) {
    // Each process keeps the shards of its own devices only (all of them
    // unless the runtime spans several processes), one buffer per tile.
    const DenseTensor value = gather_value(impl);
    shards = addressable_tiles(layout, [&](std::size_t i) {
      DenseTensor shard = DenseTensor::empty(impl.type.dtype, layout.shard_shape);
      copy_shard(layout, i, value.bytes(), element_size(impl.type.dtype), {shard.data(), shard.nbytes()});
      return shard;
    });
  }
  impl.value.reset();
  impl.sharding = sharding;
  impl.layout = std::move(layout);
  impl.shards = std::move(shards);
  return tensor;
}

Tensor clear_sharding(const Tensor& tensor) {
  TensorImpl& impl = *tensor.impl();
  if (!impl.sharding) return tensor;
  if (!impl.meta) impl.value = gather_value(impl);
  impl.sharding.reset();
  impl.layout.reset();
  impl.shards.clear();
  return tensor;
}

}  // namespace shardflow
