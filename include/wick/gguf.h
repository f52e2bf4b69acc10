#pragma once
// GGUF files (llama.cpp's model format, versions 2 and 3): typed metadata, tensor infos, aligned
// tensor data in GGML's block formats. Files are memory-mapped.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "wick/device.h"
#include "wick/quantized.h"
#include "wick/shape.h"
#include "wick/tensor.h"

namespace wick::gguf {

/// Metadata value types, numbered as in the file.
enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
const char* value_type_name(ValueType type);

/// One metadata value. Integers are held as int64 or uint64 (by signedness), floats as double;
/// `type()` keeps the type the file used. Arrays are held packed as the file stores them (a
/// scalar array takes its file size in memory, a string array its bytes plus 8 per string);
/// their elements are made into Values on demand. Values are immutable: safe to read from
/// several threads.
class Value {
 public:
  using Array = std::vector<Value>;
  Value() = default;
  static Value u64(uint64_t v, ValueType type = ValueType::U64);
  static Value i64(int64_t v, ValueType type = ValueType::I64);
  static Value f64(double v, ValueType type = ValueType::F64);
  static Value boolean(bool v);
  static Value string(std::string v);
  /// `elem_type` is the declared element type (kept for empty arrays); wick::Error when an item
  /// has another type.
  static Value array(ValueType elem_type, const Array& items);

  ValueType type() const { return type_; }
  /// For arrays: the element type.
  ValueType elem_type() const { return elem_type_; }
  bool is_integer() const;
  bool is_float() const { return type_ == ValueType::F32 || type_ == ValueType::F64; }
  bool is_string() const { return type_ == ValueType::String; }
  bool is_array() const { return type_ == ValueType::Array; }

  /// Any integer type, when it fits int64 (wick::Error otherwise).
  int64_t as_int() const;
  /// Any non-negative integer.
  uint64_t as_uint() const;
  /// Floats, and integers converted.
  double as_float() const;
  bool as_bool() const;
  const std::string& as_string() const;
  /// Elements of an array (wick::Error for other types).
  size_t array_size() const;
  /// Element `i` of an array (IndexOutOfRange past its end).
  Value at(size_t i) const;
  /// The elements as Values, made on demand (prefer array_size/at or the typed forms below for
  /// long arrays).
  Array as_array() const;
  std::vector<std::string> as_string_array() const;
  std::vector<int64_t> as_int_array() const;
  std::vector<double> as_float_array() const;
  /// Short text form for messages and tools: 42, 1.5, "text", [3 x string].
  std::string to_string() const;

  /// The packed elements of an array (defined by the GGUF reader).
  struct Packed;
  static Value packed_array(std::shared_ptr<const Packed> items);

 private:
  const Packed& packed() const;
  ValueType type_ = ValueType::U8;
  ValueType elem_type_ = ValueType::U8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<const Packed>> v_;
};

/// Where one tensor lies: GGML type, logical shape (row-major: GGUF's ne[0] is the last dim),
/// byte range from the start of the file.
struct TensorInfo {
  GgmlType type = GgmlType::F32;
  Shape shape;
  size_t data_offset = 0;
  size_t byte_size = 0;
};

/// An opened GGUF file (cheap to copy: copies share the mapping). Immutable after open: every
/// method may be called from several threads at once.
class File {
 public:
  /// Maps and validates `path`. FormatError naming the file and offset for a malformed file.
  static File open(const std::string& path);
  static File from_bytes(std::vector<uint8_t> bytes, const std::string& name = "<memory>");

  const std::string& path() const;
  uint32_t version() const;
  size_t alignment() const;
  const std::map<std::string, Value>& metadata() const;
  bool contains_key(const std::string& key) const;
  /// The value of `key`, or nullptr.
  const Value* find(const std::string& key) const;
  /// Typed getters: wick::Error naming the file and key when missing or of another type.
  const Value& value(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  /// general.architecture ("llama", ...), empty when absent.
  std::string architecture() const;

  /// Tensor names in file order.
  std::vector<std::string> tensor_names() const;
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  /// The tensor on `device`: F32/F16/BF16/F64/I64 as they are (a CPU view of the mapping when
  /// aligned), quantized types dequantised to F32. UnsupportedDType for other types.
  Tensor get(const std::string& name, const Device& device = Device::cpu()) const;
  /// The raw blocks on `device` (a view of the mapping on the CPU), any type.
  QTensor get_quantized(const std::string& name, const Device& device = Device::cpu()) const;

  struct Impl;

 private:
  explicit File(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/// Writes a GGUF v3 file atomically: `metadata` (general.alignment is set to `alignment`), then
/// `tensors` (F32, F16, BF16, F64, I64; any layout) and `quantized` (raw blocks) in name order.
void save(const std::map<std::string, Tensor>& tensors, const std::string& path,
          const std::map<std::string, Value>& metadata = {},
          const std::map<std::string, QTensor>& quantized = {}, size_t alignment = 32);

}  // namespace wick::gguf
