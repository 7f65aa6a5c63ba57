// Indexing ops: embedding, index_select, index_copy (functional), gather and
// scatter (scatter.src, scatter.value, scatter_add, scatter_reduce),
// and put_rows_into, index_copy's in-place form for memory a caller owns.
//
// Index tensors are i64 or i32. Every index is checked against the size it
// indexes before anything is read, and the error names the index and the
// size; no op here wraps negative indices (PyTorch's CPU kernels reject them
// too); put_rows_into does, as index_put_ does.
//
// Sharding rules list the result's dims first, in order, then the factors
// the result lacks. The dim embedding, index_select and gather read from is
// indexed: sharded, each device looks up the indices in its shard and gives
// zeros for the rest, and the partial results add up to the lookup (GSPMD
// partitions a gather from a sharded operand the same way). The dim
// index_copy writes is indexed too, in self and the result: sharded, each
// device writes the rows that fall in its shard and keeps the others, so a
// KV cache split over its positions is updated where it lies; the dim
// scatter writes is indexed the same way. Dims of gather's self longer than
// the index's are need-replication, as any index may read any of their rows;
// for scatter, every dim where index, src and self do not line up is,
// except that scatter_add sums over index and src (each pair adds once).
// Examples:
//   embedding f32[100,16], i64[4,8]:
//     ([l, k], [i, j])->([i, j, k]) {i=4, j=8, k=16, l=100} indexed={l}
//   index_select f32[8,16], dim 1, i64[4]:
//     ([i, k], [j])->([i, j]) {i=8, j=4, k=16} indexed={k}
//   index_copy f32[2,16,8,4], dim 1, i64[3], f32[2,3,8,4] (a KV-cache update):
//     ([i, j, k, l], [m], [i, m, k, l])->([i, j, k, l]) {i=2, j=16, k=8, l=4, m=3}
//     need_replication={m} indexed={j}
//   gather f32[4,10], dim 1, i64[4,3]:
//     ([i, k], [i, j])->([i, j]) {i=4, j=3, k=10} indexed={k}
//   scatter.src f32[4,10], dim 1, i64[4,3], f32[4,3]:
//     ([i, j], [i, k], [i, k])->([i, j]) {i=4, j=10, k=3} need_replication={k} indexed={j}
//   scatter_add f32[10], dim 0, i64[100], f32[100] (a histogram's counts):
//     ([i], [j], [j])->([i]) {i=10, j=100} reduction={j} indexed={i}
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "families.h"
#include "kernel_util.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"
#include "shardflow/ops/in_place.h"

namespace shardflow::ops {
namespace {

constexpr FactorKind kNeedReplication = FactorKind::kNeedReplication;

bool is_index_dtype(DType dtype) { return dtype == DType::kI64 || dtype == DType::kI32; }

// PyTorch prints sizes as "[4, 3]".
std::string sizes_text(std::span<const int64_t> sizes) { return "[" + join_ints(sizes, ", ") + "]"; }

// The values of an i64 or i32 index tensor.
std::vector<int64_t> index_values(const DenseTensor& index) {
  std::vector<int64_t> values(static_cast<std::size_t>(index.numel()));
  if (index.dtype() == DType::kI64) {
    std::copy_n(index.data_as<int64_t>(), index.numel(), values.begin());
  } else {
    std::copy_n(index.data_as<int32_t>(), index.numel(), values.begin());
  }
  return values;
}

// Checks all indices before any is used, so that kernels never read or write
// out of bounds; `message(index)` is the error.
template <class Message>
void check_indices(std::span<const int64_t> indices, int64_t size, Message message) {
  for (int64_t index : indices) {
    if (index < 0 || index >= size) throw Error(message(index));
  }
}

// index_select's (and so embedding's) message: PyTorch's, plus the index and size.
std::string out_of_range_in_self(int64_t index, int64_t dim, int64_t size) {
  return fmt::format(
      "index out of range in self: index {} is out of bounds for dimension {} with "
      "size {}",
      index, dim, size);
}

// A shape seen as [outer, size, inner] around `dim`; a scalar is [1, 1, 1].
struct Slab {
  int64_t outer = 1, size = 1, inner = 1;
};

Slab slab(const Shape& shape, int64_t dim) {
  Slab s;
  if (shape.empty()) return s;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const int64_t extent = shape[static_cast<std::size_t>(d)];
    if (d < dim) s.outer *= extent;
    if (d == dim) s.size = extent;
    if (d > dim) s.inner *= extent;
  }
  return s;
}

// The rows of select_rows, `row` bytes each. kRow is `row` when it is a
// small power of two known here (a fixed-size memcpy compiles to one move),
// else 0.
template <std::size_t kRow>
void gather_rows(const std::byte* src, Slab in_slab, std::span<const int64_t> indices, std::size_t row,
                 std::byte* dst) {
  const std::size_t size = kRow != 0 ? kRow : row;
  for (int64_t o = 0; o < in_slab.outer; ++o) {
    const std::byte* slab = src + static_cast<std::size_t>(o * in_slab.size) * size;
    for (int64_t k : indices) {
      std::memcpy(dst, slab + static_cast<std::size_t>(k) * size, size);
      dst += size;
    }
  }
}

// out[o, k, :] = in[o, indices[k], :]: the loop of index_select and embedding.
// Rows are contiguous, so they are copied as bytes whatever the dtype.
// Rows of 1, 2, 4 or 8 bytes (single elements: a gather along the last dim,
// as rotary embeddings' pair swap does) get a loop of plain moves: a memcpy
// call per element cost more than the rest of the op.
DenseTensor select_rows(const DenseTensor& in, Slab in_slab, std::span<const int64_t> indices,
                        const TensorType& out_type) {
  DenseTensor out = DenseTensor::empty(out_type.dtype, out_type.shape);
  const std::size_t row = static_cast<std::size_t>(in_slab.inner) * element_size(in.dtype());
  const std::byte* src = in.data();
  std::byte* dst = out.data();
  switch (row) {
    case 1:
      gather_rows<1>(src, in_slab, indices, row, dst);
      break;
    case 2:
      gather_rows<2>(src, in_slab, indices, row, dst);
      break;
    case 4:
      gather_rows<4>(src, in_slab, indices, row, dst);
      break;
    case 8:
      gather_rows<8>(src, in_slab, indices, row, dst);
      break;
    default:
      gather_rows<0>(src, in_slab, indices, row, dst);
      break;
  }
  return out;
}

// select_rows on a shard of the indexed dim that starts at global row
// `window.begin`: indices inside it pick its rows, the others give zeros.
// `in_slab.size` is the shard's padded size; rows past the dim's global end
// are padding and never read.
DenseTensor select_rows_in_window(const DenseTensor& in, Slab in_slab, std::span<const int64_t> indices,
                                  const IndexWindow& window, const TensorType& out_type) {
  DenseTensor out = DenseTensor::zeros(out_type.dtype, out_type.shape);
  const int64_t rows = std::clamp<int64_t>(window.global_size - window.begin, 0, in_slab.size);
  const std::size_t row = static_cast<std::size_t>(in_slab.inner) * element_size(in.dtype());
  const std::byte* src = in.data();
  std::byte* dst = out.data();
  for (int64_t o = 0; o < in_slab.outer; ++o) {
    const std::byte* slab = src + static_cast<std::size_t>(o * in_slab.size) * row;
    for (int64_t k : indices) {
      const int64_t local = k - window.begin;
      if (local >= 0 && local < rows) std::memcpy(dst, slab + static_cast<std::size_t>(local) * row, row);
      dst += row;
    }
  }
  return out;
}

// ---------------------------------------------------------------- embedding

TensorType embedding_type(std::span<const TensorType> in) {
  const TensorType& weight = in[0];
  const TensorType& indices = in[1];
  if (weight.rank() != 2) throw Error("'weight' must be 2-D");
  if (!is_index_dtype(indices.dtype)) {
    throw Error(
        fmt::format("Expected tensor for argument #1 'indices' to have one of the following "
                    "scalar types: Long, Int; but got torch.{}Tensor instead (while "
                    "checking arguments for embedding)",
                    scalar_type_name(indices.dtype)));
  }
  Shape shape = indices.shape;
  shape.push_back(weight.shape[1]);
  return {weight.dtype, shape};
}

void register_embedding(OpRegistry& r) {
  OpDef def;
  def.family = OpFamily::kIndexing;
  def.infer = [](const OpArgs&, std::span<const TensorType> in) { return std::vector<TensorType>{embedding_type(in)}; };
  def.sharding_rule = [](const OpArgs&, std::span<const TensorType> in, std::span<const TensorType> out) {
    RuleBuilder b(in, out);
    const int batch = static_cast<int>(in[1].rank());
    for (int d = 0; d < batch; ++d) b.add_factor({-1, d}, {d}, in[1].shape[static_cast<std::size_t>(d)]);
    b.add_factor({1, -1}, {batch}, in[0].shape[1]);                     // D: each row is copied whole
    b.add_factor({0, -1}, {-1}, in[0].shape[0], FactorKind::kIndexed);  // V: looked up
    return b.build();
  };
  // padding_idx, scale_grad_by_freq and sparse only change the gradient.
  def.kernel = [](const OpArgs&, std::span<const DenseTensor> in) {
    const TensorType out_type = embedding_type(types_of(in));
    const std::vector<int64_t> indices = index_values(in[1]);
    const int64_t vocabulary = in[0].shape()[0];
    check_indices(indices, vocabulary, [&](int64_t i) { return out_of_range_in_self(i, 0, vocabulary); });
    const Slab rows{1, vocabulary, in[0].shape()[1]};
    return std::vector<DenseTensor>{select_rows(in[0], rows, indices, out_type)};
  };
  def.windowed_kernel = [](const OpArgs&, std::span<const DenseTensor> in, const IndexWindow& window) {
    const TensorType out_type = embedding_type(types_of(in));
    const std::vector<int64_t> indices = index_values(in[1]);
    const int64_t vocabulary = window.global_size;
    check_indices(indices, vocabulary, [&](int64_t i) { return out_of_range_in_self(i, 0, vocabulary); });
    const Slab rows{1, in[0].shape()[0], in[0].shape()[1]};
    return std::vector<DenseTensor>{select_rows_in_window(in[0], rows, indices, window, out_type)};
  };
  r.add(
      "aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, "
      "bool scale_grad_by_freq=False, bool sparse=False) -> Tensor",
      std::move(def));
}

// ------------------------------------------------------------- index_select

TensorType index_select_type(const OpArgs& args, std::span<const TensorType> in) {
  const TensorType& self = in[0];
  const TensorType& index = in[1];
  const int64_t dim = wrap_dim(args.get_int("dim"), self.rank());
  if (index.rank() > 1) throw Error("index_select(): Index is supposed to be a vector");
  if (!is_index_dtype(index.dtype)) throw Error("index_select(): Expected dtype int32 or int64 for index");
  const int64_t count = numel(index.shape);
  if (self.rank() == 0) {
    if (count != 1) {
      throw Error(fmt::format("index_select(): Index to scalar can have only 1 value, got {} value(s)", count));
    }
    return {self.dtype, {}};
  }
  Shape shape = self.shape;
  shape[static_cast<std::size_t>(dim)] = count;  // a 0-d index keeps the dim, with size 1
  return {self.dtype, shape};
}

void register_index_select(OpRegistry& r) {
  OpDef def;
  def.family = OpFamily::kIndexing;
  def.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    return std::vector<TensorType>{index_select_type(args, in)};
  };
  def.sharding_rule = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    RuleBuilder b(in, out);
    const TensorType& self = in[0];
    if (self.rank() > 0) {
      const auto dim = static_cast<int>(wrap_dim(args.get_int("dim"), self.rank()));
      for (int d = 0; d < static_cast<int>(self.rank()); ++d) {
        const int64_t extent = out[0].shape[static_cast<std::size_t>(d)];
        if (d == dim) {
          b.add_factor({-1, in[1].rank() == 1 ? 0 : -1}, {d}, extent);
        } else {
          b.add_factor({d, -1}, {d}, extent);
        }
      }
      b.add_operand_only(0, dim, FactorKind::kIndexed);
    }
    return b.build();
  };
  def.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    const TensorType out_type = index_select_type(args, types_of(in));
    const DenseTensor& self = in[0];
    const int64_t dim = wrap_dim(args.get_int("dim"), self.rank());
    const Slab rows = slab(self.shape(), dim);
    const std::vector<int64_t> indices = index_values(in[1]);
    check_indices(indices, rows.size, [&](int64_t i) { return out_of_range_in_self(i, dim, rows.size); });
    return std::vector<DenseTensor>{select_rows(self, rows, indices, out_type)};
  };
  def.windowed_kernel = [](const OpArgs& args, std::span<const DenseTensor> in, const IndexWindow& window) {
    const TensorType out_type = index_select_type(args, types_of(in));
    const DenseTensor& self = in[0];
    const int64_t dim = wrap_dim(args.get_int("dim"), self.rank());
    const std::vector<int64_t> indices = index_values(in[1]);
    check_indices(indices, window.global_size,
                  [&](int64_t i) { return out_of_range_in_self(i, dim, window.global_size); });
    return std::vector<DenseTensor>{select_rows_in_window(self, slab(self.shape(), dim), indices, window, out_type)};
  };
  r.add("aten::index_select(Tensor self, int dim, Tensor index) -> Tensor", std::move(def));
}

// --------------------------------------------------------------- index_copy

// PyTorch's checks of index_copy_, in its order; the result is self's type.
TensorType index_copy_type(int64_t dim_arg, std::span<const TensorType> in) {
  const TensorType& self = in[0];
  const TensorType& index = in[1];
  const TensorType& source = in[2];
  const int64_t dim = wrap_dim(dim_arg, self.rank());
  if (index.rank() > 1) {
    throw Error(fmt::format("index_copy_(): Index should have dimension 1 or 0 (got {})", index.rank()));
  }
  const int64_t count = numel(index.shape);
  if (source.rank() == 0 && count != 1) {
    throw Error(
        fmt::format("index_copy_(): When source is scalar, index should have one element "
                    "(got {})",
                    count));
  }
  if (source.rank() != self.rank() && source.rank() != 0 && self.rank() != 0) {
    throw Error(
        fmt::format("index_copy_(): When source and destination are not scalars, their "
                    "dimensionality must match. Source dimensionality ({}), destination "
                    "dimensionality ({})",
                    source.rank(), self.rank()));
  }
  if (!is_index_dtype(index.dtype)) {
    throw Error(fmt::format("index_copy_(): Expected dtype int32 or int64 for index, but got {}",
                            scalar_type_name(index.dtype)));
  }
  if (self.dtype != source.dtype) {
    throw Error(
        fmt::format("index_copy_(): self and source expected to have the same dtype, but got "
                    "(self) {} and (source) {}",
                    scalar_type_name(self.dtype), scalar_type_name(source.dtype)));
  }
  Shape self_slice = self.shape;
  Shape source_slice = source.shape;
  if (!self_slice.empty()) self_slice.erase(self_slice.begin() + dim);
  if (!source_slice.empty()) source_slice.erase(source_slice.begin() + dim);
  if (self_slice != source_slice) {
    throw Error(
        fmt::format("index_copy_(): Source/destination tensor must have same slice shapes. "
                    "Destination slice shape: {} at dimension {} and source slice shape: {} "
                    "at dimension 0.",
                    sizes_text(self_slice), dim, sizes_text(source_slice)));
  }
  if (source.rank() > 0 && count != source.shape[static_cast<std::size_t>(dim)]) {
    throw Error(
        fmt::format("index_copy_(): Number of indices ({}) should be equal to "
                    "source.size(dim) ({})",
                    count, source.shape[static_cast<std::size_t>(dim)]));
  }
  return self;
}

// out[o, indices[k] - window.begin, :] = src[o, k, :] for the indices inside
// the window of the dim `rows` spans (the whole dim: begin 0); the others are
// another shard's. Rows past the dim's global end are the last shard's
// padding. k ascends, so the last duplicate wins.
void write_rows_in_window(std::byte* out, Slab rows, std::size_t row_bytes, std::span<const int64_t> indices,
                          const IndexWindow& window, const std::byte* src) {
  const int64_t held = std::clamp<int64_t>(window.global_size - window.begin, 0, rows.size);
  const auto count = static_cast<int64_t>(indices.size());
  for (int64_t k = 0; k < count; ++k) {
    const int64_t local = indices[static_cast<std::size_t>(k)] - window.begin;
    if (local < 0 || local >= held) continue;
    for (int64_t o = 0; o < rows.outer; ++o) {
      std::memcpy(out + static_cast<std::size_t>(o * rows.size + local) * row_bytes,
                  src + static_cast<std::size_t>(o * count + k) * row_bytes, row_bytes);
    }
  }
}

// index_copy into the shard of self's written dim that starts at global row
// window.begin (the whole dim: begin 0); every index is checked against the
// dim's global size.
DenseTensor copy_rows_in_window(const OpArgs& args, std::span<const DenseTensor> in, const IndexWindow& window) {
  const TensorType out_type = index_copy_type(args.get_int("dim"), types_of(in));
  const DenseTensor& self = in[0];
  const int64_t dim = wrap_dim(args.get_int("dim"), self.rank());
  const std::vector<int64_t> indices = index_values(in[1]);
  check_indices(indices, window.global_size, [&](int64_t i) {
    return fmt::format("index_copy_(): index {} is out of bounds for dimension {} with size {}", i, dim,
                       window.global_size);
  });
  // Functional: a copy of self with the rows replaced; written into self's
  // buffer when nothing else holds it (a donated cache at its last use).
  DenseTensor out;
  if (self.is_sole_owner()) {
    out = self;
  } else {
    out = DenseTensor::empty(out_type.dtype, out_type.shape);
    std::memcpy(out.data(), self.data(), self.nbytes());
  }
  const Slab rows = slab(self.shape(), dim);
  write_rows_in_window(out.data(), rows, static_cast<std::size_t>(rows.inner) * element_size(self.dtype()), indices,
                       window, in[2].data());
  return out;
}

void register_index_copy(OpRegistry& r) {
  OpDef def;
  def.family = OpFamily::kIndexing;
  def.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    return std::vector<TensorType>{index_copy_type(args.get_int("dim"), in)};
  };
  def.sharding_rule = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    RuleBuilder b(in, out);
    const TensorType& self = in[0];
    const TensorType& source = in[2];
    const auto dim = static_cast<int>(wrap_dim(args.get_int("dim"), self.rank()));
    for (int d = 0; d < static_cast<int>(self.rank()); ++d) {
      const int64_t extent = self.shape[static_cast<std::size_t>(d)];
      if (d == dim) {
        b.add_factor({d, -1, -1}, {d}, extent, FactorKind::kIndexed);  // rows written at the index values
      } else {
        b.add_factor({d, -1, source.rank() > 0 ? d : -1}, {d}, extent);
      }
    }
    // The rows of source follow the index, whose values say where they go.
    const int index_dim = in[1].rank() == 1 ? 0 : -1;
    const int source_dim = source.rank() > 0 ? dim : -1;
    if (index_dim >= 0 || source_dim >= 0) {
      b.add_factor({-1, index_dim, source_dim}, {-1}, numel(in[1].shape), kNeedReplication);
    }
    return b.build();
  };
  def.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    const int64_t dim = wrap_dim(args.get_int("dim"), in[0].rank());
    return std::vector<DenseTensor>{copy_rows_in_window(args, in, IndexWindow{0, slab(in[0].shape(), dim).size})};
  };
  def.windowed_kernel = [](const OpArgs& args, std::span<const DenseTensor> in, const IndexWindow& window) {
    return std::vector<DenseTensor>{copy_rows_in_window(args, in, window)};
  };
  r.add("aten::index_copy(Tensor self, int dim, Tensor index, Tensor source) -> Tensor", std::move(def));
}

// ------------------------------------------------------------------- gather

// gather treats a scalar as a 1-D tensor of size 1.
int64_t nonempty_size(const TensorType& type, int64_t dim) {
  return type.rank() == 0 ? 1 : type.shape[static_cast<std::size_t>(dim)];
}

TensorType gather_type(const OpArgs& args, std::span<const TensorType> in) {
  const TensorType& self = in[0];
  const TensorType& index = in[1];
  const int64_t dim = wrap_dim(args.get_int("dim"), self.rank());
  if (!is_index_dtype(index.dtype)) throw Error("gather(): Expected dtype int32 or int64 for index");
  // PyTorch skips the shape checks for an empty index.
  if (numel(index.shape) != 0) {
    const int64_t rank = std::max<int64_t>(self.rank(), 1);
    if (rank != std::max<int64_t>(index.rank(), 1)) {
      throw Error("Index tensor must have the same number of dimensions as input tensor");
    }
    for (int64_t d = 0; d < rank; ++d) {
      if (d != dim && nonempty_size(index, d) > nonempty_size(self, d)) {
        throw Error(
            fmt::format("Size does not match at dimension {} expected index {} to be smaller "
                        "than self {} apart for dimension {}",
                        d, sizes_text(index.shape), sizes_text(self.shape), dim));
      }
    }
  }
  return {self.dtype, index.shape};
}

// gather from the shard of self's gathered dim that starts at global index
// window.begin (the whole dim: begin 0): indices inside it read it, the
// others give zeros; every index is checked against the dim's global size.
DenseTensor gather_in_window(const OpArgs& args, std::span<const DenseTensor> in, const IndexWindow& window) {
  const TensorType out_type = gather_type(args, types_of(in));
  DenseTensor out = DenseTensor::zeros(out_type.dtype, out_type.shape);
  if (out.numel() == 0) return out;
  const DenseTensor& self = in[0];
  const auto dim = static_cast<std::size_t>(wrap_dim(args.get_int("dim"), self.rank()));
  const Shape self_shape = self.rank() == 0 ? Shape{1} : self.shape();
  const Shape index_shape = in[1].rank() == 0 ? Shape{1} : in[1].shape();
  const Dims self_strides = row_major_strides(self_shape);
  const std::vector<int64_t> indices = index_values(in[1]);
  const int64_t bound = window.global_size;
  check_indices(indices, bound, [&](int64_t i) {
    return fmt::format("index {} is out of bounds for dimension {} with size {}", i, dim, bound);
  });
  const int64_t rows = std::clamp<int64_t>(bound - window.begin, 0, self_shape[dim]);
  visit_dtype(self.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = self.data_as<T>();
    T* dst = out.data_as<T>();
    std::vector<int64_t> position(index_shape.size(), 0);
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const int64_t local = indices[i] - window.begin;
      if (local >= 0 && local < rows) {
        int64_t offset = 0;
        for (std::size_t d = 0; d < position.size(); ++d) offset += (d == dim ? local : position[d]) * self_strides[d];
        dst[i] = src[offset];
      }
      for (std::size_t d = position.size(); d-- > 0;) {
        if (++position[d] < index_shape[d]) break;
        position[d] = 0;
      }
    }
  });
  return out;
}

void register_gather(OpRegistry& r) {
  OpDef def;
  def.family = OpFamily::kIndexing;
  def.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    return std::vector<TensorType>{gather_type(args, in)};
  };
  def.sharding_rule = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    RuleBuilder b(in, out);
    const TensorType& self = in[0];
    const TensorType& index = in[1];
    const auto dim = static_cast<int>(wrap_dim(args.get_int("dim"), self.rank()));
    // A dim of self is shared when it lines up with the index's, element for
    // element; the gathered dim, or a longer self dim, needs all of self's.
    const auto shared = [&](int d) {
      return self.rank() == index.rank() && d != dim &&
             self.shape[static_cast<std::size_t>(d)] == index.shape[static_cast<std::size_t>(d)];
    };
    for (int d = 0; d < static_cast<int>(index.rank()); ++d) {
      b.add_factor({shared(d) ? d : -1, d}, {d}, index.shape[static_cast<std::size_t>(d)]);
    }
    for (int d = 0; d < static_cast<int>(self.rank()); ++d) {
      if (!shared(d)) b.add_operand_only(0, d, d == dim ? FactorKind::kIndexed : kNeedReplication);
    }
    return b.build();
  };
  def.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    const auto dim = static_cast<std::size_t>(wrap_dim(args.get_int("dim"), in[0].rank()));
    const IndexWindow whole{0, in[0].rank() == 0 ? 1 : in[0].shape()[dim]};
    return std::vector<DenseTensor>{gather_in_window(args, in, whole)};
  };
  def.windowed_kernel = [](const OpArgs& args, std::span<const DenseTensor> in, const IndexWindow& window) {
    return std::vector<DenseTensor>{gather_in_window(args, in, window)};
  };
  r.add("aten::gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor", std::move(def));
}

// ------------------------------------------------------------------ scatter

// scatter.src, scatter.value, scatter_add and scatter_reduce: a copy of self
// where, for each position p of index, the element at p with dim replaced by
// index[p] is set to src[p] or the value (scatter_add: increased by src[p];
// scatter_reduce: combined with it by sum, prod, mean, amax or amin, from
// self's value or, without include_self, from the reduction's identity).
enum class ScatterKind { kSource, kValue, kAdd, kReduce };

void check_scatter(const OpArgs& args, std::span<const TensorType> in, ScatterKind kind) {
  const TensorType& self = in[0];
  const TensorType& index = in[1];
  const int64_t dim = wrap_dim(args.get_int("dim"), self.rank());
  if (!is_index_dtype(index.dtype)) throw Error("scatter(): Expected dtype int32/int64 for index");
  const TensorType* src = kind == ScatterKind::kValue ? nullptr : &in[2];
  if (src != nullptr && src->dtype != self.dtype) {
    throw Error("scatter(): Expected self.dtype to be equal to src.dtype");
  }
  if (numel(index.shape) == 0) return;  // PyTorch skips the shape checks for an empty index
  const int64_t rank = std::max<int64_t>(self.rank(), 1);
  if (std::max<int64_t>(index.rank(), 1) != rank) {
    throw Error("Index tensor must have the same number of dimensions as self tensor");
  }
  if (src != nullptr && std::max<int64_t>(src->rank(), 1) != rank) {
    throw Error("Index tensor must have the same number of dimensions as src tensor");
  }
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t size = nonempty_size(index, d);
    if ((d != dim && size > nonempty_size(self, d)) || (src != nullptr && size > nonempty_size(*src, d))) {
      throw Error(fmt::format("Expected index {} to be no larger than self {} apart from dimension {}{}",
                              sizes_text(index.shape), sizes_text(self.shape), dim,
                              src == nullptr ? "" : " and to be no larger size than src " + sizes_text(src->shape)));
    }
  }
}

// scatter_reduce's reduction, and its identity (what a position that
// leaves self out starts from).
enum class ScatterReduction { kSum, kProd, kMean, kMax, kMin };

ScatterReduction read_scatter_reduction(const OpArgs& args) {
  const std::string& name = args.get_string("reduce");
  if (name == "sum") return ScatterReduction::kSum;
  if (name == "prod") return ScatterReduction::kProd;
  if (name == "mean") return ScatterReduction::kMean;
  if (name == "amax" || name == "max") return ScatterReduction::kMax;  // PyTorch takes "max" too
  if (name == "amin" || name == "min") return ScatterReduction::kMin;
  throw Error(fmt::format("reduce argument must be either sum, prod, mean, amax or amin, got {}", name));
}

template <class C>
C scatter_identity(ScatterReduction reduction) {
  switch (reduction) {
    case ScatterReduction::kProd:
      return C{1};
    case ScatterReduction::kMax:
      return std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                  : std::numeric_limits<C>::lowest();
    case ScatterReduction::kMin:
      return std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity() : std::numeric_limits<C>::max();
    default:
      return C{0};
  }
}

// NaN wins amax and amin, as in PyTorch.
template <class C>
C scatter_combine(ScatterReduction reduction, C a, C b) {
  switch (reduction) {
    case ScatterReduction::kProd:
      return static_cast<C>(a * b);
    case ScatterReduction::kMax:
      return (is_nan(a) || a > b) ? a : b;
    case ScatterReduction::kMin:
      return (is_nan(a) || a < b) ? a : b;
    default:
      return static_cast<C>(a + b);
  }
}

// Calls visit(at, from) for each position of index, in row-major order,
// whose value falls in the shard of self's dim that starts at global index
// `begin` and holds `rows` rows: `at` is the element of the local self it
// names, `from` the element of src (strides `src_strides`) at the position.
template <class Visit>
void for_each_scattered(std::span<const int64_t> indices, const Shape& index_shape, const Dims& self_strides,
                        const Dims& src_strides, std::size_t dim, int64_t begin, int64_t rows, Visit visit) {
  std::vector<int64_t> position(index_shape.size(), 0);
  for (const int64_t index : indices) {
    const int64_t local = index - begin;
    if (local >= 0 && local < rows) {
      int64_t at = 0, from = 0;
      for (std::size_t d = 0; d < position.size(); ++d) {
        at += (d == dim ? local : position[d]) * self_strides[d];
        if (!src_strides.empty()) from += position[d] * src_strides[d];
      }
      visit(at, from);
    }
    for (std::size_t d = position.size(); d-- > 0;) {
      if (++position[d] < index_shape[d]) break;
      position[d] = 0;
    }
  }
}

// scatter into the shard of self's dim that starts at global index
// window.begin (the whole dim: begin 0): positions whose index falls inside
// it are written, the others are another shard's. Positions go in row-major
// order, so the last of duplicate indices wins (as PyTorch's CPU kernel).
DenseTensor scatter_in_window(const OpArgs& args, std::span<const DenseTensor> in, const IndexWindow& window,
                              ScatterKind kind) {
  check_scatter(args, types_of(in), kind);
  const DenseTensor& self = in[0];
  DenseTensor out;
  if (self.is_sole_owner()) {
    out = self;
  } else {
    out = DenseTensor::empty(self.dtype(), self.shape());
    std::memcpy(out.data(), self.data(), self.nbytes());
  }
  const std::vector<int64_t> indices = index_values(in[1]);
  const auto dim = static_cast<std::size_t>(wrap_dim(args.get_int("dim"), self.rank()));
  const int64_t bound = window.global_size;
  check_indices(indices, bound, [&](int64_t i) {
    return fmt::format("index {} is out of bounds for dimension {} with size {}", i, dim, bound);
  });
  if (indices.empty()) return out;
  const Shape self_shape = self.rank() == 0 ? Shape{1} : self.shape();
  const Shape index_shape = in[1].rank() == 0 ? Shape{1} : in[1].shape();
  const Dims self_strides = row_major_strides(self_shape);
  const Dims src_strides =
      kind == ScatterKind::kValue ? Dims{} : row_major_strides(in[2].rank() == 0 ? Shape{1} : in[2].shape());
  const int64_t rows = std::clamp<int64_t>(bound - window.begin, 0, self_shape[dim]);
  const auto each = [&](auto visit) {
    for_each_scattered(indices, index_shape, self_strides, src_strides, dim, window.begin, rows, visit);
  };
  visit_dtype(self.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    T* dst = out.data_as<T>();
    const T* src = kind == ScatterKind::kValue ? nullptr : in[2].data_as<T>();
    switch (kind) {
      case ScatterKind::kSource:
        each([&](int64_t at, int64_t from) { dst[at] = src[from]; });
        break;
      case ScatterKind::kValue: {
        const T value = store<T>(args.get_number("value"));
        each([&](int64_t at, int64_t) { dst[at] = value; });
        break;
      }
      case ScatterKind::kAdd:
        each([&](int64_t at, int64_t from) { dst[at] = store<T>(load(dst[at]) + load(src[from])); });
        break;
      case ScatterKind::kReduce: {
        const ScatterReduction reduction = read_scatter_reduction(args);
        const bool include_self = args.get_bool("include_self");
        if (!include_self) {
          each([&](int64_t at, int64_t) { dst[at] = store<T>(scatter_identity<C>(reduction)); });
        }
        std::vector<int64_t> count(reduction == ScatterReduction::kMean ? static_cast<std::size_t>(out.numel()) : 0);
        each([&](int64_t at, int64_t from) {
          dst[at] = store<T>(scatter_combine(reduction, load(dst[at]), load(src[from])));
          if (!count.empty()) ++count[static_cast<std::size_t>(at)];
        });
        // A mean divides what reached each position by how many did (self
        // included); integers round down, as in PyTorch.
        for (std::size_t at = 0; at < count.size(); ++at) {
          if (count[at] == 0) continue;
          const auto total = static_cast<C>(count[at] + (include_self ? 1 : 0));
          const C sum = load(dst[at]);
          C mean = static_cast<C>(sum / total);
          if constexpr (std::is_integral_v<C>) mean = floored_from_truncated(mean, sum, total);
          dst[at] = store<T>(mean);
        }
        break;
      }
    }
  });
  return out;
}

void add_scatter(OpRegistry& r, std::string_view schema, ScatterKind kind) {
  OpDef def;
  def.family = OpFamily::kIndexing;
  if (kind == ScatterKind::kAdd) def.addend_arg = "self";
  def.infer = [kind](const OpArgs& args, std::span<const TensorType> in) {
    check_scatter(args, in, kind);
    return std::vector<TensorType>{in[0]};
  };
  def.sharding_rule = [kind](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    RuleBuilder b(in, out);
    const TensorType& self = in[0];
    const TensorType& index = in[1];
    const bool has_src = kind != ScatterKind::kValue;
    const auto dim = static_cast<int>(wrap_dim(args.get_int("dim"), self.rank()));
    // A dim other than `dim` is shared when index (and src) line up with
    // self element for element; otherwise, or along `dim`, any position of
    // index may land anywhere, so index and src are needed whole.
    const auto shared = [&](int d) {
      const auto at = static_cast<std::size_t>(d);
      return self.rank() == index.rank() && d != dim && self.shape[at] == index.shape[at] &&
             (!has_src || (in[2].rank() == index.rank() && in[2].shape[at] == index.shape[at]));
    };
    for (int d = 0; d < static_cast<int>(self.rank()); ++d) {
      const int64_t extent = self.shape[static_cast<std::size_t>(d)];
      if (d == dim) {
        b.add_factor(has_src ? std::vector<int>{d, -1, -1} : std::vector<int>{d, -1}, {d}, extent,
                     FactorKind::kIndexed);  // written where the index values say
      } else if (shared(d)) {
        b.add_factor(has_src ? std::vector<int>{d, d, d} : std::vector<int>{d, d}, {d}, extent);
      } else {
        b.add_factor(has_src ? std::vector<int>{d, -1, -1} : std::vector<int>{d, -1}, {d}, extent, kNeedReplication);
      }
    }
    // The rest of index and src: one factor where src lines up with index.
    // scatter_add adds every (index, src) pair into the result: split over
    // them, each device's result is a partial sum, and self (the addend) is
    // counted on one device of the group.
    const auto src_matches = [&](int d) {
      const auto at = static_cast<std::size_t>(d);
      return has_src && in[2].rank() == index.rank() && in[2].shape[at] == index.shape[at];
    };
    const FactorKind pairs = kind == ScatterKind::kAdd ? FactorKind::kReduction : kNeedReplication;
    for (int d = 0; d < static_cast<int>(index.rank()); ++d) {
      if (shared(d)) continue;
      if (src_matches(d)) {
        b.add_factor({-1, d, d}, {-1}, index.shape[static_cast<std::size_t>(d)], pairs);
      } else {
        b.add_operand_only(1, d, kNeedReplication);
      }
    }
    for (int d = 0; has_src && d < static_cast<int>(in[2].rank()); ++d) {
      if (!shared(d) && !src_matches(d)) b.add_operand_only(2, d, kNeedReplication);
    }
    return b.build();
  };
  def.kernel = [kind](const OpArgs& args, std::span<const DenseTensor> in) {
    const auto dim = static_cast<std::size_t>(wrap_dim(args.get_int("dim"), in[0].rank()));
    const IndexWindow whole{0, in[0].rank() == 0 ? 1 : in[0].shape()[dim]};
    return std::vector<DenseTensor>{scatter_in_window(args, in, whole, kind)};
  };
  def.windowed_kernel = [kind](const OpArgs& args, std::span<const DenseTensor> in, const IndexWindow& window) {
    return std::vector<DenseTensor>{scatter_in_window(args, in, window, kind)};
  };
  r.add(schema, std::move(def));
}

void register_scatter(OpRegistry& r) {
  add_scatter(r, "aten::scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor", ScatterKind::kSource);
  add_scatter(r, "aten::scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor",
              ScatterKind::kValue);
  add_scatter(r, "aten::scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor", ScatterKind::kAdd);
  add_scatter(r,
              "aten::scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, "
              "bool include_self=True) -> Tensor",
              ScatterKind::kReduce);
}

}  // namespace

void put_rows_into(DenseTensor& self, int64_t dim, const DenseTensor& index, const DenseTensor& source) {
  Shape source_shape = source.shape();
  if (source_shape.size() < self.shape().size()) {  // index_put_ broadcasts leading 1s: the same bytes
    source_shape.insert(source_shape.begin(), self.shape().size() - source_shape.size(), 1);
  }
  const TensorType types[] = {
      {self.dtype(), self.shape()}, {index.dtype(), index.shape()}, {source.dtype(), source_shape}};
  index_copy_type(dim, types);  // index_copy_'s checks and messages
  dim = wrap_dim(dim, self.rank());
  const Slab rows = slab(self.shape(), dim);
  std::vector<int64_t> indices = index_values(index);
  for (int64_t& i : indices) {
    if (i < -rows.size || i >= rows.size) {
      throw Error(fmt::format("index {} is out of bounds for dimension {} with size {}", i, dim, rows.size));
    }
    if (i < 0) i += rows.size;  // index_put_ counts negative indices from the end
  }
  write_rows_in_window(self.data(), rows, static_cast<std::size_t>(rows.inner) * element_size(self.dtype()), indices,
                       IndexWindow{0, rows.size}, source.data());
}

void register_index_ops(OpRegistry& registry) {
  register_embedding(registry);
  register_gather(registry);
  register_index_copy(registry);
  register_index_select(registry);
  register_scatter(registry);
}

}  // namespace shardflow::ops
