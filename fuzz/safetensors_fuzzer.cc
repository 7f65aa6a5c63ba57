// safetensors files: load_hf on a checkpoint directory (a per-process
// scratch directory under /dev/shm) whose config.json is a fixed, valid
// config (model_fixture.h) and whose model.safetensors is the input: the
// header, its layout checks, then every tensor read as the config says.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "model_fixture.h"

namespace {
shardflow_fuzz::ScratchDir& scratch() {
  static shardflow_fuzz::ScratchDir dir("safetensors");
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  shardflow_fuzz::write_fixture(scratch().path(), 1);  // config.json (+ a model.safetensors replaced below)
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardflow_fuzz::write_file(scratch().path() / "model.safetensors", data, size);
  shardflow_fuzz::run([&] { (void)shardflow::llama::load_hf(scratch().path()); });
  return 0;
}
