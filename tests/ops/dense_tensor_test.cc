// DenseTensor buffers: the alignment kernels rely on, fresh and recycled;
// sizes that do not fit.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "shardflow/base/error.h"
#include "shardflow/tensor/dense_tensor.h"

namespace sf = shardflow;

namespace {

uintptr_t address(const sf::DenseTensor& t) { return reinterpret_cast<uintptr_t>(t.data()); }

TEST(DenseTensor, SmallBuffersAre64ByteAligned) {
  for (int64_t n : {1, 3, 16, 1000, 16000}) {  // below 64 KiB
    const sf::DenseTensor t = sf::DenseTensor::empty(sf::DType::kF32, {n});
    EXPECT_EQ(address(t) % 64, 0u) << n << " floats";
  }
}

// Matrix-vector kernels stream weights measurably faster from a page start.
TEST(DenseTensor, BuffersOf64KiBOrMoreStartOnAPage) {
  for (int round = 0; round < 2; ++round) {  // the second round gets recycled buffers
    std::vector<sf::DenseTensor> held;
    for (int64_t n : {16384, 16385, 589824, 1 << 22}) {
      held.push_back(sf::DenseTensor::empty(sf::DType::kF32, {n}));
      EXPECT_EQ(address(held.back()) % 4096, 0u) << n << " floats, round " << round;
      held.back().data_as<float>()[n - 1] = 1.0f;  // the whole size is there
    }
  }
}

// The kB of huge pages backing the mapping that holds `address`, from
// /proc/self/smaps; -1 where that file cannot tell.
int64_t huge_page_kib_around(uintptr_t where) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= where && where < end;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stoll(line.substr(14));
    }
  }
  return -1;
}

// Memory another library placed on 4 KiB pages, 64 bytes into a page as
// torch places a large tensor, keeps its contents and addresses when moved
// onto huge pages, which then back it.
TEST(DenseTensor, BorrowedMemoryCollapsesIntoHugePagesInPlace) {
  constexpr std::size_t kBytes = std::size_t{8} << 20;
  void* region = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  const std::shared_ptr<std::byte> mapping(static_cast<std::byte*>(region),
                                           [](std::byte* p) { munmap(p, kBytes); });
  const int64_t count = static_cast<int64_t>((kBytes - 64) / sizeof(float));
  const std::shared_ptr<std::byte> first(mapping, mapping.get() + 64);
  float* values = reinterpret_cast<float*>(first.get());
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 9973) - 0.5f;

  const sf::DenseTensor small = sf::DenseTensor::borrow(sf::DType::kF32, {1000}, first);
  EXPECT_FALSE(small.collapse_into_huge_pages());  // no whole huge page inside

  const sf::DenseTensor borrowed = sf::DenseTensor::borrow(sf::DType::kF32, {count}, first);
  if (!borrowed.collapse_into_huge_pages()) {
    GTEST_SKIP() << "the kernel does not collapse memory into huge pages here (errno " << errno << ")";
  }
  EXPECT_EQ(borrowed.data(), first.get());
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(values[i], static_cast<float>(i % 9973) - 0.5f) << "element " << i;
  }
  // The 2 MiB pages wholly inside the 8 MiB (three or four of them).
  EXPECT_GE(huge_page_kib_around(reinterpret_cast<uintptr_t>(region)), 3 * 2048);
}

#if !defined(__SANITIZE_ADDRESS__)  // AddressSanitizer builds free every buffer at once
// Minor page faults of this process so far.
long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// The pool of freed large buffers is full of a size no longer used (an
// earlier model's): a new size still gets cached, the oldest go, so a
// buffer of the new size comes back without faulting its pages in again.
TEST(DenseTensor, AFullBufferPoolMakesRoomForTheSizeInUse) {
  constexpr int64_t kOldFloats = int64_t{64} << 20;  // 256 MiB, never touched
  {
    std::vector<sf::DenseTensor> old;
    for (int i = 0; i < 5; ++i) old.push_back(sf::DenseTensor::empty(sf::DType::kF32, {kOldFloats}));
  }  // freed: the pool (1 GiB) is full of them
  constexpr int64_t kNewFloats = (int64_t{16} << 20) + 1024;  // 64 MiB and a bit
  auto touch = [](sf::DenseTensor& t) {
    for (int64_t i = 0; i < t.numel(); i += 1024) t.data_as<float>()[i] = 1.0f;  // every 4 KiB page
  };
  {
    sf::DenseTensor first = sf::DenseTensor::empty(sf::DType::kF32, {kNewFloats});
    touch(first);
  }
  sf::DenseTensor again = sf::DenseTensor::empty(sf::DType::kF32, {kNewFloats});
  const long before = minor_faults();
  touch(again);
  EXPECT_LT(minor_faults() - before, 32) << "the buffer was mapped anew";
}
#endif

}  // namespace

namespace {

// Element counts past int64 and byte counts past 2^63 are errors, never a
// wrapped-around small buffer; a zero extent makes any shape empty.
TEST(DenseTensor, SizesBeyondInt64AreErrors) {
  constexpr int64_t kHalf = int64_t{1} << 62;
  EXPECT_EQ(sf::numel(sf::Shape{0, kHalf, kHalf}), 0);
  EXPECT_EQ(sf::numel(sf::Shape{kHalf, 1}), kHalf);
  EXPECT_THROW(sf::numel(sf::Shape{kHalf, 4}), sf::Error);
  EXPECT_THROW(sf::DenseTensor::empty(sf::DType::kF32, {kHalf, 4}), sf::Error);
  EXPECT_THROW(sf::DenseTensor::zeros(sf::DType::kF32, {int64_t{1} << 61}), sf::Error);  // 2^63 bytes
  EXPECT_EQ(sf::DenseTensor::zeros(sf::DType::kF32, {0, kHalf}).numel(), 0);
}

}  // namespace
