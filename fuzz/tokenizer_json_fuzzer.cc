// Hugging Face tokenizer.json: the input is written to one file in a
// per-process scratch directory under /dev/shm and read by
// Tokenizer::load_hf for a model of 320 tokens (the `tiny` config's
// vocabulary; the seeds use fewer ids), then encode/decode (tokenizer_fuzz.h).
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "shardflow/models/tokenizer.h"
#include "tokenizer_fuzz.h"

namespace {
constexpr int64_t kVocabSize = 320;

shardflow_fuzz::ScratchDir& scratch() {
  static shardflow_fuzz::ScratchDir dir("tokenizer_json");
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  scratch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = scratch().path() / "tokenizer.json";
  shardflow_fuzz::write_file(path, data, size);
  shardflow_fuzz::run([&] {
    const shardflow::llama::Tokenizer tokenizer = shardflow::llama::Tokenizer::load_hf(path, kVocabSize);
    shardflow_fuzz::exercise(tokenizer);
  });
  return 0;
}
