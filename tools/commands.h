// The subcommands of the `shardflow` program. Each takes its parsed options
// and returns the exit status; invalid input is thrown as shardflow::Error
// (exit 1), a malformed command line as cli::UsageError (exit 2). Only
// main.cc sees CLI11, to keep its heavy header out of the other files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace shardflow::cli {

struct ShardingOptions {
  std::string mesh_shape;
  std::optional<std::string> device_ids;
  std::optional<std::string> axis_names;
  std::string spec;
  std::optional<std::string> shape;
  std::optional<int64_t> num_devices;
  std::string format = "text";
};

// `shardflow sharding`: a mesh and a partition spec, shown as XLA sharding
// strings, the sharding type, and (with a shape) each device's shard.
int run_sharding_command(const ShardingOptions& options);

struct IrOptions {
  std::string file;
};

// `shardflow ir FILE`: parses, verifies and prints the canonical IR.
int run_ir_command(const IrOptions& options);

struct RunOptions {
  std::string file;
  int64_t seed = 0;
  std::optional<int64_t> devices;  // default: the size of the annotations' mesh
  bool check = false;
  bool profile = false;
  std::string format = "text";
  std::string backend;  // "local" or "mpi"; empty: mpi when mpirun started us, else local
};

// `shardflow run FILE`: partitions the graph, runs it on in-process devices
// on deterministic random inputs and summarises each output; --check compares
// with one device.
int run_run_command(const RunOptions& options);

struct PartitionOptions {
  std::string file;
  std::optional<int64_t> devices;
  std::string format = "text";
};

// `shardflow partition FILE`: the shardings of every value, the per-device
// program and its collectives with their reasons.
int run_partition_command(const PartitionOptions& options);

}  // namespace shardflow::cli

namespace shardflow::cli {

struct LlamaOptions {
  std::optional<std::string> weights;    // a llama2.c .bin or a Hugging Face directory
  std::optional<std::string> tokenizer;  // tokenizer.bin, tokenizer.json or a directory holding one
  std::optional<std::string> config;     // a named config for random weights
  int64_t seed = 0;
  std::optional<std::string> mesh;
  std::string axis_names = "data,fsdp,model";
  std::optional<int64_t> devices;
  std::optional<std::string> prompt;
  std::optional<std::string> prompt_ids;
  int64_t steps = 32;
  std::optional<int64_t> batch;
  std::optional<int64_t> seq_len;         // cache positions (default: what the prompt and steps need)
  std::optional<std::string> max_memory;  // a size such as 8G (default: the machine's available memory)
  double temperature = 0;
  double top_p = 0.9;
  bool check = false;
  bool profile = false;
  std::string format = "text";
  std::string backend;  // "local" or "mpi"; empty: mpi when mpirun started us, else local
};

// `shardflow llama`: LLaMA 2 generation on in-process devices with the
// Megatron plan and activation sharding; --check compares with one device.
int run_llama_command(const LlamaOptions& options);

}  // namespace shardflow::cli
