// A logical device mesh, as PyTorch/XLA's `Mesh(device_ids, mesh_shape, axis_names)`.
//
// The device ids are kept flat, in the order given; the logical mesh is that
// list reshaped to `mesh_shape` in row-major order. Example: ids 0..7 with
// shape (4, 2) give [[0,1],[2,3],[4,5],[6,7]], so device 5 sits at (2, 1).
// Construction validates in PyTorch/XLA's order and with its messages
// (sharding-semantics §1.2); negative ids are rejected as well.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardflow {

// The largest mesh shardflow accepts (2^20 devices).
inline constexpr int64_t kMaxMeshSize = int64_t{1} << 20;
// The most axes a mesh has (numpy 2's limit on array dims).
inline constexpr std::size_t kMaxMeshAxes = 64;

class Mesh {
 public:
  // `axis_names` empty means an unnamed mesh (Python's `axis_names=None`).
  // When `num_global_devices` is not given, the device count of the current
  // runtime is used if one is set (see set_global_device_count); the mesh must
  // cover all global devices.
  Mesh(std::vector<int64_t> device_ids, std::vector<int64_t> mesh_shape, std::vector<std::string> axis_names = {},
       std::optional<int64_t> num_global_devices = std::nullopt);

  // Number of devices: the product of the mesh shape.
  int64_t size() const { return size_; }
  int num_axes() const { return static_cast<int>(mesh_shape_.size()); }
  const std::vector<int64_t>& device_ids() const { return device_ids_; }
  const std::vector<int64_t>& mesh_shape() const { return mesh_shape_; }
  int64_t axis_size(int axis) const { return mesh_shape_.at(static_cast<std::size_t>(axis)); }
  bool has_axis_names() const { return !axis_names_.empty(); }
  const std::vector<std::string>& axis_names() const { return axis_names_; }

  // PyTorch/XLA's `shape()`: (name, size) per axis in mesh order; an unnamed
  // mesh uses the axis index as the name.
  std::vector<std::pair<std::string, int64_t>> shape() const;
  // The name users read for an axis: its name, or its index on unnamed meshes.
  std::string axis_label(int axis) const;
  // The index of a named axis, or nullopt when the mesh has no such name.
  std::optional<int> axis_index(std::string_view name) const;

  // The device at mesh coordinates, and the coordinates of a device id.
  int64_t device_at(const std::vector<int64_t>& coords) const;
  std::vector<int64_t> coords_of(int64_t device_id) const;

  // `{'device_ids': [0, 1], 'mesh_shape': (2,), 'axis_names': ('x',)}`, and back.
  std::string to_string() const;
  static Mesh from_string(std::string_view text, std::optional<int64_t> num_global_devices = std::nullopt);

  friend bool operator==(const Mesh& a, const Mesh& b) {
    return a.device_ids_ == b.device_ids_ && a.mesh_shape_ == b.mesh_shape_ && a.axis_names_ == b.axis_names_;
  }

 private:
  std::vector<int64_t> device_ids_;
  std::vector<int64_t> mesh_shape_;
  std::vector<std::string> axis_names_;
  std::vector<int64_t> position_of_device_;  // device id -> flat position
  int64_t size_ = 1;
};

// The number of devices of the current runtime ("global devices" in
// PyTorch/XLA). The runtime sets it; nullopt means no runtime is active, and a
// mesh then defines its own device count.
std::optional<int64_t> global_device_count();
void set_global_device_count(std::optional<int64_t> count);

}  // namespace shardflow
