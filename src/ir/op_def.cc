#include "shardflow/ir/op_def.h"

#include <fmt/format.h>

#include <cassert>

#include "shardflow/base/error.h"

namespace shardflow {

const BoundArg& OpArgs::slot(std::string_view name) const {
  const int index = schema_->argument_index(name);
  assert(index >= 0 && "OpArgs: the op's definition asked for an argument its schema lacks");
  return args_[static_cast<std::size_t>(index)];
}

const Constant& OpArgs::constant(std::string_view name) const { return slot(name).constant; }

int64_t OpArgs::get_int(std::string_view name) const { return constant(name).as_int(); }

std::optional<int64_t> OpArgs::get_optional_int(std::string_view name) const {
  const Constant& value = constant(name);
  if (value.is_none()) return std::nullopt;
  return value.as_int();
}

double OpArgs::get_number(std::string_view name) const {
  const Constant& value = constant(name);
  if (value.kind() == Constant::Kind::kBool) return value.as_bool() ? 1.0 : 0.0;
  return value.as_number();
}

bool OpArgs::get_bool(std::string_view name) const { return constant(name).as_bool(); }

const std::string& OpArgs::get_string(std::string_view name) const { return constant(name).as_string(); }

std::vector<int64_t> OpArgs::get_int_list(std::string_view name) const {
  const Constant& value = constant(name);
  if (value.kind() == Constant::Kind::kInt) return {value.as_int()};
  return value.as_int_list();
}

std::optional<std::vector<int64_t>> OpArgs::get_optional_int_list(std::string_view name) const {
  if (constant(name).is_none()) return std::nullopt;
  return get_int_list(name);
}

std::optional<DType> OpArgs::get_optional_dtype(std::string_view name) const {
  const Constant& value = constant(name);
  if (value.is_none()) return std::nullopt;
  return value.as_dtype();
}

DType OpArgs::get_dtype(std::string_view name) const { return constant(name).as_dtype(); }

int OpArgs::tensor(std::string_view name) const {
  const BoundArg& arg = slot(name);
  return arg.kind == BoundArg::Kind::kTensor ? arg.tensors[0] : -1;
}

const std::vector<int>& OpArgs::tensor_list(std::string_view name) const { return slot(name).tensors; }

bool reinterprets_operand(const OpDef& op, const OpArgs& args, std::span<const TensorType> inputs,
                          std::span<const TensorType> outputs) {
  if (!op.keeps_element_order || inputs.size() != 1 || outputs.size() != 1) return false;
  if (inputs[0].dtype != outputs[0].dtype || numel(inputs[0].shape) != numel(outputs[0].shape)) return false;
  return op.keeps_element_order(args, inputs, outputs);
}

void OpRegistry::add(std::string_view schema_text, OpDef def) {
  def.schema = FunctionSchema::parse(schema_text);
  if (find(def.schema.full_name()) != nullptr) {
    throw Error(fmt::format("op {} is registered twice", def.schema.full_name()));
  }
  if (def.position_dependent && (!def.tiled_kernel || def.schema.returns().size() != 1)) {
    throw Error(
        fmt::format("internal: position-dependent op {} needs a tiled kernel and one result", def.schema.full_name()));
  }
  ops_.push_back(std::make_unique<OpDef>(std::move(def)));
  by_full_name_.emplace(ops_.back()->schema.full_name(), ops_.back().get());
  by_qualified_name_[ops_.back()->schema.qualified_name()].push_back(ops_.back().get());
}

const OpDef* OpRegistry::find(std::string_view full_name) const {
  const auto found = by_full_name_.find(std::string(full_name));
  return found == by_full_name_.end() ? nullptr : found->second;
}

std::vector<const OpDef*> OpRegistry::overloads(std::string_view name) const {
  // "aten::squeeze" names every overload (squeeze, squeeze.dim), as in
  // PyTorch; "aten::squeeze.dim" names one.
  std::vector<const OpDef*> result;
  if (auto found = by_qualified_name_.find(std::string(name)); found != by_qualified_name_.end()) {
    result = found->second;
  } else {
    if (const OpDef* exact = find(name)) result.push_back(exact);
  }
  return result;
}

std::vector<const OpDef*> OpRegistry::all() const {
  std::vector<const OpDef*> result;
  for (const auto& op : ops_) result.push_back(op.get());
  return result;
}

OpRegistry& op_registry() {
  static OpRegistry registry;
  return registry;
}

}  // namespace shardflow
