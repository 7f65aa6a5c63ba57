// `shardflow ir` and `shardflow run`: exit statuses, canonical printing, and
// the run summary contract (JSON: outputs with shape, dtype, sum, values_head).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace {

std::string write(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

const char* kModel = R"IR(func @model(%tokens: i64[2,3], %table: f32[10,4], %w: f32[4,4]) -> (f32[2,3,4], f32[2,3]) {
  %e = aten::embedding(%table, %tokens) : f32[2,3,4]
  %h = aten::matmul(%e, %w) : f32[2,3,4]
  %a = aten::gelu(%h, approximate="tanh") : f32[2,3,4]
  %s = aten::sum.dim_IntList(%a, [-1]) : f32[2,3]
  return %a, %s
}
)IR";

TEST(IrCli, PrintsCanonicalIr) {
  const std::string path = write("model.ir", kModel);
  const CliResult r = run_cli("ir " + path);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, kModel);
  // Non-canonical input (default written out, overload left out) prints canonical.
  const std::string loose = write("loose.ir",
      "func @f(%x: f32[2]) -> (f32[2]) {\n  %y = aten::add(%x, %x, alpha=1)   : f32[2]\n  return %y\n}\n");
  EXPECT_EQ(run_cli("ir " + loose).out,
            "func @f(%x: f32[2]) -> (f32[2]) {\n  %y = aten::add.Tensor(%x, %x) : f32[2]\n  return %y\n}\n");
}

TEST(IrCli, BadIrIsOneErrorLineWithStatus1) {
  const std::string path = write("bad.ir", "func @f(%x: f32[2]) -> (f32[2]) {\n  %y = aten::exp(%z) : f32[2]\n  return %y\n}\n");
  const CliResult r = run_cli("ir " + path);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "error: invalid IR at line 2, column 18: value %z is not defined before this use\n");
  EXPECT_EQ(run_cli("ir /nonexistent/file.ir").status, 1);
  const CliResult directory = run_cli("ir " + testing::TempDir());
  EXPECT_EQ(directory.status, 1);
  EXPECT_NE(directory.err.find("it is a directory"), std::string::npos) << directory.err;
  EXPECT_EQ(run_cli("ir").status, 2);  // usage
  // Input that is not text, or never ends, stops at once (it used to be read
  // until the memory ran out, or forever).
  for (const char* device : {"/dev/zero", "/dev/urandom"}) {
    const CliResult endless = run_cli(std::string("ir ") + device);
    EXPECT_EQ(endless.status, 1) << device;
    EXPECT_NE(endless.err.find("is not IR text: it has a NUL byte at offset"), std::string::npos) << endless.err;
  }
  // An error line is bounded and shows control bytes and bad UTF-8 escaped,
  // however long or strange the input it quotes.
  const std::string long_node = write("long.ir", "func @f(%x: f32[2]) -> (f32[2]) {\n  %y = aten::relu(%x, " +
                                                     std::string(200000, 'a') + "\x1b\xff) : f32[2]\n  return %y\n}\n");
  const CliResult long_error = run_cli("ir " + long_node);
  EXPECT_EQ(long_error.status, 1);
  EXPECT_LT(long_error.err.size(), 4200u);
  EXPECT_NE(long_error.err.find("more bytes)\n"), std::string::npos) << long_error.err.substr(0, 200);
  const std::string strange = write("strange.ir", "func @f(%x: f32[2]) -> (f32[2]) {\n  %y = aten::relu(%x) \x1b[31m\xff\n}\n");
  const CliResult strange_error = run_cli("ir " + strange);
  EXPECT_EQ(strange_error.status, 1);
  EXPECT_EQ(strange_error.err.find('\x1b'), std::string::npos) << strange_error.err;
  EXPECT_EQ(strange_error.err.find('\xff'), std::string::npos) << strange_error.err;
  // Arguments are checked when the graph is verified (ir, partition), not
  // first when it runs, with the node and its line.
  const std::string bogus = write("bogus.ir",
      "func @f(%x: f32[2]) -> (f32[2]) {\n  %y = aten::gelu(%x, approximate=\"bogus\") : f32[2]\n  return %y\n}\n");
  for (const char* command : {"ir ", "partition "}) {
    const CliResult gelu = run_cli(command + bogus);
    EXPECT_EQ(gelu.status, 1) << command;
    EXPECT_NE(gelu.err.find("at line 2: approximate argument must be either none or tanh."), std::string::npos)
        << command << gelu.err;
  }
}

TEST(IrCli, RunSummarisesEachOutputDeterministically) {
  const std::string path = write("run.ir", kModel);
  const CliResult r = run_cli("run " + path + " --seed 7 --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["outputs"].size(), 2u);
  EXPECT_EQ(j["outputs"][0]["shape"], nlohmann::json::parse("[2, 3, 4]"));
  EXPECT_EQ(j["outputs"][0]["dtype"], "f32");
  EXPECT_EQ(j["outputs"][0]["values_head"].size(), 8u);
  EXPECT_EQ(j["outputs"][1]["values_head"].size(), 6u);
  // The second output is the row sum of the first.
  double sum0 = j["outputs"][0]["sum"], sum1 = j["outputs"][1]["sum"];
  EXPECT_NEAR(sum0, sum1, 1e-3 * (1 + std::abs(sum0)));
  EXPECT_EQ(run_cli("run " + path + " --seed 7 --format json").out, r.out);  // same seed, same result
  EXPECT_NE(run_cli("run " + path + " --seed 8 --format json").out, r.out);
  const CliResult text = run_cli("run " + path);
  EXPECT_EQ(text.status, 0);
  EXPECT_NE(text.out.find("output 1 (%s): f32[2,3]"), std::string::npos) << text.out;
}

const char* kMlp = R"IR(func @mlp(%x: f32[8,16], %w1: f32[16,64], %w2: f32[64,16]) -> (f32[8,16]) {
  %a = xla::dynamo_mark_sharding(%w1, [0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('data', 'model')", "(None, 'model')") : f32[16,64]
  %b = xla::dynamo_mark_sharding(%w2, [0, 1, 2, 3, 4, 5, 6, 7], "(2, 4)", "('data', 'model')", "('model', None)") : f32[64,16]
  %h = aten::matmul(%x, %a) : f32[8,64]
  %g = aten::gelu(%h) : f32[8,64]
  %y = aten::matmul(%g, %b) : f32[8,16]
  return %y
}
)IR";

TEST(IrCli, DevicesMustMatchTheAnnotationsMesh) {
  const std::string path = write("devices.ir", kMlp);
  const CliResult r = run_cli("run " + path + " --devices 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("run it with --devices 8 (got --devices 4)"), std::string::npos) << r.err;
  EXPECT_EQ(run_cli("run " + write("one.ir", kModel) + " --devices 2").status, 1);  // no annotations: 1 device
}

TEST(IrCli, PartitionJsonListsShardingsAndCollectives) {
  const std::string path = write("mlp.ir", kMlp);
  const CliResult r = run_cli("partition " + path + " --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["values"]["%h"]["sharding"], "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}");
  EXPECT_EQ(j["values"]["%h"]["readable"], "f32[8,64@model]");
  ASSERT_EQ(j["collectives"].size(), 1u);
  const auto& c = j["collectives"][0];
  EXPECT_EQ(c["kind"], "all-reduce");
  EXPECT_EQ(c["axes"], nlohmann::json::parse(R"(["model"])"));
  EXPECT_EQ(c["bytes_per_device"], 8 * 16 * 4);
  EXPECT_EQ(c["value"], "%y");
  EXPECT_EQ(c["reason"], "%y aten::matmul contracts dim 1, sharded on 'model' by the annotation at %a through "
                         "%h aten::matmul, %g aten::gelu; output 0 needs whole values");
  EXPECT_EQ(j["warnings"].size(), 0u);
  const CliResult text = run_cli("partition " + path);
  EXPECT_NE(text.out.find("1 collective(s); 1 all-reduce (512 bytes/device)"), std::string::npos) << text.out;
  EXPECT_EQ(run_cli("partition " + path + " --devices 2").status, 1);
}

// --profile: the run's ops per kind on the first device, the program's one
// all-reduce among them.
TEST(IrCli, RunProfileListsTheProgramsOps) {
  const std::string path = write("profile.ir", kMlp);
  const CliResult r = run_cli("run " + path + " --profile --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("profile")) << r.out;
  EXPECT_EQ(j["profile"]["device"], 0);
  EXPECT_EQ(j["profile"]["calls"], 1);
  std::map<std::string, double> calls;
  for (const auto& op : j["profile"]["ops"]) calls[op["op"].get<std::string>()] = op["calls_per_call"].get<double>();
  EXPECT_EQ(calls["aten::matmul"], 2);
  EXPECT_EQ(calls["aten::gelu"], 1);
  EXPECT_EQ(calls["all-reduce"], 1);
  const CliResult text = run_cli("run " + path + " --profile");
  EXPECT_NE(text.out.find("run profile, device 0:"), std::string::npos) << text.out;
  EXPECT_FALSE(nlohmann::json::parse(run_cli("run " + path + " --format json").out).contains("profile"));
}

TEST(IrCli, RunChecksAgainstOneDevice) {
  const std::string path = write("check.ir", kMlp);
  const CliResult r = run_cli("run " + path + " --devices 8 --check --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_LT(j["max_abs_diff"].get<double>(), 1e-3);
  EXPECT_TRUE(j.contains("max_rel_diff"));
  EXPECT_EQ(j["outputs"][0]["shape"], nlohmann::json::parse("[8, 16]"));
  const CliResult text = run_cli("run " + path + " --check");
  EXPECT_NE(text.out.find("within tolerance"), std::string::npos) << text.out;
}

// Partial sums that overflow to +inf and -inf on different devices add to
// NaN where one device gets +inf: the check fails, although the reference
// holds an infinity (which once made every difference tolerable). A
// division of a partial sum by zeros, or a product with inf, reduces first
// and matches.
TEST(IrCli, RunCheckComparesInfinitiesExactly) {
  const std::string overflow = write("overflow.ir", R"IR(func @f() -> (f32[6,4], f32[4]) {
  %p = aten::full([4, 4], 3e+38) : f32[4,4]
  %n = aten::full([2, 4], -3e+38) : f32[2,4]
  %c = aten::cat([%p, %n], 0) : f32[6,4]
  %a = xla::dynamo_mark_sharding(%c, [0, 1, 2], "(3,)", "('x',)", "('x', None)") : f32[6,4]
  %s = aten::sum.dim_IntList(%a, [0]) : f32[4]
  return %a, %s
}
)IR");
  const CliResult r = run_cli("run " + overflow + " --check");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("max rel diff inf (OUT OF TOLERANCE)"), std::string::npos) << r.out;
  // The error names the output and element over its tolerance.
  EXPECT_NE(r.err.find("error: output 1 (%s) of the 3-device result differs from the one-device result: element 0 "
                       "is "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("nan, expected inf (difference inf"), std::string::npos) << r.err;
  const std::string divide = write("divide.ir", R"IR(func @f(%x: f32[8,8], %w: f32[8,8]) -> (f32[8,8]) {
  %a = xla::dynamo_mark_sharding(%x, [0, 1, 2, 3], "(4,)", "('model',)", "(None, 'model')") : f32[8,8]
  %b = xla::dynamo_mark_sharding(%w, [0, 1, 2, 3], "(4,)", "('model',)", "('model', None)") : f32[8,8]
  %m = aten::matmul(%a, %b) : f32[8,8]
  %z = aten::sub.Tensor(%x, %x) : f32[8,8]
  %r = aten::div.Tensor(%m, %z) : f32[8,8]
  return %r
}
)IR");
  const CliResult d = run_cli("run " + divide + " --check --format json");
  ASSERT_EQ(d.status, 0) << d.err << d.out;
  EXPECT_EQ(nlohmann::json::parse(d.out)["max_abs_diff"].get<double>(), 0.0);
  // Likewise a product with an infinite number.
  std::string infinite = R"IR(func @f(%x: f32[8,8], %w: f32[8,8]) -> (f32[8,8]) {
  %a = xla::dynamo_mark_sharding(%x, [0, 1, 2, 3], "(4,)", "('model',)", "(None, 'model')") : f32[8,8]
  %b = xla::dynamo_mark_sharding(%w, [0, 1, 2, 3], "(4,)", "('model',)", "('model', None)") : f32[8,8]
  %m = aten::matmul(%a, %b) : f32[8,8]
  %r = aten::mul.Scalar(%m, inf) : f32[8,8]
  return %r
}
)IR";
  const CliResult i = run_cli("run " + write("infinite.ir", infinite) + " --check --format json");
  ASSERT_EQ(i.status, 0) << i.err << i.out;
  EXPECT_EQ(nlohmann::json::parse(i.out)["max_abs_diff"].get<double>(), 0.0);
}

// Token ids that reach embedding through an annotation are drawn within the
// table; 16-bit outputs are compared at their own precision; shapes beyond
// int64 or memory are one error line, not a crash.
TEST(IrCli, RunInputsTolerancesAndHugeShapes) {
  const std::string embed = write("embed.ir", R"IR(func @f(%w: f32[10,6], %i: i64[7]) -> (f32[7,6]) {
  %0 = xla::dynamo_mark_sharding(%w, [0, 1, 2, 3], "(2, 2)", "('a', 'b')", "('a', 'b')") : f32[10,6]
  %1 = xla::dynamo_mark_sharding(%i, [0, 1, 2, 3], "(2, 2)", "('a', 'b')", "('b',)") : i64[7]
  %2 = aten::embedding(%0, %1) : f32[7,6]
  return %2
}
)IR");
  const CliResult ids = run_cli("run " + embed + " --check");
  EXPECT_EQ(ids.status, 0) << ids.err;
  const std::string bf16 = write("bf16.ir", R"IR(func @f(%x: bf16[4,64], %w: bf16[64,4]) -> (bf16[4,4]) {
  %0 = xla::dynamo_mark_sharding(%x, [0, 1, 2, 3], "(4,)", "('x',)", "(None, 'x')") : bf16[4,64]
  %1 = xla::dynamo_mark_sharding(%w, [0, 1, 2, 3], "(4,)", "('x',)", "('x', None)") : bf16[64,4]
  %2 = aten::matmul(%0, %1) : bf16[4,4]
  return %2
}
)IR");
  const CliResult half = run_cli("run " + bf16 + " --check");
  EXPECT_EQ(half.status, 0) << half.err << half.out;
  // An f32 output computed through bf16 partial sums keeps their rounding.
  const std::string widened = write("widened.ir", R"IR(func @f(%x: bf16[2,4], %w: bf16[4,3]) -> (f32[3], bf16[2,3]) {
  %xa = xla::dynamo_mark_sharding(%x, [1, 0], "(2,)", "('y',)", "(None, 'y')") : bf16[2,4]
  %wa = xla::dynamo_mark_sharding(%w, [1, 0], "(2,)", "('y',)", "('y', None)") : bf16[4,3]
  %p = aten::matmul(%xa, %wa) : bf16[2,3]
  %u1 = aten::sum.dim_IntList(%p, [0], false, dtype=f32) : f32[3]
  %u2 = aten::relu(%p) : bf16[2,3]
  return %u1, %u2
}
)IR");
  const CliResult wide = run_cli("run " + widened + " --check --seed 99");
  EXPECT_EQ(wide.status, 0) << wide.err << wide.out;
  const std::pair<const char*, const char*> huge[] = {
      {"f32[9223372036854775807]", "2^63 bytes or more"},
      {"f32[4294967296,4294967296]", "has more elements than a 64-bit count holds"},
  };
  for (const auto& [type, message] : huge) {
    const std::string path = write("huge.ir", std::string("func @f(%x: ") + type + ") -> (" + type +
                                                  ") {\n  %0 = aten::relu(%x) : " + type + "\n  return %0\n}\n");
    const CliResult r = run_cli("run " + path);
    EXPECT_EQ(r.status, 1) << type << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << type << ": " << r.err;
  }
}

}  // namespace

// ONEDNN_MAX_CPU_ISA limiting the matrix kernels below the CPU's: said once
// on stderr, with the fix; the command still runs. Unlimited, nothing is
// said: oneDNN picks its kernels by the CPU's instruction sets.
TEST(IrCli, NarrowMatrixKernelsForcedByTheEnvironmentAreNamed) {
  const CliResult forced = run_command("ONEDNN_MAX_CPU_ISA=SSE41 " + std::string(SHARDFLOW_CLI) +
                                       " sharding --mesh-shape 2 --spec '(0,)' --format v1");
  EXPECT_EQ(forced.status, 0);
  EXPECT_EQ(forced.out, "{devices=[2]0,1}\n");
  if (__builtin_cpu_supports("avx2")) {
    EXPECT_EQ(forced.err,
              std::string("note: ONEDNN_MAX_CPU_ISA=SSE41 limits oneDNN to its SSE kernels on this ") +
                  (__builtin_cpu_supports("avx512bw") ? "AVX-512" : "AVX2") +
                  " CPU: matrix products run slower than they could. Unset ONEDNN_MAX_CPU_ISA.\n");
  }
  const CliResult plain = run_command("env -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA " + std::string(SHARDFLOW_CLI) +
                                      " sharding --mesh-shape 2 --spec '(0,)' --format v1");
  EXPECT_EQ(plain.status, 0);
  EXPECT_EQ(plain.out, "{devices=[2]0,1}\n");
  EXPECT_EQ(plain.err, "");
}
