// Helpers for op tests: call an op by name on DenseTensors through the same
// binding, inference and kernel path the rest of shardflow uses, checking on
// every call that inference agrees with the kernel's outputs and that the
// sharding rule covers every dim with factors of the right sizes.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "shardflow/ir/binding.h"
#include "shardflow/ops/ops.h"
#include "shardflow/tensor/dense_tensor.h"
#include "shardflow/tensor/gemm.h"

namespace shardflow::testing_util {

// An argument of run_op: a tensor, a list of tensors, or a constant; with an
// optional keyword.
struct TestArg {
  enum class Kind { kTensor, kTensorList, kConstant };
  Kind kind = Kind::kConstant;
  std::vector<DenseTensor> tensors;
  Constant constant;
  std::string keyword;

  TestArg(DenseTensor t) : kind(Kind::kTensor), tensors{std::move(t)} {}  // NOLINT
  TestArg(std::vector<DenseTensor> ts) : kind(Kind::kTensorList), tensors(std::move(ts)) {}  // NOLINT
  TestArg(Constant c) : constant(std::move(c)) {}  // NOLINT
  TestArg(int v) : constant(v) {}                  // NOLINT
  TestArg(int64_t v) : constant(v) {}              // NOLINT
  TestArg(double v) : constant(v) {}               // NOLINT
  TestArg(bool v) : constant(v) {}                 // NOLINT
  TestArg(const char* v) : constant(v) {}          // NOLINT
  TestArg(std::vector<int64_t> v) : constant(std::move(v)) {}  // NOLINT
  TestArg(const Shape& v) : constant(std::vector<int64_t>(v)) {}  // NOLINT
  TestArg(DType v) : constant(v) {}                // NOLINT
};

// Sets the process's kernel threads for a scope (tests run with
// OPENBLAS_NUM_THREADS=1, so split kernels need this to split).
using KernelThreads = ScopedKernelThreads;

inline TestArg kw(std::string name, TestArg arg) {
  arg.keyword = std::move(name);
  return arg;
}

struct OpRun {
  const OpDef* op = nullptr;
  std::vector<DenseTensor> outputs;
  std::vector<TensorType> inferred;
  OpShardingRule rule;
  // reinterprets_operand for this call: the interpreter and the executor
  // would skip the kernel and reuse the operand's buffer.
  bool reinterprets = false;
};

// Binds, infers, builds the sharding rule, runs the kernel; fails the test
// when inference and kernel disagree, the rule does not fit the shapes, or
// the op claims to reinterpret its operand while the kernel changes its bytes.
OpRun run_op(const std::string& name, const std::vector<TestArg>& args);

// The single output of run_op.
inline DenseTensor call(const std::string& name, const std::vector<TestArg>& args) {
  return run_op(name, args).outputs.at(0);
}

// A call that must fail: op, arguments, and a substring of its error's message.
struct ErrorRow {
  std::string op;
  std::vector<TestArg> args;
  std::string message;
};

// Fails the test for each row whose call does not throw a shardflow::Error
// whose message contains the row's message.
void expect_errors(const std::vector<ErrorRow>& rows);

// Random tensors: floats in [-2, 2), ints in [lo, hi), bools.
DenseTensor random_tensor(DType dtype, Shape shape, std::mt19937& rng, int64_t lo = -5,
                          int64_t hi = 5);
DenseTensor from_floats(const std::vector<float>& values, Shape shape);
DenseTensor from_ints(const std::vector<int64_t>& values, Shape shape, DType dtype = DType::kI64);

// Element i of any tensor, as a double.
double element(const DenseTensor& tensor, int64_t flat_index);
std::vector<double> to_doubles(const DenseTensor& tensor);

// |a - b| <= atol + rtol * |b| elementwise (NaNs must match), with a message
// naming the first mismatch.
::testing::AssertionResult all_close(const std::vector<double>& actual,
                                     const std::vector<double>& expected, double rtol = 1e-5,
                                     double atol = 1e-6);

}  // namespace shardflow::testing_util
