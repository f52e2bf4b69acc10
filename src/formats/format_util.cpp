#include "formats/format_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "cpu/cpu_storage.h"
#include "tensor_internal.h"
#include "wick/formats.h"

namespace wick {

namespace {
std::atomic<uint64_t> g_viewed{0};
std::atomic<uint64_t> g_copied{0};
}  // namespace

FormatLoadStats format_load_stats() {
  return {g_viewed.load(), g_copied.load()};
}

void reset_format_load_stats() {
  g_viewed = 0;
  g_copied = 0;
}

namespace formats {

void count_viewed(size_t bytes) {
  g_viewed += bytes;
}
void count_copied(size_t bytes) {
  g_copied += bytes;
}

namespace {

// Opens `path` for reading once stat says it is a regular file. O_NONBLOCK keeps a file swapped
// for a named pipe between the two calls from blocking the open; fstat then checks again.
int open_regular(const std::string& path, struct stat& st) {
  if (::stat(path.c_str(), &st) != 0) {
    throw FormatError(str("open ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw FormatError(str("open ", path, ": not a regular file"));
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw FormatError(str("open ", path, ": ", std::strerror(errno)));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FormatError(str("open ", path, ": not a regular file"));
  }
  return fd;
}

}  // namespace

std::string read_file_bounded(const std::string& path, size_t max_bytes) {
  struct stat st {};
  int fd = open_regular(path, st);
  size_t size = static_cast<size_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    throw FormatError(
        str(path, ": file of ", size, " bytes is over the limit of ", max_bytes, " bytes"));
  }
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::read(fd, out.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw FormatError(str("read ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

std::shared_ptr<const Bytes> Bytes::map_file(const std::string& path) {
  struct stat st {};
  int fd = open_regular(path, st);
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return std::make_shared<const Bytes>(nullptr, 0, path, nullptr);
  }
  // Private and writable: pages are shared with the page cache until a tensor writes to them.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw FormatError(str("mmap ", path, ": ", std::strerror(err)));
  std::shared_ptr<void> owner(p, [size](void* q) { ::munmap(q, size); });
  return std::make_shared<const Bytes>(static_cast<const uint8_t*>(p), size, path,
                                       std::move(owner));
}

std::shared_ptr<const Bytes> Bytes::from_vector(std::vector<uint8_t> data, std::string name) {
  auto holder = std::make_shared<std::vector<uint8_t>>(std::move(data));
  const uint8_t* p = holder->data();
  size_t n = holder->size();
  return std::make_shared<const Bytes>(p, n, std::move(name), std::move(holder));
}

size_t checked_mul(size_t a, size_t b, const char* format, const std::string& file,
                   const std::string& what) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r))
    fail(format, file, what, ": size overflows (", a, " * ", b, ")");
  return r;
}

size_t checked_add(size_t a, size_t b, const char* format, const std::string& file,
                   const std::string& what) {
  size_t r;
  if (__builtin_add_overflow(a, b, &r))
    fail(format, file, what, ": size overflows (", a, " + ", b, ")");
  return r;
}

size_t checked_elem_count(const std::vector<size_t>& dims, const char* format,
                          const std::string& file, const std::string& what) {
  size_t n = 1;
  for (size_t d : dims) n = checked_mul(n, d, format, file, what);
  return n;
}

Shape checked_shape(const std::vector<size_t>& dims, const char* format, const std::string& file,
                    const std::string& what) {
  try {
    return Shape(dims);
  } catch (const ShapeMismatch& e) {
    fail(format, file, what, ": ", e.what());
  }
}

Tensor tensor_from_bytes(const std::shared_ptr<const Bytes>& bytes, const uint8_t* src, DType dtype,
                         const Shape& shape, const Device& device) {
  size_t count = shape.elem_count();
  size_t nbytes = count * size_in_bytes(dtype);
  if (device.is_cpu()) {
    bool aligned = reinterpret_cast<uintptr_t>(src) % size_in_bytes(dtype) == 0;
    if (aligned && count > 0) {
      count_viewed(nbytes);
      std::shared_ptr<const void> keep = bytes;
      auto storage = std::make_unique<cpu::CpuStorage>(const_cast<uint8_t*>(src), count, dtype,
                                                       std::move(keep));
      return detail::from_storage(std::move(storage), shape);
    }
    count_copied(nbytes);
    return detail::from_storage(cpu::device().from_host(src, count, dtype), shape);
  }
  count_copied(nbytes);
  return detail::from_storage(backend_device(device).upload(src, count, dtype), shape);
}

const uint8_t* row_major_bytes(const Tensor& t, std::vector<uint8_t>& scratch) {
  size_t nbytes = t.elem_count() * size_in_bytes(t.dtype());
  if (t.device().is_cpu() && t.is_contiguous()) {
    const auto& s = cpu::as_cpu(detail::backend_of(t));
    return static_cast<const uint8_t*>(s.data()) +
           t.layout().start_offset() * size_in_bytes(t.dtype());
  }
  scratch.resize(nbytes);
  if (nbytes == 0) return scratch.data();
  auto locks = detail::read_locks({&t});
  detail::backend_of(t).copy_to_host(t.layout(), scratch.data());
  return scratch.data();
}

AtomicWriter::AtomicWriter(std::string path, const char* format)
    : path_(std::move(path)), format_(format) {
  temp_ = path_ + ".tmp.XXXXXX";
  std::vector<char> name(temp_.begin(), temp_.end());
  name.push_back('\0');
  fd_ = ::mkstemp(name.data());
  if (fd_ < 0) {
    throw Error(
        str(format_, " save ", path_, ": cannot create a temporary file: ", std::strerror(errno)));
  }
  temp_ = name.data();
  ::fchmod(fd_, 0644);
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicWriter::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw Error(str(format_, " save ", path_, ": write failed after ", written_,
                      " bytes: ", std::strerror(errno)));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
}

void AtomicWriter::pad(size_t count) {
  static const char zeros[64] = {};
  while (count > 0) {
    size_t n = count < sizeof(zeros) ? count : sizeof(zeros);
    write(zeros, n);
    count -= n;
  }
}

void AtomicWriter::close_for_external() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void AtomicWriter::commit() {
  if (fd_ >= 0) {
    if (::fsync(fd_) != 0 || ::close(fd_) != 0) {
      fd_ = -1;
      throw Error(str(format_, " save ", path_, ": flush failed: ", std::strerror(errno)));
    }
    fd_ = -1;
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    throw Error(str(format_, " save ", path_, ": rename failed: ", std::strerror(errno)));
  }
  committed_ = true;
}

}  // namespace formats
}  // namespace wick
