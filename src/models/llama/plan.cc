// The sharding plan: which mesh axes each parameter and annotated activation
// is split over.
#include <fmt/format.h>

#include <set>

#include "shardflow/base/error.h"
#include "shardflow/models/llama.h"

namespace shardflow::llama {

ShardingPlan ShardingPlan::megatron(std::shared_ptr<const Mesh> mesh) {
  ShardingPlan plan;
  plan.mesh = std::move(mesh);
  const SpecEntry none = shardflow::none;
  auto column = PartitionSpec{"model", "fsdp"};  // [out, in]: output features over model
  auto row = PartitionSpec{"fsdp", "model"};     // input features over model: partial sums
  plan.params = {
      // Vocab over model, as the head: each device looks up the tokens in
      // its rows (one all-reduce of the rows), and a tied head is held once.
      {"tok_embeddings", {"model", "fsdp"}},
      {"attention_norm", {none}},
      {"wq", column},
      {"wk", column},
      {"wv", column},
      {"wo", row},
      {"ffn_norm", {none}},
      {"w1", column},
      {"w3", column},
      {"w2", row},
      {"norm", {none}},
      {"output", {"model", "fsdp"}},  // vocab over model
  };
  plan.activations = {
      {"tokens", {"data", none}},
      {"kv_cache", {"data", "model", none, none}},
      {"block_output", {"data", "fsdp", "model"}},
  };
  plan.check();
  return plan;
}

void ShardingPlan::check() const {
  if (!mesh) throw Error("the sharding plan has no mesh");
  // What the message shows besides the entry: the mesh's axes and every axis
  // the plan names (sorted, so it does not depend on map order).
  const auto context = [&] {
    std::vector<std::string> mesh_axes;
    for (int a = 0; a < mesh->num_axes(); ++a) {
      mesh_axes.push_back(fmt::format("{}={}", mesh->axis_label(a), mesh->axis_size(a)));
    }
    std::set<std::string> named;
    for (const auto* entries : {&params, &activations}) {
      for (const auto& [role, spec] : *entries) {
        for (const SpecEntry& entry : spec.entries()) {
          for (const AxisRef& axis : entry.axes()) {
            if (axis.is_name()) named.insert("'" + axis.name() + "'");
          }
        }
      }
    }
    return std::pair{fmt::format("{}", fmt::join(mesh_axes, ", ")), fmt::format("{}", fmt::join(named, ", "))};
  };
  const auto check_entry = [&](const char* kind, const std::string& role, const PartitionSpec& spec) {
    try {
      validate_partition_spec(translate_partition_spec(spec, *mesh), *mesh);
    } catch (const Error& e) {
      const auto [mesh_axes, named] = context();
      throw Error(
          fmt::format("the sharding plan's {} '{}' {} does not fit the mesh ({}): {} (the plan names the "
                      "axes {}; give the mesh each of them, size 1 leaves one unused)",
                      kind, role, spec.to_string(), mesh_axes, e.what(), named));
    }
  };
  for (const auto& [role, spec] : params) check_entry("parameter", role, spec);
  for (const auto& [role, spec] : activations) check_entry("activation", role, spec);
}

const PartitionSpec& ShardingPlan::param(const std::string& role) const {
  auto it = params.find(role);
  if (it == params.end()) throw Error(fmt::format("the sharding plan has no entry for parameter '{}'", role));
  return it->second;
}

const PartitionSpec* ShardingPlan::activation(const std::string& role) const {
  auto it = activations.find(role);
  return it == activations.end() ? nullptr : &it->second;
}

std::string ShardingPlan::to_string() const {
  std::string out = fmt::format("mesh {}\n", mesh ? mesh->to_string() : "(none)");
  for (const auto& [role, spec] : params) out += fmt::format("  param       {:<15} {}\n", role, spec.to_string());
  for (const auto& [role, spec] : activations) {
    out += fmt::format("  activation  {:<15} {}\n", role, spec.to_string());
  }
  return out;
}

}  // namespace shardflow::llama
