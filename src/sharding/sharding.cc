#include "shardflow/sharding/sharding.h"

#include <fmt/format.h>

#include <algorithm>

#include "shardflow/base/error.h"

namespace shardflow {

std::string_view to_string(ShardingType type) {
  switch (type) {
    case ShardingType::kReplicated:
      return "REPLICATED";
    case ShardingType::kMaximal:
      return "MAXIMAL";
    case ShardingType::kTuple:
      return "TUPLE";
    case ShardingType::kTiled:
      return "TILED";
    case ShardingType::kManual:
      return "MANUAL";
    case ShardingType::kPartial:
      return "PARTIAL";
    case ShardingType::kUnknown:
      return "UNKNOWN";
  }
  return "UNKNOWN";
}

Sharding::Sharding(std::shared_ptr<const Mesh> mesh, std::vector<std::vector<int>> dim_axes,
                   std::vector<int> unreduced_axes)
    : mesh_(std::move(mesh)), dim_axes_(std::move(dim_axes)), unreduced_axes_(std::move(unreduced_axes)) {
  if (!mesh_) throw Error("a sharding needs a mesh");
  std::sort(unreduced_axes_.begin(), unreduced_axes_.end());
  std::vector<bool> seen(static_cast<std::size_t>(mesh_->num_axes()), false);
  const auto claim = [&](int axis) {
    if (axis < 0 || axis >= mesh_->num_axes()) {
      throw Error(fmt::format("sharding uses mesh axis {} but the mesh has {} axes", axis, mesh_->num_axes()));
    }
    if (seen[static_cast<std::size_t>(axis)]) {
      throw Error(fmt::format("sharding uses mesh axis '{}' more than once", mesh_->axis_label(axis)));
    }
    seen[static_cast<std::size_t>(axis)] = true;
  };
  for (const auto& axes : dim_axes_) {
    for (int axis : axes) claim(axis);
  }
  for (int axis : unreduced_axes_) claim(axis);
}

Sharding Sharding::replicated(std::shared_ptr<const Mesh> mesh, int rank) {
  return Sharding(std::move(mesh), std::vector<std::vector<int>>(static_cast<std::size_t>(rank)));
}

Sharding Sharding::from_spec(std::shared_ptr<const Mesh> mesh, const PartitionSpec& spec) {
  if (!mesh) throw Error("a sharding needs a mesh");
  const PartitionSpec translated = translate_partition_spec(spec, *mesh);
  validate_partition_spec(translated, *mesh);
  std::vector<std::vector<int>> dim_axes;
  for (const SpecEntry& entry : translated.entries()) {
    std::vector<int> axes;
    for (const AxisRef& axis : entry.axes()) axes.push_back(static_cast<int>(axis.index()));
    dim_axes.push_back(std::move(axes));
  }
  return Sharding(std::move(mesh), std::move(dim_axes));
}

std::vector<int> Sharding::replicated_axes() const {
  std::vector<bool> used(static_cast<std::size_t>(mesh_->num_axes()), false);
  for (const auto& axes : dim_axes_) {
    for (int axis : axes) used[static_cast<std::size_t>(axis)] = true;
  }
  for (int axis : unreduced_axes_) used[static_cast<std::size_t>(axis)] = true;
  std::vector<int> result;
  for (int axis = 0; axis < mesh_->num_axes(); ++axis) {
    if (!used[static_cast<std::size_t>(axis)]) result.push_back(axis);
  }
  return result;
}

int64_t Sharding::num_shards(int dim) const {
  int64_t shards = 1;
  for (int axis : dim_axes(dim)) shards *= mesh_->axis_size(axis);
  return shards;
}

bool Sharding::is_replicated() const {
  return unreduced_axes_.empty() &&
         std::all_of(dim_axes_.begin(), dim_axes_.end(), [](const auto& a) { return a.empty(); });
}

PartitionSpec Sharding::to_partition_spec() const {
  const auto ref = [&](int axis) -> AxisRef {
    if (mesh_->has_axis_names()) return AxisRef(mesh_->axis_label(axis));
    return AxisRef(axis);
  };
  std::vector<SpecEntry> entries;
  for (const auto& axes : dim_axes_) {
    if (axes.empty()) {
      entries.push_back(none);
    } else if (axes.size() == 1) {
      entries.push_back(mesh_->has_axis_names() ? SpecEntry(mesh_->axis_label(axes[0])) : SpecEntry(axes[0]));
    } else {
      std::vector<AxisRef> refs;
      for (int axis : axes) refs.push_back(ref(axis));
      entries.push_back(SpecEntry::tuple(std::move(refs)));
    }
  }
  return PartitionSpec(std::move(entries));
}

ShardingType sharding_type(const HloSharding& sharding) {
  switch (sharding.kind()) {
    case HloSharding::Kind::kReplicated:
      return ShardingType::kReplicated;
    case HloSharding::Kind::kMaximal:
      return ShardingType::kMaximal;
    case HloSharding::Kind::kTuple:
      return ShardingType::kTuple;
    case HloSharding::Kind::kManual:
      return ShardingType::kManual;
    case HloSharding::Kind::kTiled:
      return sharding.replicate_on_last_tile_dim() ? ShardingType::kPartial : ShardingType::kTiled;
    case HloSharding::Kind::kUnknown:
    case HloSharding::Kind::kUnreduced:
      return ShardingType::kUnknown;
  }
  return ShardingType::kUnknown;  // unreachable: the switch covers every kind
}

ShardingType Sharding::type() const { return sharding_type(to_hlo_v1()); }

ShardingType Sharding::spec_type() const {
  if (rank() == 0) return ShardingType::kReplicated;
  const auto none_count = static_cast<std::size_t>(
      std::count_if(dim_axes_.begin(), dim_axes_.end(), [](const auto& a) { return a.empty(); }));
  const std::size_t tiled_count = dim_axes_.size() - none_count;
  // §2.5: the transposed mesh has one axis per tiled dim plus one per unused
  // mesh axis; more axes than tensor dims means partial replication.
  if (tiled_count + replicated_axes().size() > dim_axes_.size()) return ShardingType::kPartial;
  if (mesh_->size() == 1) return ShardingType::kMaximal;
  if (none_count == dim_axes_.size()) return ShardingType::kReplicated;
  if (none_count > 0) return ShardingType::kPartial;
  return ShardingType::kTiled;
}

// The logical mesh transposed so that `order` lists its axes, flattened.
static std::vector<int64_t> transposed_devices(const Mesh& mesh, const std::vector<int>& order) {
  const std::vector<int64_t> perm(order.begin(), order.end());
  return transpose_array(mesh.device_ids(), mesh.mesh_shape(), perm);
}

static int64_t axes_size(const Mesh& mesh, const std::vector<int>& axes) {
  int64_t size = 1;
  for (int axis : axes) size *= mesh.axis_size(axis);
  return size;
}

// V1 in closed form (§2.8): transpose the logical mesh to (sharded axes in
// spec order, unreduced axes, unused axes ascending); the trailing groups are
// subgroups, normalised (sorted, collapsed) by HloSharding itself.
HloSharding Sharding::to_hlo_v1() const {
  const std::vector<int> unused = replicated_axes();
  const int64_t replication = axes_size(*mesh_, unused);
  if (mesh_->size() == 1 || (replication == mesh_->size())) return HloSharding::replicate();
  std::vector<int> order;
  std::vector<int64_t> dims;
  for (int d = 0; d < rank(); ++d) {
    order.insert(order.end(), dim_axes(d).begin(), dim_axes(d).end());
    dims.push_back(num_shards(d));
  }
  std::vector<SubgroupType> subgroups;
  if (!unreduced_axes_.empty()) {
    order.insert(order.end(), unreduced_axes_.begin(), unreduced_axes_.end());
    dims.push_back(axes_size(*mesh_, unreduced_axes_));
    subgroups.push_back(SubgroupType::kUnreduced);
  }
  order.insert(order.end(), unused.begin(), unused.end());
  if (replication > 1) {
    dims.push_back(replication);
    subgroups.push_back(SubgroupType::kReplicated);
  }
  TileAssignment assignment(std::move(dims), transposed_devices(*mesh_, order));
  if (subgroups.empty()) return HloSharding::tile(std::move(assignment));
  return HloSharding::subgroup(std::move(assignment), std::move(subgroups));
}

// V2 (§2.9): the same tiles as an iota over the mesh shape; ignores the
// mesh's device order, as PyTorch/XLA's Shardy path does.
HloSharding Sharding::to_hlo_v2() const {
  if (rank() == 0 || mesh_->size() == 1 || is_replicated()) return HloSharding::replicate();
  const std::vector<int> unused = replicated_axes();
  std::vector<int64_t> perm;
  std::vector<int64_t> dims;
  for (int d = 0; d < rank(); ++d) {
    for (int axis : dim_axes(d)) perm.push_back(axis);
    dims.push_back(num_shards(d));
  }
  std::vector<SubgroupType> subgroups;
  if (!unreduced_axes_.empty()) {
    perm.insert(perm.end(), unreduced_axes_.begin(), unreduced_axes_.end());
    dims.push_back(axes_size(*mesh_, unreduced_axes_));
    subgroups.push_back(SubgroupType::kUnreduced);
  }
  perm.insert(perm.end(), unused.begin(), unused.end());
  const int64_t replication = axes_size(*mesh_, unused);
  if (replication > 1) {
    dims.push_back(replication);
    subgroups.push_back(SubgroupType::kReplicated);
  }
  TileAssignment assignment(IotaTileAssignment::create(std::move(dims), mesh_->mesh_shape(), std::move(perm)));
  if (subgroups.empty()) return HloSharding::tile(std::move(assignment));
  return HloSharding::subgroup(std::move(assignment), std::move(subgroups));
}

static std::string axes_list(const Mesh& mesh, const std::vector<int>& axes) {
  std::string out;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (i > 0) out += ",";
    out += mesh.axis_label(axes[i]);
  }
  return out;
}

std::string Sharding::to_readable() const {
  std::string out = "[";
  for (int d = 0; d < rank(); ++d) {
    if (d > 0) out += ",";
    out += "{" + axes_list(*mesh_, dim_axes(d)) + "}";
  }
  out += "]";
  if (!unreduced_axes_.empty()) out += " unreduced={" + axes_list(*mesh_, unreduced_axes_) + "}";
  return out;
}

std::string Sharding::to_readable(std::span<const int64_t> shape, std::string_view dtype) const {
  if (static_cast<int>(shape.size()) != rank()) {
    throw Error(fmt::format("shape of rank {} does not match a sharding of rank {}", shape.size(), rank()));
  }
  std::string out = std::string(dtype) + "[";
  for (int d = 0; d < rank(); ++d) {
    if (d > 0) out += ",";
    out += std::to_string(shape[static_cast<std::size_t>(d)]);
    const auto& axes = dim_axes(d);
    if (axes.size() == 1) out += "@" + mesh_->axis_label(axes[0]);
    if (axes.size() > 1) out += "@(" + axes_list(*mesh_, axes) + ")";
  }
  out += "]";
  if (!unreduced_axes_.empty()) out += " unreduced={" + axes_list(*mesh_, unreduced_axes_) + "}";
  return out;
}

bool operator==(const Sharding& a, const Sharding& b) {
  return (a.mesh_ == b.mesh_ || *a.mesh_ == *b.mesh_) && a.dim_axes_ == b.dim_axes_ &&
         a.unreduced_axes_ == b.unreduced_axes_;
}

}  // namespace shardflow
