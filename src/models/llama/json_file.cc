#include "json_file.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "shardflow/base/error.h"

namespace shardflow::llama {

Json parse_json(std::string_view text, const std::string& what, const std::string& source) {
  if (text.size() > kMaxJsonBytes) {
    throw Error(
        fmt::format("{} '{}' has {} bytes, more than the limit of {}", what, source, text.size(), kMaxJsonBytes));
  }
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw Error(fmt::format("{} '{}' is not valid JSON: {}", what, source, e.what()));
  }
}

Json read_json(const std::filesystem::path& path, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(fmt::format("cannot open {} '{}': {}", what, path.string(),
                            std::filesystem::exists(path, ec) ? "not a regular file" : "no such file"));
  }
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(fmt::format("cannot read {} '{}': {}", what, path.string(), ec.message()));
  if (size > kMaxJsonBytes) {
    throw Error(
        fmt::format("{} '{}' has {} bytes, more than the limit of {}", what, path.string(), size, kMaxJsonBytes));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) throw Error(fmt::format("cannot read {} '{}'", what, path.string()));
  return parse_json(text.str(), what, path.string());
}

std::string describe(const Json& value) {
  if (value.is_number_float()) return "a floating-point number";
  if (value.is_number()) return "an integer";
  if (value.is_null()) return "null";
  const std::string type = value.type_name();
  return (type == "array" || type == "object" ? "an " : "a ") + type;
}

}  // namespace shardflow::llama
