// Shape (movement) ops: reshape, view, flatten, squeeze, unsqueeze, permute,
// transpose, expand, slice, select, cat and stack.
//
// Tensors are dense and row-major, so what PyTorch makes a view is here the
// same buffer under a new shape when the bytes, in order, are unchanged, and a
// copy otherwise.
//
// Sharding rules (factors are pass-through unless listed), one example each:
//   reshape f32[8] -> [2,4]       ([ij])->([i, j]) {i=2, j=4}
//   reshape f32[2,4] -> [8]       ([i, j])->([ij]) {i=2, j=4}
//   reshape f32[2,3] -> [3,2]     ([i, j])->([k, l]) {i=2, j=3, k=3, l=2}
//                                 need_replication={i, j}
//   permute f32[2,3,4] [2,0,1]    ([i, j, k])->([k, i, j]) {i=2, j=3, k=4}
//   unsqueeze f32[2,3] dim 1      ([i, k])->([i, j, k]) {i=2, j=1, k=3}
//   squeeze f32[2,1,3]            ([i, j, k])->([i, k]) {i=2, j=1, k=3}
//   expand f32[3,1] -> [2,3,4]    ([j, k])->([i, j, l]) {i=2, j=3, k=1, l=4}
//   slice f32[8,6] dim 1, 0:4     ([i, j])->([i, k]) {i=8, j=6, k=4} need_replication={j}
//   select f32[8,6] dim 0         ([i, j])->([j]) {i=8, j=6} need_replication={i}
//   cat f32[2,3], f32[2,5] dim 1  ([i, j], [i, k])->([i, l]) {i=2, j=3, k=5, l=8}
//                                 need_replication={j, k}
//   stack 2 x f32[2,3] dim 0      ([j, k], [j, k])->([i, j, k]) {i=2, j=2, k=3}
// Factors are numbered in dim order (operand before result where a dim gets
// one of each).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "families.h"
#include "kernel_util.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"

namespace shardflow::ops {
namespace {

// ---------------------------------------------------------------- helpers

// Sizes as PyTorch prints them in messages: "[2, 5]".
std::string sizes_text(std::span<const int64_t> sizes) { return "[" + join_ints(sizes, ", ") + "]"; }

std::size_t to_index(int64_t value) { return static_cast<std::size_t>(value); }

// The tensor input bound to argument `name`. It need not be input 0: an int[]
// argument given as a small int tensor is bound as a constant but stays a
// tensor input of the call.
template <class T>
const T& input(const OpArgs& args, std::span<const T> in, std::string_view name = "self") {
  return in[to_index(args.tensor(name))];
}

// Per tensor input, the dim a factor is on: `dim` on each of `operands`
// (input indices), -1 (absent) on the other inputs.
std::vector<int> dims_on(std::size_t inputs, std::span<const int> operands, int64_t dim) {
  std::vector<int> dims(inputs, -1);
  for (int t : operands) dims[to_index(t)] = static_cast<int>(dim);
  return dims;
}

// One strided row: n elements of kSize bytes, `step` elements apart in src
// (0 repeats one element). A fixed-size memcpy compiles to a plain move.
template <std::size_t kSize>
void gather_row(const std::byte* src, int64_t step, int64_t n, std::byte* dst) {
  const auto stride = static_cast<std::ptrdiff_t>(step) * static_cast<std::ptrdiff_t>(kSize);
  for (int64_t i = 0; i < n; ++i, src += stride, dst += kSize) std::memcpy(dst, src, kSize);
}

// A strided view of a source tensor: element (i0, ..., in) of `shape` is
// source element offset + sum(ik * strides[k]); strides may be 0 (expand).
struct StridedView {
  int64_t offset = 0;
  Shape shape;
  Dims strides;
};

// Drops size-1 dims and merges neighbours that are also neighbours in the
// source (stride[k] == stride[k+1] * shape[k+1]), so that loops run over as
// few and as long rows as possible.
StridedView simplified(const StridedView& view) {
  StridedView out{view.offset, {}, {}};
  for (std::size_t k = 0; k < view.shape.size(); ++k) {
    if (view.shape[k] == 1) continue;
    if (!out.shape.empty() && out.strides.back() == view.strides[k] * view.shape[k]) {
      out.shape.back() *= view.shape[k];
      out.strides.back() = view.strides[k];
    } else {
      out.shape.push_back(view.shape[k]);
      out.strides.push_back(view.strides[k]);
    }
  }
  return out;
}

// Whether the view reads every element of a source of `source` shape, in
// order: it is then the source itself under the view's shape. The kernels
// take that path, and keeps_element_order asks the same question.
bool reads_all_in_order(const StridedView& view, const Shape& source) {
  const StridedView flat = simplified(view);
  const bool in_order = flat.offset == 0 && (flat.shape.empty() || (flat.shape.size() == 1 && flat.strides[0] == 1));
  return in_order && numel(view.shape) == numel(source);
}

// The view materialised as a row-major tensor: the source itself (reshaped)
// when the view reads all of its bytes in order, else a copy whose rows are
// memcpy'd when the innermost dim is contiguous in the source.
DenseTensor view_or_copy(const DenseTensor& src, const StridedView& view) {
  if (reads_all_in_order(view, src.shape())) return src.reshaped(view.shape);
  const StridedView flat = simplified(view);
  DenseTensor out = DenseTensor::empty(src.dtype(), view.shape);
  if (out.numel() == 0) return out;
  const std::size_t size = element_size(src.dtype());
  const std::byte* base = src.data() + to_index(flat.offset) * size;
  std::byte* dst = out.data();
  if (flat.shape.empty()) {
    std::memcpy(dst, base, size);
    return out;
  }
  const int64_t n = flat.shape.back();
  const int64_t step = flat.strides.back();
  const auto row = [&](const std::byte* src_row) {
    if (step == 1) {
      std::memcpy(dst, src_row, to_index(n) * size);
    } else {
      switch (size) {
        case 1:
          gather_row<1>(src_row, step, n, dst);
          break;
        case 2:
          gather_row<2>(src_row, step, n, dst);
          break;
        case 4:
          gather_row<4>(src_row, step, n, dst);
          break;
        default:
          gather_row<8>(src_row, step, n, dst);
          break;
      }
    }
    dst += to_index(n) * size;
  };
  // Odometer over the outer dims, tracking the source offset of each row.
  const std::size_t outer = flat.shape.size() - 1;
  Dims index(outer, 0);
  int64_t offset = 0;
  for (int64_t done = 0; done < out.numel(); done += n) {
    row(base + offset * static_cast<int64_t>(size));
    for (std::size_t d = outer; d-- > 0;) {
      offset += flat.strides[d];
      if (++index[d] < flat.shape[d]) break;
      offset -= flat.strides[d] * flat.shape[d];
      index[d] = 0;
    }
  }
  return out;
}

// Concatenation as memcpys: for each of the `outer` index combinations of the
// dims before the cat dim, each input's next numel/outer elements in turn
// (the inputs already have the result's dtype).
void concat_chunks(std::span<const DenseTensor> inputs, int64_t outer, DenseTensor& out) {
  if (out.numel() == 0) return;
  const std::size_t size = element_size(out.dtype());
  std::byte* dst = out.data();
  for (int64_t o = 0; o < outer; ++o) {
    for (const DenseTensor& input : inputs) {
      const std::size_t chunk = to_index(input.numel() / outer) * size;
      if (chunk == 0) continue;
      std::memcpy(dst, input.data() + to_index(o) * chunk, chunk);
      dst += chunk;
    }
  }
}

// ----------------------------------------------------------- rule helpers

// Reshape factors, Shardy style: walk the operand and result dims left to
// right with what is left of the current dim on each side. Equal sizes share
// one factor; when one divides the other, a factor of the smaller size is the
// whole of the smaller and the next (more minor) part of the larger. Size-1
// dims get their own factors. Sizes that do not divide (f32[2,3] -> [3,2]) make a group: the
// fewest dims on both sides that hold equal element counts; its operand dims
// get need-replication factors and its result dims their own pass-through
// factors (the result is then produced locally from a replicated operand).
OpShardingRule reshape_rule(const OpArgs& args, std::span<const TensorType> inputs,
                            std::span<const TensorType> outputs) {
  RuleBuilder builder(inputs, outputs);
  const int self = args.tensor("self");
  const Shape& in = input(args, inputs).shape;
  const Shape& out = outputs[0].shape;
  std::size_t i = 0, o = 0;
  int64_t in_left = in.empty() ? 0 : in[0];
  int64_t out_left = out.empty() ? 0 : out[0];
  const auto next_in = [&] { in_left = ++i < in.size() ? in[i] : 0; };
  const auto next_out = [&] { out_left = ++o < out.size() ? out[o] : 0; };
  const auto in_dim = [&] { return dims_on(inputs.size(), {&self, 1}, static_cast<int64_t>(i)); };
  const auto out_dim = [&] { return std::vector<int>{static_cast<int>(o)}; };
  const std::vector<int> no_operand(inputs.size(), -1);
  while (i < in.size() || o < out.size()) {
    if (i < in.size() && in[i] == 1) {
      builder.add_operand_only(self, static_cast<int>(i));
      next_in();
      continue;
    }
    if (o < out.size() && out[o] == 1) {
      builder.add_result_only(0, static_cast<int>(o));
      next_out();
      continue;
    }
    if (i < in.size() && o < out.size()) {
      if (in_left == out_left) {
        builder.add_factor(in_dim(), out_dim(), in_left);
        next_in();
        next_out();
        continue;
      }
      if (in_left > 0 && out_left > 0 && in_left % out_left == 0) {
        builder.add_factor(in_dim(), out_dim(), out_left);
        in_left /= out_left;
        next_out();
        continue;
      }
      if (in_left > 0 && out_left > 0 && out_left % in_left == 0) {
        builder.add_factor(in_dim(), out_dim(), in_left);
        out_left /= in_left;
        next_in();
        continue;
      }
    }
    // A non-dividing group. With no elements, element counts say nothing:
    // the group is every dim left.
    std::size_t in_end = in.size(), out_end = out.size();
    if (numel(in) != 0) {
      in_end = i + 1;
      out_end = o + 1;
      for (int64_t in_count = in_left, out_count = out_left; in_count != out_count;) {
        if (in_count < out_count) {
          in_count *= in[in_end++];
        } else {
          out_count *= out[out_end++];
        }
      }
    }
    while (i < in_end) {
      const FactorKind kind = in[i] == 1 ? FactorKind::kPassThrough : FactorKind::kNeedReplication;
      builder.add_factor(in_dim(), {-1}, in_left, kind);
      next_in();
    }
    while (o < out_end) {
      builder.add_factor(no_operand, out_dim(), out_left);
      next_out();
    }
  }
  return builder.build();
}

// Ops whose result keeps some operand dims in order, drops others and adds
// new ones (squeeze, unsqueeze, select, stack): kept[r] is the operand dim
// result dim r keeps, -1 for a new dim. A kept dim shares one factor across
// `operands` (input indices; all of one shape) and the result; a dropped dim
// gets its own factor of `dropped` kind, a new dim its own pass-through one.
OpShardingRule keep_dims_rule(std::span<const TensorType> inputs, std::span<const TensorType> outputs,
                              std::span<const int> operands, const Dims& kept,
                              FactorKind dropped = FactorKind::kPassThrough) {
  RuleBuilder builder(inputs, outputs);
  const int64_t rank = inputs[to_index(operands[0])].rank();
  int64_t p = 0;
  const auto drop_until = [&](int64_t end) {
    for (; p < end; ++p) {
      for (int t : operands) builder.add_operand_only(t, static_cast<int>(p), dropped);
    }
  };
  for (std::size_t r = 0; r < kept.size(); ++r) {
    if (kept[r] < 0) {
      builder.add_result_only(0, static_cast<int>(r));
      continue;
    }
    drop_until(kept[r]);
    builder.add_factor(dims_on(inputs.size(), operands, p), {static_cast<int>(r)}, outputs[0].shape[r]);
    ++p;
  }
  drop_until(rank);
  return builder.build();
}

// Every dim shared by `operands` (input indices) and the result, except
// `dim` (-1: none): there each operand gets its own factor of `kind` and the
// result its own pass-through factor (slice, cat).
OpShardingRule shared_except_rule(std::span<const TensorType> inputs, std::span<const TensorType> outputs,
                                  std::span<const int> operands, int64_t dim, FactorKind kind) {
  RuleBuilder builder(inputs, outputs);
  for (int64_t d = 0; d < outputs[0].rank(); ++d) {
    if (d == dim) {
      for (int t : operands) builder.add_operand_only(t, static_cast<int>(d), kind);
      builder.add_result_only(0, static_cast<int>(d));
    } else {
      builder.add_factor(dims_on(inputs.size(), operands, d), {static_cast<int>(d)}, outputs[0].shape[to_index(d)]);
    }
  }
  return builder.build();
}

// ------------------------------------------------- reshape, view, flatten

// PyTorch's infer_size: at most one -1, filled in from the element count.
Shape infer_size(std::span<const int64_t> shape, int64_t count) {
  std::optional<std::size_t> inferred;
  int64_t known = 1;
  bool overflow = false;  // more elements than 64 bits count: no tensor has that many
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      if (inferred) throw Error("only one dimension can be inferred");
      inferred = d;
    } else if (shape[d] >= 0) {
      overflow = __builtin_mul_overflow(known, shape[d], &known) || overflow;
    } else {
      throw Error(fmt::format("invalid shape dimension {}", shape[d]));
    }
  }
  if (overflow && known != 0) {
    throw Error(fmt::format("shape '{}' is invalid for input of size {}", sizes_text(shape), count));
  }
  Shape result(shape.begin(), shape.end());
  if (count == known || (inferred && known > 0 && count % known == 0)) {
    if (inferred) {
      if (known == 0) {
        throw Error(
            fmt::format("cannot reshape tensor of 0 elements into shape {} because the "
                        "unspecified dimension size -1 can be any value and is ambiguous",
                        sizes_text(shape)));
      }
      result[*inferred] = count / known;
    }
    return result;
  }
  throw Error(fmt::format("shape '{}' is invalid for input of size {}", sizes_text(shape), count));
}

Shape flatten_shape(const OpArgs& args, const Shape& in) {
  const auto rank = static_cast<int64_t>(in.size());
  const int64_t start = wrap_dim(args.get_int("start_dim"), rank);
  const int64_t end = wrap_dim(args.get_int("end_dim"), rank);
  if (start > end) throw Error("flatten() has invalid args: start_dim cannot come after end_dim");
  if (rank == 0) return {1};
  Shape shape(in.begin(), in.begin() + start);
  shape.push_back(numel(std::span(in).subspan(to_index(start), to_index(end - start + 1))));
  shape.insert(shape.end(), in.begin() + end + 1, in.end());
  return shape;
}

// Ops whose result is the operand's bytes under a new shape; `shape_of`
// gives that shape.
template <class ShapeOf>
OpDef same_bytes_def(ShapeOf shape_of) {
  OpDef def;
  def.family = OpFamily::kMovement;
  def.linearity = Linearity::kLinear;  // moving values commutes with summing them
  def.infer = [shape_of](const OpArgs& args, std::span<const TensorType> in) {
    const TensorType& self = input(args, in);
    return std::vector<TensorType>{{self.dtype, shape_of(args, self.shape)}};
  };
  def.kernel = [shape_of](const OpArgs& args, std::span<const DenseTensor> in) {
    const DenseTensor& self = input(args, in);
    return std::vector<DenseTensor>{self.reshaped(shape_of(args, self.shape()))};
  };
  def.keeps_element_order = [](const OpArgs&, std::span<const TensorType>, std::span<const TensorType>) {
    return true;
  };
  return def;
}

void register_reshape_ops(OpRegistry& r) {
  // On dense tensors view never needs a copy, so view is reshape.
  for (const auto& [schema, name] : {std::pair{"aten::reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a)", "shape"},
                                     std::pair{"aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)", "size"}}) {
    OpDef def = same_bytes_def([name = std::string(name)](const OpArgs& args, const Shape& in) {
      return infer_size(args.get_int_list(name), numel(in));
    });
    def.sharding_rule = reshape_rule;
    def.output_shape_arg = name;
    r.add(schema, std::move(def));
  }

  OpDef flatten = same_bytes_def(flatten_shape);
  flatten.sharding_rule = reshape_rule;
  r.add("aten::flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a)", std::move(flatten));
}

// ------------------------------------------------------ squeeze, unsqueeze

// The result shape of a keep_dims_rule mapping (new dims have size 1).
Shape kept_shape(const Shape& in, const Dims& kept) {
  Shape shape;
  for (int64_t d : kept) shape.push_back(d < 0 ? 1 : in[to_index(d)]);
  return shape;
}

// Squeeze and unsqueeze keep the bytes; `kept_of(args, shape)` says which
// operand dim each result dim is (see keep_dims_rule).
template <class KeptOf>
void add_keep_dims(OpRegistry& r, std::string_view schema, KeptOf kept_of) {
  OpDef def =
      same_bytes_def([kept_of](const OpArgs& args, const Shape& in) { return kept_shape(in, kept_of(args, in)); });
  def.sharding_rule = [kept_of](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const int self = args.tensor("self");
    return keep_dims_rule(in, out, {&self, 1}, kept_of(args, input(args, in).shape));
  };
  r.add(schema, std::move(def));
}

// Squeeze drops size-1 dims: all of them, or the one named (if it is size 1).
Dims squeeze_kept(const OpArgs& args, const Shape& in) {
  const auto rank = static_cast<int64_t>(in.size());
  std::optional<int64_t> dim;
  if (args.schema().argument_index("dim") >= 0) dim = wrap_dim(args.get_int("dim"), rank);
  Dims kept;
  for (int64_t d = 0; d < rank; ++d) {
    const bool removed = in[to_index(d)] == 1 && (!dim || *dim == d);
    if (!removed) kept.push_back(d);
  }
  return kept;
}

Dims unsqueeze_kept(const OpArgs& args, const Shape& in) {
  const auto rank = static_cast<int64_t>(in.size());
  const int64_t dim = wrap_dim(args.get_int("dim"), rank + 1);
  Dims kept;
  for (int64_t d = 0; d < rank; ++d) {
    if (d == dim) kept.push_back(-1);
    kept.push_back(d);
  }
  if (dim == rank) kept.push_back(-1);
  return kept;
}

// ---------------------------------------------------- permute, transpose

Dims permute_dims(const OpArgs& args, int64_t rank) {
  const std::vector<int64_t> dims = args.get_int_list("dims");
  if (static_cast<int64_t>(dims.size()) != rank) {
    // PyTorch's wording, "(sparse_coo)" included, for dense tensors too.
    throw Error(
        fmt::format("permute(sparse_coo): number of dimensions in the tensor input does "
                    "not match the length of the desired ordering of dimensions i.e. "
                    "input.dim() = {} is not equal to len(dims) = {}",
                    rank, dims.size()));
  }
  Dims perm;
  std::vector<bool> seen(to_index(rank), false);
  for (int64_t dim : dims) {
    const int64_t d = wrap_dim(dim, rank);
    if (seen[to_index(d)]) throw Error("permute(): duplicate dims are not allowed.");
    seen[to_index(d)] = true;
    perm.push_back(d);
  }
  return perm;
}

Dims transpose_dims(const OpArgs& args, int64_t rank) {
  const int64_t dim0 = wrap_dim(args.get_int("dim0"), rank);
  const int64_t dim1 = wrap_dim(args.get_int("dim1"), rank);
  Dims perm(to_index(rank));
  for (int64_t d = 0; d < rank; ++d) perm[to_index(d)] = d;
  if (rank > 0) std::swap(perm[to_index(dim0)], perm[to_index(dim1)]);
  return perm;
}

// Result dim k is operand dim perm[k], as a view of the operand.
StridedView permuted_view(const Shape& shape, const Dims& perm) {
  const Dims strides = row_major_strides(shape);
  StridedView view;
  for (int64_t d : perm) {
    view.shape.push_back(shape[to_index(d)]);
    view.strides.push_back(strides[to_index(d)]);
  }
  return view;
}

// Result dim k is operand dim perm[k]; each operand dim's factor moves with
// it: ([i, j])->([j, i]).
template <class PermOf>
void add_permute(OpRegistry& r, std::string_view schema, PermOf perm_of) {
  OpDef def;
  def.family = OpFamily::kMovement;
  def.linearity = Linearity::kLinear;
  def.infer = [perm_of](const OpArgs& args, std::span<const TensorType> in) {
    const TensorType& self = input(args, in);
    Shape shape;
    for (int64_t d : perm_of(args, self.rank())) shape.push_back(self.shape[to_index(d)]);
    return std::vector<TensorType>{{self.dtype, shape}};
  };
  def.sharding_rule = [perm_of](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const int self = args.tensor("self");
    const TensorType& type = input(args, in);
    const Dims perm = perm_of(args, type.rank());
    RuleBuilder builder(in, out);
    for (int64_t d = 0; d < type.rank(); ++d) {
      const auto k = std::find(perm.begin(), perm.end(), d) - perm.begin();
      builder.add_factor(dims_on(in.size(), {&self, 1}, d), {static_cast<int>(k)}, type.shape[to_index(d)]);
    }
    return builder.build();
  };
  def.kernel = [perm_of](const OpArgs& args, std::span<const DenseTensor> in) {
    const DenseTensor& self = input(args, in);
    return std::vector<DenseTensor>{view_or_copy(self, permuted_view(self.shape(), perm_of(args, self.rank())))};
  };
  // True when only size-1 dims move: [B,1,H,D] -> [B,H,1,D].
  def.keeps_element_order = [perm_of](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType>) {
    const TensorType& self = input(args, in);
    return reads_all_in_order(permuted_view(self.shape, perm_of(args, self.rank())), self.shape);
  };
  r.add(schema, std::move(def));
}

// ------------------------------------------------------------------ expand

// PyTorch's expand geometry, aligned from the right: -1 keeps an existing dim,
// a size-1 dim may grow, new dims lead.
Shape expand_shape(const OpArgs& args, const TensorType& in) {
  const std::vector<int64_t> sizes = args.get_int_list("size");
  const int64_t rank = in.rank();
  const auto out_rank = static_cast<int64_t>(sizes.size());
  if (out_rank < rank) {
    throw Error(
        fmt::format("expand(torch.{}Tensor{{{}}}, size={}): the number of sizes provided "
                    "({}) must be greater or equal to the number of dimensions in the "
                    "tensor ({})",
                    scalar_type_name(in.dtype), sizes_text(in.shape), sizes_text(sizes), out_rank, rank));
  }
  Shape shape(sizes.size());
  for (int64_t r = 0; r < out_rank; ++r) {
    const int64_t d = r - (out_rank - rank);
    const int64_t size = d >= 0 ? in.shape[to_index(d)] : 1;
    int64_t target = sizes[to_index(r)];
    if (target == -1) {
      if (d < 0) {
        throw Error(
            fmt::format("The expanded size of the tensor (-1) isn't allowed in a leading, "
                        "non-existing dimension {}",
                        r));
      }
      target = size;
    }
    if (target < 0) {
      throw Error(fmt::format("Trying to create tensor with negative dimension {}: {}", target, sizes_text(sizes)));
    }
    if (size != target && size != 1) {
      throw Error(
          fmt::format("The expanded size of the tensor ({}) must match the existing size "
                      "({}) at non-singleton dimension {}.  Target sizes: {}.  Tensor "
                      "sizes: {}",
                      target, size, r, sizes_text(sizes), sizes_text(in.shape)));
    }
    shape[to_index(r)] = target;
  }
  return shape;
}

// `out` (expand_shape's result) as a view of `shape`: grown and new dims
// repeat their element (stride 0).
StridedView expanded_view(const Shape& shape, const Shape& out) {
  StridedView view{0, out, {}};
  const Dims strides = row_major_strides(shape);
  const int64_t lead = static_cast<int64_t>(out.size()) - static_cast<int64_t>(shape.size());
  for (int64_t k = 0; k < static_cast<int64_t>(out.size()); ++k) {
    const int64_t d = k - lead;
    const bool same = d >= 0 && shape[to_index(d)] == out[to_index(k)];
    view.strides.push_back(same ? strides[to_index(d)] : 0);
  }
  return view;
}

void register_expand(OpRegistry& registry) {
  OpDef def;
  def.family = OpFamily::kMovement;
  def.linearity = Linearity::kLinear;
  def.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    const TensorType& self = input(args, in);
    return std::vector<TensorType>{{self.dtype, expand_shape(args, self)}};
  };
  // Kept dims share a factor. A size-1 operand dim that grows has its own
  // size-1 factor and the result dim its own (each shard of it can be made
  // locally); new leading dims are result-only:
  //   f32[3,1] -> [2,3,4]: ([j, k])->([i, j, l]) {i=2, j=3, k=1, l=4}
  def.sharding_rule = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const int self = args.tensor("self");
    const Shape& shape = input(args, in).shape;
    RuleBuilder builder(in, out);
    const int64_t lead = out[0].rank() - static_cast<int64_t>(shape.size());
    for (int64_t k = 0; k < out[0].rank(); ++k) {
      const int64_t d = k - lead;
      const int64_t size = out[0].shape[to_index(k)];
      if (d >= 0 && shape[to_index(d)] == size) {
        builder.add_factor(dims_on(in.size(), {&self, 1}, d), {static_cast<int>(k)}, size);
        continue;
      }
      if (d >= 0) builder.add_operand_only(self, static_cast<int>(d));
      builder.add_result_only(0, static_cast<int>(k));
    }
    return builder.build();
  };
  def.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    const DenseTensor& self = input(args, in);
    const TensorType type{self.dtype(), self.shape()};
    return std::vector<DenseTensor>{view_or_copy(self, expanded_view(type.shape, expand_shape(args, type)))};
  };
  // True when nothing grows (only leading size-1 dims are added).
  def.keeps_element_order = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType>) {
    const TensorType& self = input(args, in);
    return reads_all_in_order(expanded_view(self.shape, expand_shape(args, self)), self.shape);
  };
  def.output_shape_arg = "size";
  registry.add("aten::expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)", std::move(def));
}

// ---------------------------------------------------------- slice, select

struct SliceBounds {
  int64_t dim, start, step, length;
};

// PyTorch's clamping: negative indices count from the end, then start and
// end are clamped to [0, size] and end to at least start.
SliceBounds slice_bounds(const OpArgs& args, const Shape& in) {
  if (in.empty()) throw Error("slice() cannot be applied to a 0-dim tensor.");
  const int64_t dim = wrap_dim(args.get_int("dim"), static_cast<int64_t>(in.size()));
  const int64_t size = in[to_index(dim)];
  int64_t start = args.get_optional_int("start").value_or(0);
  int64_t end = args.get_optional_int("end").value_or(std::numeric_limits<int64_t>::max());
  const int64_t step = args.get_int("step");
  if (step <= 0) throw Error("slice step must be positive");
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  const int64_t length = end == start ? 0 : (end - start - 1) / step + 1;
  return {dim, start, step, length};
}

Shape slice_shape(const Shape& in, const SliceBounds& bounds) {
  Shape shape = in;
  shape[to_index(bounds.dim)] = bounds.length;
  return shape;
}

struct SelectIndex {
  int64_t dim, index;
};

SelectIndex select_index(const OpArgs& args, const Shape& in) {
  if (in.empty()) throw Error("select() cannot be applied to a 0-dim tensor.");
  const int64_t dim = wrap_dim(args.get_int("dim"), static_cast<int64_t>(in.size()));
  const int64_t size = in[to_index(dim)];
  const int64_t index = args.get_int("index");
  if (index >= size || index < -size) {
    throw Error(fmt::format("select(): index {} out of range for tensor of size {} at dimension {}", index,
                            sizes_text(in), dim));
  }
  return {dim, index < 0 ? index + size : index};
}

Dims all_but(int64_t rank, int64_t dim) {
  Dims kept;
  for (int64_t d = 0; d < rank; ++d) {
    if (d != dim) kept.push_back(d);
  }
  return kept;
}

void register_slice_select(OpRegistry& r) {
  OpDef slice;
  slice.family = OpFamily::kMovement;
  slice.linearity = Linearity::kLinear;
  slice.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    const TensorType& self = input(args, in);
    return std::vector<TensorType>{{self.dtype, slice_shape(self.shape, slice_bounds(args, self.shape))}};
  };
  // A slice that keeps the whole dim (the result dim as long as the operand's:
  // start 0, end >= size and step 1, or a size-0 or size-1 dim kept whole)
  // shares it. Otherwise which elements a shard needs depends on the bounds:
  // the operand dim needs replication and the result dim is cut locally.
  slice.sharding_rule = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const int self = args.tensor("self");
    const Shape& shape = input(args, in).shape;
    const SliceBounds bounds = slice_bounds(args, shape);
    const bool whole = bounds.length == shape[to_index(bounds.dim)];
    return shared_except_rule(in, out, {&self, 1}, whole ? -1 : bounds.dim, FactorKind::kNeedReplication);
  };
  slice.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    const DenseTensor& self = input(args, in);
    const SliceBounds bounds = slice_bounds(args, self.shape());
    Dims strides = row_major_strides(self.shape());
    const int64_t offset = bounds.start * strides[to_index(bounds.dim)];
    strides[to_index(bounds.dim)] *= bounds.step;
    const StridedView view{offset, slice_shape(self.shape(), bounds), std::move(strides)};
    return std::vector<DenseTensor>{view_or_copy(self, view)};
  };
  r.add(
      "aten::slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, "
      "SymInt step=1) -> Tensor(a)",
      std::move(slice));

  OpDef select;
  select.family = OpFamily::kMovement;
  select.linearity = Linearity::kLinear;
  select.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    const TensorType& self = input(args, in);
    const SelectIndex at = select_index(args, self.shape);
    const Shape shape = kept_shape(self.shape, all_but(self.rank(), at.dim));
    return std::vector<TensorType>{{self.dtype, shape}};
  };
  // The selected dim is gone from the result; every shard needs the one
  // selected row, so the operand dim needs replication.
  select.sharding_rule = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const int self = args.tensor("self");
    const TensorType& type = input(args, in);
    const SelectIndex at = select_index(args, type.shape);
    return keep_dims_rule(in, out, {&self, 1}, all_but(type.rank(), at.dim), FactorKind::kNeedReplication);
  };
  select.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    const DenseTensor& self = input(args, in);
    const SelectIndex at = select_index(args, self.shape());
    const Dims strides = row_major_strides(self.shape());
    StridedView view{at.index * strides[to_index(at.dim)], {}, {}};
    for (int64_t d : all_but(self.rank(), at.dim)) {
      view.shape.push_back(self.shape()[to_index(d)]);
      view.strides.push_back(strides[to_index(d)]);
    }
    return std::vector<DenseTensor>{view_or_copy(self, view)};
  };
  r.add("aten::select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)", std::move(select));
}

// ------------------------------------------------------------ cat, stack

// The tensors of the Tensor[] argument, in list order.
template <class T>
std::vector<T> listed(const OpArgs& args, std::span<const T> in) {
  std::vector<T> items;
  for (int index : args.tensor_list("tensors")) items.push_back(in[to_index(index)]);
  return items;
}

TensorType cat_type(const OpArgs& args, std::span<const TensorType> all) {
  const std::vector<TensorType> in = listed(args, all);
  if (in.empty()) throw Error("torch.cat(): expected a non-empty list of Tensors");
  for (std::size_t t = 0; t < in.size(); ++t) {
    if (in[t].rank() == 0) {
      throw Error(fmt::format("zero-dimensional tensor (at position {}) cannot be concatenated", t));
    }
  }
  const int64_t dim = wrap_dim(args.get_int("dim"), in[0].rank());
  Shape shape = in[0].shape;
  for (std::size_t t = 1; t < in.size(); ++t) {
    if (in[t].rank() != in[0].rank()) {
      throw Error(
          fmt::format("Tensors must have same number of dimensions: got {} and {}", in[0].rank(), in[t].rank()));
    }
    for (int64_t d = 0; d < in[0].rank(); ++d) {
      const int64_t expected = in[0].shape[to_index(d)], got = in[t].shape[to_index(d)];
      if (d != dim && got != expected) {
        throw Error(
            fmt::format("Sizes of tensors must match except in dimension {}. Expected size "
                        "{} but got size {} for tensor number {} in the list.",
                        dim, expected, got, t));
      }
    }
    shape[to_index(dim)] += in[t].shape[to_index(dim)];
  }
  return {result_type(in), shape};
}

TensorType stack_type(const OpArgs& args, std::span<const TensorType> all) {
  const std::vector<TensorType> in = listed(args, all);
  if (in.empty()) throw Error("stack expects a non-empty TensorList");
  const int64_t dim = wrap_dim(args.get_int("dim"), in[0].rank() + 1);
  for (std::size_t t = 1; t < in.size(); ++t) {
    if (in[t].shape != in[0].shape) {
      throw Error(
          fmt::format("stack expects each tensor to be equal size, but got {} at entry 0 "
                      "and {} at entry {}",
                      sizes_text(in[0].shape), sizes_text(in[t].shape), t));
    }
  }
  Shape shape = in[0].shape;
  shape.insert(shape.begin() + dim, static_cast<int64_t>(in.size()));
  return {result_type(in), shape};
}

// The listed inputs, cast to the result's dtype.
std::vector<DenseTensor> cast_all(const OpArgs& args, std::span<const DenseTensor> all, DType dtype) {
  std::vector<DenseTensor> inputs;
  for (const DenseTensor& t : listed(args, all)) inputs.push_back(cast(t, dtype));
  return inputs;
}

// The number of index combinations of the dims before `dim`.
int64_t outer_count(const Shape& shape, int64_t dim) { return numel(std::span(shape).first(to_index(dim))); }

void register_cat_stack(OpRegistry& r) {
  OpDef cat;
  cat.family = OpFamily::kMovement;
  cat.linearity = Linearity::kAdditive;
  cat.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    return std::vector<TensorType>{cat_type(args, in)};
  };
  // Where an operand's rows land depends on the sizes of the operands before
  // it, so the cat dim of each operand needs replication; the result's cat
  // dim is cut locally. The other dims are shared by all.
  cat.sharding_rule = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const std::vector<int>& operands = args.tensor_list("tensors");
    const int64_t dim = wrap_dim(args.get_int("dim"), out[0].rank());
    return shared_except_rule(in, out, operands, dim, FactorKind::kNeedReplication);
  };
  cat.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    const TensorType type = cat_type(args, types_of(in));
    const int64_t dim = wrap_dim(args.get_int("dim"), type.rank());
    const std::vector<DenseTensor> inputs = cast_all(args, in, type.dtype);
    if (inputs.size() == 1) return inputs;
    DenseTensor out = DenseTensor::empty(type.dtype, type.shape);
    concat_chunks(inputs, outer_count(type.shape, dim), out);
    return std::vector<DenseTensor>{std::move(out)};
  };
  r.add("aten::cat(Tensor[] tensors, int dim=0) -> Tensor", std::move(cat));

  OpDef stack;
  stack.family = OpFamily::kMovement;
  stack.linearity = Linearity::kAdditive;
  stack.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    return std::vector<TensorType>{stack_type(args, in)};
  };
  // The new dim is the result's alone; every other dim is shared.
  stack.sharding_rule = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const std::vector<int>& operands = args.tensor_list("tensors");
    const int64_t dim = wrap_dim(args.get_int("dim"), out[0].rank());
    Dims kept = all_but(out[0].rank() - 1, -1);
    kept.insert(kept.begin() + dim, -1);
    return keep_dims_rule(in, out, operands, kept);
  };
  stack.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    const TensorType type = stack_type(args, types_of(in));
    const int64_t dim = wrap_dim(args.get_int("dim"), type.rank());
    DenseTensor out = DenseTensor::empty(type.dtype, type.shape);
    concat_chunks(cast_all(args, in, type.dtype), outer_count(type.shape, dim), out);
    return std::vector<DenseTensor>{std::move(out)};
  };
  r.add("aten::stack(Tensor[] tensors, int dim=0) -> Tensor", std::move(stack));
}

}  // namespace

void register_shape_ops(OpRegistry& registry) {
  register_reshape_ops(registry);
  add_keep_dims(registry, "aten::squeeze(Tensor(a) self) -> Tensor(a)", squeeze_kept);
  add_keep_dims(registry, "aten::squeeze.dim(Tensor(a) self, int dim) -> Tensor(a)", squeeze_kept);
  add_keep_dims(registry, "aten::unsqueeze(Tensor(a) self, int dim) -> Tensor(a)", unsqueeze_kept);
  add_permute(registry, "aten::permute(Tensor(a) self, int[] dims) -> Tensor(a)", permute_dims);
  add_permute(registry, "aten::transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)", transpose_dims);
  register_expand(registry);
  register_slice_select(registry);
  register_cat_stack(registry);
}

}  // namespace shardflow::ops
