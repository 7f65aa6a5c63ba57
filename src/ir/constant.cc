#include "shardflow/ir/constant.h"

#include <fmt/format.h>

#include <cmath>

namespace shardflow {

double Constant::as_number() const { return kind() == Kind::kInt ? static_cast<double>(as_int()) : as_float(); }

std::string float_to_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

static std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string Constant::to_string() const {
  switch (kind()) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "true" : "false";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat:
      return float_to_text(as_float());
    case Kind::kString:
      return quoted(as_string());
    case Kind::kIntList:
      return fmt::format("[{}]", fmt::join(as_int_list(), ", "));
    case Kind::kFloatList: {
      std::string out = "[";
      for (std::size_t i = 0; i < as_float_list().size(); ++i) {
        if (i > 0) out += ", ";
        out += float_to_text(as_float_list()[i]);
      }
      return out + "]";
    }
    case Kind::kDType:
      return std::string(dtype_name(as_dtype()));
  }
  return "?";
}

std::string Constant::type_name() const {
  switch (kind()) {
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kIntList:
      return "List[int]";
    case Kind::kFloatList:
      return "List[float]";
    case Kind::kDType:
      return "dtype";
  }
  return "?";
}

std::string Constant::repr() const { return to_string(); }

}  // namespace shardflow
