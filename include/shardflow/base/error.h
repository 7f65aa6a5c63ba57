// The one exception type of shardflow.
//
// Every error a user can cause (bad input, an invalid mesh, a malformed string)
// is reported by throwing `shardflow::Error` with a message that says what was
// wrong, where, and what was expected. Internal invariants use assert().
#pragma once

#include <stdexcept>
#include <string>

namespace shardflow {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An invalid mesh or partition spec: what PyTorch/XLA rejects when a Mesh is
// built or a spec is checked against it (its AssertionError, ValueError and
// TypeError there). The Python package raises it as a ValueError.
class InvalidShardingError : public Error {
 public:
  using Error::Error;
};

}  // namespace shardflow
