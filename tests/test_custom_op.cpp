// wick::CustomOp and wick::apply (include/wick/custom_op.h): user-defined ops with a CPU kernel
// and a composed fallback, their gradients (autograd through the fallback, or the op's own
// backward checked against finite differences), the fallback where no kernel takes the inputs,
// absent inputs, several outputs and the error paths; and wick's own fused ops' fallbacks
// against float64 references.

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "fused/norm.h"
#include "fused/rope.h"
#include "test_util.h"
#include "wick/autograd.h"
#include "wick/custom_op.h"
#include "wick/error.h"
#include "wick/numerics.h"

namespace {

using namespace wick;
using wick::testing::random_values;

std::atomic<int> g_kernel_calls{0};
std::atomic<int> g_fallback_calls{0};

void reset_counts() {
  g_kernel_calls = 0;
  g_fallback_calls = 0;
}

// y = x * x * w, with a CPU kernel that declines inputs longer than `kernel_max` elements.
class SquareScale final : public CustomOp {
 public:
  explicit SquareScale(size_t kernel_max = 1000) : kernel_max_(kernel_max) {}
  const char* name() const override { return "square_scale"; }
  void check(const TensorList& in) const override {
    if (in.size() != 2 || in[0].shape() != in[1].shape()) {
      throw ShapeMismatch("square_scale: x and w must have one shape");
    }
  }
  TensorList fallback(const TensorList& in) const override {
    ++g_fallback_calls;
    return {in[0].sqr().mul(in[1])};
  }
  std::optional<TensorList> cpu(const TensorList& in) const override {
    if (in[0].elem_count() > kernel_max_) return std::nullopt;
    ++g_kernel_calls;
    // A kernel reads its inputs' values and builds a fresh output (here through host vectors).
    std::vector<double> x = in[0].contiguous().flatten_all().to_vec1<double>();
    std::vector<double> w = in[1].contiguous().flatten_all().to_vec1<double>();
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * x[i] * w[i];
    return TensorList{Tensor::from_vec(y, in[0].shape(), Device::cpu())};
  }

 private:
  size_t kernel_max_;
};

// y = x^3 with its own gradient 3 x^2 g; no kernel gives the same result as the fallback's
// composition through any other path.
class Cube final : public CustomOp {
 public:
  const char* name() const override { return "cube"; }
  TensorList fallback(const TensorList& in) const override {
    ++g_fallback_calls;
    return {in[0].sqr().mul(in[0])};
  }
  std::optional<TensorList> cpu(const TensorList& in) const override {
    ++g_kernel_calls;
    std::vector<double> x = in[0].flatten_all().to_vec1<double>();
    for (double& v : x) v = v * v * v;
    return TensorList{Tensor::from_vec(x, in[0].shape(), Device::cpu())};
  }
  bool has_backward() const override { return true; }
  TensorList backward(const TensorList& in, const TensorList&, const TensorList& grads,
                      const std::vector<bool>& need) const override {
    TensorList out(1);
    if (need[0]) out[0] = in[0].sqr().affine(3, 0).mul(grads[0]);
    return out;
  }
};

// (a + b (+ bias), a - b): two outputs, an optional input, its own gradient; no kernel.
class SumDiff final : public CustomOp {
 public:
  const char* name() const override { return "sum_diff"; }
  TensorList fallback(const TensorList& in) const override {
    ++g_fallback_calls;
    Tensor sum = in[0].add(in[1]);
    if (in[2].defined()) sum = sum.add(in[2]);
    return {sum, in[0].sub(in[1])};
  }
  bool has_backward() const override { return true; }
  TensorList backward(const TensorList& in, const TensorList&, const TensorList& grads,
                      const std::vector<bool>& need) const override {
    EXPECT_EQ(grads[0].defined() + grads[1].defined(), 1);  // one output at a time
    TensorList out(3);
    if (grads[0].defined()) {
      if (need[0]) out[0] = grads[0];
      if (need[1]) out[1] = grads[0];
      if (need[2]) out[2] = grads[0];
    } else {
      if (need[0]) out[0] = grads[1];
      if (need[1]) out[1] = grads[1].neg();
    }
    EXPECT_EQ(in[2].defined(), need.size() > 2 && in[2].defined());
    return out;
  }
};

Tensor f64(const std::vector<double>& v) {
  return Tensor::from_vec(v, Shape{v.size()}, Device::cpu());
}

std::vector<double> values(const Tensor& t) {
  return t.to_dtype(DType::F64).flatten_all().to_vec1<double>();
}

// |a - b| <= a few f64 roundings of |b|.
void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rel = 8) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], rel * numerics::unit_roundoff(DType::F64) * (std::abs(b[i]) + 1e-300))
        << "at " << i;
  }
}

TEST(CustomOp, CpuKernelRunsAndMatchesTheReference) {
  std::vector<double> x = random_values(16), w = random_values(16);
  reset_counts();
  Tensor y = wick::apply(SquareScale(), {f64(x), f64(w)})[0];
  EXPECT_EQ(g_kernel_calls, 1);
  EXPECT_EQ(g_fallback_calls, 0);
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] * x[i] * w[i];
  expect_close(values(y), want, 2);
}

TEST(CustomOp, FallbackRunsWhereTheKernelDeclines) {
  std::vector<double> x = random_values(16), w = random_values(16);
  reset_counts();
  Tensor y = wick::apply(SquareScale(4), {f64(x), f64(w)})[0];
  EXPECT_EQ(g_kernel_calls, 0);
  EXPECT_EQ(g_fallback_calls, 1);
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] * x[i] * w[i];
  expect_close(values(y), want, 2);
}

TEST(CustomOp, FallbackRunsWithoutAKernel) {
  std::vector<double> a = random_values(8), b = random_values(8);
  reset_counts();
  TensorList r = wick::apply(SumDiff(), {f64(a), f64(b), Tensor()});
  EXPECT_EQ(g_fallback_calls, 1);
  ASSERT_EQ(r.size(), 2u);
  std::vector<double> s = values(r[0]), d = values(r[1]);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(s[i], a[i] + b[i]);
    EXPECT_EQ(d[i], a[i] - b[i]);
  }
}

TEST(CustomOp, GradientThroughTheFallback) {
  std::vector<double> x = random_values(12), w = random_values(12);
  Tensor xt = f64(x).requires_grad(), wt = f64(w).requires_grad();
  reset_counts();
  Tensor y = wick::apply(SquareScale(), {xt, wt})[0];
  EXPECT_EQ(g_fallback_calls, 1);  // recorded by autograd
  EXPECT_EQ(g_kernel_calls, 0);
  GradStore g = y.sum_all().backward();
  std::vector<double> gx_want(x.size()), gw_want(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    gx_want[i] = 2 * x[i] * w[i];
    gw_want[i] = x[i] * x[i];
  }
  expect_close(values(*g.get(xt)), gx_want);
  expect_close(values(*g.get(wt)), gw_want);
}

TEST(CustomOp, OwnBackwardMatchesFiniteDifferences) {
  std::vector<double> x = random_values(10, 0.5, 2.0), c = random_values(10);
  Tensor xt = f64(x).requires_grad();
  reset_counts();
  Tensor y = wick::apply(Cube(), {xt})[0];
  EXPECT_EQ(g_kernel_calls, 1);  // the kernel runs under autograd too
  EXPECT_EQ(g_fallback_calls, 0);
  GradStore g = y.mul(f64(c)).sum_all().backward();
  std::vector<double> got = values(*g.get(xt));
  // loss(x) = sum c_i x_i^3; central differences of the op itself (no gradient recorded).
  const double h = 1e-5;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> up = x, down = x;
    up[i] += h;
    down[i] -= h;
    double lu = values(wick::apply(Cube(), {f64(up)})[0])[i] * c[i];
    double ld = values(wick::apply(Cube(), {f64(down)})[0])[i] * c[i];
    double fd = (lu - ld) / (2 * h);
    // Truncation h^2 |c| |x|, plus the cancellation of the difference.
    EXPECT_NEAR(got[i], fd, 1e-8 * (std::abs(c[i]) * 8 + 1)) << "at " << i;
  }
}

TEST(CustomOp, SeveralOutputsAndAnAbsentInput) {
  std::vector<double> a = random_values(6), b = random_values(6), c0 = random_values(6),
                      c1 = random_values(6);
  Tensor at = f64(a).requires_grad(), bt = f64(b).requires_grad();
  TensorList r = wick::apply(SumDiff(), {at, bt, Tensor()});
  GradStore g = r[0].mul(f64(c0)).add(r[1].mul(f64(c1))).sum_all().backward();
  std::vector<double> ga = values(*g.get(at)), gb = values(*g.get(bt));
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(ga[i], c0[i] + c1[i]);
    EXPECT_EQ(gb[i], c0[i] - c1[i]);
  }
  // With the optional input present, it gets the first output's gradient.
  Tensor bias = f64(random_values(6)).requires_grad();
  TensorList r2 = wick::apply(SumDiff(), {at, bt, bias});
  GradStore g2 = r2[0].mul(f64(c0)).sum_all().backward();
  std::vector<double> gbias = values(*g2.get(bias));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(gbias[i], c0[i]);
}

TEST(CustomOp, ErrorPaths) {
  EXPECT_THROW(wick::apply(SumDiff(), {Tensor(), Tensor(), Tensor()}), Error);
  EXPECT_THROW(wick::apply(SquareScale(), {f64({1, 2}), f64({1, 2, 3})}), ShapeMismatch);
}

// wick's own fused ops: their fallbacks (what runs where no kernel takes the inputs) and their
// CPU kernels against a float64 reference.
TEST(CustomOp, RmsNormFallbackAndKernelMatchTheReference) {
  const size_t rows = 3, d = 64;
  const double eps = 1e-5;
  std::vector<double> x = random_values(rows * d), w = random_values(d);
  Tensor xt = Tensor::from_vec(x, Shape{rows, d}, Device::cpu()).to_dtype(DType::F32);
  Tensor wt = f64(w).to_dtype(DType::F32);
  std::vector<double> xr = values(xt), wr = values(wt);  // the rounded inputs
  Tensor kernel = xt.rms_norm(wt, eps);
  Tensor composed = fused::NormOp(true, eps).fallback({xt, wt})[0];
  std::vector<double> k = values(kernel), c = values(composed);
  for (size_t r = 0; r < rows; ++r) {
    double ss = 0, sa = 0;
    for (size_t i = 0; i < d; ++i) {
      ss += xr[r * d + i] * xr[r * d + i];
      sa += std::abs(xr[r * d + i]);
    }
    double rms = std::sqrt(ss / d + eps);
    double m = sa / d / rms;
    for (size_t i = 0; i < d; ++i) {
      double z = xr[r * d + i] / rms, want = z * wr[i];
      double bound = numerics::norm_bound(DType::F32, d, want, z, wr[i], m);
      EXPECT_NEAR(k[r * d + i], want, bound);
      EXPECT_NEAR(c[r * d + i], want, bound);
    }
  }
}

TEST(CustomOp, RopeFallbackMatchesTheKernel) {
  // f64: the kernel and the composition both round each product and the sum once.
  const size_t b = 1, h = 2, s = 3, d = 8;
  std::vector<double> x = random_values(b * h * s * d), cs = random_values(s * d / 2),
                      sn = random_values(s * d / 2);
  Tensor xt = Tensor::from_vec(x, Shape{b, h, s, d}, Device::cpu());
  Tensor ct = Tensor::from_vec(cs, Shape{s, d / 2}, Device::cpu());
  Tensor st = Tensor::from_vec(sn, Shape{s, d / 2}, Device::cpu());
  for (bool interleaved : {false, true}) {
    std::vector<double> k = values(interleaved ? xt.rope_interleaved(ct, st) : xt.rope(ct, st));
    std::vector<double> c = values(fused::RopeOp(interleaved).fallback({xt, ct, st})[0]);
    std::vector<double> want(x.size()), mag(x.size());
    for (size_t row = 0; row < b * h * s; ++row) {
      size_t t = row % s;
      for (size_t i = 0; i < d / 2; ++i) {
        size_t ia = row * d + (interleaved ? 2 * i : i);
        size_t ib = row * d + (interleaved ? 2 * i + 1 : i + d / 2);
        double ci = cs[t * d / 2 + i], si = sn[t * d / 2 + i];
        want[ia] = x[ia] * ci - x[ib] * si;
        want[ib] = x[ib] * ci + x[ia] * si;
        mag[ia] = std::abs(x[ia] * ci) + std::abs(x[ib] * si);
        mag[ib] = std::abs(x[ib] * ci) + std::abs(x[ia] * si);
      }
    }
    // Two rounded products and their rounded sum, in the result and in the reference: each within
    // 2 u of the products' magnitudes.
    const double u = numerics::unit_roundoff(DType::F64);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(k[i], want[i], 4 * u * mag[i]) << "kernel at " << i;
      EXPECT_NEAR(c[i], want[i], 4 * u * mag[i]) << "fallback at " << i;
    }
  }
}

}  // namespace
