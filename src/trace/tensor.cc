#include "shardflow/trace/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shardflow/base/error.h"
#include "shardflow/sharding/shard_layout.h"
#include "shardflow/trace/call.h"
#include "shardflow/trace/compile.h"
#include "shardflow/trace/ops.h"
#include "trace_context.h"

namespace shardflow {

std::string traced_origin(const TensorImpl& impl);  // dispatch.cc

std::shared_ptr<TensorImpl> make_concrete_impl(DenseTensor value) {
  auto impl = std::make_shared<TensorImpl>();
  impl->type = {value.dtype(), value.shape()};
  impl->value = std::move(value);
  if (TraceContext* trace = TraceContext::current()) impl->trace_id = trace->id();
  return impl;
}

void throw_donated(const TensorImpl& impl) {
  throw Error(
      fmt::format("this tensor ({}) was donated to the compiled function '{}', which reused its buffer "
                  "for its outputs; use those outputs instead",
                  impl.type.to_string(), impl.donated_to));
}

DenseTensor gather_value(const TensorImpl& impl) {
  if (impl.meta) {
    throw Error("tensor " + impl.type.to_string() + " is shape-only (meta); it has no values to read or compute with");
  }
  if (impl.traced_value != nullptr) {
    throw Error(
        "this tensor depends on the inputs of the compiled function, so its values are "
        "not known while tracing; it is computed by: " +
        traced_origin(impl));
  }
  if (!impl.donated_to.empty()) throw_donated(impl);
  if (impl.value) return *impl.value;
  const std::vector<int64_t>& tiles = impl.layout->num_tiles;
  if (std::all_of(tiles.begin(), tiles.end(), [](int64_t t) { return t == 1; })) {  // no dim split: each is whole
    for (const DenseTensor& shard : impl.shards) {
      if (shard.defined()) return shard;
    }
  }
  const std::vector<DenseTensor>* held = &impl.shards;
  std::vector<DenseTensor> fetched;
  if (std::any_of(impl.shards.begin(), impl.shards.end(), [](const DenseTensor& s) { return !s.defined(); })) {
    // Some shards live in other processes: a collective read.
    fetched = impl.shards;
    graph_runner()->fetch_shards(fetched, *impl.layout, impl.type.dtype);
    held = &fetched;
  }
  std::vector<std::span<const std::byte>> shards;
  for (const DenseTensor& shard : *held) shards.push_back(shard.bytes());
  DenseTensor value = DenseTensor::empty(impl.type.dtype, impl.type.shape);
  assemble_from_shards(*impl.layout, shards, element_size(impl.type.dtype),
                       std::span<std::byte>(value.data(), value.nbytes()));
  return value;
}

Tensor::Tensor(DenseTensor value) : impl_(make_concrete_impl(std::move(value))) {}

Tensor Tensor::meta(DType dtype, Shape shape) {
  for (int64_t d : shape) {
    if (d < 0) throw Error("tensor shape " + shape_to_string(shape) + " has a negative dimension");
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->type = {dtype, std::move(shape)};
  impl->meta = true;
  if (TraceContext* trace = TraceContext::current()) impl->trace_id = trace->id();
  return Tensor(std::move(impl));
}

Tensor Tensor::from_floats(std::span<const float> values, Shape shape) {
  if (static_cast<int64_t>(values.size()) != shardflow::numel(shape)) {
    throw Error(fmt::format("{} values do not fill a tensor of shape {}", values.size(), shape_to_string(shape)));
  }
  DenseTensor value = DenseTensor::empty(DType::kF32, std::move(shape));
  std::copy(values.begin(), values.end(), value.data_as<float>());
  return Tensor(std::move(value));
}

Tensor Tensor::from_ints(std::span<const int64_t> values, Shape shape, DType dtype) {
  if (static_cast<int64_t>(values.size()) != shardflow::numel(shape)) {
    throw Error(fmt::format("{} values do not fill a tensor of shape {}", values.size(), shape_to_string(shape)));
  }
  DenseTensor value = DenseTensor::empty(dtype, std::move(shape));
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < values.size(); ++i) value.data_as<T>()[i] = store<T>(values[i]);
  });
  return Tensor(std::move(value));
}

Tensor Tensor::scalar(double value, DType dtype) {
  DenseTensor data = DenseTensor::empty(dtype, {});
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    *data.data_as<T>() = store<T>(value);
  });
  return Tensor(std::move(data));
}

Tensor Tensor::from_shards(DType dtype, Shape shape, const Sharding& sharding, std::vector<DenseTensor> shards) {
  auto impl = std::make_shared<TensorImpl>();
  ShardLayout layout = shard_layout(sharding, shape);
  if (shards.size() != layout.shards.size()) {
    throw Error(fmt::format("{} shards given for a layout of {} devices", shards.size(), layout.shards.size()));
  }
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const DenseTensor& shard = shards[i];
    if (!shard.defined() && !is_addressable_device(layout.shards[i].device)) continue;  // another process's
    if (shard.dtype() != dtype || shard.shape() != layout.shard_shape) {
      throw Error(fmt::format("a shard is {}{} but the layout needs {}{}", dtype_name(shard.dtype()),
                              shape_to_string(shard.shape()), dtype_name(dtype), shape_to_string(layout.shard_shape)));
    }
  }
  impl->type = {dtype, std::move(shape)};
  impl->sharding = sharding;
  impl->layout = std::move(layout);
  impl->shards = std::move(shards);
  if (TraceContext* trace = TraceContext::current()) impl->trace_id = trace->id();
  return Tensor(std::move(impl));
}

const TensorType& Tensor::type() const {
  if (!impl_) throw Error("the tensor is undefined (default-constructed)");
  return impl_->type;
}

int64_t Tensor::size(int64_t dim) const { return shape()[static_cast<std::size_t>(wrap_dim(dim, rank()))]; }
int64_t Tensor::numel() const { return shardflow::numel(shape()); }
bool Tensor::is_meta() const { return impl_ && impl_->meta; }

bool Tensor::is_traced() const {
  TraceContext* trace = TraceContext::current();
  return impl_ && trace != nullptr && trace->must_record(std::span(&impl_, 1));
}

DenseTensor Tensor::value() const {
  if (!impl_) throw Error("the tensor is undefined (default-constructed)");
  return gather_value(*impl_);
}

std::vector<float> Tensor::to_floats() const {
  const DenseTensor data = value();
  std::vector<float> out(static_cast<std::size_t>(data.numel()));
  visit_dtype(data.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(load(data.data_as<T>()[i]));
  });
  return out;
}

std::vector<int64_t> Tensor::to_ints() const {
  const DenseTensor data = value();
  std::vector<int64_t> out(static_cast<std::size_t>(data.numel()));
  visit_dtype(data.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(load(data.data_as<T>()[i]));
  });
  return out;
}

double Tensor::item() const {
  if (numel() != 1) {
    throw Error(fmt::format("a Tensor with {} elements cannot be converted to Scalar", numel()));
  }
  return static_cast<double>(to_floats()[0]);
}

std::string Tensor::to_string() const {
  if (!impl_) return "Tensor(undefined)";
  std::string out = "Tensor(" + type().to_string();
  if (impl_->meta) return out + ", meta)";
  if (impl_->traced_value != nullptr) {
    // The value belongs to its trace's graph, which may be gone once the
    // trace has ended (a tensor kept past it, e.g. in a Python traceback).
    const TraceContext* trace = TraceContext::current();
    if (trace == nullptr || trace->id() != impl_->trace_id) return out + ", traced, from a finished trace)";
    return out + ", traced %" + impl_->traced_value->name() + ")";
  }
  const std::vector<float> values = to_floats();
  out += ", [";
  constexpr std::size_t kShown = 8;
  for (std::size_t i = 0; i < values.size() && i < kShown; ++i) {
    out += (i > 0 ? ", " : "") + fmt::format("{:.6g}", values[i]);
  }
  if (values.size() > kShown) out += ", ...";
  return out + "])";
}

std::optional<Sharding> Tensor::sharding() const { return impl_ ? impl_->sharding : std::nullopt; }

std::string Tensor::sharding_spec() const {
  const std::optional<Sharding> s = sharding();
  return s ? s->to_hlo_v1().to_string() : std::string();
}

std::vector<LocalShard> Tensor::local_shards() const {
  if (!impl_->donated_to.empty()) throw_donated(*impl_);
  std::vector<LocalShard> result;
  if (!impl_->sharding) {
    // Not laid out: one device holds the whole tensor.
    result.push_back({0, 0, {}, true, value()});
    for (int64_t d : shape()) result.back().slices.push_back({0, d});
    return result;
  }
  const ShardLayout& layout = *impl_->layout;
  for (std::size_t i = 0; i < layout.shards.size(); ++i) {
    const DeviceShard& shard = layout.shards[i];
    result.push_back(
        {shard.device, shard.replica_id, shard.slices, shard.whole, impl_->meta ? DenseTensor() : impl_->shards[i]});
  }
  return result;
}

bool Tensor::lies_in(const std::byte* memory) const {
  if (!impl_ || !impl_->is_concrete() || !impl_->donated_to.empty()) return false;
  if (!impl_->sharding) return impl_->value && impl_->value->data() == memory;
  const std::optional<std::vector<int64_t>> offsets = contiguous_shard_offsets(*impl_->layout);
  if (!offsets) return false;
  const std::size_t element = element_size(dtype());
  for (std::size_t i = 0; i < offsets->size(); ++i) {
    if (impl_->shards[i].data() != memory + static_cast<std::size_t>((*offsets)[i]) * element) return false;
  }
  return true;
}

Tensor Tensor::matmul(const Tensor& other) const { return shardflow::matmul(*this, other); }
Tensor Tensor::reshape(Shape shape) const { return shardflow::reshape(*this, std::move(shape)); }
Tensor Tensor::view(Shape shape) const { return ops::call("aten::view", {*this, std::move(shape)}); }
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const { return shardflow::transpose(*this, dim0, dim1); }
Tensor Tensor::permute(std::vector<int64_t> dims) const { return shardflow::permute(*this, std::move(dims)); }
Tensor Tensor::unsqueeze(int64_t dim) const { return shardflow::unsqueeze(*this, dim); }
Tensor Tensor::squeeze(int64_t dim) const { return shardflow::squeeze(*this, dim); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  return shardflow::flatten(*this, start_dim, end_dim);
}
Tensor Tensor::expand(Shape size) const { return shardflow::expand(*this, std::move(size)); }
Tensor Tensor::slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) const {
  return shardflow::slice(*this, dim, start, end, step);
}
Tensor Tensor::select(int64_t dim, int64_t index) const { return shardflow::select(*this, dim, index); }
Tensor Tensor::sum(std::vector<int64_t> dims, bool keepdim) const {
  return shardflow::sum(*this, std::move(dims), keepdim);
}
Tensor Tensor::mean(std::vector<int64_t> dims, bool keepdim) const {
  return shardflow::mean(*this, std::move(dims), keepdim);
}
Tensor Tensor::amax(std::vector<int64_t> dims, bool keepdim) const {
  return shardflow::amax(*this, std::move(dims), keepdim);
}
Tensor Tensor::argmax(std::optional<int64_t> dim, bool keepdim) const { return shardflow::argmax(*this, dim, keepdim); }
Tensor Tensor::softmax(int64_t dim) const { return shardflow::softmax(*this, dim); }
Tensor Tensor::to(DType dtype) const { return ops::call("aten::to.dtype", {*this, dtype}); }
Tensor Tensor::pow(double exponent) const { return shardflow::pow(*this, exponent); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor scalar_op(const char* op, const Tensor& a, const Constant& b) { return ops::call(op, {a, b}); }

}  // namespace shardflow
