// MPI jobs launched with mpiexec, as a user launches them: `shardflow run`
// and `shardflow llama` with --backend mpi (the default under mpiexec) give
// the in-process results; a
// rank that throws, exits or stops joining collectives ends the job with a
// non-zero status and the error within 30 s, printed once when every rank
// has it; ranks started with different
// arguments, or too few ranks for the mesh, are told at start-up.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/cli_runner.h"

namespace {

struct JobResult : CliResult {
  double seconds = 0;
};

JobResult run(const std::string& command) {
  const auto started = std::chrono::steady_clock::now();
  JobResult result{run_command(command)};
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

// The environment of every job: OpenMPI refuses root without the two
// variables (CI runs as root); LeakSanitizer would report OpenMPI's own
// allocations at exit in the asan build.
const std::string kJobEnvironment =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 OPENBLAS_NUM_THREADS=1 ";

// mpiexec with `ranks` ranks (oversubscribed: more ranks than cores is fine
// for tests).
std::string mpiexec(int ranks) {
  return kJobEnvironment + SHARDFLOW_MPIEXEC + " -n " + std::to_string(ranks) + " --oversubscribe ";
}

const std::string kShardflow = SHARDFLOW_CLI;
const std::string kProbe = SHARDFLOW_MPI_PROBE;

std::string write(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(MpiJob, HealthyJobEndsWithStatus0) {
  const JobResult r = run(mpiexec(2) + kProbe + " none");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "ok\n");  // rank 0 only
}

TEST(MpiJob, RankThatThrowsEndsTheJobWithItsError) {
  const JobResult r = run(mpiexec(2) + kProbe + " throw");
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds, 30);
  EXPECT_NE(r.err.find("shardflow: rank 1 of 2: device 1: injected failure at round 5"), std::string::npos) << r.err;
}

TEST(MpiJob, RankThatExitsEndsTheJob) {
  const JobResult r = run(mpiexec(2) + kProbe + " exit");
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds, 30);
}

TEST(MpiJob, RankThatStopsJoiningIsReportedByTheWatchdog) {
  const JobResult r = run("SHARDFLOW_MPI_TIMEOUT=2 " + mpiexec(2) + kProbe + " skip");
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds, 30);
  EXPECT_NE(r.err.find("rank 0 of 2: waited 2 s in all_reduce over devices [0, 1]"), std::string::npos) << r.err;
}

const char* kMlp = R"IR(func @mlp(%x: f32[8,16], %w1: f32[16,64], %w2: f32[64,16]) -> (f32[8,16]) {
  %a = xla::dynamo_mark_sharding(%w1, [0, 1, 2, 3], "(2, 2)", "('data', 'model')", "(None, 'model')") : f32[16,64]
  %b = xla::dynamo_mark_sharding(%w2, [0, 1, 2, 3], "(2, 2)", "('data', 'model')", "('model', None)") : f32[64,16]
  %c = xla::dynamo_mark_sharding(%x, [0, 1, 2, 3], "(2, 2)", "('data', 'model')", "('data', None)") : f32[8,16]
  %h = aten::matmul(%c, %a) : f32[8,64]
  %g = aten::gelu(%h) : f32[8,64]
  %y = aten::matmul(%g, %b) : f32[8,16]
  return %y
}
)IR";

TEST(MpiJob, RunGivesTheInProcessOutputBitForBit) {
  const std::string path = write("mpi_mlp.ir", kMlp);
  const JobResult local = run(kJobEnvironment + kShardflow + " run " + path + " --check --format json");
  ASSERT_EQ(local.status, 0) << local.err;
  const JobResult mpi = run(mpiexec(4) + kShardflow + " run " + path + " --check --format json --backend mpi");
  EXPECT_EQ(mpi.status, 0) << mpi.err;
  EXPECT_EQ(mpi.out, local.out);  // same sums and values: the reductions run in the same order
}

TEST(MpiJob, LlamaTinyGivesTheInProcessTokens) {
  const std::string args = " llama --config tiny --mesh 2,1,2 --steps 12 --check --format json";
  const JobResult local = run(kJobEnvironment + kShardflow + args);
  ASSERT_EQ(local.status, 0) << local.err;
  const JobResult mpi = run(mpiexec(4) + kShardflow + args + " --backend mpi");
  ASSERT_EQ(mpi.status, 0) << mpi.err;
  const auto l = nlohmann::json::parse(local.out), m = nlohmann::json::parse(mpi.out);
  EXPECT_EQ(m["tokens"], l["tokens"]);
  EXPECT_EQ(m["collectives_per_decode_step"], l["collectives_per_decode_step"]);
  EXPECT_LT(m["max_abs_logit_diff"].get<double>(), 1e-4);
}

// Without --backend, mpirun's ranks are the devices (as xr.use_spmd()):
// before, each rank ran the whole job in process and printed it.
TEST(MpiJob, LlamaUnderMpirunRunsOneDevicePerRankByDefault) {
  const std::string args = " llama --config tiny --mesh 2,1,2 --steps 6 --format json";
  const JobResult local = run(kJobEnvironment + kShardflow + args);
  ASSERT_EQ(local.status, 0) << local.err;
  const JobResult mpi = run(mpiexec(4) + kShardflow + args);
  ASSERT_EQ(mpi.status, 0) << mpi.err;
  const auto m = nlohmann::json::parse(mpi.out);  // one document: rank 0 alone prints
  EXPECT_EQ(m["tokens"], nlohmann::json::parse(local.out)["tokens"]);
  // A mesh the ranks do not cover names the mpirun to use, where in process
  // it would have run.
  const JobResult too_few = run(mpiexec(2) + kShardflow + args);
  EXPECT_NE(too_few.status, 0);
  EXPECT_NE(too_few.err.find("mpirun -n 4"), std::string::npos) << too_few.err;
}

TEST(MpiJob, RanksStartedWithDifferentArgumentsAreToldAtStartUp) {
  const std::string base = " --oversubscribe " + kShardflow + " llama --config tiny --mesh 2,1,1 --backend mpi --steps ";
  const JobResult r = run(kJobEnvironment + SHARDFLOW_MPIEXEC + " -n 1" + base + "2 : -n 1" + base + "3");
  EXPECT_EQ(r.status, 1);
  EXPECT_LT(r.seconds, 30);
  EXPECT_NE(r.err.find("the MPI ranks were started differently: rank 0 runs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("but rank 1 runs"), std::string::npos) << r.err;
}

TEST(MpiJob, TooFewRanksForTheMeshIsAnError) {
  const JobResult r = run(mpiexec(2) + kShardflow + " llama --config tiny --mesh 2,1,2 --backend mpi --steps 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("the mesh (2, 1, 2) needs 4 device(s), but the MPI job has 2 rank(s): launch it with mpirun -n 4"),
            std::string::npos)
      << r.err;
}

// Bad input fails on every rank: the error is printed once (by rank 0),
// not once per rank.
TEST(MpiJob, AnErrorOfEveryRankIsPrintedOnce) {
  const std::string path = write("mpi_bad.ir", "func @f(%x: f32[4]) -> (f32[4]) {\n  %y = aten::nope(%x) : f32[4]\n"
                                               "  return %y\n}\n");
  const JobResult r = run(mpiexec(4) + kShardflow + " run " + path + " --backend mpi");
  EXPECT_EQ(r.status, 1);
  EXPECT_LT(r.seconds, 30);
  const std::string error = "unknown op 'aten::nope'";
  const std::size_t first = r.err.find(error);
  ASSERT_NE(first, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(error, first + 1), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("shardflow: rank 0 of 4: error: invalid IR at line 2"), std::string::npos) << r.err;
}

}  // namespace
