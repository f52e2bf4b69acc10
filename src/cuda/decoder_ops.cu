// Fused decoder-block kernels: residual add + RMSNorm (a block per row), silu(gate) * up, and the
// decode step's rope of q and k with the KV-cache write (a thread per rotated pair).

#include "cuda/decoder_ops.h"
#include "cuda/device_timeline.cuh"
#include "cuda/kernel_utils.cuh"
#include "ops/norm_math.h"
#include "ops/rope_math.h"

WICK_TIMELINE_TU(decoder_ops)

namespace wick::cuda {
namespace {

template <class C>
__device__ __forceinline__ C block_sum_all(C x, C* scratch) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += shfl_xor(x, m);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  C r = 0;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) r += scratch[w];
  return r;
}

template <class C>
__device__ __forceinline__ C exp_of(C x) {
  if constexpr (std::is_same_v<C, float>)
    return expf(x);  // not __expf: silu's rounding to f16/bf16 should follow PyTorch's expf
  else
    return exp(x);
}

// x rounded to T and widened back: where transformers rounds an f16/bf16 intermediate (each
// op's result) in the model's dtype. Identity for f32 and f64.
template <class T>
__device__ __forceinline__ compute_t<T> round_as(compute_t<T> x) {
  return to_compute(convert<T>(x));
}

// One block per row; each thread re-reads only the sums it wrote itself.
template <class T>
__global__ void __launch_bounds__(1024)
    add_rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ delta,
                        const T* __restrict__ w, T* __restrict__ sum, T* __restrict__ normed,
                        int64_t cols, compute_t<T> eps) {
  using C = compute_t<T>;
  __shared__ C scratch[32];
  int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  C sq = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    T s = convert<T>(to_compute(x[base + c]) + to_compute(delta[base + c]));
    sum[base + c] = s;
    C v = to_compute(s);
    sq += v * v;
  }
  C rstd = ops::norm_rstd(block_sum_all(sq, scratch), C(cols), eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    // Rounded before the weight multiplies it, as transformers' RMSNorm.
    normed[base + c] = convert<T>(to_compute(w[c]) * round_as<T>(to_compute(sum[base + c]) * rstd));
  }
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    silu_mul_kernel(const T* __restrict__ gu, T* __restrict__ out, uint64_t rows, uint64_t n) {
  using C = compute_t<T>;
  for (uint64_t i = global_tid(); i < rows * n; i += grid_stride()) {
    uint64_t r = i / n, c = i % n;
    C g = to_compute(gu[r * 2 * n + c]);
    C u = to_compute(gu[r * 2 * n + n + c]);
    // silu rounded, then the product: transformers' act_fn(gate) * up in the dtype.
    out[i] = convert<T>(round_as<T>(g / (C(1) + exp_of(-g))) * u);
  }
}

// Thread per (batch, row, head of q|k|v, pair i < d/2): elements i and i + d/2 of the head.
template <class T>
__global__ void __launch_bounds__(kBlock) rope_write_kernel(RopeWriteArgs a) {
  using C = compute_t<T>;
  const int64_t half = a.d / 2, heads = a.h + 2 * a.h_kv;
  const int64_t count = a.b * a.s * heads * half;
  const int64_t start = static_cast<int64_t>(*a.position);
  const T* qkv = static_cast<const T*>(a.qkv);
  const T* bias = static_cast<const T*>(a.bias);
  for (int64_t t = static_cast<int64_t>(global_tid()); t < count;
       t += static_cast<int64_t>(grid_stride())) {
    int64_t i = t % half, rest = t / half;
    int64_t head = rest % heads;
    rest /= heads;
    int64_t si = rest % a.s, bi = rest / a.s;
    int64_t pos = start + si;
    if (pos >= a.max_len) continue;
    int64_t in = (bi * a.s + si) * heads * a.d + head * a.d;
    C x1 = to_compute(qkv[in + i]), x2 = to_compute(qkv[in + i + half]);
    if (bias != nullptr) {
      // Rounded as the separate bias add would leave it (Llama passes f16/bf16 biases already
      // added, rounded once with the product as nn.Linear does).
      x1 = round_as<T>(x1 + to_compute(bias[head * a.d + i]));
      x2 = round_as<T>(x2 + to_compute(bias[head * a.d + i + half]));
    }
    if (head < a.h + a.h_kv) {
      C c = to_compute(static_cast<const T*>(a.cos)[pos * half + i]);
      C s = to_compute(static_cast<const T*>(a.sin)[pos * half + i]);
      auto round = [](C v) { return round_as<T>(v); };
      C r1 = ops::rope_lo(x1, x2, c, s, round);
      C r2 = ops::rope_hi(x1, x2, c, s, round);
      x1 = r1;
      x2 = r2;
    }
    T* dst;
    if (head < a.h) {
      dst = static_cast<T*>(a.q) + ((bi * a.h + head) * a.s + si) * a.d;
    } else if (head < a.h + a.h_kv) {
      dst = static_cast<T*>(a.k_cache) + ((bi * a.h_kv + head - a.h) * a.max_len + pos) * a.d;
    } else {
      dst = static_cast<T*>(a.v_cache) +
            ((bi * a.h_kv + head - a.h - a.h_kv) * a.max_len + pos) * a.d;
    }
    dst[i] = convert<T>(x1);
    dst[i + half] = convert<T>(x2);
  }
}

// One thread: the greedy step's token becomes the next step's input, and is posted to the host.
__global__ void advance_decode_kernel(const uint32_t* next, uint32_t* input,
                                      unsigned long long* mailbox, int slots, bool launch_next) {
  WICK_TL_START();
  if (launch_next) pdl_launch_dependents();  // the next step's embedding waits for this kernel
  pdl_wait();
  WICK_TL_WAITED();
  const uint32_t token = *next, position = input[1] + 1;
  input[0] = token;
  input[1] = position;
  // One 8-byte store: the host never sees a position with another step's token.
  volatile unsigned long long* slot = mailbox + position % static_cast<uint32_t>(slots);
  *slot = static_cast<unsigned long long>(position) << 32 | token;
  __threadfence_system();
  WICK_TL_END(4u << 28);
}

}  // namespace

void launch_add_rms_norm(DType dtype, const void* x, const void* delta, const void* weight,
                         void* sum, void* normed, size_t rows, size_t cols, double eps,
                         cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  // About four elements per thread, whole warps, at most 1024.
  unsigned threads = static_cast<unsigned>(std::clamp<size_t>((cols / 4 + 31) / 32 * 32, 32, 1024));
  dispatch_float<DeviceTypes>(dtype, "add_rms_norm", [&]<class T>() {
    add_rms_norm_kernel<T><<<static_cast<unsigned>(rows), threads, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(delta), static_cast<const T*>(weight),
        static_cast<T*>(sum), static_cast<T*>(normed), static_cast<int64_t>(cols),
        static_cast<compute_t<T>>(eps));
    WICK_CUDA_CHECK_LAUNCH();
  });
}

void launch_silu_mul(DType dtype, const void* gate_up, void* out, size_t rows, size_t n,
                     cudaStream_t s) {
  if (rows * n == 0) return;
  dispatch_float<DeviceTypes>(dtype, "silu_mul", [&]<class T>() {
    silu_mul_kernel<T><<<grid_for(rows * n), kBlock, 0, s>>>(static_cast<const T*>(gate_up),
                                                             static_cast<T*>(out), rows, n);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

void launch_advance_decode(const uint32_t* next, uint32_t* input, uint64_t* mailbox, int slots,
                           cudaStream_t s) {
  launch_pdl(advance_decode_kernel, dim3(1), dim3(1), 0, s, next, input,
             reinterpret_cast<unsigned long long*>(mailbox), slots, tuning().pdl_step_ends);
}

void launch_rope_write(DType dtype, const RopeWriteArgs& a, cudaStream_t s) {
  uint64_t count = static_cast<uint64_t>(a.b * a.s * (a.h + 2 * a.h_kv) * (a.d / 2));
  if (count == 0) return;
  dispatch_float<DeviceTypes>(dtype, "rope_write", [&]<class T>() {
    rope_write_kernel<T><<<grid_for(count), kBlock, 0, s>>>(a);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace wick::cuda
