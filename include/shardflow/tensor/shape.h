// Tensor shapes (a list of non-negative extents, rank 0 upward) and Dims,
// the small vector that holds them and other per-dim values.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace shardflow {

// One int64 per tensor dim (extents, strides, a permutation), with the
// parts of std::vector's interface the code base uses. Up to kInline values
// live in the object itself: kernels and shape inference copy and build
// these for every op they run, and a decode step runs a few hundred ops,
// where a heap allocation each was a measurable share of the time. Unlike
// std::vector, moving a Dims of at most kInline values copies them, so
// pointers to its elements do not follow a move; at() throws
// shardflow::Error.
class Dims {
 public:
  using value_type = int64_t;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = int64_t&;
  using const_reference = const int64_t&;
  using pointer = int64_t*;
  using const_pointer = const int64_t*;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  static constexpr size_type kInline = 6;

  Dims() = default;
  explicit Dims(size_type count, int64_t value = 0) { assign(count, value); }
  Dims(std::initializer_list<int64_t> extents) { assign(extents.begin(), extents.end()); }
  template <std::input_iterator It>
  Dims(It first, It last) {
    assign(first, last);
  }
  // Interchangeable with the int lists of op arguments.
  Dims(const std::vector<int64_t>& extents) { assign(extents.begin(), extents.end()); }  // NOLINT
  Dims(const Dims& other) { assign(other.begin(), other.end()); }
  Dims(Dims&& other) noexcept { take(other); }
  ~Dims() { release(); }

  Dims& operator=(const Dims& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  Dims& operator=(Dims&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  Dims& operator=(std::initializer_list<int64_t> extents) {
    assign(extents.begin(), extents.end());
    return *this;
  }
  operator std::vector<int64_t>() const { return {begin(), end()}; }  // NOLINT

  void assign(size_type count, int64_t value) {
    size_ = 0;
    reserve(count);
    std::fill_n(data_, count, value);
    size_ = count;
  }
  template <std::input_iterator It>
  void assign(It first, It last) {
    clear();
    if constexpr (std::forward_iterator<It>) {
      const auto count = static_cast<size_type>(std::distance(first, last));
      reserve(count);
      std::copy(first, last, data_);
      size_ = count;
    } else {
      for (; first != last; ++first) push_back(*first);
    }
  }

  size_type size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_type capacity() const { return capacity_; }
  int64_t* data() { return data_; }
  const int64_t* data() const { return data_; }

  iterator begin() { return data_; }
  iterator end() { return data_ + size_; }
  const_iterator begin() const { return data_; }
  const_iterator end() const { return data_ + size_; }
  const_iterator cbegin() const { return begin(); }
  const_iterator cend() const { return end(); }
  reverse_iterator rbegin() { return reverse_iterator(end()); }
  reverse_iterator rend() { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const { return const_reverse_iterator(begin()); }

  int64_t& operator[](size_type i) { return data_[i]; }
  const int64_t& operator[](size_type i) const { return data_[i]; }
  int64_t& at(size_type i) { return data_[checked(i)]; }
  const int64_t& at(size_type i) const { return data_[checked(i)]; }
  int64_t& front() { return data_[0]; }
  const int64_t& front() const { return data_[0]; }
  int64_t& back() { return data_[size_ - 1]; }
  const int64_t& back() const { return data_[size_ - 1]; }

  void reserve(size_type wanted) {
    if (wanted > capacity_) grow(wanted);
  }
  void clear() { size_ = 0; }
  void resize(size_type count, int64_t value = 0) {
    reserve(count);
    if (count > size_) std::fill(data_ + size_, data_ + count, value);
    size_ = count;
  }
  void push_back(int64_t value) {  // by value: `value` may be an element
    if (size_ == capacity_) grow(2 * capacity_);
    data_[size_++] = value;
  }
  int64_t& emplace_back(int64_t value) {
    push_back(value);
    return back();
  }
  void pop_back() { --size_; }
  iterator insert(const_iterator position, int64_t value) { return insert(position, size_type{1}, value); }
  iterator insert(const_iterator position, size_type count, int64_t value);
  template <std::input_iterator It>
  iterator insert(const_iterator position, It first, It last) {
    const Dims extents(first, last);  // the source may be this shape
    const auto at = static_cast<size_type>(position - data_);
    make_gap(at, extents.size());
    std::copy(extents.begin(), extents.end(), data_ + at);
    return data_ + at;
  }
  iterator insert(const_iterator position, std::initializer_list<int64_t> extents) {
    return insert(position, extents.begin(), extents.end());
  }
  iterator erase(const_iterator position) { return erase(position, position + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    const auto from = static_cast<size_type>(first - data_);
    const auto to = static_cast<size_type>(last - data_);
    if (from == to) return data_ + from;
    std::copy(data_ + to, data_ + size_, data_ + from);
    size_ -= to - from;
    return data_ + from;
  }

  friend bool operator==(const Dims& a, const Dims& b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }
  friend std::strong_ordering operator<=>(const Dims& a, const Dims& b) {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  bool on_heap() const { return data_ != inline_; }
  size_type checked(size_type i) const;  // i, or throws when out of range
  void grow(size_type wanted);
  void make_gap(size_type at, size_type count);
  // Inline: every tensor and type copy or move goes through these.
  void release() {
    if (on_heap()) delete[] data_;
    data_ = inline_;
    capacity_ = kInline;
  }
  void take(Dims& other) noexcept {
    if (other.on_heap()) {
      data_ = other.data_;
      capacity_ = other.capacity_;
    } else {
      std::copy(other.inline_, other.inline_ + other.size_, inline_);
    }
    size_ = other.size_;
    other.data_ = other.inline_;
    other.size_ = 0;
    other.capacity_ = kInline;
  }

  int64_t* data_ = inline_;
  size_type size_ = 0;
  size_type capacity_ = kInline;
  int64_t inline_[kInline];
};

// A tensor's extents.
using Shape = Dims;

// The element count; an error when it does not fit in int64 (a zero extent
// makes it 0 whatever the others are).
int64_t numel(std::span<const int64_t> shape);
// Row-major strides in elements.
Dims row_major_strides(std::span<const int64_t> shape);
// "[8,512]"; a scalar is "[]".
std::string shape_to_string(std::span<const int64_t> shape);

// NumPy/PyTorch broadcasting of two shapes; throws PyTorch's message
// ("The size of tensor a (3) must match the size of tensor b (4) at
// non-singleton dimension 1") when they do not broadcast.
Shape broadcast_shapes(std::span<const int64_t> a, std::span<const int64_t> b);

// Wraps a possibly negative dim into [0, rank); PyTorch's error otherwise:
// "Dimension out of range (expected to be in range of [-2, 1], but got 2)".
// A scalar accepts dims -1 and 0, as PyTorch does.
int64_t wrap_dim(int64_t dim, int64_t rank);

}  // namespace shardflow
