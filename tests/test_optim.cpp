// Optimizers: SGD (with and without momentum) and AdamW against updates computed by hand in
// double precision.

#include <cmath>

#include "test_util.h"

namespace wick {
namespace {

using testing::all_close;
using testing::random_values;
using testing::tensor_from;

const Device cpu = Device::cpu();

Tensor param(const std::vector<double>& v, DType dt = DType::F64) {
  return tensor_from(v, {v.size()}, dt).requires_grad();
}

GradStore grads_for(const Tensor& p, const std::vector<double>& g) {
  GradStore store;
  store.insert(p, tensor_from(g, {g.size()}, p.dtype()));
  return store;
}

TEST(SGDTest, PlainStep) {
  std::vector<double> p0 = random_values(6), g = random_values(6);
  Tensor p = param(p0);
  optim::SGD sgd({p}, 0.1);
  sgd.step(grads_for(p, g));
  std::vector<double> expected;
  for (size_t i = 0; i < p0.size(); ++i) expected.push_back(p0[i] - 0.1 * g[i]);
  EXPECT_TRUE(all_close(p.to_vec_f64(), expected, 1e-15, 1e-15));
  EXPECT_TRUE(p.is_tracked());  // still a leaf
  EXPECT_TRUE(grad_enabled());
}

TEST(SGDTest, MomentumOverThreeSteps) {
  std::vector<double> p0 = random_values(5);
  std::vector<std::vector<double>> gs{random_values(5), random_values(5), random_values(5)};
  Tensor p = param(p0);
  optim::SGD sgd({p}, 0.05, 0.9);
  std::vector<double> ref = p0, v(5, 0.0);
  for (size_t step = 0; step < gs.size(); ++step) {
    sgd.step(grads_for(p, gs[step]));
    for (size_t i = 0; i < 5; ++i) {
      v[i] = step == 0 ? gs[step][i] : 0.9 * v[i] + gs[step][i];
      ref[i] -= 0.05 * v[i];
    }
    EXPECT_TRUE(all_close(p.to_vec_f64(), ref, 1e-14, 1e-14)) << "step " << step;
  }
}

TEST(SGDTest, OnlyParametersWithGradientsMove) {
  std::vector<double> a0 = random_values(3), b0 = random_values(4);
  Tensor a = param(a0), b = param(b0);
  optim::SGD sgd({a, b}, 0.5, 0.5);
  sgd.step(grads_for(a, {1, 2, 3}));
  EXPECT_EQ(b.to_vec_f64(), b0);
  EXPECT_TRUE(all_close(a.to_vec_f64(), {a0[0] - 0.5, a0[1] - 1.0, a0[2] - 1.5}, 1e-15, 1e-15));
  sgd.step(GradStore{});
  EXPECT_EQ(b.to_vec_f64(), b0);
}

TEST(SGDTest, TrainsALinearFitFromBackward) {
  // y = 3x - 2 from exact samples: gradient descent on the mean squared error converges.
  Tensor xs = tensor_from({-1, -0.5, 0, 0.5, 1, 1.5}, {6}, DType::F32);
  Tensor ys = xs.affine(3, -2);
  Tensor w = Tensor::zeros({1}, DType::F32, cpu).requires_grad();
  Tensor b = Tensor::zeros({1}, DType::F32, cpu).requires_grad();
  optim::SGD sgd({w, b}, 0.1, 0.5);
  float first = 0, last = 0;
  for (int i = 0; i < 200; ++i) {
    Tensor loss = xs.broadcast_mul(w).broadcast_add(b).sub(ys).sqr().mean_all();
    (i == 0 ? first : last) = loss.to_scalar<float>();
    sgd.step(loss.backward());
  }
  EXPECT_LT(last, 1e-6f * first);
  EXPECT_NEAR(w.to_vec1<float>()[0], 3.0f, 1e-3f);
  EXPECT_NEAR(b.to_vec1<float>()[0], -2.0f, 1e-3f);
}

TEST(SGDTest, LearningRateAccessors) {
  Tensor p = param({1.0});
  optim::SGD sgd({p}, 0.1);
  EXPECT_EQ(sgd.lr(), 0.1);
  sgd.set_lr(1.0);
  EXPECT_EQ(sgd.lr(), 1.0);
  sgd.step(grads_for(p, {0.25}));
  EXPECT_EQ(p.to_vec_f64(), std::vector<double>{0.75});
}

TEST(SGDTest, Errors) {
  Tensor ints = tensor_from({1, 2}, {2}, DType::I64);
  EXPECT_THROW(optim::SGD({ints}, 0.1), UnsupportedDType);
  EXPECT_THROW(optim::SGD({Tensor()}, 0.1), Error);
  EXPECT_THROW(optim::SGD({param({1.0})}, -0.1), Error);
  EXPECT_THROW(optim::SGD({param({1.0})}, 0.1, -1), Error);
  EXPECT_THROW(optim::SGD({param({1.0})}, std::nan("")), Error);
}

// Reference AdamW (decoupled weight decay, bias-corrected moments), one parameter vector.
struct AdamRef {
  optim::AdamWOptions o;
  std::vector<double> p, m, v;
  int t = 0;
  void step(const std::vector<double>& g) {
    ++t;
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      double mh = m[i] / (1 - std::pow(o.beta1, t));
      double vh = v[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
    }
  }
};

TEST(AdamWTest, MatchesReferenceOverSeveralSteps) {
  optim::AdamWOptions options{
      .lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  std::vector<double> p0 = random_values(7);
  Tensor p = param(p0);
  optim::AdamW adam({p}, options);
  AdamRef ref{options, p0, {}, {}};
  for (int step = 0; step < 4; ++step) {
    std::vector<double> g = random_values(7);
    adam.step(grads_for(p, g));
    ref.step(g);
    EXPECT_TRUE(all_close(p.to_vec_f64(), ref.p, 1e-13, 1e-14)) << "step " << step;
  }
}

TEST(AdamWTest, DefaultsAndF32) {
  optim::AdamWOptions defaults;
  EXPECT_EQ(defaults.lr, 1e-3);
  EXPECT_EQ(defaults.beta1, 0.9);
  EXPECT_EQ(defaults.beta2, 0.999);
  EXPECT_EQ(defaults.eps, 1e-8);
  EXPECT_EQ(defaults.weight_decay, 0.01);
  std::vector<double> p0 = random_values(5);
  Tensor p = param(p0, DType::F32);
  optim::AdamW adam({p});
  std::vector<double> p0_f32;
  for (double x : p0) p0_f32.push_back(static_cast<float>(x));
  AdamRef ref{defaults, p0_f32, {}, {}};
  for (int step = 0; step < 3; ++step) {
    std::vector<double> g = random_values(5);
    std::vector<double> g_f32;
    for (double x : g) g_f32.push_back(static_cast<float>(x));
    adam.step(grads_for(p, g_f32));
    ref.step(g_f32);
  }
  EXPECT_EQ(p.dtype(), DType::F32);
  EXPECT_TRUE(all_close(p.to_vec_f64(), ref.p, 1e-5, 1e-6));
  adam.set_lr(0.5);
  EXPECT_EQ(adam.lr(), 0.5);
}

TEST(AdamWTest, FirstStepMovesEachWeightByAboutLr) {
  // With bias correction the first update is lr * g / (|g| + eps): about lr in size.
  Tensor p = param({1.0, -1.0, 0.5});
  optim::AdamW adam({p}, {.lr = 0.1, .weight_decay = 0});
  adam.step(grads_for(p, {2.0, -0.001, 30.0}));
  EXPECT_TRUE(all_close(p.to_vec_f64(), {0.9, -0.9, 0.4}, 1e-4, 1e-6));
}

TEST(AdamWTest, SkipsParametersWithoutGradients) {
  std::vector<double> b0 = random_values(3);
  Tensor a = param(random_values(3)), b = param(b0);
  optim::AdamW adam({a, b});
  adam.step(grads_for(a, random_values(3)));
  EXPECT_EQ(b.to_vec_f64(), b0);  // no weight decay either
}

TEST(AdamWTest, Errors) {
  Tensor ints = tensor_from({1, 2}, {2}, DType::U32);
  EXPECT_THROW(optim::AdamW({ints}), UnsupportedDType);
  EXPECT_THROW(optim::AdamW({Tensor()}), Error);
  EXPECT_THROW(optim::AdamW({param({1.0})}, {.lr = -1}), Error);
  EXPECT_THROW(optim::AdamW({param({1.0})}, {.beta1 = 1.0}), Error);
  EXPECT_THROW(optim::AdamW({param({1.0})}, {.beta2 = 1.5}), Error);
  EXPECT_THROW(optim::AdamW({param({1.0})}, {.eps = -1e-8}), Error);
  EXPECT_THROW(optim::AdamW({param({1.0})}, {.weight_decay = -0.1}), Error);
}

}  // namespace
}  // namespace wick
