#include "cuda/cuda_storage.h"

#include <numeric>

#include "util.h"

namespace wick::cuda {

StridedView dense_view(size_t count) {
  StridedView v;
  v.rank = 1;
  v.dims[0] = static_cast<int64_t>(count);
  v.strides[0] = 1;
  v.offset = 0;
  v.contiguous = true;
  return v;
}

namespace {

// Copies the elements of `src_layout` at `src` into `dst_layout` at `dst`. Layouts still deeper
// than kMaxDims after collapsing are split along their first dim.
void copy_strided(CudaDevice& dev, DType dtype, const void* src, const Layout& src_layout,
                  void* dst, const Layout& dst_layout) {
  size_t n = src_layout.elem_count();
  if (n == 0) return;
  StridedView sv, dv;
  if (make_view(src_layout, sv) && make_view(dst_layout, dv)) {
    dev.queue().enqueue(
        "copy", dtype, [&](cudaStream_t s) { launch_copy_strided(dtype, src, sv, dst, dv, n, s); });
    return;
  }
  auto tail = [](const Layout& l, size_t i) {
    std::vector<size_t> dims(l.dims().begin() + 1, l.dims().end());
    std::vector<size_t> strides(l.strides().begin() + 1, l.strides().end());
    return Layout(Shape(std::move(dims)), std::move(strides),
                  l.start_offset() + i * l.strides()[0]);
  };
  for (size_t i = 0; i < src_layout.dims()[0]; ++i) {
    copy_strided(dev, dtype, src, tail(src_layout, i), dst, tail(dst_layout, i));
  }
}

// An operand as a (pointer, view) pair, through a contiguous copy when the layout is too deep.
struct ViewOperand {
  const void* ptr = nullptr;
  StridedView view;
  std::unique_ptr<CudaStorage> copy;  // freed after the op: reuse is ordered by the stream
};

ViewOperand view_operand(const CudaStorage& s, const Layout& layout) {
  ViewOperand op;
  if (make_view(layout, op.view)) {
    op.ptr = s.data();
    return op;
  }
  op.copy = s.contiguous_copy(layout);
  op.ptr = op.copy->data();
  op.view = dense_view(layout.elem_count());
  return op;
}

// An operand for launchers that take a Layout: the layout itself, or a contiguous copy.
struct LayoutOperand {
  const void* ptr = nullptr;
  Layout layout;
  std::unique_ptr<CudaStorage> copy;
};

LayoutOperand layout_operand(const CudaStorage& s, const Layout& layout) {
  LayoutOperand op;
  StridedView v;
  if (make_view(layout, v)) {
    op.ptr = s.data();
    op.layout = layout;
    return op;
  }
  op.copy = s.contiguous_copy(layout);
  op.ptr = op.copy->data();
  op.layout = Layout::contiguous(layout.shape());
  return op;
}

std::unique_ptr<CudaStorage> fresh(const CudaStorage& like, size_t count, DType dtype) {
  return std::make_unique<CudaStorage>(like.cuda_device(), count, dtype);
}

}  // namespace

CudaStorage::CudaStorage(CudaDevice& device, size_t count, DType dtype)
    : dev_(&device),
      count_(count),
      dtype_(dtype),
      buffer_(std::make_shared<DeviceBuffer>(device, count * size_in_bytes(dtype))) {}

std::unique_ptr<CudaStorage> CudaStorage::contiguous_copy(const Layout& layout) const {
  auto out = fresh(*this, layout.elem_count(), dtype_);
  copy_strided(*dev_, dtype_, data(), layout, out->data(), Layout::contiguous(layout.shape()));
  return out;
}

void CudaStorage::copy_to_host(const Layout& layout, void* dst) const {
  size_t n = layout.elem_count();
  if (n == 0) return;
  size_t bytes = n * size_in_bytes(dtype_);
  if (layout.is_contiguous()) {
    // Only the view's bytes cross the bus: one element of a 1024x1024 result is one element.
    dev_->queue().read_back(data_at(layout.start_offset()), bytes, dst);
    return;
  }
  auto gathered = contiguous_copy(layout);  // gathered on the GPU, then one copy
  dev_->queue().read_back(gathered->data(), bytes, dst);
}

void CudaStorage::copy_into(const Layout& src_layout, BackendStorage& dst,
                            const Layout& dst_layout) const {
  copy_strided(*dev_, dtype_, data(), src_layout, as_cuda(dst).data(), dst_layout);
}

StoragePtr CudaStorage::to_dtype(const Layout& layout, DType dtype) const {
  size_t n = layout.elem_count();
  if (dtype == dtype_) return contiguous_copy(layout);
  auto out = fresh(*this, n, dtype);
  if (n == 0) return out;
  ViewOperand src = view_operand(*this, layout);
  dev_->queue().enqueue("cast", dtype_, [&](cudaStream_t s) {
    launch_cast(dtype_, src.ptr, src.view, dtype, out->data(), n, s);
  });
  return out;
}

StoragePtr CudaStorage::unary(const UnaryOp& op, const Layout& layout) const {
  size_t n = layout.elem_count();
  auto out = fresh(*this, n, dtype_);
  if (n == 0) return out;
  ViewOperand src = view_operand(*this, layout);
  dev_->queue().enqueue(unary_name(op.kind), dtype_, [&](cudaStream_t s) {
    launch_unary(op, dtype_, src.ptr, src.view, out->data(), n, s);
  });
  return out;
}

StoragePtr CudaStorage::binary(BinaryKind op, const Layout& layout, const BackendStorage& rhs,
                               const Layout& rhs_layout) const {
  size_t n = layout.elem_count();
  auto out = fresh(*this, n, dtype_);
  if (n == 0) return out;
  ViewOperand a = view_operand(*this, layout);
  ViewOperand b = view_operand(as_cuda(rhs), rhs_layout);
  dev_->queue().enqueue(binary_name(op), dtype_, [&](cudaStream_t s) {
    launch_binary(op, dtype_, a.ptr, a.view, b.ptr, b.view, out->data(), n, s);
  });
  return out;
}

StoragePtr CudaStorage::cmp(CmpKind op, const Layout& layout, const BackendStorage& rhs,
                            const Layout& rhs_layout) const {
  size_t n = layout.elem_count();
  auto out = fresh(*this, n, DType::U8);
  if (n == 0) return out;
  ViewOperand a = view_operand(*this, layout);
  ViewOperand b = view_operand(as_cuda(rhs), rhs_layout);
  dev_->queue().enqueue(cmp_name(op), dtype_, [&](cudaStream_t s) {
    launch_cmp(op, dtype_, a.ptr, a.view, b.ptr, b.view, out->data(), n, s);
  });
  return out;
}

StoragePtr CudaStorage::where_cond(const Layout& layout, const BackendStorage& on_true,
                                   const Layout& true_layout, const BackendStorage& on_false,
                                   const Layout& false_layout) const {
  size_t n = layout.elem_count();
  DType dtype = on_true.dtype();
  auto out = fresh(*this, n, dtype);
  if (n == 0) return out;
  ViewOperand c = view_operand(*this, layout);
  ViewOperand t = view_operand(as_cuda(on_true), true_layout);
  ViewOperand f = view_operand(as_cuda(on_false), false_layout);
  dev_->queue().enqueue("where_cond", dtype, [&](cudaStream_t s) {
    launch_where(c.ptr, c.view, dtype, t.ptr, t.view, f.ptr, f.view, out->data(), n, s);
  });
  return out;
}

StoragePtr CudaStorage::reduce(ReduceKind op, const Layout& layout,
                               const std::vector<size_t>& dims) const {
  size_t out_count = 1;
  for (size_t i = 0, j = 0; i < layout.rank(); ++i) {
    if (j < dims.size() && dims[j] == i) {
      ++j;
    } else {
      out_count *= layout.dims()[i];
    }
  }
  bool arg = op == ReduceKind::ArgMax || op == ReduceKind::ArgMin;
  DType out_dtype = arg ? DType::U32 : dtype_;
  auto out = fresh(*this, out_count, out_dtype);
  if (out_count == 0) return out;
  if (layout.elem_count() == 0) {
    // A sum over nothing (the front end rejects max/min/arg* of empty dims).
    const uint64_t zero_bits = 0;
    return dev_->filled(out_count, out_dtype, &zero_bits);
  }
  LayoutOperand src = layout_operand(*this, layout);
  TempBuffers temps(*dev_);
  dev_->queue().enqueue(reduce_name(op), dtype_, [&](cudaStream_t s) {
    launch_reduce(op, dtype_, src.ptr, src.layout, dims, out->data(), temps.alloc(), s);
  });
  return out;
}

StoragePtr CudaStorage::softmax_last_dim(const Layout& layout) const {
  size_t n = layout.elem_count();
  auto out = fresh(*this, n, dtype_);
  if (n == 0) return out;
  size_t cols = layout.rank() == 0 ? 1 : layout.dims().back();
  std::unique_ptr<CudaStorage> copy;
  const void* src = data_at(layout.start_offset());
  if (!layout.is_contiguous()) {
    copy = contiguous_copy(layout);
    src = copy->data();
  }
  dev_->queue().enqueue("softmax", dtype_, [&](cudaStream_t s) {
    launch_softmax_last_dim(dtype_, src, out->data(), n / cols, cols, s);
  });
  return out;
}

StoragePtr CudaStorage::index_select(const Layout& layout, const BackendStorage& ids,
                                     const Layout& ids_layout, size_t dim) const {
  size_t out_count = ids_layout.elem_count();
  for (size_t i = 0; i < layout.rank(); ++i) {
    if (i != dim) out_count *= layout.dims()[i];
  }
  auto out = fresh(*this, out_count, dtype_);
  if (out_count == 0) return out;
  LayoutOperand src = layout_operand(*this, layout);
  LayoutOperand idx = layout_operand(as_cuda(ids), ids_layout);
  int* flag = dev_->queue().error_flag("index_select");
  dev_->queue().enqueue("index_select", dtype_, [&](cudaStream_t s) {
    launch_index_select(dtype_, src.ptr, src.layout, ids.dtype(), idx.ptr, idx.layout, dim,
                        out->data(), flag, s);
  });
  return out;
}

StoragePtr CudaStorage::gather(const Layout& layout, const BackendStorage& ids,
                               const Layout& ids_layout, size_t dim) const {
  size_t out_count = ids_layout.elem_count();
  auto out = fresh(*this, out_count, dtype_);
  if (out_count == 0) return out;
  LayoutOperand src = layout_operand(*this, layout);
  LayoutOperand idx = layout_operand(as_cuda(ids), ids_layout);
  int* flag = dev_->queue().error_flag("gather");
  dev_->queue().enqueue("gather", dtype_, [&](cudaStream_t s) {
    launch_gather(dtype_, src.ptr, src.layout, ids.dtype(), idx.ptr, idx.layout, dim, out->data(),
                  flag, s);
  });
  return out;
}

StoragePtr CudaStorage::index_add(const Layout& layout, const BackendStorage& ids,
                                  const Layout& ids_layout, const BackendStorage& src,
                                  const Layout& src_layout, size_t dim) const {
  auto out = contiguous_copy(layout);
  if (layout.elem_count() == 0 || src_layout.elem_count() == 0) return out;
  LayoutOperand idx = layout_operand(as_cuda(ids), ids_layout);
  LayoutOperand add = layout_operand(as_cuda(src), src_layout);
  int* flag = dev_->queue().error_flag("index_add");
  TempBuffers temps(*dev_);
  dev_->queue().enqueue("index_add", dtype_, [&](cudaStream_t s) {
    launch_index_add(dtype_, out->data(), layout.shape(), ids.dtype(), idx.ptr, idx.layout, add.ptr,
                     add.layout, dim, flag, temps.alloc(), s);
  });
  return out;
}

StoragePtr CudaStorage::scatter_add(const Layout& layout, const BackendStorage& ids,
                                    const Layout& ids_layout, const BackendStorage& src,
                                    const Layout& src_layout, size_t dim) const {
  auto out = contiguous_copy(layout);
  if (layout.elem_count() == 0 || src_layout.elem_count() == 0) return out;
  LayoutOperand idx = layout_operand(as_cuda(ids), ids_layout);
  LayoutOperand add = layout_operand(as_cuda(src), src_layout);
  int* flag = dev_->queue().error_flag("scatter_add");
  TempBuffers temps(*dev_);
  dev_->queue().enqueue("scatter_add", dtype_, [&](cudaStream_t s) {
    launch_scatter_add(dtype_, out->data(), layout.shape(), ids.dtype(), idx.ptr, idx.layout,
                       add.ptr, add.layout, dim, flag, temps.alloc(), s);
  });
  return out;
}

}  // namespace wick::cuda
