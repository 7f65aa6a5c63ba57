#include "shardflow/sharding/shard_diagram.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "shardflow/base/text.h"

namespace shardflow {

std::string compress_device_list(std::vector<int64_t> devices) {
  std::sort(devices.begin(), devices.end());
  std::string out;
  for (std::size_t i = 0; i < devices.size();) {
    std::size_t j = i;
    while (j + 1 < devices.size() && devices[j + 1] == devices[j] + 1) ++j;
    if (!out.empty()) out += ",";
    if (j - i >= 2) {
      out += fmt::format("{}-{}", devices[i], devices[j]);
    } else {
      out += std::to_string(devices[i]);
      if (j > i) out += "," + std::to_string(devices[j]);
    }
    i = j + 1;
  }
  return out;
}

namespace {

class DiagramWriter {
 public:
  DiagramWriter(const ShardLayout& layout, bool label_ranges) : layout_(layout), label_ranges_(label_ranges) {}

  std::string draw() {
    const std::size_t rank = layout_.global_shape.size();
    std::vector<std::size_t> split_dims;
    for (std::size_t d = 0; d < rank; ++d) {
      if (layout_.num_tiles[d] > 1) split_dims.push_back(d);
    }
    // The grid takes the two split dims with the most shards, in dim order.
    std::vector<std::size_t> by_shards = split_dims;
    std::stable_sort(by_shards.begin(), by_shards.end(),
                     [&](std::size_t a, std::size_t b) { return layout_.num_tiles[a] > layout_.num_tiles[b]; });
    if (by_shards.size() > 2) by_shards.resize(2);
    std::sort(by_shards.begin(), by_shards.end());
    if (by_shards.size() == 2) row_dim_ = by_shards[0];
    if (!by_shards.empty()) col_dim_ = by_shards.back();
    for (std::size_t d : split_dims) {
      if (d != row_dim_ && d != col_dim_) other_dims_.push_back(d);
    }

    std::string out;
    std::vector<std::string> whole;
    for (std::size_t d = 0; d < rank; ++d) {
      if (layout_.num_tiles[d] == 1) {
        whole.push_back(label_ranges_ ? fmt::format("dim {} ({})", d, layout_.global_shape[d])
                                      : fmt::format("dim {}", d));
      }
    }
    if (!whole.empty()) {
      out += "not split (whole on every device): ";
      for (std::size_t i = 0; i < whole.size(); ++i) out += (i > 0 ? ", " : "") + whole[i];
      out += "\n";
    }

    // Group the devices by the block they hold.
    std::map<std::vector<int64_t>, std::vector<int64_t>> devices_of_block;
    for (const DeviceShard& shard : layout_.shards) {
      devices_of_block[shard.tile_index].push_back(shard.device);
    }
    std::vector<int64_t> other_index(other_dims_.size(), 0);
    while (true) {
      if (!other_dims_.empty()) {
        std::string heading;
        for (std::size_t i = 0; i < other_dims_.size(); ++i) {
          heading +=
              fmt::format("{}dim {} {}", i > 0 ? ", " : "", other_dims_[i], tile_label(other_dims_[i], other_index[i]));
        }
        out += heading + ":\n";
      }
      out += draw_grid(devices_of_block, other_index);
      std::size_t i = other_dims_.size();
      while (i-- > 0) {
        if (++other_index[i] < layout_.num_tiles[other_dims_[i]]) break;
        other_index[i] = 0;
      }
      if (i == static_cast<std::size_t>(-1)) break;
    }
    return out;
  }

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  std::string tile_label(std::size_t dim, int64_t tile) const {
    if (!label_ranges_) return fmt::format("#{}", tile);
    return fmt::format("[{}:{}]", layout_.tile_edge(dim, tile), layout_.tile_edge(dim, tile + 1));
  }

  std::string draw_grid(const std::map<std::vector<int64_t>, std::vector<int64_t>>& blocks,
                        const std::vector<int64_t>& other_index) const {
    const int64_t rows = row_dim_ == kNone ? 1 : layout_.num_tiles[row_dim_];
    const int64_t cols = col_dim_ == kNone ? 1 : layout_.num_tiles[col_dim_];
    std::vector<std::vector<std::string>> cells(static_cast<std::size_t>(rows));
    std::size_t width = 1;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        std::vector<int64_t> index(layout_.global_shape.size(), 0);
        if (row_dim_ != kNone) index[row_dim_] = r;
        if (col_dim_ != kNone) index[col_dim_] = c;
        for (std::size_t i = 0; i < other_dims_.size(); ++i) index[other_dims_[i]] = other_index[i];
        const auto found = blocks.find(index);
        std::string cell = found == blocks.end() ? "-" : compress_device_list(found->second);
        width = std::max(width, cell.size());
        cells[static_cast<std::size_t>(r)].push_back(std::move(cell));
      }
    }
    std::vector<std::string> col_labels;
    for (int64_t c = 0; c < cols; ++c) {
      col_labels.push_back(col_dim_ == kNone ? "" : tile_label(col_dim_, c));
      width = std::max(width, col_labels.back().size());
    }
    std::vector<std::string> row_labels;
    const std::string row_title = row_dim_ == kNone ? "" : fmt::format("dim {}", row_dim_);
    std::size_t label_width = row_title.size();
    for (int64_t r = 0; r < rows; ++r) {
      row_labels.push_back(row_dim_ == kNone ? "" : tile_label(row_dim_, r));
      label_width = std::max(label_width, row_labels.back().size());
    }
    const auto pad = [](const std::string& text, std::size_t w) {
      return text + std::string(w - std::min(w, text.size()), ' ');
    };
    const std::string indent(label_width + 1, ' ');
    std::string border = indent;
    for (int64_t c = 0; c < cols; ++c) border += "+" + std::string(width + 2, '-');
    border += "+\n";

    std::string out;
    if (col_dim_ != kNone) {
      out += indent + fmt::format("  dim {}\n", col_dim_);
      out += pad(row_title, label_width) + " ";
      for (const std::string& label : col_labels) out += "  " + pad(label, width) + " ";
      // Drop the trailing spaces of the header line.
      out.erase(out.find_last_not_of(' ') + 1);
      out += "\n";
    }
    out += border;
    for (int64_t r = 0; r < rows; ++r) {
      out += pad(row_labels[static_cast<std::size_t>(r)], label_width) + " ";
      for (const std::string& cell : cells[static_cast<std::size_t>(r)]) {
        out += "| " + pad(cell, width) + " ";
      }
      out += "|\n" + border;
    }
    return out;
  }

  const ShardLayout& layout_;
  bool label_ranges_;
  std::size_t row_dim_ = kNone;
  std::size_t col_dim_ = kNone;
  std::vector<std::size_t> other_dims_;
};

}  // namespace

std::string draw_shard_layout(const ShardLayout& layout, bool label_ranges) {
  return DiagramWriter(layout, label_ranges).draw();
}

}  // namespace shardflow
