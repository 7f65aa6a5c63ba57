// Reading the JSON files of Hugging Face checkpoints (config.json, the
// safetensors index, tokenizer.json) with errors that name the file.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace shardflow::llama {

using Json = nlohmann::json;

// These files are a few KB to a few MB; refuse to parse anything huge.
inline constexpr std::uintmax_t kMaxJsonBytes = std::uintmax_t{64} << 20;

// The parsed text, refused over kMaxJsonBytes; `what` names the file's role
// and `source` the file in messages: "Hugging Face config
// 'dir/config.json' is not valid JSON: ...".
Json parse_json(std::string_view text, const std::string& what, const std::string& source);

// The parsed file, refused when missing, not a regular file or over kMaxJsonBytes.
Json read_json(const std::filesystem::path& path, const std::string& what);

// "an object", "a string", "null", ... for "is X, expected Y" messages.
std::string describe(const Json& value);

}  // namespace shardflow::llama
