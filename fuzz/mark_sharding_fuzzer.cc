// The annotation op's mesh and spec decoders: xla::dynamo_mark_sharding's
// arguments bound as the IR binder binds them (resolve_call), then
// decode_mark_sharding (mesh_shape and axis_names literals, the Mesh, the
// partition spec against it), then the sharding's printers and shard layout.
//
// Input: lines separated by '\n':
//   1  device_ids: integers separated by anything else ("0,1,2,3")
//   2  mesh_shape  ("(2, 2)")
//   3  axis_names  ("('data', 'model')" or "None")
//   4  partition_spec ("('data', None)")
//   5  the tensor's rank (decimal, 0..8; default 2); each dim has extent 6
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "shardflow/ir/binding.h"
#include "shardflow/ops/annotation.h"
#include "shardflow/ops/ops.h"
#include "shardflow/sharding/hlo_sharding.h"
#include "shardflow/sharding/shard_layout.h"

namespace sf = shardflow;

namespace {

std::vector<std::string_view> split_lines(std::string_view text, std::size_t max_lines) {
  std::vector<std::string_view> lines;
  while (lines.size() + 1 < max_lines) {
    const std::size_t end = text.find('\n');
    if (end == std::string_view::npos) break;
    lines.push_back(text.substr(0, end));
    text.remove_prefix(end + 1);
  }
  lines.push_back(text);
  return lines;
}

// Integers (an optional '-', then digits; saturating) separated by anything else.
std::vector<int64_t> integers(std::string_view text) {
  std::vector<int64_t> out;
  std::size_t i = 0;
  while (i < text.size()) {
    const bool negative = text[i] == '-' && i + 1 < text.size() && text[i + 1] >= '0' && text[i + 1] <= '9';
    if (negative) ++i;
    if (text[i] < '0' || text[i] > '9') {
      ++i;
      continue;
    }
    int64_t value = 0;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
      const int digit = text[i] - '0';
      value = value > (std::numeric_limits<int64_t>::max() - digit) / 10 ? std::numeric_limits<int64_t>::max()
                                                                         : value * 10 + digit;
    }
    out.push_back(negative ? -value : value);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  sf::ops::register_all_ops();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> lines = split_lines(shardflow_fuzz::as_text(data, size), 5);
  auto line = [&](std::size_t i) { return i < lines.size() ? std::string(lines[i]) : std::string(); };
  int64_t rank = 2;
  if (lines.size() > 4) {
    const std::vector<int64_t> r = integers(lines[4]);
    if (!r.empty()) rank = r[0] < 0 ? 0 : r[0] > 8 ? 8 : r[0];
  }
  sf::TensorType type;
  for (int64_t d = 0; d < rank; ++d) type.shape.push_back(6);

  shardflow_fuzz::run([&] {
    std::vector<sf::CallArg> args;
    args.push_back(sf::CallArg::tensor_arg(0));
    args.push_back(sf::CallArg::constant_arg(sf::Constant(integers(lines[0]))));
    args.push_back(sf::CallArg::constant_arg(sf::Constant(line(1))));
    args.push_back(sf::CallArg::constant_arg(sf::Constant(line(2))));
    args.push_back(sf::CallArg::constant_arg(sf::Constant(line(3))));
    const std::vector<sf::TensorType> types{type};
    const auto [op, bound] = sf::resolve_call(sf::ops::kMarkShardingOp, args, types);
    const sf::Sharding sharding = sf::ops::decode_mark_sharding(bound, rank);
    (void)sharding.to_hlo_v1().to_string();
    (void)sharding.to_hlo_v2().to_string();
    (void)sharding.to_readable(type.shape, "f32");
    (void)sharding.to_partition_spec().to_string();
    (void)sharding.type();
    (void)sf::shard_layout(sharding, type.shape);
    // The op's own inference, as verify_graph runs it.
    (void)op->infer(bound, types);
  });
  return 0;
}
