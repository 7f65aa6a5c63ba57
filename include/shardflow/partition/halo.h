// A halo exchange: one dim moved between two tilings over mesh axes whose
// tiles do not nest (7 rows in tiles of 4 wanted in tiles of 2; tiles of 5
// wanted in tiles of 3), so no gather or slice makes one from the other.
// Each device keeps the rows it holds and receives only those it lacks,
// from the devices holding them, in rounds of collective-permutes in which
// every device sends at most once and receives at most once. Where XLA
// sends such rows with collective-permutes too, the alternative is a
// gather of the whole dim.
#pragma once

#include <cstdint>
#include <vector>

#include "shardflow/sharding/mesh.h"

namespace shardflow {

// Rows [begin, end) of the dim, from group member `source` to `target`
// (members numbered by their coordinates over HaloSchedule::axes, major
// first, as a collective's group lists them).
struct HaloTransfer {
  int64_t source = 0, target = 0;
  int64_t begin = 0, end = 0;
};

struct HaloSchedule {
  std::vector<int> axes;  // the group: the axes before, then the others after
  std::vector<std::vector<HaloTransfer>> rounds;
  std::vector<int64_t> round_rows;  // each round's buffer, in rows: its largest transfer
  int64_t rows_sent() const;        // the sum of round_rows: what a device sends at most
};

// The exchange moving a dim of `size` rows from tiles over `before` to
// tiles over `after` (ceil-sized tiles, the last ones short or empty).
// `held_rows`, when given, is the size of the tiles before instead: a
// reshape computed in its operand's tiles of a factor that does not divide
// evenly (7 rows over 2 devices, then merged with 2: tiles of 8 of 14, not 7).
// Every device computes the same schedule.
HaloSchedule halo_schedule(const Mesh& mesh, int64_t size, const std::vector<int>& before,
                           const std::vector<int>& after, int64_t held_rows = 0);

}  // namespace shardflow
