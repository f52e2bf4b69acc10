#pragma once
// What gguf.cpp (the file's parser) and gguf_value.cpp (metadata values) share: the encodings of
// fixed-size scalars and the packed storage of metadata arrays.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "wick/gguf.h"

namespace wick::gguf {

namespace detail {

/// Smallest encoding of one value of `type` (for bounding counts by the bytes left).
size_t min_value_bytes(ValueType type);
/// Whether `t` names a GGUF value type.
bool valid_value_type(uint32_t t);
/// Bytes of one fixed-size scalar of `type` (0 for strings and arrays).
size_t fixed_size(ValueType type);
/// The scalar of `type` at `p` (fixed_size(type) bytes, little-endian).
Value decode_fixed(ValueType type, const uint8_t* p);
/// Appends the encoding of the scalar `v` of `type`.
void encode_fixed(ValueType type, const Value& v, std::vector<uint8_t>& out);

}  // namespace detail

// An array's elements as the file stores them: fixed-size scalars as their bytes, strings as one
// buffer and their end offsets, nested arrays as Values.
struct Value::Packed {
  ValueType elem = ValueType::U8;
  std::vector<uint8_t> raw;
  std::string chars;
  std::vector<uint64_t> ends;
  std::vector<Value> values;

  size_t size() const {
    if (elem == ValueType::String) return ends.size();
    if (elem == ValueType::Array) return values.size();
    return raw.size() / detail::fixed_size(elem);
  }
  std::string string_at(size_t i) const {
    size_t begin = i == 0 ? 0 : ends[i - 1];
    return chars.substr(begin, ends[i] - begin);
  }
  Value at(size_t i) const {
    if (elem == ValueType::String) return Value::string(string_at(i));
    if (elem == ValueType::Array) return values[i];
    return detail::decode_fixed(elem, raw.data() + i * detail::fixed_size(elem));
  }
};

}  // namespace wick::gguf
