// Matrix products: matmul (torch.matmul, with 1-D operands and broadcast
// batch dims) and linear (y = x W^T + b).
//
// Sharding rules: batch dims are like pointwise dims (a broadcast size-1 dim
// gets its own factor); the rows of the lhs and the columns of the rhs are
// pass-through; the contracted dim is one reduction (sum) factor shared by
// both operands, so sharding it leaves partial sums. Example, matmul
// f32[8,32] x f32[32,16]:
//   ([i, k], [k, j])->([i, j]) {i=8, j=16, k=32} reduction={k}
#include <fmt/format.h>

#include <type_traits>

#include "families.h"
#include "kernel_util.h"
#include "shardflow/base/error.h"
#include "shardflow/tensor/gemm.h"

namespace shardflow::ops {
namespace {

// caffe2::TypeMeta's names, which PyTorch's mm dtype message prints.
std::string_view type_meta_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float";
    case DType::kBF16:
      return "c10::BFloat16";
    case DType::kF16:
      return "c10::Half";
    case DType::kI64:
      return "long int";
    case DType::kI32:
      return "int";
    case DType::kBool:
      return "bool";
  }
  return "float";
}

Shape leading(const Shape& shape, std::size_t drop) {
  return Shape(shape.begin(), shape.end() - static_cast<std::ptrdiff_t>(std::min(drop, shape.size())));
}

// ------------------------------------------------------------------ shapes

// A torch.matmul call as a stack of `batch` products of an m x k lhs matrix
// and a k x n rhs matrix, both row-major. A 1-D lhs is a 1 x k row and a
// 1-D rhs a k x 1 column; their unit dims are not in the result.
struct MatmulShapes {
  Shape lhs_batch, rhs_batch, batch;
  int64_t m = 1, n = 1, k = 0;
  bool lhs_vector = false, rhs_vector = false;
  Shape result;
};

std::string mm_mismatch(int64_t rows, int64_t k1, int64_t k2, int64_t columns) {
  return fmt::format("mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})", rows, k1, k2, columns);
}

std::string mv_mismatch(int64_t rows, int64_t k, int64_t vector) {
  return fmt::format("size mismatch, got input ({}), mat ({}x{}), vec ({})", rows, rows, k, vector);
}

// PyTorch's message for contracted sizes that differ names the kernel
// torch.matmul picks for these ranks: dot, mv or mm (a batched operand
// against a 1-D or 2-D one is folded into a matrix first), or bmm.
std::string contraction_mismatch(const TensorType& lhs, const TensorType& rhs, int64_t lhs_k, int64_t rhs_k,
                                 int64_t batch_count) {
  if (rhs.rank() <= 2) {
    const int64_t rows = numel(leading(lhs.shape, 1));
    if (rhs.rank() == 2) return mm_mismatch(rows, lhs_k, rhs_k, rhs.shape[1]);
    if (lhs.rank() >= 2) return mv_mismatch(rows, lhs_k, rhs_k);
    return fmt::format(
        "inconsistent tensor size, expected tensor [{}] and src [{}] to have the same "
        "number of elements, but got {} and {} elements respectively",
        lhs_k, rhs_k, lhs_k, rhs_k);
  }
  // A 1-D lhs folds against the transposed rhs when that needs no copy
  // (rhs empty or its k is 1).
  if (lhs.rank() == 1 && (numel(rhs.shape) == 0 || rhs_k == 1)) {
    const int64_t rows = numel(leading(rhs.shape, 2)) * rhs.shape.back();
    return mv_mismatch(rows, rhs_k, lhs_k);
  }
  return fmt::format(
      "Expected size for first two dimensions of batch2 tensor to be: [{}, {}] but "
      "got: [{}, {}].",
      batch_count, lhs_k, batch_count, rhs_k);
}

MatmulShapes matmul_shapes(const TensorType& lhs, const TensorType& rhs) {
  if (lhs.rank() == 0 || rhs.rank() == 0) {
    throw Error(fmt::format("both arguments to matmul need to be at least 1D, but they are {}D and {}D", lhs.rank(),
                            rhs.rank()));
  }
  MatmulShapes s;
  s.lhs_vector = lhs.rank() == 1;
  s.rhs_vector = rhs.rank() == 1;
  s.lhs_batch = leading(lhs.shape, 2);
  s.rhs_batch = leading(rhs.shape, 2);
  s.m = s.lhs_vector ? 1 : lhs.shape[lhs.shape.size() - 2];
  s.n = s.rhs_vector ? 1 : rhs.shape.back();
  const int64_t lhs_k = lhs.shape.back();
  const int64_t rhs_k = s.rhs_vector ? rhs.shape[0] : rhs.shape[rhs.shape.size() - 2];
  // Batch dims broadcast before the contraction is checked, as in PyTorch.
  s.batch = broadcast_shapes(s.lhs_batch, s.rhs_batch);
  if (lhs_k != rhs_k) {
    throw Error(contraction_mismatch(lhs, rhs, lhs_k, rhs_k, numel(s.batch)));
  }
  s.k = lhs_k;
  s.result = s.batch;
  if (!s.lhs_vector) s.result.push_back(s.m);
  if (!s.rhs_vector) s.result.push_back(s.n);
  return s;
}

void check_same_dtype(DType lhs, DType rhs) {
  if (lhs != rhs) {
    throw Error(fmt::format("expected m1 and m2 to have the same dtype, but got: {} != {}", type_meta_name(lhs),
                            type_meta_name(rhs)));
  }
}

void check_not_bool(DType dtype) {
  if (dtype == DType::kBool) throw Error("\"addmm_impl_cpu_\" not implemented for 'Bool'");
}

TensorType matmul_type(const TensorType& lhs, const TensorType& rhs) {
  const MatmulShapes s = matmul_shapes(lhs, rhs);
  if (lhs.rank() == 1 && rhs.rank() == 1 && lhs.dtype != rhs.dtype) {
    throw Error(fmt::format("dot : expected both vectors to have same dtype, but found {} and {}",
                            scalar_type_name(lhs.dtype), scalar_type_name(rhs.dtype)));
  }
  check_same_dtype(lhs.dtype, rhs.dtype);
  check_not_bool(lhs.dtype);
  return {lhs.dtype, s.result};
}

// ------------------------------------------------------------------ kernels

// Element offset of each batch's matrix in an operand whose batch dims
// broadcast to `batch` (a broadcast dim does not move the offset, so a shared
// matrix is read in place).
std::vector<int64_t> batch_offsets(const Shape& own, const Shape& batch, int64_t matrix_size) {
  const std::size_t pad = batch.size() - own.size();
  std::vector<int64_t> strides(batch.size(), 0);
  int64_t stride = matrix_size;
  for (std::size_t d = batch.size(); d-- > pad;) {
    if (own[d - pad] != 1) strides[d] = stride;
    stride *= own[d - pad];
  }
  const int64_t count = numel(batch);
  std::vector<int64_t> offsets;
  offsets.reserve(static_cast<std::size_t>(count));
  std::vector<int64_t> index(batch.size(), 0);
  int64_t offset = 0;
  for (int64_t b = 0; b < count; ++b) {
    offsets.push_back(offset);
    for (std::size_t d = batch.size(); d-- > 0;) {
      offset += strides[d];
      if (++index[d] < batch[d]) break;
      offset -= strides[d] * batch[d];
      index[d] = 0;
    }
  }
  return offsets;
}

// c[m x n] = a[m x k] · b (+ c when accumulate), b stored k x n (n x k
// when transpose_b), with wrapping integer arithmetic (unsigned, so that
// overflow is defined).
template <class T>
void integer_gemm(const GemmShape& s, const T* a, const T* b, T* c, bool accumulate) {
  using U = std::make_unsigned_t<T>;
  const auto initial = [&](int64_t at) { return accumulate ? static_cast<U>(c[at]) : U{0}; };
  if (s.transpose_b) {
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        U sum = initial(i * s.n + j);
        for (int64_t p = 0; p < s.k; ++p) sum += static_cast<U>(a[i * s.k + p]) * static_cast<U>(b[j * s.k + p]);
        c[i * s.n + j] = static_cast<T>(sum);
      }
    }
    return;
  }
  // Row i of c accumulates a[i, p] * row p of b: unit-stride, vectorisable.
  std::vector<U> row(static_cast<std::size_t>(s.n));
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) row[static_cast<std::size_t>(j)] = initial(i * s.n + j);
    for (int64_t p = 0; p < s.k; ++p) {
      const U scale = static_cast<U>(a[i * s.k + p]);
      const T* b_row = b + p * s.n;
      for (int64_t j = 0; j < s.n; ++j) row[static_cast<std::size_t>(j)] += scale * static_cast<U>(b_row[j]);
    }
    for (int64_t j = 0; j < s.n; ++j) c[i * s.n + j] = static_cast<T>(row[static_cast<std::size_t>(j)]);
  }
}

// c = a · b (+ c when accumulate): BLAS for f32, plain loops for integers.
template <class T>
void gemm(const GemmShape& shape, const T* a, const T* b, T* c, bool accumulate = false) {
  if constexpr (std::is_same_v<T, float>) {
    gemm_f32(shape, a, b, c, accumulate);
  } else {
    integer_gemm(shape, a, b, c, accumulate);
  }
}

// One GEMM per batch, reading broadcast operands in place.
template <class T>
void batched_gemm(const MatmulShapes& s, const T* lhs, const T* rhs, T* out) {
  const int64_t batches = numel(s.batch);
  // Batched lhs matrices against one shared rhs are one tall product.
  if (numel(s.rhs_batch) == 1 && numel(s.lhs_batch) == batches) {
    gemm<T>({batches * s.m, s.n, s.k}, lhs, rhs, out);
    return;
  }
  const std::vector<int64_t> lhs_at = batch_offsets(s.lhs_batch, s.batch, s.m * s.k);
  const std::vector<int64_t> rhs_at = batch_offsets(s.rhs_batch, s.batch, s.k * s.n);
  for (int64_t b = 0; b < batches; ++b) {
    const auto index = static_cast<std::size_t>(b);
    gemm<T>({s.m, s.n, s.k}, lhs + lhs_at[index], rhs + rhs_at[index], out + b * s.m * s.n);
  }
}

DenseTensor matmul_kernel(const DenseTensor& lhs, const DenseTensor& rhs) {
  const DType dtype = matmul_type({lhs.dtype(), lhs.shape()}, {rhs.dtype(), rhs.shape()}).dtype;
  const MatmulShapes s = matmul_shapes({lhs.dtype(), lhs.shape()}, {rhs.dtype(), rhs.shape()});
  if (dtype == DType::kI64 || dtype == DType::kI32) {
    DenseTensor out = DenseTensor::empty(dtype, s.result);
    if (dtype == DType::kI64) {
      batched_gemm(s, lhs.data_as<int64_t>(), rhs.data_as<int64_t>(), out.data_as<int64_t>());
    } else {
      batched_gemm(s, lhs.data_as<int32_t>(), rhs.data_as<int32_t>(), out.data_as<int32_t>());
    }
    return out;
  }
  // bf16 and f16 compute in f32, as PyTorch does on CPU.
  const DenseTensor a = cast(lhs, DType::kF32);
  const DenseTensor b = cast(rhs, DType::kF32);
  DenseTensor out = DenseTensor::empty(DType::kF32, s.result);
  batched_gemm(s, a.data_as<float>(), b.data_as<float>(), out.data_as<float>());
  return cast(out, dtype);
}

// Batch factors like pointwise dims, then m, n and the contracted k.
OpShardingRule matmul_rule(const OpArgs&, std::span<const TensorType> inputs, std::span<const TensorType> outputs) {
  const TensorType& lhs = inputs[0];
  const TensorType& rhs = inputs[1];
  const MatmulShapes s = matmul_shapes(lhs, rhs);
  RuleBuilder builder(inputs, outputs);
  const auto batch_rank = static_cast<int>(s.batch.size());
  // The operand dim aligned with batch dim d, unless absent or broadcast.
  const auto aligned = [&](const Shape& own, int d) {
    const int dim = d - (batch_rank - static_cast<int>(own.size()));
    return dim >= 0 && own[static_cast<std::size_t>(dim)] == s.batch[static_cast<std::size_t>(d)] ? dim : -1;
  };
  for (int d = 0; d < batch_rank; ++d) {
    builder.add_factor({aligned(s.lhs_batch, d), aligned(s.rhs_batch, d)}, {d}, s.batch[static_cast<std::size_t>(d)]);
  }
  const auto lhs_rank = static_cast<int>(lhs.rank());
  const auto rhs_rank = static_cast<int>(rhs.rank());
  int result_dim = batch_rank;
  if (!s.lhs_vector) builder.add_factor({lhs_rank - 2, -1}, {result_dim++}, s.m);
  if (!s.rhs_vector) builder.add_factor({-1, rhs_rank - 1}, {result_dim}, s.n);
  builder.add_factor({lhs_rank - 1, s.rhs_vector ? 0 : rhs_rank - 2}, {-1}, s.k, FactorKind::kReduction,
                     ReduceOp::kSum);
  return builder.build();
}

void register_matmul(OpRegistry& registry) {
  OpDef def;
  def.family = OpFamily::kContraction;
  def.infer = [](const OpArgs&, std::span<const TensorType> in) {
    return std::vector<TensorType>{matmul_type(in[0], in[1])};
  };
  def.sharding_rule = matmul_rule;
  def.kernel = [](const OpArgs&, std::span<const DenseTensor> in) {
    return std::vector<DenseTensor>{matmul_kernel(in[0], in[1])};
  };
  def.linearity = Linearity::kBilinear;
  registry.add("aten::matmul(Tensor self, Tensor other) -> Tensor", std::move(def));
}

// ------------------------------------------------------------------ linear

// Sizes as PyTorch prints them in messages: "[4, 5]".
std::string sizes_text(const Shape& shape) {
  std::string text = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) text += fmt::format("{}{}", d > 0 ? ", " : "", shape[d]);
  return text + "]";
}

// The bias broadcasts to the result without changing its shape (the
// message is expand's).
void check_bias_broadcasts(const TensorType& bias, const Shape& target) {
  const Shape& own = bias.shape;
  if (own.size() > target.size()) {
    throw Error(
        fmt::format("expand(torch.{}Tensor{{{}}}, size={}): the number of sizes provided ({}) "
                    "must be greater or equal to the number of dimensions in the tensor ({})",
                    scalar_type_name(bias.dtype), sizes_text(own), sizes_text(target), target.size(), own.size()));
  }
  const std::size_t pad = target.size() - own.size();
  for (std::size_t d = pad; d < target.size(); ++d) {
    if (own[d - pad] != 1 && own[d - pad] != target[d]) {
      throw Error(
          fmt::format("The expanded size of the tensor ({}) must match the existing size ({}) "
                      "at non-singleton dimension {}.  Target sizes: {}.  Tensor sizes: {}",
                      target[d], own[d - pad], d, sizes_text(target), sizes_text(own)));
    }
  }
}

// linear(x, W, b) is matmul(x, W^T) + b. For a 2-D or 3-D x, or a 1-D bias,
// PyTorch fuses the bias into addmm (x flattened to a matrix), whose dtype
// messages differ from mm's and which needs a 2-D W.
TensorType linear_type(const TensorType& input, const TensorType& weight, const TensorType* bias) {
  if (input.rank() == 0 || weight.rank() == 0) {
    throw Error(fmt::format("both arguments to linear need to be at least 1D, but they are {}D and {}D", input.rank(),
                            weight.rank()));
  }
  if (weight.rank() > 2) {
    throw Error(fmt::format("t() expects a tensor with <= 2 dimensions, but self is {}D", weight.rank()));
  }
  if (bias != nullptr) {
    if (bias->dtype != weight.dtype) {
      throw Error(fmt::format("self and mat2 must have the same dtype, but got {} and {}",
                              scalar_type_name(bias->dtype), scalar_type_name(weight.dtype)));
    }
    const bool fused = input.rank() == 2 || input.rank() == 3 || bias->rank() == 1;
    if (fused && input.dtype != weight.dtype) {
      throw Error(fmt::format("mat1 and mat2 must have the same dtype, but got {} and {}",
                              scalar_type_name(input.dtype), scalar_type_name(weight.dtype)));
    }
    if (fused && weight.rank() == 1) throw Error("mat2 must be a matrix, got 1-D tensor");
  }
  TensorType transposed = weight;
  if (weight.rank() == 2) transposed.shape = {weight.shape[1], weight.shape[0]};
  const TensorType result = matmul_type(input, transposed);
  if (bias != nullptr) check_bias_broadcasts(*bias, result.shape);
  return result;
}

const TensorType* bias_type(const OpArgs& args, std::span<const TensorType> in) {
  const int bias = args.tensor("bias");
  return bias < 0 ? nullptr : &in[static_cast<std::size_t>(bias)];
}

DenseTensor linear_kernel(const DenseTensor& input, const DenseTensor& weight, const DenseTensor* bias) {
  const TensorType bias_desc = bias ? TensorType{bias->dtype(), bias->shape()} : TensorType{};
  const TensorType result =
      linear_type({input.dtype(), input.shape()}, {weight.dtype(), weight.shape()}, bias ? &bias_desc : nullptr);
  const int64_t in_features = input.shape().back();
  const int64_t out_features = weight.rank() == 2 ? weight.shape()[0] : 1;
  // Every leading dim of x is a row: one GEMM against W stored out x in.
  const GemmShape product{numel(leading(input.shape(), 1)), out_features, in_features, false, true};
  const DType compute = is_floating(result.dtype) ? DType::kF32 : result.dtype;
  const DenseTensor x = cast(input, compute);
  // 16-bit weights are read as stored (see gemm_f32), not converted per call.
  const bool sixteen_bit_weight = compute == DType::kF32 && weight.dtype() != DType::kF32;
  const DenseTensor w = sixteen_bit_weight ? weight : cast(weight, compute);
  DenseTensor out = DenseTensor::empty(compute, result.shape);
  visit_dtype(compute, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, int64_t> || std::is_same_v<T, int32_t>) {
      T* y = out.data_as<T>();
      if (bias != nullptr) {
        // Start from the broadcast bias and accumulate the product onto it.
        const DenseTensor b = cast(*bias, compute);
        const Shape* shapes[] = {&b.shape()};
        T* row_start = y;
        for_each_broadcast_row(result.shape, shapes, [&](int64_t n, const int64_t* offset, const int64_t* inner) {
          const T* source = b.data_as<T>() + offset[0];
          for (int64_t i = 0; i < n; ++i) row_start[i] = source[i * inner[0]];
          row_start += n;
        });
      }
      if constexpr (std::is_same_v<T, float>) {
        if (w.dtype() == DType::kBF16) {
          gemm_f32(product, x.data_as<float>(), w.data_as<BFloat16>(), y, bias != nullptr);
          return;
        }
        if (w.dtype() == DType::kF16) {
          gemm_f32(product, x.data_as<float>(), w.data_as<Float16>(), y, bias != nullptr);
          return;
        }
      }
      gemm(product, x.data_as<T>(), w.data_as<T>(), y, bias != nullptr);
    }
  });
  return cast(out, result.dtype);
}

// Batch dims of x pass through; in_features is the reduction shared by x and
// W; out_features is shared by W, the bias and the result's last dim.
OpShardingRule linear_rule(const OpArgs& args, std::span<const TensorType> inputs,
                           std::span<const TensorType> outputs) {
  const TensorType& input = inputs[0];
  const TensorType& weight = inputs[1];
  const TensorType& result = outputs[0];
  const int bias = args.tensor("bias");
  RuleBuilder builder(inputs, outputs);
  const auto result_rank = static_cast<int>(result.rank());
  // The bias dim aligned with result dim d, unless absent or broadcast.
  const auto bias_dim = [&](int d) {
    if (bias < 0) return -1;
    const Shape& own = inputs[static_cast<std::size_t>(bias)].shape;
    const int dim = d - (result_rank - static_cast<int>(own.size()));
    return dim >= 0 && own[static_cast<std::size_t>(dim)] == result.shape[static_cast<std::size_t>(d)] ? dim : -1;
  };
  const auto operand_dims = [&](int input_dim, int weight_dim, int d) {
    std::vector<int> dims = {input_dim, weight_dim};
    if (bias >= 0) dims.push_back(d < 0 ? -1 : bias_dim(d));
    return dims;
  };
  const int batch_rank = static_cast<int>(input.rank()) - 1;
  for (int d = 0; d < batch_rank; ++d) {
    builder.add_factor(operand_dims(d, -1, d), {d}, input.shape[static_cast<std::size_t>(d)]);
  }
  if (weight.rank() == 2) {
    builder.add_factor(operand_dims(-1, 0, result_rank - 1), {result_rank - 1}, weight.shape[0]);
  }
  builder.add_factor(operand_dims(batch_rank, static_cast<int>(weight.rank()) - 1, -1), {-1}, input.shape.back(),
                     FactorKind::kReduction, ReduceOp::kSum);
  return builder.build();
}

void register_linear(OpRegistry& registry) {
  OpDef def;
  def.family = OpFamily::kContraction;
  def.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    return std::vector<TensorType>{linear_type(in[0], in[1], bias_type(args, in))};
  };
  def.sharding_rule = linear_rule;
  def.addend_arg = "bias";
  def.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    const int bias = args.tensor("bias");
    const DenseTensor* bias_tensor = bias < 0 ? nullptr : &in[static_cast<std::size_t>(bias)];
    return std::vector<DenseTensor>{linear_kernel(in[0], in[1], bias_tensor)};
  };
  registry.add("aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor", std::move(def));
}

}  // namespace

void register_matmul_ops(OpRegistry& registry) {
  register_matmul(registry);
  register_linear(registry);
}

}  // namespace shardflow::ops
