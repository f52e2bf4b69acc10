#pragma once
// f64 references for the fused ops, composed from element-wise ops (shared by the CPU and CUDA
// nn tests).

#include <cmath>
#include <limits>

#include "test_util.h"

namespace wick::testing {

inline Tensor f64(const Tensor& t) {
  return t.to_dtype(DType::F64);
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Compares a result against its f64 reference with a tolerance relative to the values' scale
// (the scale is checked to be far from zero, so an all-zero output fails).
inline ::testing::AssertionResult close_to(const Tensor& got, const Tensor& ref, double tol) {
  std::vector<double> r = ref.to_vec_f64();
  if (got.shape() != ref.shape()) {
    return ::testing::AssertionFailure() << "shape " << got.shape() << " vs " << ref.shape();
  }
  double scale = max_abs(r);
  if (!(scale > 1e-3)) return ::testing::AssertionFailure() << "reference is ~0";
  return all_close(got.to_vec_f64(), r, tol, tol * scale);
}

// ---- references composed from element-wise ops ----

inline Tensor layer_norm_ref(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  size_t last = x.rank() - 1;
  Tensor xc = x.broadcast_sub(x.mean_keepdim({last}));
  Tensor y = xc.broadcast_div(xc.sqr().mean_keepdim({last}).affine(1, eps).sqrt());
  y = y.broadcast_mul(w);
  return b.defined() ? y.broadcast_add(b) : y;
}

inline Tensor rms_norm_ref(const Tensor& x, const Tensor& w, double eps) {
  size_t last = x.rank() - 1;
  return x.broadcast_div(x.sqr().mean_keepdim({last}).affine(1, eps).sqrt()).broadcast_mul(w);
}

inline Tensor rope_ref(const Tensor& x, const Tensor& c, const Tensor& s, bool interleaved) {
  size_t half = x.dims()[3] / 2;
  Tensor a, b;
  if (interleaved) {
    Tensor p = x.reshape(Shape{x.dims()[0], x.dims()[1], x.dims()[2], half, 2});
    a = p.narrow(4, 0, 1).squeeze(4);
    b = p.narrow(4, 1, 1).squeeze(4);
  } else {
    a = x.narrow(3, 0, half);
    b = x.narrow(3, half, half);
  }
  Tensor ra = a.broadcast_mul(c).broadcast_sub(b.broadcast_mul(s));
  Tensor rb = b.broadcast_mul(c).broadcast_add(a.broadcast_mul(s));
  if (!interleaved) return Tensor::cat({ra, rb}, 3);
  return Tensor::stack({ra, rb}, 4).reshape(x.shape());
}

inline Tensor attention_ref(const Tensor& q, const Tensor& k, const Tensor& v,
                            const nn::AttentionOptions& o) {
  size_t b = q.dims()[0], h = q.dims()[1], s = q.dims()[2], d = q.dims()[3];
  size_t hk = k.dims()[1], skv = k.dims()[2], g = h / hk;
  auto rep = [&](const Tensor& t) {
    return t.unsqueeze(2).broadcast_as(Shape{b, hk, g, skv, d}).reshape(Shape{b, h, skv, d});
  };
  double scale = o.scale != 0 ? o.scale : 1.0 / std::sqrt(double(d));
  Tensor sc = q.matmul(rep(k).t()).affine(scale, 0);
  if (o.mask) sc = sc.broadcast_add(f64(*o.mask));
  if (o.causal) {
    std::vector<double> m(s * skv);
    for (size_t i = 0; i < s; ++i)
      for (size_t j = 0; j < skv; ++j)
        m[i * skv + j] = long(j) <= long(i) + long(skv) - long(s)
                             ? 0.0
                             : -std::numeric_limits<double>::infinity();
    sc = sc.broadcast_add(Tensor::from_vec(m, Shape{s, skv}, Device::cpu()));
  }
  return sc.softmax(3).matmul(rep(v));
}

}  // namespace wick::testing
