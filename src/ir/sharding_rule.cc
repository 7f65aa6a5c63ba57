#include "shardflow/ir/sharding_rule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

namespace shardflow {

// Factor names: i, j, k, ..., z, then z_1, z_2, ...
static std::string factor_name(int index) {
  constexpr int kLetters = 'z' - 'i' + 1;
  if (index < kLetters) return std::string(1, static_cast<char>('i' + index));
  return fmt::format("z_{}", index - kLetters + 1);
}

static std::string tensors_text(const std::vector<DimFactors>& tensors) {
  std::string out = "(";
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    out += t > 0 ? ", [" : "[";
    for (std::size_t d = 0; d < tensors[t].size(); ++d) {
      if (d > 0) out += ", ";
      for (int factor : tensors[t][d]) out += factor_name(factor);
    }
    out += "]";
  }
  return out + ")";
}

std::string OpShardingRule::to_string() const {
  std::string out = tensors_text(operands) + "->" + tensors_text(results) + " {";
  for (std::size_t f = 0; f < factors.size(); ++f) {
    out += fmt::format("{}{}={}", f > 0 ? ", " : "", factor_name(static_cast<int>(f)), factors[f].size);
  }
  out += "}";
  const auto list = [&](FactorKind kind, std::string_view label) {
    std::string names;
    for (std::size_t f = 0; f < factors.size(); ++f) {
      if (factors[f].kind != kind) continue;
      names += (names.empty() ? "" : ", ") + factor_name(static_cast<int>(f));
      if (kind == FactorKind::kReduction && factors[f].reduction != ReduceOp::kSum) {
        names += factors[f].reduction == ReduceOp::kMax ? ":max" : ":min";
      }
    }
    if (!names.empty()) out += fmt::format(" {}={{{}}}", label, names);
  };
  list(FactorKind::kReduction, "reduction");
  list(FactorKind::kNeedReplication, "need_replication");
  list(FactorKind::kPermutation, "permutation");
  list(FactorKind::kIndexed, "indexed");
  return out;
}

bool OpShardingRule::in_results(int f) const {
  for (const DimFactors& mapping : results) {
    for (const std::vector<int>& dim : mapping) {
      if (std::find(dim.begin(), dim.end(), f) != dim.end()) return true;
    }
  }
  return false;
}

bool OpShardingRule::leaves_partials(int f) const {
  const FactorKind kind = factors[static_cast<std::size_t>(f)].kind;
  return kind == FactorKind::kReduction || (kind == FactorKind::kIndexed && !in_results(f));
}

RuleBuilder::RuleBuilder(std::span<const TensorType> operands, std::span<const TensorType> results)
    : operand_types_(operands.begin(), operands.end()), result_types_(results.begin(), results.end()) {
  for (const TensorType& type : operand_types_) {
    rule_.operands.emplace_back(static_cast<std::size_t>(type.rank()));
  }
  for (const TensorType& type : result_types_) {
    rule_.results.emplace_back(static_cast<std::size_t>(type.rank()));
  }
}

int RuleBuilder::add_factor(std::vector<int> operand_dims, std::vector<int> result_dims, int64_t size, FactorKind kind,
                            ReduceOp reduction) {
  assert(operand_dims.size() == rule_.operands.size() && "one dim (or -1) per operand");
  assert(result_dims.size() == rule_.results.size() && "one dim (or -1) per result");
  const int factor = static_cast<int>(rule_.factors.size());
  rule_.factors.push_back({size, kind, reduction});
  for (std::size_t t = 0; t < operand_dims.size(); ++t) {
    if (operand_dims[t] >= 0) map_operand(static_cast<int>(t), operand_dims[t], factor);
  }
  for (std::size_t t = 0; t < result_dims.size(); ++t) {
    if (result_dims[t] >= 0) map_result(static_cast<int>(t), result_dims[t], factor);
  }
  return factor;
}

void RuleBuilder::map_operand(int operand, int dim, int factor) {
  rule_.operands.at(static_cast<std::size_t>(operand)).at(static_cast<std::size_t>(dim)).push_back(factor);
}

void RuleBuilder::map_result(int result, int dim, int factor) {
  rule_.results.at(static_cast<std::size_t>(result)).at(static_cast<std::size_t>(dim)).push_back(factor);
}

int RuleBuilder::add_operand_only(int operand, int dim, FactorKind kind) {
  const int factor = static_cast<int>(rule_.factors.size());
  rule_.factors.push_back(
      {operand_types_[static_cast<std::size_t>(operand)].shape[static_cast<std::size_t>(dim)], kind});
  map_operand(operand, dim, factor);
  return factor;
}

int RuleBuilder::add_result_only(int result, int dim, FactorKind kind) {
  const int factor = static_cast<int>(rule_.factors.size());
  rule_.factors.push_back({result_types_[static_cast<std::size_t>(result)].shape[static_cast<std::size_t>(dim)], kind});
  map_result(result, dim, factor);
  return factor;
}

void RuleBuilder::add_pointwise(FactorKind kind) {
  const Shape& out = result_types_.at(0).shape;
  const auto out_rank = static_cast<int64_t>(out.size());
  for (int64_t d = 0; d < out_rank; ++d) {
    std::vector<int> operand_dims;
    for (const TensorType& operand : operand_types_) {
      const int64_t aligned = d - (out_rank - operand.rank());
      const bool has_dim =
          aligned >= 0 && operand.shape[static_cast<std::size_t>(aligned)] == out[static_cast<std::size_t>(d)];
      operand_dims.push_back(has_dim ? static_cast<int>(aligned) : -1);
    }
    std::vector<int> result_dims(result_types_.size(), -1);
    for (std::size_t r = 0; r < result_types_.size(); ++r) {
      if (result_types_[r].shape == out) result_dims[r] = static_cast<int>(d);
    }
    add_factor(std::move(operand_dims), std::move(result_dims), out[static_cast<std::size_t>(d)], kind);
  }
}

OpShardingRule RuleBuilder::build() {
  for (std::size_t t = 0; t < rule_.operands.size(); ++t) {
    for (std::size_t d = 0; d < rule_.operands[t].size(); ++d) {
      if (rule_.operands[t][d].empty()) add_operand_only(static_cast<int>(t), static_cast<int>(d));
    }
  }
  for (std::size_t t = 0; t < rule_.results.size(); ++t) {
    for (std::size_t d = 0; d < rule_.results[t].size(); ++d) {
      if (rule_.results[t][d].empty()) add_result_only(static_cast<int>(t), static_cast<int>(d));
    }
  }
  return std::move(rule_);
}

}  // namespace shardflow
