#include "shardflow/ir/sharding_projection.h"

namespace shardflow {

static int64_t axes_size(const Mesh& mesh, const std::vector<int>& axes) {
  int64_t size = 1;
  for (int axis : axes) size *= mesh.axis_size(axis);
  return size;
}

std::vector<FactorAxes> project_to_factors(const Mesh& mesh, const OpShardingRule& rule,
                                           const std::vector<int>& factors, const std::vector<int>& axes) {
  std::vector<FactorAxes> result;
  std::size_t next = 0;  // the first axis no factor has taken yet
  for (std::size_t i = 0; i < factors.size(); ++i) {
    const int factor = factors[i];
    const int64_t size = rule.factors[static_cast<std::size_t>(factor)].size;
    const bool last = i + 1 == factors.size();
    FactorAxes taken{.factor = factor, .axes = {}};
    int64_t product = 1;
    while (next < axes.size()) {
      const int64_t with = product * mesh.axis_size(axes[next]);
      if (!last && size % with != 0) break;
      taken.axes.push_back(axes[next++]);
      product = with;
    }
    result.push_back(std::move(taken));
    if (!last && product != size) break;  // not whole: the later factors take nothing
  }
  return result;
}

DimProjection project_to_dim(const Mesh& mesh, const OpShardingRule& rule, const std::vector<int>& factors,
                             const std::vector<std::vector<int>>& factor_axes) {
  DimProjection dim;
  for (std::size_t i = 0; i < factors.size(); ++i) {
    const int factor = factors[i];
    const std::vector<int>& axes = factor_axes[static_cast<std::size_t>(factor)];
    const int64_t size = rule.factors[static_cast<std::size_t>(factor)].size;
    const int64_t product = axes_size(mesh, axes);
    const bool last = i + 1 == factors.size();
    if (!last && size % product != 0) break;
    dim.axes.insert(dim.axes.end(), axes.begin(), axes.end());
    if (!axes.empty() && dim.first_factor < 0) dim.first_factor = factor;
    if (!last && product != size) break;  // not whole: the later factors' axes cannot follow
  }
  return dim;
}

std::vector<std::vector<int>> project_to_dims(const Mesh& mesh, const OpShardingRule& rule, const DimFactors& mapping,
                                              const std::vector<std::vector<int>>& factor_axes) {
  std::vector<std::vector<int>> dims;
  dims.reserve(mapping.size());
  for (const std::vector<int>& factors : mapping) {
    dims.push_back(project_to_dim(mesh, rule, factors, factor_axes).axes);
  }
  return dims;
}

}  // namespace shardflow
