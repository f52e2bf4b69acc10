#pragma once
// Shared by the file-format readers and writers: the bytes of a file (memory-mapped or held in
// memory), checked arithmetic on untrusted sizes, errors naming the file, tensors made from file
// bytes, and atomic writes.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util.h"
#include "wick/device.h"
#include "wick/dtype.h"
#include "wick/error.h"
#include "wick/shape.h"
#include "wick/tensor.h"

namespace wick::formats {

/// The read-only bytes of one file: a private memory mapping, or a buffer handed over in memory.
/// Tensors that view the bytes hold `owner()` so the bytes outlive the File object.
class Bytes {
 public:
  /// Maps `path` (copy-on-write, so a tensor viewing it may be written in place). Throws
  /// FormatError naming the path when it is missing, unreadable or not a regular file (a named
  /// pipe or a device is refused before it is opened for reading, so it cannot block).
  static std::shared_ptr<const Bytes> map_file(const std::string& path);
  /// Takes `data`; `name` stands for the path in error messages.
  static std::shared_ptr<const Bytes> from_vector(std::vector<uint8_t> data, std::string name);

  Bytes(const uint8_t* data, size_t size, std::string name, std::shared_ptr<void> owner)
      : data_(data), size_(size), name_(std::move(name)), owner_(std::move(owner)) {}
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  const uint8_t* data_;
  size_t size_;
  std::string name_;
  std::shared_ptr<void> owner_;  // munmaps or frees the bytes
};

/// Most dims a tensor in any file format may have (numpy's own limit); a larger rank in a file
/// is a FormatError before anything is sized from it.
constexpr size_t kMaxRank = 64;

/// The whole of the regular file `path`, at most `max_bytes` of it; FormatError naming the path
/// when it is missing, unreadable, not a regular file or larger.
std::string read_file_bounded(const std::string& path, size_t max_bytes);

/// Throws FormatError "<format> <file>: <what>".
template <class... Args>
[[noreturn]] void fail(const char* format, const std::string& file, const Args&... what) {
  throw FormatError(str(format, " ", file, ": ", what...));
}

/// a * b, or FormatError naming `file` and `what` on overflow.
size_t checked_mul(size_t a, size_t b, const char* format, const std::string& file,
                   const std::string& what);
size_t checked_add(size_t a, size_t b, const char* format, const std::string& file,
                   const std::string& what);

/// Elements of `dims`, FormatError on overflow.
size_t checked_elem_count(const std::vector<size_t>& dims, const char* format,
                          const std::string& file, const std::string& what);

/// Shape(dims), with a FormatError naming `file` and `what` (not a ShapeMismatch) for dims whose
/// strides would overflow.
Shape checked_shape(const std::vector<size_t>& dims, const char* format, const std::string& file,
                    const std::string& what);

/// A tensor of `dtype`/`shape` holding the row-major bytes at `src` (inside `bytes`). On the CPU
/// the tensor views the bytes when `src` is aligned to the element size; otherwise (or on CUDA)
/// the bytes are copied. Counts into format_load_stats().
Tensor tensor_from_bytes(const std::shared_ptr<const Bytes>& bytes, const uint8_t* src, DType dtype,
                         const Shape& shape, const Device& device);

/// The elements of `t` in row-major order, as bytes (`scratch` holds them when a copy is needed).
/// The returned pointer is valid while `t` and `scratch` live.
const uint8_t* row_major_bytes(const Tensor& t, std::vector<uint8_t>& scratch);

/// Writes a file atomically: open() creates a temporary file next to `path`, commit() flushes it
/// and renames it onto `path`; destroying an uncommitted writer removes the temporary file.
class AtomicWriter {
 public:
  AtomicWriter(std::string path, const char* format);
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  void write(const void* data, size_t bytes);
  /// Writes `count` zero bytes.
  void pad(size_t count);
  size_t written() const { return written_; }
  const std::string& temp_path() const { return temp_; }
  /// Closes the temporary file (for writers, like libzip, that write it themselves).
  void close_for_external();
  void commit();

 private:
  std::string path_, temp_;
  const char* format_;
  int fd_ = -1;
  size_t written_ = 0;
  bool committed_ = false;
};

/// Counters behind format_load_stats().
void count_viewed(size_t bytes);
void count_copied(size_t bytes);

}  // namespace wick::formats
