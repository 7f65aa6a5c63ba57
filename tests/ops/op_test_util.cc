#include "op_test_util.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "shardflow/base/error.h"

namespace shardflow::testing_util {

OpRun run_op(const std::string& name, const std::vector<TestArg>& args) {
  ops::register_all_ops();
  std::vector<CallArg> call_args;
  std::vector<DenseTensor> tensors;
  std::vector<TensorType> types;
  for (const TestArg& arg : args) {
    if (arg.kind == TestArg::Kind::kConstant) {
      call_args.push_back(CallArg::constant_arg(arg.constant, arg.keyword));
      continue;
    }
    std::vector<int> indices;
    for (const DenseTensor& t : arg.tensors) {
      indices.push_back(static_cast<int>(tensors.size()));
      tensors.push_back(t);
      types.push_back({t.dtype(), t.shape()});
    }
    call_args.push_back(arg.kind == TestArg::Kind::kTensor
                            ? CallArg::tensor_arg(indices[0], arg.keyword)
                            : CallArg::tensor_list_arg(indices, arg.keyword));
  }
  auto [op, bound] = resolve_call(name, call_args, types);
  OpRun run;
  run.op = op;
  run.inferred = op->infer(bound, types);
  run.rule = op->sharding_rule(bound, types, run.inferred);
  run.outputs = op->kernel(bound, tensors);
  run.reinterprets = reinterprets_operand(*op, bound, types, run.inferred);
  if (run.reinterprets && run.outputs.size() == 1) {
    const DenseTensor& in = tensors.at(0);
    const DenseTensor& out = run.outputs[0];
    EXPECT_TRUE(out.nbytes() == in.nbytes() && std::memcmp(out.data(), in.data(), in.nbytes()) == 0)
        << op->full_name() << " on " << shape_to_string(in.shape())
        << ": the op says it keeps its operand's element order, but the kernel's bytes differ";
  }
  EXPECT_EQ(run.outputs.size(), run.inferred.size()) << op->full_name();
  for (std::size_t i = 0; i < run.outputs.size() && i < run.inferred.size(); ++i) {
    EXPECT_EQ((TensorType{run.outputs[i].dtype(), run.outputs[i].shape()}), run.inferred[i])
        << op->full_name() << " output " << i << ": kernel vs inference";
  }
  // The rule maps every dim of every operand and result to factors whose
  // sizes multiply to the dim's extent.
  EXPECT_EQ(run.rule.operands.size(), types.size()) << op->full_name() << " " << run.rule.to_string();
  EXPECT_EQ(run.rule.results.size(), run.inferred.size()) << op->full_name();
  const auto check_tensor = [&](const DimFactors& dims, const TensorType& type, const char* what) {
    EXPECT_EQ(dims.size(), type.shape.size()) << run.op->full_name() << " " << what << " " << run.rule.to_string();
    for (std::size_t d = 0; d < dims.size() && d < type.shape.size(); ++d) {
      int64_t size = 1;
      for (int f : dims[d]) size *= run.rule.factors.at(static_cast<std::size_t>(f)).size;
      EXPECT_FALSE(dims[d].empty()) << run.op->full_name() << " " << what << " dim " << d;
      EXPECT_EQ(size, type.shape[d]) << run.op->full_name() << " " << what << " dim " << d << ": "
                                     << run.rule.to_string();
    }
  };
  for (std::size_t i = 0; i < run.rule.operands.size() && i < types.size(); ++i) {
    check_tensor(run.rule.operands[i], types[i], "operand");
  }
  for (std::size_t i = 0; i < run.rule.results.size() && i < run.inferred.size(); ++i) {
    check_tensor(run.rule.results[i], run.inferred[i], "result");
  }
  return run;
}

void expect_errors(const std::vector<ErrorRow>& rows) {
  for (const ErrorRow& row : rows) {
    try {
      call(row.op, row.args);
      ADD_FAILURE() << row.op << ": no error, expected an error containing \"" << row.message << "\"";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(row.message), std::string::npos)
          << row.op << ": got \"" << error.what() << "\", expected an error containing \"" << row.message
          << "\"";
    }
  }
}

DenseTensor random_tensor(DType dtype, Shape shape, std::mt19937& rng, int64_t lo, int64_t hi) {
  DenseTensor tensor = DenseTensor::empty(dtype, std::move(shape));
  std::uniform_real_distribution<float> real(-2.0f, 2.0f);
  std::uniform_int_distribution<int64_t> integer(lo, hi - 1);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* data = tensor.data_as<T>();
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      if constexpr (std::is_same_v<T, bool>) {
        data[i] = integer(rng) % 2 == 0;
      } else if constexpr (std::is_integral_v<T>) {
        data[i] = static_cast<T>(integer(rng));
      } else {
        data[i] = store<T>(real(rng));
      }
    }
  });
  return tensor;
}

DenseTensor from_floats(const std::vector<float>& values, Shape shape) {
  DenseTensor tensor = DenseTensor::empty(DType::kF32, std::move(shape));
  std::copy(values.begin(), values.end(), tensor.data_as<float>());
  return tensor;
}

DenseTensor from_ints(const std::vector<int64_t>& values, Shape shape, DType dtype) {
  DenseTensor tensor = DenseTensor::empty(dtype, std::move(shape));
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < values.size(); ++i) tensor.data_as<T>()[i] = store<T>(values[i]);
  });
  return tensor;
}

double element(const DenseTensor& tensor, int64_t flat_index) {
  double value = 0;
  visit_dtype(tensor.dtype(), [&](auto tag) {
    using T = decltype(tag);
    value = static_cast<double>(load(tensor.data_as<T>()[flat_index]));
  });
  return value;
}

std::vector<double> to_doubles(const DenseTensor& tensor) {
  std::vector<double> values;
  for (int64_t i = 0; i < tensor.numel(); ++i) values.push_back(element(tensor, i));
  return values;
}

::testing::AssertionResult all_close(const std::vector<double>& actual,
                                     const std::vector<double>& expected, double rtol, double atol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (std::isnan(a) && std::isnan(e)) continue;
    if (std::isinf(e) && a == e) continue;
    if (!(std::abs(a - e) <= atol + rtol * std::abs(e))) {
      return ::testing::AssertionFailure()
             << fmt::format("element {}: got {}, expected {} (rtol {}, atol {})", i, a, e, rtol, atol);
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace shardflow::testing_util
