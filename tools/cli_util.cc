#include "cli_util.h"

#include <fmt/format.h>

#include <charconv>

#include "shardflow/base/error.h"
#include "shardflow/base/python_literal.h"
#include "shardflow/runtime/runtime.h"

namespace shardflow::cli {

static std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

// Strips one pair of enclosing brackets: "(2, 4)" -> "2, 4".
static std::string_view strip_brackets(std::string_view text) {
  text = trim(text);
  if (text.size() >= 2 && ((text.front() == '(' && text.back() == ')') ||
                           (text.front() == '[' && text.back() == ']'))) {
    return trim(text.substr(1, text.size() - 2));
  }
  return text;
}

std::vector<int64_t> parse_int_list(std::string_view option, std::string_view text) {
  const std::string_view body = strip_brackets(text);
  std::vector<int64_t> values;
  if (body.empty()) return values;
  std::size_t start = 0;
  while (start <= body.size()) {
    const std::size_t comma = std::min(body.find(',', start), body.size());
    const std::string_view item = trim(body.substr(start, comma - start));
    start = comma + 1;
    if (item.empty() && comma == body.size() && !values.empty()) break;  // "8," trailing comma
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      throw UsageError(fmt::format("{}: expected a comma-separated list of integers such as 2,4; "
                                   "'{}' is not an integer", option, item));
    }
    values.push_back(value);
  }
  return values;
}

std::vector<std::string> parse_name_list(std::string_view option, std::string_view text) {
  const std::string_view body = trim(text);
  std::vector<std::string> names;
  if (body.empty() || body == "None") return names;
  if (body.front() == '(' || body.front() == '[') {
    PyValue value;
    try {
      value = parse_python_literal(body);
    } catch (const Error& error) {
      throw UsageError(fmt::format("{}: {}", option, error.what()));
    }
    if (!value.is_sequence()) {
      throw UsageError(fmt::format("{}: expected a tuple of names, got {}", option, value.repr()));
    }
    for (const PyValue& item : value.items()) {
      if (item.kind() != PyValue::Kind::kString) {
        throw UsageError(
            fmt::format("{}: axis names must be strings, got {}", option, item.repr()));
      }
      names.push_back(item.as_string());
    }
    return names;
  }
  std::size_t start = 0;
  while (start <= body.size()) {
    const std::size_t comma = std::min(body.find(',', start), body.size());
    names.emplace_back(trim(body.substr(start, comma - start)));
    start = comma + 1;
  }
  return names;
}

static Runtime* g_mpi_runtime = nullptr;

Runtime* mpi_runtime() { return g_mpi_runtime; }
void set_mpi_runtime(Runtime* runtime) { g_mpi_runtime = runtime; }

void check_mpi_ranks(int64_t devices, std::string_view what) {
  if (g_mpi_runtime == nullptr || g_mpi_runtime->num_devices() == devices) return;
  throw Error(fmt::format("{} needs {} device(s), but the MPI job has {} rank(s): launch it with mpirun -n {}", what,
                          devices, g_mpi_runtime->num_devices(), devices));
}

}  // namespace shardflow::cli
