#include "placement.h"

#include "shardflow/sharding/sharding.h"
#include "shardflow/trace/compile.h"

namespace shardflow::llama {

namespace {

// Copies the elements of `slices` (global coordinates) into the padded
// shard, one contiguous run of the last dim at a time.
void fill_shard(const Shape& shape, const std::vector<DimSlice>& slices, const Shape& shard_shape,
                const ElementSource& source, float* shard) {
  const std::size_t rank = shape.size();
  for (const DimSlice& s : slices) {
    if (s.size() <= 0) return;  // a shard of padding only
  }
  if (rank == 0) {
    source(0, 1, shard);
    return;
  }
  std::vector<int64_t> index(rank - 1, 0);  // position within the slices of the outer dims
  const int64_t run = slices[rank - 1].size();
  while (true) {
    int64_t global = 0, local = 0;
    for (std::size_t d = 0; d + 1 < rank; ++d) {
      global = global * shape[d] + slices[d].start + index[d];
      local = local * shard_shape[d] + index[d];
    }
    global = global * shape[rank - 1] + slices[rank - 1].start;
    local = local * shard_shape[rank - 1];
    source(global, run, shard + local);
    std::size_t d = rank - 1;
    while (d > 0) {
      --d;
      if (++index[d] < slices[d].size()) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (rank == 1) return;
  }
}

}  // namespace

Tensor place_tensor(const Shape& shape, const ElementSource& source, const ShardingPlan* plan,
                    const std::string& role) {
  if (plan == nullptr || !plan->mesh) {
    DenseTensor value = DenseTensor::empty(DType::kF32, shape);
    source(0, value.numel(), value.data_as<float>());
    return Tensor(std::move(value));
  }
  const Sharding sharding = Sharding::from_spec(plan->mesh, plan->param(role));
  const ShardLayout layout = shard_layout(sharding, shape);
  // Another process's devices get no shard (MPI); replicas share one.
  std::vector<DenseTensor> shards = addressable_tiles(layout, [&](std::size_t i) {
    const DeviceShard& device = layout.shards[i];
    std::vector<DimSlice> slices = device.slices;
    if (device.whole) {
      slices.clear();
      for (int64_t d : shape) slices.push_back({0, d});
    }
    DenseTensor shard = DenseTensor::zeros(DType::kF32, layout.shard_shape);
    fill_shard(shape, slices, layout.shard_shape, source, shard.data_as<float>());
    return shard;
  });
  return Tensor::from_shards(DType::kF32, shape, sharding, std::move(shards));
}

bool tied_head_shares_embedding(const ShardingPlan* plan) {
  return plan == nullptr || !plan->mesh || plan->param("output") == plan->param("tok_embeddings");
}

}  // namespace shardflow::llama
