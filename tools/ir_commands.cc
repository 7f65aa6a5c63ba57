// `shardflow ir FILE` and `shardflow run FILE`.
#include <fmt/format.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_set>

#include "cli_util.h"
#include "commands.h"
#include "profile_report.h"
#include "shardflow/base/error.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/ops.h"
#include "shardflow/partition/program.h"
#include "shardflow/propagation/propagation.h"
#include "shardflow/runtime/check.h"
#include "shardflow/runtime/executor.h"
#include "shardflow/runtime/runtime.h"
#include "shardflow/trace/interpreter.h"
#include "shardflow/trace/ops.h"

namespace shardflow::cli {

// IR text far larger than any graph's (a 100k-node graph is 4 MB): reading
// stops there, so /dev/zero or a wrong file cannot fill the memory.
constexpr std::size_t kMaxIrBytes = std::size_t{256} << 20;

static std::string read_file(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) throw Error(fmt::format("cannot read '{}': it is a directory", path));
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error(fmt::format("cannot read '{}'", path));
  std::string text;
  std::array<char, 1 << 16> chunk{};
  while (file) {
    file.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const auto got = static_cast<std::size_t>(file.gcount());
    if (const void* nul = std::memchr(chunk.data(), '\0', got)) {
      throw Error(fmt::format("'{}' is not IR text: it has a NUL byte at offset {}", path,
                              text.size() + static_cast<std::size_t>(static_cast<const char*>(nul) - chunk.data())));
    }
    if (text.size() + got > kMaxIrBytes) {
      throw Error(fmt::format("'{}' is larger than {} MiB, the limit for IR text", path, kMaxIrBytes >> 20));
    }
    text.append(chunk.data(), got);
  }
  return text;
}

Graph load_graph(const std::string& path) {
  ops::register_all_ops();
  Graph graph = parse_graph(read_file(path));
  verify_graph(graph);
  return graph;
}

int run_ir_command(const IrOptions& options) {
  std::cout << print_graph(load_graph(options.file));
  return 0;
}

// The partitioned program of a graph, for the device count asked for (the
// size of the annotations' mesh; --devices must agree with it).
struct Partitioned {
  PropagationResult shardings;
  PartitionedProgram program;
};

static Partitioned partition_for(const Graph& graph, std::optional<int64_t> devices) {
  PropagationResult shardings = propagate_shardings(graph);
  const int64_t mesh_size = shardings.mesh()->size();
  if (devices && *devices != mesh_size) {
    throw Error(
        fmt::format("the graph's annotations use a mesh of {} device(s) ({}); run it with "
                    "--devices {} (got --devices {})",
                    mesh_size, shardings.mesh()->to_string(), mesh_size, *devices));
  }
  PartitionedProgram program = partition_graph(graph, shardings);
  return {std::move(shardings), std::move(program)};
}

static std::string axes_json_label(const Mesh& mesh, int axis) { return mesh.axis_label(axis); }

int run_partition_command(const PartitionOptions& options) {
  const Graph graph = load_graph(options.file);
  const Partitioned p = partition_for(graph, options.devices);
  const Mesh& mesh = *p.program.mesh;
  if (options.format == "json") {
    nlohmann::ordered_json values = nlohmann::ordered_json::object();
    const auto add = [&](const Value* value) {
      const Sharding& sharding = p.shardings.sharding(value);
      values["%" + value->name()] = {
          {"sharding", sharding.to_hlo_v1().to_string()},
          {"readable", sharding.to_readable(value->type().shape, dtype_name(value->type().dtype))}};
    };
    for (const Value* input : graph.inputs()) add(input);
    for (const auto& node : graph.nodes()) {
      for (const Value* output : node->outputs()) add(output);
    }
    nlohmann::ordered_json collectives = nlohmann::ordered_json::array();
    for (const CollectiveInfo& info : p.program.collectives) {
      std::vector<std::string> axes;
      for (int axis : info.axes) axes.push_back(axes_json_label(mesh, axis));
      collectives.push_back({{"kind", std::string(to_string(info.kind))},
                             {"axes", axes},
                             {"bytes_per_device", info.bytes_per_device},
                             {"value", "%" + info.value->name()},
                             {"reason", info.reason}});
    }
    std::cout << nlohmann::ordered_json{{"values", values},
                                        {"collectives", collectives},
                                        {"warnings", p.program.warnings}}
                     .dump()
              << "\n";
    return 0;
  }
  std::cout << print_with_shardings(graph, p.shardings) << "\n" << p.program.to_string(graph) << "\n";
  std::map<std::string, std::pair<int, int64_t>> totals;
  for (const CollectiveInfo& info : p.program.collectives) {
    std::cout << info.describe(mesh) << "\n";
    auto& [count, bytes] = totals[std::string(to_string(info.kind))];
    ++count;
    bytes += info.bytes_per_device;
  }
  std::cout << fmt::format("\n{} collective(s)", p.program.collectives.size());
  for (const auto& [kind, total] : totals) {
    std::cout << fmt::format("; {} {} ({} bytes/device)", total.first, kind, total.second);
  }
  std::cout << "\n";
  for (const std::string& warning : p.program.warnings) std::cout << "warning: " << warning << "\n";
  return 0;
}

int run_run_command(const RunOptions& options) {
  const Graph graph = load_graph(options.file);
  const Partitioned p = partition_for(graph, options.devices);
  const std::vector<DenseTensor> input_values = random_inputs(graph, options.seed);
  std::vector<Tensor> inputs;
  for (const DenseTensor& value : input_values) inputs.emplace_back(value);
  std::vector<Tensor> outputs;
  std::optional<Runtime> local;
  Runtime* runtime = mpi_runtime();
  check_mpi_ranks(p.program.mesh->size(), "the graph's mesh " + p.program.mesh->to_string());
  if (runtime == nullptr) runtime = &local.emplace(Runtime::local(p.program.mesh->size()));
  const auto profile = options.profile ? std::make_shared<OpProfile>() : nullptr;
  const auto started = std::chrono::steady_clock::now();
  outputs = run_program(p.program, *runtime, inputs, profile.get());
  if (profile)
    profile->add_function_call(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  const std::optional<ProfileReport> report = report_of(profile);
  std::optional<std::vector<DenseTensor>> reference;
  if (options.check) reference = run_graph(graph, input_values);
  nlohmann::ordered_json json_outputs = nlohmann::ordered_json::array();
  std::vector<std::vector<float>> output_values;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& output = outputs[i];
    const std::vector<float>& values = output_values.emplace_back(output.to_floats());
    double sum = 0;
    for (float v : values) sum += v;
    std::vector<double> head;
    for (std::size_t k = 0; k < values.size() && k < 8; ++k) head.push_back(values[k]);
    if (options.format == "json") {
      json_outputs.push_back({{"shape", output.shape()},
                              {"dtype", std::string(dtype_name(output.dtype()))},
                              {"sum", sum},
                              {"values_head", head}});
    } else {
      std::cout << fmt::format("output {} (%{}): {}{}  sum {:.6g}  values [{:.6g}]{}\n", i, graph.outputs()[i]->name(),
                               dtype_name(output.dtype()), shape_to_string(output.shape()), sum, fmt::join(head, ", "),
                               values.size() > head.size() ? " ..." : "");
    }
  }
  std::optional<CheckResult> check;
  if (reference) {
    std::vector<std::vector<float>> expected;
    for (const DenseTensor& value : *reference) expected.push_back(Tensor(value).to_floats());
    check = compare_with_reference(graph, output_values, expected);
  }
  if (options.format == "json") {
    nlohmann::ordered_json out{{"outputs", json_outputs}};
    if (check) {
      out["max_abs_diff"] = check->max_abs_diff;
      out["max_rel_diff"] = check->max_rel_diff;
    }
    if (report) out["profile"] = profile_json(*report);
    std::cout << out.dump() << "\n";
  } else if (check) {
    std::cout << fmt::format("check against one device: max abs diff {:.3g}, max rel diff {:.3g} ({})\n",
                             check->max_abs_diff, check->max_rel_diff,
                             check->within() ? "within tolerance" : "OUT OF TOLERANCE");
  }
  if (report && options.format != "json") std::cout << profile_text("run", *report);
  if (check && !check->within()) {
    std::cerr << "error: " << check->error_message(graph, p.program.mesh->size()) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace shardflow::cli
