// Runs the shardflow CLI from a test and captures its output.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>

struct CliResult {
  int status = -1;
  std::string out;
  std::string err;
};

// Runs a shell command line, capturing stdout and stderr.
inline CliResult run_command(const std::string& command_line) {
  // CTest runs tests in parallel: one stderr file per process.
  const std::string err_file =
      testing::TempDir() + "shardflow_cli_stderr_" + std::to_string(getpid()) + ".txt";
  const std::string command = command_line + " 2>" + err_file;
  CliResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  while (std::size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) result.out.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (FILE* err = fopen(err_file.c_str(), "r")) {
    while (std::size_t n = fread(buffer.data(), 1, buffer.size(), err)) result.err.append(buffer.data(), n);
    fclose(err);
  }
  return result;
}

#ifdef SHARDFLOW_CLI
// Runs `shardflow <args>` (shell syntax).
inline CliResult run_cli(const std::string& args) { return run_command(std::string(SHARDFLOW_CLI) + " " + args); }
#endif
