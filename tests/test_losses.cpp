// Tensor::log_softmax and the losses of wick/loss.h (cross_entropy, nll, mse): values and
// gradients against float64 references written here from the definitions (the gradients also
// against central finite differences of those references), the stability of log_softmax far from
// 0, their errors, a small training run, and the optimizers' refusal of tensors that are not
// tracked leaves.

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <typeinfo>

#include "expect_error.h"
#include "test_util.h"

namespace wick {
namespace {

using testing::random_values;
using testing::tensor_from;
using testing::within_bounds;

const Device cpu = Device::cpu();

// ---- float64 references ----

// The flat offsets of every line along `dim` of a row-major `dims`, one vector per line.
std::vector<std::vector<size_t>> lines(const std::vector<size_t>& dims, size_t dim) {
  size_t inner = 1;
  for (size_t i = dim + 1; i < dims.size(); ++i) inner *= dims[i];
  size_t outer = 1;
  for (size_t i = 0; i < dim; ++i) outer *= dims[i];
  std::vector<std::vector<size_t>> out;
  for (size_t o = 0; o < outer; ++o) {
    for (size_t in = 0; in < inner; ++in) {
      std::vector<size_t> line;
      for (size_t j = 0; j < dims[dim]; ++j) line.push_back((o * dims[dim] + j) * inner + in);
      out.push_back(line);
    }
  }
  return out;
}

struct LogSoftmaxRef {
  std::vector<double> values;  // log_softmax
  std::vector<double> probs;   // softmax
  std::vector<double> spread;  // max - min of each element's line
};

LogSoftmaxRef ref_log_softmax(const std::vector<double>& x, const std::vector<size_t>& dims,
                              size_t dim) {
  LogSoftmaxRef r{std::vector<double>(x.size()), std::vector<double>(x.size()),
                  std::vector<double>(x.size())};
  for (const auto& line : lines(dims, dim)) {
    double m = -INFINITY, lo = INFINITY;
    for (size_t i : line) {
      m = std::max(m, x[i]);
      lo = std::min(lo, x[i]);
    }
    double s = 0;
    for (size_t i : line) s += std::exp(x[i] - m);
    for (size_t i : line) {
      r.values[i] = x[i] - m - std::log(s);
      r.probs[i] = std::exp(x[i] - m) / s;
      r.spread[i] = m - lo;
    }
  }
  return r;
}

// Cross-entropy of rows of `c` logits against `targets`: mean of logsumexp - x[target].
double ref_cross_entropy(const std::vector<double>& x, size_t c,
                         const std::vector<int64_t>& targets) {
  const size_t n = targets.size();
  auto ls = ref_log_softmax(x, {n, c}, 1).values;
  double sum = 0;
  for (size_t r = 0; r < n; ++r) sum -= ls[r * c + static_cast<size_t>(targets[r])];
  return sum / static_cast<double>(n);
}

double ref_mse(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return s / static_cast<double>(a.size());
}

// Central differences of f at x, step 1e-5 relative: truncation (h^2 / 6) |f'''| and rounding
// 2 u |f| / h are both below 1e-10 here, so 1e-8 (1 + |g|) separates them from any real error.
std::vector<double> finite_differences(const std::function<double(const std::vector<double>&)>& f,
                                       std::vector<double> x) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double h = 1e-5 * std::max(1.0, std::abs(x[i]));
    double keep = x[i];
    x[i] = keep + h;
    double up = f(x);
    x[i] = keep - h;
    double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

::testing::AssertionResult near_differences(const std::vector<double>& got,
                                            const std::vector<double>& fd) {
  return within_bounds(got, fd, [](size_t, double w) { return 1e-8 * (1 + std::abs(w)); });
}

std::vector<double> random_targets(size_t n, size_t c, std::vector<int64_t>& out) {
  std::vector<double> r = random_values(n, 0.0, static_cast<double>(c));
  out.clear();
  for (double v : r) out.push_back(std::min<int64_t>(static_cast<int64_t>(v), c - 1));
  return r;
}

// ---- log_softmax ----

TEST(LogSoftmax, MatchesReferenceOnEveryFloatDtypeAndDim) {
  const std::vector<size_t> dims{3, 5, 7};
  std::vector<double> v = random_values(105, -6.0, 6.0);
  for (DType dt : testing::float_dtypes()) {
    Tensor t = tensor_from(v, Shape(dims), dt);
    std::vector<double> x = t.to_vec_f64();  // the inputs as rounded to dt
    for (size_t d = 0; d < 3; ++d) {
      LogSoftmaxRef want = ref_log_softmax(x, dims, d);
      Tensor got = t.log_softmax(d);
      EXPECT_EQ(got.dtype(), dt);
      EXPECT_EQ(got.shape(), t.shape());
      EXPECT_TRUE(within_bounds(got.to_vec_f64(), want.values,
                                [&](size_t i, double w) {
                                  return numerics::log_softmax_bound(dt, dims[d], w,
                                                                     want.spread[i]);
                                }))
          << dt << " dim " << d;
    }
    // A strided view: the transpose of a (7, 5, 3) tensor along its first dim.
    Tensor tt = tensor_from(v, {7, 5, 3}, dt).transpose(0, 2);
    std::vector<double> xt = tt.contiguous().to_vec_f64();
    LogSoftmaxRef want = ref_log_softmax(xt, dims, 2);
    EXPECT_TRUE(within_bounds(
        tt.log_softmax(2).to_vec_f64(), want.values,
        [&](size_t i, double w) { return numerics::log_softmax_bound(dt, 7, w, want.spread[i]); }))
        << dt << " transposed";
  }
}

TEST(LogSoftmax, StaysFiniteFarFromZero) {
  // exp(1000) overflows and exp(-1000) underflows in every dtype: log(softmax(x)) gives -inf
  // where log_softmax gives the exact -1000 and -2000.
  std::vector<double> v{1000, 0, -1000, -1e4, -1e4 + 1, -1e4 + 2};
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor t = tensor_from(v, {2, 3}, dt);
    auto naive = t.softmax(1).log().to_vec_f64();
    EXPECT_TRUE(std::isinf(naive[2])) << dt;
    std::vector<double> x = t.to_vec_f64();
    LogSoftmaxRef want = ref_log_softmax(x, {2, 3}, 1);
    auto got = t.log_softmax(1).to_vec_f64();
    for (double g : got) EXPECT_TRUE(std::isfinite(g)) << dt;
    EXPECT_TRUE(within_bounds(got, want.values, [&](size_t i, double w) {
      return numerics::log_softmax_bound(dt, 3, w, want.spread[i]);
    })) << dt;
    EXPECT_EQ(got[0], 0.0);  // the maximum's own term: exp(0) = 1 among terms that vanish
    EXPECT_EQ(got[2], -2000.0);
  }
  // f16: exp(30000) overflows f32 too; the result -60000 is still an f16 value.
  Tensor h = tensor_from({30000, 29990, -30000}, {3}, DType::F16);
  auto got = h.log_softmax(0).to_vec_f64();
  LogSoftmaxRef want = ref_log_softmax(h.to_vec_f64(), {3}, 0);
  // The maximum's term (-4.5e-5) is below its bound, which then accepts zero: checked alone; the
  // two far ones under the zero guard of within_bounds.
  EXPECT_LE(std::abs(got[0] - want.values[0]),
            numerics::log_softmax_bound(DType::F16, 3, want.values[0], want.spread[0]));
  std::vector<double> far_got(got.begin() + 1, got.end());
  std::vector<double> far_want(want.values.begin() + 1, want.values.end());
  EXPECT_TRUE(within_bounds(far_got, far_want, [&](size_t i, double w) {
    return numerics::log_softmax_bound(DType::F16, 3, w, want.spread[i + 1]);
  }));
}

TEST(LogSoftmax, GradientMatchesReferenceAndFiniteDifferences) {
  const std::vector<size_t> dims{4, 6};
  std::vector<double> v = random_values(24, -3.0, 3.0), w = random_values(24);
  for (size_t d = 0; d < 2; ++d) {
    for (DType dt : {DType::F32, DType::F64}) {
      Tensor x = tensor_from(v, Shape(dims), dt).requires_grad();
      Tensor weights = tensor_from(w, Shape(dims), dt);
      GradStore g = x.log_softmax(d).mul(weights).sum_all().backward();
      std::vector<double> xs = x.to_vec_f64(), ws = weights.to_vec_f64();
      LogSoftmaxRef r = ref_log_softmax(xs, dims, d);
      // d/dx_i sum_j w_j log_softmax_j = w_i - p_i sum_j w_j (over x_i's line).
      std::vector<double> want(xs.size()), wsum(xs.size());
      for (const auto& line : lines(dims, d)) {
        double s = 0;
        for (size_t i : line) s += ws[i];
        for (size_t i : line) {
          want[i] = ws[i] - r.probs[i] * s;
          wsum[i] = std::abs(s);
        }
      }
      double uc = numerics::compute_roundoff(dt);
      EXPECT_TRUE(within_bounds(
          g.get(x)->to_vec_f64(), want,
          [&](size_t i, double wv) {
            // p_i's error (as softmax's) times |sum w|, the sum over the line, the subtraction.
            return numerics::softmax_bound(dt, dims[d], r.probs[i], r.spread[i]) * wsum[i] +
                   4 * uc * (std::abs(wv) + std::abs(ws[i]) + 2 * std::sqrt(dims[d]) * wsum[i]);
          }))
          << dt << " dim " << d;
      if (dt == DType::F64) {
        auto f = [&](const std::vector<double>& at) {
          auto ls = ref_log_softmax(at, dims, d).values;
          double s = 0;
          for (size_t i = 0; i < at.size(); ++i) s += ws[i] * ls[i];
          return s;
        };
        EXPECT_TRUE(near_differences(g.get(x)->to_vec_f64(), finite_differences(f, xs)))
            << "dim " << d;
      }
    }
  }
}

TEST(LogSoftmax, EmptyAndErrors) {
  Tensor e = Tensor::zeros({2, 0}, DType::F32, cpu);
  EXPECT_EQ(e.log_softmax(1).shape(), Shape({2, 0}));
  EXPECT_EQ(e.log_softmax(0).shape(), Shape({2, 0}));
  EXPECT_BAD(UnsupportedDType, "log_softmax: unsupported dtype i64",
             Tensor::arange(0, 4, cpu).log_softmax(0));
  EXPECT_BAD(IndexOutOfRange, "log_softmax: dim 2 out of range for shape [2, 0]", e.log_softmax(2));
  EXPECT_BAD(Error, "log_softmax", Tensor().log_softmax(0));
}

// ---- cross_entropy and nll ----

TEST(CrossEntropy, ValueAndGradientMatchReference) {
  struct Case {
    std::vector<size_t> logits_dims;
    DType target_dtype;
  };
  for (const Case& cs :
       {Case{{6, 5}, DType::I64}, Case{{2, 3, 4}, DType::U32}, Case{{1, 9}, DType::I64}}) {
    const size_t c = cs.logits_dims.back();
    const size_t n = Shape(cs.logits_dims).elem_count() / c;
    std::vector<size_t> target_dims(cs.logits_dims.begin(), cs.logits_dims.end() - 1);
    std::vector<int64_t> targets;
    random_targets(n, c, targets);
    std::vector<double> tv(targets.begin(), targets.end());
    Tensor t = tensor_from(tv, Shape(target_dims), cs.target_dtype);
    std::vector<double> v = random_values(n * c, -4.0, 4.0);
    for (DType dt : testing::float_dtypes()) {
      Tensor logits = tensor_from(v, Shape(cs.logits_dims), dt).requires_grad();
      Tensor loss = loss::cross_entropy(logits, t);
      EXPECT_EQ(loss.shape(), Shape({}));
      EXPECT_EQ(loss.dtype(), dt);
      std::vector<double> x = logits.to_vec_f64();
      LogSoftmaxRef r = ref_log_softmax(x, {n, c}, 1);
      double want = ref_cross_entropy(x, c, targets);
      // Each picked log_softmax within its bound, then their mean.
      double picked_err = 0, abs_sum = 0;
      for (size_t row = 0; row < n; ++row) {
        size_t i = row * c + static_cast<size_t>(targets[row]);
        picked_err += numerics::log_softmax_bound(dt, c, r.values[i], r.spread[i]);
        abs_sum += std::abs(r.values[i]);
      }
      EXPECT_TRUE(within_bounds({loss.to_vec_f64()[0]}, {want}, [&](size_t, double w) {
        return picked_err / n + numerics::mean_bound(dt, n, w, abs_sum);
      })) << dt;
      if (dt != DType::F32 && dt != DType::F64) continue;
      // d loss / d x[r, j] = (p[r, j] - [j == target[r]]) / n.
      std::vector<double> grad(x.size());
      for (size_t row = 0; row < n; ++row) {
        for (size_t j = 0; j < c; ++j) {
          size_t i = row * c + j;
          grad[i] = (r.probs[i] - (static_cast<int64_t>(j) == targets[row] ? 1.0 : 0.0)) / n;
        }
      }
      GradStore g = loss.backward();
      double uc = numerics::compute_roundoff(dt);
      EXPECT_TRUE(within_bounds(g.get(logits)->to_vec_f64(), grad, [&](size_t i, double w) {
        return numerics::softmax_bound(dt, c, r.probs[i], r.spread[i]) / n +
               4 * uc * (std::abs(w) + r.probs[i] / n) + numerics::underflow_floor(dt);
      })) << dt;
      if (dt == DType::F64) {
        auto f = [&](const std::vector<double>& at) { return ref_cross_entropy(at, c, targets); };
        EXPECT_TRUE(near_differences(g.get(logits)->to_vec_f64(), finite_differences(f, x)));
      }
    }
  }
}

TEST(Nll, ValueAndGradientMatchReference) {
  const size_t n = 7, c = 4;
  std::vector<int64_t> targets;
  random_targets(n, c, targets);
  Tensor t = Tensor::from_vec(targets, {n}, cpu);
  std::vector<double> v = random_values(n * c, -5.0, 0.0);
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor lp = tensor_from(v, {n, c}, dt).requires_grad();
    Tensor loss = loss::nll(lp, t);
    std::vector<double> x = lp.to_vec_f64();
    double want = 0, abs_sum = 0;
    for (size_t r = 0; r < n; ++r) {
      want -= x[r * c + static_cast<size_t>(targets[r])] / n;
      abs_sum += std::abs(x[r * c + static_cast<size_t>(targets[r])]);
    }
    EXPECT_TRUE(within_bounds({loss.to_vec_f64()[0]}, {want}, [&](size_t, double w) {
      return numerics::mean_bound(dt, n, w, abs_sum);
    })) << dt;
    std::vector<double> grad(n * c, 0.0);
    for (size_t r = 0; r < n; ++r) grad[r * c + static_cast<size_t>(targets[r])] = -1.0 / n;
    GradStore g = loss.backward();
    EXPECT_TRUE(within_bounds(g.get(lp)->to_vec_f64(), grad, [&](size_t, double w) {
      return 2 * numerics::unit_roundoff(dt) * std::abs(w);
    })) << dt;
  }
  // cross_entropy is nll of log_softmax.
  Tensor logits = tensor_from(random_values(n * c), {n, c}, DType::F64);
  EXPECT_NEAR(loss::cross_entropy(logits, t).to_scalar<double>(),
              loss::nll(logits.log_softmax(1), t).to_scalar<double>(), 1e-15);
}

TEST(Nll, NoRowsIsNaN) {
  Tensor lp = Tensor::zeros({0, 3}, DType::F32, cpu);
  Tensor t = Tensor::zeros({0}, DType::I64, cpu);
  EXPECT_TRUE(std::isnan(loss::nll(lp, t).to_scalar<float>()));
  EXPECT_TRUE(std::isnan(loss::cross_entropy(lp, t).to_scalar<float>()));
}

TEST(CrossEntropy, Errors) {
  Tensor logits = Tensor::zeros({4, 3}, DType::F32, cpu);
  Tensor t = Tensor::from_vec({0, 1, 2, 1}, {4}, cpu);
  EXPECT_BAD(ShapeMismatch, "cross_entropy: targets [3] do not fit scores [4, 3]",
             loss::cross_entropy(logits, Tensor::from_vec({0, 1, 2}, {3}, cpu)));
  EXPECT_BAD(ShapeMismatch, "nll: targets [4, 1] do not fit scores [4, 3]",
             loss::nll(logits, t.reshape({4, 1})));
  EXPECT_BAD(ShapeMismatch, "do not fit scores []",
             loss::cross_entropy(Tensor::scalar(1.0f, cpu), Tensor::scalar(0, cpu)));
  EXPECT_BAD(UnsupportedDType, "cross_entropy: targets must be class ids (u32 or i64), got f32",
             loss::cross_entropy(logits, Tensor::zeros({4}, DType::F32, cpu)));
  EXPECT_BAD(UnsupportedDType, "nll: scores must be a float dtype, got i64",
             loss::nll(Tensor::zeros({4, 3}, DType::I64, cpu), t));
  EXPECT_BAD(IndexOutOfRange, "cross_entropy: a target is not a class id below 3",
             loss::cross_entropy(logits, Tensor::from_vec({0, 1, 3, 1}, {4}, cpu)));
  EXPECT_BAD(IndexOutOfRange, "nll: a target is not a class id below 3",
             loss::nll(logits, Tensor::from_vec({0, -1, 2, 1}, {4}, cpu)));
  EXPECT_BAD(Error, "cross_entropy", loss::cross_entropy(Tensor(), t));
}

// ---- mse ----

TEST(Mse, ValueAndGradientMatchReference) {
  std::vector<double> av = random_values(30), bv = random_values(30);
  for (DType dt : testing::float_dtypes()) {
    Tensor a = tensor_from(av, {5, 6}, dt).requires_grad();
    Tensor b = tensor_from(bv, {5, 6}, dt).requires_grad();
    Tensor loss = loss::mse(a, b);
    EXPECT_EQ(loss.shape(), Shape({}));
    std::vector<double> x = a.to_vec_f64(), y = b.to_vec_f64();
    double want = ref_mse(x, y);
    double uc = numerics::compute_roundoff(dt);
    // (a - b) and its square rounded to T (3 u_T relative to each term), then a 30-long mean.
    EXPECT_TRUE(within_bounds({loss.to_vec_f64()[0]}, {want}, [&](size_t, double w) {
      return numerics::mean_bound(dt, 30, w, w * 30) + 3 * numerics::unit_roundoff(dt) * w;
    })) << dt;
    if (dt != DType::F32 && dt != DType::F64) continue;
    GradStore g = loss.backward();
    std::vector<double> ga(30), gb(30);
    for (size_t i = 0; i < 30; ++i) {
      ga[i] = 2 * (x[i] - y[i]) / 30;
      gb[i] = -ga[i];
    }
    auto bound = [&](size_t, double w) { return 6 * uc * std::abs(w); };
    EXPECT_TRUE(within_bounds(g.get(a)->to_vec_f64(), ga, bound)) << dt;
    EXPECT_TRUE(within_bounds(g.get(b)->to_vec_f64(), gb, bound)) << dt;
    if (dt == DType::F64) {
      auto f = [&](const std::vector<double>& at) { return ref_mse(at, y); };
      EXPECT_TRUE(near_differences(g.get(a)->to_vec_f64(), finite_differences(f, x)));
    }
  }
}

TEST(Mse, Errors) {
  Tensor a = Tensor::zeros({2, 3}, DType::F32, cpu);
  EXPECT_BAD(ShapeMismatch, "mse: shapes differ, a [2, 3], b [3, 2]",
             loss::mse(a, Tensor::zeros({3, 2}, DType::F32, cpu)));
  EXPECT_BAD(UnsupportedDType, "mse: unsupported dtype i64",
             loss::mse(Tensor::zeros({2}, DType::I64, cpu), Tensor::zeros({2}, DType::I64, cpu)));
  EXPECT_BAD(DTypeMismatch, "mse", loss::mse(a, Tensor::zeros({2, 3}, DType::F64, cpu)));
  EXPECT_TRUE(
      std::isnan(loss::mse(Tensor::zeros({0}, DType::F32, cpu), Tensor::zeros({0}, DType::F32, cpu))
                     .to_scalar<float>()));
}

// ---- training ----

TEST(Training, SoftmaxRegressionLearnsThreeClusters) {
  // 3 clusters of 20 points around (2, 0), (-1, 1.7), (-1, -1.7); AdamW on cross_entropy.
  const size_t per = 20, n = 3 * per;
  const double centers[3][2] = {{2, 0}, {-1, 1.7}, {-1, -1.7}};
  std::vector<double> noise = random_values(2 * n, -0.5, 0.5), xs(2 * n);
  std::vector<int64_t> labels(n);
  for (size_t i = 0; i < n; ++i) {
    labels[i] = static_cast<int64_t>(i / per);
    xs[2 * i] = centers[i / per][0] + noise[2 * i];
    xs[2 * i + 1] = centers[i / per][1] + noise[2 * i + 1];
  }
  Tensor x = tensor_from(xs, {n, 2}, DType::F32), y = Tensor::from_vec(labels, {n}, cpu);
  Tensor w = Tensor::zeros({2, 3}, DType::F32, cpu).requires_grad();
  Tensor b = Tensor::zeros({1, 3}, DType::F32, cpu).requires_grad();
  optim::AdamW opt({w, b}, {.lr = 0.1, .weight_decay = 0});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = loss::cross_entropy(x.matmul(w).broadcast_add(b), y);
    if (step == 0) first = loss.to_scalar<float>();
    last = loss.to_scalar<float>();
    opt.step(loss.backward());
  }
  EXPECT_NEAR(first, std::log(3.0), 1e-6);  // all-zero weights: uniform over 3 classes
  EXPECT_LT(last, 0.1);
  auto predicted = x.matmul(w).broadcast_add(b).argmax(1).to_vec1<uint32_t>();
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(predicted[i], static_cast<uint32_t>(labels[i])) << i;
}

TEST(Optimizers, RefuseTensorsThatAreNotTrackedLeaves) {
  Tensor plain = Tensor::zeros({2}, DType::F32, cpu);
  Tensor leaf = plain.requires_grad();
  Tensor result = leaf.affine(2, 0);
  EXPECT_BAD(Error, "SGD: parameter 1 [2] is not a tracked leaf (it does not track gradients)",
             optim::SGD({leaf, plain}, 0.1));
  EXPECT_BAD(Error, "AdamW: parameter 0 [2] is not a tracked leaf (it is the result of an op)",
             optim::AdamW({result}));
  EXPECT_BAD(Error, "pass the tensor returned by requires_grad()", optim::SGD({plain}, 0.1));
  EXPECT_BAD(Error, "not a tracked leaf", optim::AdamW({leaf.detach()}));
  // A leaf steps.
  optim::SGD sgd({leaf}, 0.5);
  sgd.step(leaf.sqr().sum_all().backward());
  EXPECT_EQ(leaf.to_vec1<float>(), (std::vector<float>{0, 0}));
  Tensor moving = Tensor::from_vec({1.0f, -1.0f}, {2}, cpu).requires_grad();
  optim::SGD sgd2({moving}, 0.25);
  sgd2.step(moving.sqr().sum_all().backward());  // x - 0.25 * 2x
  EXPECT_EQ(moving.to_vec1<float>(), (std::vector<float>{0.5f, -0.5f}));
}

}  // namespace
}  // namespace wick
