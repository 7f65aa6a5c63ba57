// model.safetensors.index.json: load_hf on a checkpoint directory (a
// per-process scratch directory under /dev/shm) holding a fixed, valid
// config.json and the two valid files model-00001-of-00002.safetensors and
// model-00002-of-00002.safetensors (model_fixture.h), whose index is the
// input: its JSON, the weight_map, the files it names, every tensor.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "fuzz_support.h"
#include "model_fixture.h"

namespace {
shardflow_fuzz::ScratchDir& scratch() {
  static shardflow_fuzz::ScratchDir dir("safetensors_index");
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  shardflow_fuzz::write_fixture(scratch().path(), 2);
  // model.safetensors would win over the index; write_hf writes none for two files.
  if (std::filesystem::exists(scratch().path() / "model.safetensors")) std::abort();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardflow_fuzz::write_file(scratch().path() / "model.safetensors.index.json", data, size);
  shardflow_fuzz::run([&] { (void)shardflow::llama::load_hf(scratch().path()); });
  return 0;
}
