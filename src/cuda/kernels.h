#pragma once
// Launchers for wick's precompiled CUDA kernels (sm_90 + PTX). Plain C++ signatures so that the
// storage code (.cpp) stays free of CUDA kernel syntax. Each launcher enqueues work on `stream`
// and returns at once; it checks the launch with WICK_CUDA_CHECK_LAUNCH.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ops.h"
#include "wick/layout.h"

namespace wick::cuda {

/// Most dims a kernel indexes; layouts are collapsed (mergeable dims joined) before launch and
/// a layout still deeper than this is first made contiguous by the caller.
constexpr int kMaxDims = 8;

/// A strided layout as a small by-value kernel argument (no upload of strides per call).
struct StridedView {
  int rank = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  int64_t offset = 0;
  bool contiguous = true;
};

/// Collapses `layout` into a view; returns false when it has more than kMaxDims dims left.
bool make_view(const Layout& layout, StridedView& view);

/// Device memory for temporaries, valid for work enqueued on the same stream after the call.
using TempAlloc = std::function<void*(size_t bytes)>;

void launch_fill(DType dtype, void* dst, size_t count, const void* host_value, cudaStream_t s);
/// dst[dst_view(i)] = src[src_view(i)] for i < count (same dtype).
void launch_copy_strided(DType dtype, const void* src, const StridedView& src_view, void* dst,
                         const StridedView& dst_view, size_t count, cudaStream_t s);
/// Contiguous dst of dtype `to` from a strided src of dtype `from`.
void launch_cast(DType from, const void* src, const StridedView& src_view, DType to, void* dst,
                 size_t count, cudaStream_t s);
void launch_unary(const UnaryOp& op, DType dtype, const void* src, const StridedView& src_view,
                  void* dst, size_t count, cudaStream_t s);
void launch_binary(BinaryKind op, DType dtype, const void* lhs, const StridedView& lhs_view,
                   const void* rhs, const StridedView& rhs_view, void* dst, size_t count,
                   cudaStream_t s);
/// dst is U8.
void launch_cmp(CmpKind op, DType dtype, const void* lhs, const StridedView& lhs_view,
                const void* rhs, const StridedView& rhs_view, void* dst, size_t count,
                cudaStream_t s);
void launch_where(const void* cond, const StridedView& cond_view, DType dtype, const void* on_true,
                  const StridedView& true_view, const void* on_false, const StridedView& false_view,
                  void* dst, size_t count, cudaStream_t s);
/// See BackendStorage::reduce. dst is contiguous with the kept dims.
void launch_reduce(ReduceKind op, DType dtype, const void* src, const Layout& layout,
                   const std::vector<size_t>& dims, void* dst, const TempAlloc& temp,
                   cudaStream_t s);
/// Contiguous rows x cols.
void launch_softmax_last_dim(DType dtype, const void* src, void* dst, size_t rows, size_t cols,
                             cudaStream_t s);
/// Index ops (see BackendStorage). An id out of range sets *error_flag (device memory) to 1
/// and the element is left as zero; the device reports it at the next synchronize.
void launch_index_select(DType dtype, const void* src, const Layout& layout, DType ids_dtype,
                         const void* ids, const Layout& ids_layout, size_t dim, void* dst,
                         int* error_flag, cudaStream_t s);
void launch_gather(DType dtype, const void* src, const Layout& layout, DType ids_dtype,
                   const void* ids, const Layout& ids_layout, size_t dim, void* dst,
                   int* error_flag, cudaStream_t s);
/// dst already holds a contiguous copy of self. Deterministic (no atomics): the sources of each
/// destination are added to it in a fixed order (index.cu). Temporaries come from `temp`.
void launch_index_add(DType dtype, void* dst, const Shape& dst_shape, DType ids_dtype,
                      const void* ids, const Layout& ids_layout, const void* src,
                      const Layout& src_layout, size_t dim, int* error_flag, const TempAlloc& temp,
                      cudaStream_t s);
void launch_scatter_add(DType dtype, void* dst, const Shape& dst_shape, DType ids_dtype,
                        const void* ids, const Layout& ids_layout, const void* src,
                        const Layout& src_layout, size_t dim, int* error_flag,
                        const TempAlloc& temp, cudaStream_t s);
/// Counter-based generator: (seed, offset) fully determine the values.
void launch_rand_uniform(DType dtype, void* dst, size_t count, double lo, double hi, uint64_t seed,
                         uint64_t offset, cudaStream_t s);
void launch_rand_normal(DType dtype, void* dst, size_t count, double mean, double std,
                        uint64_t seed, uint64_t offset, cudaStream_t s);

}  // namespace wick::cuda
