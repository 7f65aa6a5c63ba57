// Helpers shared by the `shardflow` subcommands.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace shardflow {
class Runtime;
}

namespace shardflow::cli {

// A malformed command line (exit status 2), as opposed to invalid input that
// the command line describes correctly (shardflow::Error, exit status 1).
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

// "2,4", "2, 4", "(2, 4)", "[2,4]", "8" -> {2, 4} / {8}; "" and "()" -> {}.
std::vector<int64_t> parse_int_list(std::string_view option, std::string_view text);

// "data,model" or the Python form "('data', 'model')"; "None" -> {} (unnamed).
std::vector<std::string> parse_name_list(std::string_view option, std::string_view text);

// "8G", "512M", "1.5GiB", "100k", "123" (bytes) -> bytes; units are powers of 1024.
uint64_t parse_byte_size(std::string_view option, std::string_view text);

// The memory this machine can give a new run: /proc/meminfo's MemAvailable,
// else the physical memory.
uint64_t available_memory_bytes();

// The job's MPI runtime when the command runs with --backend mpi (main makes
// it before the command runs, so that an error can end every rank), else
// nullptr.
Runtime* mpi_runtime();
void set_mpi_runtime(Runtime* runtime);

// Under --backend mpi the job must have one rank per device of the mesh.
void check_mpi_ranks(int64_t devices, std::string_view what);

}  // namespace shardflow::cli
