#pragma once
// The GPU benchmarks' checks: a failed CUDA or cuBLAS call prints the call and its error, and the
// benchmark exits (a figure after a failure would mean nothing).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

inline void exit_if_failed(bool failed, const char* call, const char* error) {
  if (!failed) return;
  std::fprintf(stderr, "%s failed: %s\n", call, error);
  std::exit(1);
}

#define CHECK_CUDA(x)                                              \
  do {                                                             \
    cudaError_t e_ = (x);                                          \
    exit_if_failed(e_ != cudaSuccess, #x, cudaGetErrorString(e_)); \
  } while (0)
#define CHECK_CUBLAS(x)                                                         \
  do {                                                                          \
    cublasStatus_t s_ = (x);                                                    \
    exit_if_failed(s_ != CUBLAS_STATUS_SUCCESS, #x, cublasGetStatusString(s_)); \
  } while (0)
