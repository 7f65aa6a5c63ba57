// xla::dynamo_mark_sharding: identity on values, a sharding constraint for
// propagation. Its rule passes every dim through:
//   ([i, j])->([i, j]) {i=8, j=512}
#include "shardflow/ops/annotation.h"

#include <fmt/format.h>

#include "families.h"
#include "shardflow/base/error.h"
#include "shardflow/base/python_literal.h"

namespace shardflow::ops {

MarkShardingStrings encode_mark_sharding(const Mesh& mesh, const PartitionSpec& spec) {
  MarkShardingStrings strings;
  strings.device_ids = mesh.device_ids();
  std::vector<PyValue> extents;
  for (int64_t extent : mesh.mesh_shape()) extents.push_back(PyValue::integer(extent));
  strings.mesh_shape = PyValue::tuple(std::move(extents)).repr();
  if (mesh.has_axis_names()) {
    std::vector<PyValue> names;
    for (const std::string& name : mesh.axis_names()) names.push_back(PyValue::string(name));
    strings.axis_names = PyValue::tuple(std::move(names)).repr();
  } else {
    strings.axis_names = "None";
  }
  strings.partition_spec = spec.to_string();
  return strings;
}

static std::vector<int64_t> decode_mesh_shape(const std::string& text) {
  const PyValue value = parse_python_literal(text);
  if (value.kind() == PyValue::Kind::kInt) return {value.as_int()};
  if (!value.is_sequence()) {
    throw Error(
        fmt::format("xla::dynamo_mark_sharding: mesh_shape must be a tuple of ints such as "
                    "\"(4, 1, 2)\", got \"{}\"",
                    text));
  }
  std::vector<int64_t> shape;
  for (const PyValue& item : value.items()) {
    if (item.kind() != PyValue::Kind::kInt) {
      throw Error(
          fmt::format("xla::dynamo_mark_sharding: mesh_shape must hold ints, got {} in \"{}\"", item.repr(), text));
    }
    shape.push_back(item.as_int());
  }
  return shape;
}

static std::vector<std::string> decode_axis_names(const std::string& text) {
  const PyValue value = parse_python_literal(text);
  if (value.is_none()) return {};
  if (!value.is_sequence()) {
    throw Error(
        fmt::format("xla::dynamo_mark_sharding: axis_names must be \"None\" or a tuple of "
                    "strings such as \"('data', 'model')\", got \"{}\"",
                    text));
  }
  std::vector<std::string> names;
  for (const PyValue& item : value.items()) {
    if (item.kind() != PyValue::Kind::kString) {
      throw Error(
          fmt::format("xla::dynamo_mark_sharding: axis_names must hold strings, got {} in "
                      "\"{}\"",
                      item.repr(), text));
    }
    names.push_back(item.as_string());
  }
  return names;
}

Sharding decode_mark_sharding(const OpArgs& args, int64_t rank) {
  auto mesh =
      std::make_shared<const Mesh>(args.get_int_list("device_ids"), decode_mesh_shape(args.get_string("mesh_shape")),
                                   decode_axis_names(args.get_string("axis_names")));
  const PartitionSpec spec = PartitionSpec::parse(args.get_string("partition_spec"));
  check_partition_spec_rank(spec, rank);
  return Sharding::from_spec(std::move(mesh), spec);
}

void register_annotation_ops(OpRegistry& registry) {
  OpDef def;
  def.family = OpFamily::kAnnotation;
  def.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    decode_mark_sharding(args, in[0].rank());  // validates the annotation
    return std::vector<TensorType>{in[0]};
  };
  def.sharding_rule = [](const OpArgs&, std::span<const TensorType> in, std::span<const TensorType> out) {
    RuleBuilder builder(in, out);
    builder.add_pointwise();
    return builder.build();
  };
  def.kernel = [](const OpArgs&, std::span<const DenseTensor> in) { return std::vector<DenseTensor>{in[0]}; };
  registry.add(
      "xla::dynamo_mark_sharding(Tensor t, int[] device_ids, str mesh_shape, "
      "str axis_names, str partition_spec) -> Tensor",
      std::move(def));
}

}  // namespace shardflow::ops
