// GGUF metadata values (wick/gguf.h's Value): scalars, strings and arrays, the arrays stored as
// the file packs them (gguf_internal.h) so that a large array costs about its bytes in memory.

#include <algorithm>
#include <cstring>

#include "formats/format_util.h"
#include "formats/gguf_internal.h"

namespace wick::gguf {

namespace detail {

bool valid_value_type(uint32_t t) {
  return t <= static_cast<uint32_t>(ValueType::F64);
}

// Bytes of one fixed-size element (0 for strings and arrays).
size_t fixed_size(ValueType type) {
  switch (type) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::Bool:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    case ValueType::String:
    case ValueType::Array:
      return 0;
  }
  return 0;
}

// Smallest encoding of one value of `type` (for bounding counts by the bytes left): a string is
// at least its 8-byte length, an array its 4-byte type and 8-byte count.
size_t min_value_bytes(ValueType type) {
  if (size_t f = fixed_size(type)) return f;
  if (type == ValueType::Array) return 12;
  return type == ValueType::String ? 8 : 1;
}

// The fixed-size value of `type` whose little-endian bytes are at `p`.
Value decode_fixed(ValueType type, const uint8_t* p) {
  auto get = [p]<class T>(T) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  };
  switch (type) {
    case ValueType::U8:
      return Value::u64(get(uint8_t{}), type);
    case ValueType::I8:
      return Value::i64(get(int8_t{}), type);
    case ValueType::U16:
      return Value::u64(get(uint16_t{}), type);
    case ValueType::I16:
      return Value::i64(get(int16_t{}), type);
    case ValueType::U32:
      return Value::u64(get(uint32_t{}), type);
    case ValueType::I32:
      return Value::i64(get(int32_t{}), type);
    case ValueType::U64:
      return Value::u64(get(uint64_t{}), type);
    case ValueType::I64:
      return Value::i64(get(int64_t{}), type);
    case ValueType::F32:
      return Value::f64(get(float{}), type);
    case ValueType::F64:
      return Value::f64(get(double{}), type);
    case ValueType::Bool:
      return Value::boolean(get(uint8_t{}) != 0);
    case ValueType::String:
    case ValueType::Array:
      break;
  }
  throw Error("gguf: not a fixed-size type");
}

// Appends the little-endian bytes of `v` as `type`.
void encode_fixed(ValueType type, const Value& v, std::vector<uint8_t>& out) {
  auto put = [&out]<class T>(T x) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    out.insert(out.end(), b, b + sizeof(T));
  };
  switch (type) {
    case ValueType::U8:
      return put(static_cast<uint8_t>(v.as_uint()));
    case ValueType::I8:
      return put(static_cast<int8_t>(v.as_int()));
    case ValueType::U16:
      return put(static_cast<uint16_t>(v.as_uint()));
    case ValueType::I16:
      return put(static_cast<int16_t>(v.as_int()));
    case ValueType::U32:
      return put(static_cast<uint32_t>(v.as_uint()));
    case ValueType::I32:
      return put(static_cast<int32_t>(v.as_int()));
    case ValueType::U64:
      return put(v.as_uint());
    case ValueType::I64:
      return put(v.as_int());
    case ValueType::F32:
      return put(static_cast<float>(v.as_float()));
    case ValueType::F64:
      return put(v.as_float());
    case ValueType::Bool:
      return put(static_cast<uint8_t>(v.as_bool() ? 1 : 0));
    case ValueType::String:
    case ValueType::Array:
      break;
  }
}

}  // namespace detail

using namespace detail;

// ---- Value ----

const char* value_type_name(ValueType type) {
  switch (type) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::Bool:
      return "bool";
    case ValueType::String:
      return "string";
    case ValueType::Array:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "?";
}

Value Value::u64(uint64_t v, ValueType type) {
  Value x;
  x.type_ = type;
  x.v_ = v;
  return x;
}
Value Value::i64(int64_t v, ValueType type) {
  Value x;
  x.type_ = type;
  x.v_ = v;
  return x;
}
Value Value::f64(double v, ValueType type) {
  Value x;
  x.type_ = type;
  x.v_ = v;
  return x;
}
Value Value::boolean(bool v) {
  Value x;
  x.type_ = ValueType::Bool;
  x.v_ = v;
  return x;
}
Value Value::string(std::string v) {
  Value x;
  x.type_ = ValueType::String;
  x.v_ = std::move(v);
  return x;
}
Value Value::array(ValueType elem_type, const Array& items) {
  auto packed = std::make_shared<Packed>();
  packed->elem = elem_type;
  for (const Value& item : items) {
    if (item.type() != elem_type) {
      throw Error(str("gguf: an array of ", value_type_name(elem_type), " given a ",
                      value_type_name(item.type())));
    }
    if (elem_type == ValueType::String) {
      packed->chars += item.as_string();
      packed->ends.push_back(packed->chars.size());
    } else if (elem_type == ValueType::Array) {
      packed->values.push_back(item);
    } else {
      encode_fixed(elem_type, item, packed->raw);
    }
  }
  return packed_array(std::move(packed));
}

Value Value::packed_array(std::shared_ptr<const Packed> items) {
  Value x;
  x.type_ = ValueType::Array;
  x.elem_type_ = items->elem;
  x.v_ = std::move(items);
  return x;
}

const Value::Packed& Value::packed() const {
  if (const auto* a = std::get_if<std::shared_ptr<const Packed>>(&v_)) return **a;
  throw Error(str("gguf value of type ", value_type_name(type_), " is not an array"));
}

size_t Value::array_size() const {
  return packed().size();
}

Value Value::at(size_t i) const {
  const Packed& p = packed();
  if (i >= p.size()) {
    throw IndexOutOfRange(str("gguf array: element ", i, " of an array of ", p.size()));
  }
  return p.at(i);
}

bool Value::is_integer() const {
  return std::holds_alternative<uint64_t>(v_) || std::holds_alternative<int64_t>(v_);
}

int64_t Value::as_int() const {
  if (const auto* u = std::get_if<uint64_t>(&v_)) {
    if (*u > static_cast<uint64_t>(INT64_MAX))
      throw Error(str("gguf value ", *u, " does not fit int64"));
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v_)) return *i;
  throw Error(str("gguf value of type ", value_type_name(type_), " is not an integer"));
}

uint64_t Value::as_uint() const {
  if (const auto* u = std::get_if<uint64_t>(&v_)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v_)) {
    if (*i < 0) throw Error(str("gguf value ", *i, " is negative"));
    return static_cast<uint64_t>(*i);
  }
  throw Error(str("gguf value of type ", value_type_name(type_), " is not an integer"));
}

double Value::as_float() const {
  if (const auto* d = std::get_if<double>(&v_)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v_)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&v_)) return static_cast<double>(*i);
  throw Error(str("gguf value of type ", value_type_name(type_), " is not a number"));
}

bool Value::as_bool() const {
  if (const auto* b = std::get_if<bool>(&v_)) return *b;
  throw Error(str("gguf value of type ", value_type_name(type_), " is not a bool"));
}

const std::string& Value::as_string() const {
  if (const auto* s = std::get_if<std::string>(&v_)) return *s;
  throw Error(str("gguf value of type ", value_type_name(type_), " is not a string"));
}

Value::Array Value::as_array() const {
  const Packed& p = packed();
  Array out;
  out.reserve(p.size());
  for (size_t i = 0; i < p.size(); ++i) out.push_back(p.at(i));
  return out;
}

std::vector<std::string> Value::as_string_array() const {
  const Packed& p = packed();
  if (p.elem != ValueType::String) {
    throw Error(str("gguf array of ", value_type_name(p.elem), " is not an array of strings"));
  }
  std::vector<std::string> out;
  out.reserve(p.size());
  for (size_t i = 0; i < p.size(); ++i) out.push_back(p.string_at(i));
  return out;
}

std::vector<int64_t> Value::as_int_array() const {
  const Packed& p = packed();
  std::vector<int64_t> out;
  out.reserve(p.size());
  for (size_t i = 0; i < p.size(); ++i) out.push_back(p.at(i).as_int());
  return out;
}

std::vector<double> Value::as_float_array() const {
  const Packed& p = packed();
  std::vector<double> out;
  out.reserve(p.size());
  for (size_t i = 0; i < p.size(); ++i) out.push_back(p.at(i).as_float());
  return out;
}

std::string Value::to_string() const {
  if (const auto* u = std::get_if<uint64_t>(&v_)) return std::to_string(*u);
  if (const auto* i = std::get_if<int64_t>(&v_)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v_)) return str(*d);
  if (const auto* b = std::get_if<bool>(&v_)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v_)) {
    return s->size() <= 64 ? "\"" + *s + "\"" : "\"" + s->substr(0, 61) + "...\"";
  }
  return str("[", packed().size(), " x ", value_type_name(elem_type_), "]");
}

}  // namespace wick::gguf
