// safetensors: https://github.com/huggingface/safetensors (format description in its README).
// The reader trusts nothing in the header: every offset and size is checked against the file.

#include "wick/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "formats/format_util.h"
#include "formats/json_util.h"

namespace wick::safetensors {

namespace {

constexpr const char* kFormat = "safetensors";
// The reference implementation refuses larger headers too.
constexpr size_t kMaxHeaderBytes = size_t{100} << 20;

struct DTypeName {
  const char* name;
  size_t bytes;
  bool supported;
  DType dtype;
};

// Every dtype the safetensors specification names; the supported ones map to a wick dtype
// (BOOL is one byte, 0 or 1: read as U8). Bytes 0: packed in fewer than 8 bits (never read). A
// name not listed is a malformed file.
constexpr DTypeName kDTypes[] = {
    {"BOOL", 1, true, DType::U8},     {"U8", 1, true, DType::U8},
    {"I8", 1, false, DType::U8},      {"I16", 2, false, DType::U8},
    {"U16", 2, false, DType::U8},     {"F16", 2, true, DType::F16},
    {"BF16", 2, true, DType::BF16},   {"I32", 4, false, DType::U8},
    {"U32", 4, true, DType::U32},     {"F32", 4, true, DType::F32},
    {"F64", 8, true, DType::F64},     {"I64", 8, true, DType::I64},
    {"U64", 8, false, DType::U8},     {"F8_E5M2", 1, false, DType::U8},
    {"F8_E4M3", 1, false, DType::U8}, {"F8_E8M0", 1, false, DType::U8},
    {"C64", 8, false, DType::U8},     {"F4", 0, false, DType::U8},
    {"F6_E2M3", 0, false, DType::U8}, {"F6_E3M2", 0, false, DType::U8},
};

const char* safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::U8:
      return "U8";
    case DType::U32:
      return "U32";
    case DType::I64:
      return "I64";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
  }
  return "?";
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

struct File::Impl {
  std::shared_ptr<const formats::Bytes> bytes;
  std::map<std::string, TensorInfo> tensors;
  std::vector<std::string> order;  // by data offset
  std::map<std::string, std::string> metadata;
};

namespace {

std::shared_ptr<const File::Impl> parse(std::shared_ptr<const formats::Bytes> bytes) {
  using formats::fail;
  const std::string& file = bytes->name();
  size_t size = bytes->size();
  if (size < 8)
    fail(kFormat, file, "file is ", size, " bytes, too short for the 8-byte header length");
  uint64_t header_len = read_le64(bytes->data());
  if (header_len > size - 8) {
    fail(kFormat, file, "header length ", header_len,
         " at offset 0 runs past the end of the file (", size, " bytes)");
  }
  if (header_len > kMaxHeaderBytes) {
    fail(kFormat, file, "header length ", header_len, " is over the ", kMaxHeaderBytes,
         "-byte limit");
  }
  const char* text = reinterpret_cast<const char*>(bytes->data() + 8);
  nlohmann::json header =
      formats::parse_json(text, text + header_len, kFormat, file, "header (offset 8)");
  if (!header.is_object()) fail(kFormat, file, "header (offset 8) is not a JSON object");

  auto impl = std::make_shared<File::Impl>();
  size_t data_start = 8 + header_len;
  size_t data_size = size - data_start;
  struct Range {
    size_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(kFormat, file, "__metadata__ is not a JSON object");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(kFormat, file, "__metadata__ value of '", k, "' is not a string");
        impl->metadata[k] = v.get<std::string>();
      }
      continue;
    }
    std::string where = str("tensor '", name, "'");
    if (!entry.is_object()) fail(kFormat, file, where, ": entry is not a JSON object");
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) fail(kFormat, file, where, ": no string 'dtype'");
    if (sh == entry.end() || !sh->is_array()) fail(kFormat, file, where, ": no array 'shape'");
    if (off == entry.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      fail(kFormat, file, where, ": 'data_offsets' is not two non-negative integers");
    }
    if (sh->size() > formats::kMaxRank) {
      fail(kFormat, file, where, ": shape has ", sh->size(), " dims (at most ", formats::kMaxRank,
           ")");
    }
    TensorInfo info;
    std::vector<size_t> dims;
    for (auto& d : *sh) {
      if (!d.is_number_unsigned())
        fail(kFormat, file, where, ": shape holds a non-integer or negative dim");
      dims.push_back(d.get<uint64_t>());
    }
    // Counted before a Shape is made: a lying header must give a FormatError, not an overflow.
    size_t count = formats::checked_elem_count(dims, kFormat, file, where);
    info.shape = formats::checked_shape(dims, kFormat, file, where);
    info.dtype_name = dt->get<std::string>();
    size_t begin = (*off)[0].get<uint64_t>();
    size_t end = (*off)[1].get<uint64_t>();
    if (begin > end)
      fail(kFormat, file, where, ": data_offsets [", begin, ", ", end, "] are out of order");
    if (end > data_size) {
      fail(kFormat, file, where, ": data_offsets [", begin, ", ", end,
           "] run past the end of the data (", data_size, " bytes from offset ", data_start, ")");
    }
    const DTypeName* known = nullptr;
    for (const auto& d : kDTypes) {
      if (info.dtype_name == d.name) known = &d;
    }
    if (known == nullptr) {
      fail(kFormat, file, where, ": dtype '", info.dtype_name, "' is not a safetensors dtype");
    }
    info.supported = known->supported;
    if (known->bytes != 0) {
      info.dtype = known->dtype;
      size_t need = formats::checked_mul(count, known->bytes, kFormat, file, where);
      if (need != end - begin) {
        fail(kFormat, file, where, ": ", info.dtype_name, " ", info.shape, " needs ", need,
             " bytes but data_offsets [", begin, ", ", end, "] hold ", end - begin);
      }
    }
    info.data_offset = data_start + begin;
    info.byte_size = end - begin;
    auto [it, fresh] = impl->tensors.emplace(name, std::move(info));
    ranges.push_back({begin, end, &it->first});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      fail(kFormat, file, "tensor '", *ranges[i].name, "' data [", ranges[i].begin, ", ",
           ranges[i].end, "] overlaps tensor '", *ranges[i - 1].name, "' data [",
           ranges[i - 1].begin, ", ", ranges[i - 1].end, "]");
    }
  }
  for (const auto& r : ranges) impl->order.push_back(*r.name);
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

std::vector<std::string> File::names() const {
  return impl_->order;
}

bool File::contains(const std::string& name) const {
  return impl_->tensors.count(name) != 0;
}

const std::map<std::string, std::string>& File::metadata() const {
  return impl_->metadata;
}

const TensorInfo& File::info(const std::string& name) const {
  auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end())
    throw Error(str("safetensors ", path(), ": no tensor '", name, "'"));
  if (!it->second.supported) {
    throw UnsupportedDType(str("safetensors ", path(), ": tensor '", name, "' has dtype ",
                               it->second.dtype_name, ", which wick has no type for"));
  }
  return it->second;
}

Tensor File::get(const std::string& name, const Device& device) const {
  const TensorInfo& i = info(name);
  return formats::tensor_from_bytes(impl_->bytes, impl_->bytes->data() + i.data_offset, i.dtype,
                                    i.shape, device);
}

std::map<std::string, Tensor> File::load_all(const Device& device) const {
  std::map<std::string, Tensor> out;
  for (const auto& name : impl_->order) out.emplace(name, get(name, device));
  return out;
}

std::map<std::string, Tensor> load(const std::string& path, const Device& device) {
  return File::open(path).load_all(device);
}

void save(const std::map<std::string, Tensor>& tensors, const std::string& path,
          const std::map<std::string, std::string>& metadata) {
  // Wider elements first, then by name (as the reference writer orders them): with the header
  // padded to 8 bytes every tensor starts aligned to its element size, so loads can view it.
  std::vector<std::pair<const std::string*, const Tensor*>> order;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw Error(str("safetensors save ", path, ": tensor '", name, "' is empty"));
    if (name == "__metadata__")
      throw Error(str("safetensors save ", path, ": '__metadata__' is reserved"));
    order.emplace_back(&name, &t);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return size_in_bytes(a.second->dtype()) > size_in_bytes(b.second->dtype());
  });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& [name, t] : order) {
    size_t bytes = t->elem_count() * size_in_bytes(t->dtype());
    header[*name] = {{"dtype", safetensors_name(t->dtype())},
                     {"shape", t->dims()},
                     {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Padded with spaces so the data starts 8-byte aligned (as the reference writer does).
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  formats::AtomicWriter out(path, kFormat);
  out.write(len, 8);
  out.write(text.data(), text.size());
  std::vector<uint8_t> scratch;
  for (const auto& [name, t] : order) {
    const uint8_t* p = formats::row_major_bytes(*t, scratch);
    out.write(p, t->elem_count() * size_in_bytes(t->dtype()));
  }
  out.commit();
}

// ---- sharded checkpoints ----

ShardedFile ShardedFile::open(const std::string& path) {
  namespace fs = std::filesystem;
  ShardedFile out;
  out.path_ = path;
  if (fs::path(path).extension() != ".json") {
    File f = File::open(path);
    for (const auto& n : f.names()) out.shard_of_[n] = 0;
    out.metadata_ = f.metadata();
    out.shards_.push_back(std::move(f));
    return out;
  }
  auto bytes = formats::Bytes::map_file(path);
  const char* text = reinterpret_cast<const char*>(bytes->data());
  nlohmann::json index =
      formats::parse_json(text, text + bytes->size(), "safetensors index", path, "index");
  if (!index.is_object()) formats::fail("safetensors index", path, "index is not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object())
    formats::fail("safetensors index", path, "no object 'weight_map'");
  auto md = index.find("metadata");
  if (md != index.end() && md->is_object()) {
    // Scalars as their JSON text; a nested value is not metadata wick reads.
    for (auto& [k, v] : md->items()) {
      if (v.is_string()) {
        out.metadata_[k] = v.get<std::string>();
      } else if (v.is_primitive()) {
        out.metadata_[k] = v.dump();
      }
    }
  }
  fs::path dir = fs::path(path).parent_path();
  std::map<std::string, size_t> shard_index;
  for (auto& [name, shard] : wm->items()) {
    if (!shard.is_string()) {
      formats::fail("safetensors index", path, "weight_map entry '", name, "' is not a file name");
    }
    std::string file = shard.get<std::string>();
    auto it = shard_index.find(file);
    if (it == shard_index.end()) {
      fs::path rel(file);
      bool escapes = file.empty() || rel.is_absolute();
      for (const auto& part : rel) escapes = escapes || part == "..";
      if (escapes) {
        formats::fail("safetensors index", path, "weight_map entry '", name, "' names shard ",
                      formats::quote_prefix(file), ", not a file beside the index");
      }
      it = shard_index.emplace(file, out.shards_.size()).first;
      try {
        out.shards_.push_back(File::open((dir / file).string()));
      } catch (const FormatError& e) {
        formats::fail("safetensors index", path, "shard ", file, ": ", e.what());
      }
    }
    if (!out.shards_[it->second].contains(name)) {
      formats::fail("safetensors index", path, "tensor '", name, "' is not in its shard ", file);
    }
    out.shard_of_[name] = it->second;
  }
  return out;
}

std::vector<std::string> ShardedFile::names() const {
  std::vector<std::string> out;
  for (const auto& [n, s] : shard_of_) out.push_back(n);
  return out;
}

bool ShardedFile::contains(const std::string& name) const {
  return shard_of_.count(name) != 0;
}

const File& ShardedFile::file_of(const std::string& name) const {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end()) throw Error(str("safetensors ", path_, ": no tensor '", name, "'"));
  return shards_[it->second];
}

const TensorInfo& ShardedFile::info(const std::string& name) const {
  return file_of(name).info(name);
}

Tensor ShardedFile::get(const std::string& name, const Device& device) const {
  return file_of(name).get(name, device);
}

std::map<std::string, Tensor> load_sharded(const std::string& path, const Device& device) {
  ShardedFile f = ShardedFile::open(path);
  std::map<std::string, Tensor> out;
  for (const auto& n : f.names()) out.emplace(n, f.get(n, device));
  return out;
}

}  // namespace wick::safetensors
