#include "shardflow/sharding/tile_assignment.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <numeric>

#include "shardflow/base/error.h"
#include "shardflow/base/text.h"

namespace shardflow {

static std::string bracketed(const std::vector<int64_t>& values) { return "[" + join_ints(values, ",") + "]"; }

// Number of tiles; dims come from user text, so they are checked here.
static int64_t product(const std::vector<int64_t>& values) {
  // Far beyond any real mesh, and small enough to list the devices explicitly.
  constexpr int64_t kMaxDevices = int64_t{1} << 20;
  int64_t result = 1;
  for (int64_t v : values) {
    if (v <= 0) throw Error("tile assignment dims must be positive, got " + bracketed(values));
    if (result > kMaxDevices / v) {
      throw Error("tile assignment dims " + bracketed(values) + " describe more than 2^20 tiles");
    }
    result *= v;
  }
  return result;
}

// Removes reshape dim `dim` (of size 1, or merged away) and renumbers `perm`.
static void erase_reshape_dim(std::vector<int64_t>& reshape_dims, std::vector<int64_t>& perm, int64_t dim) {
  reshape_dims.erase(reshape_dims.begin() + dim);
  perm.erase(std::find(perm.begin(), perm.end(), dim));
  for (int64_t& p : perm) {
    if (p > dim) --p;
  }
}

std::vector<int64_t> transpose_array(std::span<const int64_t> values, std::span<const int64_t> dims,
                                     std::span<const int64_t> perm) {
  const std::size_t rank = dims.size();
  assert(perm.size() == rank && "transpose_array needs one perm entry per dim");
  std::vector<int64_t> strides(rank, 1);
  for (std::size_t i = rank; i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  // Walk the result row-major; `source` is the matching position in `values`.
  std::vector<int64_t> extent(rank), stride(rank), index(rank, 0);
  for (std::size_t i = 0; i < rank; ++i) {
    extent[i] = dims[static_cast<std::size_t>(perm[i])];
    stride[i] = strides[static_cast<std::size_t>(perm[i])];
  }
  std::vector<int64_t> result;
  result.reserve(values.size());
  int64_t source = 0;
  for (std::size_t k = 0; k < values.size(); ++k) {
    result.push_back(values[static_cast<std::size_t>(source)]);
    for (std::size_t i = rank; i-- > 0;) {
      source += stride[i];
      if (++index[i] < extent[i]) break;
      source -= stride[i] * extent[i];
      index[i] = 0;
    }
  }
  return result;
}

IotaTileAssignment IotaTileAssignment::create(std::vector<int64_t> dims) {
  const int64_t n = product(dims);
  return create(std::move(dims), {n}, {0});
}

IotaTileAssignment IotaTileAssignment::create(std::vector<int64_t> dims, std::vector<int64_t> reshape_dims,
                                              std::vector<int64_t> perm) {
  if (perm.size() != reshape_dims.size()) {
    throw Error(fmt::format("iota transpose T({}) has {} entries but the reshape dims {} have {}", join_ints(perm, ","),
                            perm.size(), bracketed(reshape_dims), reshape_dims.size()));
  }
  std::vector<int64_t> sorted_perm = perm;
  std::sort(sorted_perm.begin(), sorted_perm.end());
  for (std::size_t i = 0; i < sorted_perm.size(); ++i) {
    if (sorted_perm[i] != static_cast<int64_t>(i)) {
      throw Error(
          fmt::format("iota transpose T({}) is not a permutation of 0..{}", join_ints(perm, ","), perm.size() - 1));
    }
  }
  for (int64_t d : reshape_dims) {
    if (d <= 0) throw Error("iota reshape dims must be positive, got " + bracketed(reshape_dims));
  }
  if (product(dims) != product(reshape_dims)) {
    throw Error(
        fmt::format("tile assignment dims {} hold {} devices but the iota reshape dims {} "
                    "hold {}",
                    bracketed(dims), product(dims), bracketed(reshape_dims), product(reshape_dims)));
  }
  bool changed = true;
  while (changed) {
    changed = false;
    for (std::size_t i = 0; i < reshape_dims.size(); ++i) {
      if (reshape_dims[i] == 1) {
        erase_reshape_dim(reshape_dims, perm, static_cast<int64_t>(i));
        changed = true;
        break;
      }
    }
    for (std::size_t k = 0; !changed && k + 1 < perm.size(); ++k) {
      if (perm[k + 1] == perm[k] + 1) {
        const int64_t major = perm[k];
        reshape_dims[static_cast<std::size_t>(major)] *= reshape_dims[static_cast<std::size_t>(major + 1)];
        erase_reshape_dim(reshape_dims, perm, major + 1);
        changed = true;
      }
    }
  }
  if (reshape_dims.empty()) {
    reshape_dims = {1};
    perm = {0};
  }
  IotaTileAssignment iota;
  iota.dims_ = std::move(dims);
  iota.reshape_dims_ = std::move(reshape_dims);
  iota.perm_ = std::move(perm);
  return iota;
}

int64_t IotaTileAssignment::num_elements() const { return product(dims_); }

std::vector<int64_t> IotaTileAssignment::to_devices() const {
  std::vector<int64_t> iota(static_cast<std::size_t>(num_elements()));
  std::iota(iota.begin(), iota.end(), int64_t{0});
  return transpose_array(iota, reshape_dims_, perm_);
}

std::string IotaTileAssignment::to_string() const {
  std::string out = bracketed(dims_) + "<=" + bracketed(reshape_dims_);
  if (reshape_dims_.size() > 1) out += "T(" + join_ints(perm_, ",") + ")";
  return out;
}

TileAssignment::TileAssignment(IotaTileAssignment iota) : dims_(iota.dims()), iota_(std::move(iota)) {}

TileAssignment::TileAssignment(std::vector<int64_t> dims, std::vector<int64_t> devices)
    : dims_(std::move(dims)), devices_(std::move(devices)) {
  if (static_cast<int64_t>(devices_.size()) != product(dims_)) {
    throw Error(fmt::format("tile assignment {} needs {} devices but {} are listed", bracketed(dims_), product(dims_),
                            devices_.size()));
  }
}

int64_t TileAssignment::num_elements() const { return product(dims_); }

std::vector<int64_t> TileAssignment::devices() const { return iota_ ? iota_->to_devices() : devices_; }

TileAssignment TileAssignment::reshape(std::vector<int64_t> new_dims) const {
  assert(product(new_dims) == num_elements() && "reshape must keep the element count");
  if (iota_) {
    return TileAssignment(IotaTileAssignment::create(std::move(new_dims), iota_->reshape_dims(), iota_->perm()));
  }
  return TileAssignment(std::move(new_dims), devices_);
}

// The transposed iota, or nullopt where XLA would fall back to an explicit
// array. Handles XLA's simple cases; the general prime-factor regrouping is
// not attempted, so such cases come out explicit.
static std::optional<IotaTileAssignment> transpose_iota(const IotaTileAssignment& iota,
                                                        const std::vector<int64_t>& perm) {
  const std::vector<int64_t>& dims = iota.dims();
  std::vector<int64_t> new_dims;
  for (int64_t p : perm) new_dims.push_back(dims[static_cast<std::size_t>(p)]);
  // Only size-1 dims move: the devices keep their order.
  std::vector<int64_t> non_trivial_order;
  for (int64_t p : perm) {
    if (dims[static_cast<std::size_t>(p)] != 1) non_trivial_order.push_back(p);
  }
  if (std::is_sorted(non_trivial_order.begin(), non_trivial_order.end())) {
    return IotaTileAssignment::create(new_dims, iota.reshape_dims(), iota.perm());
  }
  if (iota.reshape_dims().size() == 1) {
    return IotaTileAssignment::create(new_dims, dims, perm);
  }
  // Each non-trivial tile dim is exactly one reshape dim: permute those.
  std::vector<int64_t> non_trivial_dims;
  for (int64_t d : dims) {
    if (d != 1) non_trivial_dims.push_back(d);
  }
  if (non_trivial_dims.size() != iota.perm().size()) return std::nullopt;
  for (std::size_t k = 0; k < non_trivial_dims.size(); ++k) {
    if (non_trivial_dims[k] != iota.reshape_dims()[static_cast<std::size_t>(iota.perm()[k])]) {
      return std::nullopt;
    }
  }
  std::vector<int64_t> rank_among_non_trivial(dims.size(), -1);
  for (std::size_t d = 0, k = 0; d < dims.size(); ++d) {
    if (dims[d] != 1) rank_among_non_trivial[d] = static_cast<int64_t>(k++);
  }
  std::vector<int64_t> new_perm;
  for (int64_t p : perm) {
    const int64_t k = rank_among_non_trivial[static_cast<std::size_t>(p)];
    if (k >= 0) new_perm.push_back(iota.perm()[static_cast<std::size_t>(k)]);
  }
  return IotaTileAssignment::create(new_dims, iota.reshape_dims(), new_perm);
}

TileAssignment TileAssignment::transpose(const std::vector<int64_t>& perm) const {
  assert(perm.size() == dims_.size() && "transpose needs one entry per tile dim");
  if (iota_) {
    if (std::optional<IotaTileAssignment> result = transpose_iota(*iota_, perm)) {
      return TileAssignment(std::move(*result));
    }
  }
  std::vector<int64_t> new_dims;
  for (int64_t p : perm) new_dims.push_back(dims_[static_cast<std::size_t>(p)]);
  return TileAssignment(std::move(new_dims), transpose_array(devices(), dims_, perm));
}

std::string TileAssignment::to_string() const {
  if (iota_) return "devices=" + iota_->to_string();
  return "devices=" + bracketed(dims_) + join_ints(devices_, ",");
}

}  // namespace shardflow
