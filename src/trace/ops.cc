// The free-function API: one line per op, forwarding to ops::call.
#include "shardflow/trace/ops.h"

namespace shardflow {

using ops::call;

Tensor neg(const Tensor& x) { return call("aten::neg", {x}); }
Tensor abs(const Tensor& x) { return call("aten::abs", {x}); }
Tensor exp(const Tensor& x) { return call("aten::exp", {x}); }
Tensor log(const Tensor& x) { return call("aten::log", {x}); }
Tensor sqrt(const Tensor& x) { return call("aten::sqrt", {x}); }
Tensor rsqrt(const Tensor& x) { return call("aten::rsqrt", {x}); }
Tensor sin(const Tensor& x) { return call("aten::sin", {x}); }
Tensor cos(const Tensor& x) { return call("aten::cos", {x}); }
Tensor tanh(const Tensor& x) { return call("aten::tanh", {x}); }
Tensor sigmoid(const Tensor& x) { return call("aten::sigmoid", {x}); }
Tensor relu(const Tensor& x) { return call("aten::relu", {x}); }
Tensor gelu(const Tensor& x, const char* approximate) {
  return call("aten::gelu", {x, kwarg("approximate", approximate)});
}
Tensor silu(const Tensor& x) { return call("aten::silu", {x}); }
Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1) return call("aten::add.Tensor", {a, b});
  return call("aten::add.Tensor", {a, b, kwarg("alpha", alpha)});
}
Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1) return call("aten::sub.Tensor", {a, b});
  return call("aten::sub.Tensor", {a, b, kwarg("alpha", alpha)});
}
Tensor mul(const Tensor& a, const Tensor& b) { return call("aten::mul.Tensor", {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return call("aten::div.Tensor", {a, b}); }
Tensor pow(const Tensor& base, const Tensor& exponent) { return call("aten::pow.Tensor_Tensor", {base, exponent}); }
Tensor pow(const Tensor& base, double exponent) { return call("aten::pow.Tensor_Scalar", {base, exponent}); }
Tensor maximum(const Tensor& a, const Tensor& b) { return call("aten::maximum", {a, b}); }
Tensor minimum(const Tensor& a, const Tensor& b) { return call("aten::minimum", {a, b}); }
Tensor eq(const Tensor& a, const Tensor& b) { return call("aten::eq.Tensor", {a, b}); }
Tensor ne(const Tensor& a, const Tensor& b) { return call("aten::ne.Tensor", {a, b}); }
Tensor lt(const Tensor& a, const Tensor& b) { return call("aten::lt.Tensor", {a, b}); }
Tensor le(const Tensor& a, const Tensor& b) { return call("aten::le.Tensor", {a, b}); }
Tensor gt(const Tensor& a, const Tensor& b) { return call("aten::gt.Tensor", {a, b}); }
Tensor ge(const Tensor& a, const Tensor& b) { return call("aten::ge.Tensor", {a, b}); }
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  return call("aten::where.self", {condition, a, b});
}

Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return call("aten::sum.dim_IntList", {x, std::move(dims), keepdim});
}
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return call("aten::mean.dim", {x, std::move(dims), keepdim});
}
Tensor amax(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return call("aten::amax", {x, std::move(dims), keepdim});
}
Tensor amin(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return call("aten::amin", {x, std::move(dims), keepdim});
}
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return call("aten::argmax", {x, dim ? Arg(*dim) : Arg(none), keepdim});
}
Tensor softmax(const Tensor& x, int64_t dim) { return call("aten::softmax.int", {x, dim}); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return call("aten::log_softmax.int", {x, dim}); }
Tensor rms_norm(const Tensor& x, Shape normalized_shape, std::optional<Tensor> weight, std::optional<double> eps) {
  return call("aten::rms_norm",
              {x, std::move(normalized_shape), weight ? Arg(*weight) : Arg(none), eps ? Arg(*eps) : Arg(none)});
}

Tensor matmul(const Tensor& a, const Tensor& b) { return call("aten::matmul", {a, b}); }
Tensor linear(const Tensor& input, const Tensor& weight, std::optional<Tensor> bias) {
  return call("aten::linear", {input, weight, bias ? Arg(*bias) : Arg(none)});
}
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    std::optional<Tensor> attn_mask, bool is_causal, std::optional<double> scale) {
  return call("aten::scaled_dot_product_attention", {query, key, value, attn_mask ? Arg(*attn_mask) : Arg(none), 0.0,
                                                     is_causal, kwarg("scale", scale ? Arg(*scale) : Arg(none))});
}

Tensor reshape(const Tensor& x, Shape shape) { return call("aten::reshape", {x, std::move(shape)}); }
Tensor permute(const Tensor& x, std::vector<int64_t> dims) { return call("aten::permute", {x, std::move(dims)}); }
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) { return call("aten::transpose.int", {x, dim0, dim1}); }
Tensor unsqueeze(const Tensor& x, int64_t dim) { return call("aten::unsqueeze", {x, dim}); }
Tensor squeeze(const Tensor& x, int64_t dim) { return call("aten::squeeze.dim", {x, dim}); }
Tensor expand(const Tensor& x, Shape size) { return call("aten::expand", {x, std::move(size)}); }
Tensor slice(const Tensor& x, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
  return call("aten::slice.Tensor", {x, dim, start ? Arg(*start) : Arg(none), end ? Arg(*end) : Arg(none), step});
}
Tensor select(const Tensor& x, int64_t dim, int64_t index) { return call("aten::select.int", {x, dim, index}); }
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) { return call("aten::cat", {tensors, dim}); }
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) { return call("aten::stack", {tensors, dim}); }
Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  return call("aten::flatten.using_ints", {x, start_dim, end_dim});
}

Tensor embedding(const Tensor& weight, const Tensor& indices) { return call("aten::embedding", {weight, indices}); }
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return call("aten::index_select", {x, dim, index});
}
Tensor index_copy(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source) {
  return call("aten::index_copy", {x, dim, index, source});
}
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) { return call("aten::gather", {x, dim, index}); }

Tensor arange(int64_t end, DType dtype) { return call("aten::arange", {end, kwarg("dtype", dtype)}); }
Tensor arange(double start, double end, double step, std::optional<DType> dtype) {
  return call("aten::arange.start_step", {start, end, step, kwarg("dtype", dtype ? Arg(*dtype) : Arg(none))});
}
Tensor full(Shape size, double value, DType dtype) {
  return call("aten::full", {std::move(size), value, kwarg("dtype", dtype)});
}
Tensor zeros(Shape size, DType dtype) { return call("aten::zeros", {std::move(size), kwarg("dtype", dtype)}); }
Tensor ones(Shape size, DType dtype) { return call("aten::ones", {std::move(size), kwarg("dtype", dtype)}); }
Tensor triu(const Tensor& x, int64_t diagonal) { return call("aten::triu", {x, diagonal}); }
Tensor tril(const Tensor& x, int64_t diagonal) { return call("aten::tril", {x, diagonal}); }
Tensor randn(Shape size, int64_t seed, DType dtype) {
  return call("shardflow::randn", {std::move(size), seed, kwarg("dtype", dtype)});
}
Tensor rand(Shape size, int64_t seed, DType dtype) {
  return call("shardflow::rand", {std::move(size), seed, kwarg("dtype", dtype)});
}

}  // namespace shardflow
