// The `shardflow sharding` contract that scripts rely on: output formats,
// exit statuses (0 ok, 1 invalid input, 2 usage) and one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"

namespace {

using Result = CliResult;
Result run(const std::string& args) { return run_cli(args); }

TEST(ShardingCli, V1AndV2AreOneLineEach) {
  Result v1 = run("sharding --mesh-shape 2,4 --spec '(None, 1)' --format v1");
  EXPECT_EQ(v1.status, 0) << v1.err;
  EXPECT_EQ(v1.out, "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}\n");
  Result v2 = run("sharding --mesh-shape 2,4 --spec '(None, 1)' --format v2");
  EXPECT_EQ(v2.out, "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}\n");
  Result named = run("sharding --mesh-shape 1,2,4 --axis-names r,b,m "
                     "--spec \"(('r', 'b'), None)\" --format v1");
  EXPECT_EQ(named.out, "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}\n");
  Result custom = run("sharding --mesh-shape 1,8 --device-ids 7,6,5,4,3,2,1,0 --spec '(0, 1)' "
                      "--format v1");
  EXPECT_EQ(custom.out, "{devices=[1,8]7,6,5,4,3,2,1,0}\n");
}

TEST(ShardingCli, JsonHasTheContractFields) {
  Result r = run("sharding --mesh-shape 8 --axis-names data --spec \"('data',)\" --shape 9 "
                 "--format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["v1"], "{devices=[8]0,1,2,3,4,5,6,7}");
  EXPECT_EQ(j["v2"], "{devices=[8]<=[8]}");
  EXPECT_EQ(j["type"], "TILED");
  EXPECT_EQ(j["readable"], "[9@data]");
  EXPECT_EQ(j["shard_shape"], nlohmann::json::array({2}));
  ASSERT_EQ(j["shards"].size(), 8u);
  for (int device = 0; device < 8; ++device) {
    const auto& shard = j["shards"][static_cast<std::size_t>(device)];
    EXPECT_EQ(shard["device"], device);
    EXPECT_EQ(shard["replica_id"], 0);
  }
  EXPECT_EQ(j["shards"][4]["slices"], nlohmann::json::parse("[[8, 9]]"));
  EXPECT_EQ(j["shards"][7]["slices"], nlohmann::json::parse("[[9, 9]]"));
  // Without --shape there is no layout.
  Result no_shape = run("sharding --mesh-shape 2,4 --spec '(0, None)' --format json");
  const nlohmann::json k = nlohmann::json::parse(no_shape.out);
  EXPECT_EQ(k["type"], "PARTIAL");
  EXPECT_FALSE(k.contains("shards"));
}

// `type` is what PyTorch/XLA's `sharding_type` reports: read off the final
// sharding, not the spec's None pattern.
TEST(ShardingCli, TypeFollowsTheFinalSharding) {
  const auto type_and_v1 = [](const std::string& args) {
    const nlohmann::json j = nlohmann::json::parse(run("sharding " + args + " --format json").out);
    return j["type"].get<std::string>() + " " + j["v1"].get<std::string>();
  };
  EXPECT_EQ(type_and_v1("--mesh-shape 2,1 --spec '(None, 1)'"), "REPLICATED {replicated}");
  EXPECT_EQ(type_and_v1("--mesh-shape 1 --spec '(0,)'"), "REPLICATED {replicated}");
  EXPECT_EQ(type_and_v1("--mesh-shape 2,4 --spec '(None, 0, 1)'"), "TILED {devices=[1,2,4]0,1,2,3,4,5,6,7}");
  EXPECT_EQ(type_and_v1("--mesh-shape 2,4 --spec '(None, 1)'"),
            "PARTIAL {devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}");
}

TEST(ShardingCli, JsonReplicaIdsOfPartialAndReplicated) {
  const nlohmann::json partial = nlohmann::json::parse(
      run("sharding --mesh-shape 4,2 --spec '(None, 1)' --shape 16,16 --format json").out);
  for (int device = 0; device < 8; ++device) {
    EXPECT_EQ(partial["shards"][static_cast<std::size_t>(device)]["replica_id"], device / 2);
  }
  const nlohmann::json replicated = nlohmann::json::parse(
      run("sharding --mesh-shape 8 --spec '(None,)' --shape 8 --format json").out);
  EXPECT_EQ(replicated["type"], "REPLICATED");
  EXPECT_EQ(replicated["shards"][5]["replica_id"], 5);
  EXPECT_EQ(replicated["shards"][5]["slices"], nlohmann::json::parse("[[0, 8]]"));
}

// Sizes near 2^63: the padded tiles run past the largest int64, but the
// printed layout does not wrap around.
TEST(ShardingCli, DimsNearTheLargestInt64) {
  Result r = run("sharding --mesh-shape 8 --spec '(0,)' --shape 9223372036854775801 --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["shard_shape"], nlohmann::json::parse("[1152921504606846976]"));
  EXPECT_EQ(j["shards"][7]["slices"], nlohmann::json::parse("[[8070450532247928832, 9223372036854775801]]"));
  Result text = run("sharding --mesh-shape 3 --spec '(0,)' --shape 9223372036854775807");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("3074457345618258603"), std::string::npos) << text.out;
  for (std::size_t at = text.out.find('-'); at != std::string::npos; at = text.out.find('-', at + 1)) {
    EXPECT_FALSE(at + 1 < text.out.size() && std::isdigit(static_cast<unsigned char>(text.out[at + 1])))
        << "a negative number in\n" << text.out;
  }
}

// Where numpy's text of 1000 ids would wrap, the one error line keeps the
// elements' padding: the same spacing throughout.
TEST(ShardingCli, LongIdListsKeepNumpyPaddingOnOneLine) {
  std::string ids, expected = "[";
  for (int id = 0; id < 1000; ++id) {
    const int value = id == 999 ? 0 : id;
    ids += (id ? "," : "") + std::to_string(value);
    const std::string word = std::to_string(value);
    expected += (id ? " " : "") + std::string(3 - word.size(), ' ') + word;
  }
  expected += "]";
  Result r = run("sharding --mesh-shape 1000 --device-ids " + ids + " --spec '(0,)'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "error: Device IDs must be unique, got: " + expected + "\n");
}

TEST(ShardingCli, TextShowsStringsTypeAndPicture) {
  Result r = run("sharding --mesh-shape 2,2,2 --spec '(0, 1, 2)' --shape 4,4,6");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("v1        {devices=[2,2,2]0,1,2,3,4,5,6,7}"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("v2        {devices=[2,2,2]<=[8]}"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("type      TILED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dim 2 [3:6]:"), std::string::npos) << r.out;  // rank 3 drawn
}

TEST(ShardingCli, NumDevicesMustBeCoveredByTheMesh) {
  Result r = run("sharding --mesh-shape 2,4 --spec '(0, None)' --num-devices 16");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "error: Number of device IDs (8) must match the global number of devices (16)\n");
  EXPECT_EQ(run("sharding --mesh-shape 2,4 --spec '(0, None)' --num-devices 8 --format v1").status, 0);
}

struct ErrorCase {
  const char* args;
  int status;
  const char* stderr_text;  // the whole stderr, or a prefix when it ends in "..."
};

TEST(ShardingCli, InvalidInputIsOneErrorLine) {
  const ErrorCase cases[] = {
      {"--mesh-shape 2,4 --spec '(0, 0)'", 1,
       "error: Each device mesh dimension should appear at most once in partition_spec (0, 0).\n"},
      {"--mesh-shape 2,4 --spec '(0, 2)'", 1,
       "error: partition_spec ((0, 2)) contains out of bound index into mesh_shape.\n"},
      {"--mesh-shape 2,4 --spec '(0,)' --shape 2,4", 1,
       "error: Partition spec length (1) should be equal to the input rank (2).\n"},
      {"--mesh-shape 2,4 --axis-names x,y --spec \"('z', None)\"", 1,
       "error: Axis name z is not defined in the given mesh\n"},
      {"--mesh-shape 2,4 --spec \"('x', None)\"", 1,
       "error: argument of type 'NoneType' is not iterable\n"},
      {"--mesh-shape 1,8 --axis-names data,model,extra --spec '(0, 1)'", 1,
       "error: Number of axis names (3) must match mesh dimensions (2)\n"},
      {"--mesh-shape 2,4 --device-ids 0,1,2,3,4,5,6,6 --spec '(0, 1)'", 1,
       "error: Device IDs must be unique, got: [0 1 2 3 4 5 6 6]\n"},
      {"--mesh-shape 2,4 --spec '(0, None'", 1, "error: invalid Python literal ..."},
      // The numpy text of 32 ids wraps; the error stays on one line.
      {"--mesh-shape 32 --device-ids 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,"
       "23,24,25,26,27,28,29,30,30 --spec '(0,)'", 1,
       "error: Device IDs must be unique, got: [ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 "
       "16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 30]\n"},
      // Usage errors: exit status 2.
      {"--spec '(0,)'", 2, "error: ..."},
      {"--mesh-shape 2,x --spec '(0, 1)'", 2, "error: --mesh-shape: expected ..."},
      {"--mesh-shape 2,4 --spec '(0, 1)' --format yaml", 2, "error: ..."},
      {"--mesh-shape 2,4 --spec '(0, 1)' --bogus", 2, "error: ..."},
      // Not clamped to the largest int64.
      {"--mesh-shape 2,4 --spec '(0, 1)' --num-devices 99999999999999999999", 2,
       "error: --num-devices: '99999999999999999999' is outside the range of a 64-bit integer..."},
  };
  for (const ErrorCase& c : cases) {
    Result r = run(std::string("sharding ") + c.args);
    EXPECT_EQ(r.status, c.status) << c.args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << "\n" << r.out;
    const std::string expected = c.stderr_text;
    if (expected.ends_with("...")) {
      EXPECT_TRUE(r.err.starts_with(expected.substr(0, expected.size() - 3))) << c.args << "\n" << r.err;
    } else {
      EXPECT_EQ(r.err, expected) << c.args;
    }
    if (c.status == 1) {
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
  }
}

}  // namespace
