// Reductions (sum, max, min, argmax, argmin over any dims of a strided layout) and the last-dim
// softmax, with the CPU backend's semantics: float sums accumulate in float (double for f64) with
// compensation, integer sums wrap; max/min propagate NaN; arg* take the first index on ties and the
// first NaN. A reduction is planned on the host: the kept dims (output order) and the reduced dims
// are each collapsed into a StridedView (the reduced dims of order-free ops sorted so the innermost
// walks memory in order). Then either a group (a warp, or a block for long runs) reduces each
// output's run, or a thread per output walks it when neighbouring outputs are neighbours in memory
// (column sums). Long runs split into chunks of a fixed length: a first pass writes partial
// accumulators to a temporary, a second pass folds them in chunk order.

#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda/fused_kernels.h"
#include "cuda/kernel_utils.cuh"
#include "util.h"

namespace wick::cuda {

namespace {

// ---- accumulators ----
// Each policy has: Acc, Out, identity(), take(acc, x, index), merge(acc, other), shfl(acc, mask),
// result(acc). Max/min share a policy with a runtime flag to halve the instantiations.

template <class T>
struct SumOp {
  using A = std::conditional_t<std::is_integral_v<T>, unsigned long long, compute_t<T>>;
  struct Acc {
    A sum, comp;
  };
  using Out = T;

  __device__ __forceinline__ Acc identity() const { return {A(0), A(0)}; }
  __device__ __forceinline__ static void add(Acc& a, A v) {
    if constexpr (std::is_floating_point_v<A>) {  // Neumaier compensation
      A t = a.sum + v;
      if (fabs(a.sum) >= fabs(v))
        a.comp += (a.sum - t) + v;
      else
        a.comp += (v - t) + a.sum;
      a.sum = t;
    } else {
      a.sum += v;
    }
  }
  __device__ __forceinline__ void take(Acc& a, T x, uint64_t) const {
    if constexpr (std::is_integral_v<T>)
      add(a, static_cast<A>(x));
    else
      add(a, to_compute(x));
  }
  __device__ __forceinline__ void merge(Acc& a, const Acc& b) const {
    add(a, b.sum);
    a.comp += b.comp;
  }
  __device__ __forceinline__ Acc shfl(const Acc& a, int mask) const {
    return {shfl_xor(a.sum, mask), shfl_xor(a.comp, mask)};
  }
  __device__ __forceinline__ Out result(const Acc& a) const {
    if constexpr (std::is_floating_point_v<A>) {
      // Once the sum is inf or nan the compensation means nothing (inf - inf).
      return convert<T>(isfinite(a.sum) ? a.sum + a.comp : a.sum);
    } else {
      return static_cast<T>(a.sum);  // wraps in the element's dtype
    }
  }
};

template <class T>
struct ExtremumOp {
  using C = compute_t<T>;
  using Acc = C;
  using Out = T;
  bool is_max;

  __device__ __forceinline__ bool takes(C x, C best) const {
    bool b = is_max ? x > best : x < best;
    if constexpr (std::is_floating_point_v<C>) b = b || x != x;  // NaN propagates
    return b;
  }
  __device__ __forceinline__ Acc identity() const { return is_max ? lowest<C>() : highest<C>(); }
  __device__ __forceinline__ void take(Acc& a, T x, uint64_t) const {
    C v = to_compute(x);
    if (takes(v, a)) a = v;
  }
  __device__ __forceinline__ void merge(Acc& a, const Acc& b) const {
    if (takes(b, a)) a = b;
  }
  __device__ __forceinline__ Acc shfl(const Acc& a, int mask) const { return shfl_xor(a, mask); }
  __device__ __forceinline__ Out result(const Acc& a) const { return convert<T>(a); }
};

template <class T>
struct ArgOp {
  using C = compute_t<T>;
  static constexpr unsigned long long kNone = ~0ull;
  struct Acc {
    C best;
    unsigned long long idx;
  };
  using Out = uint32_t;
  bool is_max;

  // Strictly better wins (the first index on ties); the first NaN wins over numbers.
  __device__ __forceinline__ bool better(C x, C best) const {
    bool b = is_max ? x > best : x < best;
    if constexpr (std::is_floating_point_v<C>) b = b || (x != x && best == best);
    return b;
  }
  __device__ __forceinline__ Acc identity() const { return {C(0), kNone}; }
  __device__ __forceinline__ void take(Acc& a, T x, uint64_t r) const {
    C v = to_compute(x);
    if (a.idx == kNone || better(v, a.best)) a = {v, r};
  }
  __device__ __forceinline__ void merge(Acc& a, const Acc& b) const {
    if (b.idx == kNone) return;
    if (a.idx == kNone || better(b.best, a.best) || (!better(a.best, b.best) && b.idx < a.idx)) {
      a = b;
    }
  }
  __device__ __forceinline__ Acc shfl(const Acc& a, int mask) const {
    return {shfl_xor(a.best, mask), shfl_xor(a.idx, mask)};
  }
  __device__ __forceinline__ Out result(const Acc& a) const {
    return static_cast<Out>(a.idx == kNone ? 0 : a.idx);
  }
};

template <class Op>
__device__ __forceinline__ typename Op::Acc warp_reduce(const Op& op, typename Op::Acc a) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) op.merge(a, op.shfl(a, m));
  return a;
}

// ---- kernels ----

/// The run [r0, r1) of one output, through a view of the reduced dims (offset 0) from `base`.
template <class T, class Op>
__device__ __forceinline__ void take_run(const Op& op, typename Op::Acc& acc, const T* src,
                                         int64_t base, const StridedView& red, uint64_t r0,
                                         uint64_t r1, unsigned lane, unsigned group) {
  if (red.contiguous) {
    const T* p = src + base + r0;
    uint64_t n = r1 - r0;
    constexpr int N = 16 / sizeof(T);
    auto addr = reinterpret_cast<uintptr_t>(p);
    uint64_t head = ((16 - addr % 16) % 16) / sizeof(T);
    if (head > n || addr % sizeof(T) != 0) head = n;
    for (uint64_t i = lane; i < head; i += group) op.take(acc, p[i], r0 + i);
    uint64_t nv = (n - head) / N;
    const auto* vp = reinterpret_cast<const Vec<T, N>*>(p + head);
#pragma unroll 4
    for (uint64_t v = lane; v < nv; v += group) {
      Vec<T, N> x = vp[v];
#pragma unroll
      for (int j = 0; j < N; ++j) op.take(acc, x.v[j], r0 + head + v * N + j);
    }
    for (uint64_t i = head + nv * N + lane; i < n; i += group) op.take(acc, p[i], r0 + i);
  } else {
#pragma unroll 4
    for (uint64_t r = r0 + lane; r < r1; r += group) {
      op.take(acc, src[base + view_offset(red, r)], r);
    }
  }
}

/// One group (a warp, or the whole block when group == blockDim.x) per (output k, chunk p),
/// g = k * chunks + p. With one chunk the result goes to dst, otherwise the accumulator to
/// partial[g].
template <class T, class Op>
__global__ void __launch_bounds__(kBlock)
    reduce_group_kernel(const T* __restrict__ src, StridedView kept, StridedView red,
                        uint64_t outputs, uint64_t len, uint64_t chunks, uint64_t chunk,
                        unsigned group, typename Op::Out* __restrict__ dst,
                        typename Op::Acc* __restrict__ partial, Op op) {
  using Acc = typename Op::Acc;
  __shared__ Acc warp_acc[kBlock / 32];
  unsigned groups_per_block = blockDim.x / group;
  unsigned lane = threadIdx.x % group;
  uint64_t total = outputs * chunks;
  uint64_t g0 = static_cast<uint64_t>(blockIdx.x) * groups_per_block + threadIdx.x / group;
  for (uint64_t g = g0; g < total; g += static_cast<uint64_t>(gridDim.x) * groups_per_block) {
    uint64_t k = g / chunks, p = g % chunks;
    uint64_t r0 = p * chunk, r1 = min(len, r0 + chunk);
    Acc acc = op.identity();
    if (r0 < r1) take_run(op, acc, src, view_offset(kept, k), red, r0, r1, lane, group);
    acc = warp_reduce(op, acc);
    if (group > 32) {  // the block is one group: fold the warps
      unsigned warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
      if (threadIdx.x % 32 == 0) warp_acc[warp] = acc;
      __syncthreads();
      if (warp == 0) {
        acc = threadIdx.x < nwarps ? warp_acc[threadIdx.x] : op.identity();
        acc = warp_reduce(op, acc);
      }
      __syncthreads();  // warp_acc is reused by the next group
    }
    if (lane == 0) {
      if (chunks == 1)
        dst[k] = op.result(acc);
      else
        partial[g] = acc;
    }
  }
}

/// One thread per (output k, chunk p), g = p * outputs + k: neighbouring threads read
/// neighbouring outputs' elements, which is coalesced when the kept dims are the inner ones.
template <class T, class Op>
__global__ void __launch_bounds__(kBlock)
    reduce_thread_kernel(const T* __restrict__ src, StridedView kept, StridedView red,
                         uint64_t outputs, uint64_t len, uint64_t chunks, uint64_t chunk,
                         typename Op::Out* __restrict__ dst, typename Op::Acc* __restrict__ partial,
                         Op op) {
  uint64_t total = outputs * chunks;
  for (uint64_t g = global_tid(); g < total; g += grid_stride()) {
    uint64_t k = g % outputs, p = g / outputs;
    uint64_t r0 = p * chunk, r1 = min(len, r0 + chunk);
    int64_t base = view_offset(kept, k);
    auto acc = op.identity();
    if (red.rank <= 1) {
      int64_t step = red.rank == 1 ? red.strides[0] : 0;
#pragma unroll 4
      for (uint64_t r = r0; r < r1; ++r) {
        op.take(acc, src[base + static_cast<int64_t>(r) * step], r);
      }
    } else {
      for (uint64_t r = r0; r < r1; ++r) op.take(acc, src[base + view_offset(red, r)], r);
    }
    if (chunks == 1)
      dst[k] = op.result(acc);
    else
      partial[g] = acc;
  }
}

/// Second pass: a warp per output folds its `chunks` partials (at k * k_stride + p * p_stride).
template <class Op>
__global__ void __launch_bounds__(kBlock)
    reduce_final_kernel(const typename Op::Acc* __restrict__ partial, uint64_t outputs,
                        uint64_t chunks, uint64_t k_stride, uint64_t p_stride,
                        typename Op::Out* __restrict__ dst, Op op) {
  unsigned lane = threadIdx.x % 32;
  uint64_t w0 = global_tid() / 32, nw = grid_stride() / 32;
  for (uint64_t k = w0; k < outputs; k += nw) {
    auto acc = op.identity();
    for (uint64_t p = lane; p < chunks; p += 32)
      op.merge(acc, partial[k * k_stride + p * p_stride]);
    acc = warp_reduce(op, acc);
    if (lane == 0) dst[k] = op.result(acc);
  }
}

// ---- planning ----

// The plan of a reduction is a function of the run length (and, for the thread-per-output path,
// of the layout and output count) only, never of the GPU's SM count: an output's bits are the
// same on every GPU of one architecture, and a row's are the same alone or inside any batch of
// rows (the chunks of a run, and so the order of its sums, follow its length alone).
constexpr uint64_t kThreadChunk = 256;  // elements a thread takes of a long run (thread path)
constexpr uint64_t kBlockChunk = 4096;  // elements a block takes of a long run (16 a thread)
constexpr uint64_t kMaxChunks = 1024;   // chunks of a run at most (longer chunks past that)

/// The chunk length of a run of `len`: `base`, or longer for runs of more than kMaxChunks chunks
/// (rounded up to 16 elements: chunk starts keep the run's vector alignment).
uint64_t chunk_for(uint64_t len, uint64_t base) {
  uint64_t c = std::max(base, (len + kMaxChunks - 1) / kMaxChunks);
  return (c + 15) / 16 * 16;
}

template <class T, class Op>
void run_reduce(const Op& op, const T* src, const StridedView& kept, const StridedView& red,
                uint64_t outputs, uint64_t len, void* dst, const TempAlloc& temp, cudaStream_t s) {
  using Acc = typename Op::Acc;
  auto* out = static_cast<typename Op::Out*>(dst);
  int64_t kept_inner = kept.rank > 0 ? kept.strides[kept.rank - 1] : 0;
  int64_t red_inner = red.rank > 0 ? red.strides[red.rank - 1] : 1;
  // A thread per output for tiny runs, and for column reductions (neighbouring outputs closer in
  // memory than neighbouring elements of a run) with plentiful outputs.
  bool per_thread =
      len > 0 &&
      (len <= 16 || (outputs >= 1024 && red_inner != 1 && kept.rank > 0 && kept_inner < red_inner));
  uint64_t chunks = 1, chunk = len;
  if (per_thread) {
    if (len >= 2 * kThreadChunk) {
      chunk = chunk_for(len, kThreadChunk);
      chunks = (len + chunk - 1) / chunk;
    }
  } else {
    // A warp per output for short runs, a whole block for long ones, in chunks of kBlockChunk
    // from 4 chunks on.
    uint64_t group = len >= 4096 ? kBlock : 32;
    uint64_t groups_per_block = kBlock / group;
    if (len >= 4 * kBlockChunk) {
      chunk = chunk_for(len, kBlockChunk);
      chunks = (len + chunk - 1) / chunk;
    }
    Acc* partial = chunks > 1 ? static_cast<Acc*>(temp(outputs * chunks * sizeof(Acc))) : nullptr;
    reduce_group_kernel<T, Op><<<grid_for(outputs * chunks, groups_per_block), kBlock, 0, s>>>(
        src, kept, red, outputs, len, chunks, chunk, static_cast<unsigned>(group), out, partial,
        op);
    WICK_CUDA_CHECK_LAUNCH();
    if (chunks > 1) {
      reduce_final_kernel<Op><<<grid_for(outputs, kBlock / 32), kBlock, 0, s>>>(
          partial, outputs, chunks, chunks, 1, out, op);
      WICK_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  Acc* partial = chunks > 1 ? static_cast<Acc*>(temp(outputs * chunks * sizeof(Acc))) : nullptr;
  reduce_thread_kernel<T, Op><<<grid_for(outputs * chunks), kBlock, 0, s>>>(
      src, kept, red, outputs, len, chunks, chunk, out, partial, op);
  WICK_CUDA_CHECK_LAUNCH();
  if (chunks > 1) {
    reduce_final_kernel<Op><<<grid_for(outputs, kBlock / 32), kBlock, 0, s>>>(
        partial, outputs, chunks, 1, outputs, out, op);
    WICK_CUDA_CHECK_LAUNCH();
  }
}

// ---- softmax ----

template <class C>
__device__ __forceinline__ C s_exp(C x) {
  if constexpr (std::is_same_v<C, float>)
    return expf(x);
  else
    return exp(x);
}

constexpr int kSoftmaxPerLane = 32;  // a warp keeps rows up to 1024 in registers

/// A warp per row, the row held in registers: one read and one write of each element.
template <class T>
__global__ void __launch_bounds__(kBlock)
    softmax_warp_kernel(const T* __restrict__ src, T* __restrict__ dst, uint64_t rows,
                        unsigned cols) {
  using C = compute_t<T>;
  unsigned lane = threadIdx.x % 32;
  uint64_t w0 = global_tid() / 32, nw = grid_stride() / 32;
  for (uint64_t row = w0; row < rows; row += nw) {
    const T* x = src + row * cols;
    C v[kSoftmaxPerLane];
    C mx = lowest<C>();
#pragma unroll
    for (int j = 0; j < kSoftmaxPerLane; ++j) {
      unsigned c = lane + 32 * j;
      v[j] = c < cols ? to_compute(x[c]) : lowest<C>();
      mx = (v[j] > mx || v[j] != v[j]) ? v[j] : mx;
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
      C o = shfl_xor(mx, m);
      mx = (o > mx || o != o) ? o : mx;
    }
    C sum = 0;
#pragma unroll
    for (int j = 0; j < kSoftmaxPerLane; ++j) {
      if (lane + 32 * j < cols) {
        v[j] = s_exp(v[j] - mx);
        sum += v[j];
      }
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) sum += shfl_xor(sum, m);
    C inv = C(1) / sum;
    T* y = dst + row * cols;
#pragma unroll
    for (int j = 0; j < kSoftmaxPerLane; ++j) {
      unsigned c = lane + 32 * j;
      if (c < cols) y[c] = convert<T>(v[j] * inv);
    }
  }
}

template <class C>
__device__ __forceinline__ C max_nan(C a, C b) {
  return (b > a || b != b) ? b : a;
}

/// Every thread of the block gets x reduced with f (scratch: one C per warp).
template <class C, class F>
__device__ __forceinline__ C block_reduce(C x, F f, C* scratch) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x = f(x, shfl_xor(x, m));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  C r = scratch[0];
  for (unsigned w = 1; w < blockDim.x / 32; ++w) r = f(r, scratch[w]);
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

constexpr int kSoftmaxPerThread = 32;  // a block keeps rows up to 8192 in registers

template <class C>
struct MaxNan {
  __device__ C operator()(C a, C b) const { return max_nan(a, b); }
};
template <class C>
struct Plus {
  __device__ C operator()(C a, C b) const { return a + b; }
};

/// A block per row of up to 8192 elements, held in registers: every load is issued at once
/// (16-byte vectors when rows are aligned), each element is read once and written once.
template <class T>
__global__ void __launch_bounds__(kBlock)
    softmax_block_reg_kernel(const T* __restrict__ src, T* __restrict__ dst, uint64_t rows,
                             unsigned cols, bool vec) {
  using C = compute_t<T>;
  constexpr int N = 16 / sizeof(T);
  constexpr int V = kSoftmaxPerThread / N;
  __shared__ C scratch[kBlock / 32];
  for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = src + row * cols;
    C v[V][N];
    C mx = lowest<C>();
#pragma unroll
    for (int j = 0; j < V; ++j) {
      unsigned c0 = (j * kBlock + threadIdx.x) * N;
      if (vec && c0 < cols) {
        Vec<T, N> t = *reinterpret_cast<const Vec<T, N>*>(x + c0);
#pragma unroll
        for (int e = 0; e < N; ++e) v[j][e] = to_compute(t.v[e]);
      } else {
#pragma unroll
        for (int e = 0; e < N; ++e) v[j][e] = c0 + e < cols ? to_compute(x[c0 + e]) : lowest<C>();
      }
#pragma unroll
      for (int e = 0; e < N; ++e) mx = max_nan(mx, v[j][e]);
    }
    mx = block_reduce(mx, MaxNan<C>{}, scratch);
    C sum = 0;
#pragma unroll
    for (int j = 0; j < V; ++j) {
#pragma unroll
      for (int e = 0; e < N; ++e) {
        if ((j * kBlock + threadIdx.x) * N + e < cols) {
          v[j][e] = s_exp(v[j][e] - mx);
          sum += v[j][e];
        }
      }
    }
    sum = block_reduce(sum, Plus<C>{}, scratch);
    C inv = C(1) / sum;
    T* y = dst + row * cols;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      unsigned c0 = (j * kBlock + threadIdx.x) * N;
      if (vec && c0 < cols) {
        Vec<T, N> t;
#pragma unroll
        for (int e = 0; e < N; ++e) t.v[e] = convert<T>(v[j][e] * inv);
        *reinterpret_cast<Vec<T, N>*>(y + c0) = t;
      } else {
#pragma unroll
        for (int e = 0; e < N; ++e) {
          if (c0 + e < cols) y[c0 + e] = convert<T>(v[j][e] * inv);
        }
      }
    }
  }
}

// Online (max, sum of exp(x - max)) pairs; equal maxima add without exp(-inf - -inf).
template <class C>
__device__ __forceinline__ void online_merge(C& m, C& s, C m2, C s2) {
  if (m2 > m || m2 != m2) {
    s = (m == m2 ? s : s * s_exp(m - m2)) + s2;
    m = m2;
  } else {
    s += m2 == m ? s2 : s2 * s_exp(m2 - m);
  }
}

/// A block per row longer than 8192: one pass for (max, sum) online, one pass to write.
template <class T>
__global__ void __launch_bounds__(kBlock)
    softmax_block_kernel(const T* __restrict__ src, T* __restrict__ dst, uint64_t rows,
                         uint64_t cols) {
  using C = compute_t<T>;
  __shared__ C sm[kBlock / 32], ss[kBlock / 32];
  unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = src + row * cols;
    C m = lowest<C>(), s = 0;
#pragma unroll 8
    for (uint64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      online_merge(m, s, to_compute(x[c]), C(1));
    }
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) online_merge(m, s, shfl_xor(m, k), shfl_xor(s, k));
    if (lane == 0) {
      sm[warp] = m;
      ss[warp] = s;
    }
    __syncthreads();
    m = sm[0];
    s = ss[0];
    for (unsigned w = 1; w < blockDim.x / 32; ++w) online_merge(m, s, sm[w], ss[w]);
    __syncthreads();  // sm/ss are reused by the next row
    C inv = C(1) / s;
    T* y = dst + row * cols;
    for (uint64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      y[c] = convert<T>(s_exp(to_compute(x[c]) - m) * inv);
    }
  }
}

}  // namespace

void launch_reduce(ReduceKind op, DType dtype, const void* src, const Layout& layout,
                   const std::vector<size_t>& dims, void* dst, const TempAlloc& temp,
                   cudaStream_t s) {
  size_t rank = layout.rank();
  std::vector<bool> reduced(rank, false);
  for (size_t d : dims) reduced[d] = true;
  std::vector<size_t> kd, ks, rd, rs;
  for (size_t i = 0; i < rank; ++i) {
    auto& dd = reduced[i] ? rd : kd;
    auto& ss = reduced[i] ? rs : ks;
    dd.push_back(layout.dims()[i]);
    ss.push_back(layout.strides()[i]);
  }
  bool arg = op == ReduceKind::ArgMax || op == ReduceKind::ArgMin;
  if (!arg) {  // order-free: walk the reduced dims by decreasing stride (innermost in memory last)
    std::vector<size_t> order(rd.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rs[a] > rs[b]; });
    std::vector<size_t> d2, s2;
    for (size_t i : order) {
      d2.push_back(rd[i]);
      s2.push_back(rs[i]);
    }
    rd = std::move(d2);
    rs = std::move(s2);
  }
  uint64_t outputs = 1, len = 1;
  for (size_t d : kd) outputs *= d;
  for (size_t d : rd) len *= d;
  if (outputs == 0) return;
  StridedView kept, red;
  if (!collapse_into(kd.data(), ks.data(), kd.size(), layout.start_offset(), kept) ||
      !collapse_into(rd.data(), rs.data(), rd.size(), 0, red)) {
    throw BackendError(str(reduce_name(op), ": layout ", layout.shape(), " has more than ",
                           kMaxDims, " dims after merging on cuda"));
  }
  if (len == 0) red = contiguous_view(0);
  dispatch<DeviceTypes>(dtype, [&]<class T>() {
    const T* p = static_cast<const T*>(src);
    switch (op) {
      case ReduceKind::Sum:
        return run_reduce(SumOp<T>{}, p, kept, red, outputs, len, dst, temp, s);
      case ReduceKind::Max:
      case ReduceKind::Min:
        return run_reduce(ExtremumOp<T>{op == ReduceKind::Max}, p, kept, red, outputs, len, dst,
                          temp, s);
      case ReduceKind::ArgMax:
      case ReduceKind::ArgMin:
        return run_reduce(ArgOp<T>{op == ReduceKind::ArgMax}, p, kept, red, outputs, len, dst, temp,
                          s);
    }
  });
}

void launch_softmax_last_dim(DType dtype, const void* src, void* dst, size_t rows, size_t cols,
                             cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  dispatch_float<DeviceTypes>(dtype, "softmax", [&]<class T>() {
    const T* x = static_cast<const T*>(src);
    T* y = static_cast<T*>(dst);
    if (cols <= 32 * kSoftmaxPerLane) {
      softmax_warp_kernel<T>
          <<<grid_for(rows, kBlock / 32), kBlock, 0, s>>>(x, y, rows, static_cast<unsigned>(cols));
    } else if (launch_softmax_rows_vec(dtype, src, dst, rows, cols, s)) {
      return;
    } else if (cols <= kBlock * kSoftmaxPerThread) {
      // 16-byte vectors when every row starts aligned.
      bool vec = (cols * sizeof(T)) % 16 == 0 && aligned16(x, 0, 1) && aligned16(y, 0, 1);
      softmax_block_reg_kernel<T>
          <<<grid_for(rows, 1), kBlock, 0, s>>>(x, y, rows, static_cast<unsigned>(cols), vec);
    } else {
      softmax_block_kernel<T><<<grid_for(rows, 1), kBlock, 0, s>>>(
          static_cast<const T*>(src), static_cast<T*>(dst), rows, cols);
    }
    WICK_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace wick::cuda
