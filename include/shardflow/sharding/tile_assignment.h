// XLA tile assignments: which device holds each tile of a tiled sharding.
//
// Two forms, as in XLA. Explicit: the device ids listed row-major over the
// tile dims (`devices=[2,2]0,2,1,3`). Iota: devices = arange(N) reshaped to
// `reshape_dims`, transposed by `perm`, then read row-major over the tile
// dims (`devices=[2,2]<=[2,2]T(1,0)` is again 0,2,1,3).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace shardflow {

// numpy's values.reshape(dims).transpose(perm).flatten(), for small int arrays.
std::vector<int64_t> transpose_array(std::span<const int64_t> values, std::span<const int64_t> dims,
                                     std::span<const int64_t> perm);

class IotaTileAssignment {
 public:
  // `<=[N]` over the given tile dims.
  static IotaTileAssignment create(std::vector<int64_t> dims);
  // Canonicalises (XLA's IotaTileAssignment::Create): drops reshape dims of
  // size 1, merges runs of consecutive perm entries, until nothing changes.
  // Example: [3,4,5]T(1,2,0) -> [3,20]T(1,0); [1,8]T(0,1) -> [8].
  static IotaTileAssignment create(std::vector<int64_t> dims, std::vector<int64_t> reshape_dims,
                                   std::vector<int64_t> perm);

  const std::vector<int64_t>& dims() const { return dims_; }
  const std::vector<int64_t>& reshape_dims() const { return reshape_dims_; }
  const std::vector<int64_t>& perm() const { return perm_; }
  int64_t num_elements() const;

  // The device ids, row-major over the tile dims.
  std::vector<int64_t> to_devices() const;
  // "[4,2]<=[2,4]T(1,0)"; T(...) only when there is more than one reshape dim.
  std::string to_string() const;

  friend bool operator==(const IotaTileAssignment&, const IotaTileAssignment&) = default;

 private:
  std::vector<int64_t> dims_;
  std::vector<int64_t> reshape_dims_;
  std::vector<int64_t> perm_;
};

class TileAssignment {
 public:
  explicit TileAssignment(IotaTileAssignment iota);
  TileAssignment(std::vector<int64_t> dims, std::vector<int64_t> devices);

  const std::vector<int64_t>& dims() const { return dims_; }
  int num_dims() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int i) const { return dims_.at(static_cast<std::size_t>(i)); }
  int64_t num_elements() const;
  bool is_iota() const { return iota_.has_value(); }
  const std::optional<IotaTileAssignment>& iota() const { return iota_; }

  // Device ids row-major over the tile dims (expands an iota).
  std::vector<int64_t> devices() const;
  // Same devices read with other dims (same element count); an iota stays one.
  TileAssignment reshape(std::vector<int64_t> new_dims) const;
  // The tile array with its dims permuted (new dim i = old dim perm[i]). An
  // iota stays an iota where XLA keeps one (moves of size-1 dims, a plain
  // [N] iota, a transpose of whole reshape dims); otherwise the result is
  // explicit.
  TileAssignment transpose(const std::vector<int64_t>& perm) const;
  // "devices=[2,4]0,1,2,3,4,5,6,7" or "devices=[2,4]<=[8]".
  std::string to_string() const;

  // Equal when the form and the content are equal (an iota and the explicit
  // list it expands to compare unequal, as XLA's proto comparison does).
  friend bool operator==(const TileAssignment&, const TileAssignment&) = default;

 private:
  std::vector<int64_t> dims_;
  std::optional<IotaTileAssignment> iota_;
  std::vector<int64_t> devices_;  // explicit form only
};

}  // namespace shardflow
