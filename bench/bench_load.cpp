// Loading a 1 GB f32 safetensors file to the CPU: wick's File::open + get (a view of the file
// mapping) beside its peer, a bare open + mmap of the same file, in the same run. Prints the bytes
// the load copied (0 when it only viewed the mapping) and "RESULT key value" lines.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "load_file.h"
#include "wick/formats.h"
#include "wick/wick.h"

using namespace wick;

int main() {
  size_t bytes = bench::load_bench_bytes();
  std::printf("== safetensors load to the CPU: %zu MB f32\n", bytes >> 20);
  std::string path = bench::write_load_bench_file(bytes);
  constexpr int kReps = 21;
  double peer = bench::median_seconds(kReps, [&] {
    int fd = ::open(path.c_str(), O_RDONLY);
    struct stat st {};
    ::fstat(fd, &st);
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) std::abort();
    ::munmap(p, static_cast<size_t>(st.st_size));
  });
  reset_format_load_stats();
  size_t elems = 0;
  double ours = bench::median_seconds(kReps, [&] {
    Tensor w = safetensors::File::open(path).get("w");
    elems = w.elem_count();
  });
  FormatLoadStats stats = format_load_stats();
  // The data is there: one value read through the tensor (4 bytes read back).
  Tensor w = safetensors::File::open(path).get("w");
  float probe = w.narrow(0, 12345, 1).to_vec1<float>()[0];
  std::printf("%-34s %10.1f us\n", "peer: open + mmap + munmap", peer * 1e6);
  std::printf("%-34s %10.1f us  (%zu elements, value[12345] = %g)\n",
              "wick: File::open + get(\"w\")", ours * 1e6, elems, probe);
  std::printf("bytes viewed %llu, bytes copied %llu over %d loads\n",
              static_cast<unsigned long long>(stats.bytes_viewed),
              static_cast<unsigned long long>(stats.bytes_copied), kReps);
  std::printf(
      "RESULT load_cpu_us %.6g\nRESULT load_cpu_mmap_us %.6g\nRESULT load_cpu_bytes_copied %llu\n",
      ours * 1e6, peer * 1e6, static_cast<unsigned long long>(stats.bytes_copied));
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  return stats.bytes_copied == 0 ? 0 : 1;
}
