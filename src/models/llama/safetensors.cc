// The safetensors container (see safetensors.h).
#include "safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "shardflow/base/error.h"
#include "shardflow/base/text.h"

namespace shardflow::llama::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors data is read and written as native");

namespace {

// "a string", "an array", ...: what a JSON value is, for error messages.
std::string describe(const nlohmann::json& value) {
  if (value.is_number_float()) return "a floating-point number";
  if (value.is_number()) return "an integer";
  if (value.is_null()) return "null";
  const std::string type = value.type_name();
  return (type == "array" || type == "object" ? "an " : "a ") + type;
}

// A non-negative integer that fits in int64, or nullopt.
std::optional<uint64_t> non_negative(const nlohmann::json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;  // negative integers are number_integer
  const auto v = value.get<uint64_t>();
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return v;
}

std::optional<DType> dtype_of_tag(const std::string& tag) {
  if (tag == "F32") return DType::kF32;
  if (tag == "F16") return DType::kF16;
  if (tag == "BF16") return DType::kBF16;
  return std::nullopt;
}

}  // namespace

std::string dtype_tag(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    default:
      break;
  }
  throw Error(fmt::format("safetensors: cannot store dtype {}; expected f32, f16 or bf16", dtype_name(dtype)));
}

Reader::Reader(std::filesystem::path path) : path_(std::move(path)) {
  const std::string where = fmt::format("safetensors file '{}'", path_.string());
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path_, ec)) {
    throw Error(fmt::format("cannot open {}: {}", where,
                            std::filesystem::exists(path_, ec) ? "not a regular file" : "no such file"));
  }
  file_.reset(std::fopen(path_.c_str(), "rb"));
  if (!file_) throw Error(fmt::format("cannot open {}: {}", where, std::strerror(errno)));
  std::FILE* f = file_.get();
  if (std::fseek(f, 0, SEEK_END) != 0) throw Error(fmt::format("cannot read {}", where));
  const long end = std::ftell(f);
  if (end < 0 || std::fseek(f, 0, SEEK_SET) != 0) throw Error(fmt::format("cannot read {}", where));
  const auto size = static_cast<uint64_t>(end);

  std::array<unsigned char, 8> length_bytes{};
  if (size < length_bytes.size() || std::fread(length_bytes.data(), 1, 8, f) != 8) {
    throw Error(fmt::format("{} is too short: it has {} bytes, the header length field alone needs 8", where, size));
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | length_bytes[static_cast<std::size_t>(i)];
  if (header_bytes > size - 8) {
    throw Error(
        fmt::format("{}: the header length {} is larger than the file (expected at most {}, the bytes "
                    "after the length field)",
                    where, header_bytes, size - 8));
  }
  if (header_bytes > kMaxHeaderBytes) {
    throw Error(
        fmt::format("{}: the header length {} exceeds the limit of {} bytes", where, header_bytes, kMaxHeaderBytes));
  }
  std::string text(static_cast<std::size_t>(header_bytes), '\0');
  if (std::fread(text.data(), 1, text.size(), f) != text.size()) {
    throw Error(fmt::format("cannot read the header of {}", where));
  }
  data_start_ = static_cast<int64_t>(8 + header_bytes);
  data_bytes_ = size - 8 - header_bytes;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{} has a malformed JSON header ({} bytes): {}", where, header_bytes, e.what()));
  }
  if (!header.is_object()) {
    throw Error(fmt::format("{}: the JSON header is {}, expected an object mapping tensor names to entries", where,
                            describe(header)));
  }
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;  // free-form strings; not needed here
    const std::string tensor = fmt::format("{}: the header entry of tensor '{}'", where, name);
    if (!value.is_object()) throw Error(fmt::format("{} is {}, expected an object", tensor, describe(value)));
    Entry entry;
    const auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) {
      throw Error(fmt::format("{} has {} as 'dtype', expected a string", tensor,
                              dtype == value.end() ? "nothing" : describe(*dtype)));
    }
    entry.dtype = dtype->get<std::string>();
    const auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) {
      throw Error(fmt::format("{} has {} as 'shape', expected an array of non-negative integers", tensor,
                              shape == value.end() ? "nothing" : describe(*shape)));
    }
    for (const nlohmann::json& extent : *shape) {
      const std::optional<uint64_t> e = non_negative(extent);
      if (!e) {
        throw Error(fmt::format("{} has {} in 'shape', expected non-negative integers", tensor, describe(extent)));
      }
      entry.shape.push_back(static_cast<int64_t>(*e));
    }
    const auto offsets = value.find("data_offsets");
    std::optional<uint64_t> begin, end_offset;
    if (offsets != value.end() && offsets->is_array() && offsets->size() == 2) {
      begin = non_negative((*offsets)[0]);
      end_offset = non_negative((*offsets)[1]);
    }
    if (!begin || !end_offset) {
      throw Error(fmt::format("{} has {} as 'data_offsets', expected [begin, end], two non-negative integers", tensor,
                              offsets == value.end() ? "nothing" : describe(*offsets)));
    }
    if (*begin > *end_offset || *end_offset > data_bytes_) {
      throw Error(
          fmt::format("{}: data_offsets [{}, {}] lie outside the data (expected 0 <= begin <= end <= {}, "
                      "the data's size)",
                      tensor, *begin, *end_offset, data_bytes_));
    }
    entry.begin = *begin;
    entry.end = *end_offset;
    entries_.emplace(name, std::move(entry));
  }
  check_layout(where);
}

namespace {

// Bytes per element of each safetensors dtype tag (the format's list).
std::optional<uint64_t> tag_element_size(const std::string& tag) {
  static const std::map<std::string, uint64_t, std::less<>> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  const auto found = kSizes.find(tag);
  return found == kSizes.end() ? std::nullopt : std::optional<uint64_t>(found->second);
}

}  // namespace

// As the safetensors library checks a file: every tensor's bytes are its
// shape times its dtype's size, and the tensors tile the data in order of
// their offsets, from 0 to its end, without gaps, overlaps or bytes left over.
void Reader::check_layout(const std::string& where) const {
  std::vector<std::pair<const std::string*, const Entry*>> by_offset;
  for (const auto& [name, entry] : entries_) by_offset.emplace_back(&name, &entry);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->begin, a.second->end) < std::tie(b.second->begin, b.second->end);
  });
  uint64_t expected_begin = 0;
  for (const auto& [name, entry] : by_offset) {
    const std::string tensor = fmt::format("{}: tensor {}", where, quote_for_message(*name, 80));
    const std::optional<uint64_t> size = tag_element_size(entry->dtype);
    if (!size) {
      throw Error(fmt::format("{} has the dtype {}, which is not a safetensors dtype", tensor,
                              quote_for_message(entry->dtype, 20)));
    }
    uint64_t bytes = *size;
    for (int64_t extent : entry->shape) {
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(extent), &bytes)) bytes = UINT64_MAX;
    }
    if (entry->end - entry->begin != bytes) {
      throw Error(fmt::format("{}: data_offsets [{}, {}] span {} bytes, but shape {} of {} takes {}", tensor,
                              entry->begin, entry->end, entry->end - entry->begin, shape_to_string(entry->shape),
                              entry->dtype, bytes));
    }
    if (entry->begin != expected_begin) {
      throw Error(fmt::format(
          "{}: data_offsets [{}, {}] {} (tensors must tile the data in order)", tensor, entry->begin, entry->end,
          entry->begin < expected_begin ? fmt::format("overlap the tensor before it, which ends at {}", expected_begin)
                                        : fmt::format("leave a gap after byte {}", expected_begin)));
    }
    expected_begin = entry->end;
  }
  if (expected_begin != data_bytes_) {
    throw Error(fmt::format("{}: the tensors' data ends at byte {} but the file has {} data bytes ({} left over)",
                            where, expected_begin, data_bytes_, data_bytes_ - expected_begin));
  }
}

TensorView Reader::tensor(const std::string& name, const Shape& expected) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    throw Error(fmt::format("tensor '{}' is missing from safetensors file '{}'", name, path_.string()));
  }
  const Entry& e = it->second;
  const std::string where = fmt::format("tensor '{}' in safetensors file '{}'", name, path_.string());
  const std::optional<DType> dtype = dtype_of_tag(e.dtype);
  if (!dtype) throw Error(fmt::format("{} has unsupported dtype '{}', expected F32, F16 or BF16", where, e.dtype));
  if (e.shape != expected) {
    throw Error(
        fmt::format("{} has shape {}, expected {}", where, shape_to_string(e.shape), shape_to_string(expected)));
  }
  const auto elements = static_cast<uint64_t>(numel(expected));
  const uint64_t size = element_size(*dtype), bytes = elements * size;
  if (e.end - e.begin != bytes) {
    throw Error(fmt::format("{}: data_offsets [{}, {}] span {} bytes, expected {} ({} elements of {} bytes)", where,
                            e.begin, e.end, e.end - e.begin, bytes, elements, size));
  }
  return {name, *dtype, expected, data_start_ + static_cast<int64_t>(e.begin)};
}

void Reader::read(const TensorView& tensor, int64_t first, int64_t count, float* dst) const {
  if (first < 0 || count < 0 || first + count > numel(tensor.shape)) {
    throw Error(fmt::format("internal: elements [{}, {}) of tensor '{}' requested, it has {}", first, first + count,
                            tensor.name, numel(tensor.shape)));
  }
  const auto size = static_cast<int64_t>(element_size(tensor.dtype));
  std::FILE* f = file_.get();
  auto fail = [&] {
    throw Error(fmt::format("cannot read tensor '{}' from safetensors file '{}' (did the file change?)", tensor.name,
                            path_.string()));
  };
  if (std::fseek(f, static_cast<long>(tensor.offset + first * size), SEEK_SET) != 0) fail();
  if (tensor.dtype == DType::kF32) {
    if (std::fread(dst, 4, static_cast<std::size_t>(count), f) != static_cast<std::size_t>(count)) fail();
    return;
  }
  constexpr int64_t kChunk = 8192;
  std::array<uint16_t, kChunk> bits{};
  while (count > 0) {
    const int64_t n = std::min(count, kChunk);
    if (std::fread(bits.data(), 2, static_cast<std::size_t>(n), f) != static_cast<std::size_t>(n)) fail();
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = bits[static_cast<std::size_t>(i)];
      dst[i] = tensor.dtype == DType::kF16 ? to_float(Float16{b}) : to_float(BFloat16{b});
    }
    dst += n;
    count -= n;
  }
}

int64_t write(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors, DType dtype) {
  const std::string tag = dtype_tag(dtype);
  const auto size = static_cast<int64_t>(element_size(dtype));
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const int64_t bytes = t.tensor->numel() * size;
    header[t.name] = {{"dtype", tag},
                      {"shape", t.tensor->shape()},
                      {"data_offsets", nlohmann::json::array({offset, offset + bytes})}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned

  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> file(std::fopen(path.c_str(), "wb"));
  if (!file) throw Error(fmt::format("cannot create safetensors file '{}': {}", path.string(), std::strerror(errno)));
  auto put = [&](const void* data, std::size_t element, std::size_t count) {
    if (std::fwrite(data, element, count, file.get()) != count) {
      throw Error(fmt::format("cannot write safetensors file '{}'", path.string()));
    }
  };
  std::array<unsigned char, 8> length{};
  for (std::size_t i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  put(length.data(), 1, 8);
  put(text.data(), 1, text.size());
  for (const NamedTensor& t : tensors) {
    const std::vector<float> values = t.tensor->to_floats();
    if (dtype == DType::kF32) {
      put(values.data(), 4, values.size());
      continue;
    }
    std::vector<uint16_t> bits(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      bits[i] = dtype == DType::kF16 ? to_float16(values[i]).bits : to_bfloat16(values[i]).bits;
    }
    put(bits.data(), 2, bits.size());
  }
  if (std::fflush(file.get()) != 0) throw Error(fmt::format("cannot write safetensors file '{}'", path.string()));
  return offset;
}

}  // namespace shardflow::llama::safetensors
