// The CPU kernels of fused::NormOp (layer_norm, rms_norm) and fused::RopeOp: single-pass row
// kernels over the thread pool (attention is in attention.cpp). f16/bf16 rows are widened to f32
// once, normalised and rounded once on the way out.

#include "cpu/fused.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "cpu/cpu_storage.h"
#include "cpu/parallel.h"
#include "dispatch.h"
#include "fused/norm.h"
#include "fused/rope.h"
#include "fused_op.h"
#include "ops/norm_math.h"
#include "ops/rope_math.h"
#include "tensor_internal.h"
#include "util.h"

namespace wick::cpu {
namespace {

// Rows per parallel chunk: about this many elements each.
constexpr size_t kParallelWork = size_t{1} << 14;

template <class T>
const T* data_of(const KernelOperand& op) {
  return as_cpu(*op.storage).as<T>() + op.layout.start_offset();
}

// Sums with eight independent accumulators, so that they vectorise without reassociation
// (explicit vectors for f32).
template <class C>
C lane_sum(const C* x, size_t n) {
  size_t i = 0;
  C s = 0;
  if constexpr (std::is_same_v<C, float>) {
    v8f acc = {};
    for (; i + 8 <= n; i += 8) acc += load8(x + i);
    s = hsum8(acc);
  } else {
    C acc[8] = {};
    for (; i + 8 <= n; i += 8) {
      for (size_t j = 0; j < 8; ++j) acc[j] += x[i + j];
    }
    s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  for (; i < n; ++i) s += x[i];
  return s;
}

// Sum of (x - mean)^2.
template <class C>
C lane_sum_sq_dev(const C* x, size_t n, C mean) {
  size_t i = 0;
  C s = 0;
  if constexpr (std::is_same_v<C, float>) {
    v8f acc = {};
    for (; i + 8 <= n; i += 8) {
      v8f v = load8(x + i) - mean;
      acc += v * v;
    }
    s = hsum8(acc);
  } else {
    C acc[8] = {};
    for (; i + 8 <= n; i += 8) {
      for (size_t j = 0; j < 8; ++j) {
        C v = x[i + j] - mean;
        acc[j] += v * v;
      }
    }
    s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  for (; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  return s;
}

// f32 outputs of at least this many bytes are written with non-temporal stores: no read for
// ownership of lines about to be overwritten, no eviction of the input for them.
constexpr size_t kStreamBytes = size_t{4} << 20;

// A norm's f32 output row, eight at a time (from a 32-byte boundary when streamed: the caller
// fences once its rows are done); `one(i)` writes y[i], `eight(i)` gives y[i, i + 8).
template <class One, class Eight>
void write_row(float* y, size_t n, bool stream, One&& one, Eight&& eight) {
  size_t i = 0;
#if defined(__AVX__)
  if (stream) {
    const size_t head = std::min(n, (0 - reinterpret_cast<uintptr_t>(y)) % 32 / sizeof(float));
    for (; i < head; ++i) one(i);
    for (; i + 8 <= n; i += 8) _mm256_stream_ps(y + i, eight(i));
  }
#else
  (void)stream;
#endif
  for (; i + 8 <= n; i += 8) store8(y + i, eight(i));
  for (; i < n; ++i) one(i);
}

// y = (v - mean) * rstd * w + b, rounded to T.
template <class T, class C>
void norm_out(const C* v, const C* w, const C* b, C mean, C rstd, T* y, size_t n, bool stream) {
  auto one = [&](size_t i) { y[i] = T((v[i] - mean) * rstd * w[i] + b[i]); };
  if constexpr (std::is_same_v<T, float>) {
    write_row(y, n, stream, one,
              [&](size_t i) { return (load8(v + i) - mean) * rstd * load8(w + i) + load8(b + i); });
  } else {
    for (size_t i = 0; i < n; ++i) one(i);
  }
}

// RMS norm's output: y = w * round(v * rstd), rounded to T. As transformers' LlamaRMSNorm (and
// Qwen2's, Mistral's): the normalised row is cast back to the input dtype before the weight
// multiplies it, so f16/bf16 round twice (f32: the same product).
template <class T, class C>
void rms_out(const C* v, const C* w, C rstd, T* y, size_t n, bool stream) {
  auto one = [&](size_t i) { y[i] = T(w[i] * round_as<T>(v[i] * rstd)); };
  if constexpr (std::is_same_v<T, float>) {
    write_row(y, n, stream, one, [&](size_t i) { return load8(w + i) * (load8(v + i) * rstd); });
  } else {
    for (size_t i = 0; i < n; ++i) one(i);
  }
}

// One kernel for both norms: layer_norm centres and adds the bias, rms_norm does neither.
template <class T, bool kLayer>
void norm_rows(double eps_in, const std::vector<KernelOperand>& ops, T* y) {
  using C = compute_t<T>;
  const Layout& xl = ops[0].layout;
  size_t d = xl.dims().back();
  size_t rows = d == 0 ? 0 : xl.elem_count() / d;
  const T* x = data_of<T>(ops[0]);
  // The weight and bias are widened once for all rows.
  std::vector<C> w(d), b(d, C(0));
  const T* wp = data_of<T>(ops[1]);
  for (size_t i = 0; i < d; ++i) w[i] = static_cast<C>(wp[i]);
  bool has_bias = kLayer && ops.size() > 2 && ops[2].storage;
  if (has_bias) {
    const T* bp = data_of<T>(ops[2]);
    for (size_t i = 0; i < d; ++i) b[i] = static_cast<C>(bp[i]);
  }
  C eps = static_cast<C>(eps_in);
  const bool stream = std::is_same_v<T, float> && rows * d * sizeof(float) >= kStreamBytes;
  parallel_for(rows, std::max<size_t>(1, kParallelWork / std::max<size_t>(d, 1)),
               [&](size_t r0, size_t r1) {
                 std::vector<C> buf(std::is_same_v<C, T> ? 0 : d);
                 for (size_t r = r0; r < r1; ++r) {
                   const T* xr = x + r * d;
                   const C* v;
                   if constexpr (std::is_same_v<C, T>) {
                     v = xr;
                   } else {
                     for (size_t i = 0; i < d; ++i) buf[i] = static_cast<C>(xr[i]);
                     v = buf.data();
                   }
                   T* yr = y + r * d;
                   C mean = kLayer ? lane_sum(v, d) / static_cast<C>(d) : C(0);
                   C rstd = ops::norm_rstd(lane_sum_sq_dev(v, d, mean), static_cast<C>(d), eps);
                   if constexpr (kLayer) {
                     norm_out(v, w.data(), b.data(), mean, rstd, yr, d, stream);
                   } else {
                     rms_out(v, w.data(), rstd, yr, d, stream);
                   }
                 }
#if defined(__AVX__)
                 if (stream) _mm_sfence();  // the streamed lines reach memory before y is read
#endif
               });
}

// x (b, h, s, d) with the last dim contiguous; cos/sin (s, d/2); y row-major.
template <class T, bool kInterleaved>
void rope_rows(const std::vector<KernelOperand>& ops, T* y) {
  using C = compute_t<T>;
  const Layout& xl = ops[0].layout;
  size_t nb = xl.dims()[0], nh = xl.dims()[1], s = xl.dims()[2], d = xl.dims()[3];
  size_t sb = xl.strides()[0], sh = xl.strides()[1], ss = xl.strides()[2];
  size_t half = d / 2;
  const T* x = data_of<T>(ops[0]);
  const T* cs = data_of<T>(ops[1]);
  const T* sn = data_of<T>(ops[2]);
  size_t rows = nb * nh * s;
  parallel_for(
      rows, std::max<size_t>(1, kParallelWork / std::max<size_t>(d, 1)), [&](size_t r0, size_t r1) {
        for (size_t r = r0; r < r1; ++r) {
          size_t t = r % s, bh = r / s;
          const T* xr = x + (bh / nh) * sb + (bh % nh) * sh + t * ss;
          const T* c = cs + t * half;
          const T* sr = sn + t * half;
          T* yr = y + r * d;
          auto round = [](C v) { return round_as<T>(v); };
          for (size_t i = 0; i < half; ++i) {
            C ci = static_cast<C>(c[i]), si = static_cast<C>(sr[i]);
            const size_t ia = kInterleaved ? 2 * i : i, ib = kInterleaved ? 2 * i + 1 : i + half;
            C a = static_cast<C>(xr[ia]), b = static_cast<C>(xr[ib]);
            yr[ia] = T(ops::rope_lo(a, b, ci, si, round));
            yr[ib] = T(ops::rope_hi(a, b, ci, si, round));
          }
        }
      });
}

// The op's operands and its output: x's dtype and element count, row-major.
template <class Kernel>
TensorList run_rows(const char* name, const TensorList& in, Kernel&& kernel) {
  std::vector<KernelOperand> ops;
  ops.reserve(in.size());
  for (const Tensor& t : in) ops.push_back(detail::kernel_operand(t));
  DType dtype = in[0].dtype();
  auto out = std::make_unique<CpuStorage>(ops[0].layout.elem_count(), dtype);
  if (ops[0].layout.elem_count() > 0) {
    dispatch_float(dtype, name,
                   [&]<class T>() { kernel.template operator()<T>(ops, out->as<T>()); });
  }
  return {detail::from_storage(std::move(out), in[0].shape())};
}

}  // namespace

template <class T>
void rms_norm_row(const compute_t<T>* v, const compute_t<T>* w, compute_t<T> eps, size_t d,
                  bool f32_weight, T* y) {
  using C = compute_t<T>;
  C rstd = ops::norm_rstd(lane_sum_sq_dev(v, d, C(0)), static_cast<C>(d), eps);
  if (f32_weight) {
    // NormOp's fallback: the f32 norm of the widened row, rounded once.
    for (size_t i = 0; i < d; ++i) y[i] = T(w[i] * (v[i] * rstd));
  } else {
    rms_out(v, w, rstd, y, d, false);
  }
}

template void rms_norm_row<float>(const float*, const float*, float, size_t, bool, float*);
template void rms_norm_row<double>(const double*, const double*, double, size_t, bool, double*);
template void rms_norm_row<f16>(const float*, const float*, float, size_t, bool, f16*);
template void rms_norm_row<bf16>(const float*, const float*, float, size_t, bool, bf16*);

}  // namespace wick::cpu

namespace wick::fused {

std::optional<TensorList> NormOp::cpu(const TensorList& in) const {
  if (in[1].dtype() != in[0].dtype()) return std::nullopt;  // an f32 weight: the fallback's f32
  auto locks = detail::lock_inputs(*this, in);
  return cpu::run_rows(name(), in, [&]<class T>(const std::vector<KernelOperand>& ops, T* y) {
    if (rms) {
      cpu::norm_rows<T, false>(eps, ops, y);
    } else {
      cpu::norm_rows<T, true>(eps, ops, y);
    }
  });
}

std::optional<TensorList> RopeOp::cpu(const TensorList& in) const {
  auto locks = detail::lock_inputs(*this, in);
  return cpu::run_rows(name(), in, [&]<class T>(const std::vector<KernelOperand>& ops, T* y) {
    if (interleaved) {
      cpu::rope_rows<T, true>(ops, y);
    } else {
      cpu::rope_rows<T, false>(ops, y);
    }
  });
}

}  // namespace wick::fused
