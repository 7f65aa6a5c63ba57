#include "runtime_test_util.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

namespace shardflow::testing_util {

Watchdog::Watchdog(std::chrono::seconds limit) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "?";
  thread_ = std::thread([this, limit, name] {
    std::unique_lock lock(mutex_);
    if (!done_changed_.wait_for(lock, limit, [&] { return done_; })) {
      std::fprintf(stderr, "watchdog: %s did not finish within %lld s; aborting\n", name.c_str(),
                   static_cast<long long>(limit.count()));
      std::abort();
    }
  });
}

Watchdog::~Watchdog() {
  {
    const std::lock_guard lock(mutex_);
    done_ = true;
  }
  done_changed_.notify_all();
  thread_.join();
}

Bytes random_values(DType dtype, std::size_t count, uint32_t seed) {
  Bytes bytes(count * element_size(dtype));
  std::mt19937 rng(seed);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* out = reinterpret_cast<T*>(bytes.data());
    for (std::size_t i = 0; i < count; ++i) {
      if constexpr (std::is_same_v<T, bool>) {
        out[i] = (rng() & 1) != 0;
      } else if constexpr (std::is_integral_v<T>) {
        out[i] = static_cast<T>(static_cast<int64_t>(rng() % 2001) - 1000);
      } else {
        out[i] = store<T>(std::uniform_real_distribution<float>(-8.0f, 8.0f)(rng));
      }
    }
  });
  return bytes;
}

Bytes random_bytes(std::size_t count, uint32_t seed) {
  Bytes bytes(count);
  std::mt19937 rng(seed);
  for (auto& byte : bytes) byte = static_cast<std::byte>(rng());
  return bytes;
}

template <class C>
static C reference_combine(ReduceOp op, C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
  }
  switch (op) {
    case ReduceOp::kSum:
      if constexpr (std::is_integral_v<C>) {
        using U = std::make_unsigned_t<C>;
        return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
      } else {
        return a + b;
      }
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kMin:
      return std::min(a, b);
  }
  return a;
}

Bytes reference_reduce(DType dtype, ReduceOp op, const std::vector<Bytes>& inputs) {
  Bytes result(inputs.at(0).size());
  const std::size_t count = result.size() / element_size(dtype);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < count; ++i) {
      auto acc = load(reinterpret_cast<const T*>(inputs[0].data())[i]);
      for (std::size_t s = 1; s < inputs.size(); ++s) {
        acc = reference_combine(op, acc, load(reinterpret_cast<const T*>(inputs[s].data())[i]));
      }
      reinterpret_cast<T*>(result.data())[i] = store<T>(acc);
    }
  });
  return result;
}

bool same_values(DType dtype, const Bytes& a, const Bytes& b) {
  if (a.size() != b.size()) return false;
  const std::size_t count = a.size() / element_size(dtype);
  bool same = true;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < count && same; ++i) {
      const T x = reinterpret_cast<const T*>(a.data())[i];
      const T y = reinterpret_cast<const T*>(b.data())[i];
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, BFloat16> ||
                    std::is_same_v<T, Float16>) {
        const float fx = static_cast<float>(load(x)), fy = static_cast<float>(load(y));
        if (std::isnan(fx) && std::isnan(fy)) continue;
      }
      same = std::memcmp(&x, &y, sizeof(T)) == 0;
    }
  });
  return same;
}

DeviceGroup scrambled_group(int64_t size) {
  const std::vector<int64_t> order{5, 2, 7, 0, 3, 6, 1, 4};
  return DeviceGroup{{order.begin(), order.begin() + size}};
}

Bytes sub_bytes(const Bytes& bytes, std::size_t begin, std::size_t count) {
  return Bytes(bytes.begin() + static_cast<std::ptrdiff_t>(begin),
               bytes.begin() + static_cast<std::ptrdiff_t>(begin + count));
}

}  // namespace shardflow::testing_util
