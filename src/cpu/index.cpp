// CPU index ops: index_select, gather and their adjoints index_add, scatter_add.
//
// index_select and index_add split a layout around the indexed dim into "pre" (the dims before
// it) and "post" (the dims after it); each part's storage offsets are listed once, so the loops
// work for any strides and copy whole post rows with memcpy when they are contiguous. gather and
// scatter_add walk rows of the last dim, with the row starts from a strided walker.

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu/cpu_storage.h"
#include "cpu/parallel.h"
#include "cpu/strided.h"
#include "dispatch.h"
#include "util.h"

namespace wick::cpu {
namespace {

// Elements of work below which a loop stays on the calling thread.
constexpr size_t kParallelWork = size_t{1} << 15;
// Post elements per task in index_add.
constexpr size_t kPostChunk = 4096;

template <class F>
decltype(auto) dispatch_ids(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::U32:
      return f.template operator()<uint32_t>();
    case DType::I64:
      return f.template operator()<int64_t>();
    default:
      throw UnsupportedDType(str(op, ": ids must be u32 or i64, got ", dtype_name(dtype)));
  }
}

template <class Id>
inline size_t checked_id(Id id, size_t size, const char* op, size_t dim) {
  bool negative = false;
  if constexpr (std::is_signed_v<Id>) negative = id < 0;
  if (negative || static_cast<size_t>(id) >= size) {
    throw IndexOutOfRange(
        str(op, ": index ", id, " out of range for dim ", dim, " of size ", size));
  }
  return static_cast<size_t>(id);
}

// Rank-1 ids, checked against the size of `dim`.
std::vector<size_t> load_ids(const CpuStorage& ids, const Layout& layout, size_t size,
                             const char* op, size_t dim) {
  std::vector<size_t> out(layout.elem_count());
  dispatch_ids(ids.dtype(), op, [&]<class Id>() {
    const Id* p = ids.as<Id>();
    for_each_offset(layout, 0, out.size(),
                    [&](size_t i, size_t off) { out[i] = checked_id(p[off], size, op, dim); });
  });
  return out;
}

// a += b, wrapping for integers and rounding once for f16/bf16.
template <class T>
inline T add_elem(T a, T b) {
  if constexpr (std::is_same_v<T, int64_t>) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(a + b);
  } else {
    using C = compute_t<T>;
    return T(static_cast<C>(a) + static_cast<C>(b));
  }
}

// Offsets of a layout's dims before and after `dim`.
struct Split {
  std::vector<size_t> pre, post;
  size_t dim_stride = 0;
  bool post_contiguous = false;  // post offsets are 0, 1, 2, ...
};

Split split_at(const Layout& layout, size_t dim) {
  const auto& d = layout.dims();
  const auto& s = layout.strides();
  auto offsets = [](Layout l) {
    std::vector<size_t> out(l.elem_count());
    for_each_offset(l, 0, out.size(), [&](size_t i, size_t off) { out[i] = off; });
    return out;
  };
  Split sp;
  Layout pre(Shape(std::vector<size_t>(d.begin(), d.begin() + dim)),
             std::vector<size_t>(s.begin(), s.begin() + dim), 0);
  Layout post(Shape(std::vector<size_t>(d.begin() + dim + 1, d.end())),
              std::vector<size_t>(s.begin() + dim + 1, s.end()), 0);
  sp.pre = offsets(pre);
  sp.post = offsets(post);
  sp.dim_stride = s[dim];
  sp.post_contiguous = post.is_contiguous();
  return sp;
}

// A layout walked as rows of its last dim: `outer` gives each row's start, `step` the stride
// along the row (rank >= 1).
struct Rows {
  Layout outer;
  size_t len, step, count;
  explicit Rows(const Layout& l)
      : outer(Shape(std::vector<size_t>(l.dims().begin(), l.dims().end() - 1)),
              std::vector<size_t>(l.strides().begin(), l.strides().end() - 1), l.start_offset()),
        len(l.dims().back()),
        step(l.strides().back()),
        count(outer.elem_count()) {}
};

// The result starts as a row-major copy of the input.
std::unique_ptr<CpuStorage> copy_of(const CpuStorage& in, const Layout& layout) {
  auto out = std::make_unique<CpuStorage>(layout.elem_count(), in.dtype());
  if (layout.elem_count() > 0) in.copy_to_host(layout, out->data());
  return out;
}

}  // namespace

StoragePtr CpuStorage::index_select(const Layout& layout, const BackendStorage& ids,
                                    const Layout& ids_layout, size_t dim) const {
  std::vector<size_t> id =
      load_ids(as_cpu(ids), ids_layout, layout.dims()[dim], "index_select", dim);
  Split sp = split_at(layout, dim);
  size_t n = id.size(), q = sp.post.size();
  size_t rows = sp.pre.size() * n;
  auto result = std::make_unique<CpuStorage>(rows * q, dtype_);
  if (rows * q == 0) return result;
  dispatch(dtype_, [&]<class T>() {
    const T* x = as<T>() + layout.start_offset();
    T* y = result->as<T>();
    parallel_for(rows, std::max<size_t>(1, kParallelWork / q), [&](size_t b, size_t e) {
      size_t pre = b / n, i = b % n;
      for (size_t r = b; r < e; ++r) {
        const T* src = x + sp.pre[pre] + id[i] * sp.dim_stride;
        T* dst = y + r * q;
        if (q == 1) {
          *dst = src[sp.post[0]];
        } else if (sp.post_contiguous) {
          std::memcpy(dst, src, q * sizeof(T));
        } else {
          for (size_t j = 0; j < q; ++j) dst[j] = src[sp.post[j]];
        }
        if (++i == n) {
          i = 0;
          ++pre;
        }
      }
    });
  });
  return result;
}

StoragePtr CpuStorage::gather(const Layout& layout, const BackendStorage& ids,
                              const Layout& ids_layout, size_t dim) const {
  size_t n = ids_layout.elem_count();
  auto result = std::make_unique<CpuStorage>(n, dtype_);
  if (n == 0) return result;
  // The input seen with the ids' shape; the indexed dim's offset comes from the ids.
  std::vector<size_t> view_strides = layout.strides();
  view_strides[dim] = 0;
  Layout view(ids_layout.shape(), view_strides, layout.start_offset());
  Rows xr(view), ir(ids_layout);
  size_t size = layout.dims()[dim], stride = layout.strides()[dim];
  dispatch(dtype_, [&]<class T>() {
    const T* x = as<T>();
    T* y = result->as<T>();
    dispatch_ids(ids.dtype(), "gather", [&]<class Id>() {
      const Id* p = as_cpu(ids).as<Id>();
      size_t len = xr.len;
      parallel_for(xr.count, std::max<size_t>(1, kParallelWork / len), [&](size_t b, size_t e) {
        StridedIndex xi(xr.outer, b), ii(ir.outer, b);
        for (size_t r = b; r < e; ++r, xi.next(), ii.next()) {
          const T* xp = x + xi.offset();
          const Id* ip = p + ii.offset();
          T* yp = y + r * len;
          for (size_t k = 0; k < len; ++k) {
            size_t id = checked_id(ip[k * ir.step], size, "gather", dim);
            yp[k] = xp[k * xr.step + id * stride];
          }
        }
      });
    });
  });
  return result;
}

StoragePtr CpuStorage::index_add(const Layout& layout, const BackendStorage& ids,
                                 const Layout& ids_layout, const BackendStorage& src,
                                 const Layout& src_layout, size_t dim) const {
  size_t size = layout.dims()[dim];
  std::vector<size_t> id = load_ids(as_cpu(ids), ids_layout, size, "index_add", dim);
  auto result = copy_of(*this, layout);
  Split sp = split_at(src_layout, dim);
  size_t n = id.size(), q = sp.post.size(), p = sp.pre.size();
  if (n * q * p == 0) return result;
  size_t chunks = (q + kPostChunk - 1) / kPostChunk;
  dispatch(dtype_, [&]<class T>() {
    const T* s = as_cpu(src).as<T>() + src_layout.start_offset();
    T* y = result->as<T>();
    // Tasks own disjoint (pre, post-chunk) blocks of the result, so repeated ids never race.
    size_t grain = std::max<size_t>(1, kParallelWork / (n * std::min(q, kPostChunk)));
    parallel_for(p * chunks, grain, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) {
        size_t pre = t / chunks, j0 = (t % chunks) * kPostChunk;
        size_t j1 = std::min(q, j0 + kPostChunk);
        for (size_t i = 0; i < n; ++i) {
          const T* sr = s + sp.pre[pre] + i * sp.dim_stride;
          T* yr = y + (pre * size + id[i]) * q;
          if (sp.post_contiguous) {
            for (size_t j = j0; j < j1; ++j) yr[j] = add_elem(yr[j], sr[j]);
          } else {
            for (size_t j = j0; j < j1; ++j) yr[j] = add_elem(yr[j], sr[sp.post[j]]);
          }
        }
      }
    });
  });
  return result;
}

StoragePtr CpuStorage::scatter_add(const Layout& layout, const BackendStorage& ids,
                                   const Layout& ids_layout, const BackendStorage& src,
                                   const Layout& src_layout, size_t dim) const {
  auto result = copy_of(*this, layout);
  size_t n = ids_layout.elem_count();
  if (n == 0) return result;
  // The result seen with the ids' shape; the indexed dim's offset comes from the ids.
  std::vector<size_t> view_strides = layout.shape().contiguous_strides();
  size_t size = layout.dims()[dim], stride = view_strides[dim];
  view_strides[dim] = 0;
  Rows yr(Layout(ids_layout.shape(), view_strides, 0)), ir(ids_layout), sr(src_layout);
  // Different values of the dims before `dim` write disjoint parts of the result; each such
  // value owns a whole number of rows.
  size_t pre = 1;
  for (size_t i = 0; i < dim; ++i) pre *= ids_layout.dims()[i];
  size_t rows_per_pre = yr.count / pre;
  dispatch(dtype_, [&]<class T>() {
    const T* s = as_cpu(src).as<T>();
    T* y = result->as<T>();
    dispatch_ids(ids.dtype(), "scatter_add", [&]<class Id>() {
      const Id* p = as_cpu(ids).as<Id>();
      size_t len = yr.len;
      size_t grain = std::max<size_t>(1, kParallelWork / (rows_per_pre * len));
      parallel_for(pre, grain, [&](size_t pb, size_t pe) {
        size_t b = pb * rows_per_pre, e = pe * rows_per_pre;
        StridedIndex yi(yr.outer, b), ii(ir.outer, b), si(sr.outer, b);
        for (size_t r = b; r < e; ++r, yi.next(), ii.next(), si.next()) {
          T* yp = y + yi.offset();
          const Id* ip = p + ii.offset();
          const T* sp = s + si.offset();
          for (size_t k = 0; k < len; ++k) {
            size_t id = checked_id(ip[k * ir.step], size, "scatter_add", dim);
            T& dst = yp[k * yr.step + id * stride];
            dst = add_elem(dst, sp[k * sr.step]);
          }
        }
      });
    });
  });
  return result;
}

}  // namespace wick::cpu
