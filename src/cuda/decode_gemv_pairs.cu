// The decode projections over GGML rows with k a multiple of 2048 (gemv_pairs_kernel): a warp
// owns two rows at a time, copies them into its own shared memory and dots units of two GGML
// blocks with 32-bit loads whose lanes meet different banks; x is quantized into shared memory
// once a block (the one block barrier). Warps take pairs of rows grid-stride, one item in flight
// each, and the grid is one wave, so the kernel after it may start loading as this one streams.

#include "cuda/device_timeline.cuh"

WICK_TIMELINE_TU(gemv_pairs)

#include "cuda/decode_gemv_device.cuh"
#include "cuda/decode_gemv_launch.h"
#include "cuda/kernel_utils.cuh"
#include "cuda_config.h"
#include "ops/norm_math.h"

namespace wick::cuda {
namespace {

using namespace gemv;

// ---- GGML rows in warp-owned pairs (gemv_pairs_kernel), for k a multiple of 2048 ----
// A unit is two GGML blocks (64 values) of a row. Lane l of a warp dots units l, l + 32, ... of
// the warp's two rows from their shared-memory copy with 32-bit loads: units 9 (Q4_0), 10 (Q4_1)
// or 17 (Q8_0) words apart put the lanes' words in different banks (Q4_1: two lanes a bank),
// where the 16-bit loads of half blocks above meet three to five lanes a bank. Each warp copies
// its own rows into shared memory and needs no block barrier after x is quantized.

// A block's 16 nibble bytes (values 0-15 in the low nibbles, 16-31 in the high ones) as the
// integers of its two half blocks, four to a word.
struct Nibbles {
  uint32_t lo[4], hi[4];
  __device__ explicit Nibbles(const uint32_t* q) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = q[i] & 0x0f0f0f0fu;
      hi[i] = (q[i] >> 4) & 0x0f0f0f0fu;
    }
  }
};

// A unit's words (the two blocks' scales and integers) dotted with x's four half blocks.
struct Q4_0Unit {
  static constexpr int kWords = 9;  // f16 d, 16 nibble bytes; twice
  __device__ static float block(const uint32_t (&q)[4], float d, const QUnit& xa, const QUnit& xb) {
    const Nibbles n(q);
    return (dot_q(n.lo, xa, -8 * xa.s) + dot_q(n.hi, xb, -8 * xb.s)) * (d * xa.d);
  }
  __device__ static float dot(const uint32_t (&w)[kWords], const QUnit (&x)[4]) {
    // The first block's integers start 2 bytes into word 0; the second's are word-aligned.
    const uint32_t q0[4] = {__byte_perm(w[0], w[1], 0x5432), __byte_perm(w[1], w[2], 0x5432),
                            __byte_perm(w[2], w[3], 0x5432), __byte_perm(w[3], w[4], 0x5432)};
    const uint32_t q1[4] = {w[5], w[6], w[7], w[8]};
    return block(q0, f16_bits(static_cast<uint16_t>(w[0])), x[0], x[1]) +
           block(q1, f16_bits(static_cast<uint16_t>(w[4] >> 16)), x[2], x[3]);
  }
};

struct Q4_1Unit {
  static constexpr int kWords = 10;  // f16 d, f16 m, 16 nibble bytes; twice
  __device__ static float block(const uint32_t* w, const QUnit& xa, const QUnit& xb) {
    const Nibbles n(w + 1);
    const float v =
        (dot_q(n.lo, xa, 0) + dot_q(n.hi, xb, 0)) * (f16_bits(static_cast<uint16_t>(w[0])) * xa.d);
    return fmaf(f16_bits(static_cast<uint16_t>(w[0] >> 16)), xa.d * (xa.s + xb.s), v);
  }
  __device__ static float dot(const uint32_t (&w)[kWords], const QUnit (&x)[4]) {
    return block(w, x[0], x[1]) + block(w + 5, x[2], x[3]);
  }
};

struct Q8_0Unit {
  static constexpr int kWords = 17;  // f16 d, 32 int8; twice
  __device__ static float dot(const uint32_t (&w)[kWords], const QUnit (&x)[4]) {
    uint32_t q0[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q0[i] = __byte_perm(w[i], w[i + 1], 0x5432);
    const uint32_t a0[4] = {q0[0], q0[1], q0[2], q0[3]}, b0[4] = {q0[4], q0[5], q0[6], q0[7]};
    const uint32_t a1[4] = {w[9], w[10], w[11], w[12]}, b1[4] = {w[13], w[14], w[15], w[16]};
    return (dot_q(a0, x[0], 0) + dot_q(b0, x[1], 0)) *
               (f16_bits(static_cast<uint16_t>(w[0])) * x[0].d) +
           (dot_q(a1, x[2], 0) + dot_q(b1, x[3], 0)) *
               (f16_bits(static_cast<uint16_t>(w[8] >> 16)) * x[2].d);
  }
};

constexpr int kPairsWarps = kGemvThreads / 32;
// x quantized in shared memory, a unit's four half blocks (hi and lo words, 128 bytes, then
// their sums and scales) 176 bytes apart: the 16-byte loads of 8 consecutive units meet
// different banks.
constexpr int kXUnitBytes = 176;

__device__ __forceinline__ void store_x_half(uint8_t* xs, int64_t half, const QUnit& q) {
  uint8_t* u = xs + (half / 4) * kXUnitBytes;
  const int j = static_cast<int>(half % 4);
  *reinterpret_cast<uint4*>(u + 32 * j) = make_uint4(q.hi[0], q.hi[1], q.hi[2], q.hi[3]);
  *reinterpret_cast<uint4*>(u + 32 * j + 16) = make_uint4(q.lo[0], q.lo[1], q.lo[2], q.lo[3]);
  reinterpret_cast<float*>(u + 128)[j] = q.s;
  reinterpret_cast<float*>(u + 144)[j] = q.d;
}

__device__ __forceinline__ void load_x_unit(const uint8_t* xs, int64_t unit, QUnit (&x)[4]) {
  const uint8_t* u = xs + unit * kXUnitBytes;
  const float4 s = *reinterpret_cast<const float4*>(u + 128);
  const float4 d = *reinterpret_cast<const float4*>(u + 144);
  const float ss[4] = {s.x, s.y, s.z, s.w}, dd[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint4 hi = *reinterpret_cast<const uint4*>(u + 32 * j);
    const uint4 lo = *reinterpret_cast<const uint4*>(u + 32 * j + 16);
    x[j] = QUnit{{hi.x, hi.y, hi.z, hi.w}, {lo.x, lo.y, lo.z, lo.w}, ss[j], dd[j]};
  }
}

// x quantized into shared memory by the whole block (the one block barrier), as the CPU's
// qmatmul takes it, normalised first when the projection takes a norm. With k = 2048 each thread
// quantizes one half block: it keeps its 16 values from the sum of squares to the quantization
// (one read of x, not two) and loads its norm weights, as floats, before pdl_wait (they are
// weights).
template <class T, bool kOneUnit>
__device__ __forceinline__ void quantize_x_to_shared(const GemvArgs& a, uint8_t* xs) {
  const T* x = static_cast<const T*>(a.x);
  const T* nw = static_cast<const T*>(a.norm_weight);
  const int64_t halves = a.k / 16;  // a multiple of the block's threads
  if constexpr (kOneUnit) {
    float v[16], w[16];
    if (nw != nullptr) load_run<T, 16>(nw + 16 * threadIdx.x, w);
    pdl_wait();
    WICK_TL_WAITED();
    load_run<T, 16>(x + 16 * threadIdx.x, v);
    if (nw != nullptr) {
      float sq[1] = {0};
#pragma unroll
      for (int e = 0; e < 16; ++e) sq[0] += v[e] * v[e];
      block_totals<1>(sq);
      const float rstd = ops::norm_rstd(sq[0], static_cast<float>(a.k), static_cast<float>(a.eps));
#pragma unroll
      for (int e = 0; e < 16; ++e) v[e] = rms_normed<T>(v[e], w[e], rstd);
    }
    store_x_half(xs, threadIdx.x, quantize_unit(v));
  } else {
    // A thread's halves of x are loaded ROUNDS at a time before any is used: one round trip to
    // the L2 for them, not one a half (k = 8192, bf16: four halves a thread, one load round).
    constexpr int PIECES = 16 * sizeof(T) / 16;  // 16-byte loads a half
    constexpr int ROUNDS = 8 / PIECES;           // 8 loads in flight: 32 registers
    pdl_wait();
    WICK_TL_WAITED();
    Input<T> in{x, nw, nullptr};
    if (nw != nullptr) in.find_rstd(a.k, a.eps);
    // Every thread runs every round (halves is a multiple of the block's threads): the
    // quantization's shuffle needs the whole warp.
    for (int64_t h0 = threadIdx.x; h0 < halves; h0 += ROUNDS * kGemvThreads) {
      uint4 raw[ROUNDS][PIECES];
#pragma unroll
      for (int r = 0; r < ROUNDS; ++r) {
        const int64_t h = h0 + r * kGemvThreads;
#pragma unroll
        for (int i = 0; i < PIECES; ++i) {
          raw[r][i] = h < halves ? __ldg(reinterpret_cast<const uint4*>(x + 16 * h) + i)
                                 : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int r = 0; r < ROUNDS; ++r) {
        const int64_t h = h0 + r * kGemvThreads;
        if (h >= halves) break;  // the same for the whole block
        float v[16];
#pragma unroll
        for (int i = 0; i < PIECES; ++i) unpack16<T>(raw[r][i], v + i * 16 / PIECES);
        if (nw != nullptr) {
          float w[16];
          load_run<T, 16>(nw + 16 * h, w);
#pragma unroll
          for (int e = 0; e < 16; ++e) v[e] = rms_normed<T>(v[e], w[e], in.rstd);
        }
        store_x_half(xs, h, quantize_unit(v));
      }
    }
  }
  __syncthreads();
}

// Warp w of the grid takes pairs of rows w, w + warps, ... (an item each), copying the next
// item's rows as soon as it has read this one's: one item in flight a warp leaves room for more
// warps a multiprocessor than a deeper ring would. With k = 2048 a lane's one unit of x stays in
// registers.
template <class T, class F, bool kOneUnit>
__global__ void __launch_bounds__(kGemvThreads, 6)
    gemv_pairs_kernel(GemvArgs a, int64_t row_bytes, int64_t items) {
  extern __shared__ __align__(16) uint8_t gemv_rows[];
  WICK_TL_START();
  prefetch_cache_rows<T>(a);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  uint8_t* staged = gemv_rows + warp * 2 * row_bytes;
  uint8_t* xs = gemv_rows + kPairsWarps * 2 * row_bytes;
  const int64_t warps = int64_t{gridDim.x} * kPairsWarps;
  int64_t item = int64_t{blockIdx.x} * kPairsWarps + warp;
  auto stage = [&](int64_t it) {  // item it's two rows into the warp's shared memory
    if (it >= items) return;
    int64_t rows[2];
    const uint8_t* src[2];
    group_rows<2>(a, it, rows);
    row_starts<2>(a, row_bytes, rows, src);
    for (int64_t i = lane * 16; i < row_bytes; i += 32 * 16) {
      cp_async<16>(staged + i, src[0] + i);
      cp_async<16>(staged + row_bytes + i, src[1] + i);
    }
    cp_async_commit();
  };
  stage(item);
  // The grid is one wave: the kernel after it may take the multiprocessors' spare room now and
  // load its first weights while this one streams.
  pdl_launch_dependents();
  quantize_x_to_shared<T, kOneUnit>(a, xs);
  const int64_t units = a.k / 64;
  QUnit x_own[4];
  if constexpr (kOneUnit) load_x_unit(xs, lane, x_own);
  for (; item < items; item += warps) {
    cp_async_wait<0>();
    __syncwarp();  // every lane's copies have landed
    float acc[2] = {0, 0};
    for (int64_t u = lane; u < units; u += 32) {
      QUnit xu[4];
      if constexpr (kOneUnit) {
#pragma unroll
        for (int j = 0; j < 4; ++j) xu[j] = x_own[j];
      } else {
        load_x_unit(xs, u, xu);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t* src =
            reinterpret_cast<const uint32_t*>(staged + r * row_bytes) + u * F::kWords;
        uint32_t w[F::kWords];
#pragma unroll
        for (int i = 0; i < F::kWords; ++i) w[i] = src[i];
        acc[r] += F::dot(w, xu);
      }
    }
    __syncwarp();  // every lane is done with the rows before the next item's replace them
    stage(item + warps);
    acc[0] = warp_total(acc[0]);
    acc[1] = warp_total(acc[1]);
    if (lane == 0) {
      int64_t r0, r1;
      pair_rows(a, item, r0, r1);
      epilogue<T>(a, item, r0, r1, acc[0], acc[1]);
    }
  }
#ifdef WICK_DEVICE_TIMELINE
  __syncthreads();  // the block's end is its last warp's
#endif
  WICK_TL_END(6u << 28 | static_cast<uint32_t>(a.epilogue) << 24 | static_cast<uint32_t>(a.k));
}

// Whether gemv_pairs_kernel takes the projection: k a multiple of 2048 (every lane has whole
// units, x's halves a multiple of the block's threads), rows that cp.async copies 16 bytes at a
// time, and a block's shared memory within the opt-in limit, less room for its static shared
// memory (block_totals' sums; the timeline's records).
constexpr int64_t kPairsK = 2048;

size_t pairs_smem(int64_t row_bytes, int64_t k) {
  return static_cast<size_t>(kPairsWarps * 2 * row_bytes + k / 64 * kXUnitBytes);
}

size_t pairs_max_smem() {
  return shared_per_block_optin() - 1024;
}

bool pairs_fit(const GemvArgs& a, int64_t row_bytes) {
  return tuning().gemv_pairs && tuning().gemv_rows == 0 && a.k % kPairsK == 0 && aligned(a.w, 16) &&
         row_bytes % 16 == 0 && pairs_smem(row_bytes, a.k) <= pairs_max_smem();
}

// As many blocks as a multiprocessor holds with the shared memory.
template <class T, class F, bool kOneUnit>
void launch_pairs(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  auto kernel = gemv_pairs_kernel<T, F, kOneUnit>;
  static std::once_flag attribute;
  std::call_once(attribute, [&] {
    WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(pairs_max_smem())));
  });
  const size_t smem = pairs_smem(row_bytes, a.k);
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), smem);
  const int64_t items = a.n / 2;
  const int64_t blocks =
      std::min((items + kPairsWarps - 1) / kPairsWarps, int64_t{per_sm} * sm_count());
  launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), kGemvThreads, smem, s, a, row_bytes,
             items);
}

template <class T, class F>
void launch_pairs_units(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  if (a.k == kPairsK) return launch_pairs<T, F, true>(a, row_bytes, s);
  launch_pairs<T, F, false>(a, row_bytes, s);
}

}  // namespace

namespace gemv {

bool ggml_pairs_fit(const GemvArgs& a, int64_t row_bytes) {
  // Its units are two blocks of 32 (Q4_0, Q4_1, Q8_0); its norm reads weights of the dtype.
  const bool blocks_of_32 = a.weights == GemvWeights::Q4_0 || a.weights == GemvWeights::Q4_1 ||
                            a.weights == GemvWeights::Q8_0;
  return blocks_of_32 && !a.norm_f32 && pairs_fit(a, row_bytes);
}

void launch_ggml_pairs(DType dtype, const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  by_dtype(dtype, [&]<class T>() {
    switch (a.weights) {
      case GemvWeights::Q4_0:
        return launch_pairs_units<T, Q4_0Unit>(a, row_bytes, s);
      case GemvWeights::Q4_1:
        return launch_pairs_units<T, Q4_1Unit>(a, row_bytes, s);
      default:
        return launch_pairs_units<T, Q8_0Unit>(a, row_bytes, s);
    }
  });
}

}  // namespace gemv
}  // namespace wick::cuda
