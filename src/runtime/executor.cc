// The executor of partitioned programs: every device runs the same
// instruction list on its own slots; collectives go through its Communicator.
#include "shardflow/runtime/executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>

#include "shardflow/base/error.h"
#include "shardflow/partition/halo.h"
#include "shardflow/tensor/device_memory.h"
#include "shardflow/trace/profile.h"

namespace shardflow {

namespace {

// Tile of a device along a dim sharded over `axes` (coordinates, major first).
int64_t tile_index(const Mesh& mesh, const std::vector<int64_t>& coords, const std::vector<int>& axes) {
  int64_t tile = 0;
  for (int axis : axes) tile = tile * mesh.axis_size(axis) + coords[static_cast<std::size_t>(axis)];
  return tile;
}

// The inverse: sets `coords` over `axes` to the ones that select `tile`.
void set_tile_coords(const Mesh& mesh, std::vector<int64_t>& coords, const std::vector<int>& axes, int64_t tile) {
  for (std::size_t a = axes.size(); a-- > 0;) {
    coords[static_cast<std::size_t>(axes[a])] = tile % mesh.axis_size(axes[a]);
    tile /= mesh.axis_size(axes[a]);
  }
}

int64_t axes_size(const Mesh& mesh, const std::vector<int>& axes) {
  int64_t size = 1;
  for (int axis : axes) size *= mesh.axis_size(axis);
  return size;
}

// A dim of a row-major tensor viewed as [outer, rows, inner].
struct DimView {
  int64_t outer = 1, rows = 1, inner = 1;
  DimView(const Shape& shape, int dim) {
    for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
      const int64_t extent = shape[static_cast<std::size_t>(d)];
      if (d < dim) outer *= extent;
      if (d == dim) rows = extent;
      if (d > dim) inner *= extent;
    }
  }
};

// Copies rows [from, from + count) of `source` (dim `dim`) to rows
// [to, to + count) of `target`; both have the same other dims.
void copy_rows(const DenseTensor& source, int64_t from, DenseTensor& target, int64_t to, int64_t count, int dim) {
  if (count <= 0) return;
  const DimView s(source.shape(), dim), t(target.shape(), dim);
  const std::size_t element = element_size(source.dtype());
  const std::size_t run = static_cast<std::size_t>(count * s.inner) * element;
  for (int64_t o = 0; o < s.outer; ++o) {
    std::memcpy(target.data() + static_cast<std::size_t>((o * t.rows + to) * t.inner) * element,
                source.data() + static_cast<std::size_t>((o * s.rows + from) * s.inner) * element, run);
  }
}

// Copies the box of `extent` at `from` in `source` to `to` in `target`
// (any shapes of one rank and dtype). Trailing dims that both tensors and the
// box hold whole are copied as one run.
void copy_box(const DenseTensor& source, const Shape& from, DenseTensor& target, const Shape& to, const Shape& extent) {
  if (std::any_of(extent.begin(), extent.end(), [](int64_t e) { return e <= 0; })) return;
  const Shape& s = source.shape();
  const Shape& t = target.shape();
  std::size_t run_dims = extent.size();  // dims [run_dims, rank) form one contiguous run
  std::size_t run = element_size(source.dtype());
  while (run_dims > 0 && extent[run_dims - 1] == s[run_dims - 1] && extent[run_dims - 1] == t[run_dims - 1]) {
    run *= static_cast<std::size_t>(extent[--run_dims]);
  }
  if (run_dims == 0) {
    std::memcpy(target.data(), source.data(), run);
    return;
  }
  // The innermost partial dim's rows are contiguous too: one memcpy per
  // index of the dims before it.
  const std::size_t last = run_dims - 1;
  std::vector<int64_t> index(last, 0);
  const auto offset = [&](const Shape& shape, const Shape& origin) {
    int64_t flat = 0;
    for (std::size_t d = 0; d < last; ++d) flat = flat * shape[d] + origin[d] + index[d];
    flat = flat * shape[last] + origin[last];
    for (std::size_t d = last + 1; d < shape.size(); ++d) flat *= shape[d];
    return static_cast<std::size_t>(flat);
  };
  const std::size_t element = element_size(source.dtype());
  const std::size_t bytes = static_cast<std::size_t>(extent[last]) * run;
  for (;;) {
    std::memcpy(target.data() + offset(t, to) * element, source.data() + offset(s, from) * element, bytes);
    std::size_t d = last;
    while (d > 0 && ++index[d - 1] == extent[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

// `value` in T; integers saturate: the padding a min reduces over is +inf,
// which is the dtype's largest integer (converted as it is, an int32 amin
// over a padded sharded dim read INT_MIN).
template <class T>
T saturated(double value) {
  if constexpr (std::is_integral_v<T>) {
    if (value >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    if (value <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
    if (std::isnan(value)) return T{0};
  }
  return store<T>(value);
}

DenseTensor filled(DType dtype, const Shape& shape, double value) {
  DenseTensor tensor = DenseTensor::empty(dtype, shape);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    std::fill_n(tensor.data_as<T>(), tensor.numel(), saturated<T>(value));
  });
  return tensor;
}

class DeviceRun {
 public:
  // `timed`: time each instruction, for times().
  DeviceRun(const PartitionedProgram& program, int64_t device, Communicator& comm, bool timed)
      : program_(program),
        mesh_(*program.mesh),
        comm_(comm),
        timed_(timed),
        coords_(mesh_.coords_of(device)),
        slots_(program.slots.size()) {}

  // Per op kind: the calls and seconds of this run (when timed).
  const std::vector<OpProfile::Entry>& times() const { return times_.totals(); }

  std::vector<DenseTensor>& slots() { return slots_; }

  void execute() {
    using Clock = std::chrono::steady_clock;
    for (const Instruction& instruction : program_.instructions) {
      const Clock::time_point start = timed_ ? Clock::now() : Clock::time_point();
      switch (instruction.kind) {
        case InstructionKind::kCompute:
          compute(instruction);
          break;
        case InstructionKind::kCollective:
          collective(instruction);
          break;
        case InstructionKind::kLocalSlice:
          local_slice(instruction);
          break;
        case InstructionKind::kMaskPadding:
          mask(instruction);
          break;
        case InstructionKind::kCountOnce:
          count_once(instruction);
          break;
      }
      if (timed_) {
        times_.add(profile_key(instruction), std::chrono::duration<double>(Clock::now() - start).count(),
                   [&] { return profile_name(instruction); });
      }
      // What device_memory() reports is then what is still ahead.
      for (int slot : instruction.releases) slots_[static_cast<std::size_t>(slot)] = DenseTensor();
    }
  }

 private:
  // What an instruction is timed as: its op, or else its kind (each
  // collective kind apart): a key to count it under, and the name shown.
  const void* profile_key(const Instruction& instruction) const {
    static constexpr char kCollectiveKinds[8] = {}, kInstructionKinds[8] = {};  // one address each
    switch (instruction.kind) {
      case InstructionKind::kCompute:
        return instruction.op;
      case InstructionKind::kCollective:
        return &kCollectiveKinds[static_cast<std::size_t>(collective_kind(instruction))];
      default:
        return &kInstructionKinds[static_cast<std::size_t>(instruction.kind)];
    }
  }
  std::string profile_name(const Instruction& instruction) const {
    switch (instruction.kind) {
      case InstructionKind::kCompute:
        return instruction.op->full_name();
      case InstructionKind::kCollective:
        return std::string(to_string(collective_kind(instruction)));
      case InstructionKind::kLocalSlice:
        return "local-slice";
      case InstructionKind::kMaskPadding:
        return "mask-padding";
      case InstructionKind::kCountOnce:
        return "count-once";
    }
    return "?";
  }
  CollectiveKind collective_kind(const Instruction& instruction) const {
    return program_.collectives[static_cast<std::size_t>(instruction.collective)].kind;
  }

  const DenseTensor& in(const Instruction& instruction, std::size_t i = 0) const {
    return slots_[static_cast<std::size_t>(instruction.inputs[i])];
  }
  const TensorType& out_type(const Instruction& instruction, std::size_t i = 0) const {
    return program_.slots[static_cast<std::size_t>(instruction.outputs[i])];
  }
  void set(const Instruction& instruction, DenseTensor value, std::size_t i = 0) {
    const TensorType& type = out_type(instruction, i);
    if (value.dtype() != type.dtype || value.shape() != type.shape) {
      throw Error(fmt::format("internal: slot %{} should be {} but got {}{}", instruction.outputs[i], type.to_string(),
                              dtype_name(value.dtype()), shape_to_string(value.shape())));
    }
    slots_[static_cast<std::size_t>(instruction.outputs[i])] = std::move(value);
  }

  // The group of this device over `axes`: devices that differ only there,
  // ordered by their coordinates over `axes`.
  const DeviceGroup& group(const std::vector<int>& axes) {
    auto found = groups_.find(axes);
    if (found != groups_.end()) return found->second;
    DeviceGroup g;
    std::vector<int64_t> coords = coords_;
    const std::size_t n = static_cast<std::size_t>(axes_size(mesh_, axes));
    for (std::size_t k = 0; k < n; ++k) {
      set_tile_coords(mesh_, coords, axes, static_cast<int64_t>(k));
      g.devices.push_back(mesh_.device_at(coords));
    }
    return groups_.emplace(axes, std::move(g)).first->second;
  }

  void compute(const Instruction& instruction) {
    if (instruction.reinterprets) {
      set(instruction, in(instruction).reshaped(out_type(instruction).shape));
      return;
    }
    std::vector<DenseTensor>& inputs = operands_;
    inputs.clear();
    for (std::size_t k = 0; k < instruction.inputs.size(); ++k) {
      const int slot = instruction.inputs[k];
      const bool handed_over =
          std::find(instruction.releases.begin(), instruction.releases.end(), slot) != instruction.releases.end() &&
          std::count(instruction.inputs.begin(), instruction.inputs.end(), slot) == 1;
      inputs.push_back(handed_over ? std::move(slots_[static_cast<std::size_t>(slot)])
                                   : slots_[static_cast<std::size_t>(slot)]);
    }
    if (!instruction.args) throw Error(fmt::format("internal: {} has no bound arguments", instruction.op->full_name()));
    std::vector<DenseTensor> outputs;
    if (instruction.indexed_input >= 0) {
      const Shape& shard = inputs[static_cast<std::size_t>(instruction.indexed_input)].shape();
      const int64_t shard_rows = shard[static_cast<std::size_t>(instruction.dim)];
      const IndexWindow window{tile_index(mesh_, coords_, instruction.axes_before) * shard_rows,
                               instruction.global_size};
      outputs = instruction.op->windowed_kernel(*instruction.args, inputs, window);
    } else if (instruction.op->position_dependent) {
      outputs = instruction.op->tiled_kernel(*instruction.args, inputs, tile_of(instruction));
    } else {
      outputs = instruction.op->kernel(*instruction.args, inputs);
    }
    inputs.clear();  // drop the references before the results are stored
    if (outputs.size() != instruction.outputs.size()) {
      throw Error(fmt::format("internal: {} returned {} results for {} outputs", instruction.op->full_name(),
                              outputs.size(), instruction.outputs.size()));
    }
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (instruction.scale != 1) outputs[i] = scaled(outputs[i], instruction.scale);
      set(instruction, std::move(outputs[i]), i);
    }
  }

  // Where this device's tile of a position-dependent op's result lies.
  ResultTile tile_of(const Instruction& instruction) const {
    ResultTile tile{{}, out_type(instruction).shape, instruction.global_shape};
    for (std::size_t d = 0; d < tile.shape.size(); ++d) {
      tile.begin.push_back(tile_index(mesh_, coords_, instruction.tile_axes[d]) * tile.shape[d]);
    }
    return tile;
  }

  static DenseTensor scaled(const DenseTensor& value, double scale) {
    DenseTensor out = DenseTensor::empty(value.dtype(), value.shape());
    visit_dtype(value.dtype(), [&](auto tag) {
      using T = decltype(tag);
      for (int64_t i = 0; i < value.numel(); ++i) {
        out.data_as<T>()[i] = store<T>(static_cast<double>(load(value.data_as<T>()[i])) * scale);
      }
    });
    return out;
  }

  void collective(const Instruction& instruction) {
    const CollectiveInfo& info = program_.collectives[static_cast<std::size_t>(instruction.collective)];
    const DeviceGroup& members = group(info.axes);
    const DenseTensor& input = in(instruction);
    const TensorType& type = out_type(instruction);
    switch (info.kind) {
      case CollectiveKind::kAllReduce: {
        DenseTensor out = DenseTensor::empty(input.dtype(), input.shape());
        std::memcpy(out.data(), input.data(), input.nbytes());
        comm_.all_reduce(members, {out.data(), out.nbytes()}, out.dtype(), info.reduction);
        set(instruction, std::move(out));
        return;
      }
      case CollectiveKind::kAllGather: {
        const int dim = instruction.dim;
        const int64_t n = members.size();
        DenseTensor gathered = DenseTensor::empty(input.dtype(), [&] {
          Shape s = input.shape();
          s.insert(s.begin(), n);
          return s;
        }());
        comm_.all_gather(members, input.bytes(), {gathered.data(), gathered.nbytes()});
        // Chunk g holds tile (p * n + g) of the dim; place it at its offset
        // inside this device's new tile p (rows past the dim's end are padding).
        DenseTensor out = DenseTensor::zeros(type.dtype, type.shape);
        const int64_t s_in = input.shape()[static_cast<std::size_t>(dim)];
        const int64_t s_out = type.shape[static_cast<std::size_t>(dim)];
        const int64_t size = instruction.global_size;
        const int64_t p = tile_index(mesh_, coords_, instruction.axes_after);
        for (int64_t g = 0; g < n; ++g) {
          const int64_t global_start = (p * n + g) * s_in;
          const int64_t offset = global_start - p * s_out;
          const int64_t count = std::min({s_in, s_out - offset, size - global_start});
          if (count > 0) copy_rows(view_chunk(gathered, g, input.shape()), 0, out, offset, count, dim);
        }
        set(instruction, std::move(out));
        return;
      }
      case CollectiveKind::kReduceScatter: {
        const int dim = instruction.dim;
        const int64_t n = members.size();
        // Chunk g = rows [g * s_out, (g + 1) * s_out): make each contiguous.
        // A whole dim that does not split evenly ends early: the last
        // chunks are padded with zeros (padding rows, never read as values).
        const int64_t s_in = input.shape()[static_cast<std::size_t>(dim)];
        const int64_t s_out = type.shape[static_cast<std::size_t>(dim)];
        DenseTensor packed = DenseTensor::empty(input.dtype(), [&] {
          Shape s = type.shape;
          s.insert(s.begin(), n);
          return s;
        }());
        for (int64_t g = 0; g < n; ++g) {
          const int64_t count = std::clamp<int64_t>(s_in - g * s_out, 0, s_out);
          DenseTensor chunk =
              count < s_out ? DenseTensor::zeros(type.dtype, type.shape) : DenseTensor::empty(type.dtype, type.shape);
          copy_rows(input, g * s_out, chunk, 0, count, dim);
          std::memcpy(packed.data() + static_cast<std::size_t>(g) * chunk.nbytes(), chunk.data(), chunk.nbytes());
        }
        DenseTensor out = DenseTensor::empty(type.dtype, type.shape);
        comm_.reduce_scatter(members, packed.bytes(), {out.data(), out.nbytes()}, type.dtype, info.reduction);
        set(instruction, std::move(out));
        return;
      }
      case CollectiveKind::kAllToAll: {
        // Member j receives, of every dim that gains axes, the chunk its
        // coordinates over the gained axes select (padded where the dim
        // ends early); a dim that loses axes takes member g's piece at the
        // block g's coordinates over the lost axes select. Several dims may
        // gain and lose at once: one exchange over all the axes that move.
        const std::vector<std::vector<int>>& before = instruction.dims_before;
        const std::vector<std::vector<int>>& after = instruction.dims_after;
        const std::size_t rank = before.size();
        const auto n = static_cast<std::size_t>(members.size());
        Shape piece_shape = input.shape();
        for (std::size_t d = 0; d < rank; ++d) {
          if (after[d].size() > before[d].size()) piece_shape[d] = type.shape[d];
        }
        const auto moved_axes = [](const std::vector<int>& longer, const std::vector<int>& shorter) {
          return std::vector<int>(longer.begin() + static_cast<std::ptrdiff_t>(shorter.size()), longer.end());
        };
        // Every piece is written whole below (its padding zeroed first).
        DenseTensor packed = DenseTensor::empty(input.dtype(), [&] {
          Shape s = piece_shape;
          s.insert(s.begin(), static_cast<int64_t>(n));
          return s;
        }());
        const std::size_t piece_bytes = packed.nbytes() / n;
        DenseTensor piece = DenseTensor::empty(input.dtype(), piece_shape);
        for (std::size_t j = 0; j < n; ++j) {
          const std::vector<int64_t> coords = mesh_.coords_of(members.devices[j]);
          Shape start(rank, 0), extent = piece_shape;
          for (std::size_t d = 0; d < rank; ++d) {
            if (after[d].size() <= before[d].size()) continue;
            start[d] = tile_index(mesh_, coords, moved_axes(after[d], before[d])) * piece_shape[d];
            extent[d] = std::clamp<int64_t>(input.shape()[d] - start[d], 0, piece_shape[d]);
          }
          std::memset(piece.data(), 0, piece_bytes);  // padding rows, never read as values
          copy_box(input, start, piece, Shape(rank, 0), extent);
          std::memcpy(packed.data() + j * piece_bytes, piece.data(), piece_bytes);
        }
        DenseTensor received = DenseTensor::empty(input.dtype(), packed.shape());
        comm_.all_to_all(members, packed.bytes(), {received.data(), received.nbytes()});
        DenseTensor out = DenseTensor::empty(type.dtype, type.shape);
        for (std::size_t g = 0; g < n; ++g) {
          const std::vector<int64_t> coords = mesh_.coords_of(members.devices[g]);
          std::memcpy(piece.data(), received.data() + g * piece_bytes, piece_bytes);
          Shape start(rank, 0), extent = piece_shape;
          for (std::size_t d = 0; d < rank; ++d) {
            if (before[d].size() <= after[d].size()) continue;
            start[d] = tile_index(mesh_, coords, moved_axes(before[d], after[d])) * piece_shape[d];
            extent[d] = std::clamp<int64_t>(type.shape[d] - start[d], 0, piece_shape[d]);
          }
          copy_box(piece, Shape(rank, 0), out, start, extent);
        }
        set(instruction, std::move(out));
        return;
      }
      case CollectiveKind::kCollectivePermute: {
        if (instruction.dims_before.empty()) {
          halo_exchange(instruction, members);
          return;
        }
        // Every member receives the tile its coordinates select under the new
        // sharding from the member whose coordinates select it under the old.
        std::vector<std::pair<int64_t, int64_t>> pairs;
        for (int64_t target : members.devices) {
          const std::vector<int64_t> target_coords = mesh_.coords_of(target);
          std::vector<int64_t> source_coords = target_coords;
          for (std::size_t d = 0; d < instruction.dims_after.size(); ++d) {
            set_tile_coords(mesh_, source_coords, instruction.dims_before[d],
                            tile_index(mesh_, target_coords, instruction.dims_after[d]));
          }
          pairs.emplace_back(mesh_.device_at(source_coords), target);
        }
        DenseTensor out = DenseTensor::empty(type.dtype, type.shape);
        comm_.collective_permute(members, pairs, input.bytes(), {out.data(), out.nbytes()});
        set(instruction, std::move(out));
        return;
      }
    }
  }

  // The rows of its new tile this device holds are kept; the others come
  // in the rounds of the exchange's schedule, each a collective-permute of
  // a buffer of that round's rows (halo.h).
  void halo_exchange(const Instruction& instruction, const DeviceGroup& members) {
    const DenseTensor& input = in(instruction);
    const TensorType& type = out_type(instruction);
    const int dim = instruction.dim;
    const auto d = static_cast<std::size_t>(dim);
    const HaloSchedule schedule = halo_schedule(mesh_, instruction.global_size, instruction.axes_before,
                                                instruction.axes_after, input.shape()[d]);
    const int64_t me = tile_index(mesh_, coords_, schedule.axes);
    const int64_t held = input.shape()[d], wanted = type.shape[d];
    const int64_t held_start = tile_index(mesh_, coords_, instruction.axes_before) * held;
    const int64_t wanted_start = tile_index(mesh_, coords_, instruction.axes_after) * wanted;
    DenseTensor out = DenseTensor::zeros(type.dtype, type.shape);
    const int64_t begin = std::max(held_start, wanted_start);
    const int64_t end = std::min({held_start + held, wanted_start + wanted, instruction.global_size});
    copy_rows(input, begin - held_start, out, begin - wanted_start, end - begin, dim);
    for (std::size_t r = 0; r < schedule.rounds.size(); ++r) {
      Shape buffer_shape = input.shape();
      buffer_shape[d] = schedule.round_rows[r];
      DenseTensor send = DenseTensor::zeros(input.dtype(), buffer_shape);
      DenseTensor received = DenseTensor::empty(input.dtype(), buffer_shape);
      std::vector<std::pair<int64_t, int64_t>> pairs;
      const HaloTransfer* incoming = nullptr;
      for (const HaloTransfer& transfer : schedule.rounds[r]) {
        pairs.emplace_back(members.devices[static_cast<std::size_t>(transfer.source)],
                           members.devices[static_cast<std::size_t>(transfer.target)]);
        if (transfer.source == me) {
          copy_rows(input, transfer.begin - held_start, send, 0, transfer.end - transfer.begin, dim);
        }
        if (transfer.target == me) incoming = &transfer;
      }
      comm_.collective_permute(members, pairs, send.bytes(), {received.data(), received.nbytes()});
      if (incoming != nullptr) {
        copy_rows(received, 0, out, incoming->begin - wanted_start, incoming->end - incoming->begin, dim);
      }
    }
    set(instruction, std::move(out));
  }

  // Chunk g of a buffer holding n chunks of `shape`, as its own tensor.
  static DenseTensor view_chunk(const DenseTensor& chunks, int64_t g, const Shape& shape) {
    DenseTensor chunk = DenseTensor::empty(chunks.dtype(), shape);
    std::memcpy(chunk.data(), chunks.data() + static_cast<std::size_t>(g) * chunk.nbytes(), chunk.nbytes());
    return chunk;
  }

  void local_slice(const Instruction& instruction) {
    const DenseTensor& input = in(instruction);
    const TensorType& type = out_type(instruction);
    const int dim = instruction.dim;
    const int64_t s_in = input.shape()[static_cast<std::size_t>(dim)];
    const int64_t s_out = type.shape[static_cast<std::size_t>(dim)];
    const int64_t old_tile = tile_index(mesh_, coords_, instruction.axes_before);
    const int64_t new_tile = tile_index(mesh_, coords_, instruction.axes_after);
    const int64_t global_start = new_tile * s_out;
    const int64_t offset = global_start - old_tile * s_in;
    const int64_t count = std::min({s_out, s_in - offset, instruction.global_size - global_start});
    DenseTensor out = DenseTensor::zeros(type.dtype, type.shape);
    copy_rows(input, offset, out, 0, count, dim);
    set(instruction, std::move(out));
  }

  void mask(const Instruction& instruction) {
    const DenseTensor& input = in(instruction);
    const int dim = instruction.dim;
    const int64_t s = input.shape()[static_cast<std::size_t>(dim)];
    const int64_t tile = tile_index(mesh_, coords_, instruction.axes_before);
    const int64_t valid = std::clamp<int64_t>(instruction.global_size - tile * s, 0, s);
    DenseTensor out = DenseTensor::empty(input.dtype(), input.shape());
    std::memcpy(out.data(), input.data(), input.nbytes());
    if (valid < s) {
      Shape padding_shape = input.shape();
      padding_shape[static_cast<std::size_t>(dim)] = s - valid;
      copy_rows(filled(input.dtype(), padding_shape, instruction.fill), 0, out, valid, s - valid, dim);
    }
    set(instruction, std::move(out));
  }

  void count_once(const Instruction& instruction) {
    const DenseTensor& input = in(instruction);
    const bool first = tile_index(mesh_, coords_, instruction.axes_before) == 0;
    set(instruction, first ? input : filled(input.dtype(), input.shape(), 0));
  }

  const PartitionedProgram& program_;
  const Mesh& mesh_;
  Communicator& comm_;
  bool timed_;
  detail::RunTimes times_;
  std::vector<int64_t> coords_;
  std::vector<DenseTensor> slots_;
  std::vector<DenseTensor> operands_;  // compute()'s, kept to reuse its allocation
  std::map<std::vector<int>, DeviceGroup> groups_;
};

// The communicator of a one-device program, which has no collectives.
class NoCollectives final : public Communicator {
 public:
  int64_t device() const override { return 0; }
  int64_t num_devices() const override { return 1; }
  void all_reduce(const DeviceGroup&, std::span<std::byte>, DType, ReduceOp) override { fail(); }
  void all_gather(const DeviceGroup&, std::span<const std::byte>, std::span<std::byte>) override { fail(); }
  void reduce_scatter(const DeviceGroup&, std::span<const std::byte>, std::span<std::byte>, DType, ReduceOp) override {
    fail();
  }
  void all_to_all(const DeviceGroup&, std::span<const std::byte>, std::span<std::byte>) override { fail(); }
  void collective_permute(const DeviceGroup&, const std::vector<std::pair<int64_t, int64_t>>&,
                          std::span<const std::byte>, std::span<std::byte>) override {
    fail();
  }
  void barrier(const DeviceGroup&) override { fail(); }

 private:
  [[noreturn]] static void fail() { throw Error("internal: a one-device program calls a collective"); }
};

// Whether `tensor` is already laid out as `sharding` says.
bool laid_out_as(const Tensor& tensor, const Sharding& sharding) {
  const std::optional<Sharding> current = tensor.sharding();
  return current && current->mesh() == sharding.mesh() && current->all_dim_axes() == sharding.all_dim_axes();
}

}  // namespace

std::vector<Tensor> run_program(const PartitionedProgram& program, Runtime& runtime, std::vector<Tensor> inputs,
                                OpProfile* profile) {
  return run_program(
      program, runtime.num_devices(), [&](const DeviceProgram& fn) { runtime.run(fn); }, std::move(inputs), profile);
}

std::vector<Tensor> run_program(const PartitionedProgram& program, int64_t num_devices,
                                const std::function<void(const DeviceProgram&)>& run_on_devices,
                                std::vector<Tensor> inputs, OpProfile* profile) {
  const Mesh& mesh = *program.mesh;
  // A program on one device (a graph without annotations) runs on device 0.
  if (num_devices != mesh.size() && mesh.size() != 1) {
    throw Error(fmt::format("the program is partitioned over {} devices (mesh {}) but the runtime has {}", mesh.size(),
                            mesh.to_string(), num_devices));
  }
  if (inputs.size() != program.input_slots.size()) {
    throw Error(fmt::format("the program takes {} inputs, got {}", program.input_slots.size(), inputs.size()));
  }
  // Per input: the shards every device takes (existing eager shards), or the
  // global value and its layout (each device copies its own tile).
  struct Feed {
    std::vector<LocalShard> shards;
    DenseTensor global;
    ShardLayout layout;
  };
  std::vector<Feed> feeds(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Sharding& sharding = program.input_shardings[i];
    if (inputs[i].is_meta()) throw Error(fmt::format("input {} is shape-only (meta): nothing to run on", i));
    if (laid_out_as(inputs[i], sharding)) {
      feeds[i].shards = inputs[i].local_shards();
    } else {
      feeds[i].global = inputs[i].value();
      feeds[i].layout = shard_layout(sharding, inputs[i].shape());
    }
  }
  inputs.clear();  // the feeds hold the buffers now: a donated shard has no other holder
  // Per device: its outputs, if it ran in this process (a multi-process
  // runtime runs only this process's devices).
  std::vector<std::vector<DenseTensor>> outputs(static_cast<std::size_t>(mesh.size()));
  std::vector<char> ran(static_cast<std::size_t>(mesh.size()), 0);
  // Per device: its op times, added to the profile once every device is done.
  std::vector<std::vector<OpProfile::Entry>> times(profile ? static_cast<std::size_t>(mesh.size()) : 0);
  const DeviceProgram device_program = [&](int64_t device, Communicator& comm) {
    if (device >= mesh.size()) return;
    const DeviceMemoryScope memory_scope(device);
    DeviceRun run(program, device, comm, profile != nullptr);
    for (std::size_t i = 0; i < feeds.size(); ++i) {
      const TensorType& type = program.slots[static_cast<std::size_t>(program.input_slots[i])];
      DenseTensor local;
      if (!feeds[i].shards.empty()) {
        local = std::move(feeds[i].shards[static_cast<std::size_t>(device)].data);  // each device takes its own
      } else if (feeds[i].layout.shard_shape == feeds[i].layout.global_shape) {
        // The whole tensor: read where it lies (a torch parameter fed without
        // a copy), by every device. Kernels write only into buffers nothing
        // else holds, so sharing it is safe; one device takes it, and writes
        // into it when it was the only holder (a donated cache).
        local = mesh.size() == 1 ? std::move(feeds[i].global) : feeds[i].global;
      } else {
        local = DenseTensor::empty(type.dtype, type.shape);
        copy_shard(feeds[i].layout, static_cast<std::size_t>(device), feeds[i].global.bytes(), element_size(type.dtype),
                   {local.data(), local.nbytes()});
      }
      run.slots()[static_cast<std::size_t>(program.input_slots[i])] = std::move(local);
    }
    run.execute();
    for (int slot : program.output_slots) {
      outputs[static_cast<std::size_t>(device)].push_back(run.slots()[static_cast<std::size_t>(slot)]);
    }
    if (profile) times[static_cast<std::size_t>(device)] = run.times();
    ran[static_cast<std::size_t>(device)] = 1;
  };
  if (mesh.size() == 1) {
    // Nothing to communicate: run here. In a multi-process job every process
    // runs such a program itself, like any unsharded host computation.
    NoCollectives no_collectives;
    device_program(0, no_collectives);
  } else {
    run_on_devices(device_program);
  }
  for (std::size_t device = 0; device < times.size(); ++device) {
    if (ran[device]) profile->add_run(static_cast<int64_t>(device), times[device]);
  }
  const auto first_ran = std::find(ran.begin(), ran.end(), 1);
  std::vector<Tensor> results;
  for (std::size_t o = 0; o < program.output_slots.size(); ++o) {
    const Sharding& sharding = program.output_shardings[o];
    const TensorType& type = program.slots[static_cast<std::size_t>(program.output_slots[o])];
    // A replicated value on several devices keeps each device's copy: fed
    // back (a replicated KV cache donated to the next run) each device then
    // updates its own in place, where one buffer shared by all would be
    // copied by every device on every call (stories110M, the seed's
    // pattern on (1,1,2): 24 index_copy of 3 MiB, 8.8 ms per decode step).
    if (sharding.is_replicated() && first_ran != ran.end() && mesh.size() == 1) {
      results.emplace_back(outputs[static_cast<std::size_t>(first_ran - ran.begin())][o]);
      continue;
    }
    std::vector<DenseTensor> shards(static_cast<std::size_t>(mesh.size()));
    for (std::size_t device = 0; device < shards.size(); ++device) {
      if (ran[device]) shards[device] = outputs[device][o];
    }
    results.push_back(Tensor::from_shards(type.dtype, program.output_types[o].shape, sharding, std::move(shards)));
  }
  return results;
}

}  // namespace shardflow
