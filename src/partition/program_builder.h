// Appends slots, instructions and collectives to the program, and costs
// what it appended, so the partitioner can try a lowering and roll it back
// (private to partition/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardflow/partition/program.h"

namespace shardflow::partition_detail {

// ceil(a / b) without forming a + b - 1, which overflows for sizes near 2^63:
// the rows of a dim's padded tile.
inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// The number of tiles mesh axes `axes` split a dim into (their sizes' product).
inline int64_t axes_size(const Mesh& mesh, const std::vector<int>& axes) {
  int64_t size = 1;
  for (int axis : axes) size *= mesh.axis_size(axis);
  return size;
}

// A collective's fixed cost (its latency), in bytes sent, when choosing
// between ways to move a value: small tensors take the fewest collectives,
// large ones the fewest bytes. Measured (runtime_bench, 2-core VM): a 4 KiB
// all-reduce over 2 in-process devices takes 2.3 us at 23 GB/s (53 KB),
// over 8 takes 28 us at 3.2 GB/s (90 KB); MPI between hosts is ~10 us at
// ~10 GB/s (100 KB).
inline constexpr double kCollectiveLatencyBytes = 64 * 1024;

// Bytes one device sends in a ring implementation of a collective of `kind`
// over `group_size` devices; `bytes` is its larger local buffer (what a
// reduction takes in, what an all-gather puts out).
double ring_bytes_sent(CollectiveKind kind, double group_size, double bytes);

// Builds the program: slots, instructions, collectives.
class ProgramBuilder {
 public:
  ProgramBuilder(PartitionedProgram& program, const Mesh& mesh) : program_(program), mesh_(mesh) {}

  const Mesh& mesh() const { return mesh_; }
  int new_slot(const TensorType& local_type);
  const TensorType& slot_type(int slot) const { return program_.slots.at(static_cast<std::size_t>(slot)); }
  void emit(Instruction instruction) { program_.instructions.push_back(std::move(instruction)); }
  int add_collective(CollectiveInfo info);
  CollectiveInfo& collective_info(int id) { return program_.collectives.at(static_cast<std::size_t>(id)); }
  void warn(std::string warning) { program_.warnings.push_back(std::move(warning)); }

  // What the program holds at a point; rollback() drops everything added
  // since (a trial lowering, to compare costs).
  struct Mark {
    std::size_t slots, instructions, collectives, warnings;
  };
  Mark mark() const;
  void rollback(const Mark& mark);
  // The cost of the collectives added since the mark: bytes one device
  // sends in ring implementations, plus kCollectiveLatencyBytes each.
  double cost_since(const Mark& mark) const;

  int64_t axes_size(const std::vector<int>& axes) const { return partition_detail::axes_size(mesh_, axes); }
  // "'model'", "('data', 'model')"
  std::string axes_text(const std::vector<int>& axes) const;

 private:
  PartitionedProgram& program_;
  const Mesh& mesh_;
};

}  // namespace shardflow::partition_detail
