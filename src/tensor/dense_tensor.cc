#include "shardflow/tensor/dense_tensor.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "device_memory_counter.h"
#include "shardflow/base/error.h"

namespace shardflow {

namespace {

// The transparent huge page of x86-64 Linux.
constexpr std::size_t kHugePage = std::size_t{2} << 20;

// Small buffers (below 64 KiB) are kept per thread by size, without a lock.
// A decode step allocates the same few hundred small tensors every token, and
// aligned_alloc misses malloc's own thread cache, so this saves most of the
// allocator's time there. A buffer freed on another thread joins that
// thread's cache.
class SmallBufferCache {
 public:
  static constexpr std::size_t kGranule = 64;  // the buffer alignment; sizes are multiples
  static constexpr std::size_t kClasses = (std::size_t{64} << 10) / kGranule;
  static constexpr std::size_t kMaxPerClass = 32;
  static constexpr std::size_t kMaxCached = std::size_t{4} << 20;  // bytes per thread

  SmallBufferCache() = default;
  SmallBufferCache(const SmallBufferCache&) = delete;
  SmallBufferCache& operator=(const SmallBufferCache&) = delete;
  ~SmallBufferCache();

  void* take(std::size_t bytes) {
    std::vector<void*>& free = free_[bytes / kGranule];
    if (free.empty()) return nullptr;
    void* memory = free.back();
    free.pop_back();
    cached_ -= bytes;
    return memory;
  }

  bool keep(void* memory, std::size_t bytes) {
    std::vector<void*>& free = free_[bytes / kGranule];
    if (free.size() >= kMaxPerClass || cached_ + bytes > kMaxCached) return false;
    free.push_back(memory);
    cached_ += bytes;
    return true;
  }

 private:
  std::array<std::vector<void*>, kClasses> free_;
  std::size_t cached_ = 0;
};

thread_local SmallBufferCache small_buffers;
// Trivially destructible, so still readable while the thread's other
// thread_local objects are destroyed: buffers freed after the cache is gone
// go straight back to malloc.
thread_local bool small_buffers_alive = true;

SmallBufferCache::~SmallBufferCache() {
  small_buffers_alive = false;
  for (std::vector<void*>& free : free_) {
    for (void* memory : free) std::free(memory);
  }
}

// Large tensor buffers are kept for reuse when freed. Freshly mapped memory
// costs a page fault per 4 KiB on first touch, which for the large
// intermediates of eager ops and graph runs costs more than the op itself;
// buffers of the same size recur from one step to the next.
class BufferPool {
 public:
  static constexpr std::size_t kAlignment = 64;
  static constexpr std::size_t kLargeAlignment = 4096;
  static constexpr std::size_t kPooledMin = std::size_t{64} << 10;  // smaller: SmallBufferCache
  static constexpr std::size_t kMaxCached = std::size_t{1} << 30;   // bytes kept at most
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer finds a use after free only if the buffer is freed.
  static constexpr bool kRecycle = false;
#else
  static constexpr bool kRecycle = true;
#endif

  // aligned_alloc takes sizes that are multiples of the alignment, so
  // allocate() rounds to this too.
  static std::size_t alignment_for(std::size_t bytes) { return bytes >= kPooledMin ? kLargeAlignment : kAlignment; }

  static BufferPool& instance() {
    static BufferPool* pool = new BufferPool();  // never destroyed: buffers may outlive main
    return *pool;
  }

  void* take(std::size_t bytes) {
    if (void* memory = kRecycle ? take_cached(bytes) : nullptr) return memory;
    // Large buffers start on a page. malloc's own placement of a large
    // block, 64 bytes into a page, made every matrix-vector product of a
    // stories110M decode step stream its weights 8-13% slower on the 2-core
    // AMD EPYC VM this was measured on (same kernel, same bytes).
    if (bytes >= kHugePage) return take_huge(bytes);
    void* memory = std::aligned_alloc(alignment_for(bytes), bytes);
    if (memory == nullptr) throw Error(fmt::format("out of memory allocating {} bytes", bytes));
    return memory;
  }

  void give(void* memory, std::size_t bytes) {
    if (!kRecycle || !keep_cached(memory, bytes)) std::free(memory);
  }

 private:
  // Buffers of 2 MiB and more start on a 2 MiB boundary and ask the kernel
  // for transparent huge pages (which Debian gives only where asked). A
  // decode step streams every weight once; on 4 KiB pages the hardware
  // prefetcher stops at each page and the TLB misses every 4 KiB. Decode of
  // a 1.1B shape (3.9 GiB of weights) on the dev VM went from 11.5-12.2 to
  // 12.6-13.5 tok/s in alternating runs. Where huge pages are off, madvise
  // fails and the buffer is an ordinary one.
  static void* take_huge(std::size_t bytes) {
    void* memory = nullptr;
    if (posix_memalign(&memory, kHugePage, bytes) != 0) {
      throw Error(fmt::format("out of memory allocating {} bytes", bytes));
    }
#if defined(MADV_HUGEPAGE)
    madvise(memory, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
    return memory;
  }

  void* take_cached(std::size_t bytes) {
    if (bytes < kPooledMin) return small_buffers_alive ? small_buffers.take(bytes) : nullptr;
    std::lock_guard lock(mutex_);
    auto found = free_.find(bytes);
    if (found == free_.end() || found->second.empty()) return nullptr;
    const auto cached = found->second.back();
    found->second.pop_back();
    void* memory = cached->memory;
    recent_.erase(cached);
    cached_ -= bytes;
    return memory;
  }

  bool keep_cached(void* memory, std::size_t bytes) {
    if (bytes < kPooledMin) return small_buffers_alive && small_buffers.keep(memory, bytes);
    if (bytes > kMaxCached) return false;
    std::vector<void*> evicted;
    {
      std::lock_guard lock(mutex_);
      // Full: the buffers freed longest ago go back to the system. They are
      // of sizes an earlier model or shape used; refusing the new size
      // instead made every call of the next model fault its buffers in
      // again (stories110M (4,1,2) prefill after three stories15M runs in
      // one process: 54,000 page faults, 282 instead of 122 ms).
      while (cached_ + bytes > kMaxCached) {
        const auto oldest = std::prev(recent_.end());
        std::vector<std::list<Cached>::iterator>& same_size = free_[oldest->bytes];
        same_size.erase(std::find(same_size.begin(), same_size.end(), oldest));
        cached_ -= oldest->bytes;
        evicted.push_back(oldest->memory);
        recent_.erase(oldest);
      }
      recent_.push_front({bytes, memory});
      free_[bytes].push_back(recent_.begin());
      cached_ += bytes;
    }
    for (void* old : evicted) std::free(old);
    return true;
  }

  struct Cached {
    std::size_t bytes;
    void* memory;
  };
  std::mutex mutex_;
  std::list<Cached> recent_;  // the cached buffers, most recently freed first
  std::unordered_map<std::size_t, std::vector<std::list<Cached>::iterator>> free_;  // by size, into recent_
  std::size_t cached_ = 0;
};

std::shared_ptr<std::byte> allocate(std::size_t bytes) {
  const std::size_t alignment = BufferPool::alignment_for(bytes);
  const std::size_t rounded = std::max<std::size_t>((bytes + alignment - 1) / alignment, 1) * alignment;
  void* memory = BufferPool::instance().take(rounded);
  detail::DeviceMemoryCounter* counter = detail::current_device_memory_counter();
  if (counter != nullptr) detail::count_allocation(*counter, static_cast<int64_t>(rounded));
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(memory), [rounded, counter](std::byte* p) {
    BufferPool::instance().give(p, rounded);
    if (counter != nullptr) detail::count_free(*counter, static_cast<int64_t>(rounded));
  });
}

}  // namespace

DenseTensor DenseTensor::empty(DType dtype, Shape shape) {
  for (int64_t d : shape) {
    if (d < 0) throw Error("tensor shape " + shape_to_string(shape) + " has a negative dimension");
  }
  DenseTensor tensor;
  tensor.dtype_ = dtype;
  tensor.numel_ = shardflow::numel(shape);
  if (tensor.numel_ > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(element_size(dtype))) {
    throw Error(fmt::format("out of memory: a {} tensor of shape {} needs 2^63 bytes or more", dtype_name(dtype),
                            shape_to_string(shape)));
  }
  tensor.shape_ = std::move(shape);
  tensor.buffer_ = allocate(tensor.nbytes());
  return tensor;
}

DenseTensor DenseTensor::borrow(DType dtype, Shape shape, std::shared_ptr<std::byte> owner, Access access) {
  DenseTensor tensor;
  tensor.dtype_ = dtype;
  tensor.numel_ = shardflow::numel(shape);
  tensor.shape_ = std::move(shape);
  if (tensor.numel_ > 0 && owner == nullptr) throw Error("DenseTensor::borrow: no memory to view");
  if (reinterpret_cast<uintptr_t>(owner.get()) % element_size(dtype) != 0) {
    throw Error(fmt::format("cannot view memory at {} as {}: it is not aligned to {} bytes",
                            static_cast<const void*>(owner.get()), dtype_name(dtype), element_size(dtype)));
  }
  tensor.buffer_ = std::move(owner);
  tensor.borrowed_ = true;
  tensor.writable_ = access == Access::kWritable;
  return tensor;
}

bool DenseTensor::collapse_into_huge_pages() const {
#if defined(__linux__)
  constexpr int kCollapse = 25;  // MADV_COLLAPSE, which older C libraries do not name
  const auto begin = reinterpret_cast<uintptr_t>(data());
  const uintptr_t first = (begin + kHugePage - 1) / kHugePage * kHugePage;
  const uintptr_t last = (begin + nbytes()) / kHugePage * kHugePage;
  if (begin == 0 || last <= first) return false;
  return madvise(reinterpret_cast<void*>(first), last - first, kCollapse) == 0;
#else
  return false;
#endif
}

DenseTensor DenseTensor::zeros(DType dtype, Shape shape) {
  DenseTensor tensor = empty(dtype, std::move(shape));
  std::memset(tensor.data(), 0, tensor.nbytes());
  return tensor;
}

DenseTensor DenseTensor::reshaped(Shape shape) const {
  if (shardflow::numel(shape) != numel_) {
    throw Error(fmt::format("shape '{}' is invalid for input of size {}", shape_to_string(shape), numel_));
  }
  DenseTensor view = *this;
  view.shape_ = std::move(shape);
  return view;
}

}  // namespace shardflow
