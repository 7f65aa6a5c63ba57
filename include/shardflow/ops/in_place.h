// In-place forms of ops, for memory a caller owns.
//
// Kernels never write a buffer they did not create (or that another holder
// shares): ops are functional. The PyTorch bridge must still bring a torch
// tensor that a compiled graph wrote in place (a KV cache) up to date, and
// does so here, with the small operands the graph returned, instead of
// copying the whole new value.
#pragma once

#include <cstdint>

#include "shardflow/tensor/dense_tensor.h"

namespace shardflow::ops {

// self[..., index[k], ...] = source[..., k, ...] along `dim`, written into
// self's buffer: index_put_ with one index tensor (negative indices count
// from the end), which is also index_copy_. index_copy_'s checks and errors
// apply; source has self's shape with index.numel() rows at `dim`, or that
// shape without some of its leading 1s (index_put_ broadcasts those).
void put_rows_into(DenseTensor& self, int64_t dim, const DenseTensor& index, const DenseTensor& source);

}  // namespace shardflow::ops
