// Views, fills, strided copies and dtype casts.

#include <cstring>

#include "cuda/kernel_utils.cuh"

namespace wick::cuda {

bool collapse_into(const size_t* dims, const size_t* strides, size_t rank, size_t offset,
                   StridedView& view) {
  view = StridedView{};
  view.offset = static_cast<int64_t>(offset);
  int r = 0;
  for (size_t i = 0; i < rank; ++i) {
    if (dims[i] == 0) {  // empty: nothing is ever indexed
      view = contiguous_view(0);
      view.offset = static_cast<int64_t>(offset);
      return true;
    }
    if (dims[i] == 1) continue;
    auto d = static_cast<int64_t>(dims[i]);
    auto st = static_cast<int64_t>(strides[i]);
    // The previous dim steps exactly over this one: one dim of their product.
    if (r > 0 && view.strides[r - 1] == st * d) {
      view.dims[r - 1] *= d;
      view.strides[r - 1] = st;
      continue;
    }
    if (r == kMaxDims) return false;
    view.dims[r] = d;
    view.strides[r] = st;
    ++r;
  }
  view.rank = r;
  view.contiguous = r == 0 || (r == 1 && view.strides[0] == 1);
  return true;
}

bool make_view(const Layout& layout, StridedView& view) {
  return collapse_into(layout.dims().data(), layout.strides().data(), layout.rank(),
                       layout.start_offset(), view);
}

namespace {

template <class U>
__global__ void __launch_bounds__(kBlock) fill_kernel(U* __restrict__ dst, uint64_t n, U value) {
  uint64_t tid = global_tid(), stride = grid_stride();
  constexpr int N = 16 / sizeof(U);
  auto addr = reinterpret_cast<uintptr_t>(dst);
  // Elements before the first 16-byte boundary, then whole vectors, then the tail.
  uint64_t head = ((16 - addr % 16) % 16) / sizeof(U);
  if (addr % sizeof(U) != 0 || head > n) head = n;
  for (uint64_t i = tid; i < head; i += stride) dst[i] = value;
  uint64_t nv = (n - head) / N;
  Vec<U, N> v;
#pragma unroll
  for (int j = 0; j < N; ++j) v.v[j] = value;
  auto* vdst = reinterpret_cast<Vec<U, N>*>(dst + head);
  for (uint64_t i = tid; i < nv; i += stride) vdst[i] = v;
  for (uint64_t i = head + nv * N + tid; i < n; i += stride) dst[i] = value;
}

template <class U>
__global__ void __launch_bounds__(kBlock)
    copy_kernel(const U* __restrict__ src, StridedView sv, U* __restrict__ dst, StridedView dv,
                uint64_t n) {
  uint64_t tid = global_tid(), stride = grid_stride();
  for (uint64_t i = tid; i < n; i += stride) dst[view_offset(dv, i)] = src[view_offset(sv, i)];
}

template <class To>
struct Convert {
  template <class From>
  __device__ To operator()(From x) const {
    return convert<To>(x);
  }
};

}  // namespace

void launch_fill(DType dtype, void* dst, size_t count, const void* host_value, cudaStream_t s) {
  if (count == 0) return;
  size_t esize = size_in_bytes(dtype);
  unsigned char bytes[8];
  std::memcpy(bytes, host_value, esize);
  bool same = true;
  for (size_t i = 1; i < esize; ++i) same = same && bytes[i] == bytes[0];
  if (same) {  // zeros and other byte patterns: the driver's memset is fastest
    WICK_CUDA_CHECK(cudaMemsetAsync(dst, bytes[0], count * esize, s));
    return;
  }
  dispatch_size(esize, [&]<class U>() {
    U value;
    std::memcpy(&value, bytes, sizeof(U));
    fill_kernel<<<grid_for(count, kBlock * (16 / sizeof(U))), kBlock, 0, s>>>(static_cast<U*>(dst),
                                                                              count, value);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

void launch_copy_strided(DType dtype, const void* src, const StridedView& src_view, void* dst,
                         const StridedView& dst_view, size_t count, cudaStream_t s) {
  if (count == 0) return;
  size_t esize = size_in_bytes(dtype);
  if (src_view.contiguous && dst_view.contiguous) {
    WICK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + dst_view.offset * esize,
                                    static_cast<const char*>(src) + src_view.offset * esize,
                                    count * esize, cudaMemcpyDeviceToDevice, s));
    return;
  }
  dispatch_size(esize, [&]<class U>() {
    copy_kernel<<<grid_for(count), kBlock, 0, s>>>(static_cast<const U*>(src), src_view,
                                                   static_cast<U*>(dst), dst_view, count);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

void launch_cast(DType from, const void* src, const StridedView& src_view, DType to, void* dst,
                 size_t count, cudaStream_t s) {
  if (count == 0) return;
  if (from == to) {
    launch_copy_strided(from, src, src_view, dst, contiguous_view(count), count, s);
    return;
  }
  dispatch<DeviceTypes>(from, [&]<class A>() {
    dispatch<DeviceTypes>(to, [&]<class Out>() {
      if constexpr (!std::is_same_v<A, Out>) {
        launch_map1(static_cast<const A*>(src), src_view, static_cast<Out*>(dst), count,
                    Convert<Out>{}, s);
      }
    });
  });
}

}  // namespace wick::cuda
