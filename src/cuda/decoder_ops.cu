// Fused decoder-block kernels: residual add + RMSNorm (a block per row), silu(gate) * up, and the
// decode step's rope of q and k (after their per-head norms) with the KV-cache write or the paged
// cache write (a warp per head).

#include "cuda/decoder_ops.h"
#include "cuda/device_timeline.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/row_math.cuh"
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
  // Launched programmatically: the next kernel loads its weights meanwhile.
  pdl_wait();
  pdl_launch_dependents();
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

// Pairs (i, i + d/2) of a head one lane holds: heads up to 256 wide.
constexpr int kRopePairsPerLane = 4;

// A warp per (token, head of q|k|v): lane j holds the pairs i = j, j + 32, ... < d/2 of the head
// (elements i and i + d/2; with partial rotary ops::rope_pair's), normalised over the head where a
// norm weight is given, then rotated. What does not come from the kernel before -- the position,
// its rows of cos and sin, the norm weights -- is loaded before pdl_wait, so that the kernel waits
// on one round trip (qkv's) after it.
template <class T>
__global__ void __launch_bounds__(kBlock) rope_write_kernel(RopeWriteArgs a) {
  using C = compute_t<T>;
  const int64_t half = a.d / 2, heads = a.h + 2 * a.h_kv;
  const int64_t warps = a.b * a.s * heads;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const T* qkv = static_cast<const T*>(a.qkv);
  const T* bias = static_cast<const T*>(a.bias);
  for (int64_t w = static_cast<int64_t>(global_tid() / 32); w < warps;
       w += static_cast<int64_t>(grid_stride() / 32)) {
    const int64_t head = w % heads, token = w / heads;
    int64_t pos, page, row;  // the rope's row and the cache's (page, row) of the token
    T* q_row;
    if (a.slots == nullptr) {
      const int64_t si = token % a.s, bi = token / a.s;
      pos = static_cast<int64_t>(*a.position) + si;
      page = bi;
      row = pos;
      q_row = static_cast<T*>(a.q) + ((bi * a.h + head) * a.s + si) * a.d;
    } else {
      pos = static_cast<int64_t>(a.position[token]);
      page = static_cast<int64_t>(a.slots[token]) / a.max_len;
      row = static_cast<int64_t>(a.slots[token]) % a.max_len;
      q_row = static_cast<T*>(a.q) + (token * a.h + head) * a.d;
    }
    const bool skip = a.slots == nullptr && pos >= a.max_len;  // the same for the whole warp
    const void* norm = head < a.h ? a.q_norm : head < a.h + a.h_kv ? a.k_norm : nullptr;
    const bool rotates = head < a.h + a.h_kv;
    // Norm weights (lo, hi) and cos, sin of this lane's pairs.
    C nw[kRopePairsPerLane][2], cs[kRopePairsPerLane][2];
#pragma unroll
    for (int j = 0; j < kRopePairsPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      nw[j][0] = nw[j][1] = cs[j][0] = cs[j][1] = 0;
      if (i >= half || skip) continue;
      const ops::RopePair e = ops::rope_pair(i, half, a.rot_half);
      if (norm != nullptr) {
        if (a.norms_f32) {
          nw[j][0] = static_cast<const float*>(norm)[e.lo];
          nw[j][1] = static_cast<const float*>(norm)[e.hi];
        } else {
          nw[j][0] = to_compute(static_cast<const T*>(norm)[e.lo]);
          nw[j][1] = to_compute(static_cast<const T*>(norm)[e.hi]);
        }
      }
      if (rotates && e.rotates) {
        cs[j][0] = to_compute(static_cast<const T*>(a.cos)[pos * a.rot_half + i]);
        cs[j][1] = to_compute(static_cast<const T*>(a.sin)[pos * a.rot_half + i]);
      }
    }
    // Launched programmatically: the attention after it starts loading the cache's earlier rows.
    pdl_wait();
    pdl_launch_dependents();
    if (skip) continue;
    const int64_t in = token * heads * a.d + head * a.d;
    C x1[kRopePairsPerLane], x2[kRopePairsPerLane];
    C sq = 0;
#pragma unroll
    for (int j = 0; j < kRopePairsPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      x1[j] = x2[j] = 0;
      if (i >= half) continue;
      const ops::RopePair e = ops::rope_pair(i, half, a.rot_half);
      x1[j] = to_compute(qkv[in + e.lo]);
      x2[j] = to_compute(qkv[in + e.hi]);
      if (bias != nullptr) {
        // Rounded as the separate bias add would leave it (Llama passes f16/bf16 biases already
        // added, rounded once with the product as nn.Linear does).
        x1[j] = round_as<T>(x1[j] + to_compute(bias[head * a.d + e.lo]));
        x2[j] = round_as<T>(x2[j] + to_compute(bias[head * a.d + e.hi]));
      }
      sq += x1[j] * x1[j] + x2[j] * x2[j];
    }
    if (norm != nullptr) {
      const C rstd = ops::norm_rstd(row_math::warp_sum(sq), C(a.d), C(a.eps));
      // Weights of the dtype: rms_norm in it (x * rstd rounded first, as LlamaRMSNorm). f32
      // weights (Gemma's 1 + w): the norm in f32, rounded to the dtype once.
      auto normed = [&](C x, C w) -> C {
        if (a.norms_f32) {
          return round_as<T>(row_math::norm_value<float, true>(
              static_cast<float>(x), 0.0f, static_cast<float>(rstd), static_cast<float>(w)));
        }
        return round_as<T>(row_math::norm_value<T, true>(x, C(0), rstd, w));
      };
#pragma unroll
      for (int j = 0; j < kRopePairsPerLane; ++j) {
        if (lane + 32 * j >= half) continue;
        x1[j] = normed(x1[j], nw[j][0]);
        x2[j] = normed(x2[j], nw[j][1]);
      }
    }
    T* dst;
    if (head < a.h) {
      dst = q_row;
    } else if (head < a.h + a.h_kv) {
      dst = static_cast<T*>(a.k_cache) + ((page * a.h_kv + head - a.h) * a.max_len + row) * a.d;
    } else {
      dst = static_cast<T*>(a.v_cache) +
            ((page * a.h_kv + head - a.h - a.h_kv) * a.max_len + row) * a.d;
    }
#pragma unroll
    for (int j = 0; j < kRopePairsPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      if (i >= half) continue;
      const ops::RopePair e = ops::rope_pair(i, half, a.rot_half);
      C y1 = x1[j], y2 = x2[j];
      if (rotates && e.rotates) {
        auto round = [](C v) { return round_as<T>(v); };
        y1 = ops::rope_lo(x1[j], x2[j], cs[j][0], cs[j][1], round);
        y2 = ops::rope_hi(x1[j], x2[j], cs[j][0], cs[j][1], round);
      }
      dst[e.lo] = convert<T>(y1);
      dst[e.hi] = convert<T>(y2);
    }
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
    launch_pdl(add_rms_norm_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, s,
               static_cast<const T*>(x), static_cast<const T*>(delta),
               static_cast<const T*>(weight), static_cast<T*>(sum), static_cast<T*>(normed),
               static_cast<int64_t>(cols), static_cast<compute_t<T>>(eps));
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

bool rope_write_fits(const RopeWriteArgs& a) {
  return a.d % 2 == 0 && a.d / 2 <= 32 * kRopePairsPerLane && a.rot_half > 0 &&
         2 * a.rot_half <= a.d;
}

void launch_rope_write(DType dtype, const RopeWriteArgs& a, cudaStream_t s) {
  uint64_t count = static_cast<uint64_t>(a.b * a.s * (a.h + 2 * a.h_kv)) * 32;
  if (count == 0) return;
  dispatch_float<DeviceTypes>(dtype, "rope_write", [&]<class T>() {
    launch_pdl(rope_write_kernel<T>, dim3(grid_for(count)), dim3(kBlock), 0, s, a);
  });
}

}  // namespace wick::cuda
