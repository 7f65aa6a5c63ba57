// Printing the partitioned program and explaining its collectives.
#include <fmt/format.h>

#include "shardflow/ir/text.h"
#include "shardflow/partition/program.h"

namespace shardflow {

std::string_view to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all-reduce";
    case CollectiveKind::kAllGather:
      return "all-gather";
    case CollectiveKind::kReduceScatter:
      return "reduce-scatter";
    case CollectiveKind::kAllToAll:
      return "all-to-all";
    case CollectiveKind::kCollectivePermute:
      return "collective-permute";
  }
  return "?";
}

std::vector<std::vector<int64_t>> CollectiveInfo::groups(const Mesh& mesh) const {
  // One group per combination of the other axes' coordinates; members in
  // the order of their coordinates over `axes` (major to minor).
  std::vector<std::vector<int64_t>> result;
  std::vector<int> others;
  for (int axis = 0; axis < mesh.num_axes(); ++axis) {
    if (std::find(axes.begin(), axes.end(), axis) == axes.end()) others.push_back(axis);
  }
  std::vector<int64_t> coords(static_cast<std::size_t>(mesh.num_axes()), 0);
  const auto advance = [&](const std::vector<int>& which) {
    for (std::size_t k = which.size(); k-- > 0;) {
      const auto a = static_cast<std::size_t>(which[k]);
      if (++coords[a] < mesh.axis_size(which[k])) return true;
      coords[a] = 0;
    }
    return false;
  };
  do {
    std::vector<int64_t> group;
    for (int a : axes) coords[static_cast<std::size_t>(a)] = 0;
    do {
      group.push_back(mesh.device_at(coords));
    } while (advance(axes));
    result.push_back(std::move(group));
  } while (advance(others));
  return result;
}

static std::string bytes_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
  return fmt::format("{} B", bytes);
}

// "'data', 'model'"
static std::string axes_list(const Mesh& mesh, const std::vector<int>& axes) {
  std::string text;
  for (std::size_t i = 0; i < axes.size(); ++i)
    text += fmt::format("{}'{}'", i > 0 ? ", " : "", mesh.axis_label(axes[i]));
  return text;
}

// "[8, 6] (dim 0 over 'a')": a position-dependent result's global shape
// and the dims its tiles split.
static std::string tile_text(const Mesh& mesh, const Instruction& instruction) {
  std::string split;
  for (std::size_t d = 0; d < instruction.tile_axes.size(); ++d) {
    if (instruction.tile_axes[d].empty()) continue;
    split += fmt::format("{}dim {} over {}", split.empty() ? "" : ", ", d, axes_list(mesh, instruction.tile_axes[d]));
  }
  return fmt::format("{} ({})", shape_to_string(instruction.global_shape), split.empty() ? "whole" : split);
}

std::string CollectiveInfo::describe(const Mesh& mesh) const {
  std::string op;
  if (kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter) {
    op = reduction == ReduceOp::kSum ? "" : reduction == ReduceOp::kMax ? " (max)" : " (min)";
  }
  const std::string in_rounds = rounds > 1 ? fmt::format(" in {} rounds", rounds) : "";
  return fmt::format("{}{} over {}{} ({}/device): {}", to_string(kind), op, axes_list(mesh, axes), in_rounds,
                     bytes_text(bytes_per_device), reason);
}

// A compute instruction's arguments as the IR prints a call, with its local
// shapes and constants (reshape's local size, a slice's bounds).
static std::string call_arguments(const Instruction& instruction) {
  const OpArgs& args = *instruction.args;
  const auto slot = [&](int index) {
    return fmt::format("%{}", instruction.inputs.at(static_cast<std::size_t>(index)));
  };
  return print_arguments(
      args.schema(),
      [&](std::size_t i) {
        const BoundArg& arg = args[i];
        if (arg.kind == BoundArg::Kind::kConstant) return arg.constant.to_string();
        if (arg.kind == BoundArg::Kind::kTensor) return slot(arg.tensors.at(0));
        std::string items;
        for (std::size_t k = 0; k < arg.tensors.size(); ++k) items += (k > 0 ? ", " : "") + slot(arg.tensors[k]);
        return "[" + items + "]";
      },
      [&](std::size_t i) { return args[i].kind == BoundArg::Kind::kConstant ? &args[i].constant : nullptr; });
}

std::string PartitionedProgram::to_string(const Graph& graph) const {
  std::string out = fmt::format("spmd @{} on {} devices, mesh {}\n", graph.name(), mesh->size(), mesh->to_string());
  const auto slot = [&](int s) { return fmt::format("%{}: {}", s, slots[static_cast<std::size_t>(s)].to_string()); };
  for (std::size_t i = 0; i < input_slots.size(); ++i) {
    out += fmt::format("  input %{} -> {}  # {}\n", graph.inputs()[i]->name(), slot(input_slots[i]),
                       input_shardings[i].to_readable());
  }
  for (const Instruction& instruction : instructions) {
    std::string inputs;
    for (std::size_t k = 0; k < instruction.inputs.size(); ++k) {
      inputs += fmt::format("{}%{}", k > 0 ? ", " : "", instruction.inputs[k]);
    }
    std::string outputs;
    for (std::size_t k = 0; k < instruction.outputs.size(); ++k) {
      outputs += (k > 0 ? ", " : "") + slot(instruction.outputs[k]);
    }
    switch (instruction.kind) {
      case InstructionKind::kCompute: {
        std::string window;
        if (instruction.indexed_input >= 0) {
          window = fmt::format("  # {} this device's rows of dim {} of %{} ({} rows over {})",
                               instruction.indexed_write ? "writes" : "looks up", instruction.dim,
                               instruction.inputs[static_cast<std::size_t>(instruction.indexed_input)],
                               instruction.global_size, axes_list(*mesh, instruction.axes_before));
        } else if (instruction.op->position_dependent) {
          window = "  # this device's tile of " + tile_text(*mesh, instruction);
        }
        out += fmt::format("  {} = {}({}){}{}\n", outputs, instruction.op->full_name(),
                           instruction.args ? call_arguments(instruction) : inputs,
                           instruction.scale != 1 ? fmt::format(" * {}", instruction.scale) : "", window);
        break;
      }
      case InstructionKind::kCollective: {
        const CollectiveInfo& info = collectives[static_cast<std::size_t>(instruction.collective)];
        const std::string dim =
            info.kind == CollectiveKind::kCollectivePermute ? std::string() : fmt::format(" dim {}", instruction.dim);
        out += fmt::format("  {} = {}({}){}  # {}\n", outputs, shardflow::to_string(info.kind), inputs, dim,
                           info.describe(*mesh));
        break;
      }
      case InstructionKind::kLocalSlice:
        out += fmt::format("  {} = local-slice({}) dim {}\n", outputs, inputs, instruction.dim);
        break;
      case InstructionKind::kMaskPadding:
        out +=
            fmt::format("  {} = mask-padding({}) dim {} with {}\n", outputs, inputs, instruction.dim, instruction.fill);
        break;
      case InstructionKind::kCountOnce:
        out +=
            fmt::format("  {} = count-once({}) over {}\n", outputs, inputs, axes_list(*mesh, instruction.axes_before));
        break;
    }
  }
  for (std::size_t i = 0; i < output_slots.size(); ++i) {
    out += fmt::format("  output {} <- %{}  # {}\n", i, output_slots[i], output_shardings[i].to_readable());
  }
  return out;
}

}  // namespace shardflow
