#pragma once
// Every CUDA, cuBLAS and cuBLASLt call goes through these: a failure throws BackendError with
// the call's text and status. Also the helpers every part of a device uses: make_current and
// sm_count.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "wick/error.h"

namespace wick::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);

/// Makes GPU `ordinal` current on this thread (cheap when it already is).
void make_current(int ordinal);

/// Multiprocessors of the current GPU, asked once (132 when the query fails).
int sm_count();

/// Shared memory of the current GPU, asked once (sm_90's when the query fails): the most a block
/// may ask for (above 48 KB by opting in), and a multiprocessor's whole.
size_t shared_per_block_optin();
size_t shared_per_multiprocessor();

/// Compute capability of the current GPU as major * 10 + minor (90 for sm_90), asked at every
/// call: it decides which machine code may run. 0 when the query fails.
int compute_capability();

}  // namespace wick::cuda

#define WICK_CUDA_CHECK(call)                                                  \
  do {                                                                         \
    cudaError_t wick_status_ = (call);                                         \
    if (wick_status_ != cudaSuccess)                                           \
      ::wick::cuda::throw_cuda_error(wick_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define WICK_CUBLAS_CHECK(call)                                                  \
  do {                                                                           \
    cublasStatus_t wick_status_ = (call);                                        \
    if (wick_status_ != CUBLAS_STATUS_SUCCESS)                                   \
      ::wick::cuda::throw_cublas_error(wick_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// After a kernel launch: a bad launch configuration shows up here, at once.
#define WICK_CUDA_CHECK_LAUNCH() WICK_CUDA_CHECK(cudaGetLastError())
