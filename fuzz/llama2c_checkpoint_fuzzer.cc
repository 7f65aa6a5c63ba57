// llama2.c checkpoints: the input is written to one file in a per-process
// scratch directory under /dev/shm; read_llama2c_config reads its header,
// load_llama2c the whole file (header, size check, every tensor) onto one
// device.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "shardflow/models/checkpoint.h"

namespace {
shardflow_fuzz::ScratchDir& scratch() {
  static shardflow_fuzz::ScratchDir dir("llama2c");
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  scratch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = scratch().path() / "model.bin";
  shardflow_fuzz::write_file(path, data, size);
  shardflow_fuzz::run([&] { (void)shardflow::llama::read_llama2c_config(path); });
  shardflow_fuzz::run([&] { (void)shardflow::llama::load_llama2c(path); });
  return 0;
}
