// Reductions over dims (sum, mean, prod, amax, amin, argmax) and softmax /
// log_softmax along one dim.
//
// Sharding rules: a kept dim is a pass-through factor shared by operand and
// result; a reduced dim is a factor of the operand only, of kind reduction
// (partial results combine by sum, max or min) or, for prod and argmax,
// need-replication (no collective multiplies; partial indices cannot be
// combined without the values).
// With keepdim the result's size-1 dim gets its own factor. Softmax keeps
// every dim; its dim is one need-replication factor shared by operand and
// result. Example, sum over dim 1 of f32[8,16]:
//   ([i, j])->([i]) {i=8, j=16} reduction={j}
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "families.h"
#include "kernel_util.h"
#include "shardflow/base/error.h"

namespace shardflow::ops {
namespace {

// ------------------------------------------------------------ reduced dims

// The dims a dim list reduces, wrapped; every dim for an absent or empty
// list (PyTorch's dim=None and dim=[]). A scalar accepts dims 0 and -1, and
// repeating one is an error there too, as in PyTorch.
std::vector<bool> reduced_dims(const std::optional<std::vector<int64_t>>& dims, int64_t rank) {
  const bool all = !dims || dims->empty();
  std::vector<bool> reduced(static_cast<std::size_t>(std::max<int64_t>(rank, 1)), all);
  if (!all) {
    for (int64_t dim : *dims) {
      const auto wrapped = static_cast<std::size_t>(wrap_dim(dim, rank));
      if (reduced[wrapped]) {
        throw Error(fmt::format("dim {} appears multiple times in the list of dims", wrapped));
      }
      reduced[wrapped] = true;
    }
  }
  reduced.resize(static_cast<std::size_t>(rank));
  return reduced;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& reduced, bool keepdim) {
  Shape result;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (!reduced[d]) {
      result.push_back(shape[d]);
    } else if (keepdim) {
      result.push_back(1);
    }
  }
  return result;
}

int64_t reduced_count(const Shape& shape, const std::vector<bool>& reduced) {
  int64_t count = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (reduced[d]) count *= shape[d];
  }
  return count;
}

// Max and min have no identity: an empty tensor must be reduced along given
// non-empty dims only (PyTorch's checks and messages; dims as given).
void check_reducible_when_empty(std::string_view name, const std::vector<int64_t>& dims, const Shape& shape) {
  if (dims.empty()) {
    throw Error(
        fmt::format("{}(): Expected reduction dim to be specified for input.numel() == 0. "
                    "Specify the reduction dim with the 'dim' argument.",
                    name));
  }
  for (int64_t dim : dims) {
    if (shape[static_cast<std::size_t>(wrap_dim(dim, static_cast<int64_t>(shape.size())))] == 0) {
      throw Error(fmt::format("{}(): Expected reduction dim {} to have non-zero size.", name, dim));
    }
  }
}

// A kept dim is shared by operand and result; a reduced one is the
// operand's alone (with keepdim the result's size-1 dim gets its own factor
// in build()).
OpShardingRule reduction_rule(const std::vector<bool>& reduced, bool keepdim, std::span<const TensorType> inputs,
                              std::span<const TensorType> outputs, FactorKind kind, ReduceOp reduction) {
  RuleBuilder builder(inputs, outputs);
  const Shape& shape = inputs[0].shape;
  int result_dim = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const int dim = static_cast<int>(d);
    if (!reduced[d]) {
      builder.add_factor({dim}, {result_dim++}, shape[d]);
      continue;
    }
    builder.add_factor({dim}, {-1}, shape[d], kind, reduction);
    if (keepdim) ++result_dim;
  }
  return builder.build();
}

// ------------------------------------------------------------ loop structure

// A reduction as loops: `outer` loops (kept and reduced dims in any order)
// around `count` rows of `inner` contiguous kept elements. Extent-1 dims are
// dropped and neighbouring dims of the same kind merged first, so reducing
// the last dims, the leading dims or everything is a single loop nest.
struct ReductionPlan {
  struct Loop {
    int64_t extent, input_stride, output_stride;  // output_stride 0: reduced
  };
  std::vector<Loop> outer;
  int64_t count = 1;
  int64_t inner = 1;
};

ReductionPlan plan_reduction(const Shape& shape, const std::vector<bool>& reduced) {
  struct Run {
    int64_t extent;
    bool reduced;
  };
  std::vector<Run> runs;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!runs.empty() && runs.back().reduced == reduced[d]) {
      runs.back().extent *= shape[d];
    } else {
      runs.push_back({shape[d], reduced[d]});
    }
  }
  ReductionPlan plan;
  if (!runs.empty() && !runs.back().reduced) {
    plan.inner = runs.back().extent;
    runs.pop_back();
  }
  if (!runs.empty() && runs.back().reduced) {
    plan.count = runs.back().extent;
    runs.pop_back();
  }
  int64_t input_stride = plan.count * plan.inner;
  int64_t output_stride = plan.inner;
  plan.outer.resize(runs.size());
  for (std::size_t r = runs.size(); r-- > 0;) {
    plan.outer[r] = {runs[r].extent, input_stride, runs[r].reduced ? 0 : output_stride};
    input_stride *= runs[r].extent;
    if (!runs[r].reduced) output_stride *= runs[r].extent;
  }
  return plan;
}

// Calls body(input_offset, output_offset) once per iteration of the outer
// loops.
template <class Body>
void for_each_outer(const ReductionPlan& plan, Body&& body) {
  int64_t total = 1;
  for (const auto& loop : plan.outer) total *= loop.extent;
  std::vector<int64_t> index(plan.outer.size(), 0);
  int64_t input = 0, output = 0;
  for (int64_t step = 0; step < total; ++step) {
    body(input, output);
    for (std::size_t d = plan.outer.size(); d-- > 0;) {
      const auto& loop = plan.outer[d];
      input += loop.input_stride;
      output += loop.output_stride;
      if (++index[d] < loop.extent) break;
      input -= loop.input_stride * loop.extent;
      output -= loop.output_stride * loop.extent;
      index[d] = 0;
    }
  }
}

// ------------------------------------------------------------ accumulation

// How partial results combine. NaN wins max and min, as in torch.amax.
struct SumOp {
  template <class A>
  static A identity() {
    return A{0};
  }
  template <class A>
  static A combine(A a, A b) {
    return a + b;
  }
};
struct ProductOp {
  template <class A>
  static A identity() {
    return A{1};
  }
  template <class A>
  static A combine(A a, A b) {
    return a * b;
  }
};
struct MaxOp {
  template <class A>
  static A identity() {
    return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                : std::numeric_limits<A>::lowest();
  }
  template <class A>
  static A combine(A a, A b) {
    return (a > b || is_nan(a)) ? a : b;
  }
};
struct MinOp {
  template <class A>
  static A identity() {
    return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
  }
  template <class A>
  static A combine(A a, A b) {
    return (a < b || is_nan(a)) ? a : b;
  }
};

// One contiguous row to one value. Independent lanes let the compiler
// vectorise without reassociating a single float chain (which it may not).
template <class Op, class A, class T>
A reduce_contiguous(const T* x, int64_t count) {
  constexpr int kLanes = 8;
  A lanes[kLanes];
  for (A& lane : lanes) lane = Op::template identity<A>();
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = Op::combine(lanes[l], static_cast<A>(load(x[i + l])));
  }
  for (; i < count; ++i) lanes[0] = Op::combine(lanes[0], static_cast<A>(load(x[i])));
  A total = lanes[0];
  for (int l = 1; l < kLanes; ++l) total = Op::combine(total, lanes[l]);
  return total;
}

// `count` rows of `inner` elements into acc[inner], row by row (each row is
// an elementwise, vectorisable update).
template <class Op, class A, class T>
void accumulate_rows(const T* x, int64_t count, int64_t inner, A* acc) {
  for (int64_t r = 0; r < count; ++r) {
    const T* row = x + r * inner;
    for (int64_t i = 0; i < inner; ++i) acc[i] = Op::combine(acc[i], static_cast<A>(load(row[i])));
  }
}

// Combines every input element into its output's accumulator (preset to the
// identity, one per output element).
template <class Op, class A, class T>
void reduce_into(const T* x, const ReductionPlan& plan, A* acc) {
  for_each_outer(plan, [&](int64_t input, int64_t output) {
    if (plan.inner == 1) {
      acc[output] = Op::combine(acc[output], reduce_contiguous<Op, A>(x + input, plan.count));
    } else {
      accumulate_rows<Op>(x + input, plan.count, plan.inner, acc + output);
    }
  });
}

// ------------------------------------------ sum, mean, prod, amax, amin

enum class ReduceKind { kSum, kMean, kProd, kMax, kMin };

std::string_view reduce_name(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kSum:
      return "sum";
    case ReduceKind::kMean:
      return "mean";
    case ReduceKind::kProd:
      return "prod";
    case ReduceKind::kMax:
      return "amax";
    case ReduceKind::kMin:
      return "amin";
  }
  return "sum";
}

// What a call reduces and into what, read once from its arguments so that
// inference, rule and kernel agree.
struct ReduceCall {
  std::vector<bool> reduced;
  bool keepdim = false;
  DType dtype = DType::kF32;
  Shape shape;
};

ReduceCall read_reduce_call(ReduceKind kind, const OpArgs& args, const TensorType& input) {
  const bool has_dtype = kind != ReduceKind::kMax && kind != ReduceKind::kMin;
  // The full reductions aten::sum(Tensor self, *, ScalarType? dtype) and
  // aten::mean(...) have no dim and no keepdim: every dim, not kept.
  const bool full = args.schema().argument_index("dim") < 0;
  const std::optional<std::vector<int64_t>> dims = full        ? std::nullopt
                                                   : has_dtype ? args.get_optional_int_list("dim")
                                                               : args.get_int_list("dim");
  if (!has_dtype && numel(input.shape) == 0) {
    check_reducible_when_empty(reduce_name(kind), *dims, input.shape);
  }
  ReduceCall call;
  call.reduced = reduced_dims(dims, input.rank());
  call.keepdim = !full && args.get_bool("keepdim");
  call.shape = reduced_shape(input.shape, call.reduced, call.keepdim);
  if (!has_dtype) {
    call.dtype = input.dtype;
    return call;
  }
  const bool dtype_given = !args.constant("dtype").is_none();
  if (dtype_given) {
    call.dtype = args.get_dtype("dtype");
  } else if ((kind == ReduceKind::kSum || kind == ReduceKind::kProd) && !is_floating(input.dtype)) {
    call.dtype = DType::kI64;  // integers and bools sum and multiply to i64, as in PyTorch
  } else {
    call.dtype = input.dtype;
  }
  if (kind == ReduceKind::kMean && !is_floating(call.dtype)) {
    throw Error(
        fmt::format("mean(): could not infer output dtype. {} dtype must be either a "
                    "floating point or complex dtype. Got: {}",
                    dtype_given ? "Optional" : "Input", scalar_type_name(call.dtype)));
  }
  return call;
}

// Sums (Op = SumOp, divided by the count for a mean) and products.
template <class Op>
DenseTensor accumulate_kernel(const DenseTensor& input, const ReduceCall& call, bool mean) {
  // PyTorch accumulates in the result dtype. Integers widen to i64 exactly, so they
  // are read as they are instead of through a cast copy.
  const bool widens = !is_floating(input.dtype()) && call.dtype == DType::kI64;
  const DenseTensor source = widens ? input : cast(input, call.dtype);
  const ReductionPlan plan = plan_reduction(source.shape(), call.reduced);
  const auto count = static_cast<double>(reduced_count(source.shape(), call.reduced));
  DenseTensor out = DenseTensor::empty(call.dtype, call.shape);
  visit_dtype(source.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // Floats accumulate in double; integers in uint64, which wraps like
    // PyTorch's integer sums and products without signed overflow.
    using A = std::conditional_t<std::is_floating_point_v<ComputeType<T>>, double, uint64_t>;
    std::vector<A> acc(static_cast<std::size_t>(out.numel()), Op::template identity<A>());
    if (source.numel() > 0) reduce_into<Op>(source.data_as<T>(), plan, acc.data());
    visit_dtype(call.dtype, [&](auto out_tag) {
      using O = decltype(out_tag);
      O* y = out.data_as<O>();
      for (int64_t i = 0; i < out.numel(); ++i) {
        const A value = acc[static_cast<std::size_t>(i)];
        if (!mean) {
          y[i] = store<O>(value);
        } else {
          // The mean of nothing is NaN, as in PyTorch.
          y[i] = store<O>(count > 0 ? static_cast<double>(value) / count : std::numeric_limits<double>::quiet_NaN());
        }
      }
    });
  });
  return out;
}

template <class Op>
DenseTensor extremum_kernel(const DenseTensor& input, const ReduceCall& call) {
  const ReductionPlan plan = plan_reduction(input.shape(), call.reduced);
  DenseTensor out = DenseTensor::empty(input.dtype(), call.shape);
  visit_dtype(input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = ComputeType<T>;
    std::vector<A> acc(static_cast<std::size_t>(out.numel()), Op::template identity<A>());
    if (input.numel() > 0) reduce_into<Op>(input.data_as<T>(), plan, acc.data());
    T* y = out.data_as<T>();
    for (int64_t i = 0; i < out.numel(); ++i) y[i] = store<T>(acc[static_cast<std::size_t>(i)]);
  });
  return out;
}

void add_reduction(OpRegistry& registry, std::string_view schema, ReduceKind kind) {
  OpDef def;
  def.family = OpFamily::kReduction;
  // A sum of partial sums is the partial sum of the sums; max is not linear.
  const bool sums = kind == ReduceKind::kSum || kind == ReduceKind::kMean;
  def.linearity = sums ? Linearity::kLinear : Linearity::kNone;
  def.averages = kind == ReduceKind::kMean;
  def.infer = [kind](const OpArgs& args, std::span<const TensorType> in) {
    const ReduceCall call = read_reduce_call(kind, args, in[0]);
    return std::vector<TensorType>{{call.dtype, call.shape}};
  };
  def.sharding_rule = [kind](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const ReduceCall call = read_reduce_call(kind, args, in[0]);
    const ReduceOp reduction = kind == ReduceKind::kMax   ? ReduceOp::kMax
                               : kind == ReduceKind::kMin ? ReduceOp::kMin
                                                          : ReduceOp::kSum;
    // No collective multiplies partial products: a product's dims are whole.
    const FactorKind reduced = kind == ReduceKind::kProd ? FactorKind::kNeedReplication : FactorKind::kReduction;
    return reduction_rule(call.reduced, call.keepdim, in, out, reduced, reduction);
  };
  def.kernel = [kind](const OpArgs& args, std::span<const DenseTensor> in) {
    const ReduceCall call = read_reduce_call(kind, args, {in[0].dtype(), in[0].shape()});
    switch (kind) {
      case ReduceKind::kSum:
        return std::vector<DenseTensor>{accumulate_kernel<SumOp>(in[0], call, false)};
      case ReduceKind::kMean:
        return std::vector<DenseTensor>{accumulate_kernel<SumOp>(in[0], call, true)};
      case ReduceKind::kProd:
        return std::vector<DenseTensor>{accumulate_kernel<ProductOp>(in[0], call, false)};
      case ReduceKind::kMax:
        return std::vector<DenseTensor>{extremum_kernel<MaxOp>(in[0], call)};
      case ReduceKind::kMin:
        return std::vector<DenseTensor>{extremum_kernel<MinOp>(in[0], call)};
    }
    return std::vector<DenseTensor>{};
  };
  registry.add(schema, std::move(def));
}

// ------------------------------------------------------------------ argmax

// argmax over one dim, or over the flattened tensor for dim=None.
struct ArgmaxCall {
  std::vector<bool> reduced;
  bool keepdim = false;
  Shape shape;
};

ArgmaxCall read_argmax_call(const OpArgs& args, const TensorType& input) {
  const std::optional<int64_t> dim = args.get_optional_int("dim");
  if (input.dtype == DType::kBool) throw Error("\"argmax_cpu\" not implemented for 'Bool'");
  ArgmaxCall call;
  if (dim) {
    const int64_t wrapped = wrap_dim(*dim, input.rank());
    if (input.rank() > 0 && input.shape[static_cast<std::size_t>(wrapped)] == 0) {
      throw Error(fmt::format("argmax(): Expected reduction dim {} to have non-zero size.", wrapped));
    }
    call.reduced = reduced_dims(std::vector<int64_t>{wrapped}, input.rank());
  } else {
    if (numel(input.shape) == 0) {
      throw Error("argmax(): Expected reduction dim to be specified for input.numel() == 0.");
    }
    call.reduced = reduced_dims(std::nullopt, input.rank());
  }
  call.keepdim = args.get_bool("keepdim");
  call.shape = reduced_shape(input.shape, call.reduced, call.keepdim);
  return call;
}

// True when `value` should replace `best`: larger, or the first NaN (NaN is
// the maximum for torch.argmax).
template <class C>
bool beats(C value, C best) {
  return value > best || (is_nan(value) && !is_nan(best));
}

DenseTensor argmax_kernel(const DenseTensor& input, const ArgmaxCall& call) {
  // The reduced dims (one, or all) are contiguous: [outer, count, inner].
  int64_t outer = 1, count = 1, inner = 1;
  bool seen_reduced = false;
  for (std::size_t d = 0; d < call.reduced.size(); ++d) {
    const int64_t extent = input.shape()[d];
    if (call.reduced[d]) {
      count *= extent;
      seen_reduced = true;
    } else {
      (seen_reduced ? inner : outer) *= extent;
    }
  }
  DenseTensor out = DenseTensor::empty(DType::kI64, call.shape);
  int64_t* y_base = out.data_as<int64_t>();
  visit_dtype(input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    std::vector<C> best(static_cast<std::size_t>(inner));
    for (int64_t o = 0; o < outer; ++o) {
      const T* x = input.data_as<T>() + o * count * inner;
      int64_t* y = y_base + o * inner;
      if (inner == 1) {
        // The (vectorised) maximum first, then its first position.
        const C top = reduce_contiguous<MaxOp, C>(x, count);
        int64_t at = 0;
        while (is_nan(top) ? !is_nan(load(x[at])) : load(x[at]) != top) ++at;
        y[0] = at;
        continue;
      }
      for (int64_t i = 0; i < inner; ++i) {
        best[static_cast<std::size_t>(i)] = load(x[i]);
        y[i] = 0;
      }
      for (int64_t r = 1; r < count; ++r) {
        const T* row = x + r * inner;
        for (int64_t i = 0; i < inner; ++i) {
          const C value = load(row[i]);
          C& current = best[static_cast<std::size_t>(i)];
          const bool take = beats(value, current);
          current = take ? value : current;
          y[i] = take ? r : y[i];
        }
      }
    }
  });
  return out;
}

void register_argmax(OpRegistry& registry) {
  OpDef def;
  def.family = OpFamily::kReduction;
  def.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    return std::vector<TensorType>{{DType::kI64, read_argmax_call(args, in[0]).shape}};
  };
  def.sharding_rule = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const ArgmaxCall call = read_argmax_call(args, in[0]);
    return reduction_rule(call.reduced, call.keepdim, in, out, FactorKind::kNeedReplication, ReduceOp::kSum);
  };
  def.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    const ArgmaxCall call = read_argmax_call(args, {in[0].dtype(), in[0].shape()});
    return std::vector<DenseTensor>{argmax_kernel(in[0], call)};
  };
  registry.add("aten::argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", std::move(def));
}

// -------------------------------------------------------------------- topk

// The k largest (or smallest) elements along one dim and their positions,
// largest first (sorted=False may give any order in PyTorch; this order is
// one of them). NaN counts as the largest value, as in PyTorch; among equal
// values the earlier position comes first.
struct TopkCall {
  int64_t k = 0;
  int64_t dim = 0;  // wrapped
  bool largest = true;
  Shape shape;  // of both results
};

TopkCall read_topk_call(const OpArgs& args, const TensorType& input) {
  TopkCall call;
  call.dim = wrap_dim(args.get_int("dim"), input.rank());
  call.k = args.get_int("k");
  call.largest = args.get_bool("largest");
  const int64_t size = input.rank() == 0 ? 1 : input.shape[static_cast<std::size_t>(call.dim)];
  if (call.k < 0 || call.k > size) throw Error("selected index k out of range");
  if (input.dtype == DType::kBool) throw Error("\"topk_cpu\" not implemented for 'Bool'");
  call.shape = input.shape;
  if (input.rank() > 0) call.shape[static_cast<std::size_t>(call.dim)] = call.k;
  return call;
}

std::vector<DenseTensor> topk_kernel(const DenseTensor& input, const TopkCall& call) {
  const Shape& shape = input.shape();
  int64_t outer = 1, inner = 1;
  const int64_t count = shape.empty() ? 1 : shape[static_cast<std::size_t>(call.dim)];
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < call.dim) outer *= shape[static_cast<std::size_t>(d)];
    if (d > call.dim) inner *= shape[static_cast<std::size_t>(d)];
  }
  DenseTensor values = DenseTensor::empty(input.dtype(), call.shape);
  DenseTensor indices = DenseTensor::empty(DType::kI64, call.shape);
  visit_dtype(input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* x = input.data_as<T>();
    T* v = values.data_as<T>();
    int64_t* ix = indices.data_as<int64_t>();
    std::vector<int64_t> order(static_cast<std::size_t>(count));
    const auto before = [&](C a, C b) {  // a ranks before b
      if (is_nan(a) || is_nan(b)) return is_nan(a) != is_nan(b) && (call.largest ? is_nan(a) : is_nan(b));
      return call.largest ? a > b : a < b;
    };
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const T* row = x + o * count * inner + i;
        for (int64_t r = 0; r < count; ++r) order[static_cast<std::size_t>(r)] = r;
        std::partial_sort(order.begin(), order.begin() + call.k, order.end(), [&](int64_t a, int64_t b) {
          const C va = load(row[a * inner]), vb = load(row[b * inner]);
          if (before(va, vb)) return true;
          if (before(vb, va)) return false;
          return a < b;
        });
        for (int64_t j = 0; j < call.k; ++j) {
          const int64_t at = (o * call.k + j) * inner + i;
          const int64_t r = order[static_cast<std::size_t>(j)];
          v[at] = row[r * inner];
          ix[at] = r;
        }
      }
    }
  });
  return {std::move(values), std::move(indices)};
}

void register_topk(OpRegistry& registry) {
  OpDef def;
  def.family = OpFamily::kReduction;
  def.infer = [](const OpArgs& args, std::span<const TensorType> in) {
    const TopkCall call = read_topk_call(args, in[0]);
    return std::vector<TensorType>{{in[0].dtype, call.shape}, {DType::kI64, call.shape}};
  };
  // The dim it selects along must be whole on each device; the others pass
  // through to both results.
  def.sharding_rule = [](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const TopkCall call = read_topk_call(args, in[0]);
    RuleBuilder builder(in, out);
    for (int d = 0; d < in[0].rank(); ++d) {
      const int64_t size = in[0].shape[static_cast<std::size_t>(d)];
      if (d == call.dim) {
        builder.add_factor({d}, {-1, -1}, size, FactorKind::kNeedReplication);
      } else {
        builder.add_factor({d}, {d, d}, size);
      }
    }
    return builder.build();
  };
  def.kernel = [](const OpArgs& args, std::span<const DenseTensor> in) {
    return topk_kernel(in[0], read_topk_call(args, {in[0].dtype(), in[0].shape()}));
  };
  registry.add(
      "aten::topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> "
      "(Tensor values, Tensor indices)",
      std::move(def));
}

// ------------------------------------------------------ softmax, log_softmax

struct SoftmaxCall {
  int64_t dim = 0;  // wrapped; 0 for a scalar
  DType dtype = DType::kF32;
};

SoftmaxCall read_softmax_call(const OpArgs& args, const TensorType& input, bool log) {
  SoftmaxCall call;
  call.dim = wrap_dim(args.get_int("dim"), input.rank());
  call.dtype = args.get_optional_dtype("dtype").value_or(input.dtype);
  if (!is_floating(call.dtype)) {
    // PyTorch's CPU kernels are chosen by whether the dim is the last one.
    const bool last = call.dim + 1 >= input.rank();
    throw Error(fmt::format("\"{}softmax_{}kernel_impl\" not implemented for '{}'", log ? "log_" : "",
                            last ? "lastdim_" : "", scalar_type_name(call.dtype)));
  }
  return call;
}

// exp that keeps NaN (exp_approx clamps it away): a NaN or an all -inf row
// stays NaN, as in PyTorch.
inline float exp_keeping_nan(float x) { return x != x ? x : exp_approx(x); }

// softmax(x) = exp(x - max) / sum(exp(x - max)); log_softmax(x) =
// (x - max) - log(sum(exp(x - max))). Computed in float, the sums in double.
DenseTensor softmax_kernel(const DenseTensor& in, const SoftmaxCall& call, bool log) {
  const DenseTensor input = cast(in, call.dtype);
  int64_t outer = 1, count = 1, inner = 1;
  for (int64_t d = 0; d < input.rank(); ++d) {
    const int64_t extent = input.shape()[static_cast<std::size_t>(d)];
    if (d < call.dim) outer *= extent;
    if (d == call.dim) count = extent;
    if (d > call.dim) inner *= extent;
  }
  DenseTensor out = DenseTensor::empty(call.dtype, input.shape());
  if (input.numel() == 0) return out;
  const auto block = static_cast<std::size_t>(count * inner);
  std::vector<float> shifted(block), exps(block);
  std::vector<float> row_max(static_cast<std::size_t>(inner));
  std::vector<double> row_sum(static_cast<std::size_t>(inner));
  std::vector<float> row_factor(static_cast<std::size_t>(inner));  // 1/sum, or log(sum)
  visit_dtype(call.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t o = 0; o < outer; ++o) {
      const T* x = input.data_as<T>() + o * count * inner;
      T* y = out.data_as<T>() + o * count * inner;
      float* s = shifted.data();
      float* e = exps.data();
      for (std::size_t j = 0; j < block; ++j) s[j] = static_cast<float>(load(x[j]));
      // Subtracting the row maximum keeps exp in range.
      if (inner == 1) {
        row_max[0] = reduce_contiguous<MaxOp, float>(s, count);
      } else {
        std::fill(row_max.begin(), row_max.end(), MaxOp::identity<float>());
        accumulate_rows<MaxOp>(s, count, inner, row_max.data());
      }
      for (int64_t r = 0; r < count; ++r) {
        float* row = s + r * inner;
        for (int64_t i = 0; i < inner; ++i) row[i] -= row_max[static_cast<std::size_t>(i)];
      }
      for (std::size_t j = 0; j < block; ++j) e[j] = exp_keeping_nan(s[j]);
      if (inner == 1) {
        row_sum[0] = reduce_contiguous<SumOp, double>(e, count);
      } else {
        std::fill(row_sum.begin(), row_sum.end(), 0.0);
        accumulate_rows<SumOp>(e, count, inner, row_sum.data());
      }
      // One scale (or shift) per row, applied with a multiply (or subtract).
      for (int64_t i = 0; i < inner; ++i) {
        const double sum = row_sum[static_cast<std::size_t>(i)];
        row_factor[static_cast<std::size_t>(i)] = static_cast<float>(log ? std::log(sum) : 1.0 / sum);
      }
      for (int64_t r = 0; r < count; ++r) {
        const float* source = (log ? s : e) + r * inner;
        T* target = y + r * inner;
        for (int64_t i = 0; i < inner; ++i) {
          const float factor = row_factor[static_cast<std::size_t>(i)];
          target[i] = store<T>(log ? source[i] - factor : source[i] * factor);
        }
      }
    }
  });
  return out;
}

void add_softmax(OpRegistry& registry, std::string_view schema, bool log) {
  OpDef def;
  def.family = OpFamily::kReduction;
  def.infer = [log](const OpArgs& args, std::span<const TensorType> in) {
    return std::vector<TensorType>{{read_softmax_call(args, in[0], log).dtype, in[0].shape}};
  };
  // Every dim pass-through except the softmax dim, which needs the whole row.
  def.sharding_rule = [log](const OpArgs& args, std::span<const TensorType> in, std::span<const TensorType> out) {
    const SoftmaxCall call = read_softmax_call(args, in[0], log);
    RuleBuilder builder(in, out);
    for (int64_t d = 0; d < in[0].rank(); ++d) {
      const int dim = static_cast<int>(d);
      builder.add_factor({dim}, {dim}, in[0].shape[static_cast<std::size_t>(d)],
                         d == call.dim ? FactorKind::kNeedReplication : FactorKind::kPassThrough);
    }
    return builder.build();
  };
  def.kernel = [log](const OpArgs& args, std::span<const DenseTensor> in) {
    const SoftmaxCall call = read_softmax_call(args, {in[0].dtype(), in[0].shape()}, log);
    return std::vector<DenseTensor>{softmax_kernel(in[0], call, log)};
  };
  registry.add(schema, std::move(def));
}

}  // namespace

void register_reduction_ops(OpRegistry& registry) {
  add_reduction(registry,
                "aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, "
                "ScalarType? dtype=None) -> Tensor",
                ReduceKind::kSum);
  add_reduction(registry,
                "aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, "
                "ScalarType? dtype=None) -> Tensor",
                ReduceKind::kMean);
  // The full reductions, which PyTorch's dispatcher picks for sum(x) and
  // mean(x) without a dim (AOTAutograd records them so).
  add_reduction(registry, "aten::sum(Tensor self, *, ScalarType? dtype=None) -> Tensor", ReduceKind::kSum);
  add_reduction(registry, "aten::mean(Tensor self, *, ScalarType? dtype=None) -> Tensor", ReduceKind::kMean);
  add_reduction(registry, "aten::prod(Tensor self, *, ScalarType? dtype=None) -> Tensor", ReduceKind::kProd);
  add_reduction(registry,
                "aten::prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
                ReduceKind::kProd);
  add_reduction(registry, "aten::amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor", ReduceKind::kMax);
  add_reduction(registry, "aten::amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor", ReduceKind::kMin);
  register_argmax(registry);
  register_topk(registry);
  add_softmax(registry, "aten::softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", false);
  add_softmax(registry, "aten::log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", true);
}

}  // namespace shardflow::ops
