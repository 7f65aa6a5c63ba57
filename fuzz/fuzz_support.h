// What every shardflow fuzzer shares: the expected-error wrapper, and a
// per-process scratch directory under /dev/shm for the loaders that take a
// path.
//
// shardflow::Error (and its subclasses) is how shardflow rejects bad input,
// so run() catches it; any other exception escapes LLVMFuzzerTestOneInput,
// std::terminate aborts, and libFuzzer reports it as a crash with the
// exception's type and what() (libstdc++'s verbose terminate handler).
// SHARDFLOW_FUZZ_VERBOSE=1 prints each caught error (to check that seeds
// reach the code they are meant to). SHARDFLOW_FUZZ_ROUNDTRIP=1 makes the
// text fuzzers (ir_text, hlo_sharding, python_literal) also check that what
// they print parses back to the same thing; a difference aborts (a finding).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#include "shardflow/base/error.h"

namespace shardflow_fuzz {

inline bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' && *value != '0';
}

inline bool verbose() {
  static const bool on = env_flag("SHARDFLOW_FUZZ_VERBOSE");
  return on;
}

inline bool roundtrip() {
  static const bool on = env_flag("SHARDFLOW_FUZZ_ROUNDTRIP");
  return on;
}

// A broken invariant (SHARDFLOW_FUZZ_ROUNDTRIP): prints it and aborts, so
// libFuzzer saves the input.
[[noreturn]] inline void invariant_failed(std::string_view what, std::string_view first, std::string_view second = {}) {
  std::fprintf(stderr, "shardflow fuzz invariant failed: %.*s\n--- first:\n%.*s\n--- second:\n%.*s\n",
               static_cast<int>(what.size()), what.data(), static_cast<int>(first.size()), first.data(),
               static_cast<int>(second.size()), second.data());
  std::abort();
}

// Runs body(); a shardflow::Error is the expected outcome for bad input.
template <class Body>
void run(Body&& body) {
  try {
    body();
  } catch (const shardflow::Error& e) {
    if (verbose()) std::fprintf(stderr, "shardflow::Error: %s\n", e.what());
  }
}

inline std::string_view as_text(const uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// /dev/shm/shardflow-fuzz-<name>-<pid>, created on first use and removed at
// normal exit (a crashed run leaves it behind; it is small).
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) {
    std::filesystem::path base = "/dev/shm";
    std::error_code ec;
    if (!std::filesystem::is_directory(base, ec)) base = std::filesystem::temp_directory_path();
    path_ = base / ("shardflow-fuzz-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_, ec);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Replaces the file's content by the bytes (the same path every run).
inline void write_file(const std::filesystem::path& path, const uint8_t* data, std::size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::abort();  // the harness cannot work: not a finding in shardflow
  }
  if (size != 0 && std::fwrite(data, 1, size, f) != size) {
    std::perror(path.c_str());
    std::abort();
  }
  std::fclose(f);
}

inline void write_file(const std::filesystem::path& path, std::string_view text) {
  write_file(path, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

}  // namespace shardflow_fuzz
