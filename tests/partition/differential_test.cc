// Differential tests of the whole SPMD path: random graphs (ops from the
// whole op set, shapes with dims that do not divide the mesh axes) x random
// meshes (1-8 devices, 1-3 axes, random device orders) x random annotations
// on inputs and intermediates. The partitioned program run on in-process
// devices must give the single-device result. A failing case prints its
// annotated graph and writes it to a reproducer file.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <numeric>
#include <random>

#include "random_mesh.h"
#include "shardflow/partition/program.h"
#include "shardflow/runtime/executor.h"
#include "shardflow/shardflow.h"
#include "shardflow/trace/interpreter.h"

namespace sf = shardflow;

namespace {

using sf::testing_util::random_mesh;

class RandomCase {
 public:
  explicit RandomCase(uint32_t seed) : rng_(seed) {
    mesh_ = random_mesh(rng_);
    for (int i = 0, n = pick(2, 4); i < n; ++i) inputs_.push_back(sf::randn(random_shape(), seed * 10 + static_cast<uint32_t>(i)));
    indices_ = sf::Tensor::from_ints(std::vector<int64_t>{2, 0, 1, 1}, {4});
    inputs_.push_back(indices_);
  }

  const sf::Mesh& mesh() const { return *mesh_; }
  const std::vector<sf::Tensor>& inputs() const { return inputs_; }

  std::vector<sf::Tensor> program(const std::vector<sf::Tensor>& in) {
    std::mt19937 saved = rng_;  // the same choices on every trace
    std::vector<sf::Tensor> pool(in.begin(), in.end() - 1);
    const sf::Tensor indices = in.back();
    for (sf::Tensor& t : pool) {
      if (pick(0, 2) == 0) t = annotate(t);
    }
    for (int step = 0, steps = pick(5, 30); step < steps; ++step) {
      sf::Tensor next = apply(pool, indices);
      if (pick(0, 4) == 0) next = annotate(next);
      pool.push_back(next);
    }
    rng_ = saved;
    return {pool.back(), pool[pool.size() / 2]};
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  sf::Shape random_shape() {
    sf::Shape shape(static_cast<std::size_t>(pick(1, 3)));
    for (int64_t& d : shape) d = pick(1, 7);
    return shape;
  }

  sf::Tensor annotate(const sf::Tensor& t) {
    std::vector<sf::SpecEntry> spec(static_cast<std::size_t>(t.rank()), sf::none);
    std::vector<int> axes(static_cast<std::size_t>(mesh_->num_axes()));
    std::iota(axes.begin(), axes.end(), 0);
    std::shuffle(axes.begin(), axes.end(), rng_);
    std::vector<std::vector<sf::AxisRef>> dims(spec.size());
    for (int axis : axes) {
      if (spec.empty() || pick(0, 2) == 0) continue;
      dims[static_cast<std::size_t>(pick(0, static_cast<int>(spec.size()) - 1))].push_back(sf::AxisRef(axis));
    }
    for (std::size_t d = 0; d < spec.size(); ++d) {
      if (!dims[d].empty()) spec[d] = sf::SpecEntry::tuple(dims[d]);
    }
    return sf::mark_sharding(t * 1, *mesh_, sf::PartitionSpec(spec));
  }

  const sf::Tensor& any(const std::vector<sf::Tensor>& pool) {
    return pool[static_cast<std::size_t>(pick(0, static_cast<int>(pool.size()) - 1))];
  }

  sf::Tensor apply(const std::vector<sf::Tensor>& pool, const sf::Tensor& indices) {
    const sf::Tensor& a = any(pool);
    const sf::Tensor& b = any(pool);
    const int64_t rank = a.rank();
    const int64_t dim = rank > 0 ? pick(0, static_cast<int>(rank) - 1) : 0;
    const auto broadcastable = [](const sf::Tensor& x, const sf::Tensor& y) {
      try {
        sf::broadcast_shapes(x.shape(), y.shape());
        return true;
      } catch (const sf::Error&) {
        return false;
      }
    };
    switch (pick(0, 32)) {
      case 0: return sf::silu(a);
      case 1: return sf::tanh(a) * 2;
      case 2: return broadcastable(a, b) ? a + b : a - 1;
      case 3: return broadcastable(a, b) ? a * b : a * 0.5;
      case 4: return broadcastable(a, b) ? a / (sf::abs(b) + 1) : a / 3;
      case 5: return rank > 0 ? sf::sum(a, {dim}, pick(0, 1) == 1) : sf::exp(a);
      case 6: return rank > 0 ? sf::mean(a, {dim}, pick(0, 1) == 1) : sf::neg(a);
      case 7: return rank > 0 ? sf::amax(a, {dim}) : sf::relu(a);
      case 8: return rank > 0 ? sf::softmax(a, dim) : sf::sigmoid(a);
      case 9: return rank > 0 ? sf::log_softmax(a, dim) : sf::gelu(a);
      case 10: {
        if (rank == 0) return a + 2;
        const int64_t n = pick(1, 6);
        const sf::Tensor w = sf::randn({a.shape().back(), n}, pick(0, 100000));
        return sf::matmul(a, pick(0, 1) ? annotate(w) : w);
      }
      case 11: {
        if (rank == 0) return a;
        const sf::Tensor w = sf::randn({pick(1, 5), a.shape().back()}, pick(0, 100000));
        return sf::linear(a, w, sf::randn({w.size(0)}, pick(0, 100000)));
      }
      case 12: return rank >= 2 ? a.transpose(0, rank - 1) : sf::abs(a);
      case 13: return a.reshape({-1});
      case 14: return a.unsqueeze(pick(0, static_cast<int>(rank)));
      case 15: return rank > 0 ? sf::cat({a, a * 2}, dim) : sf::sin(a);
      case 16: return rank > 0 ? a.slice(dim, std::min<int64_t>(pick(0, 1), a.size(dim) - 1), a.size(dim)) : sf::cos(a);
      case 17: return rank > 0 ? a.select(dim, pick(0, static_cast<int>(a.size(dim)) - 1)) : a * 3;
      case 18: return sf::where(sf::gt(a, sf::zeros({})), a, a * -0.5);
      case 19: return sf::maximum(a, sf::zeros({}) + 0.25);
      case 20: return rank >= 2 ? sf::triu(a) : sf::minimum(a, sf::ones({}));
      case 21: return rank > 0 ? sf::stack({a, a + 1}, dim) : a;
      case 22: return rank > 0 && a.size(dim) >= 3 ? sf::index_select(a, dim, indices) : a;
      case 23: {
        // Large tables are looked up in their shards (indexed factor), small ones gathered.
        const sf::Tensor table = sf::randn({pick(0, 1) ? 3 : pick(9, 40), pick(1, 6)}, pick(0, 100000));
        return sf::embedding(pick(0, 1) ? annotate(table) : table, indices);
      }
      case 24: return rank > 0 ? sf::argmax(a, dim).to(sf::DType::kF32) : a;
      case 25: {
        const double n = static_cast<double>(rank > 0 ? a.shape().back() : 1);
        return a + sf::arange(n, 0.0, -1.0).to(sf::DType::kF32);
      }
      case 26: return rank >= 2 ? a.flatten(0, 1) : a.to(sf::DType::kBF16).to(sf::DType::kF32);
      case 27: {  // attention with `a` as the queries [..., L, E], a random mask
        if (rank < 2) return a * a;
        sf::Shape key_shape = a.shape(), value_shape = a.shape();
        const int64_t keys = pick(1, 5);
        key_shape[static_cast<std::size_t>(rank - 2)] = keys;
        value_shape[static_cast<std::size_t>(rank - 2)] = keys;
        value_shape.back() = pick(1, 4);
        const sf::Tensor k = sf::randn(key_shape, pick(0, 100000)), v = sf::randn(value_shape, pick(0, 100000));
        const sf::Tensor mask = sf::gt(sf::randn({a.size(rank - 2), keys}, pick(0, 100000)), sf::zeros({}) - 0.5);
        return sf::scaled_dot_product_attention(a, pick(0, 1) ? annotate(k) : k, pick(0, 1) ? annotate(v) : v, mask);
      }
      case 28: {  // rms_norm over the last one or two dims, with or without a weight
        if (rank == 0) return a - 3;
        const int64_t normalized = pick(1, static_cast<int>(std::min<int64_t>(rank, 2)));
        const sf::Shape shape(a.shape().end() - normalized, a.shape().end());
        if (pick(0, 1)) return sf::rms_norm(a, shape);
        const sf::Tensor w = sf::randn(shape, pick(0, 100000));
        return sf::rms_norm(a, shape, pick(0, 1) ? annotate(w) : w, 1e-5);
      }
      case 29: return rank > 0 ? sf::gather(a, dim, sf::argmax(a, dim, true)) : a;  // the maxima
      case 30: {  // rows 2, 0, 1, 1 of `a` along dim replaced (the last 1 wins), where a shard or all hold them
        if (rank == 0 || a.size(dim) < 3) return a * 0.75;
        sf::Shape rows = a.shape();
        rows[static_cast<std::size_t>(dim)] = indices.numel();
        const sf::Tensor source = sf::randn(rows, pick(0, 100000));
        return sf::index_copy(a, dim, indices, pick(0, 1) ? annotate(source) : source);
      }
      case 31: {  // a draw in a's layout: each device draws its tile (f32 or bf16, uniform or normal)
        const sf::DType dtype = pick(0, 1) ? sf::DType::kF32 : sf::DType::kBF16;
        const sf::Tensor draw = pick(0, 1) ? sf::rand(a.shape(), pick(0, 100000), dtype)
                                           : sf::randn(a.shape(), pick(0, 100000), dtype);
        return a + draw.to(sf::DType::kF32);
      }
      default: return sf::sqrt(sf::abs(a) + 1);
    }
  }

  std::mt19937 rng_;
  std::unique_ptr<sf::Mesh> mesh_;
  std::vector<sf::Tensor> inputs_;
  sf::Tensor indices_;
};

}  // namespace

namespace {

::testing::AssertionResult same_values(const sf::DenseTensor& expected, const sf::Tensor& actual, float rtol) {
  const sf::Tensor want(expected);
  if (want.shape() != actual.shape() || want.dtype() != actual.dtype()) {
    return ::testing::AssertionFailure() << "type " << actual.type().to_string() << " vs " << want.type().to_string();
  }
  const std::vector<float> got = actual.to_floats(), ref = want.to_floats();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(ref[i]);
    if (!both_nan && !(std::abs(got[i] - ref[i]) <= rtol * (1 + std::abs(ref[i])))) {
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs " << ref[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Each slot a program reads is dropped once, right after its last reader;
// program outputs never are.
::testing::AssertionResult releases_follow_last_reads(const sf::PartitionedProgram& program) {
  std::map<int, std::size_t> last_read, released_at;
  for (std::size_t i = 0; i < program.instructions.size(); ++i) {
    for (int slot : program.instructions[i].inputs) last_read[slot] = i;
    for (int slot : program.instructions[i].releases) {
      if (!released_at.emplace(slot, i).second) return ::testing::AssertionFailure() << "slot " << slot << " released twice";
    }
  }
  for (int slot : program.output_slots) last_read.erase(slot);
  for (const auto& [slot, i] : last_read) {
    const auto found = released_at.find(slot);
    if (found == released_at.end() || found->second != i) {
      return ::testing::AssertionFailure() << "slot " << slot << " last read by instruction " << i << " but released "
                                           << (found == released_at.end() ? "never" : "after " + std::to_string(found->second));
    }
  }
  if (released_at.size() != last_read.size()) return ::testing::AssertionFailure() << "an output or unread slot is released";
  return ::testing::AssertionSuccess();
}

TEST(Differential, ShardedResultEqualsSingleDeviceResult) {
  constexpr uint32_t kCases = 1000;
  // One runtime per device count, so group the cases by their mesh size.
  std::map<int64_t, std::vector<uint32_t>> seeds_by_size;
  for (uint32_t seed = 0; seed < kCases; ++seed) seeds_by_size[RandomCase(seed).mesh().size()].push_back(seed);
  int sharded_cases = 0, lookups_in_shards = 0, writes_in_shards = 0;
  int failures = 0;
  for (const auto& [size, seeds] : seeds_by_size) {
    sf::Runtime runtime = sf::Runtime::local(size);
    for (uint32_t seed : seeds) {
      if (failures >= 3) break;  // keep the log readable
      RandomCase c(seed);
      sf::CompiledFunction traced([&](const std::vector<sf::Tensor>& in) { return c.program(in); });
      const sf::Graph& graph = traced.trace(c.inputs());
      ASSERT_EQ(graph.inputs().size(), c.inputs().size());
      const std::string text = sf::print_graph(graph);
      // Values rounded to bf16 may round the other way after a sum in another order.
      const float rtol = text.find("bf16") != std::string::npos ? 1e-2f : 1e-4f;
      try {
        const sf::PropagationResult shardings = sf::propagate_shardings(graph);
        const sf::PartitionedProgram program = sf::partition_graph(graph, shardings);
        EXPECT_TRUE(releases_follow_last_reads(program)) << "seed " << seed;
        std::vector<sf::DenseTensor> values;
        for (const sf::Tensor& input : c.inputs()) values.push_back(input.value());
        const std::vector<sf::DenseTensor> expected = sf::run_graph(graph, values);
        const std::vector<sf::Tensor> actual = sf::run_program(program, runtime, c.inputs());
        sharded_cases += program.mesh->size() > 1 ? 1 : 0;
        for (const sf::Instruction& instruction : program.instructions) {
          lookups_in_shards += instruction.indexed_input >= 0 && !instruction.indexed_write ? 1 : 0;
          writes_in_shards += instruction.indexed_write ? 1 : 0;
        }
        for (std::size_t o = 0; o < expected.size(); ++o) {
          const ::testing::AssertionResult same = same_values(expected[o], actual[o], rtol);
          if (!same) {
            ++failures;
            const std::string path = testing::TempDir() + "differential_" + std::to_string(seed) + ".ir";
            std::ofstream(path) << sf::print_with_shardings(graph, shardings);
            ADD_FAILURE() << "seed " << seed << " output " << o << ": " << same.message() << "\nreproducer: " << path
                          << "\n" << sf::print_with_shardings(graph, shardings) << program.to_string(graph);
          }
        }
      } catch (const sf::Error& error) {
        ++failures;
        ADD_FAILURE() << "seed " << seed << ": " << error.what() << "\n" << text;
      }
    }
  }
  EXPECT_GT(sharded_cases, static_cast<int>(kCases) / 2);
  EXPECT_GT(lookups_in_shards, 20);
  EXPECT_GT(writes_in_shards, 20);
}

}  // namespace

namespace {

// A value annotated in one random layout and wanted in another, on a random
// mesh, with dims that often do not divide the axes: every reshard the
// partitioner can choose (fused and padded all-to-alls, permutes, halo
// exchanges, gathers, slices) must move the values exactly.
class RandomReshard {
 public:
  explicit RandomReshard(uint32_t seed) : rng_(seed) {
    mesh_ = random_mesh(rng_);
    sf::Shape dims(static_cast<std::size_t>(pick(1, 4)));
    for (int64_t& d : dims) d = pick(0, 2) == 0 ? 8 * pick(1, 3) : pick(1, 13);
    input_ = sf::randn(dims, seed);
    from_ = random_spec(dims.size());
    // A third of the cases merge two dims between the annotations (a
    // reshape): an unevenly split major dim then reaches the merged dim's
    // even tiles by a halo exchange.
    merged_ = dims.size() >= 2 && pick(0, 2) == 0 ? pick(0, static_cast<int>(dims.size()) - 2) : -1;
    to_ = random_spec(dims.size() - (merged_ >= 0 ? 1 : 0));
  }

  const sf::Mesh& mesh() const { return *mesh_; }
  const sf::Tensor& input() const { return input_; }

  std::vector<sf::Tensor> program(const std::vector<sf::Tensor>& in) const {
    sf::Tensor moved = sf::exp(sf::mark_sharding(in[0] * 1, *mesh_, from_));
    if (merged_ >= 0) {
      std::vector<int64_t> shape(moved.shape().begin(), moved.shape().end());
      shape[static_cast<std::size_t>(merged_)] *= shape[static_cast<std::size_t>(merged_ + 1)];
      shape.erase(shape.begin() + merged_ + 1);
      moved = moved.reshape(shape);
    }
    return {sf::mark_sharding(moved, *mesh_, to_)};
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  // Each axis, in a random order, on a random dim or on none.
  sf::PartitionSpec random_spec(std::size_t rank) {
    std::vector<int> axes(static_cast<std::size_t>(mesh_->num_axes()));
    std::iota(axes.begin(), axes.end(), 0);
    std::shuffle(axes.begin(), axes.end(), rng_);
    std::vector<std::vector<sf::AxisRef>> dims(rank);
    for (int axis : axes) {
      if (pick(0, 3) > 0) dims[static_cast<std::size_t>(pick(0, static_cast<int>(rank) - 1))].push_back(sf::AxisRef(axis));
    }
    std::vector<sf::SpecEntry> spec(rank, sf::none);
    for (std::size_t d = 0; d < rank; ++d) {
      if (!dims[d].empty()) spec[d] = sf::SpecEntry::tuple(dims[d]);
    }
    return sf::PartitionSpec(spec);
  }

  std::mt19937 rng_;
  std::unique_ptr<sf::Mesh> mesh_;
  sf::Tensor input_;
  sf::PartitionSpec from_, to_;
  int merged_ = -1;  // the dim flattened with the next one, or -1
};

// The dims an all-to-all splits (gains axes) and gathers (loses them).
std::pair<int, int> split_and_gathered_dims(const sf::Instruction& instruction) {
  int split = 0, gathered = 0;
  for (std::size_t d = 0; d < instruction.dims_before.size(); ++d) {
    split += instruction.dims_after[d].size() > instruction.dims_before[d].size() ? 1 : 0;
    gathered += instruction.dims_after[d].size() < instruction.dims_before[d].size() ? 1 : 0;
  }
  return {split, gathered};
}

TEST(Differential, ReshardsBetweenRandomLayoutsMoveValuesExactly) {
  constexpr uint32_t kCases = 3000;
  std::map<int64_t, std::vector<uint32_t>> seeds_by_size;
  for (uint32_t seed = 0; seed < kCases; ++seed) seeds_by_size[RandomReshard(seed).mesh().size()].push_back(seed);
  int fused = 0, padded = 0, halos = 0, reshaped_halos = 0, failures = 0;
  for (const auto& [size, seeds] : seeds_by_size) {
    sf::Runtime runtime = sf::Runtime::local(size);
    for (uint32_t seed : seeds) {
      if (failures >= 3) break;
      const RandomReshard c(seed);
      sf::CompiledFunction traced([&](const std::vector<sf::Tensor>& in) { return c.program(in); });
      const sf::Graph& graph = traced.trace({c.input()});
      const sf::PropagationResult shardings = sf::propagate_shardings(graph);
      const sf::PartitionedProgram program = sf::partition_graph(graph, shardings);
      const std::vector<sf::DenseTensor> values{c.input().value()};
      const std::vector<sf::DenseTensor> expected = sf::run_graph(graph, values);
      const std::vector<sf::Tensor> actual = sf::run_program(program, runtime, {c.input()});
      for (const sf::Instruction& instruction : program.instructions) {
        if (instruction.kind != sf::InstructionKind::kCollective) continue;
        const sf::CollectiveKind kind = program.collectives[static_cast<std::size_t>(instruction.collective)].kind;
        const bool halo = kind == sf::CollectiveKind::kCollectivePermute && instruction.dims_before.empty();
        halos += halo ? 1 : 0;
        // From a reshape's tiles to the even tiles of the same axes.
        reshaped_halos += halo && instruction.axes_before == instruction.axes_after ? 1 : 0;
        if (kind != sf::CollectiveKind::kAllToAll) continue;
        const auto [split, gathered] = split_and_gathered_dims(instruction);
        fused += split + gathered > 2 ? 1 : 0;
        const sf::Shape& local = program.slots[static_cast<std::size_t>(instruction.inputs[0])].shape;
        const sf::Shape& global = program.collectives[static_cast<std::size_t>(instruction.collective)].value->type().shape;
        for (std::size_t d = 0; d < global.size(); ++d) {
          const int64_t tiles = (global[d] + local[d] - 1) / local[d];
          if (local[d] * tiles != global[d]) {
            ++padded;
            break;
          }
        }
      }
      const ::testing::AssertionResult same = same_values(expected[0], actual[0], 1e-6f);
      if (!same) {
        ++failures;
        ADD_FAILURE() << "seed " << seed << ": " << same.message() << "\n"
                      << sf::print_with_shardings(graph, shardings) << program.to_string(graph);
      }
    }
  }
  // The draw reaches the moves it is for.
  EXPECT_GT(fused, 20);
  EXPECT_GT(padded, 20);
  EXPECT_GT(halos, 20);
  EXPECT_GT(reshaped_halos, 20);
}

}  // namespace
