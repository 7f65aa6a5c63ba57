// Non-tensor argument values of ops: None, bool, int, float, str, int[],
// float[], and dtypes. They appear in the IR text as written here:
//   None  true  false  3  -1  1.5  1e-05  "text"  [1, 2]  [0.5, 1.0]  f32
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "shardflow/tensor/dtype.h"

namespace shardflow {

class Constant {
 public:
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kIntList, kFloatList, kDType };

  Constant() = default;                                               // None
  Constant(bool value) : value_(value) {}                             // NOLINT: implicit by design
  Constant(int value) : value_(int64_t{value}) {}                     // NOLINT
  Constant(int64_t value) : value_(value) {}                          // NOLINT
  Constant(double value) : value_(value) {}                           // NOLINT
  Constant(const char* value) : value_(std::string(value)) {}         // NOLINT
  Constant(std::string value) : value_(std::move(value)) {}           // NOLINT
  Constant(std::vector<int64_t> value) : value_(std::move(value)) {}  // NOLINT
  Constant(std::vector<double> value) : value_(std::move(value)) {}   // NOLINT
  Constant(DType value) : value_(value) {}                            // NOLINT

  Kind kind() const { return static_cast<Kind>(value_.index()); }
  bool is_none() const { return kind() == Kind::kNone; }
  bool as_bool() const { return std::get<bool>(value_); }
  int64_t as_int() const { return std::get<int64_t>(value_); }
  double as_float() const { return std::get<double>(value_); }
  // An int or a float, as a double (PyTorch's Scalar).
  double as_number() const;
  const std::string& as_string() const { return std::get<std::string>(value_); }
  const std::vector<int64_t>& as_int_list() const { return std::get<std::vector<int64_t>>(value_); }
  const std::vector<double>& as_float_list() const { return std::get<std::vector<double>>(value_); }
  DType as_dtype() const { return std::get<DType>(value_); }

  // The IR text form (see above).
  std::string to_string() const;
  // Python's name of the type, for PyTorch-style messages: "NoneType",
  // "bool", "int", "float", "str", "List[int]", "List[float]", "dtype".
  std::string type_name() const;
  // How PyTorch shows the value in messages: "0,1" is shown with double quotes.
  std::string repr() const;

  friend bool operator==(const Constant&, const Constant&) = default;

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<int64_t>, std::vector<double>, DType>
      value_;
};

// Shortest text that reads back to the same double, always with a '.' or an
// exponent so that it reads back as a float ("1.0", "1e-05", "inf").
std::string float_to_text(double value);

}  // namespace shardflow
