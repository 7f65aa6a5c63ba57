// llama2.c's tokenizer.bin: the input is written to one file in a
// per-process scratch directory under /dev/shm and read by Tokenizer::load
// (then encode/decode, tokenizer_fuzz.h). The format has no token count (it
// is the model's vocab_size), so vocab_size is the number of whole records
// the input holds (at least 259, the smallest vocabulary): inputs with
// records enough reach the tokenizer, the others its truncation errors, and
// a partial record left over its "bytes follow the last record" error.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "shardflow/models/tokenizer.h"
#include "tokenizer_fuzz.h"

namespace {

shardflow_fuzz::ScratchDir& scratch() {
  static shardflow_fuzz::ScratchDir dir("tokenizer_bin");
  return dir;
}

int64_t whole_records(const uint8_t* data, size_t size) {
  auto i32 = [&](size_t at) {
    return static_cast<int32_t>(static_cast<uint32_t>(data[at]) | static_cast<uint32_t>(data[at + 1]) << 8 |
                                static_cast<uint32_t>(data[at + 2]) << 16 | static_cast<uint32_t>(data[at + 3]) << 24);
  };
  int64_t count = 0;
  size_t offset = 4;
  while (offset <= size && size - offset >= 8) {
    const int32_t length = i32(offset + 4);
    if (length < 0 || size - offset - 8 < static_cast<size_t>(length)) break;
    offset += 8 + static_cast<size_t>(length);
    ++count;
  }
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  scratch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = scratch().path() / "tokenizer.bin";
  shardflow_fuzz::write_file(path, data, size);
  const int64_t vocab_size = std::clamp<int64_t>(whole_records(data, size), shardflow::llama::Tokenizer::kMinVocabSize,
                                                 shardflow::llama::Tokenizer::kMaxVocabSize);
  shardflow_fuzz::run([&] {
    const shardflow::llama::Tokenizer tokenizer = shardflow::llama::Tokenizer::load(path, vocab_size);
    shardflow_fuzz::exercise(tokenizer);
  });
  return 0;
}
