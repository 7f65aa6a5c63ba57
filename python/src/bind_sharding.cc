// Mesh, PartitionSpec, Sharding, HloSharding and shard layouts in Python.
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "arrays.h"
#include "bindings.h"
#include "convert.h"
#include "shardflow/base/error.h"
#include "shardflow/sharding/hlo_sharding.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/sharding/shard_diagram.h"
#include "shardflow/sharding/shard_layout.h"
#include "shardflow/sharding/sharding.h"

namespace shardflow::python {

using namespace nb::literals;

static nb::tuple int_tuple(const std::vector<int64_t>& values) {
  nb::list list;
  for (int64_t v : values) list.append(v);
  return nb::tuple(list);
}

static Mesh make_mesh(nb::handle device_ids, nb::handle mesh_shape, nb::handle axis_names) {
  std::vector<std::string> names;
  if (!axis_names.is_none()) {
    if (nb::isinstance<nb::str>(axis_names)) {
      throw Error(fmt::format("axis_names must be a tuple of strings such as ('data', 'model'), got the string {}",
                              nb::repr(axis_names).c_str()));
    }
    for (nb::handle name : axis_names) {
      if (!nb::isinstance<nb::str>(name)) {
        throw Error(fmt::format("axis_names must hold strings, got {}", nb::repr(name).c_str()));
      }
      names.push_back(nb::cast<std::string>(name));
    }
  }
  return Mesh(int_list(device_ids, "device_ids"), int_list(mesh_shape, "mesh_shape"), std::move(names));
}

static nb::object axis_names_of(const Mesh& mesh) {
  if (!mesh.has_axis_names()) return nb::none();
  nb::list names;
  for (const std::string& name : mesh.axis_names()) names.append(name);
  return nb::tuple(names);
}

// Python's slice objects for a shard (torch_xla's XLAShard.indices).
static nb::tuple slice_indices(const std::vector<DimSlice>& slices) {
  nb::list indices;
  for (const DimSlice& s : slices) indices.append(nb::slice(nb::int_(s.start), nb::int_(s.stop), nb::none()));
  return nb::tuple(indices);
}

static nb::object spec_entry_object(const SpecEntry& entry) {
  const auto axis_object = [](const AxisRef& axis) -> nb::object {
    return axis.is_name() ? nb::object(nb::str(axis.name().c_str())) : nb::object(nb::int_(axis.index()));
  };
  switch (entry.kind()) {
    case SpecEntry::Kind::kNone:
      return nb::none();
    case SpecEntry::Kind::kAxis:
      return axis_object(entry.axes().front());
    case SpecEntry::Kind::kTuple: {
      nb::list axes;
      for (const AxisRef& axis : entry.axes()) axes.append(axis_object(axis));
      return nb::tuple(axes);
    }
    case SpecEntry::Kind::kInvalid:
      break;
  }
  throw Error("partition spec entry " + entry.repr() + " is not valid: " + entry.invalid_message());
}

static void bind_mesh(nb::module_& m) {
  nb::class_<Mesh>(m, "Mesh",
                   "A logical device mesh, as PyTorch/XLA's Mesh(device_ids, mesh_shape, axis_names).\n\n"
                   "device_ids stay flat in the order given; the logical mesh is that list reshaped to\n"
                   "mesh_shape row-major. Validation and messages are PyTorch/XLA's.")
      .def(
          "__init__",
          [](Mesh* self, nb::handle device_ids, nb::handle mesh_shape, nb::handle axis_names) {
            new (self) Mesh(make_mesh(device_ids, mesh_shape, axis_names));
          },
          "device_ids"_a, "mesh_shape"_a, "axis_names"_a.none() = nb::none(),
          nb::sig("def __init__(self, device_ids: typing.Sequence[int] | typing.Any, "
                  "mesh_shape: typing.Sequence[int], axis_names: typing.Sequence[str] | None = None) -> None"))
      .def_prop_ro(
          "device_ids", [](const Mesh& mesh) { return mesh.device_ids(); }, "The device ids, flat, in the order given.")
      .def_prop_ro("mesh_shape", [](const Mesh& mesh) { return int_tuple(mesh.mesh_shape()); })
      .def_prop_ro("axis_names", &axis_names_of, nb::sig("def axis_names(self) -> tuple[str, ...] | None"))
      .def("size", &Mesh::size, "The number of devices: the product of the mesh shape.")
      .def(
          "shape",
          [](const Mesh& mesh) {
            nb::dict shape;  // insertion-ordered, like PyTorch/XLA's OrderedDict
            for (int axis = 0; axis < mesh.num_axes(); ++axis) {
              if (mesh.has_axis_names()) {
                shape[nb::str(mesh.axis_names()[static_cast<std::size_t>(axis)].c_str())] = mesh.axis_size(axis);
              } else {
                shape[nb::int_(axis)] = mesh.axis_size(axis);
              }
            }
            return shape;
          },
          "Axis name (or index, on an unnamed mesh) to size, in mesh order.")
      .def(
          "get_logical_mesh",
          [](const Mesh& mesh) {
            return nb::module_::import_("numpy")
                .attr("array")(mesh.device_ids())
                .attr("reshape")(int_tuple(mesh.mesh_shape()));
          },
          "The device ids reshaped to the mesh shape (a NumPy array).")
      .def(
          "get_axis_name_idx",
          [](const Mesh& mesh, const std::string& name) -> std::optional<int> {
            if (!mesh.has_axis_names()) throw InvalidShardingError("argument of type 'NoneType' is not iterable");
            return mesh.axis_index(name);
          },
          "name"_a, "The index of a named axis, or None.")
      .def("device_at", &Mesh::device_at, "coords"_a, "The device at these mesh coordinates.")
      .def("coords_of", &Mesh::coords_of, "device_id"_a, "The mesh coordinates of a device.")
      .def_static(
          "from_str", [](const std::string& text) { return Mesh::from_string(text); }, "text"_a,
          "Builds a mesh from its str() form (validated again).")
      .def("__str__", &Mesh::to_string)
      .def("__repr__",
           [](const Mesh& mesh) {
             return fmt::format("Mesh({}, {}, {})", nb::repr(nb::cast(mesh.device_ids())).c_str(),
                                nb::repr(int_tuple(mesh.mesh_shape())).c_str(), nb::repr(axis_names_of(mesh)).c_str());
           })
      .def("__eq__", [](const Mesh& a, const Mesh& b) { return a == b; })
      .def("__hash__", [](const Mesh& mesh) { return nb::hash(nb::str(mesh.to_string().c_str())); });
}

static void bind_partition_spec(nb::module_& m) {
  nb::class_<PartitionSpec>(m, "PartitionSpec",
                            "Which mesh axes split each tensor dim: PartitionSpec('data', None, ('x', 'y')).\n\n"
                            "Entries are None, an axis name or index, or a tuple of axes (major to minor).")
      .def(
          "__init__",
          [](PartitionSpec* self, nb::args entries) {
            new (self) PartitionSpec(PartitionSpec::from_literal(literal_of(nb::tuple(entries), "partition_spec")));
          },
          nb::sig("def __init__(self, *entries: None | int | str | tuple[int | str, ...]) -> None"))
      .def_static("parse", &PartitionSpec::parse, "text"_a,
                  "Parses the Python-literal form the custom op carries: \"('data', None)\".")
      .def("__len__", &PartitionSpec::size)
      .def("__getitem__",
           [](const PartitionSpec& spec, int64_t i) {
             const auto n = static_cast<int64_t>(spec.size());
             if (i < -n || i >= n) throw nb::index_error("partition spec index out of range");
             return spec_entry_object(spec[static_cast<std::size_t>(i < 0 ? i + n : i)]);
           })
      .def("__iter__",
           [](const PartitionSpec& spec) {
             nb::list entries;
             for (const SpecEntry& entry : spec.entries()) entries.append(spec_entry_object(entry));
             return nb::iter(entries);
           })
      .def("__eq__", [](const PartitionSpec& a, const PartitionSpec& b) { return a == b; })
      .def("__hash__", [](const PartitionSpec& spec) { return nb::hash(nb::str(spec.to_string().c_str())); })
      .def("__str__", &PartitionSpec::to_string)
      .def("__repr__", [](const PartitionSpec& spec) {
        const std::string text = spec.to_string();  // "('a', None)" or "('a',)"
        std::string inner = text.substr(1, text.size() - 2);
        if (!inner.empty() && inner.back() == ',') inner.pop_back();
        return "PartitionSpec(" + inner + ")";
      });
}

static void bind_hlo_sharding(nb::module_& m) {
  nb::class_<HloSharding>(m, "HloSharding",
                          "XLA's sharding text: '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'.\n\n"
                          "parse() normalises as XLA does, so str() gives XLA's canonical text.")
      .def_static("parse", &HloSharding::parse, "text"_a)
      .def_prop_ro(
          "kind",
          [](const HloSharding& s) -> const char* {
            switch (s.kind()) {
              case HloSharding::Kind::kReplicated:
                return "replicated";
              case HloSharding::Kind::kManual:
                return "manual";
              case HloSharding::Kind::kUnknown:
                return "unknown";
              case HloSharding::Kind::kUnreduced:
                return "unreduced";
              case HloSharding::Kind::kMaximal:
                return "maximal";
              case HloSharding::Kind::kTiled:
                return "tiled";
              case HloSharding::Kind::kTuple:
                return "tuple";
            }
            return "unknown";
          },
          "'replicated', 'manual', 'unknown', 'unreduced', 'maximal', 'tiled' or 'tuple'.")
      .def_prop_ro(
          "type", [](const HloSharding& s) { return std::string(to_string(sharding_type(s))); },
          "PyTorch/XLA's ShardingType name: 'REPLICATED', 'TILED', 'PARTIAL', ...")
      .def_prop_ro("is_tiled", &HloSharding::is_tiled)
      .def_prop_ro(
          "tile_shape",
          [](const HloSharding& s) -> nb::object {
            return s.is_tiled() ? nb::object(int_tuple(s.tile_assignment().dims())) : nb::none();
          },
          "The tile assignment's dims (None unless tiled).")
      .def_prop_ro(
          "tile_devices",
          [](const HloSharding& s) -> nb::object {
            return s.is_tiled() ? nb::cast(s.tile_assignment().devices()) : nb::none();
          },
          "The device ids row-major over the tile dims (None unless tiled).")
      .def_prop_ro("replicate_on_last_tile_dim", &HloSharding::replicate_on_last_tile_dim)
      .def_prop_ro("num_data_dims", &HloSharding::num_data_dims)
      .def_prop_ro("maximal_device",
                   [](const HloSharding& s) -> std::optional<int64_t> {
                     if (s.kind() != HloSharding::Kind::kMaximal) return std::nullopt;
                     return s.maximal_device();
                   })
      .def_prop_ro("tuple_elements", &HloSharding::tuple_elements)
      .def(
          "shard_layout",
          [](const HloSharding& s, nb::handle shape, int64_t num_devices) {
            return shard_layout(s, int_list(shape, "shape"), num_devices);
          },
          "shape"_a, "num_devices"_a, "Where each of devices 0..num_devices-1 holds its piece of a tensor.")
      .def("__str__", &HloSharding::to_string)
      .def("__repr__", [](const HloSharding& s) { return "HloSharding('" + s.to_string() + "')"; })
      .def("__eq__", [](const HloSharding& a, const HloSharding& b) { return a == b; })
      .def("__hash__", [](const HloSharding& s) { return nb::hash(nb::str(s.to_string().c_str())); });
}

static void bind_layouts(nb::module_& m) {
  nb::class_<DeviceShard>(m, "DeviceShard", "One device's piece of a tensor under a shard layout.")
      .def_ro("device", &DeviceShard::device)
      .def_ro("replica_id", &DeviceShard::replica_id)
      .def_prop_ro(
          "slices",
          [](const DeviceShard& s) {
            std::vector<std::pair<int64_t, int64_t>> out;
            for (const DimSlice& d : s.slices) out.emplace_back(d.start, d.stop);
            return out;
          },
          "(start, stop) per tensor dim, in global unpadded coordinates.")
      .def_prop_ro(
          "indices", [](const DeviceShard& s) { return slice_indices(s.slices); },
          "The slices as Python slice objects: global_array[shard.indices] is the shard's data.")
      .def_ro("tile_index", &DeviceShard::tile_index)
      .def_ro("whole", &DeviceShard::whole, "The device holds the whole tensor.")
      .def("__repr__", [](const DeviceShard& s) {
        std::string slices;
        for (const DimSlice& d : s.slices)
          slices += fmt::format("{}[{}:{}]", slices.empty() ? "" : ", ", d.start, d.stop);
        return fmt::format("DeviceShard(device={}, replica_id={}, slices=({}))", s.device, s.replica_id, slices);
      });

  nb::class_<ShardLayout>(m, "ShardLayout",
                          "Where each device's piece of a tensor lives: ceil-sized shards padded on the high side.")
      .def_prop_ro("global_shape", [](const ShardLayout& l) { return int_tuple(l.global_shape); })
      .def_prop_ro(
          "shard_shape", [](const ShardLayout& l) { return int_tuple(l.shard_shape); },
          "The padded local shape, the same on every device.")
      .def_prop_ro("num_tiles", [](const ShardLayout& l) { return int_tuple(l.num_tiles); })
      .def_ro("shards", &ShardLayout::shards, "One per device, by device id.")
      .def("shard_of", &ShardLayout::shard_of, "device"_a, nb::rv_policy::copy)
      .def(
          "draw", [](const ShardLayout& l) { return draw_shard_layout(l); },
          "A text picture of which device holds which block (any rank).")
      .def(
          "split",
          [](const ShardLayout& layout, const InputArray& array) {
            const DenseTensor global = borrow_array(array);
            if (global.shape() != layout.global_shape) {
              throw Error(fmt::format("split: the array has shape {} but the layout is for {}",
                                      shape_to_string(global.shape()), shape_to_string(layout.global_shape)));
            }
            nb::list shards;
            const std::size_t element = element_size(global.dtype());
            for (std::size_t i = 0; i < layout.shards.size(); ++i) {
              DenseTensor shard = DenseTensor::empty(global.dtype(), layout.shard_shape);
              copy_shard(layout, i, global.bytes(), element, {shard.data(), shard.nbytes()});
              shards.append(to_numpy(shard));
            }
            return shards;
          },
          "array"_a, "The padded shard of every device (zero padding), as NumPy arrays.")
      .def("__repr__", [](const ShardLayout& l) {
        return fmt::format("ShardLayout(global_shape={}, shard_shape={}, devices={})", shape_to_string(l.global_shape),
                           shape_to_string(l.shard_shape), l.shards.size());
      });
}

static void bind_sharding_class(nb::module_& m) {
  nb::class_<Sharding>(m, "Sharding",
                       "shardflow's axis-based sharding: a mesh and, per tensor dim, the mesh axes splitting it.\n\n"
                       "Sharding.from_spec(mesh, ('data', None)).v1 is the string PyTorch/XLA prints.")
      .def_static(
          "from_spec",
          [](std::shared_ptr<Mesh> mesh, nb::handle spec) {
            return Sharding::from_spec(std::move(mesh), partition_spec_of(spec));
          },
          "mesh"_a, "spec"_a,
          nb::sig("def from_spec(mesh: Mesh, spec: PartitionSpec | tuple | list | str) -> Sharding"),
          "Translates and validates the spec against the mesh (PyTorch/XLA's errors).")
      .def_static(
          "replicated",
          [](std::shared_ptr<Mesh> mesh, int rank) { return Sharding::replicated(std::move(mesh), rank); }, "mesh"_a,
          "rank"_a)
      .def_prop_ro("mesh", [](const Sharding& s) { return python_mesh(s.mesh_ptr()); })
      .def_prop_ro("rank", &Sharding::rank)
      .def_prop_ro(
          "dim_axes",
          [](const Sharding& s) {
            nb::list dims;
            for (const std::vector<int>& axes : s.all_dim_axes()) {
              nb::list names;
              for (int axis : axes) names.append(s.mesh().axis_label(axis));
              dims.append(nb::tuple(names));
            }
            return nb::tuple(dims);
          },
          "Per tensor dim, the names (or indices) of the mesh axes splitting it, major to minor.")
      .def_prop_ro("spec", &Sharding::to_partition_spec)
      .def_prop_ro(
          "v1", [](const Sharding& s) { return s.to_hlo_v1().to_string(); },
          "XLA's sharding string with an explicit device list (PyTorch/XLA's default).")
      .def_prop_ro(
          "v2", [](const Sharding& s) { return s.to_hlo_v2().to_string(); },
          "XLA's iota sharding string (PyTorch/XLA with CONVERT_SHLO_TO_SHARDY).")
      .def_prop_ro("hlo_v1", &Sharding::to_hlo_v1)
      .def_prop_ro("hlo_v2", &Sharding::to_hlo_v2)
      .def_prop_ro(
          "readable", [](const Sharding& s) { return s.to_readable(); }, "'[{data},{}]'")
      .def_prop_ro(
          "type", [](const Sharding& s) { return std::string(to_string(s.type())); },
          "PyTorch/XLA's sharding_type, read off the final sharding: 'REPLICATED', 'TILED' or 'PARTIAL'.")
      .def_prop_ro(
          "spec_type", [](const Sharding& s) { return std::string(to_string(s.spec_type())); },
          "The type mark_sharding computes from the spec before XLA normalises the sharding.")
      .def_prop_ro("is_replicated", &Sharding::is_replicated)
      .def("num_shards", &Sharding::num_shards, "dim"_a)
      .def(
          "readable_for",
          [](const Sharding& s, nb::handle shape, const std::string& dtype) {
            return s.to_readable(int_list(shape, "shape"), dtype);
          },
          "shape"_a, "dtype"_a = "", "'f32[16@data,8]'")
      .def(
          "shard_layout", [](const Sharding& s, nb::handle shape) { return shard_layout(s, int_list(shape, "shape")); },
          "shape"_a, "The padded local shard shape and each device's slices and replica id.")
      .def(
          "draw",
          [](const Sharding& s, nb::handle shape) {
            return draw_shard_layout(shard_layout(s, int_list(shape, "shape")));
          },
          "shape"_a, "A text picture of which device holds which block of a tensor of this shape (any rank).")
      .def("__eq__", [](const Sharding& a, const Sharding& b) { return a == b; })
      .def("__repr__", [](const Sharding& s) {
        return "Sharding(" + s.to_readable() + ", v1='" + s.to_hlo_v1().to_string() + "')";
      });
}

void bind_sharding(nb::module_& m) {
  bind_mesh(m);
  bind_partition_spec(m);
  bind_hlo_sharding(m);
  bind_layouts(m);
  bind_sharding_class(m);
  m.def("compress_device_list", &compress_device_list, "devices"_a, "'0-3,8,10-11'");
}

}  // namespace shardflow::python
