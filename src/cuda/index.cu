// Index ops: index_select, gather, index_add, scatter_add. Ids are U32 or I64 (a runtime flag,
// not a template, to halve the instantiations); an id out of range sets *error_flag, leaves the
// element zero (select, gather) or adds nothing (index_add, scatter_add), and is never used as an
// address.
//
// index_add and scatter_add are deterministic: no atomics. The sources are sorted by destination
// (a stable radix sort of (destination, source position) pairs), then one thread per destination
// element adds its sources to it in source order, starting from the element's value: the same
// bits run to run whatever the duplicates. A destination's run of sorted sources is cut at fixed
// positions (multiples of kPiece), so that a heavily repeated id (padding in an embedding
// backward) is summed by many threads, piece by piece, the pieces then added in order.

#include <bit>
#include <cub/device/device_radix_sort.cuh>
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

/// The accumulator of index_add / scatter_add sums: float for f16/bf16 (rounded once at the
/// end), the element type for f32/f64, 64-bit unsigned for integers (wrapping like the dtype).
template <class T>
struct AddAcc {
  using type = std::conditional_t<std::is_integral_v<T>, unsigned long long, compute_t<T>>;
};
template <class T>
__device__ __forceinline__ typename AddAcc<T>::type to_acc(T x) {
  if constexpr (std::is_integral_v<T>) {
    // Sign-extended for i64; the low bits of an unsigned sum wrap like the dtype.
    return static_cast<unsigned long long>(static_cast<long long>(x));
  } else {
    return to_compute(x);
  }
}
template <class T>
__device__ __forceinline__ T from_acc(typename AddAcc<T>::type a) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(a);
  } else {
    return convert<T>(a);
  }
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

/// Sort keys of index_add: keys[j] = ids[j] (dim_size when out of range, which sets the flag)
/// and order[j] = j.
__global__ void __launch_bounds__(kBlock)
    index_add_keys_kernel(const void* __restrict__ ids, bool ids64, int64_t ids_off,
                          int64_t ids_stride, uint64_t n_ids, int64_t dim_size,
                          uint32_t* __restrict__ keys, uint32_t* __restrict__ order,
                          int* error_flag) {
  for (uint64_t j = global_tid(); j < n_ids; j += grid_stride()) {
    int64_t id = read_id(ids, ids64, ids_off + static_cast<int64_t>(j) * ids_stride);
    if (id < 0 || id >= dim_size) {
      *error_flag = 1;
      id = dim_size;
    }
    keys[j] = static_cast<uint32_t>(id);
    order[j] = static_cast<uint32_t>(j);
  }
}

// Sources a thread adds in sequence: a destination with more (a heavily repeated id) has its
// sorted sources cut at multiples of kPiece, each piece after the first summed by its own thread.
constexpr uint64_t kPiece = 64;

/// Thread (outer, piece, inner) whose piece (sorted positions [piece * kPiece, +kPiece)) continues
/// the destination of the position before it sums that destination's sources in the piece, in
/// order, into partial[(outer * pieces + piece) * right + inner].
template <class T>
__global__ void __launch_bounds__(kBlock)
    index_add_pieces_kernel(uint32_t dim_size, const uint32_t* __restrict__ keys,
                            const uint32_t* __restrict__ order, uint64_t n_ids, uint64_t pieces,
                            uint64_t right, const T* __restrict__ src, StridedView sv,
                            typename AddAcc<T>::type* __restrict__ partial, uint64_t n) {
  using A = typename AddAcc<T>::type;
  for (uint64_t g = global_tid(); g < n; g += grid_stride()) {
    uint64_t q = div_fast(g, right), inner = g - q * right;
    uint64_t outer = div_fast(q, pieces), piece = q - outer * pieces;
    const uint64_t i = piece * kPiece;
    const uint32_t key = keys[i];
    if (i == 0 || key >= dim_size || keys[i - 1] != key) continue;
    uint64_t end = i + 1;
    while (end < n_ids && end < i + kPiece && keys[end] == key) ++end;
    const uint64_t src_row = outer * n_ids;
    A acc = A(0);
#pragma unroll 4
    for (uint64_t k = i; k < end; ++k) {
      acc += to_acc(src[view_offset(sv, (src_row + order[k]) * right + inner)]);
    }
    partial[g] = acc;
  }
}

/// Thread (outer, i, inner) with sorted position i the first of its destination `key` adds to
/// dst[outer, key, inner] its sources in the piece of i (equal keys, ascending j), in order, then
/// the partial sums of the destination's later pieces, in order.
template <class T>
__global__ void __launch_bounds__(kBlock)
    index_add_sorted_kernel(T* dst, uint32_t dim_size, const uint32_t* __restrict__ keys,
                            const uint32_t* __restrict__ order, uint64_t n_ids, uint64_t pieces,
                            uint64_t right, const T* __restrict__ src, StridedView sv,
                            const typename AddAcc<T>::type* __restrict__ partial, uint64_t n) {
  using A = typename AddAcc<T>::type;
  for (uint64_t g = global_tid(); g < n; g += grid_stride()) {
    uint64_t q = div_fast(g, right), inner = g - q * right;
    uint64_t outer = div_fast(q, n_ids), i = q - outer * n_ids;
    const uint32_t key = keys[i];
    if (key >= dim_size || (i > 0 && keys[i - 1] == key)) continue;
    const uint64_t piece_end = min(n_ids, (i / kPiece + 1) * kPiece);
    uint64_t end = i + 1;
    while (end < piece_end && keys[end] == key) ++end;
    const uint64_t off = (outer * dim_size + key) * right + inner;
    const uint64_t src_row = outer * n_ids;
    A acc = to_acc(dst[off]);
#pragma unroll 4
    for (uint64_t k = i; k < end; ++k) {
      acc += to_acc(src[view_offset(sv, (src_row + order[k]) * right + inner)]);
    }
    for (uint64_t p = i / kPiece + 1; p < pieces && keys[p * kPiece] == key; ++p) {
      acc += partial[(outer * pieces + p) * right + inner];
    }
    dst[off] = from_acc<T>(acc);
  }
}

/// Sort keys of scatter_add: element i of the ids (shape of src, `len` along dim, `right` after
/// it) goes to line (i without its dim coordinate) and id: key line * dim_size + id (lines *
/// dim_size when out of range, which sets the flag); order[i] = i.
__global__ void __launch_bounds__(kBlock)
    scatter_add_keys_kernel(const void* __restrict__ ids, bool ids64, StridedView iv,
                            int64_t dim_size, uint64_t len, uint64_t right, uint64_t lines,
                            uint64_t n, uint64_t* __restrict__ keys, uint32_t* __restrict__ order,
                            int* error_flag) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    int64_t id = read_id(ids, ids64, view_offset(iv, i));
    uint64_t key;
    if (id < 0 || id >= dim_size) {
      *error_flag = 1;
      key = lines * static_cast<uint64_t>(dim_size);
    } else {
      uint64_t q = div_fast(i, right), inner = i - q * right, outer = div_fast(q, len);
      key = (outer * right + inner) * static_cast<uint64_t>(dim_size) + static_cast<uint64_t>(id);
    }
    keys[i] = key;
    order[i] = static_cast<uint32_t>(i);
  }
}

/// Piece `piece` of the sorted sources (positions [piece * kPiece, +kPiece)) that continues the
/// key of the position before it: the sum of its sources with that key, in order, into
/// partial[piece].
template <class T>
__global__ void __launch_bounds__(kBlock)
    scatter_add_pieces_kernel(const uint64_t* __restrict__ keys, const uint32_t* __restrict__ order,
                              uint64_t sentinel, const T* __restrict__ src, StridedView sv,
                              typename AddAcc<T>::type* __restrict__ partial, uint64_t n,
                              uint64_t pieces) {
  using A = typename AddAcc<T>::type;
  for (uint64_t piece = global_tid(); piece < pieces; piece += grid_stride()) {
    const uint64_t i = piece * kPiece;
    const uint64_t key = keys[i];
    if (i == 0 || key >= sentinel || keys[i - 1] != key) continue;
    uint64_t end = i + 1;
    while (end < n && end < i + kPiece && keys[end] == key) ++end;
    A acc = A(0);
#pragma unroll 4
    for (uint64_t k = i; k < end; ++k) acc += to_acc(src[view_offset(sv, order[k])]);
    partial[piece] = acc;
  }
}

/// Sorted position k, the first of its key, adds the sources of its piece (ascending i) to their
/// destination dv(i) + id * dim_stride, in order, then the partial sums of the key's later pieces.
template <class T>
__global__ void __launch_bounds__(kBlock)
    scatter_add_sorted_kernel(T* dst, StridedView dv, int64_t dim_size, int64_t dim_stride,
                              const uint64_t* __restrict__ keys, const uint32_t* __restrict__ order,
                              uint64_t sentinel, const T* __restrict__ src, StridedView sv,
                              const typename AddAcc<T>::type* __restrict__ partial, uint64_t n,
                              uint64_t pieces) {
  using A = typename AddAcc<T>::type;
  for (uint64_t k0 = global_tid(); k0 < n; k0 += grid_stride()) {
    const uint64_t key = keys[k0];
    if (key >= sentinel || (k0 > 0 && keys[k0 - 1] == key)) continue;
    const uint64_t piece_end = min(n, (k0 / kPiece + 1) * kPiece);
    uint64_t end = k0 + 1;
    while (end < piece_end && keys[end] == key) ++end;
    const uint64_t first = order[k0];
    const uint64_t id = key - div_fast(key, static_cast<uint64_t>(dim_size)) * dim_size;
    T* d = dst + view_offset(dv, first) + static_cast<int64_t>(id) * dim_stride;
    A acc = to_acc(*d);
#pragma unroll 4
    for (uint64_t k = k0; k < end; ++k) acc += to_acc(src[view_offset(sv, order[k])]);
    for (uint64_t p = k0 / kPiece + 1; p < pieces && keys[p * kPiece] == key; ++p) {
      acc += partial[p];
    }
    *d = from_acc<T>(acc);
  }
}

/// Sorts (keys, order) pairs by the low `bits` bits of the keys, stably: in[0] -> out[0], in[1]
/// -> out[1], on `s` (temporaries from `temp`).
template <class K>
void sort_pairs(const char* op, const K* keys_in, K* keys_out, const uint32_t* order_in,
                uint32_t* order_out, uint64_t n, int bits, const TempAlloc& temp, cudaStream_t s) {
  size_t bytes = 0;
  auto check = [&](cudaError_t e) {
    if (e != cudaSuccess) {
      throw BackendError(str(op, ": radix sort of ", n, " keys: ", cudaGetErrorString(e)));
    }
  };
  const auto items = static_cast<int64_t>(n);
  check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys_in, keys_out, order_in, order_out,
                                        items, 0, bits, s));
  void* work = temp(std::max<size_t>(bytes, 16));
  check(cub::DeviceRadixSort::SortPairs(work, bytes, keys_in, keys_out, order_in, order_out, items,
                                        0, bits, s));
}

/// Bits that hold every value up to and including `max_key` (at least 1).
int key_bits(uint64_t max_key) {
  return std::max(1, static_cast<int>(std::bit_width(max_key)));
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
                      const Layout& src_layout, size_t dim, int* error_flag, const TempAlloc& temp,
                      cudaStream_t s) {
  bool ids64 = ids_are_i64("index_add", ids_dtype);
  size_t n = src_layout.elem_count();
  if (n == 0) return;
  const auto& sd = src_layout.dims();
  const uint64_t n_ids = sd[dim], dim_size = dst_shape[dim];
  if (n_ids >= (uint64_t{1} << 32) || dim_size >= (uint64_t{1} << 32) - 1) {
    throw BackendError(str("index_add: ", n_ids, " ids into a dim of ", dim_size,
                           " on cuda (each below 2^32 - 1)"));
  }
  StridedView sv = view_or_throw("index_add", src_layout);
  // Keys and order, then the same sorted, in one temporary.
  auto* buf = static_cast<uint32_t*>(temp(4 * n_ids * sizeof(uint32_t)));
  uint32_t *keys = buf, *order = buf + n_ids, *keys_sorted = buf + 2 * n_ids,
           *order_sorted = buf + 3 * n_ids;
  index_add_keys_kernel<<<grid_for(n_ids), kBlock, 0, s>>>(
      ids, ids64, static_cast<int64_t>(ids_layout.start_offset()),
      static_cast<int64_t>(ids_layout.strides()[0]), n_ids, static_cast<int64_t>(dim_size), keys,
      order, error_flag);
  WICK_CUDA_CHECK_LAUNCH();
  sort_pairs("index_add", keys, keys_sorted, order, order_sorted, n_ids, key_bits(dim_size), temp,
             s);
  const uint64_t right = product(sd, dim + 1, sd.size()), outer = n / (n_ids * right);
  const uint64_t pieces = (n_ids + kPiece - 1) / kPiece, piece_items = outer * pieces * right;
  dispatch<DeviceTypes>(dtype, [&]<class T>() {
    using A = typename AddAcc<T>::type;
    auto* partial = static_cast<A*>(temp(piece_items * sizeof(A)));
    if (pieces > 1) {
      index_add_pieces_kernel<T><<<grid_for(piece_items), kBlock, 0, s>>>(
          static_cast<uint32_t>(dim_size), keys_sorted, order_sorted, n_ids, pieces, right,
          static_cast<const T*>(src), sv, partial, piece_items);
      WICK_CUDA_CHECK_LAUNCH();
    }
    index_add_sorted_kernel<T><<<grid_for(n), kBlock, 0, s>>>(
        static_cast<T*>(dst), static_cast<uint32_t>(dim_size), keys_sorted, order_sorted, n_ids,
        pieces, right, static_cast<const T*>(src), sv, partial, n);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

void launch_scatter_add(DType dtype, void* dst, const Shape& dst_shape, DType ids_dtype,
                        const void* ids, const Layout& ids_layout, const void* src,
                        const Layout& src_layout, size_t dim, int* error_flag,
                        const TempAlloc& temp, cudaStream_t s) {
  bool ids64 = ids_are_i64("scatter_add", ids_dtype);
  size_t n = src_layout.elem_count();
  if (n == 0) return;
  const auto& sd = src_layout.dims();
  const uint64_t len = sd[dim], right = product(sd, dim + 1, sd.size()), lines = n / len;
  const uint64_t dim_size = dst_shape[dim];
  // Keys up to lines * dim_size (the sentinel) in 64 bits, positions in 32.
  if (n >= (uint64_t{1} << 32) || (dim_size > 0 && lines > (UINT64_MAX - 1) / dim_size)) {
    throw BackendError(str("scatter_add: ", n, " elements into a dim of ", dim_size,
                           " on cuda (below 2^32 elements)"));
  }
  // The dst walked with the src's shape and the dst's own (contiguous) strides; the id supplies
  // the coordinate along dim.
  std::vector<size_t> dst_strides = dst_shape.contiguous_strides();
  size_t dim_stride = dst_strides[dim];
  dst_strides[dim] = 0;
  StridedView dv = view_or_throw("scatter_add", sd, dst_strides, 0);
  StridedView iv = view_or_throw("scatter_add", ids_layout);
  StridedView sv = view_or_throw("scatter_add", src_layout);
  const uint64_t sentinel = lines * dim_size;
  auto* keys = static_cast<uint64_t*>(temp(2 * n * sizeof(uint64_t)));
  auto* order = static_cast<uint32_t*>(temp(2 * n * sizeof(uint32_t)));
  uint64_t* keys_sorted = keys + n;
  uint32_t* order_sorted = order + n;
  scatter_add_keys_kernel<<<grid_for(n), kBlock, 0, s>>>(ids, ids64, iv,
                                                         static_cast<int64_t>(dim_size), len, right,
                                                         lines, n, keys, order, error_flag);
  WICK_CUDA_CHECK_LAUNCH();
  sort_pairs("scatter_add", keys, keys_sorted, order, order_sorted, n, key_bits(sentinel), temp, s);
  const uint64_t pieces = (n + kPiece - 1) / kPiece;
  dispatch<DeviceTypes>(dtype, [&]<class T>() {
    using A = typename AddAcc<T>::type;
    auto* partial = static_cast<A*>(temp(pieces * sizeof(A)));
    if (pieces > 1) {
      scatter_add_pieces_kernel<T><<<grid_for(pieces), kBlock, 0, s>>>(
          keys_sorted, order_sorted, sentinel, static_cast<const T*>(src), sv, partial, n, pieces);
      WICK_CUDA_CHECK_LAUNCH();
    }
    scatter_add_sorted_kernel<T><<<grid_for(n), kBlock, 0, s>>>(
        static_cast<T*>(dst), dv, static_cast<int64_t>(dim_size), static_cast<int64_t>(dim_stride),
        keys_sorted, order_sorted, sentinel, static_cast<const T*>(src), sv, partial, n, pieces);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace wick::cuda
