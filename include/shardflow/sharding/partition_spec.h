// Partition specs: which mesh axes split each tensor dimension.
//
// One entry per tensor dimension: None (not split), a mesh axis given by index
// or name, or a tuple of axes (major to minor). Built in C++ as
//   PartitionSpec{sf::none, "model"}            // ('None', 'model')
//   PartitionSpec{{"data", "fsdp"}, sf::none}    // (('data', 'fsdp'), None)
// or parsed from the Python-literal string the custom op carries:
//   PartitionSpec::parse("(('r', 'b'), None)")
// A spec is checked against a mesh by translate_partition_spec (names to
// indices) and validate_partition_spec (bounds, each axis at most once), with
// PyTorch/XLA's messages (sharding-semantics §2.1).
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace shardflow {

class Mesh;
class PyValue;

struct NoneType {
  friend bool operator==(NoneType, NoneType) = default;
};
// The None entry of a partition spec.
inline constexpr NoneType none{};

// A mesh axis, by index or by name.
class AxisRef {
 public:
  template <std::integral I>
  requires(!std::same_as<I, bool>) AxisRef(I index)
      : index_(static_cast<int64_t>(index)) {}                           // NOLINT: implicit by design
  AxisRef(const char* name) : is_name_(true), name_(name) {}             // NOLINT
  AxisRef(std::string name) : is_name_(true), name_(std::move(name)) {}  // NOLINT
  AxisRef(bool) = delete;  // Python rejects bool entries; so does the compiler here.

  bool is_name() const { return is_name_; }
  int64_t index() const { return index_; }
  const std::string& name() const { return name_; }
  std::string repr() const;  // 0 or 'data'

  friend bool operator==(const AxisRef&, const AxisRef&) = default;

 private:
  bool is_name_ = false;
  int64_t index_ = 0;
  std::string name_;
};

// One entry of a partition spec.
class SpecEntry {
 public:
  enum class Kind { kNone, kAxis, kTuple, kInvalid };

  SpecEntry(NoneType) {}  // NOLINT: implicit by design
  template <std::integral I>
  requires(!std::same_as<I, bool>) SpecEntry(I index) : kind_(Kind::kAxis), axes_{AxisRef(index)} {}  // NOLINT
  SpecEntry(const char* name) : kind_(Kind::kAxis), axes_{AxisRef(name)} {}                           // NOLINT
  SpecEntry(std::string name) : kind_(Kind::kAxis), axes_{AxisRef(std::move(name))} {}                // NOLINT
  SpecEntry(std::initializer_list<AxisRef> axes) : kind_(Kind::kTuple), axes_(axes) {}
  SpecEntry(bool) = delete;

  static SpecEntry tuple(std::vector<AxisRef> axes);
  // An entry read from a literal that cannot be translated (a float, a nested
  // tuple, ...). It keeps its place so that errors come in spec order:
  // translation checks `axes_before` (the items before the bad one), then
  // reports `message`.
  static SpecEntry invalid(std::string repr, std::string message, std::vector<AxisRef> axes_before = {});

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::kNone; }
  const std::vector<AxisRef>& axes() const { return axes_; }
  const std::string& invalid_message() const { return invalid_message_; }
  std::string repr() const;

  friend bool operator==(const SpecEntry&, const SpecEntry&) = default;

 private:
  SpecEntry() = default;
  Kind kind_ = Kind::kNone;
  std::vector<AxisRef> axes_;
  std::string invalid_repr_;
  std::string invalid_message_;
};

class PartitionSpec {
 public:
  PartitionSpec() = default;  // the spec () of a scalar
  PartitionSpec(std::initializer_list<SpecEntry> entries) : entries_(entries) {}
  explicit PartitionSpec(std::vector<SpecEntry> entries) : entries_(std::move(entries)) {}

  // Parses the Python-literal form: "('data', None, 'model')", "(0, 1, 2)",
  // "('data',)", "()". Lists are accepted like tuples.
  static PartitionSpec parse(std::string_view literal);
  static PartitionSpec from_literal(const PyValue& value, std::string_view source_text = {});

  std::size_t size() const { return entries_.size(); }
  const std::vector<SpecEntry>& entries() const { return entries_; }
  const SpecEntry& operator[](std::size_t i) const { return entries_.at(i); }

  // Python's str(): "('data', None)", "((0, 1), 1)", "(0,)".
  std::string to_string() const;

  friend bool operator==(const PartitionSpec&, const PartitionSpec&) = default;

 private:
  std::vector<SpecEntry> entries_;
};

// Replaces axis names by mesh indices. Errors (PyTorch/XLA's words):
// "Partition spec cannot contain nested tuples", "Axis name z is not defined in
// the given mesh", "Spec type <class 'float'> is not supported in partition
// spec", and a name on an unnamed mesh: "argument of type 'NoneType' is not
// iterable".
PartitionSpec translate_partition_spec(const PartitionSpec& spec, const Mesh& mesh);

// Checks a translated spec: every index in [0, mesh axes), each axis at most once.
void validate_partition_spec(const PartitionSpec& translated, const Mesh& mesh);

// "Partition spec length (1) should be equal to the input rank (2)."
void check_partition_spec_rank(const PartitionSpec& spec, int64_t rank);

}  // namespace shardflow
