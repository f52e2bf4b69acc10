#pragma once
// The GPU benchmarks' checks: a failed CUDA or cuBLAS call prints the call and its error, and the
// benchmark exits (a figure after a failure would mean nothing).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(x)                                                      \
  do {                                                                     \
    cudaError_t e_ = (x);                                                  \
    if (e_ != cudaSuccess) {                                               \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)
#define CHECK_CUBLAS(x)                                                       \
  do {                                                                        \
    cublasStatus_t s_ = (x);                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                        \
      std::fprintf(stderr, "%s failed: %s\n", #x, cublasGetStatusString(s_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)
