#include "shardflow/sharding/mesh.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <limits>

#include "shardflow/base/error.h"
#include "shardflow/base/python_literal.h"
#include "shardflow/base/text.h"

namespace shardflow {

static std::atomic<int64_t> g_global_device_count{-1};

std::optional<int64_t> global_device_count() {
  const int64_t count = g_global_device_count.load();
  if (count < 0) return std::nullopt;
  return count;
}

void set_global_device_count(std::optional<int64_t> count) { g_global_device_count.store(count ? *count : -1); }

static std::string python_str_tuple(const std::vector<std::string>& names) {
  std::vector<PyValue> items;
  for (const auto& name : names) items.push_back(PyValue::string(name));
  return PyValue::tuple(std::move(items)).repr();
}

Mesh::Mesh(std::vector<int64_t> device_ids, std::vector<int64_t> mesh_shape, std::vector<std::string> axis_names,
           std::optional<int64_t> num_global_devices)
    : device_ids_(std::move(device_ids)), mesh_shape_(std::move(mesh_shape)), axis_names_(std::move(axis_names)) {
  const auto num_ids = static_cast<int64_t>(device_ids_.size());
  // The checks run in PyTorch/XLA's order, with its messages.
  const std::optional<int64_t> global = num_global_devices ? num_global_devices : global_device_count();
  if (global) {
    if (*global <= 0) throw InvalidShardingError("This requires XLA supported device(s).");
    if (num_ids != *global) {
      throw InvalidShardingError(
          fmt::format("Number of device IDs ({}) must match the global number of devices ({})", num_ids, *global));
    }
  }
  if (!axis_names_.empty()) {
    if (axis_names_.size() != mesh_shape_.size()) {
      throw InvalidShardingError(fmt::format("Number of axis names ({}) must match mesh dimensions ({})",
                                             axis_names_.size(), mesh_shape_.size()));
    }
    std::vector<std::string_view> sorted(axis_names_.begin(), axis_names_.end());
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      throw InvalidShardingError("Axis names must be unique, got: " + python_str_tuple(axis_names_));
    }
  }
  for (int64_t extent : mesh_shape_) {
    if (extent <= 0) {
      throw InvalidShardingError("Mesh shape entries must be positive, got: " + python_int_tuple(mesh_shape_));
    }
    if (size_ > kMaxMeshSize / extent) {
      throw InvalidShardingError("Mesh shape " + python_int_tuple(mesh_shape_) + " has more than 2^20 devices");
    }
    size_ *= extent;
  }
  if (num_ids != size_) {
    throw InvalidShardingError(fmt::format("Number of device IDs ({}) must match mesh size ({})", num_ids, size_));
  }
  std::vector<int64_t> sorted_ids = device_ids_;
  std::sort(sorted_ids.begin(), sorted_ids.end());
  if (std::adjacent_find(sorted_ids.begin(), sorted_ids.end()) != sorted_ids.end()) {
    throw InvalidShardingError("Device IDs must be unique, got: " + numpy_int_array(device_ids_));
  }
  if (!sorted_ids.empty() && sorted_ids.back() >= size_) {
    throw InvalidShardingError(
        fmt::format("Device IDs must be less than mesh size ({}), got: {}", size_, numpy_int_array(device_ids_)));
  }
  // Python does not reject negative ids; shardflow does.
  if (!sorted_ids.empty() && sorted_ids.front() < 0) {
    throw InvalidShardingError("Device IDs must be non-negative, got: " + numpy_int_array(device_ids_));
  }
  // PyTorch/XLA accepts such a mesh here and fails later, when numpy
  // reshapes the ids (at 33 dims with numpy 1, 65 with numpy 2); shardflow
  // refuses it up front, after PyTorch/XLA's own checks.
  if (mesh_shape_.size() > kMaxMeshAxes) {
    throw InvalidShardingError(
        fmt::format("Mesh shape has {} dims; shardflow supports at most {} (numpy 2's limit on array "
                    "dims, which PyTorch/XLA reaches when it reshapes the device ids)",
                    mesh_shape_.size(), kMaxMeshAxes));
  }
  // Unique ids in [0, size) are a permutation of 0..size-1.
  position_of_device_.resize(static_cast<std::size_t>(size_));
  for (int64_t i = 0; i < num_ids; ++i) {
    position_of_device_[static_cast<std::size_t>(device_ids_[static_cast<std::size_t>(i)])] = i;
  }
}

std::vector<std::pair<std::string, int64_t>> Mesh::shape() const {
  std::vector<std::pair<std::string, int64_t>> result;
  for (int axis = 0; axis < num_axes(); ++axis) {
    result.emplace_back(axis_label(axis), axis_size(axis));
  }
  return result;
}

std::string Mesh::axis_label(int axis) const {
  if (has_axis_names()) return axis_names_.at(static_cast<std::size_t>(axis));
  return std::to_string(axis);
}

std::optional<int> Mesh::axis_index(std::string_view name) const {
  for (std::size_t i = 0; i < axis_names_.size(); ++i) {
    if (axis_names_[i] == name) return static_cast<int>(i);
  }
  return std::nullopt;
}

int64_t Mesh::device_at(const std::vector<int64_t>& coords) const {
  if (coords.size() != mesh_shape_.size()) {
    throw InvalidShardingError(fmt::format("mesh coordinates {} have {} entries but the mesh has {} axes",
                                           python_int_tuple(coords), coords.size(), mesh_shape_.size()));
  }
  int64_t flat = 0;
  for (std::size_t axis = 0; axis < coords.size(); ++axis) {
    if (coords[axis] < 0 || coords[axis] >= mesh_shape_[axis]) {
      throw InvalidShardingError(fmt::format("mesh coordinates {} are outside the mesh shape {}",
                                             python_int_tuple(coords), python_int_tuple(mesh_shape_)));
    }
    flat = flat * mesh_shape_[axis] + coords[axis];
  }
  return device_ids_[static_cast<std::size_t>(flat)];
}

std::vector<int64_t> Mesh::coords_of(int64_t device_id) const {
  if (device_id < 0 || device_id >= size_) {
    throw InvalidShardingError(fmt::format("device {} is not in the mesh (devices 0..{})", device_id, size_ - 1));
  }
  int64_t flat = position_of_device_[static_cast<std::size_t>(device_id)];
  std::vector<int64_t> coords(mesh_shape_.size());
  for (std::size_t axis = mesh_shape_.size(); axis-- > 0;) {
    coords[axis] = flat % mesh_shape_[axis];
    flat /= mesh_shape_[axis];
  }
  return coords;
}

std::string Mesh::to_string() const {
  return fmt::format("{{'device_ids': [{}], 'mesh_shape': {}, 'axis_names': {}}}", join_ints(device_ids_, ", "),
                     python_int_tuple(mesh_shape_), has_axis_names() ? python_str_tuple(axis_names_) : "None");
}

// Reads a sequence of ints from a parsed literal, for Mesh::from_string.
static std::vector<int64_t> int_sequence(const PyValue* value, std::string_view key) {
  if (value == nullptr) throw InvalidShardingError(fmt::format("mesh text has no '{}' entry", key));
  if (!value->is_sequence()) {
    throw InvalidShardingError(
        fmt::format("mesh text: '{}' must be a list or tuple of ints, got {}", key, value->repr()));
  }
  std::vector<int64_t> result;
  for (const PyValue& item : value->items()) {
    if (item.kind() != PyValue::Kind::kInt) {
      throw InvalidShardingError(fmt::format("mesh text: '{}' must hold ints only, got {}", key, item.repr()));
    }
    result.push_back(item.as_int());
  }
  return result;
}

Mesh Mesh::from_string(std::string_view text, std::optional<int64_t> num_global_devices) {
  const PyValue dict = parse_python_literal(text);
  if (dict.kind() != PyValue::Kind::kDict) {
    throw InvalidShardingError(
        "mesh text must be a dict literal such as {'device_ids': [0, 1], "
        "'mesh_shape': (2,), 'axis_names': None}, got " +
        quote_for_message(text));
  }
  std::vector<std::string> names;
  const PyValue* axis_names = dict.find("axis_names");
  if (axis_names != nullptr && !axis_names->is_none()) {
    if (!axis_names->is_sequence()) {
      throw InvalidShardingError("mesh text: 'axis_names' must be None or a tuple of strings, got " +
                                 axis_names->repr());
    }
    for (const PyValue& item : axis_names->items()) {
      if (item.kind() != PyValue::Kind::kString) {
        throw InvalidShardingError("mesh text: 'axis_names' must hold strings only, got " + item.repr());
      }
      names.push_back(item.as_string());
    }
  }
  return Mesh(int_sequence(dict.find("device_ids"), "device_ids"), int_sequence(dict.find("mesh_shape"), "mesh_shape"),
              std::move(names), num_global_devices);
}

}  // namespace shardflow
