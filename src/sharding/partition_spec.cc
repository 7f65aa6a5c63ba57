#include "shardflow/sharding/partition_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "shardflow/base/error.h"
#include "shardflow/base/python_literal.h"
#include "shardflow/base/text.h"
#include "shardflow/sharding/mesh.h"

namespace shardflow {

std::string AxisRef::repr() const { return is_name_ ? python_repr(name_) : std::to_string(index_); }

SpecEntry SpecEntry::tuple(std::vector<AxisRef> axes) {
  SpecEntry entry;
  entry.kind_ = Kind::kTuple;
  entry.axes_ = std::move(axes);
  return entry;
}

SpecEntry SpecEntry::invalid(std::string repr, std::string message, std::vector<AxisRef> axes_before) {
  SpecEntry entry;
  entry.kind_ = Kind::kInvalid;
  entry.axes_ = std::move(axes_before);
  entry.invalid_repr_ = std::move(repr);
  entry.invalid_message_ = std::move(message);
  return entry;
}

std::string SpecEntry::repr() const {
  switch (kind_) {
    case Kind::kNone:
      return "None";
    case Kind::kAxis:
      return axes_[0].repr();
    case Kind::kTuple: {
      std::string out = "(";
      for (std::size_t i = 0; i < axes_.size(); ++i) {
        if (i > 0) out += ", ";
        out += axes_[i].repr();
      }
      return out + (axes_.size() == 1 ? ",)" : ")");
    }
    case Kind::kInvalid:
      return invalid_repr_;
  }
  return "?";
}

std::string PartitionSpec::to_string() const {
  std::string out = "(";
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (i > 0) out += ", ";
    out += entries_[i].repr();
  }
  return out + (entries_.size() == 1 ? ",)" : ")");
}

static std::string unsupported_type_message(const PyValue& value) {
  return fmt::format("Spec type <class '{}'> is not supported in partition spec", value.type_name());
}

// One element of a tuple entry: an axis index or name.
static std::optional<AxisRef> axis_from_literal(const PyValue& value) {
  if (value.kind() == PyValue::Kind::kInt) return AxisRef(value.as_int());
  if (value.kind() == PyValue::Kind::kString) return AxisRef(value.as_string());
  return std::nullopt;
}

static SpecEntry entry_from_literal(const PyValue& value) {
  switch (value.kind()) {
    case PyValue::Kind::kNone:
      return none;
    case PyValue::Kind::kInt:
      return SpecEntry(value.as_int());
    case PyValue::Kind::kString:
      return SpecEntry(value.as_string());
    case PyValue::Kind::kTuple:
    case PyValue::Kind::kList:
      break;
    case PyValue::Kind::kBool:
    case PyValue::Kind::kFloat:
    case PyValue::Kind::kDict:
      return SpecEntry::invalid(value.repr(), unsupported_type_message(value));
  }
  std::vector<AxisRef> axes;
  for (const PyValue& item : value.items()) {
    if (item.is_sequence()) {
      return SpecEntry::invalid(value.repr(), "Partition spec cannot contain nested tuples");
    }
  }
  for (const PyValue& item : value.items()) {
    std::optional<AxisRef> axis = axis_from_literal(item);
    if (!axis) {
      std::string message = item.is_none() ? fmt::format(
                                                 "a tuple entry of a partition spec lists mesh axes only; "
                                                 "None inside {} is not allowed",
                                                 value.repr())
                                           : unsupported_type_message(item);
      return SpecEntry::invalid(value.repr(), std::move(message), std::move(axes));
    }
    axes.push_back(*axis);
  }
  return SpecEntry::tuple(std::move(axes));
}

PartitionSpec PartitionSpec::from_literal(const PyValue& value, std::string_view source_text) {
  if (!value.is_sequence()) {
    std::string hint;
    if (value.kind() == PyValue::Kind::kString || value.kind() == PyValue::Kind::kInt) {
      hint = fmt::format(" (a 1-tuple needs a trailing comma: ({},))", value.repr());
    }
    throw InvalidShardingError(fmt::format("partition_spec must be a tuple such as ('data', None), got {}{}",
                                           source_text.empty() ? value.repr() : quote_for_message(source_text), hint));
  }
  std::vector<SpecEntry> entries;
  for (const PyValue& item : value.items()) entries.push_back(entry_from_literal(item));
  return PartitionSpec(std::move(entries));
}

PartitionSpec PartitionSpec::parse(std::string_view literal) {
  return from_literal(parse_python_literal(literal), literal);
}

static AxisRef translate_axis(const AxisRef& axis, const Mesh& mesh) {
  if (!axis.is_name()) return axis;
  if (!mesh.has_axis_names()) {
    // PyTorch/XLA fails this way when a name meets a mesh without names.
    throw InvalidShardingError("argument of type 'NoneType' is not iterable");
  }
  const std::optional<int> index = mesh.axis_index(axis.name());
  if (!index) throw InvalidShardingError(fmt::format("Axis name {} is not defined in the given mesh", axis.name()));
  return AxisRef(*index);
}

PartitionSpec translate_partition_spec(const PartitionSpec& spec, const Mesh& mesh) {
  std::vector<SpecEntry> translated;
  for (std::size_t i = 0; i < spec.size(); ++i) {
    const SpecEntry& entry = spec[i];
    switch (entry.kind()) {
      case SpecEntry::Kind::kNone:
        translated.push_back(none);
        break;
      case SpecEntry::Kind::kAxis: {
        const AxisRef axis = translate_axis(entry.axes()[0], mesh);
        translated.push_back(SpecEntry(axis.index()));
        break;
      }
      case SpecEntry::Kind::kTuple: {
        if (entry.axes().empty()) {
          throw InvalidShardingError(
              fmt::format("partition spec entry {} of {} is an empty tuple; use None for "
                          "a dimension that is not sharded",
                          i, spec.to_string()));
        }
        std::vector<AxisRef> axes;
        for (const AxisRef& axis : entry.axes()) axes.push_back(translate_axis(axis, mesh));
        translated.push_back(SpecEntry::tuple(std::move(axes)));
        break;
      }
      case SpecEntry::Kind::kInvalid:
        // Python translates a tuple's items in order, so a bad name before the
        // bad item is reported first.
        for (const AxisRef& axis : entry.axes()) translate_axis(axis, mesh);
        throw InvalidShardingError(entry.invalid_message());
    }
  }
  return PartitionSpec(std::move(translated));
}

void validate_partition_spec(const PartitionSpec& translated, const Mesh& mesh) {
  std::vector<int64_t> used;
  for (const SpecEntry& entry : translated.entries()) {
    for (const AxisRef& axis : entry.axes()) {
      if (axis.is_name()) {
        throw InvalidShardingError("validate_partition_spec needs a translated spec; found axis name " + axis.repr());
      }
      used.push_back(axis.index());
    }
  }
  for (int64_t axis : used) {
    if (axis < 0 || axis >= mesh.num_axes()) {
      throw InvalidShardingError(
          fmt::format("partition_spec ({}) contains out of bound index into mesh_shape.", translated.to_string()));
    }
  }
  std::sort(used.begin(), used.end());
  if (std::adjacent_find(used.begin(), used.end()) != used.end()) {
    throw InvalidShardingError(fmt::format(
        "Each device mesh dimension should appear at most once in partition_spec {}.", translated.to_string()));
  }
}

void check_partition_spec_rank(const PartitionSpec& spec, int64_t rank) {
  if (static_cast<int64_t>(spec.size()) != rank) {
    throw InvalidShardingError(
        fmt::format("Partition spec length ({}) should be equal to the input rank ({}).", spec.size(), rank));
  }
}

}  // namespace shardflow
