// The IR text form: round trips over graphs traced from random programs,
// parse and verify errors with their positions, and robustness of the IR
// and schema parsers against arbitrary bytes.
#include <gtest/gtest.h>

#include <random>

#include "shardflow/shardflow.h"
#include "shardflow/trace/interpreter.h"

namespace sf = shardflow;

namespace {

// A random program over the op set, built on the inputs and on weights it
// captures. Every call picks shapes that are valid for the op.
class RandomProgram {
 public:
  explicit RandomProgram(uint32_t seed) : rng_(seed) {
    const int num_weights = pick(1, 3);
    for (int i = 0; i < num_weights; ++i) weights_.push_back(sf::randn(random_shape(), 100 + i));
  }

  std::vector<sf::Tensor> operator()(const sf::Tensor& x) {
    std::mt19937 rng = rng_;  // the same choices on every call
    std::swap(rng, rng_);
    std::vector<sf::Tensor> pool{x};
    for (const sf::Tensor& w : weights_) pool.push_back(w);
    const int steps = pick(5, 25);
    for (int s = 0; s < steps; ++s) pool.push_back(step(pool));
    std::swap(rng, rng_);
    return {pool.back(), pool[pool.size() / 2]};
  }

  sf::Shape random_shape() {
    sf::Shape shape(static_cast<std::size_t>(pick(1, 3)));
    for (int64_t& d : shape) d = pick(1, 5);
    return shape;
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  sf::Tensor step(const std::vector<sf::Tensor>& pool) {
    const sf::Tensor& a = pool[static_cast<std::size_t>(pick(0, static_cast<int>(pool.size()) - 1))];
    const sf::Tensor& b = pool[static_cast<std::size_t>(pick(0, static_cast<int>(pool.size()) - 1))];
    const int64_t rank = a.rank();
    const int64_t dim = rank > 0 ? pick(0, static_cast<int>(rank) - 1) : 0;
    switch (pick(0, 14)) {
      case 0: return sf::silu(a);
      case 1: return sf::tanh(a) * 0.5;
      case 2: {
        try {
          sf::broadcast_shapes(a.shape(), b.shape());
          return a + b;
        } catch (const sf::Error&) {
          return a - a;
        }
      }
      case 3: return rank > 0 ? sf::sum(a, {dim}, pick(0, 1) == 1) : sf::exp(a);
      case 4: return rank > 0 ? sf::softmax(a, dim) : sf::relu(a);
      case 5: return rank >= 2 ? a.transpose(0, rank - 1) : sf::neg(a);
      case 6: return a.reshape({-1});
      case 7: return a.unsqueeze(pick(0, static_cast<int>(rank)));
      case 8: {
        if (rank == 0) return a + 1;
        const sf::Tensor w = sf::randn({a.shape().back(), pick(1, 4)}, pick(0, 1000));
        return sf::matmul(a, w);
      }
      case 9: return rank > 0 ? sf::cat({a, a}, dim) : sf::sigmoid(a);
      case 10: return rank > 0 ? a.slice(dim, 0, std::max<int64_t>(1, a.size(dim) / 2)) : sf::cos(a);
      case 11: return sf::where(sf::gt(a, sf::zeros({})), a, a * -0.5);
      case 12: {
        const sf::Mesh mesh({0, 1, 2, 3}, {2, 2}, {"x", "y"});
        std::vector<sf::SpecEntry> spec(static_cast<std::size_t>(rank), sf::none);
        if (rank > 0) spec[static_cast<std::size_t>(dim)] = pick(0, 1) ? "x" : "y";
        return sf::mark_sharding(a * 1, mesh, sf::PartitionSpec(spec));
      }
      case 13: return rank > 0 ? sf::amax(a, {dim}) : sf::abs(a);
      default: return sf::gelu(a, pick(0, 1) ? "tanh" : "none");
    }
  }

  std::mt19937 rng_;
  std::vector<sf::Tensor> weights_;
};

TEST(IrText, RoundTripsGraphsTracedFromRandomPrograms) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    RandomProgram program(seed);
    auto step = sf::compile([&](sf::Tensor x) { return program(x); });
    const sf::Tensor x = sf::randn(program.random_shape(), static_cast<int64_t>(seed));
    const std::vector<sf::Tensor> compiled = step(x);
    const std::string text = step.graph_text();
    sf::Graph parsed = sf::parse_graph(text);
    ASSERT_NO_THROW(sf::verify_graph(parsed)) << text;
    ASSERT_EQ(sf::print_graph(parsed), text);
    // The compiled result equals eager execution of the same program.
    const std::vector<sf::Tensor> eager = program(x);
    for (std::size_t i = 0; i < eager.size(); ++i) {
      const auto got = compiled[i].to_floats(), want = eager[i].to_floats();
      ASSERT_EQ(got.size(), want.size()) << text;
      for (std::size_t k = 0; k < got.size(); ++k) {
        ASSERT_NEAR(got[k], want[k], 1e-4 * (1 + std::abs(want[k]))) << "seed " << seed << "\n" << text;
      }
    }
    step(x);
    ASSERT_EQ(step.stats().cache_hits, 1) << "seed " << seed;
  }
}

struct BadIr {
  const char* text;
  const char* message;  // expected substring
};

TEST(IrText, ErrorsNameLineColumnAndExpectation) {
  const BadIr cases[] = {
      {"", "line 1, column 1: expected 'func' to start the function"},
      {"func @f(%x: f32[2]) -> (f32[2]) {\n  return %y\n}\n", "line 2, column 10: value %y is not defined"},
      {"func @f(%x: f33[2]) -> (f32[2]) {\n", "line 1, column 13: expected a dtype"},
      {"func @f(%x: f32[2]) -> (f32[2]) {\n  %a = aten::nope(%x) : f32[2]\n  return %a\n}\n",
       "line 2, column 8: unknown op 'aten::nope'"},
      {"func @f(%x: f32[2]) -> (f32[2]) {\n  %a = aten::exp(%x) f32[2]\n  return %a\n}\n",
       "line 2, column 22: expected ':' and the result type(s)"},
      {"func @f(%x: f32[2]) -> (f32[2]) {\n  %x = aten::exp(%x) : f32[2]\n  return %x\n}\n",
       "value %x is defined twice"},
      {"func @f(%x: f32[2]) -> (f32[3]) {\n  %a = aten::exp(%x) : f32[2]\n  return %a\n}\n",
       "result 0 is declared f32[3] but %a is f32[2]"},
      {"func @f(%x: f32[2]) -> (f32[2]) {\n  %a = aten::exp(%x, 1) : f32[2]\n  return %a\n}\n",
       "aten::exp() expected at most 1 argument(s) but received 2 argument(s)"},
      {"func @f(%x: f32[2]) -> (f32[2]) {\n  %a = aten::add(%x, %x, beta=2) : f32[2]\n  return %a\n}\n",
       "no overload accepts these arguments"},
      {"func @f(%x: f32[2]) -> (f32[2]) {\n  %a = aten::exp(%x) : f32[2]\n  return %a\n", "expected '}'"},
      {"func @f(%x: f32[2]) -> (f32[2]) {\n  %a = aten::exp(%x) : f32[2] junk\n  return %a\n}\n",
       "line 2, column 31: expected the end of the line"},
      {"func @f(%x: f32[2]) -> (f32[2]) {\n  %a = aten::exp(\"unterminated) : f32[2]\n}\n",
       "an unterminated string"},
  };
  sf::ops::register_all_ops();
  for (const BadIr& c : cases) {
    try {
      sf::parse_graph(c.text);
      ADD_FAILURE() << "no error for:\n" << c.text;
    } catch (const sf::Error& error) {
      EXPECT_NE(std::string(error.what()).find(c.message), std::string::npos)
          << "got: " << error.what() << "\nwanted: " << c.message;
    }
  }
}

TEST(IrText, VerifierRechecksInferredTypes) {
  sf::ops::register_all_ops();
  const char* wrong_type = "func @f(%x: f32[2,3]) -> (f32[2]) {\n  %a = aten::sum.dim_IntList(%x, [0]) : f32[2]\n  return %a\n}\n";
  // Parsing keeps the declared type; verification re-infers and objects,
  // naming the node and its line.
  try {
    sf::verify_graph(sf::parse_graph(wrong_type));
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    EXPECT_NE(std::string(error.what()).find("invalid node '%a = aten::sum.dim_IntList(%x, [0]) : f32[2]' at line 2: "
                                             "%a is declared f32[2] but aten::sum.dim_IntList infers f32[3]"),
              std::string::npos) << error.what();
  }
  const char* bad_shapes = "func @f(%x: f32[4,8]) -> (f32[4,8]) {\n  %y = aten::exp(%x) : f32[4,8]\n\n"
                           "  %z = aten::matmul(%y, %x) : f32[4,8]\n  return %z\n}\n";
  try {
    sf::verify_graph(sf::parse_graph(bad_shapes));
    FAIL() << "no error";
  } catch (const sf::Error& error) {
    EXPECT_NE(std::string(error.what()).find("' at line 4: mat1 and mat2 shapes cannot be multiplied (4x8 and 4x8)"),
              std::string::npos) << error.what();
  }
}

std::vector<std::string> valid_texts() {
  return {
      "func @mlp(%x: f32[8,512], %w1: f32[512,2048], %w2: f32[2048,512]) -> (f32[8,512]) {\n"
      "  %0 = xla::dynamo_mark_sharding(%x, [0, 1, 2, 3, 4, 5, 6, 7], \"(4, 2)\", \"('data', 'model')\", \"('data', None)\") : f32[8,512]\n"
      "  %1 = xla::dynamo_mark_sharding(%w1, [0, 1, 2, 3, 4, 5, 6, 7], \"(4, 2)\", \"('data', 'model')\", \"(None, 'model')\") : f32[512,2048]\n"
      "  %2 = aten::matmul(%0, %1) : f32[8,2048]\n"
      "  %3 = aten::gelu(%2) : f32[8,2048]\n"
      "  %4 = aten::matmul(%3, %w2) : f32[8,512]\n"
      "  return %4\n"
      "}\n",
      "func @g(%a: f32[2,3], %b: i64[2]) -> (f32[2,3], f32[2]) {\n"
      "  %s = aten::sum.dim_IntList(%a, [1], true) : f32[2,1]\n"
      "  %t = aten::add.Tensor(%a, %s, alpha=2) : f32[2,3]\n"
      "  %m = aten::amax(%t, [-1]) : f32[2]\n"
      "  return %t, %m\n"
      "}\n"};
}

// An op name without its overload resolves as PyTorch's dispatcher does:
// aten::sum(%x) is the full reduction aten::sum(Tensor self, *, ScalarType?
// dtype=None), aten::sum(%x, [1]) is aten::sum.dim_IntList.
TEST(IrText, OverloadsResolveAsPyTorchDoes) {
  sf::ops::register_all_ops();
  const sf::Graph graph = sf::parse_graph(
      "func @f(%x: f32[2,3]) -> (f32[], f32[2], f32[]) {\n"
      "  %a = aten::sum(%x) : f32[]\n"
      "  %b = aten::sum(%x, [1]) : f32[2]\n"
      "  %c = aten::mean(%x, dtype=f32) : f32[]\n"
      "  return %a, %b, %c\n"
      "}\n");
  sf::verify_graph(graph);
  EXPECT_EQ(sf::print_graph(graph),
            "func @f(%x: f32[2,3]) -> (f32[], f32[2], f32[]) {\n"
            "  %a = aten::sum(%x) : f32[]\n"
            "  %b = aten::sum.dim_IntList(%x, [1]) : f32[2]\n"
            "  %c = aten::mean(%x, dtype=f32) : f32[]\n"
            "  return %a, %b, %c\n"
            "}\n");
}

TEST(IrText, SurvivesArbitraryBytesAndMutations) {
  sf::ops::register_all_ops();
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> byte(0, 255);
  int parsed = 0;
  for (const std::string& text : valid_texts()) {
    sf::Graph graph = sf::parse_graph(text);
    EXPECT_EQ(sf::print_graph(graph), text);
    for (std::size_t cut = 0; cut < text.size(); ++cut) {  // every truncation
      try {
        sf::parse_graph(text.substr(0, cut));
      } catch (const sf::Error&) {
      }
    }
    for (int i = 0; i < 3000; ++i) {  // random single-byte mutations
      std::string mutated = text;
      mutated[std::uniform_int_distribution<std::size_t>(0, text.size() - 1)(rng)] = static_cast<char>(byte(rng));
      try {
        sf::Graph g = sf::parse_graph(mutated);
        sf::verify_graph(g);
        ++parsed;
      } catch (const sf::Error&) {
      }
    }
  }
  for (int i = 0; i < 3000; ++i) {  // random bytes
    std::string junk(static_cast<std::size_t>(byte(rng) % 64), '\0');
    for (char& c : junk) c = static_cast<char>(byte(rng));
    try {
      sf::parse_graph(junk);
    } catch (const sf::Error&) {
    }
  }
  EXPECT_GT(parsed, 0);  // harmless mutations (e.g. inside names) still parse
}

TEST(SchemaText, EveryRegisteredSchemaRoundTripsAndMutationsNeverCrash) {
  sf::ops::register_all_ops();
  std::mt19937 rng(10);
  std::uniform_int_distribution<int> byte(0, 255);
  for (const sf::OpDef* op : sf::op_registry().all()) {
    const std::string text = op->schema.to_string();
    EXPECT_EQ(sf::FunctionSchema::parse(text).to_string(), text);
    for (int i = 0; i < 200; ++i) {
      std::string mutated = text;
      mutated[std::uniform_int_distribution<std::size_t>(0, text.size() - 1)(rng)] = static_cast<char>(byte(rng));
      try {
        sf::FunctionSchema::parse(mutated);
      } catch (const sf::Error&) {
      }
      try {
        sf::FunctionSchema::parse(text.substr(0, static_cast<std::size_t>(i) % text.size()));
      } catch (const sf::Error&) {
      }
    }
  }
  const std::string schema = "aten::f.o(Tensor(a!) self, int[2] k=[1, 2], *, float? x=None, str s=\"q\") -> (Tensor a, Tensor b)";
  EXPECT_EQ(sf::FunctionSchema::parse(schema).to_string(), schema);
  EXPECT_THROW(sf::FunctionSchema::parse("aten::f(Tensor self"), sf::Error);
  EXPECT_THROW(sf::FunctionSchema::parse("aten::f(Banana x) -> Tensor"), sf::Error);
}

}  // namespace
