// Python literals, as `ast.literal_eval` reads them.
//
// The custom op `xla::dynamo_mark_sharding` carries its mesh axis names and its
// partition spec as strings such as "('data', None, 'model')" or
// "(('r', 'b'), None)"; a Mesh prints as a dict literal. This module parses
// such text into a small value tree and prints values back the way Python's
// repr() does. Malformed input of any kind (including arbitrary bytes) gives a
// shardflow::Error naming the column and what was expected.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardflow {

class PyValue {
 public:
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict };

  PyValue() = default;  // None
  static PyValue none() { return PyValue(); }
  static PyValue boolean(bool value);
  static PyValue integer(int64_t value);
  static PyValue floating(double value);
  static PyValue string(std::string value);
  static PyValue tuple(std::vector<PyValue> items);
  static PyValue list(std::vector<PyValue> items);
  static PyValue dict(std::vector<std::pair<PyValue, PyValue>> entries);

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_sequence() const { return kind_ == Kind::kTuple || kind_ == Kind::kList; }

  // Accessors; each requires the matching kind.
  bool as_bool() const;
  int64_t as_int() const;
  double as_float() const;
  const std::string& as_string() const;
  const std::vector<PyValue>& items() const;                        // tuple or list
  const std::vector<std::pair<PyValue, PyValue>>& entries() const;  // dict
  // The value stored under a string key of a dict, or nullptr.
  const PyValue* find(std::string_view key) const;

  // Python's name of the type: "NoneType", "bool", "int", "float", "str", ...
  std::string_view type_name() const;
  // Python's repr(): "None", "3", "'data'", "(0,)", "[1, 2]", "{'a': 1}".
  std::string repr() const;

  friend bool operator==(const PyValue& a, const PyValue& b);

 private:
  Kind kind_ = Kind::kNone;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::string string_;
  std::vector<PyValue> items_;
  std::vector<std::pair<PyValue, PyValue>> entries_;
};

// Parses one literal: None, True, False, ints (decimal, 0x/0o/0b, '_' groups,
// one unary +/-), floats, strings in single or double quotes with backslash
// escapes (adjacent strings concatenate), tuples (a bare top-level "a, b" is a
// tuple, as in Python), lists and dicts; containers nest up to 64 levels.
// Not supported: r/b/f string prefixes, \N{...} escapes, sets, complex numbers.
PyValue parse_python_literal(std::string_view text);

}  // namespace shardflow
