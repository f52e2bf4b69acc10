// Split-KV attention for every float dtype and d <= 256 (attn_split_kernel), the path for short
// queries that no tensor-core kernel takes: the warps of a block are the query heads that share
// one k/v head, so each k/v tile is read from memory once for all of them; the keys are split
// across blocks (a split of the keys from their count alone: batch-invariant) and the last block of
// a row merges the partial (max, sum, output) of the splits, in split order.

#include <algorithm>
#include <cmath>

#include "cuda/attention_kernels.h"
#include "cuda/attention_mma.cuh"
#include "cuda/attention_operands.h"
#include "cuda/kernel_utils.cuh"

namespace wick::cuda {
namespace {

using namespace attn;

constexpr int kSplitKeys = 32;      // keys per smem tile: one per lane
constexpr int kSplitMaxWarps = 8;   // query heads per block
constexpr int kMaxDimPerLane = 8;   // d <= 256
constexpr int kKeysPerSplit = 128;  // keys per split (4 tiles), up to kMaxSplits splits
constexpr int kMaxSplits = 256;

template <class T>
struct SplitArgs : Operands<T> {
  float* part_ml;  // (rows, splits, 2): max and sum per split, when splits > 1
  float* part_o;   // (rows, splits, d): unnormalised outputs
  int* counters;   // per (b, h_kv, row, head chunk): splits done; zero before the launch
  int d;
  int splits, keys_per_split, head_chunks;
  int row0;  // first query row of this launch (grid.y is limited to 65535)
  compute_t<T> scale;
};

/// Grid (splits, rows x head chunks, b x h_kv); the warps of a block are query heads sharing
/// one k/v head. K/V tiles of 32 keys are double-buffered in shared memory as T (cp.async
/// 16-byte copies when kVec, else element copies); lane j scores key j of the tile. With
/// splits > 1 each block leaves its (max, sum, output) and the last block of a row merges them.
template <class T, bool kVec>
__global__ void attn_split_kernel(SplitArgs<T> p) {
  using C = compute_t<T>;
  constexpr int N = 16 / sizeof(T);  // elements per 16 bytes; also the row padding
  const int d = p.d, ld = d + N;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* k_tiles = reinterpret_cast<T*>(smem_raw);                      // [2][32][ld]
  T* v_tiles = k_tiles + 2 * kSplitKeys * ld;                       // [2][32][ld]
  C* q_rows = reinterpret_cast<C*>(v_tiles + 2 * kSplitKeys * ld);  // [warps][d]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = blockIdx.x;
  const int row = p.row0 + static_cast<int>(blockIdx.y) / p.head_chunks;
  const int chunk = static_cast<int>(blockIdx.y) % p.head_chunks;
  const int bi = blockIdx.z / (p.h / p.group), hk = blockIdx.z % (p.h / p.group);
  const int head_in_group = chunk * kSplitMaxWarps + warp;
  const bool active = head_in_group < p.group;
  const int hi = hk * p.group + min(head_in_group, p.group - 1);

  // This warp's query, pre-scaled.
  const T* qr = p.q + bi * p.qs[0] + hi * p.qs[1] + row * p.qs[2];
  for (int t = lane; t < d; t += 32) q_rows[warp * d + t] = to_compute(qr[t]) * p.scale;

  const int shift = p.s_kv - p.s;
  const int key_lo = split * p.keys_per_split;
  int key_hi = min(p.s_kv, key_lo + p.keys_per_split);
  if (p.causal) key_hi = min(key_hi, max(0, row + shift + 1));
  const T* kb = p.k + bi * p.ks[0] + hk * p.ks[1];
  const T* vb = p.v + bi * p.vs[0] + hk * p.vs[1];

  auto load_tile = [&](int stage, int k0) {
    T* kt = k_tiles + stage * kSplitKeys * ld;
    T* vt = v_tiles + stage * kSplitKeys * ld;
    if constexpr (kVec) {
      const int per_row = d / N;
      for (int i = threadIdx.x; i < kSplitKeys * per_row; i += blockDim.x) {
        int r = i / per_row, c = (i % per_row) * N;
        bool valid = k0 + r < key_hi;
        int64_t key = valid ? k0 + r : key_lo;
        cp_async16(kt + r * ld + c, kb + key * p.ks[2] + c, valid);
        cp_async16(vt + r * ld + c, vb + key * p.vs[2] + c, valid);
      }
      cp_async_commit();
    } else {
      for (int i = threadIdx.x; i < kSplitKeys * d; i += blockDim.x) {
        int r = i / d, c = i % d;
        bool valid = k0 + r < key_hi;
        kt[r * ld + c] = valid ? kb[(k0 + r) * p.ks[2] + c] : convert<T>(0.0f);
        vt[r * ld + c] = valid ? vb[(k0 + r) * p.vs[2] + c] : convert<T>(0.0f);
      }
    }
  };

  C o[kMaxDimPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimPerLane; ++i) o[i] = 0;
  C m = lowest<C>(), l = 0;
  const int tiles = key_hi > key_lo ? (key_hi - key_lo + kSplitKeys - 1) / kSplitKeys : 0;
  if (tiles > 0) load_tile(0, key_lo);
  for (int it = 0; it < tiles; ++it) {
    const int k0 = key_lo + it * kSplitKeys, stage = it & 1;
    if (it + 1 < tiles) {
      load_tile(stage ^ 1, k0 + kSplitKeys);
      if constexpr (kVec) cp_async_wait<1>();
    } else {
      if constexpr (kVec) cp_async_wait<0>();
    }
    __syncthreads();  // the tile (and, the first time, q_rows) is visible
    const T* kt = k_tiles + stage * kSplitKeys * ld;
    const T* vt = v_tiles + stage * kSplitKeys * ld;
    // Lane j scores key k0 + j.
    const int key = k0 + lane;
    C sc = lowest<C>();
    if (key < key_hi) {
      C acc = 0;
      const T* kr = kt + lane * ld;
      const C* qw = q_rows + warp * d;
      if constexpr (kVec) {
        for (int c = 0; c < d; c += N) {
          Vec<T, N> kv = *reinterpret_cast<const Vec<T, N>*>(kr + c);
#pragma unroll
          for (int e = 0; e < N; ++e) acc += qw[c + e] * to_compute(kv.v[e]);
        }
      } else {
        for (int t = 0; t < d; ++t) acc += qw[t] * to_compute(kr[t]);
      }
      if (p.mask != nullptr) {
        acc += to_compute(p.mask[bi * p.ms[0] + hi * p.ms[1] + row * p.ms[2] + key * p.ms[3]]);
      }
      sc = acc;
    }
    C mx = sc;
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) mx = max(mx, shfl_xor(mx, w));
    C m_new = max(m, mx);
    if (m_new != lowest<C>()) {  // else nothing is visible yet (all -inf)
      C corr = m == lowest<C>() ? C(0) : exp_c(m - m_new);
      C pj = sc == lowest<C>() ? C(0) : exp_c(sc - m_new);
      C psum = pj;
#pragma unroll
      for (int w = 16; w > 0; w >>= 1) psum += shfl_xor(psum, w);
      l = l * corr + psum;
      m = m_new;
#pragma unroll
      for (int i = 0; i < kMaxDimPerLane; ++i) o[i] *= corr;
      const int nk = min(kSplitKeys, key_hi - k0);
      for (int j = 0; j < nk; ++j) {
        C pb = shfl_idx(pj, j);
        const T* vr = vt + j * ld;
#pragma unroll
        for (int i = 0; i < kMaxDimPerLane; ++i) {
          int t = lane + 32 * i;
          if (t < d) o[i] += pb * to_compute(vr[t]);
        }
      }
    }
    __syncthreads();  // this stage is reloaded two tiles on
  }

  const int64_t out_row = (static_cast<int64_t>(bi) * p.h + hi) * p.s + row;
  if (p.splits == 1) {
    if (!active) return;
    C inv = l > C(0) ? C(1) / l : C(0);
#pragma unroll
    for (int i = 0; i < kMaxDimPerLane; ++i) {
      int t = lane + 32 * i;
      if (t < d) p.out[out_row * d + t] = convert<T>(o[i] * inv);
    }
    return;
  }
  if (active) {
    int64_t part = out_row * p.splits + split;
    if (lane == 0) {
      p.part_ml[part * 2] = static_cast<float>(m);
      p.part_ml[part * 2 + 1] = static_cast<float>(l);
    }
#pragma unroll
    for (int i = 0; i < kMaxDimPerLane; ++i) {
      int t = lane + 32 * i;
      if (t < d) p.part_o[part * d + t] = static_cast<float>(o[i]);
    }
  }
  // The last block of this (b, h_kv, row, head chunk) to finish merges the splits.
  __threadfence();
  __syncthreads();
  __shared__ int is_last;
  if (threadIdx.x == 0) {
    int64_t id = static_cast<int64_t>(blockIdx.z) * p.s * p.head_chunks +
                 static_cast<int64_t>(row) * p.head_chunks + chunk;
    is_last = atomicAdd(&p.counters[id], 1) == p.splits - 1;
  }
  __syncthreads();
  if (!is_last || !active) return;
  __threadfence();
  const float* ml = p.part_ml + out_row * p.splits * 2;
  float mx = neg_inf();
  for (int i = 0; i < p.splits; ++i) mx = fmaxf(mx, __ldcg(ml + 2 * i));
  float sum = 0;
  for (int i = 0; i < p.splits; ++i) {
    float mi = __ldcg(ml + 2 * i);
    if (mi != neg_inf()) sum += __ldcg(ml + 2 * i + 1) * __expf(mi - mx);
  }
  float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int t = lane; t < d; t += 32) {
    float acc = 0;
    for (int i = 0; i < p.splits; ++i) {
      float mi = __ldcg(ml + 2 * i);
      if (mi != neg_inf())
        acc += __ldcg(p.part_o + (out_row * p.splits + i) * d + t) * __expf(mi - mx);
    }
    p.out[out_row * d + t] = convert<T>(acc * inv);
  }
}

template <class T>
bool split_vec_fits(const AttentionArgs& a) {
  constexpr int N = 16 / sizeof(T);
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (a.d % N != 0 || !al(a.k) || !al(a.v)) return false;
  for (int i = 0; i < 3; ++i) {
    if (a.k_strides[i] % N != 0 || a.v_strides[i] % N != 0) return false;
  }
  return true;
}

template <class T>
void run_split(const AttentionArgs& a, const TempAlloc& temp, cudaStream_t s) {
  using C = compute_t<T>;
  SplitArgs<T> p{};
  static_cast<Operands<T>&>(p) = operands<T>(a);
  p.d = a.d;
  p.scale = static_cast<C>(a.scale);
  int warps = std::min(p.group, kSplitMaxWarps);
  p.head_chunks = (p.group + kSplitMaxWarps - 1) / kSplitMaxWarps;
  // The split is a function of the key count alone (never of the batch or the GPU), so that a
  // row's result is the same bits whatever else is in its batch and on every GPU of one
  // architecture: splits of kKeysPerSplit keys, at most kMaxSplits of them (longer splits past
  // kMaxSplits * kKeysPerSplit keys), rounded up to whole tiles.
  int64_t base = static_cast<int64_t>(a.b) * a.h_kv * a.s * p.head_chunks;
  p.splits = static_cast<int>(
      std::clamp<int64_t>((a.s_kv + kKeysPerSplit - 1) / kKeysPerSplit, 1, kMaxSplits));
  p.keys_per_split = (a.s_kv + p.splits - 1) / p.splits;
  p.keys_per_split = (p.keys_per_split + kSplitKeys - 1) / kSplitKeys * kSplitKeys;
  p.splits = std::max(1, (a.s_kv + p.keys_per_split - 1) / p.keys_per_split);
  uint64_t rows = static_cast<uint64_t>(a.b) * a.h * a.s;
  if (p.splits > 1) {
    p.part_ml = static_cast<float*>(temp(rows * p.splits * 2 * sizeof(float)));
    p.part_o = static_cast<float*>(temp(rows * p.splits * a.d * sizeof(float)));
    size_t counters = static_cast<size_t>(base) * sizeof(int);
    p.counters = static_cast<int*>(temp(counters));
    WICK_CUDA_CHECK(cudaMemsetAsync(p.counters, 0, counters, s));
  }
  constexpr int N = 16 / sizeof(T);
  size_t smem = 2 * 2 * kSplitKeys * (a.d + N) * sizeof(T) + warps * a.d * sizeof(C);
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024) {
      WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
    }
    int rows_per_launch = 65535 / p.head_chunks;
    for (int row0 = 0; row0 < a.s; row0 += rows_per_launch) {
      p.row0 = row0;
      int n = std::min(rows_per_launch, a.s - row0);
      dim3 grid(p.splits, n * p.head_chunks, a.b * a.h_kv);
      kernel<<<grid, warps * 32, smem, s>>>(p);
      WICK_CUDA_CHECK_LAUNCH();
    }
  };
  if (split_vec_fits<T>(a)) {
    launch(attn_split_kernel<T, true>);
  } else {
    launch(attn_split_kernel<T, false>);
  }
}

}  // namespace

static_assert(32 * kMaxDimPerLane == kSplitMaxDim);

void launch_split_attention(DType dtype, const AttentionArgs& a, const TempAlloc& temp,
                            cudaStream_t s) {
  dispatch_float<DeviceTypes>(dtype, "scaled_dot_product_attention",
                              [&]<class T>() { run_split<T>(a, temp, s); });
}

}  // namespace wick::cuda
