// CUDA matmul: cuBLASLt with cached plans, or wick's own GEMM while cuBLASLt warms up.
//
// Row-major C (m x n) = A (m x k) B (k x n) is the column-major product C^T = B^T A^T, so cuBLASLt
// gets B as its first operand and A as its second, with m and n swapped. A row-major operand is a
// column-major transpose with the same leading dimension, a column-major one is passed transposed.

#include <algorithm>
#include <cstdio>

#include "cuda/cuda_device.h"
#include "cuda/cuda_storage.h"
#include "cuda/gemm.h"
#include "cuda/matmul_engine.h"
#include "cuda_config.h"
#include "settings.h"
#include "util.h"
#include "wick/cuda.h"

namespace wick {

namespace cuda {

namespace {

uint32_t alignment(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  uintptr_t a = v & (~v + 1);
  return static_cast<uint32_t>(v == 0 || a > 256 ? 256 : a);
}

// A (rows x cols) row-major-indexed matrix with strides (rs, cs) as cuBLAS sees it: `trans`
// false when it is row-major (a column-major cols x rows matrix), true when column-major.
struct Form {
  bool ok = false, trans = false;
  int64_t ld = 0;
};

Form form(size_t rows, size_t cols, size_t rs, size_t cs) {
  Form f;
  auto R = static_cast<int64_t>(rows), C = static_cast<int64_t>(cols);
  auto RS = static_cast<int64_t>(rs), CS = static_cast<int64_t>(cs);
  if ((C == 1 || CS == 1) && (R == 1 || RS >= C)) {
    f = {true, false, R == 1 ? std::max<int64_t>(C, 1) : RS};
  } else if ((R == 1 || RS == 1) && (C == 1 || CS >= R)) {
    f = {true, true, C == 1 ? std::max<int64_t>(R, 1) : CS};
  }
  return f;
}

// The batch dims of `layout` (all but the last two) as one stride: true when batch index i sits
// at i * stride (stride 0 for a broadcast batch).
bool collapse_batch(const Layout& layout, int64_t& stride) {
  size_t nb = layout.rank() - 2;
  bool have = false;
  int64_t st = 0, span = 1;
  for (size_t i = nb; i-- > 0;) {
    auto d = static_cast<int64_t>(layout.dims()[i]);
    auto s = static_cast<int64_t>(layout.strides()[i]);
    if (d == 1) continue;
    if (!have) {
      st = s;
      span = d;
      have = true;
      continue;
    }
    if (s != st * span) return false;
    span *= d;
  }
  stride = st;
  return true;
}

// One operand ready for either GEMM: base pointer (offset applied), strides, batch stride, and
// the contiguous copy it was made from when its layout needed one.
struct MatOperand {
  const void* ptr = nullptr;
  int64_t rs = 0, cs = 0, bs = 0;
  std::unique_ptr<CudaStorage> copy;
};

MatOperand mat_operand(const CudaStorage& s, const Layout& layout, size_t rows, size_t cols,
                       bool need_blas_form) {
  MatOperand op;
  size_t r = layout.rank();
  int64_t bs = 0;
  bool ok = collapse_batch(layout, bs);
  if (ok && need_blas_form) {
    ok = form(rows, cols, layout.strides()[r - 2], layout.strides()[r - 1]).ok;
  }
  if (ok) {
    op.ptr = s.data_at(layout.start_offset());
    op.rs = static_cast<int64_t>(layout.strides()[r - 2]);
    op.cs = static_cast<int64_t>(layout.strides()[r - 1]);
    op.bs = bs;
    return op;
  }
  // Batches no single stride reaches, or rows and columns both strided: one contiguous copy.
  op.copy = s.contiguous_copy(layout);
  op.ptr = op.copy->data();
  op.rs = static_cast<int64_t>(cols);
  op.cs = 1;
  op.bs = static_cast<int64_t>(rows * cols);
  return op;
}

}  // namespace

StoragePtr CudaStorage::matmul(const BackendStorage& rhs_storage, MatmulDims dims,
                               const Layout& lhs_layout, const Layout& rhs_layout) const {
  const auto& rhs = as_cuda(rhs_storage);
  CudaDevice& dev = cuda_device();
  size_t count = dims.b * dims.m * dims.n;
  if (count > 0 && dims.k == 0) {
    const uint64_t zero_bits = 0;  // 0.0 in every float dtype
    return dev.filled(count, dtype(), &zero_bits);
  }
  auto out = std::make_unique<CudaStorage>(dev, count, dtype());
  if (count == 0) return out;

  // The work estimate that lets a big product start at once in graph mode.
  double flops = 2.0 * static_cast<double>(dims.b) * static_cast<double>(dims.m) *
                 static_cast<double>(dims.n) * static_cast<double>(dims.k);
  MatmulEngine& engine = dev.matmul_engine();
  CudaMatmulPath path = cuda_matmul_path();
  // Auto takes cuBLASLt once it is warm, and wick's GEMM while it warms up (a process's first
  // matmuls return without waiting for it). Under batch invariance (WICK_BATCH_INVARIANT=1,
  // set_batch_invariant) it takes wick's GEMM always: one tiling for every m and no split of k, so
  // a row's bits depend neither on the other rows nor on timing (cuBLASLt's kernel, and so its
  // order of summation, follows m).
  bool use_cublas =
      path == CudaMatmulPath::Cublas ||
      (path == CudaMatmulPath::Auto && !settings::batch_invariant() && engine.ready());
  if (path == CudaMatmulPath::Cublas) engine.wait_ready();
  if (engine.failed()) use_cublas = false;

  MatOperand a = mat_operand(*this, lhs_layout, dims.m, dims.k, use_cublas);
  MatOperand b = mat_operand(rhs, rhs_layout, dims.k, dims.n, use_cublas);

  if (use_cublas) {
    Form fa = form(dims.m, dims.k, a.rs, a.cs), fb = form(dims.k, dims.n, b.rs, b.cs);
    PlanKey key{dtype(),
                dtype() == DType::F32 && cuda_tf32_allowed(),
                fa.trans,
                fb.trans,
                alignment(a.ptr),
                alignment(b.ptr),
                alignment(out->data()),
                static_cast<int64_t>(dims.m),
                static_cast<int64_t>(dims.n),
                static_cast<int64_t>(dims.k),
                fa.ld,
                fb.ld,
                static_cast<int64_t>(dims.b),
                dims.b > 1 ? a.bs : 0,
                dims.b > 1 ? b.bs : 0};
    bool done = false;
    bool first = trace_enabled() && engine.first_cublas();
    dev.queue().enqueue(
        "matmul", dtype(),
        [&](cudaStream_t s) { done = engine.run(key, a.ptr, b.ptr, out->data(), s); }, flops);
    if (first) {
      std::fprintf(stderr, "[wick] MATMUL cublasLt %s %zux%zux%zu b%zu (first cuBLASLt matmul)\n",
                   dtype_name(dtype()), dims.m, dims.n, dims.k, dims.b);
    }
    if (done) return out;
  } else if (trace_enabled()) {
    std::fprintf(stderr, "[wick] MATMUL wick-gemm %s %zux%zux%zu b%zu%s\n", dtype_name(dtype()),
                 dims.m, dims.n, dims.k, dims.b,
                 path == CudaMatmulPath::Wick ? "" : " (no cuBLASLt warm-up)");
  }
  dev.queue().enqueue(
      "gemm", dtype(),
      [&](cudaStream_t s) {
        launch_gemm(dtype(), dims.b, dims.m, dims.n, dims.k, GemmOperand{a.ptr, a.rs, a.cs, a.bs},
                    GemmOperand{b.ptr, b.rs, b.cs, b.bs}, out->data(), s);
      },
      flops);
  return out;
}

}  // namespace cuda
}  // namespace wick
