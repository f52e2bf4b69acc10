#pragma once
// References for the fused ops (shared by the CPU and CUDA nn tests): compositions of wick's
// element-wise ops in f64, and oracles written here in long double loops, independent of every
// wick op, that hold each output to its bound of wick/numerics.h.

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

// ---- oracles: long double loops, bounds of wick/numerics.h ----

inline bool rounds_to_half(DType dt) {
  return dt == DType::F16 || dt == DType::BF16;
}

/// layer_norm(x, w, b, eps) (rms = false; b may be undefined) or rms_norm(x, w, eps) (rms = true)
/// over the last dim, each output within numerics::norm_bound. rms_norm in f16/bf16 rounds
/// x * rstd to the dtype first (LlamaRMSNorm; docs/NUMERICS.md); t_roundings >= 0 sets the
/// roundings in between instead (0: an f32 weight's norm, rounded once).
inline ::testing::AssertionResult norm_within(const Tensor& got, const Tensor& x, const Tensor& w,
                                              const Tensor& b, double eps, bool rms,
                                              int t_roundings = -1) {
  if (got.shape() != x.shape()) {
    return ::testing::AssertionFailure() << "shape " << got.shape() << " vs " << x.shape();
  }
  DType dt = x.dtype();
  size_t n = x.dims().back(), rows = n == 0 ? 0 : x.elem_count() / n;
  std::vector<double> xv = x.to_vec_f64(), wv = w.to_vec_f64();
  std::vector<double> bv = b.defined() ? b.to_vec_f64() : std::vector<double>(n, 0.0);
  std::vector<double> want(xv.size()), z(xv.size()), m(rows);
  for (size_t r = 0; r < rows; ++r) {
    const double* row = xv.data() + r * n;
    long double mean = 0, mean_abs = 0, var = 0;
    for (size_t i = 0; i < n; ++i) {
      mean += row[i];
      mean_abs += std::fabs(static_cast<long double>(row[i]));
    }
    mean = rms ? 0.0L : mean / n;
    mean_abs /= n;
    for (size_t i = 0; i < n; ++i) var += (row[i] - mean) * (row[i] - mean);
    long double sigma = std::sqrt(var / n + eps);
    m[r] = static_cast<double>(mean_abs / sigma);
    for (size_t i = 0; i < n; ++i) {
      long double zi = (row[i] - mean) / sigma;
      z[r * n + i] = static_cast<double>(zi);
      want[r * n + i] = static_cast<double>(zi * wv[i] + bv[i]);
    }
  }
  if (t_roundings < 0) t_roundings = rms && rounds_to_half(dt) ? 1 : 0;
  return within_bounds(got.to_vec_f64(), want, [&](size_t i, double e) {
    return numerics::norm_bound(dt, n, e, z[i], wv[i % n], m[i / n], t_roundings);
  });
}

/// softmax over the last dim, each output within numerics::softmax_bound.
inline ::testing::AssertionResult softmax_last_within(const Tensor& got, const Tensor& x) {
  if (got.shape() != x.shape()) {
    return ::testing::AssertionFailure() << "shape " << got.shape() << " vs " << x.shape();
  }
  size_t n = x.dims().back(), rows = n == 0 ? 0 : x.elem_count() / n;
  std::vector<double> xv = x.to_vec_f64(), want(xv.size()), spread(rows);
  for (size_t r = 0; r < rows; ++r) {
    const double* row = xv.data() + r * n;
    long double mx = row[0], mn = row[0], sum = 0;
    for (size_t i = 0; i < n; ++i) {
      mx = std::max<long double>(mx, row[i]);
      mn = std::min<long double>(mn, row[i]);
    }
    for (size_t i = 0; i < n; ++i) sum += std::exp(row[i] - mx);
    for (size_t i = 0; i < n; ++i)
      want[r * n + i] = static_cast<double>(std::exp(row[i] - mx) / sum);
    spread[r] = static_cast<double>(mx - mn);
  }
  return within_bounds(got.to_vec_f64(), want, [&](size_t i, double e) {
    return numerics::softmax_bound(x.dtype(), n, e, spread[i / n]);
  });
}

/// rope (interleaved = false: halves rotated) or rope_interleaved of x (b, h, s, d) with cos and
/// sin (s, d / 2): out = a cos - b sin, b cos + a sin. Each output within its two products'
/// roundings and, for f16/bf16, the three roundings to the dtype of docs/NUMERICS.md.
inline ::testing::AssertionResult rope_within(const Tensor& got, const Tensor& x, const Tensor& c,
                                              const Tensor& s, bool interleaved) {
  if (got.shape() != x.shape()) {
    return ::testing::AssertionFailure() << "shape " << got.shape() << " vs " << x.shape();
  }
  DType dt = x.dtype();
  size_t seq = x.dims()[2], d = x.dims()[3], half = d / 2;
  std::vector<double> xv = x.to_vec_f64(), cv = c.to_vec_f64(), sv = s.to_vec_f64();
  std::vector<double> want(xv.size()), terms(xv.size());
  for (size_t row = 0; row < xv.size() / d; ++row) {
    size_t pos = row % seq;
    const double* in = xv.data() + row * d;
    for (size_t i = 0; i < half; ++i) {
      size_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
      long double a = in[ia], b = in[ib], co = cv[pos * half + i], si = sv[pos * half + i];
      want[row * d + ia] = static_cast<double>(a * co - b * si);
      want[row * d + ib] = static_cast<double>(b * co + a * si);
      terms[row * d + ia] = static_cast<double>(std::fabs(a * co) + std::fabs(b * si));
      terms[row * d + ib] = static_cast<double>(std::fabs(b * co) + std::fabs(a * si));
    }
  }
  double ut = numerics::unit_roundoff(dt), uc = numerics::compute_roundoff(dt);
  bool half_dt = rounds_to_half(dt);
  return within_bounds(got.to_vec_f64(), want, [&](size_t i, double e) {
    return ut * std::abs(e) + (half_dt ? 2 * ut * terms[i] : 0) + 3 * uc * terms[i] +
           numerics::underflow_floor(dt);
  });
}

/// scaled_dot_product_attention(q, k, v, o) with q (b, h, s, d), k and v (b, h_kv, s_kv, d), the
/// mask broadcast to (b, h, s, s_kv) and causal alignment to the end (key j is seen by query i
/// when j <= i + s_kv - s; a query that sees no key gives zeros), each output within
/// numerics::attention_bound.
inline ::testing::AssertionResult attention_within(const Tensor& got, const Tensor& q,
                                                   const Tensor& k, const Tensor& v,
                                                   const nn::AttentionOptions& o) {
  size_t b = q.dims()[0], h = q.dims()[1], s = q.dims()[2], d = q.dims()[3];
  size_t hk = k.dims()[1], skv = k.dims()[2], g = h / hk;
  if (got.shape() != q.shape()) {
    return ::testing::AssertionFailure() << "shape " << got.shape() << " vs " << q.shape();
  }
  std::vector<double> qv = q.to_vec_f64(), kv = k.to_vec_f64(), vv = v.to_vec_f64(), mv;
  if (o.mask) mv = o.mask->broadcast_as(Shape{b, h, s, skv}).to_vec_f64();
  long double scale = o.scale != 0 ? o.scale : 1.0L / std::sqrt(static_cast<long double>(d));

  DType dt = q.dtype();
  std::vector<double> want(qv.size()), pv(qv.size()), pev(qv.size()), spread(b * h * s);
  std::vector<long double> sc(skv), p(skv), err(skv);
  for (size_t bi = 0; bi < b; ++bi) {
    for (size_t hi = 0; hi < h; ++hi) {
      size_t kh = hi / g;
      for (size_t i = 0; i < s; ++i) {
        size_t row = (bi * h + hi) * s + i;
        const double* qr = qv.data() + row * d;
        long double mx = -std::numeric_limits<long double>::infinity(), mn = -mx;
        for (size_t j = 0; j < skv; ++j) {
          const double* kr = kv.data() + ((bi * hk + kh) * skv + j) * d;
          long double dot = 0, dot_abs = 0;
          for (size_t e = 0; e < d; ++e) {
            dot += static_cast<long double>(qr[e]) * kr[e];
            dot_abs += std::fabs(static_cast<long double>(qr[e]) * kr[e]);
          }
          sc[j] = dot * scale + (o.mask ? mv[row * skv + j] : 0.0);
          err[j] = numerics::attention_score_error(dt, d,
                                                   static_cast<double>(dot_abs * std::fabs(scale)),
                                                   static_cast<double>(std::fabs(sc[j])));
          bool seen = !o.causal ||
                      static_cast<long>(j) + static_cast<long>(s) <= static_cast<long>(i + skv);
          if (!seen) sc[j] = -std::numeric_limits<long double>::infinity();
          if (std::isfinite(sc[j])) {
            mx = std::max(mx, sc[j]);
            mn = std::min(mn, sc[j]);
          }
        }
        long double sum = 0;
        for (size_t j = 0; j < skv; ++j) {
          p[j] = std::isfinite(sc[j]) ? std::exp(sc[j] - mx) : 0.0L;
          sum += p[j];
        }
        spread[row] = mx >= mn ? static_cast<double>(mx - mn) : 0;
        for (size_t e = 0; e < d; ++e) {
          long double acc = 0, acc_abs = 0, acc_err = 0;
          for (size_t j = 0; j < skv && sum > 0; ++j) {
            long double vj = vv[((bi * hk + kh) * skv + j) * d + e], pj = p[j] / sum;
            acc += pj * vj;
            acc_abs += pj * std::fabs(vj);
            acc_err += pj * err[j] * std::fabs(vj);
          }
          want[row * d + e] = static_cast<double>(acc);
          pv[row * d + e] = static_cast<double>(acc_abs);
          pev[row * d + e] = static_cast<double>(acc_err);
        }
      }
    }
  }
  return within_bounds(got.to_vec_f64(), want, [&](size_t i, double e) {
    return numerics::attention_bound(dt, skv, e, pv[i], pev[i], spread[i / d]);
  });
}

}  // namespace wick::testing
