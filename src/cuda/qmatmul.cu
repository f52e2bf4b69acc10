// qmatmul on CUDA for a few activation rows (decode, m <= 8): one warp per output row; each lane
// dequantises 32 weights at a time in registers (the GGML blocks as stored, read 2 bytes at a
// time since blocks are only 2-byte aligned; the types added later byte by byte, through
// ops/ggml_blocks.h) and multiplies them with every activation row, in
// f32; the warp then sums its lanes. Larger m is dequantise-then-matmul (src/qmatmul.cpp), except
// under batch invariance, where this kernel takes every m in launches of 8 rows (fused_ops.cpp).

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_storage.h"
#include "cuda/kernel_utils.cuh"
#include "cuda/quantized.h"
#include "ops/ggml_blocks.h"
#include "util.h"

namespace wick::cuda {

namespace {

constexpr int kMaxRows = 8;        // activation rows per launch
constexpr int kWarpsPerBlock = 4;  // output rows per thread block

__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}

// 16 bytes from a 2-byte aligned address.
__device__ __forceinline__ void load16(const uint8_t* p, uint8_t (&b)[16]) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint16_t v = h[i];
    b[2 * i] = static_cast<uint8_t>(v);
    b[2 * i + 1] = static_cast<uint8_t>(v >> 8);
  }
}

// The 32 values of chunk c (values 32c .. 32c + 31) of a row of GGML blocks.
template <GgmlType T>
__device__ __forceinline__ void chunk_values(const uint8_t* row, int c, float (&v)[32]) {
  if constexpr (T == GgmlType::Q4_0 || T == GgmlType::Q4_1) {
    const uint8_t* b = row + c * (T == GgmlType::Q4_0 ? 18 : 20);
    float d = f16_at(b), m = T == GgmlType::Q4_1 ? f16_at(b + 2) : -8.0f * d;
    uint8_t q[16];
    load16(b + (T == GgmlType::Q4_0 ? 2 : 4), q);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = d * static_cast<float>(q[j] & 0x0f) + m;
      v[j + 16] = d * static_cast<float>(q[j] >> 4) + m;
    }
  } else if constexpr (T == GgmlType::Q5_0) {
    const uint8_t* b = row + c * 22;
    float d = f16_at(b);
    uint32_t qh = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(b + 2)) |
                  (static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(b + 4)) << 16);
    uint8_t q[16];
    load16(b + 6, q);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      int x0 = static_cast<int>((q[j] & 0x0f) | (((qh >> j) & 1u) << 4)) - 16;
      int x1 = static_cast<int>((q[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
      v[j] = d * static_cast<float>(x0);
      v[j + 16] = d * static_cast<float>(x1);
    }
  } else if constexpr (T == GgmlType::Q8_0) {
    const uint8_t* b = row + c * 34;
    float d = f16_at(b);
    uint8_t q[16];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      load16(b + 2 + 16 * h, q);
#pragma unroll
      for (int j = 0; j < 16; ++j)
        v[16 * h + j] = d * static_cast<float>(static_cast<int8_t>(q[j]));
    }
  } else if constexpr (T == GgmlType::Q4_K) {
    const uint8_t* b = row + (c / 8) * 144;
    int j = c % 8;
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t* s = b + 4;
    int sc, mn;
    if (j < 4) {
      sc = s[j] & 63;
      mn = s[j + 4] & 63;
    } else {
      sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
      mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    uint8_t q[16];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      load16(b + 16 + 32 * (j / 2) + 16 * h, q);
#pragma unroll
      for (int l = 0; l < 16; ++l) {
        int nib = (j % 2 == 0) ? (q[l] & 0x0f) : (q[l] >> 4);
        v[16 * h + l] = d1 * static_cast<float>(nib) - m1;
      }
    }
  } else if constexpr (T == GgmlType::Q5_1) {
    const uint8_t* b = row + c * 24;
    float d = f16_at(b), m = f16_at(b + 2);
    const uint32_t qh = ops::q5_1_high_bits(b);
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = d * static_cast<float>(ops::q5_1_int(b, qh, j)) + m;
  } else if constexpr (T == GgmlType::IQ4_NL) {
    const uint8_t* b = row + c * 18;
    float d = f16_at(b);
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = d * static_cast<float>(ops::iq4_nl_int(b, j));
  } else if constexpr (T == GgmlType::Q2_K) {
    const uint8_t* b = row + (c / 8) * 84;
    const unsigned j0 = 32 * (c % 8);
    float d = f16_at(b + 80), dmin = f16_at(b + 82);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t sc = b[(j0 + 16 * h) / 16];
      float dl = d * static_cast<float>(sc & 0x0f), ml = dmin * static_cast<float>(sc >> 4);
#pragma unroll
      for (int l = 0; l < 16; ++l) {
        v[16 * h + l] = dl * static_cast<float>(ops::q2_k_int(b, j0 + 16 * h + l)) - ml;
      }
    }
  } else if constexpr (T == GgmlType::Q3_K) {
    const uint8_t* b = row + (c / 8) * 110;
    const unsigned j0 = 32 * (c % 8);
    float d = f16_at(b + 108);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float dl = d * static_cast<float>(ops::q3_k_scale(b, (j0 + 16 * h) / 16));
#pragma unroll
      for (int l = 0; l < 16; ++l) {
        v[16 * h + l] = dl * static_cast<float>(ops::q3_k_int(b, j0 + 16 * h + l));
      }
    }
  } else if constexpr (T == GgmlType::Q5_K) {
    const uint8_t* b = row + (c / 8) * 176;
    const unsigned j0 = 32 * (c % 8);
    unsigned sc, mn;
    ops::q4_k_scale_min(c % 8, b + 4, sc, mn);
    float d1 = f16_at(b) * static_cast<float>(sc), m1 = f16_at(b + 2) * static_cast<float>(mn);
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = d1 * static_cast<float>(ops::q5_k_int(b, j0 + l)) - m1;
  } else if constexpr (T == GgmlType::IQ4_XS) {
    const uint8_t* b = row + (c / 8) * 136;
    const unsigned j0 = 32 * (c % 8);
    float dl = f16_at(b) * static_cast<float>(ops::iq4_xs_scale(b, c % 8));
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = dl * static_cast<float>(ops::iq4_xs_int(b, j0 + l));
  } else {  // Q6_K
    const uint8_t* b = row + (c / 8) * 210;
    int j = c % 8, half = j / 4, g = j % 4;
    const uint8_t* ql = b + 64 * half + (g % 2 == 1 ? 32 : 0);
    const uint8_t* qh = b + 128 + 32 * half;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * half);
    float d = f16_at(b + 208);
    uint8_t lq[16], hq[16];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      load16(ql + 16 * h, lq);
      load16(qh + 16 * h, hq);
      float ds = d * static_cast<float>(sc[h + 2 * g]);
#pragma unroll
      for (int l = 0; l < 16; ++l) {
        int lo = g < 2 ? (lq[l] & 0x0f) : (lq[l] >> 4);
        int q = (lo | (((hq[l] >> (2 * g)) & 3) << 4)) - 32;
        v[16 * h + l] = ds * static_cast<float>(q);
      }
    }
  }
}

template <GgmlType T>
__host__ __device__ constexpr size_t row_bytes(size_t k) {
  if constexpr (T == GgmlType::Q4_0) return k / 32 * 18;
  if constexpr (T == GgmlType::Q4_1) return k / 32 * 20;
  if constexpr (T == GgmlType::Q5_0) return k / 32 * 22;
  if constexpr (T == GgmlType::Q8_0) return k / 32 * 34;
  if constexpr (T == GgmlType::Q4_K) return k / 256 * 144;
  if constexpr (T == GgmlType::Q5_1) return k / 32 * 24;
  if constexpr (T == GgmlType::IQ4_NL) return k / 32 * 18;
  if constexpr (T == GgmlType::Q2_K) return k / 256 * 84;
  if constexpr (T == GgmlType::Q3_K) return k / 256 * 110;
  if constexpr (T == GgmlType::Q5_K) return k / 256 * 176;
  if constexpr (T == GgmlType::IQ4_XS) return k / 256 * 136;
  return k / 256 * 210;
}

template <GgmlType T, class X>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    qmatvec_kernel(const uint8_t* w, const X* x, X* y, int n, int k, int m) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;
  const uint8_t* wrow = w + static_cast<size_t>(row) * row_bytes<T>(k);
  float acc[kMaxRows];
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) acc[i] = 0.0f;
  const int chunks = k / 32;
  for (int c = lane; c < chunks; c += 32) {
    float v[32];
    chunk_values<T>(wrow, c, v);
#pragma unroll
    for (int i = 0; i < kMaxRows; ++i) {
      if (i < m) {
        const X* xr = x + static_cast<size_t>(i) * k + 32 * c;
        float s = 0.0f;
        if constexpr (std::is_same_v<X, float>) {
          const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            float4 t = x4[j];
            s += v[4 * j] * t.x + v[4 * j + 1] * t.y + v[4 * j + 2] * t.z + v[4 * j + 3] * t.w;
          }
        } else {
#pragma unroll
          for (int j = 0; j < 32; ++j) s += v[j] * convert<float>(xr[j]);
        }
        acc[i] += s;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    if (i < m) {
      float s = acc[i];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) y[static_cast<size_t>(i) * n + row] = convert<X>(s);
    }
  }
}

template <class X>
void launch_typed(GgmlType type, const uint8_t* w, const X* x, X* y, int n, int k, int m,
                  cudaStream_t s) {
  dim3 grid((n + kWarpsPerBlock - 1) / kWarpsPerBlock), block(32 * kWarpsPerBlock);
  switch (type) {
    case GgmlType::Q4_0:
      qmatvec_kernel<GgmlType::Q4_0, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::Q4_1:
      qmatvec_kernel<GgmlType::Q4_1, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::Q5_0:
      qmatvec_kernel<GgmlType::Q5_0, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::Q8_0:
      qmatvec_kernel<GgmlType::Q8_0, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::Q4_K:
      qmatvec_kernel<GgmlType::Q4_K, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::Q6_K:
      qmatvec_kernel<GgmlType::Q6_K, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::Q5_1:
      qmatvec_kernel<GgmlType::Q5_1, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::Q2_K:
      qmatvec_kernel<GgmlType::Q2_K, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::Q3_K:
      qmatvec_kernel<GgmlType::Q3_K, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::Q5_K:
      qmatvec_kernel<GgmlType::Q5_K, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::IQ4_NL:
      qmatvec_kernel<GgmlType::IQ4_NL, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    case GgmlType::IQ4_XS:
      qmatvec_kernel<GgmlType::IQ4_XS, X><<<grid, block, 0, s>>>(w, x, y, n, k, m);
      break;
    default:
      throw UnsupportedDType(
          str("qmatmul: ggml type ", ggml_type_name(type), " is not supported on cuda"));
  }
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace

StoragePtr qmatmul(GgmlType type, const BackendStorage& w_storage, size_t w_offset, size_t n,
                   size_t k, const BackendStorage& x_storage, size_t x_offset, size_t m,
                   DType dtype) {
  const CudaStorage& w = as_cuda(w_storage);
  const CudaStorage& x = as_cuda(x_storage);
  CudaDevice& dev = w.cuda_device();
  if (w_offset % 2 != 0 || n > INT32_MAX || k > INT32_MAX) {
    throw Error(
        str("qmatmul: weights at odd byte offset ", w_offset, " or too large (", n, ", ", k, ")"));
  }
  auto out = std::make_unique<CudaStorage>(dev, m * n, dtype);
  if (m * n == 0) return out;
  const uint8_t* wp = static_cast<const uint8_t*>(w.data()) + w_offset;
  void* yp = out->data();
  const void* xp = static_cast<const char*>(x.data()) + x_offset * size_in_bytes(dtype);
  // float4 loads of x need 16-byte alignment: k % 32 == 0 keeps each row's start aligned.
  if (dtype == DType::F32 && reinterpret_cast<uintptr_t>(xp) % 16 != 0) {
    throw Error("qmatmul: f32 activations must be 16-byte aligned on cuda");
  }
  // More than kMaxRows rows (batch invariance, fused_ops.cpp): launches of kMaxRows rows each,
  // every row computed as it is in a launch of its own.
  const size_t es = size_in_bytes(dtype);
  for (size_t r0 = 0; r0 < m; r0 += kMaxRows) {
    const int rows = static_cast<int>(std::min<size_t>(kMaxRows, m - r0));
    const void* xr = static_cast<const char*>(xp) + r0 * k * es;
    void* yr = static_cast<char*>(yp) + r0 * n * es;
    dev.queue().enqueue(
        "qmatmul", dtype,
        [&](cudaStream_t s) {
          switch (dtype) {
            case DType::F32:
              launch_typed(type, wp, static_cast<const float*>(xr), static_cast<float*>(yr),
                           static_cast<int>(n), static_cast<int>(k), rows, s);
              break;
            case DType::F16:
              launch_typed(type, wp, static_cast<const __half*>(xr), static_cast<__half*>(yr),
                           static_cast<int>(n), static_cast<int>(k), rows, s);
              break;
            case DType::BF16:
              launch_typed(type, wp, static_cast<const __nv_bfloat16*>(xr),
                           static_cast<__nv_bfloat16*>(yr), static_cast<int>(n),
                           static_cast<int>(k), rows, s);
              break;
            default:
              throw UnsupportedDType(str("qmatmul: x must be f32, f16 or bf16, got ", dtype));
          }
        },
        2.0 * static_cast<double>(rows) * static_cast<double>(n * k));
  }
  dev.queue().retain(w.buffer());
  dev.queue().retain(x.buffer());
  return out;
}

}  // namespace wick::cuda
