// The CPU kernels of fused::AddRmsNormOp, AddRmsNormedOp and SiluMulOp: one pass per row, f32
// arithmetic (f64 for f64), rows split across the workers.

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/cpu_storage.h"
#include "cpu/fused.h"
#include "cpu/parallel.h"
#include "dispatch.h"
#include "fused/decoder.h"
#include "fused_op.h"
#include "ops/norm_math.h"
#include "ops/unary_math.h"
#include "tensor_internal.h"

namespace wick::fused {

namespace {

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
const T* data_of(const Tensor& t) {
  return cpu::as_cpu(detail::backend_of(t)).as<T>() + t.impl()->layout.start_offset();
}

size_t grain_for(size_t cols) {
  return std::max<size_t>(1, (size_t{1} << 14) / std::max<size_t>(cols, 1));
}

}  // namespace

std::optional<TensorList> AddRmsNormOp::cpu(const TensorList& in) const {
  auto locks = detail::lock_inputs(*this, in);
  const Tensor& x = in[0];
  const Tensor& delta = in[1];
  const Tensor& weight = in[2];
  size_t rows = x.dims()[0], d = x.dims()[1];
  auto sum = std::make_unique<cpu::CpuStorage>(rows * d, x.dtype());
  auto normed = std::make_unique<cpu::CpuStorage>(rows * d, x.dtype());
  dispatch_float(x.dtype(), "add_rms_norm", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = data_of<T>(x);
    const T* dp = data_of<T>(delta);
    const T* wp = data_of<T>(weight);
    T* sp = sum->template as<T>();
    T* np = normed->template as<T>();
    cpu::parallel_for(rows, grain_for(d), [&](size_t begin, size_t end) {
      for (size_t r = begin; r < end; ++r) {
        A sq = 0;
        for (size_t c = 0; c < d; ++c) {
          T s = T(static_cast<A>(xp[r * d + c]) + static_cast<A>(dp[r * d + c]));
          sp[r * d + c] = s;
          A v = static_cast<A>(s);
          sq += v * v;
        }
        A rstd = ops::norm_rstd(sq, static_cast<A>(d), static_cast<A>(eps));
        for (size_t c = 0; c < d; ++c) {
          // Rounded before the weight multiplies it, as transformers' RMSNorm (cpu/fused.h).
          np[r * d + c] =
              T(static_cast<A>(wp[c]) * cpu::round_as<T>(static_cast<A>(sp[r * d + c]) * rstd));
        }
      }
    });
  });
  return TensorList{detail::from_storage(std::move(sum), x.shape()),
                    detail::from_storage(std::move(normed), x.shape())};
}

std::optional<TensorList> AddRmsNormedOp::cpu(const TensorList& in) const {
  auto locks = detail::lock_inputs(*this, in);
  const Tensor& x = in[0];
  const Tensor& delta = in[1];
  const Tensor& weight = in[2];
  size_t rows = x.dims()[0], d = x.dims()[1];
  const bool f32_weight = weight.dtype() != x.dtype();  // an f32 weight of f16/bf16 x
  auto out = std::make_unique<cpu::CpuStorage>(rows * d, x.dtype());
  dispatch_float(x.dtype(), name(), [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = data_of<T>(x);
    const T* dp = data_of<T>(delta);
    T* op = out->template as<T>();
    std::vector<A> w(d);
    const float* wf = f32_weight ? data_of<float>(weight) : nullptr;
    const T* wt = f32_weight ? nullptr : data_of<T>(weight);
    for (size_t c = 0; c < d; ++c) w[c] = wf ? static_cast<A>(wf[c]) : static_cast<A>(wt[c]);
    const A e = static_cast<A>(eps);
    cpu::parallel_for(rows, grain_for(d), [&](size_t begin, size_t end) {
      std::vector<A> v(d);
      std::vector<T> normed(d);
      for (size_t r = begin; r < end; ++r) {
        for (size_t c = 0; c < d; ++c) v[c] = static_cast<A>(dp[r * d + c]);
        // rms_norm's own row (rounded to T), then the add: the composition's two roundings.
        cpu::rms_norm_row<T>(v.data(), w.data(), e, d, f32_weight, normed.data());
        for (size_t c = 0; c < d; ++c) {
          op[r * d + c] = T(static_cast<A>(xp[r * d + c]) + static_cast<A>(normed[c]));
        }
      }
    });
  });
  return TensorList{detail::from_storage(std::move(out), x.shape())};
}

std::optional<TensorList> SiluMulOp::cpu(const TensorList& in) const {
  auto locks = detail::lock_inputs(*this, in);
  const Tensor& gate_up = in[0];
  size_t rows = gate_up.dims()[0], n = gate_up.dims()[1] / 2;
  auto out = std::make_unique<cpu::CpuStorage>(rows * n, gate_up.dtype());
  dispatch_float(gate_up.dtype(), "silu_mul", [&]<class T>() {
    using A = acc_t<T>;
    const T* gp = data_of<T>(gate_up);
    T* op = out->template as<T>();
    // Split over the flattened elements, each independent.
    cpu::parallel_for(rows * n, size_t{1} << 14, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end;) {
        const size_t r = i / n, c0 = i % n, c1 = std::min(n, c0 + (end - i));
        const T* g = gp + r * 2 * n;
        const T* u = g + n;
        T* o = op + r * n;
        for (size_t c = c0; c < c1; ++c) {
          A gv = static_cast<A>(g[c]);
          // silu rounded, then the product: transformers' act_fn(gate) * up in the dtype.
          o[c] = T(cpu::round_as<T>(gv * ops::math::sigmoid(gv)) * static_cast<A>(u[c]));
        }
        i += c1 - c0;
      }
    });
  });
  return TensorList{detail::from_storage(std::move(out), Shape{rows, n})};
}

}  // namespace wick::fused
