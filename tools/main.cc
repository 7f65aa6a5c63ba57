// The `shardflow` command-line program.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <new>
#include <optional>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "shardflow/base/error.h"
#include "shardflow/base/text.h"
#include "shardflow/runtime/runtime.h"
#include "shardflow/tensor/gemm.h"

namespace cli = shardflow::cli;

// Scripts read exactly one error line. numpy-style array text wraps with a
// one-space hanging indent: a line break and that indent become the one
// space between elements, so the padding of the elements stays as numpy
// prints it on a wide enough line.
// An error message as one line a terminal shows safely: line breaks joined,
// control characters and bytes that are not UTF-8 escaped (\xNN), and at
// most kMaxErrorBytes of it (a 50 MB argument used to come back whole).
static std::string one_line(std::string message) {
  constexpr std::size_t kMaxErrorBytes = 4096;
  for (std::size_t at = message.find('\n'); at != std::string::npos; at = message.find('\n', at)) {
    message.replace(at, at + 1 < message.size() && message[at + 1] == ' ' ? 2 : 1, " ");
  }
  std::string out;
  std::size_t i = 0;
  for (; i < message.size() && i < kMaxErrorBytes; ++i) {
    const auto c = static_cast<unsigned char>(message[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else if (const shardflow::CodePoint code =
                   c >= 0x80 ? shardflow::decode_utf8(message, i) : shardflow::CodePoint{};
               code.length > 0) {
      out.append(message, i, code.length);
      i += code.length - 1;
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (i < message.size()) out += fmt::format("... ({} more bytes)", message.size() - i);
  return out;
}

static constexpr const char* kBackendHelp =
    "local: in-process devices; mpi: one device per MPI rank, launched with mpirun -n <devices>, rank 0 prints "
    "(default: mpi when started by mpirun, as xr.use_spmd(), else local)";

// CLI11 2.1 turns an integer outside int64's range into the nearest bound;
// refuse it instead (malformed text is left to CLI11's own error). Given to
// every integer option by refuse_integer_overflow.
static const CLI::Validator kInt64 = CLI::Validator(
    [](std::string& text) -> std::string {
      int64_t value = 0;
      const char* begin = text.data() + (text.starts_with('+') ? 1 : 0);
      if (std::from_chars(begin, text.data() + text.size(), value).ec == std::errc::result_out_of_range) {
        return "'" + text + "' is outside the range of a 64-bit integer";
      }
      return "";
    },
    "");

// Every integer option of every subcommand gets kInt64.
static void refuse_integer_overflow(CLI::App& app) {
  for (CLI::App* command : app.get_subcommands([](CLI::App*) { return true; })) {
    for (CLI::Option* option : command->get_options()) {
      if (option->get_type_name() == "INT") option->check(kInt64);
    }
  }
}

static void add_sharding_command(CLI::App& app, cli::ShardingOptions& options) {
  CLI::App* command =
      app.add_subcommand("sharding",
                         "Show how a partition spec shards a tensor over a device mesh: the XLA sharding strings "
                         "PyTorch/XLA prints (V1 explicit, V2 iota), the sharding type, and which device holds "
                         "which block");
  command->add_option("--mesh-shape", options.mesh_shape, "Mesh shape, e.g. 2,4")->required();
  command->add_option("--device-ids", options.device_ids,
                      "Device ids in mesh order (default 0..N-1), e.g. 0,1,2,3,4,5,6,7");
  command->add_option("--axis-names", options.axis_names, "Axis names, e.g. data,model (default: unnamed axes)");
  command
      ->add_option("--spec", options.spec,
                   "Partition spec as a Python tuple, e.g. \"(0, None)\" or "
                   "\"(('data', 'fsdp'), None)\"")
      ->required();
  command->add_option("--shape", options.shape,
                      "Tensor shape, e.g. 4,4; adds the padded shard shape and each device's "
                      "slices");
  command->add_option("--num-devices", options.num_devices,
                      "Global device count the mesh must cover (default: the mesh size)");
  command->add_option("--format", options.format, "Output format")->check(CLI::IsMember({"text", "v1", "v2", "json"}));
}

static void add_ir_commands(CLI::App& app, cli::IrOptions& ir, cli::RunOptions& run, cli::PartitionOptions& partition) {
  CLI::App* ir_command =
      app.add_subcommand("ir", "Parse, verify and print a graph in shardflow's IR text form (docs/ir.md)");
  ir_command->add_option("file", ir.file, "IR file")->required();

  CLI::App* run_command =
      app.add_subcommand("run",
                         "Partition a graph, run it on in-process devices on deterministic random inputs, and "
                         "summarise its outputs");
  run_command->add_option("file", run.file, "IR file")->required();
  run_command->add_option("--seed", run.seed, "Seed of the random inputs");
  run_command->add_option("--devices", run.devices,
                          "Number of devices (must be the size of the annotations' mesh; default: that size)");
  run_command->add_flag("--check", run.check,
                        "Also run on one device without sharding and compare every output (exit 1 if they differ)");
  run_command->add_flag("--profile", run.profile,
                        "Also report where the run spent its time: per op kind on the first device, collectives "
                        "included");
  run_command->add_option("--format", run.format, "Output format")->check(CLI::IsMember({"text", "json"}));
  run_command->add_option("--backend", run.backend, kBackendHelp)->check(CLI::IsMember({"local", "mpi"}));

  CLI::App* partition_command =
      app.add_subcommand("partition",
                         "Propagate shardings and partition a graph: every value's sharding, the per-device "
                         "program, and each collective with the reason it is there");
  partition_command->add_option("file", partition.file, "IR file")->required();
  partition_command->add_option("--devices", partition.devices, "Number of devices (the annotations' mesh size)");
  partition_command->add_option("--format", partition.format, "Output format")->check(CLI::IsMember({"text", "json"}));
}

static void add_llama_command(CLI::App& app, cli::LlamaOptions& o) {
  CLI::App* c =
      app.add_subcommand("llama",
                         "Generate with LLaMA 2 on in-process devices: Megatron sharding plan, activation sharding "
                         "inside the compiled step, one program for prefill and one for decode");
  c->add_option("--weights", o.weights,
                "llama2.c checkpoint (.bin) or Hugging Face checkpoint directory (config.json + safetensors); default: "
                "random weights of --config");
  c->add_option("--tokenizer", o.tokenizer,
                "llama2.c tokenizer.bin, or Hugging Face tokenizer.json (or a directory holding one); default: the "
                "tokenizer.json of a --weights directory, if any; without one prompts and outputs are ids");
  c->add_option("--config", o.config, "Random-weight config: tiny, stories15M (default), stories110M, 7B");
  c->add_option("--seed", o.seed, "Seed of random weights and of sampling");
  c->add_option("--mesh", o.mesh, "Mesh shape over the axes, e.g. 4,1,2 (default: all devices on 'model')");
  c->add_option("--axis-names", o.axis_names, "Mesh axis names (the plan uses data, fsdp, model)");
  c->add_option("--devices", o.devices, "In-process devices (default: the mesh size, or 1)");
  auto* prompt = c->add_option("--prompt", o.prompt, "Prompt text (encoded with BOS; needs a tokenizer)");
  c->add_option("--prompt-ids", o.prompt_ids, "Prompt token ids, used exactly as given, e.g. 1,450,4996")
      ->excludes(prompt);
  c->add_option("--steps", o.steps, "Tokens to generate");
  c->add_option("--batch", o.batch, "Batch rows (default: the size of the 'data' axis)");
  c->add_option("--seq-len", o.seq_len,
                "KV cache positions, at most the model's context (default: what the prompt and --steps need)");
  c->add_option("--max-memory", o.max_memory,
                "Refuse runs that need more memory than this, e.g. 8G (default: the machine's available memory)");
  c->add_option("--temperature", o.temperature, "0: greedy (default); above 0: sampling");
  c->add_option("--top-p", o.top_p, "Nucleus sampling threshold when sampling");
  c->add_flag("--check", o.check, "Also generate on one device without sharding and compare (exit 1 on mismatch)");
  c->add_flag("--profile", o.profile,
              "Also report where a prefill and a decode step spend their time: per op kind on the first device, "
              "collectives included");
  c->add_option("--format", o.format, "Output format")->check(CLI::IsMember({"text", "json"}));
  c->add_option("--backend", o.backend, kBackendHelp)->check(CLI::IsMember({"local", "mpi"}));
}

// oneDNN picks its matrix kernels by the CPU's instruction sets; only an
// environment variable can make them narrower. Said once, before anything
// runs.
static void note_narrow_matrix_kernels() {
  const shardflow::MatrixKernelCheck check = shardflow::check_matrix_kernels();
  if (!check.note.empty()) std::cerr << "note: " << check.note << "\n";
}

int main(int argc, char** argv) {
  note_narrow_matrix_kernels();
  CLI::App app{"shardflow: SPMD partitioning of tensor programs over a device mesh"};
  app.require_subcommand(1);
  cli::ShardingOptions sharding_options;
  add_sharding_command(app, sharding_options);
  cli::IrOptions ir_options;
  cli::RunOptions run_options;
  cli::PartitionOptions partition_options;
  add_ir_commands(app, ir_options, run_options, partition_options);
  cli::LlamaOptions llama_options;
  add_llama_command(app, llama_options);
  refuse_integer_overflow(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::ParseError& error) {
    std::cerr << "error: " << error.what() << "\n"
              << "Run with --help for usage.\n";
    return 2;
  }

  // Without --backend, a command mpirun started runs one device per rank:
  // run in process, each rank would run the whole job alone, the ranks
  // sharing the cores, and print its results once per rank.
  const bool launched = shardflow::Runtime::started_by_mpi_launcher();
  for (std::string* backend : {&run_options.backend, &llama_options.backend}) {
    if (backend->empty()) *backend = launched ? "mpi" : "local";
  }

  // --backend mpi: one MPI runtime for the whole command, made here so that
  // an error on any rank can end the job (the other ranks may be waiting for
  // it in a collective). Only rank 0 writes to stdout.
  std::optional<shardflow::Runtime> mpi;
  const bool use_mpi = (app.got_subcommand("run") && run_options.backend == "mpi") ||
                       (app.got_subcommand("llama") && llama_options.backend == "mpi");
  if (use_mpi) {
    std::string command_line;
    for (int i = 1; i < argc; ++i) command_line += (i > 1 ? " " : "") + std::string(argv[i]);
    try {
      mpi.emplace(shardflow::Runtime::mpi({.job_fingerprint = command_line}));
    } catch (const shardflow::Error& error) {
      std::cerr << "error: " << one_line(error.what()) << "\n";
      return 1;
    }
    // One rank and no MPI launcher: most likely not started with mpirun.
    if (mpi->process_count() == 1 && !launched) {
      std::cerr << "note: --backend mpi runs one device per MPI rank and this job has 1 rank; start it with "
                   "mpirun -n <devices> (or use --backend local)\n";
    }
    cli::set_mpi_runtime(&*mpi);
    if (mpi->process_index() != 0) std::cout.setstate(std::ios::badbit);
  }
  const auto fail = [&](const std::string& message, int status) {
    if (mpi && mpi->process_count() > 1) mpi->abort_job("error: " + one_line(message), status);
    std::cerr << "error: " << one_line(message) << "\n";
    return status;
  };

  try {
    if (app.got_subcommand("sharding")) return cli::run_sharding_command(sharding_options);
    if (app.got_subcommand("ir")) return cli::run_ir_command(ir_options);
    if (app.got_subcommand("run")) return cli::run_run_command(run_options);
    if (app.got_subcommand("partition")) return cli::run_partition_command(partition_options);
    if (app.got_subcommand("llama")) return cli::run_llama_command(llama_options);
  } catch (const cli::UsageError& error) {
    return fail(error.what(), 2);
  } catch (const shardflow::Error& error) {
    return fail(error.what(), 1);
  } catch (const std::bad_alloc&) {
    return fail("out of memory", 1);
  } catch (const std::filesystem::filesystem_error& error) {  // a path given on the command line
    return fail(fmt::format("cannot access {}: {}", shardflow::quote_for_message(error.path1().string(), 200),
                            error.code().message()),
                1);
  } catch (const std::exception& error) {  // a bug: still one line, not an abort
    return fail(std::string("internal: ") + error.what(), 1);
  }
  return 2;
}
