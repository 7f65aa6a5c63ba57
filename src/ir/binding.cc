// Argument binding with PyTorch's type rules and messages.
#include "shardflow/ir/binding.h"

#include <fmt/format.h>

#include <algorithm>
#include <variant>

#include "shardflow/base/error.h"

namespace shardflow {

CallArg CallArg::constant_arg(Constant value, std::string keyword) {
  CallArg arg;
  arg.constant = std::move(value);
  arg.keyword = std::move(keyword);
  return arg;
}

CallArg CallArg::tensor_arg(int index, std::string keyword) {
  CallArg arg;
  arg.kind = Kind::kTensor;
  arg.tensors = {index};
  arg.keyword = std::move(keyword);
  return arg;
}

CallArg CallArg::tensor_list_arg(std::vector<int> indices, std::string keyword) {
  CallArg arg;
  arg.kind = Kind::kTensorList;
  arg.tensors = std::move(indices);
  arg.keyword = std::move(keyword);
  return arg;
}

namespace {

// A failed binding: the message PyTorch would give.
struct BindFailure {
  std::string message;
};

class Binder {
 public:
  Binder(const OpDef& op, std::span<const TensorType> tensor_types) : schema_(op.schema), tensor_types_(tensor_types) {}

  // Binds or returns the failure.
  std::variant<OpArgs, BindFailure> bind(std::span<const CallArg> args) {
    const auto& params = schema_.arguments();
    std::vector<std::optional<BoundArg>> slots(params.size());
    std::size_t positional = 0;
    for (const CallArg& arg : args) {
      if (!arg.keyword.empty()) continue;
      if (positional >= params.size() || params[positional].keyword_only) {
        std::size_t max_positional = 0;
        while (max_positional < params.size() && !params[max_positional].keyword_only) ++max_positional;
        const auto given = static_cast<std::size_t>(
            std::count_if(args.begin(), args.end(), [](const CallArg& a) { return a.keyword.empty(); }));
        return fail(
            fmt::format("{}() expected at most {} argument(s) but received {} argument(s). "
                        "Declaration: {}",
                        schema_.qualified_name(), max_positional, given, schema_.to_string()));
      }
      BoundArg bound;
      if (auto failure = check(positional, arg, bound)) return *failure;
      slots[positional++] = std::move(bound);
    }
    for (const CallArg& arg : args) {
      if (arg.keyword.empty()) continue;
      const int index = schema_.argument_index(arg.keyword);
      if (index < 0) {
        return fail(fmt::format("{}() got an unexpected keyword argument '{}'. Declaration: {}",
                                schema_.qualified_name(), arg.keyword, schema_.to_string()));
      }
      if (slots[static_cast<std::size_t>(index)]) {
        return fail(fmt::format("{}() got multiple values for argument '{}'. Declaration: {}", schema_.qualified_name(),
                                arg.keyword, schema_.to_string()));
      }
      BoundArg bound;
      if (auto failure = check(static_cast<std::size_t>(index), arg, bound)) return *failure;
      slots[static_cast<std::size_t>(index)] = std::move(bound);
    }
    std::vector<BoundArg> bound;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!slots[i]) {
        if (!params[i].default_value) {
          return fail(fmt::format("{}() is missing value for argument '{}'. Declaration: {}", schema_.qualified_name(),
                                  params[i].name, schema_.to_string()));
        }
        BoundArg default_arg;
        default_arg.constant = default_for(params[i]);
        slots[i] = std::move(default_arg);
      }
      bound.push_back(std::move(*slots[i]));
    }
    return OpArgs(schema_, std::move(bound));
  }

 private:
  static BindFailure fail(std::string message) { return {std::move(message)}; }

  // Defaults written as identifiers in schemas (contiguous_format, ...) mean
  // "the usual"; ops read them as None.
  static Constant default_for(const SchemaArgument& param) {
    const Constant& value = *param.default_value;
    const bool is_str = param.type.kind == SchemaType::Kind::kStr;
    if (value.kind() == Constant::Kind::kString && !is_str) return Constant();
    if (param.type.kind == SchemaType::Kind::kFloat && value.kind() == Constant::Kind::kInt) {
      return Constant(static_cast<double>(value.as_int()));
    }
    return value;
  }

  std::string tensor_repr(const CallArg& arg) const {
    std::string out;
    for (std::size_t i = 0; i < arg.tensors.size(); ++i) {
      const auto index = static_cast<std::size_t>(arg.tensors[i]);
      out += i > 0 ? ", " : "";
      out += index < tensor_types_.size() ? "Tensor(" + tensor_types_[index].to_string() + ")" : "Tensor";
    }
    return arg.kind == CallArg::Kind::kTensorList ? "[" + out + "]" : out;
  }

  std::optional<BindFailure> mismatch(std::size_t position, const CallArg& arg, std::string found,
                                      std::string value) const {
    const SchemaArgument& param = schema_.arguments()[position];
    std::string what = fmt::format("but instead found type '{}'", found);
    if (!arg.traced_origin.empty()) {
      what +=
          " whose values depend on the inputs of the compiled function, so they are not "
          "known while tracing";
      value = arg.traced_origin;
    }
    return fail(fmt::format(
        "{}() Expected a value of type '{}' for argument '{}' {}.\n"
        "Position: {}\nValue: {}\nDeclaration: {}",
        schema_.qualified_name(), param.type.python_name(), param.name, what, position, value, schema_.to_string()));
  }

  // Checks `arg` against parameter `position`; fills `bound`.
  std::optional<BindFailure> check(std::size_t position, const CallArg& arg, BoundArg& bound) const {
    const SchemaType& type = schema_.arguments()[position].type;
    if (type.kind == SchemaType::Kind::kTensor) {
      if (type.is_list && arg.kind == CallArg::Kind::kTensorList) {
        bound.kind = BoundArg::Kind::kTensorList;
        bound.tensors = arg.tensors;
        return std::nullopt;
      }
      if (!type.is_list && arg.kind == CallArg::Kind::kTensor) {
        bound.kind = BoundArg::Kind::kTensor;
        bound.tensors = arg.tensors;
        return std::nullopt;
      }
      if (type.optional && arg.kind == CallArg::Kind::kConstant && arg.constant.is_none()) {
        return std::nullopt;  // bound stays a None constant
      }
      if (arg.kind == CallArg::Kind::kConstant) {
        return mismatch(position, arg, arg.constant.type_name(), arg.constant.repr());
      }
      return mismatch(position, arg, arg.kind == CallArg::Kind::kTensor ? "Tensor" : "List[Tensor]", tensor_repr(arg));
    }
    if (arg.kind != CallArg::Kind::kConstant) {
      // A tensor with known integer values stands for an int list.
      const bool int_list =
          type.is_list && (type.kind == SchemaType::Kind::kInt || type.kind == SchemaType::Kind::kSymInt);
      if (int_list && arg.kind == CallArg::Kind::kTensor && arg.known_int_values) {
        bound.constant = Constant(*arg.known_int_values);
        return std::nullopt;
      }
      return mismatch(position, arg, arg.kind == CallArg::Kind::kTensor ? "Tensor" : "List[Tensor]", tensor_repr(arg));
    }
    std::optional<Constant> converted = convert(type, arg.constant);
    if (!converted) return mismatch(position, arg, arg.constant.type_name(), arg.constant.repr());
    bound.constant = std::move(*converted);
    return std::nullopt;
  }

  // The constant as the parameter type takes it, or nullopt.
  static std::optional<Constant> convert(const SchemaType& type, const Constant& value) {
    using K = Constant::Kind;
    if (value.is_none()) return type.optional ? std::optional<Constant>(value) : std::nullopt;
    const K kind = value.kind();
    if (type.is_list) {
      switch (type.kind) {
        case SchemaType::Kind::kInt:
        case SchemaType::Kind::kSymInt:
          if (kind == K::kIntList) {
            if (type.list_size && *type.list_size > 1 && value.as_int_list().size() != 1 &&
                static_cast<int64_t>(value.as_int_list().size()) != *type.list_size) {
              return std::nullopt;
            }
            return value;
          }
          if (kind == K::kInt && type.list_size) return Constant(std::vector<int64_t>{value.as_int()});
          return std::nullopt;
        case SchemaType::Kind::kFloat:
          if (kind == K::kFloatList) return value;
          if (kind == K::kIntList) {
            return Constant(std::vector<double>(value.as_int_list().begin(), value.as_int_list().end()));
          }
          return std::nullopt;
        default:
          return std::nullopt;
      }
    }
    switch (type.kind) {
      case SchemaType::Kind::kInt:
      case SchemaType::Kind::kSymInt:
        return kind == K::kInt ? std::optional<Constant>(value) : std::nullopt;
      case SchemaType::Kind::kFloat:
        if (kind == K::kFloat) return value;
        if (kind == K::kInt) return Constant(static_cast<double>(value.as_int()));
        return std::nullopt;
      case SchemaType::Kind::kBool:
        return kind == K::kBool ? std::optional<Constant>(value) : std::nullopt;
      case SchemaType::Kind::kStr:
        return kind == K::kString ? std::optional<Constant>(value) : std::nullopt;
      case SchemaType::Kind::kScalar:
        if (kind == K::kInt || kind == K::kFloat || kind == K::kBool) return value;
        return std::nullopt;
      case SchemaType::Kind::kScalarType:
        return kind == K::kDType ? std::optional<Constant>(value) : std::nullopt;
      case SchemaType::Kind::kTensor:
      case SchemaType::Kind::kLayout:
      case SchemaType::Kind::kDevice:
      case SchemaType::Kind::kMemoryFormat:
      case SchemaType::Kind::kGenerator:
        return std::nullopt;  // only None, handled above
    }
    return std::nullopt;
  }

  const FunctionSchema& schema_;
  std::span<const TensorType> tensor_types_;
};

}  // namespace

OpArgs bind_arguments(const OpDef& op, std::span<const CallArg> args, std::span<const TensorType> tensor_types) {
  auto result = Binder(op, tensor_types).bind(args);
  if (auto* failure = std::get_if<BindFailure>(&result)) throw Error(failure->message);
  return std::get<OpArgs>(std::move(result));
}

std::optional<OpArgs> try_bind_arguments(const OpDef& op, std::span<const CallArg> args,
                                         std::span<const TensorType> tensor_types) {
  auto result = Binder(op, tensor_types).bind(args);
  if (std::holds_alternative<BindFailure>(result)) return std::nullopt;
  return std::get<OpArgs>(std::move(result));
}

std::pair<const OpDef*, OpArgs> resolve_call(std::string_view name, std::span<const CallArg> args,
                                             std::span<const TensorType> tensor_types) {
  const std::vector<const OpDef*> candidates = op_registry().overloads(name);
  if (candidates.empty()) throw Error(fmt::format("unknown op '{}'", name));
  if (candidates.size() == 1) return {candidates[0], bind_arguments(*candidates[0], args, tensor_types)};
  std::string reasons;
  for (const OpDef* candidate : candidates) {
    auto result = Binder(*candidate, tensor_types).bind(args);
    if (auto* bound = std::get_if<OpArgs>(&result)) return {candidate, std::move(*bound)};
    reasons += "\n  " + std::get<BindFailure>(result).message;
  }
  throw Error(fmt::format("{}() no overload accepts these arguments:{}", name, reasons));
}

}  // namespace shardflow
