// Small text helpers shared by the printers and parsers: UTF-8 decoding,
// Python-style reprs and joins.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace shardflow {

// A code point and the length of its UTF-8 sequence.
struct CodePoint {
  uint32_t value = 0;
  std::size_t length = 0;  // 0: the bytes at that position are not valid UTF-8
};

// The code point whose UTF-8 sequence starts at text[i] (i < text.size());
// overlong forms, surrogates and values past U+10FFFF are invalid, as in the
// Unicode standard, and so is a sequence cut off by the end of the text.
CodePoint decode_utf8(std::string_view text, std::size_t i);

// Python's repr() of a str: single quotes unless the text contains a single
// quote and no double quote; backslash escapes for quotes, control characters
// and bytes that are not valid UTF-8.
std::string python_repr(std::string_view text);

// A quoted, escaped rendering of arbitrary bytes for error messages, cut to at
// most `max_bytes` input bytes (with "..." when cut).
std::string quote_for_message(std::string_view text, std::size_t max_bytes = 80);

// "a<sep>b<sep>c" for integers.
std::string join_ints(std::span<const int64_t> values, std::string_view separator);

// Python's str() of a tuple of ints: "(1,)", "(2, 4)", "()".
std::string python_int_tuple(std::span<const int64_t> values);

// numpy's str() of a 1-D int array: "[0 1 2 3]", "[ 0 -1]"; long arrays wrap
// at 75 columns and more than 1000 elements are summarised, as numpy does.
std::string numpy_int_array(std::span<const int64_t> values);

}  // namespace shardflow
