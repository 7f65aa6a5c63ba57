// The ops as free functions, named as in PyTorch (torch.silu, torch.matmul,
// ...). Each forwards to the op of the same name (see ops::call); the op's
// definition, with its exact schema, is in src/ops/.
#pragma once

#include <optional>
#include <vector>

#include "shardflow/trace/call.h"
#include "shardflow/trace/tensor.h"

namespace shardflow {

// Elementwise.
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, const char* approximate = "none");
Tensor silu(const Tensor& x);
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1);
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& base, const Tensor& exponent);
Tensor pow(const Tensor& base, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);

// Reductions.
Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// torch.nn.functional.rms_norm: x / sqrt(mean(x^2) + eps) * weight over the
// last dims (normalized_shape); eps defaults to float32's machine epsilon.
Tensor rms_norm(const Tensor& x, Shape normalized_shape, std::optional<Tensor> weight = std::nullopt,
                std::optional<double> eps = std::nullopt);

// Contractions.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& input, const Tensor& weight, std::optional<Tensor> bias = std::nullopt);
// torch.nn.functional.scaled_dot_product_attention (no dropout): q [..., L, E],
// k [..., S, E], v [..., S, Ev]; attn_mask (bool: true attends; float: added)
// broadcasts to [..., L, S]. Keys the mask hides are not read.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    std::optional<Tensor> attn_mask = std::nullopt, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);

// Shapes.
Tensor reshape(const Tensor& x, Shape shape);
Tensor permute(const Tensor& x, std::vector<int64_t> dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor expand(const Tensor& x, Shape size);
Tensor slice(const Tensor& x, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);

// Indexing.
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor index_copy(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

// Creation.
Tensor arange(int64_t end, DType dtype = DType::kI64);
Tensor arange(double start, double end, double step = 1, std::optional<DType> dtype = std::nullopt);
Tensor full(Shape size, double value, DType dtype = DType::kF32);
Tensor zeros(Shape size, DType dtype = DType::kF32);
Tensor ones(Shape size, DType dtype = DType::kF32);
Tensor triu(const Tensor& x, int64_t diagonal = 0);
Tensor tril(const Tensor& x, int64_t diagonal = 0);
// Deterministic: element i is a function of (seed, i) only.
Tensor randn(Shape size, int64_t seed, DType dtype = DType::kF32);
Tensor rand(Shape size, int64_t seed, DType dtype = DType::kF32);

}  // namespace shardflow
