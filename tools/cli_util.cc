#include "cli_util.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iterator>
#include <utility>

#include "shardflow/base/error.h"
#include "shardflow/base/python_literal.h"
#include "shardflow/base/text.h"
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
  if (text.size() >= 2 &&
      ((text.front() == '(' && text.back() == ')') || (text.front() == '[' && text.back() == ']'))) {
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
      throw UsageError(
          fmt::format("{}: expected a comma-separated list of integers such as 2,4; "
                      "{} is not an integer",
                      option, quote_for_message(item, 40)));
    }
    values.push_back(value);
  }
  return values;
}

uint64_t parse_byte_size(std::string_view option, std::string_view text) {
  const std::string_view body = trim(text);
  std::size_t number_end = 0;
  while (number_end < body.size() &&
         (std::isdigit(static_cast<unsigned char>(body[number_end])) != 0 || body[number_end] == '.')) {
    ++number_end;
  }
  std::string unit(body.substr(number_end));
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const std::pair<const char*, int> kUnits[] = {{"", 0},    {"b", 0},  {"k", 1},   {"kb", 1}, {"kib", 1},
                                                       {"m", 2},   {"mb", 2}, {"mib", 2}, {"g", 3},  {"gb", 3},
                                                       {"gib", 3}, {"t", 4},  {"tb", 4},  {"tib", 4}};
  const auto* found =
      std::find_if(std::begin(kUnits), std::end(kUnits), [&](const auto& u) { return unit == u.first; });
  double value = 0;
  const std::string number(body.substr(0, number_end));
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || ec != std::errc() || end != number.data() + number.size() || found == std::end(kUnits)) {
    throw UsageError(fmt::format("{}: expected a size such as 8G, 512M or 1073741824 (bytes), got {}", option,
                                 quote_for_message(text, 40)));
  }
  const double bytes = value * std::pow(1024.0, found->second);
  if (!(bytes >= 1) || bytes >= 18446744073709551615.0) {
    throw UsageError(
        fmt::format("{}: {} is not a size between 1 byte and 16 EiB", option, quote_for_message(text, 40)));
  }
  return static_cast<uint64_t>(bytes);
}

uint64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : UINT64_MAX;
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
        throw UsageError(fmt::format("{}: axis names must be strings, got {}", option, item.repr()));
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
