// Hugging Face config.json: the input is a checkpoint directory's
// config.json (a per-process scratch directory under /dev/shm), read by
// read_hf_config.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "shardflow/models/checkpoint.h"

namespace {
shardflow_fuzz::ScratchDir& scratch() {
  static shardflow_fuzz::ScratchDir dir("hf_config");
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  scratch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardflow_fuzz::write_file(scratch().path() / "config.json", data, size);
  shardflow_fuzz::run([&] {
    const shardflow::llama::Config config = shardflow::llama::read_hf_config(scratch().path());
    (void)config.to_string();
  });
  return 0;
}
