// wick's own GEMM: a register-tiled kernel (128x128 tiles of 8x8 per thread in fp32, 64x64 of
// 4x4 in fp64) reading any strides, with the next tile's global loads in flight while the current
// one is multiplied. Slower than cuBLAS's tensor-core kernels, but loaded in a millisecond.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/check.h"
#include "cuda/gemm.h"

namespace wick::cuda {

namespace {

template <class Acc>
struct Cfg;
template <>
struct Cfg<float> {
  static constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8;
  using Vec = float4;
};
template <>
struct Cfg<double> {
  static constexpr int BM = 64, BN = 64, BK = 8, TM = 4, TN = 4;
  using Vec = double2;
};
constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ float to_float(T x) {
  return static_cast<float>(x);
}
template <>
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <class T, class Acc>
__device__ __forceinline__ Acc load_acc(const T* p) {
  if constexpr (std::is_same_v<T, double>) {
    return *p;
  } else {
    return to_float(*p);
  }
}

template <class T, class Acc>
__device__ __forceinline__ T from_acc(Acc x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return static_cast<T>(x);
  }
}

struct KOperand {
  const void* ptr;
  int64_t rs, cs, bs;
};

template <class T, class Acc>
__global__ void __launch_bounds__(kThreads)
    gemm_kernel(int64_t batch, int64_t m, int64_t n, int64_t k, KOperand a, KOperand b, T* c) {
  using C = Cfg<Acc>;
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, TM = C::TM, TN = C::TN;
  constexpr int PAD = 16 / sizeof(Acc);  // keeps rows 16-byte aligned, shifts banks
  constexpr int A_LOADS = BM * BK / kThreads, B_LOADS = BK * BN / kThreads;
  constexpr int HM = TM / 2, HN = TN / 2;
  __shared__ __align__(16) Acc As[BK][BM + PAD];
  __shared__ __align__(16) Acc Bs[BK][BN + PAD];

  const T* A = static_cast<const T*>(a.ptr);
  const T* B = static_cast<const T*>(b.ptr);
  const int tid = threadIdx.x;
  const int tx = tid % (BN / TN), ty = tid / (BN / TN);
  const bool a_k_contig = a.cs == 1;  // walk k with consecutive threads when it is contiguous
  const bool b_n_contig = b.cs == 1 || b.rs != 1;
  const int64_t tiles_m = (m + BM - 1) / BM;

  for (int64_t bat = blockIdx.z; bat < batch; bat += gridDim.z) {
    for (int64_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y) {
      const int64_t m0 = tm * BM, n0 = static_cast<int64_t>(blockIdx.x) * BN;
      const T* Ab = A + bat * a.bs;
      const T* Bb = B + bat * b.bs;
      Acc ra[A_LOADS], rb[B_LOADS];
      auto load = [&](int64_t k0) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
          int e = tid + i * kThreads;
          int r = a_k_contig ? e / BK : e % BM;
          int cc = a_k_contig ? e % BK : e / BM;
          int64_t gr = m0 + r, gk = k0 + cc;
          ra[i] = (gr < m && gk < k) ? load_acc<T, Acc>(Ab + gr * a.rs + gk * a.cs) : Acc(0);
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
          int e = tid + i * kThreads;
          int kk = b_n_contig ? e / BN : e % BK;
          int col = b_n_contig ? e % BN : e / BK;
          int64_t gk = k0 + kk, gc = n0 + col;
          rb[i] = (gk < k && gc < n) ? load_acc<T, Acc>(Bb + gk * b.rs + gc * b.cs) : Acc(0);
        }
      };
      auto store = [&]() {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
          int e = tid + i * kThreads;
          int r = a_k_contig ? e / BK : e % BM;
          int cc = a_k_contig ? e % BK : e / BM;
          As[cc][r] = ra[i];
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
          int e = tid + i * kThreads;
          int kk = b_n_contig ? e / BN : e % BK;
          int col = b_n_contig ? e % BN : e / BK;
          Bs[kk][col] = rb[i];
        }
      };

      Acc acc[TM][TN];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = Acc(0);

      load(0);
      for (int64_t k0 = 0; k0 < k; k0 += BK) {
        store();
        __syncthreads();
        if (k0 + BK < k) load(k0 + BK);
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
          Acc av[TM], bv[TN];
          // Two 16-byte vectors per operand: rows ty*HM.. and BM/2 + ty*HM.. (conflict-free).
          auto a0 = *reinterpret_cast<const typename C::Vec*>(&As[kk][ty * HM]);
          auto a1 = *reinterpret_cast<const typename C::Vec*>(&As[kk][BM / 2 + ty * HM]);
          auto b0 = *reinterpret_cast<const typename C::Vec*>(&Bs[kk][tx * HN]);
          auto b1 = *reinterpret_cast<const typename C::Vec*>(&Bs[kk][BN / 2 + tx * HN]);
          const Acc* pa0 = reinterpret_cast<const Acc*>(&a0);
          const Acc* pa1 = reinterpret_cast<const Acc*>(&a1);
          const Acc* pb0 = reinterpret_cast<const Acc*>(&b0);
          const Acc* pb1 = reinterpret_cast<const Acc*>(&b1);
#pragma unroll
          for (int i = 0; i < HM; ++i) {
            av[i] = pa0[i];
            av[HM + i] = pa1[i];
          }
#pragma unroll
          for (int j = 0; j < HN; ++j) {
            bv[j] = pb0[j];
            bv[HN + j] = pb1[j];
          }
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
      }

      T* Cb = c + bat * m * n;
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        int64_t row = m0 + (i < HM ? ty * HM + i : BM / 2 + ty * HM + (i - HM));
        if (row >= m) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          int64_t col = n0 + (j < HN ? tx * HN + j : BN / 2 + tx * HN + (j - HN));
          if (col < n) Cb[row * n + col] = from_acc<T, Acc>(acc[i][j]);
        }
      }
    }
  }
}

template <class T, class Acc>
void launch(size_t batch, size_t m, size_t n, size_t k, const GemmOperand& a, const GemmOperand& b,
            void* c, cudaStream_t s) {
  using C = Cfg<Acc>;
  int64_t tiles_n = (static_cast<int64_t>(n) + C::BN - 1) / C::BN;
  int64_t tiles_m = (static_cast<int64_t>(m) + C::BM - 1) / C::BM;
  // Grid x covers n in one go (2^31 tiles); y and z loop inside the kernel past their limits.
  dim3 grid(static_cast<unsigned>(tiles_n),
            static_cast<unsigned>(std::min<int64_t>(tiles_m, 65535)),
            static_cast<unsigned>(std::min<size_t>(batch, 65535)));
  gemm_kernel<T, Acc><<<grid, kThreads, 0, s>>>(
      static_cast<int64_t>(batch), static_cast<int64_t>(m), static_cast<int64_t>(n),
      static_cast<int64_t>(k), KOperand{a.ptr, a.rs, a.cs, a.bs}, KOperand{b.ptr, b.rs, b.cs, b.bs},
      static_cast<T*>(c));
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_gemm(DType dtype, size_t batch, size_t m, size_t n, size_t k, const GemmOperand& a,
                 const GemmOperand& b, void* c, cudaStream_t s) {
  if (batch == 0 || m == 0 || n == 0) return;
  switch (dtype) {
    case DType::F32:
      return launch<float, float>(batch, m, n, k, a, b, c, s);
    case DType::F64:
      return launch<double, double>(batch, m, n, k, a, b, c, s);
    case DType::F16:
      return launch<__half, float>(batch, m, n, k, a, b, c, s);
    case DType::BF16:
      return launch<__nv_bfloat16, float>(batch, m, n, k, a, b, c, s);
    default:
      throw UnsupportedDType("matmul: wick GEMM supports float dtypes only");
  }
}

void preload_gemm_kernels() {
  cudaFuncAttributes attr;
  WICK_CUDA_CHECK(cudaFuncGetAttributes(&attr, gemm_kernel<float, float>));
  WICK_CUDA_CHECK(cudaFuncGetAttributes(&attr, gemm_kernel<double, double>));
  WICK_CUDA_CHECK(cudaFuncGetAttributes(&attr, gemm_kernel<__half, float>));
  WICK_CUDA_CHECK(cudaFuncGetAttributes(&attr, gemm_kernel<__nv_bfloat16, float>));
}

}  // namespace wick::cuda
