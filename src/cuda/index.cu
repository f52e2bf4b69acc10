// Index ops: index_select, gather, index_add, scatter_add. Ids are U32 or I64 (a runtime flag,
// not a template, to halve the instantiations); an id out of range sets *error_flag, leaves the
// element zero (select, gather) or adds nothing (index_add, scatter_add), and is never used as an
// address.

#include <vector>

#include "cuda/kernel_utils.cuh"
#include "util.h"

namespace wick::cuda {

namespace {

__device__ __forceinline__ int64_t read_id(const void* ids, bool is64, int64_t off) {
  if (is64) return static_cast<const int64_t*>(ids)[off];
  return static_cast<int64_t>(static_cast<const uint32_t*>(ids)[off]);
}

/// a / b and a % b, in 32 bits when both fit.
__device__ __forceinline__ uint64_t div_fast(uint64_t a, uint64_t b) {
  if (((a | b) >> 32) == 0) return static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
  return a / b;
}

// Atomic adds for every element type. u8 has no hardware atomic: a CAS on its aligned 32-bit
// word (allocations are 512-byte classes, so the word is inside the buffer).
__device__ __forceinline__ void atomic_add(uint8_t* p, uint8_t v) {
  auto addr = reinterpret_cast<uintptr_t>(p);
  auto* word = reinterpret_cast<unsigned*>(addr & ~uintptr_t(3));
  unsigned shift = static_cast<unsigned>(addr & 3) * 8;
  unsigned old = *word, assumed;
  do {
    assumed = old;
    unsigned byte = ((assumed >> shift) + v) & 0xffu;
    old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
  } while (assumed != old);
}
__device__ __forceinline__ void atomic_add(uint32_t* p, uint32_t v) {
  atomicAdd(p, v);
}
__device__ __forceinline__ void atomic_add(int64_t* p, int64_t v) {
  // Two's complement: an unsigned add wraps to the same bits.
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}
__device__ __forceinline__ void atomic_add(__half* p, __half v) {
  atomicAdd(p, v);
}
__device__ __forceinline__ void atomic_add(__nv_bfloat16* p, __nv_bfloat16 v) {
  atomicAdd(p, v);
}
__device__ __forceinline__ void atomic_add(float* p, float v) {
  atomicAdd(p, v);
}
__device__ __forceinline__ void atomic_add(double* p, double v) {
  atomicAdd(p, v);
}

/// dst[i] = src[view(i) + id * dim_stride], id = ids[ids_off + ((i / right) % n_ids) * ids_stride].
/// A programmatic dependent launch that lets the next one launch at once (launch_index_select).
template <class U>
__global__ void __launch_bounds__(kBlock)
    index_select_kernel(const U* __restrict__ src, StridedView sv, int64_t dim_size,
                        int64_t dim_stride, const void* __restrict__ ids, bool ids64,
                        int64_t ids_off, int64_t ids_stride, uint64_t n_ids, uint64_t right,
                        U* __restrict__ dst, uint64_t n, int* error_flag) {
  pdl_launch_dependents();
  pdl_wait();
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    uint64_t q = div_fast(i, right);
    uint64_t j = q - div_fast(q, n_ids) * n_ids;
    int64_t id = read_id(ids, ids64, ids_off + static_cast<int64_t>(j) * ids_stride);
    if (id < 0 || id >= dim_size) {
      *error_flag = 1;
      dst[i] = U(0);
    } else {
      dst[i] = src[view_offset(sv, i) + id * dim_stride];
    }
  }
}

/// dst[i] = src[sv(i) + id * dim_stride], id = ids[iv(i)].
template <class U>
__global__ void __launch_bounds__(kBlock)
    gather_kernel(const U* __restrict__ src, StridedView sv, int64_t dim_size, int64_t dim_stride,
                  const void* __restrict__ ids, bool ids64, StridedView iv, U* __restrict__ dst,
                  uint64_t n, int* error_flag) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    int64_t id = read_id(ids, ids64, view_offset(iv, i));
    if (id < 0 || id >= dim_size) {
      *error_flag = 1;
      dst[i] = U(0);
    } else {
      dst[i] = src[view_offset(sv, i) + id * dim_stride];
    }
  }
}

/// Element i of src (contiguous dst shape with dims[dim] = n_ids) is added at dim index
/// ids[j] of the contiguous dst: outer * dim_size * right + id * right + inner.
template <class T>
__global__ void __launch_bounds__(kBlock)
    index_add_kernel(T* dst, int64_t dim_size, const void* __restrict__ ids, bool ids64,
                     int64_t ids_off, int64_t ids_stride, uint64_t n_ids, uint64_t right,
                     const T* __restrict__ src, StridedView sv, uint64_t n, int* error_flag) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    uint64_t q = div_fast(i, right), inner = i - q * right;
    uint64_t outer = div_fast(q, n_ids), j = q - outer * n_ids;
    int64_t id = read_id(ids, ids64, ids_off + static_cast<int64_t>(j) * ids_stride);
    if (id < 0 || id >= dim_size) {
      *error_flag = 1;
      continue;
    }
    uint64_t off =
        (outer * static_cast<uint64_t>(dim_size) + static_cast<uint64_t>(id)) * right + inner;
    atomic_add(dst + off, src[view_offset(sv, i)]);
  }
}

/// Element i of src (shape = ids shape) is added at dv(i) + id * dim_stride of the dst.
template <class T>
__global__ void __launch_bounds__(kBlock)
    scatter_add_kernel(T* dst, StridedView dv, int64_t dim_size, int64_t dim_stride,
                       const void* __restrict__ ids, bool ids64, StridedView iv,
                       const T* __restrict__ src, StridedView sv, uint64_t n, int* error_flag) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    int64_t id = read_id(ids, ids64, view_offset(iv, i));
    if (id < 0 || id >= dim_size) {
      *error_flag = 1;
      continue;
    }
    atomic_add(dst + view_offset(dv, i) + id * dim_stride, src[view_offset(sv, i)]);
  }
}

StridedView view_or_throw(const char* op, const std::vector<size_t>& dims,
                          const std::vector<size_t>& strides, size_t offset) {
  StridedView v;
  if (!collapse_into(dims.data(), strides.data(), dims.size(), offset, v)) {
    throw BackendError(
        str(op, ": layout ", Shape(dims), " has more than ", kMaxDims, " dims after merging"));
  }
  return v;
}

StridedView view_or_throw(const char* op, const Layout& l) {
  return view_or_throw(op, l.dims(), l.strides(), l.start_offset());
}

size_t product(const std::vector<size_t>& dims, size_t from, size_t to) {
  size_t p = 1;
  for (size_t i = from; i < to; ++i) p *= dims[i];
  return p;
}

bool ids_are_i64(const char* op, DType ids_dtype) {
  if (ids_dtype == DType::I64) return true;
  if (ids_dtype == DType::U32) return false;
  throw UnsupportedDType(str(op, ": ids must be u32 or i64, got ", dtype_name(ids_dtype)));
}

}  // namespace

void launch_index_select(DType dtype, const void* src, const Layout& layout, DType ids_dtype,
                         const void* ids, const Layout& ids_layout, size_t dim, void* dst,
                         int* error_flag, cudaStream_t s) {
  bool ids64 = ids_are_i64("index_select", ids_dtype);
  size_t n_ids = ids_layout.dims()[0];
  std::vector<size_t> dims = layout.dims(), strides = layout.strides();
  dims[dim] = n_ids;
  size_t n = product(dims, 0, dims.size());
  if (n == 0) return;
  strides[dim] = 0;  // the id supplies this coordinate
  StridedView sv = view_or_throw("index_select", dims, strides, layout.start_offset());
  // A programmatic dependent launch (unless tuning() turns pdl or pdl_step_ends off), for the
  // decode step's embedding: the first projection's weights start loading while the row is
  // gathered.
  dispatch_size(size_in_bytes(dtype), [&]<class U>() {
    auto launch = [&](auto&&... args) {
      if (tuning().pdl_step_ends) {
        launch_pdl(index_select_kernel<U>, dim3(grid_for(n)), dim3(kBlock), 0, s, args...);
      } else {
        index_select_kernel<U><<<grid_for(n), kBlock, 0, s>>>(args...);
      }
    };
    launch(static_cast<const U*>(src), sv, static_cast<int64_t>(layout.dims()[dim]),
           static_cast<int64_t>(layout.strides()[dim]), ids, ids64,
           static_cast<int64_t>(ids_layout.start_offset()),
           static_cast<int64_t>(ids_layout.strides()[0]), n_ids,
           product(dims, dim + 1, dims.size()), static_cast<U*>(dst), n, error_flag);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

void launch_gather(DType dtype, const void* src, const Layout& layout, DType ids_dtype,
                   const void* ids, const Layout& ids_layout, size_t dim, void* dst,
                   int* error_flag, cudaStream_t s) {
  bool ids64 = ids_are_i64("gather", ids_dtype);
  size_t n = ids_layout.elem_count();
  if (n == 0) return;
  std::vector<size_t> strides = layout.strides();
  strides[dim] = 0;
  StridedView sv = view_or_throw("gather", ids_layout.dims(), strides, layout.start_offset());
  StridedView iv = view_or_throw("gather", ids_layout);
  dispatch_size(size_in_bytes(dtype), [&]<class U>() {
    gather_kernel<U><<<grid_for(n), kBlock, 0, s>>>(
        static_cast<const U*>(src), sv, static_cast<int64_t>(layout.dims()[dim]),
        static_cast<int64_t>(layout.strides()[dim]), ids, ids64, iv, static_cast<U*>(dst), n,
        error_flag);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

void launch_index_add(DType dtype, void* dst, const Shape& dst_shape, DType ids_dtype,
                      const void* ids, const Layout& ids_layout, const void* src,
                      const Layout& src_layout, size_t dim, int* error_flag, cudaStream_t s) {
  bool ids64 = ids_are_i64("index_add", ids_dtype);
  size_t n = src_layout.elem_count();
  if (n == 0) return;
  StridedView sv = view_or_throw("index_add", src_layout);
  const auto& sd = src_layout.dims();
  dispatch<DeviceTypes>(dtype, [&]<class T>() {
    index_add_kernel<T><<<grid_for(n), kBlock, 0, s>>>(
        static_cast<T*>(dst), static_cast<int64_t>(dst_shape[dim]), ids, ids64,
        static_cast<int64_t>(ids_layout.start_offset()),
        static_cast<int64_t>(ids_layout.strides()[0]), sd[dim], product(sd, dim + 1, sd.size()),
        static_cast<const T*>(src), sv, n, error_flag);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

void launch_scatter_add(DType dtype, void* dst, const Shape& dst_shape, DType ids_dtype,
                        const void* ids, const Layout& ids_layout, const void* src,
                        const Layout& src_layout, size_t dim, int* error_flag, cudaStream_t s) {
  bool ids64 = ids_are_i64("scatter_add", ids_dtype);
  size_t n = src_layout.elem_count();
  if (n == 0) return;
  // The dst walked with the src's shape and the dst's own (contiguous) strides; the id supplies
  // the coordinate along dim.
  std::vector<size_t> dst_strides = dst_shape.contiguous_strides();
  size_t dim_stride = dst_strides[dim];
  dst_strides[dim] = 0;
  StridedView dv = view_or_throw("scatter_add", src_layout.dims(), dst_strides, 0);
  StridedView iv = view_or_throw("scatter_add", ids_layout);
  StridedView sv = view_or_throw("scatter_add", src_layout);
  dispatch<DeviceTypes>(dtype, [&]<class T>() {
    scatter_add_kernel<T><<<grid_for(n), kBlock, 0, s>>>(
        static_cast<T*>(dst), dv, static_cast<int64_t>(dst_shape[dim]),
        static_cast<int64_t>(dim_stride), ids, ids64, iv, static_cast<const T*>(src), sv, n,
        error_flag);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace wick::cuda
