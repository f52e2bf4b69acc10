#include "cuda/check.h"

#include <cstring>

#include "util.h"

namespace wick::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line) {
  const char* base = std::strrchr(file, '/');
  throw BackendError(str("CUDA error: ", call, " failed with ", cudaGetErrorName(status), " (",
                         cudaGetErrorString(status), ") at ", base ? base + 1 : file, ":", line));
}

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line) {
  const char* base = std::strrchr(file, '/');
  throw BackendError(str("cuBLAS error: ", call, " failed with ", cublasGetStatusName(status), " (",
                         cublasGetStatusString(status), ") at ", base ? base + 1 : file, ":",
                         line));
}

void make_current(int ordinal) {
  thread_local int current = -1;
  if (current != ordinal) {
    WICK_CUDA_CHECK(cudaSetDevice(ordinal));
    current = ordinal;
  }
}

namespace {
// The current GPU's attribute, or `fallback` (sm_90's) when the query fails.
size_t device_attribute(cudaDeviceAttr attr, size_t fallback) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess ||
      v <= 0) {
    (void)cudaGetLastError();
    return fallback;
  }
  return static_cast<size_t>(v);
}
}  // namespace

int sm_count() {
  static const int n = static_cast<int>(device_attribute(cudaDevAttrMultiProcessorCount, 132));
  return n;
}

size_t shared_per_block_optin() {
  static const size_t n = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 227 * 1024);
  return n;
}

size_t shared_per_multiprocessor() {
  static const size_t n = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, 228 * 1024);
  return n;
}

int compute_capability() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

}  // namespace wick::cuda
