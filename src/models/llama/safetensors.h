// The safetensors container: an 8-byte little-endian header length N, N
// bytes of JSON mapping each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (plus an optional "__metadata__" object of
// strings), then the data; offsets count from the start of the data.
//
// Reading checks every size against the file before using it, so arbitrary
// bytes give a shardflow::Error naming the file, never a crash or a huge
// allocation. Only F32, F16 and BF16 tensors are read (converted to f32).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardflow/tensor/dtype.h"
#include "shardflow/tensor/shape.h"
#include "shardflow/trace/tensor.h"

namespace shardflow::llama::safetensors {

// A header longer than this is refused (real headers are a few hundred KB).
inline constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

// A tensor of a file, checked against the shape and dtypes a reader expects.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t offset = 0;  // of the first element, in bytes from the start of the file
};

class Reader {
 public:
  // Opens the file and reads and checks its header (structure, and that
  // every tensor's data_offsets lie inside the data).
  explicit Reader(std::filesystem::path path);

  const std::filesystem::path& path() const { return path_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, entry] : entries_) out.push_back(name);
    return out;
  }

  // The tensor `name`, checked: present, of dtype F32, F16 or BF16, of shape
  // `expected`, and with data_offsets spanning exactly its bytes.
  TensorView tensor(const std::string& name, const Shape& expected) const;

  // Elements [first, first + count) (row-major) of a checked tensor, as f32.
  void read(const TensorView& tensor, int64_t first, int64_t count, float* dst) const;

 private:
  struct Entry {
    std::string dtype;
    Shape shape;
    uint64_t begin = 0, end = 0;  // data_offsets
  };
  void check_layout(const std::string& where) const;

  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };

  std::filesystem::path path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::map<std::string, Entry> entries_;
  int64_t data_start_ = 0;  // bytes from the start of the file
  uint64_t data_bytes_ = 0;
};

// One tensor to write: its name and values (the tensor's shape is written).
struct NamedTensor {
  std::string name;
  const Tensor* tensor = nullptr;
};

// Writes `tensors` in that order, stored as `dtype` (f32, f16 or bf16;
// rounded to nearest even), with the header padded to a multiple of 8 bytes.
// Returns the number of data bytes written.
int64_t write(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors, DType dtype);

// The safetensors name of a dtype written or read: "F32", "F16", "BF16".
std::string dtype_tag(DType dtype);

}  // namespace shardflow::llama::safetensors
