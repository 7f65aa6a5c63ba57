// A dense, row-major tensor in an owned, 64-byte aligned host buffer;
// buffers of 64 KiB or more start on a 4096-byte page.
//
// Copies share the buffer. Buffers are written only while a kernel fills a
// tensor it just created; after that they are read-only by convention, so a
// shared buffer never changes under another holder.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "shardflow/tensor/dtype.h"
#include "shardflow/tensor/shape.h"

namespace shardflow {

class DenseTensor {
 public:
  DenseTensor() = default;
  // Uninitialised contents.
  static DenseTensor empty(DType dtype, Shape shape);
  static DenseTensor zeros(DType dtype, Shape shape);
  // Whether kernels may write into borrowed memory (see borrow()).
  enum class Access { kReadOnly, kWritable };
  // Views memory that something else owns (a NumPy array, a torch tensor)
  // without copying: `owner` keeps it alive and its pointer is the first
  // element, row-major, aligned to the element size. Read-only: shardflow
  // never writes into it, kernels do not reuse it for their results.
  // Writable: the owner lets it be used as an owned buffer, so a kernel that
  // holds the only handle may write its result into it (the torch bridge
  // feeds a KV cache that a graph updates in place this way).
  static DenseTensor borrow(DType dtype, Shape shape, std::shared_ptr<std::byte> owner,
                            Access access = Access::kReadOnly);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * element_size(dtype_); }
  bool defined() const { return buffer_ != nullptr; }

  std::byte* data() { return buffer_.get(); }
  const std::byte* data() const { return buffer_.get(); }
  std::span<const std::byte> bytes() const { return {data(), nbytes()}; }
  template <class T>
  T* data_as() {
    return reinterpret_cast<T*>(data());
  }
  template <class T>
  const T* data_as() const {
    return reinterpret_cast<const T*>(data());
  }

  // The same bytes read with another shape of equal element count.
  DenseTensor reshaped(Shape shape) const;

  // No other DenseTensor (copy or reshaped view) shares these bytes. A
  // kernel whose operand is the sole owner may write its result into it: the
  // interpreter hands over an intermediate at its last use that way, so an
  // update of a donated buffer (a KV cache) needs no copy.
  bool is_sole_owner() const { return buffer_ != nullptr && is_writable() && buffer_.use_count() == 1; }
  // Kernels may write into it: its own memory, or borrowed as writable.
  bool is_writable() const { return !borrowed_ || writable_; }
  // Views memory another library owns (borrow()).
  bool is_borrowed() const { return borrowed_; }

  // Asks the kernel to back the whole 2 MiB pages inside this tensor's
  // memory with huge pages now (Linux 6.1's MADV_COLLAPSE): contents and
  // addresses stay. For borrowed memory another library placed on 4 KiB
  // pages (torch's), which a decode step streams ~4% slower; shardflow's own
  // large buffers are on huge pages from the start. Returns whether the
  // kernel did it: false where it cannot (an older kernel, huge pages off,
  // no whole huge page inside), which leaves the memory as it was.
  bool collapse_into_huge_pages() const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<std::byte> buffer_;
  bool borrowed_ = false;
  bool writable_ = false;  // borrowed with Access::kWritable
};

}  // namespace shardflow
