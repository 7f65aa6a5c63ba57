// `shardflow sharding`: the contract scripts rely on is in the README.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"
#include "shardflow/sharding/shard_diagram.h"
#include "shardflow/sharding/shard_layout.h"
#include "shardflow/sharding/sharding.h"

namespace shardflow::cli {

// The mesh size when every entry is positive and the product is sane; the
// mesh itself reports any other shape.
static std::optional<int64_t> mesh_size(const std::vector<int64_t>& shape) {
  int64_t size = 1;
  for (int64_t extent : shape) {
    if (extent <= 0 || size > kMaxMeshSize / extent) return std::nullopt;
    size *= extent;
  }
  return size;
}

static std::vector<int64_t> iota_ids(int64_t count) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < count; ++i) ids.push_back(i);
  return ids;
}

// The layout as JSON, written as it goes: a tree of 2^20 shards x 64 dims
// took 7.6 GB before the first byte was printed.
static void write_layout_json(std::ostream& out, const ShardLayout& layout) {
  out << ",\"shard_shape\":" << nlohmann::json(layout.shard_shape).dump() << ",\"shards\":[";
  for (std::size_t i = 0; i < layout.shards.size(); ++i) {
    const DeviceShard& shard = layout.shards[i];
    out << (i > 0 ? "," : "") << "{\"device\":" << shard.device << ",\"replica_id\":" << shard.replica_id
        << ",\"slices\":[";
    for (std::size_t d = 0; d < shard.slices.size(); ++d) {
      out << (d > 0 ? "," : "") << '[' << shard.slices[d].start << ',' << shard.slices[d].stop << ']';
    }
    out << "]}";
  }
  out << ']';
}

int run_sharding_command(const ShardingOptions& options) {
  const std::vector<int64_t> mesh_shape = parse_int_list("--mesh-shape", options.mesh_shape);
  const std::optional<int64_t> size = mesh_size(mesh_shape);
  std::vector<int64_t> device_ids;
  if (options.device_ids) {
    device_ids = parse_int_list("--device-ids", *options.device_ids);
  } else if (size) {
    device_ids = iota_ids(*size);
  }
  std::vector<std::string> axis_names;
  if (options.axis_names) axis_names = parse_name_list("--axis-names", *options.axis_names);
  std::optional<std::vector<int64_t>> shape;
  if (options.shape) shape = parse_int_list("--shape", *options.shape);

  const std::optional<int64_t> global_devices = options.num_devices ? options.num_devices : size;
  auto mesh = std::make_shared<const Mesh>(device_ids, mesh_shape, axis_names, global_devices);
  const PartitionSpec spec = PartitionSpec::parse(options.spec);
  // mark_sharding's order: the rank check first, then the spec against the mesh.
  if (shape) check_partition_spec_rank(spec, static_cast<int64_t>(shape->size()));
  const Sharding sharding = Sharding::from_spec(mesh, spec);
  const std::string v1 = sharding.to_hlo_v1().to_string();
  const std::string v2 = sharding.to_hlo_v2().to_string();
  const std::string type(to_string(sharding.type()));
  const std::string readable = shape ? sharding.to_readable(*shape) : sharding.to_readable();

  if (options.format == "v1") {
    std::cout << v1 << "\n";
    return 0;
  }
  if (options.format == "v2") {
    std::cout << v2 << "\n";
    return 0;
  }
  std::optional<ShardLayout> layout;
  if (shape) layout = shard_layout(sharding, *shape);
  if (options.format == "json") {
    const nlohmann::ordered_json head = {{"v1", v1}, {"v2", v2}, {"type", type}, {"readable", readable}};
    const std::string text = head.dump();
    std::cout << std::string_view(text).substr(0, text.size() - 1);  // without its closing brace
    if (layout) write_layout_json(std::cout, *layout);
    std::cout << "}\n";
    return 0;
  }

  std::cout << fmt::format("mesh      {}\n", mesh->to_string());
  std::cout << fmt::format("spec      {}\n", spec.to_string());
  std::cout << fmt::format("v1        {}\n", v1);
  std::cout << fmt::format("v2        {}\n", v2);
  std::cout << fmt::format("type      {}\n", type);
  std::cout << fmt::format("readable  {}\n", readable);
  if (layout) {
    std::cout << fmt::format("shape     {}, padded shard {}\n", python_int_tuple(*shape),
                             python_int_tuple(layout->shard_shape));
    std::cout << "\n" << draw_shard_layout(*layout);
  } else {
    // Without a shape, draw blocks by shard index over a stand-in shape.
    std::vector<int64_t> tile_shape;
    for (int d = 0; d < sharding.rank(); ++d) tile_shape.push_back(sharding.num_shards(d));
    std::cout << "\n" << draw_shard_layout(shard_layout(sharding, tile_shape), false);
  }
  return 0;
}

}  // namespace shardflow::cli
