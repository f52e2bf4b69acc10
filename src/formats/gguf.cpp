// GGUF (llama.cpp's docs/gguf.md): header, typed metadata, tensor infos, then aligned tensor data.
// Counts, lengths and offsets in the file are untrusted: each is checked against the bytes left
// before anything is allocated for it.

#include "wick/gguf.h"

#include <algorithm>
#include <cstring>

#include "formats/format_util.h"
#include "formats/gguf_internal.h"

namespace wick::gguf {

using namespace detail;

namespace {

constexpr const char* kFormat = "gguf";
constexpr size_t kDefaultAlignment = 32;
constexpr size_t kMaxDims = 4;     // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;  // arrays of arrays of ...

class Reader {
 public:
  explicit Reader(const formats::Bytes& b) : p_(b.data()), size_(b.size()), file_(b.name()) {}
  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }
  const std::string& file() const { return file_; }

  template <class... Args>
  [[noreturn]] void fail(const Args&... what) const {
    formats::fail(kFormat, file_, "offset ", pos_, ": ", what...);
  }

  void need(size_t n, const char* what) const {
    if (n > left()) fail(what, " needs ", n, " bytes, the file has ", left(), " left (truncated)");
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    uint64_t len = read<uint64_t>(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }
  /// `count` items of at least `each` bytes must fit in what is left.
  void check_count(uint64_t count, size_t each, const char* what) const {
    if (each != 0 && count > left() / each) {
      fail(what, " count ", count, " cannot fit in the ", left(), " bytes left");
    }
  }

  Value read_value(ValueType type, int depth) {
    switch (type) {
      case ValueType::U8:
        return Value::u64(read<uint8_t>("u8 value"), type);
      case ValueType::I8:
        return Value::i64(read<int8_t>("i8 value"), type);
      case ValueType::U16:
        return Value::u64(read<uint16_t>("u16 value"), type);
      case ValueType::I16:
        return Value::i64(read<int16_t>("i16 value"), type);
      case ValueType::U32:
        return Value::u64(read<uint32_t>("u32 value"), type);
      case ValueType::I32:
        return Value::i64(read<int32_t>("i32 value"), type);
      case ValueType::U64:
        return Value::u64(read<uint64_t>("u64 value"), type);
      case ValueType::I64:
        return Value::i64(read<int64_t>("i64 value"), type);
      case ValueType::F32:
        return Value::f64(read<float>("f32 value"), type);
      case ValueType::F64:
        return Value::f64(read<double>("f64 value"), type);
      case ValueType::Bool: {
        uint8_t b = read<uint8_t>("bool value");
        if (b > 1) fail("bool value ", int(b), " is neither 0 nor 1");
        return Value::boolean(b != 0);
      }
      case ValueType::String:
        return Value::string(read_string("string value"));
      case ValueType::Array: {
        if (depth >= kMaxArrayDepth) fail("arrays nested deeper than ", kMaxArrayDepth);
        uint32_t et = read<uint32_t>("array type");
        if (!valid_value_type(et)) fail("unknown array element type ", et);
        auto elem = static_cast<ValueType>(et);
        uint64_t count = read<uint64_t>("array length");
        check_count(count, min_value_bytes(elem), "array");
        auto items = std::make_shared<Value::Packed>();
        items->elem = elem;
        if (size_t each = fixed_size(elem)) {
          size_t bytes = static_cast<size_t>(count) * each;
          need(bytes, "array");
          if (elem == ValueType::Bool) {
            for (size_t i = 0; i < bytes; ++i) {
              if (p_[pos_ + i] > 1) fail("bool array element ", i, " is neither 0 nor 1");
            }
          }
          items->raw.assign(p_ + pos_, p_ + pos_ + bytes);
          pos_ += bytes;
        } else if (elem == ValueType::String) {
          items->ends.reserve(count);
          for (uint64_t i = 0; i < count; ++i) {
            uint64_t len = read<uint64_t>("string value");
            need(len, "string value");
            items->chars.append(reinterpret_cast<const char*>(p_ + pos_), len);
            pos_ += len;
            items->ends.push_back(items->chars.size());
          }
        } else {
          items->values.reserve(count);
          for (uint64_t i = 0; i < count; ++i) items->values.push_back(read_value(elem, depth + 1));
        }
        return Value::packed_array(std::move(items));
      }
    }
    fail("unknown value type ", static_cast<uint32_t>(type));
  }

 private:
  const uint8_t* p_;
  size_t size_;
  std::string file_;
  size_t pos_ = 0;
};

DType plain_dtype(GgmlType type, bool* ok) {
  *ok = true;
  switch (type) {
    case GgmlType::F32:
      return DType::F32;
    case GgmlType::F16:
      return DType::F16;
    case GgmlType::BF16:
      return DType::BF16;
    case GgmlType::F64:
      return DType::F64;
    case GgmlType::I64:
      return DType::I64;
    default:
      *ok = false;
      return DType::U8;
  }
}

}  // namespace

// ---- File ----

struct File::Impl {
  std::shared_ptr<const formats::Bytes> bytes;
  uint32_t version = 0;
  size_t alignment = kDefaultAlignment;
  std::map<std::string, Value> metadata;
  std::map<std::string, TensorInfo> tensors;
  std::vector<std::string> order;
};

namespace {

std::shared_ptr<const File::Impl> parse(std::shared_ptr<const formats::Bytes> bytes) {
  auto impl = std::make_shared<File::Impl>();
  Reader r(*bytes);
  const std::string& file = bytes->name();
  uint32_t magic = r.read<uint32_t>("magic");
  if (magic != 0x46554747u) formats::fail(kFormat, file, "offset 0: no GGUF magic");
  impl->version = r.read<uint32_t>("version");
  if (impl->version != 2 && impl->version != 3) {
    formats::fail(kFormat, file, "offset 4: version ", impl->version, " is not supported (2 or 3)");
  }
  uint64_t n_tensors = r.read<uint64_t>("tensor count");
  uint64_t n_kv = r.read<uint64_t>("metadata count");
  r.check_count(n_kv, 8 + 4 + 1, "metadata");
  for (uint64_t i = 0; i < n_kv; ++i) {
    size_t at = r.pos();
    std::string key = r.read_string("metadata key");
    uint32_t t = r.read<uint32_t>("metadata value type");
    if (!valid_value_type(t)) r.fail("metadata '", key, "' has unknown value type ", t);
    Value v = r.read_value(static_cast<ValueType>(t), 0);
    if (!impl->metadata.emplace(key, std::move(v)).second) {
      formats::fail(kFormat, file, "offset ", at, ": metadata key '", key, "' appears twice");
    }
  }
  auto al = impl->metadata.find("general.alignment");
  if (al != impl->metadata.end()) {
    uint64_t a = 0;
    try {
      a = al->second.as_uint();
    } catch (const Error&) {  // negative or not an integer: rejected below
    }
    if (a == 0 || (a & (a - 1)) != 0 || a > (size_t{1} << 30)) {
      formats::fail(kFormat, file, "general.alignment ", al->second.to_string(),
                    " is not a power of two");
    }
    impl->alignment = a;
  }
  r.check_count(n_tensors, 8 + 4 + 4 + 8, "tensor");
  struct Pending {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    uint64_t offset;
    size_t at;
  };
  std::vector<Pending> pending;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Pending p;
    p.at = r.pos();
    p.name = r.read_string("tensor name");
    uint32_t n_dims = r.read<uint32_t>("tensor rank");
    if (n_dims > kMaxDims)
      r.fail("tensor '", p.name, "' has ", n_dims, " dims (at most ", kMaxDims, ")");
    for (uint32_t d = 0; d < n_dims; ++d) p.ne.push_back(r.read<uint64_t>("tensor dim"));
    p.type = r.read<uint32_t>("tensor type");
    p.offset = r.read<uint64_t>("tensor offset");
    if (!ggml_type_known(p.type)) {
      formats::fail(kFormat, file, "offset ", p.at, ": tensor '", p.name,
                    "' has unknown GGML type ", p.type);
    }
    pending.push_back(std::move(p));
  }
  size_t data_start =
      formats::checked_add(r.pos(), impl->alignment - 1, kFormat, file, "data start") /
      impl->alignment * impl->alignment;
  size_t data_size = data_start <= bytes->size() ? bytes->size() - data_start : 0;
  struct Range {
    size_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto& p : pending) {
    std::string where = str("tensor '", p.name, "'");
    auto type = static_cast<GgmlType>(p.type);
    size_t block = ggml_block_size(type);
    std::vector<size_t> dims(p.ne.rbegin(), p.ne.rend());
    size_t count = formats::checked_elem_count(dims, kFormat, file, where);
    size_t ne0 = p.ne.empty() ? 1 : p.ne[0];
    if (ne0 % block != 0) {
      formats::fail(kFormat, file, where, ": ", ggml_type_name(type), " rows of ", ne0,
                    " values are not a whole number of ", block, "-value blocks");
    }
    size_t bytes_needed =
        formats::checked_mul(count / block, ggml_type_size(type), kFormat, file, where);
    if (p.offset % impl->alignment != 0) {
      formats::fail(kFormat, file, where, ": data offset ", p.offset,
                    " is not a multiple of the alignment ", impl->alignment);
    }
    size_t end = formats::checked_add(p.offset, bytes_needed, kFormat, file, where);
    if (end > data_size) {
      formats::fail(kFormat, file, where, ": data [", p.offset, ", ", end, ") from offset ",
                    data_start, " runs past the end of the file (", bytes->size(), " bytes)");
    }
    TensorInfo info{type, formats::checked_shape(dims, kFormat, file, where), data_start + p.offset,
                    bytes_needed};
    auto [it, fresh] = impl->tensors.emplace(p.name, std::move(info));
    if (!fresh) formats::fail(kFormat, file, "offset ", p.at, ": ", where, " appears twice");
    impl->order.push_back(p.name);
    ranges.push_back({p.offset, end, &it->first});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      formats::fail(kFormat, file, "tensor '", *ranges[i].name, "' data overlaps tensor '",
                    *ranges[i - 1].name, "'");
    }
  }
  impl->bytes = std::move(bytes);
  return impl;
}

}  // namespace

File File::open(const std::string& path) {
  return File(parse(formats::Bytes::map_file(path)));
}

File File::from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
  return File(parse(formats::Bytes::from_vector(std::move(bytes), name)));
}

const std::string& File::path() const {
  return impl_->bytes->name();
}
uint32_t File::version() const {
  return impl_->version;
}
size_t File::alignment() const {
  return impl_->alignment;
}
const std::map<std::string, Value>& File::metadata() const {
  return impl_->metadata;
}
bool File::contains_key(const std::string& key) const {
  return impl_->metadata.count(key) != 0;
}
const Value* File::find(const std::string& key) const {
  auto it = impl_->metadata.find(key);
  return it == impl_->metadata.end() ? nullptr : &it->second;
}

const Value& File::value(const std::string& key) const {
  const Value* v = find(key);
  if (v == nullptr) throw FormatError(str("gguf ", path(), ": no metadata key '", key, "'"));
  return *v;
}

namespace {
// Runs a typed getter, naming the file and key when the type is wrong.
template <class F>
auto typed(const File& f, const std::string& key, F&& get) {
  const Value& v = f.value(key);
  try {
    return get(v);
  } catch (const Error& e) {
    throw FormatError(str("gguf ", f.path(), ": metadata '", key, "': ", e.what()));
  }
}
}  // namespace

std::string File::get_string(const std::string& key) const {
  return typed(*this, key, [](const Value& v) { return v.as_string(); });
}
int64_t File::get_int(const std::string& key) const {
  return typed(*this, key, [](const Value& v) { return v.as_int(); });
}
uint64_t File::get_uint(const std::string& key) const {
  return typed(*this, key, [](const Value& v) { return v.as_uint(); });
}
double File::get_float(const std::string& key) const {
  return typed(*this, key, [](const Value& v) { return v.as_float(); });
}
bool File::get_bool(const std::string& key) const {
  return typed(*this, key, [](const Value& v) { return v.as_bool(); });
}
std::vector<std::string> File::get_string_array(const std::string& key) const {
  return typed(*this, key, [](const Value& v) { return v.as_string_array(); });
}
std::vector<int64_t> File::get_int_array(const std::string& key) const {
  return typed(*this, key, [](const Value& v) { return v.as_int_array(); });
}
std::vector<double> File::get_float_array(const std::string& key) const {
  return typed(*this, key, [](const Value& v) { return v.as_float_array(); });
}

std::string File::architecture() const {
  const Value* v = find("general.architecture");
  return v != nullptr && v->is_string() ? v->as_string() : std::string();
}

std::vector<std::string> File::tensor_names() const {
  return impl_->order;
}
bool File::contains(const std::string& name) const {
  return impl_->tensors.count(name) != 0;
}

const TensorInfo& File::info(const std::string& name) const {
  auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end()) throw Error(str("gguf ", path(), ": no tensor '", name, "'"));
  return it->second;
}

QTensor File::get_quantized(const std::string& name, const Device& device) const {
  const TensorInfo& i = info(name);
  Tensor raw = formats::tensor_from_bytes(impl_->bytes, impl_->bytes->data() + i.data_offset,
                                          DType::U8, Shape({i.byte_size}), device);
  return QTensor(i.type, i.shape, std::move(raw));
}

Tensor File::get(const std::string& name, const Device& device) const {
  const TensorInfo& i = info(name);
  bool plain;
  DType dt = plain_dtype(i.type, &plain);
  if (plain) {
    return formats::tensor_from_bytes(impl_->bytes, impl_->bytes->data() + i.data_offset, dt,
                                      i.shape, device);
  }
  if (!ggml_can_dequantize(i.type)) {
    throw UnsupportedDType(str("gguf ", path(), ": tensor '", name, "' has GGML type ",
                               ggml_type_name(i.type), ", which wick cannot dequantize"));
  }
  return get_quantized(name, device).dequantize();
}

// ---- writer ----

namespace {

class Writer {
 public:
  explicit Writer(formats::AtomicWriter& out) : out_(out) {}
  template <class T>
  void put(T v) {
    out_.write(&v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    out_.write(s.data(), s.size());
  }
  void put_value(const Value& v, const std::string& key) {
    switch (v.type()) {
      case ValueType::U8:
        return put<uint8_t>(static_cast<uint8_t>(v.as_uint()));
      case ValueType::I8:
        return put<int8_t>(static_cast<int8_t>(v.as_int()));
      case ValueType::U16:
        return put<uint16_t>(static_cast<uint16_t>(v.as_uint()));
      case ValueType::I16:
        return put<int16_t>(static_cast<int16_t>(v.as_int()));
      case ValueType::U32:
        return put<uint32_t>(static_cast<uint32_t>(v.as_uint()));
      case ValueType::I32:
        return put<int32_t>(static_cast<int32_t>(v.as_int()));
      case ValueType::U64:
        return put<uint64_t>(v.as_uint());
      case ValueType::I64:
        return put<int64_t>(v.as_int());
      case ValueType::F32:
        return put<float>(static_cast<float>(v.as_float()));
      case ValueType::F64:
        return put<double>(v.as_float());
      case ValueType::Bool:
        return put<uint8_t>(v.as_bool() ? 1 : 0);
      case ValueType::String:
        return put_string(v.as_string());
      case ValueType::Array: {
        put<uint32_t>(static_cast<uint32_t>(v.elem_type()));
        size_t n = v.array_size();
        put<uint64_t>(n);
        for (size_t i = 0; i < n; ++i) put_value(v.at(i), key);
        return;
      }
    }
  }

 private:
  formats::AtomicWriter& out_;
};

GgmlType ggml_type_of(DType dtype, const std::string& name) {
  switch (dtype) {
    case DType::F32:
      return GgmlType::F32;
    case DType::F16:
      return GgmlType::F16;
    case DType::BF16:
      return GgmlType::BF16;
    case DType::F64:
      return GgmlType::F64;
    case DType::I64:
      return GgmlType::I64;
    default:
      throw UnsupportedDType(str("gguf save: tensor '", name, "' has dtype ", dtype_name(dtype),
                                 ", which GGUF has no type for"));
  }
}

}  // namespace

void save(const std::map<std::string, Tensor>& tensors, const std::string& path,
          const std::map<std::string, Value>& metadata,
          const std::map<std::string, QTensor>& quantized, size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw Error(str("gguf save ", path, ": alignment ", alignment, " is not a power of two"));
  }
  struct Entry {
    std::string name;
    GgmlType type;
    Shape shape;
    Tensor data;  // row-major bytes come from here
  };
  std::vector<Entry> entries;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw Error(str("gguf save ", path, ": tensor '", name, "' is empty"));
    entries.push_back({name, ggml_type_of(t.dtype(), name), t.shape(), t});
  }
  for (const auto& [name, q] : quantized) {
    if (tensors.count(name))
      throw Error(str("gguf save ", path, ": tensor '", name, "' given twice"));
    entries.push_back({name, q.type(), q.shape(), q.data()});
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.name < b.name; });
  std::map<std::string, Value> md = metadata;
  if (alignment != kDefaultAlignment || md.count("general.alignment")) {
    md["general.alignment"] = Value::u64(alignment, ValueType::U32);
  }
  formats::AtomicWriter out(path, kFormat);
  Writer w(out);
  w.put<uint32_t>(0x46554747u);
  w.put<uint32_t>(3);
  w.put<uint64_t>(entries.size());
  w.put<uint64_t>(md.size());
  for (const auto& [key, v] : md) {
    w.put_string(key);
    w.put<uint32_t>(static_cast<uint32_t>(v.type()));
    w.put_value(v, key);
  }
  size_t offset = 0;
  std::vector<size_t> sizes;
  for (const auto& e : entries) {
    w.put_string(e.name);
    w.put<uint32_t>(static_cast<uint32_t>(e.shape.rank()));
    for (size_t d = e.shape.rank(); d-- > 0;) w.put<uint64_t>(e.shape[d]);
    w.put<uint32_t>(static_cast<uint32_t>(e.type));
    w.put<uint64_t>(offset);
    size_t bytes = e.data.elem_count() * size_in_bytes(e.data.dtype());
    sizes.push_back(bytes);
    offset += (bytes + alignment - 1) / alignment * alignment;
  }
  out.pad((alignment - out.written() % alignment) % alignment);
  std::vector<uint8_t> scratch;
  for (size_t i = 0; i < entries.size(); ++i) {
    out.write(formats::row_major_bytes(entries[i].data, scratch), sizes[i]);
    out.pad((alignment - sizes[i] % alignment) % alignment);
  }
  out.commit();
}

}  // namespace wick::gguf
