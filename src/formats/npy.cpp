// NumPy .npy (format description: numpy/lib/format.py) and .npz (a zip of .npy members, read
// and written with libzip).

#include "wick/npy.h"

#include <zip.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <set>

#include "formats/format_util.h"

namespace wick::npy {

namespace {

constexpr const char* kFormat = "npy";
const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

struct Header {
  std::string descr;
  bool fortran = false;
  std::vector<size_t> shape;
  size_t data_offset = 0;
};

// The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (3,), }
class DictParser {
 public:
  DictParser(const std::string& text, const std::string& file, size_t base)
      : s_(text), file_(file), base_(base) {}

  Header parse() {
    Header h;
    bool has_descr = false, has_fortran = false, has_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      std::string key = string_literal();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          fail_at("'descr' is not a string (structured dtypes are not supported)");
        h.descr = string_literal();
        has_descr = true;
      } else if (key == "fortran_order") {
        h.fortran = boolean();
        has_fortran = true;
      } else if (key == "shape") {
        h.shape = tuple();
        has_shape = true;
      } else {
        fail_at("unknown key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      if (peek() != '}') fail_at("expected ',' or '}'");
    }
    if (!has_descr || !has_fortran || !has_shape)
      fail_at("header lacks descr, fortran_order or shape");
    return h;
  }

 private:
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n')) ++pos_;
  }
  [[noreturn]] void fail_at(const std::string& what) const {
    formats::fail(kFormat, file_, "header at offset ", base_ + pos_, ": ", what);
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail_at(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string_literal() {
    skip_space();
    char q = peek();
    if (q != '\'' && q != '"') fail_at("expected a string");
    ++pos_;
    size_t end = s_.find(q, pos_);
    if (end == std::string::npos) fail_at("unterminated string");
    std::string out = s_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.compare(pos_, 4, "True") == 0) {
      pos_ += 4;
      return true;
    }
    if (s_.compare(pos_, 5, "False") == 0) {
      pos_ += 5;
      return false;
    }
    fail_at("expected True or False");
  }
  std::vector<size_t> tuple() {
    expect('(');
    std::vector<size_t> dims;
    while (true) {
      skip_space();
      if (peek() == ')') {
        ++pos_;
        return dims;
      }
      if (peek() < '0' || peek() > '9') fail_at("expected a dim");
      size_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (__builtin_mul_overflow(v, size_t{10}, &v) ||
            __builtin_add_overflow(v, static_cast<size_t>(peek() - '0'), &v)) {
          fail_at("dim overflows");
        }
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2 longs
      dims.push_back(v);
      if (dims.size() > 64) fail_at("more than 64 dims");
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ')') {
        fail_at("expected ',' or ')' in shape");
      }
    }
  }

  const std::string& s_;
  const std::string& file_;
  size_t base_;
  size_t pos_ = 0;
};

struct DescrInfo {
  DType dtype;
  bool big_endian;
};

DescrInfo parse_descr(const std::string& descr, const std::string& file) {
  if (descr.size() < 3) {
    throw UnsupportedDType(str("npy ", file, ": dtype '", descr, "' is not supported"));
  }
  char order = descr[0];
  std::string kind = descr.substr(1);
  DType dt;
  if (kind == "f2")
    dt = DType::F16;
  else if (kind == "f4")
    dt = DType::F32;
  else if (kind == "f8")
    dt = DType::F64;
  else if (kind == "i8")
    dt = DType::I64;
  else if (kind == "u4")
    dt = DType::U32;
  else if (kind == "u1" || kind == "b1")
    dt = DType::U8;
  else {
    throw UnsupportedDType(
        str("npy ", file, ": dtype '", descr, "' is not supported (f2, f4, f8, i8, u4, u1, b1)"));
  }
  if (order != '<' && order != '>' && order != '|' && order != '=') {
    formats::fail(kFormat, file, "dtype '", descr, "' has no byte order");
  }
  return {dt, order == '>' && size_in_bytes(dt) > 1};
}

Header read_header(const formats::Bytes& b) {
  const std::string& file = b.name();
  const uint8_t* p = b.data();
  if (b.size() < 10 || std::memcmp(p, kMagic, 6) != 0)
    formats::fail(kFormat, file, "no NUMPY magic at offset 0");
  uint8_t major = p[6];
  size_t len, start;
  if (major == 1) {
    len = p[8] | (p[9] << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) formats::fail(kFormat, file, "file ends in the header length");
    len = static_cast<size_t>(p[8]) | (static_cast<size_t>(p[9]) << 8) |
          (static_cast<size_t>(p[10]) << 16) | (static_cast<size_t>(p[11]) << 24);
    start = 12;
  } else {
    formats::fail(kFormat, file, "unknown format version ", int(major), " at offset 6");
  }
  if (len > b.size() - start) {
    formats::fail(kFormat, file, "header length ", len,
                  " at offset 8 runs past the end of the file (", b.size(), " bytes)");
  }
  std::string text(reinterpret_cast<const char*>(p + start), len);
  Header h = DictParser(text, file, start).parse();
  h.data_offset = start + len;
  return h;
}

Tensor load_from(const std::shared_ptr<const formats::Bytes>& b, const Device& device) {
  const std::string& file = b->name();
  Header h = read_header(*b);
  DescrInfo d = parse_descr(h.descr, file);
  size_t esize = size_in_bytes(d.dtype);
  size_t count = formats::checked_elem_count(h.shape, kFormat, file, "shape");
  Shape shape = formats::checked_shape(h.shape, kFormat, file, "shape");
  size_t bytes = formats::checked_mul(count, esize, kFormat, file, "data");
  if (bytes > b->size() - h.data_offset) {
    formats::fail(kFormat, file, "data of ", h.descr, " ", shape, " needs ", bytes,
                  " bytes from offset ", h.data_offset, " but the file has ",
                  b->size() - h.data_offset, " (truncated)");
  }
  std::vector<size_t> dims = h.shape;
  if (h.fortran) std::reverse(dims.begin(), dims.end());
  const uint8_t* src = b->data() + h.data_offset;
  Tensor t;
  if (d.big_endian) {
    std::vector<uint8_t> swapped(src, src + bytes);
    for (size_t i = 0; i < count; ++i)
      std::reverse(swapped.begin() + i * esize, swapped.begin() + (i + 1) * esize);
    auto held = formats::Bytes::from_vector(std::move(swapped), file);
    t = formats::tensor_from_bytes(held, held->data(), d.dtype, Shape(dims), device);
  } else {
    t = formats::tensor_from_bytes(b, src, d.dtype, Shape(dims), device);
  }
  if (h.fortran && dims.size() > 1) {
    std::vector<size_t> order(dims.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
    t = t.permute(order);
  }
  return t;
}

const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::U8:
      return "|u1";
    case DType::U32:
      return "<u4";
    case DType::I64:
      return "<i8";
    case DType::F16:
      return "<f2";
    case DType::F32:
      return "<f4";
    case DType::F64:
      return "<f8";
    case DType::BF16:
      break;
  }
  return nullptr;
}

}  // namespace

Tensor load(const std::string& path, const Device& device) {
  return load_from(formats::Bytes::map_file(path), device);
}

Tensor load_bytes(std::vector<uint8_t> bytes, const std::string& name, const Device& device) {
  return load_from(formats::Bytes::from_vector(std::move(bytes), name), device);
}

std::vector<uint8_t> to_bytes(const Tensor& t) {
  if (!t.defined()) throw Error("npy save: empty tensor handle");
  const char* descr = descr_of(t.dtype());
  if (descr == nullptr) {
    throw UnsupportedDType(str("npy save: dtype ", dtype_name(t.dtype()), " has no numpy type"));
  }
  std::string shape = "(";
  for (size_t i = 0; i < t.rank(); ++i)
    shape += str(t.dims()[i], t.rank() == 1 ? "," : (i + 1 < t.rank() ? ", " : ""));
  shape += ")";
  std::string header =
      str("{'descr': '", descr, "', 'fortran_order': False, 'shape': ", shape, ", }");
  // Magic, version, length, header and '\n' padded to a multiple of 64 bytes (as numpy does).
  size_t start = header.size() + 1 + 10 > 65535 ? 12 : 10;
  size_t total = (start + header.size() + 1 + 63) / 64 * 64;
  header.append(total - start - header.size() - 1, ' ');
  header += '\n';
  std::vector<uint8_t> out(kMagic, kMagic + 6);
  out.push_back(start == 10 ? 1 : 2);
  out.push_back(0);
  for (size_t i = 0; i < start - 8; ++i)
    out.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  std::vector<uint8_t> scratch;
  const uint8_t* p = formats::row_major_bytes(t, scratch);
  out.insert(out.end(), p, p + t.elem_count() * size_in_bytes(t.dtype()));
  return out;
}

void save(const Tensor& t, const std::string& path) {
  std::vector<uint8_t> bytes = to_bytes(t);
  formats::AtomicWriter out(path, kFormat);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

}  // namespace wick::npy

namespace wick::npz {

namespace {

constexpr const char* kFormat = "npz";
// Deflate expands at most ~1032x: a member claiming more is malformed.
constexpr size_t kMaxDeflateRatio = 1100;

uint32_t le16(const uint8_t* p) {
  return p[0] | (p[1] << 8);
}
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t le64(const uint8_t* p) {
  return le32(p) | (static_cast<uint64_t>(le32(p + 4)) << 32);
}

// CRC-32 (IEEE, as zip stores it).
uint32_t crc32(const uint8_t* p, size_t n) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

struct ZipEntry {
  std::string name;
  uint64_t size = 0, comp_size = 0, local_offset = 0;
};

// The members of the archive as its central directory lists them (ZIP64 fields read), each
// checked to lie inside the file: what libzip does not expose, so that members sharing bytes and
// the total they expand to can be refused before anything is decompressed.
std::vector<ZipEntry> central_directory(const formats::Bytes& b) {
  const std::string& file = b.name();
  const uint8_t* p = b.data();
  size_t n = b.size();
  if (n < 22) formats::fail(kFormat, file, "not a zip archive (", n, " bytes)");
  size_t eocd = n - 22, lowest = n - 22 > 65535 ? n - 22 - 65535 : 0;
  while (le32(p + eocd) != 0x06054b50u) {
    if (eocd == lowest) formats::fail(kFormat, file, "not a zip archive (no end of directory)");
    --eocd;
  }
  uint64_t count = le16(p + eocd + 10), cd_size = le32(p + eocd + 12);
  uint64_t cd_offset = le32(p + eocd + 16);
  if ((count == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_offset == 0xFFFFFFFFu) && eocd >= 20 &&
      le32(p + eocd - 20) == 0x07064b50u) {
    uint64_t z = le64(p + eocd - 20 + 8);
    if (z > n || n - z < 56 || le32(p + z) != 0x06064b50u) {
      formats::fail(kFormat, file, "ZIP64 end of directory at offset ", z, " is not one");
    }
    count = le64(p + z + 32);
    cd_size = le64(p + z + 40);
    cd_offset = le64(p + z + 48);
  }
  if (cd_offset > n || cd_size > n - cd_offset || count > cd_size / 46) {
    formats::fail(kFormat, file, "central directory (", count, " entries, ", cd_size,
                  " bytes at offset ", cd_offset, ") does not fit in the file (", n, " bytes)");
  }
  std::vector<ZipEntry> out;
  size_t pos = cd_offset, end = cd_offset + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (end - pos < 46 || le32(p + pos) != 0x02014b50u) {
      formats::fail(kFormat, file, "directory entry ", i, " at offset ", pos, " is malformed");
    }
    ZipEntry e;
    e.comp_size = le32(p + pos + 20);
    e.size = le32(p + pos + 24);
    size_t name_len = le16(p + pos + 28), extra_len = le16(p + pos + 30);
    size_t comment_len = le16(p + pos + 32);
    e.local_offset = le32(p + pos + 42);
    if (end - pos - 46 < name_len + extra_len + comment_len) {
      formats::fail(kFormat, file, "directory entry ", i, " at offset ", pos,
                    " runs past the directory");
    }
    e.name.assign(reinterpret_cast<const char*>(p + pos + 46), name_len);
    // ZIP64 extra field: the 64-bit values of the fields saturated above, in this order.
    const uint8_t* x = p + pos + 46 + name_len;
    for (size_t k = 0; k + 4 <= extra_len;) {
      size_t id = le16(x + k), len = le16(x + k + 2);
      if (k + 4 + len > extra_len) break;
      if (id == 0x0001) {
        size_t at = k + 4;
        auto wide = [&](uint64_t& field) {
          if (field != 0xFFFFFFFFu) return;
          if (at + 8 > k + 4 + len) {
            formats::fail(kFormat, file, "member '", e.name, "': ZIP64 field is too short");
          }
          field = le64(x + at);
          at += 8;
        };
        wide(e.size);
        wide(e.comp_size);
        wide(e.local_offset);
      }
      k += 4 + len;
    }
    pos += 46 + name_len + extra_len + comment_len;
    out.push_back(std::move(e));
  }
  return out;
}

// Refuses members whose bytes overlap (one deflate stream listed many times) and archives that
// would expand past kMaxDeflateRatio times their size in all.
void check_members(const formats::Bytes& b, const std::vector<ZipEntry>& entries) {
  const std::string& file = b.name();
  const uint8_t* p = b.data();
  size_t n = b.size();
  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  uint64_t total = 0;
  uint64_t cap = formats::checked_mul(n, kMaxDeflateRatio, kFormat, file, "size cap");
  for (const auto& e : entries) {
    uint64_t off = e.local_offset;
    if (off > n || n - off < 30 || le32(p + off) != 0x04034b50u) {
      formats::fail(kFormat, file, "member '", e.name, "': no local header at offset ", off);
    }
    uint64_t begin = off + 30 + le16(p + off + 26) + le16(p + off + 28);
    if (begin > n || e.comp_size > n - begin) {
      formats::fail(kFormat, file, "member '", e.name, "': ", e.comp_size,
                    " compressed bytes from offset ", begin, " run past the end of the file (", n,
                    " bytes)");
    }
    ranges.push_back({off, begin + e.comp_size, &e.name});
    if (e.size > cap - std::min(cap, total)) {
      formats::fail(kFormat, file, "members expand to more than ", kMaxDeflateRatio,
                    "x the archive (", n, " bytes) in all, at member '", e.name, "'");
    }
    total += e.size;
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& c) { return a.begin < c.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      formats::fail(kFormat, file, "member '", *ranges[i].name, "' overlaps member '",
                    *ranges[i - 1].name, "' (bytes from offset ", ranges[i].begin, ")");
    }
  }
}

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

std::map<std::string, Tensor> load_from(const std::shared_ptr<const formats::Bytes>& b,
                                        const Device& device) {
  const std::string& file = b->name();
  std::vector<ZipEntry> entries = central_directory(*b);
  check_members(*b, entries);
  zip_error_t error;
  zip_error_init(&error);
  zip_source_t* src = zip_source_buffer_create(b->data(), b->size(), 0, &error);
  if (src == nullptr) formats::fail(kFormat, file, "cannot read: ", zip_error_strerror(&error));
  std::unique_ptr<zip_t, ZipCloser> archive(zip_open_from_source(src, ZIP_RDONLY, &error));
  if (!archive) {
    zip_source_free(src);
    std::string why = zip_error_strerror(&error);
    zip_error_fini(&error);
    formats::fail(kFormat, file, "not a zip archive: ", why);
  }
  zip_error_fini(&error);
  std::map<std::string, Tensor> out;
  zip_int64_t n = zip_get_num_entries(archive.get(), 0);
  if (n < 0 || static_cast<size_t>(n) != entries.size()) {
    formats::fail(kFormat, file, "libzip reads ", n, " members, the directory lists ",
                  entries.size());
  }
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(archive.get(), i, 0, &st) != 0 || !(st.valid & ZIP_STAT_NAME) ||
        !(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_CRC) ||
        st.size != entries[static_cast<size_t>(i)].size) {
      formats::fail(kFormat, file, "member ", i, ": unreadable directory entry");
    }
    std::string name = st.name;
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".npy") != 0) {
      formats::fail(kFormat, file, "member '", name, "' is not an .npy file");
    }
    std::string key = name.substr(0, name.size() - 4);
    if (out.count(key)) formats::fail(kFormat, file, "member '", name, "' appears twice");
    size_t cap = formats::checked_mul(b->size(), kMaxDeflateRatio, kFormat, file, "size cap");
    if (st.size > cap) {
      formats::fail(kFormat, file, "member '", name, "' claims ", st.size, " bytes, more than ",
                    kMaxDeflateRatio, "x the archive");
    }
    std::unique_ptr<zip_file_t, ZipFileCloser> member(zip_fopen_index(archive.get(), i, 0));
    if (!member) {
      formats::fail(kFormat, file, "member '", name, "': ", zip_strerror(archive.get()));
    }
    std::vector<uint8_t> data(static_cast<size_t>(st.size));
    size_t got = 0;
    while (got < data.size()) {
      zip_int64_t r = zip_fread(member.get(), data.data() + got, data.size() - got);
      if (r < 0)
        formats::fail(kFormat, file, "member '", name, "': ", zip_file_strerror(member.get()));
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    if (got != data.size()) {
      formats::fail(kFormat, file, "member '", name, "' holds ", got, " bytes, its entry says ",
                    data.size());
    }
    uint32_t crc = crc32(data.data(), data.size());
    if (crc != st.crc) {
      formats::fail(kFormat, file, "member '", name, "': CRC-32 of the data is ", crc,
                    ", the directory says ", st.crc);
    }
    formats::count_copied(data.size());
    out.emplace(key, npy::load_bytes(std::move(data), file + ":" + name, device));
  }
  return out;
}

}  // namespace

std::map<std::string, Tensor> load(const std::string& path, const Device& device) {
  return load_from(formats::Bytes::map_file(path), device);
}

std::map<std::string, Tensor> load_bytes(std::vector<uint8_t> bytes, const std::string& name,
                                         const Device& device) {
  return load_from(formats::Bytes::from_vector(std::move(bytes), name), device);
}

void save(const std::map<std::string, Tensor>& tensors, const std::string& path, bool compress) {
  std::vector<std::vector<uint8_t>> members;
  members.reserve(tensors.size());
  for (const auto& [name, t] : tensors) members.push_back(npy::to_bytes(t));
  formats::AtomicWriter temp(path, kFormat);
  temp.close_for_external();
  int err = 0;
  zip_t* z = zip_open(temp.temp_path().c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  if (z == nullptr)
    throw Error(str("npz save ", path, ": cannot create the archive (libzip error ", err, ")"));
  size_t i = 0;
  for (const auto& [name, t] : tensors) {
    const auto& m = members[i++];
    zip_source_t* s = zip_source_buffer(z, m.data(), m.size(), 0);
    zip_int64_t idx = s ? zip_file_add(z, (name + ".npy").c_str(), s, ZIP_FL_ENC_UTF_8) : -1;
    if (idx < 0) {
      if (s) zip_source_free(s);
      std::string why = zip_strerror(z);
      zip_discard(z);
      throw Error(str("npz save ", path, ": cannot add '", name, "': ", why));
    }
    zip_set_file_compression(z, static_cast<zip_uint64_t>(idx),
                             compress ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0);
  }
  if (zip_close(z) != 0) {
    std::string why = zip_strerror(z);
    zip_discard(z);
    throw Error(str("npz save ", path, ": ", why));
  }
  temp.commit();
}

}  // namespace wick::npz
