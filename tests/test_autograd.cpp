// Autograd: finite-difference checks (f64, CPU) of the gradient of every differentiable op, on
// contiguous, transposed, narrowed and broadcast inputs; recording rules; GradStore; deep graphs;
// release of intermediate gradients.

#include <pthread.h>

#include <cmath>
#include <functional>
#include <thread>

#include "../src/backprop_stats.h"
#include "test_util.h"

namespace wick {
namespace {

using testing::all_close;
using testing::random_tensor;
using testing::random_values;
using testing::tensor_from;

const Device cpu = Device::cpu();

// How a leaf's elements sit in memory.
enum class Form { Contiguous, Transposed, Narrowed };

const char* form_name(Form f) {
  switch (f) {
    case Form::Contiguous:
      return "contiguous";
    case Form::Transposed:
      return "transposed";
    case Form::Narrowed:
      return "narrowed";
  }
  return "?";
}

struct Arg {
  Shape shape;
  Form form = Form::Contiguous;
  double lo = -2.0;
  double hi = 2.0;
};

// A tensor holding `values` (row-major for `shape`) laid out as `form` says.
Tensor make_input(const std::vector<double>& values, const Shape& shape, Form form) {
  Tensor base = Tensor::from_vec(values, shape, cpu);
  switch (form) {
    case Form::Contiguous:
      return base;
    case Form::Transposed:
      return base.t().copy().t();  // storage holds the transpose
    case Form::Narrowed: {
      size_t last = shape.rank() - 1;
      std::vector<size_t> pad_dims = shape.dims();
      pad_dims[last] = 2;
      Tensor pad = random_tensor(Shape(pad_dims), DType::F64);
      return Tensor::cat({pad, base, pad}, last).narrow(last, 2, shape[last]);
    }
  }
  return base;
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks the gradients of sum(f(inputs) * w), w random, against central differences.
void check_gradients(const std::vector<Arg>& args, const Fn& f, double rtol = 1e-6,
                     double atol = 1e-7) {
  std::vector<std::vector<double>> values;
  for (const Arg& a : args) values.push_back(random_values(a.shape.elem_count(), a.lo, a.hi));
  auto build = [&](bool track) {
    std::vector<Tensor> xs;
    for (size_t k = 0; k < args.size(); ++k) {
      Tensor x = make_input(values[k], args[k].shape, args[k].form);
      xs.push_back(track ? x.requires_grad() : x);
    }
    return xs;
  };
  std::vector<Tensor> xs = build(true);
  for (size_t k = 0; k < args.size(); ++k) {
    if (args[k].form != Form::Contiguous && xs[k].elem_count() > 1) {
      ASSERT_FALSE(xs[k].is_contiguous()) << "input " << k << " should be strided";
    }
  }
  Tensor y = f(xs);
  ASSERT_TRUE(y.is_tracked());
  Tensor w = tensor_from(random_values(y.elem_count(), -1.5, 1.5), y.shape(), DType::F64);
  GradStore grads = y.mul(w).sum_all().backward();

  auto loss_at = [&]() {
    NoGradGuard no_grad;
    return f(build(false)).mul(w).sum_all().to_scalar<double>();
  };
  const double h = 1e-6;
  for (size_t k = 0; k < args.size(); ++k) {
    std::optional<Tensor> g = grads.get(xs[k]);
    ASSERT_TRUE(g.has_value()) << "no gradient for input " << k;
    EXPECT_EQ(g->shape(), xs[k].shape()) << "input " << k;
    EXPECT_EQ(g->dtype(), DType::F64) << "input " << k;
    EXPECT_EQ(g->device(), cpu) << "input " << k;
    std::vector<double> numeric(values[k].size());
    for (size_t i = 0; i < values[k].size(); ++i) {
      double saved = values[k][i];
      values[k][i] = saved + h;
      double up = loss_at();
      values[k][i] = saved - h;
      double down = loss_at();
      values[k][i] = saved;
      numeric[i] = (up - down) / (2 * h);
    }
    EXPECT_TRUE(all_close(g->to_vec_f64(), numeric, rtol, atol)) << "input " << k;
  }
}

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  double lo = -2.0;
  double hi = 2.0;
};

TEST(AutogradGradients, UnaryOps) {
  std::vector<UnaryCase> cases{
      {"neg", [](const Tensor& x) { return x.neg(); }},
      {"abs", [](const Tensor& x) { return x.abs(); }},
      {"exp", [](const Tensor& x) { return x.exp(); }},
      {"log", [](const Tensor& x) { return x.log(); }, 0.2, 2.0},
      {"sqrt", [](const Tensor& x) { return x.sqrt(); }, 0.2, 2.0},
      {"sqr", [](const Tensor& x) { return x.sqr(); }},
      {"recip", [](const Tensor& x) { return x.recip(); }, 0.5, 2.0},
      {"tanh", [](const Tensor& x) { return x.tanh(); }},
      {"sin", [](const Tensor& x) { return x.sin(); }},
      {"cos", [](const Tensor& x) { return x.cos(); }},
      {"relu", [](const Tensor& x) { return x.relu(); }},
      {"silu", [](const Tensor& x) { return x.silu(); }},
      {"sigmoid", [](const Tensor& x) { return x.sigmoid(); }},
      {"gelu", [](const Tensor& x) { return x.gelu(); }, -4.0, 4.0},
      {"gelu_erf", [](const Tensor& x) { return x.gelu_erf(); }, -4.0, 4.0},
      {"affine", [](const Tensor& x) { return x.affine(1.5, -0.25); }},
      {"powf", [](const Tensor& x) { return x.powf(2.5); }, 0.2, 2.0},
      {"powf_negative", [](const Tensor& x) { return x.powf(-1.5); }, 0.5, 2.0},
      {"clamp", [](const Tensor& x) { return x.clamp(-0.5, 0.8); }},
      {"erf", [](const Tensor& x) { return x.erf(); }},
      // Piecewise constant: inputs kept away from the steps, where the difference quotient jumps.
      {"floor", [](const Tensor& x) { return x.floor(); }, 0.1, 0.9},
      {"ceil", [](const Tensor& x) { return x.ceil(); }, 1.1, 1.9},
      {"round", [](const Tensor& x) { return x.round(); }, 0.6, 1.4},
      {"sign", [](const Tensor& x) { return x.sign(); }, 0.2, 2.0},
      {"softplus", [](const Tensor& x) { return x.softplus(); }, -4.0, 4.0},
      {"log1p", [](const Tensor& x) { return x.log1p(); }, -0.5, 2.0},
      {"expm1", [](const Tensor& x) { return x.expm1(); }},
      {"elu", [](const Tensor& x) { return x.elu(0.7); }},
  };
  for (const auto& c : cases) {
    for (Form form : {Form::Contiguous, Form::Transposed, Form::Narrowed}) {
      SCOPED_TRACE(std::string(c.name) + " " + form_name(form));
      check_gradients({{{3, 4}, form, c.lo, c.hi}},
                      [&](const std::vector<Tensor>& x) { return c.f(x[0]); });
    }
  }
}

TEST(AutogradGradients, GeluErfExactValues) {
  // Includes x = 0, where the gradient formula must not divide by zero, and large |x|.
  std::vector<double> xs{0.0, -10.0, -3.0, -0.5, 1e-8, 0.7, 3.0, 10.0};
  Tensor x = Tensor::from_vec(xs, {xs.size()}, cpu).requires_grad();
  GradStore grads = x.gelu_erf().sum_all().backward();
  std::vector<double> expected;
  for (double v : xs) {
    expected.push_back(0.5 * (1 + std::erf(v / std::sqrt(2.0))) +
                       v * std::exp(-v * v / 2) / std::sqrt(2 * M_PI));
  }
  EXPECT_TRUE(all_close(grads.get(x)->to_vec_f64(), expected, 1e-9, 1e-12));
}

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> f;
  double rhs_lo = -2.0;
};

TEST(AutogradGradients, BinaryOps) {
  std::vector<BinaryCase> cases{
      {"add", [](const Tensor& a, const Tensor& b) { return a.add(b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a.sub(b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a.mul(b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return a.div(b); }, 0.5},
      {"maximum", [](const Tensor& a, const Tensor& b) { return a.maximum(b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return a.minimum(b); }},
  };
  std::vector<std::pair<Form, Form>> forms{{Form::Contiguous, Form::Contiguous},
                                           {Form::Transposed, Form::Narrowed},
                                           {Form::Narrowed, Form::Transposed}};
  for (const auto& c : cases) {
    for (auto [fa, fb] : forms) {
      SCOPED_TRACE(std::string(c.name) + " " + form_name(fa) + " " + form_name(fb));
      check_gradients({{{3, 4}, fa}, {{3, 4}, fb, c.rhs_lo, 2.0}},
                      [&](const std::vector<Tensor>& x) { return c.f(x[0], x[1]); });
    }
  }
}

TEST(AutogradGradients, BroadcastBinaryOps) {
  struct Case {
    const char* name;
    Shape a, b;
    std::function<Tensor(const Tensor&, const Tensor&)> f;
    double rhs_lo = -2.0;
  };
  std::vector<Case> cases{
      {"broadcast_add", {3, 1}, {1, 4}, [](auto& a, auto& b) { return a.broadcast_add(b); }},
      {"broadcast_sub", {2, 3, 4}, {4}, [](auto& a, auto& b) { return a.broadcast_sub(b); }},
      {"broadcast_mul", {3, 4}, {3, 1}, [](auto& a, auto& b) { return a.broadcast_mul(b); }},
      {"broadcast_div",
       {2, 3, 4},
       {3, 4},
       [](auto& a, auto& b) { return a.broadcast_div(b); },
       0.5},
      {"broadcast_maximum",
       {2, 1, 4},
       {3, 1},
       [](auto& a, auto& b) { return a.broadcast_maximum(b); }},
      {"broadcast_minimum", {4}, {3, 4}, [](auto& a, auto& b) { return a.broadcast_minimum(b); }},
      {"operator+", {3, 4}, {4}, [](auto& a, auto& b) { return a + b; }},
      {"operator-", {3, 1}, {3, 4}, [](auto& a, auto& b) { return a - b; }},
      {"operator*", {1, 4}, {3, 1}, [](auto& a, auto& b) { return a * b; }},
      {"operator/", {3, 4}, {3, 1}, [](auto& a, auto& b) { return a / b; }, 0.5},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    check_gradients({{c.a}, {c.b, Form::Contiguous, c.rhs_lo, 2.0}},
                    [&](const std::vector<Tensor>& x) { return c.f(x[0], x[1]); });
  }
  // A strided operand under broadcasting.
  check_gradients({{{4, 3}, Form::Transposed}, {{3, 1}, Form::Contiguous}},
                  [](const std::vector<Tensor>& x) { return x[0].t().broadcast_mul(x[1]); });
}

TEST(AutogradGradients, ScalarOperators) {
  check_gradients({{{3, 4}}}, [](const std::vector<Tensor>& x) { return x[0] * 2.5 + 1.0; });
  check_gradients({{{3, 4}}}, [](const std::vector<Tensor>& x) { return 1.0 - x[0] / 3.0; });
  check_gradients({{{3, 4}, Form::Contiguous, 0.5, 2.0}},
                  [](const std::vector<Tensor>& x) { return 2.0 / x[0] - (3.0 * x[0] - 1.0); });
  check_gradients({{{3, 4}}}, [](const std::vector<Tensor>& x) { return -x[0]; });
}

TEST(AutogradGradients, SameTensorOnBothSides) {
  check_gradients({{{3, 4}}}, [](const std::vector<Tensor>& x) { return x[0].mul(x[0]); });
  check_gradients({{{3, 4}, Form::Transposed, 0.5, 2.0}},
                  [](const std::vector<Tensor>& x) { return x[0].div(x[0].sqr()).add(x[0]); });
  // a.matmul(a): one storage read twice.
  check_gradients({{{4, 4}}}, [](const std::vector<Tensor>& x) { return x[0].matmul(x[0]); });
}

TEST(AutogradGradients, MaximumTieSplitsTheGradient) {
  Tensor x = random_tensor({5}, DType::F64).requires_grad();
  GradStore grads = x.maximum(x).sum_all().backward();
  EXPECT_EQ(grads.get(x)->to_vec_f64(), std::vector<double>(5, 1.0));
  // max over a dim with a tie: the tied elements share the gradient.
  Tensor y = Tensor::from_vec(std::vector<double>{1, 3, 3, 2}, {4}, cpu).requires_grad();
  EXPECT_EQ(y.max(0).backward().get(y)->to_vec_f64(), (std::vector<double>{0, 0.5, 0.5, 0}));
}

TEST(AutogradGradients, Reductions) {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
  };
  std::vector<Case> cases{
      {"sum(1)", [](const Tensor& x) { return x.sum({1}); }},
      {"sum(0,2)",
       [](const Tensor& x) {
         return x.sum({0, 2});
       }},
      {"sum_keepdim(1)", [](const Tensor& x) { return x.sum_keepdim({1}); }},
      {"sum_keepdim(2,0)",
       [](const Tensor& x) {
         return x.sum_keepdim({2, 0});
       }},
      {"mean(0)", [](const Tensor& x) { return x.mean({0}); }},
      {"mean_keepdim(1,2)",
       [](const Tensor& x) {
         return x.mean_keepdim({1, 2});
       }},
      {"sum_all", [](const Tensor& x) { return x.sum_all(); }},
      {"mean_all", [](const Tensor& x) { return x.mean_all(); }},
      {"max(1)", [](const Tensor& x) { return x.max(1); }},
      {"max_keepdim(0)", [](const Tensor& x) { return x.max_keepdim(0); }},
      {"max_keepdim(2)", [](const Tensor& x) { return x.max_keepdim(2); }},
      {"min(2)", [](const Tensor& x) { return x.min(2); }},
      {"min_keepdim(1)", [](const Tensor& x) { return x.min_keepdim(1); }},
  };
  for (const auto& c : cases) {
    for (Form form : {Form::Contiguous, Form::Transposed, Form::Narrowed}) {
      SCOPED_TRACE(std::string(c.name) + " " + form_name(form));
      check_gradients({{{2, 3, 4}, form}}, [&](const std::vector<Tensor>& x) { return c.f(x[0]); });
    }
  }
}

TEST(AutogradGradients, Softmax) {
  for (Form form : {Form::Contiguous, Form::Transposed, Form::Narrowed}) {
    SCOPED_TRACE(form_name(form));
    for (size_t dim : {0, 1, 2}) {
      check_gradients({{{2, 3, 4}, form}},
                      [&](const std::vector<Tensor>& x) { return x[0].softmax(dim); });
    }
  }
  // log-softmax written with max, exp, sum and log, as a classifier uses it.
  check_gradients({{{5, 3}}}, [](const std::vector<Tensor>& x) {
    Tensor m = x[0].max_keepdim(1);
    Tensor shifted = x[0].broadcast_sub(m);
    return shifted.broadcast_sub(shifted.exp().sum_keepdim({1}).log());
  });
}

TEST(AutogradGradients, Views) {
  struct Case {
    const char* name;
    Shape shape;
    std::function<Tensor(const Tensor&)> f;
  };
  std::vector<Case> cases{
      {"narrow", {3, 5}, [](const Tensor& x) { return x.narrow(1, 1, 3); }},
      {"narrow_start", {4, 3}, [](const Tensor& x) { return x.narrow(0, 0, 2); }},
      {"narrow_end", {4, 3}, [](const Tensor& x) { return x.narrow(0, 2, 2); }},
      {"narrow_all", {4, 3}, [](const Tensor& x) { return x.narrow(0, 0, 4).sqr(); }},
      {"transpose", {2, 3, 4}, [](const Tensor& x) { return x.transpose(0, 2); }},
      {"t", {3, 4}, [](const Tensor& x) { return x.t(); }},
      {"permute",
       {2, 3, 4},
       [](const Tensor& x) {
         return x.permute({2, 0, 1});
       }},
      {"reshape",
       {2, 3, 4},
       [](const Tensor& x) {
         return x.reshape({4, 6});
       }},
      {"broadcast_as",
       {3, 1},
       [](const Tensor& x) {
         return x.broadcast_as({2, 3, 4});
       }},
      {"broadcast_left", {3, 4}, [](const Tensor& x) { return x.broadcast_left({2}); }},
      {"squeeze", {3, 1}, [](const Tensor& x) { return x.squeeze(1); }},
      {"unsqueeze", {3, 4}, [](const Tensor& x) { return x.unsqueeze(1); }},
      {"get", {3, 4}, [](const Tensor& x) { return x.get(1); }},
      {"flatten_all", {3, 4}, [](const Tensor& x) { return x.flatten_all(); }},
      {"contiguous", {3, 4}, [](const Tensor& x) { return x.contiguous(); }},
      {"copy", {3, 4}, [](const Tensor& x) { return x.copy(); }},
      {"chain",
       {2, 3, 4},
       [](const Tensor& x) {
         return x.permute({1, 2, 0}).narrow(1, 1, 2).reshape({3, 4}).t();
       }},
  };
  for (const auto& c : cases) {
    for (Form form : {Form::Contiguous, Form::Transposed, Form::Narrowed}) {
      if (form == Form::Transposed && c.shape[c.shape.rank() - 1] == 1) continue;
      SCOPED_TRACE(std::string(c.name) + " " + form_name(form));
      check_gradients({{c.shape, form}}, [&](const std::vector<Tensor>& x) { return c.f(x[0]); });
    }
  }
}

TEST(AutogradGradients, CatAndStack) {
  check_gradients({{{3, 2}}, {{3, 4}, Form::Transposed}, {{3, 1}}},
                  [](const std::vector<Tensor>& x) {
                    return Tensor::cat({x[0], x[1], x[2]}, 1);
                  });
  check_gradients({{{2, 3}, Form::Narrowed}, {{1, 3}}}, [](const std::vector<Tensor>& x) {
    return Tensor::cat({x[0], x[1], x[0]}, 0);  // one input twice
  });
  check_gradients({{{2, 3}}, {{2, 3}, Form::Transposed}}, [](const std::vector<Tensor>& x) {
    return Tensor::stack({x[0], x[1]}, 0);
  });
  check_gradients({{{2, 3}}, {{2, 3}}}, [](const std::vector<Tensor>& x) {
    return Tensor::stack({x[0], x[1]}, 2);
  });
}

TEST(AutogradGradients, Indexing) {
  for (DType id_type : {DType::U32, DType::I64}) {
    SCOPED_TRACE(dtype_name(id_type));
    // Repeated ids: their gradients add up.
    Tensor rows = tensor_from({2, 0, 2, 3, 2}, {5}, id_type);
    check_gradients({{{4, 3}, Form::Transposed}},
                    [&](const std::vector<Tensor>& x) { return x[0].index_select(rows, 0); });
    Tensor cols = tensor_from({1, 1, 0}, {3}, id_type);
    check_gradients({{{2, 3, 2}}},
                    [&](const std::vector<Tensor>& x) { return x[0].index_select(cols, 1); });
    Tensor gather_ids = tensor_from({0, 2, 2, 1, 1, 1, 3, 0}, {2, 4}, id_type);
    check_gradients({{{2, 4}, Form::Narrowed}},
                    [&](const std::vector<Tensor>& x) { return x[0].gather(gather_ids, 1); });
    Tensor tokens = tensor_from({1, 4, 1, 0, 3, 4}, {2, 3}, id_type);
    check_gradients({{{5, 3}}},
                    [&](const std::vector<Tensor>& x) { return x[0].embedding(tokens); });
    Tensor add_ids = tensor_from({3, 0, 3}, {3}, id_type);
    check_gradients({{{4, 2}}, {{3, 2}, Form::Transposed}},
                    [&](const std::vector<Tensor>& x) { return x[0].index_add(add_ids, x[1], 0); });
    Tensor scatter_ids = tensor_from({0, 1, 1, 2, 2, 2}, {2, 3}, id_type);
    check_gradients({{{2, 4}}, {{2, 3}}}, [&](const std::vector<Tensor>& x) {
      return x[0].scatter_add(scatter_ids, x[1], 1);
    });
  }
}

TEST(AutogradGradients, WhereCond) {
  Tensor cond = random_tensor({3, 4}, DType::F64).gt(Tensor::zeros({}, DType::F64, cpu));
  check_gradients({{{3, 4}}, {{3, 4}, Form::Transposed}},
                  [&](const std::vector<Tensor>& x) { return cond.where_cond(x[0], x[1]); });
  // Broadcast branches.
  check_gradients({{{4}}, {{3, 1}}},
                  [&](const std::vector<Tensor>& x) { return cond.where_cond(x[0], x[1]); });
}

TEST(AutogradGradients, Matmul) {
  check_gradients({{{3, 4}}, {{4, 5}}},
                  [](const std::vector<Tensor>& x) { return x[0].matmul(x[1]); });
  check_gradients({{{3, 4}, Form::Transposed}, {{4, 5}, Form::Narrowed}},
                  [](const std::vector<Tensor>& x) { return x[0].matmul(x[1]); });
  check_gradients({{{2, 3, 4}, Form::Transposed}, {{2, 4, 2}}},
                  [](const std::vector<Tensor>& x) { return x[0].matmul(x[1]); });
  // Batch broadcasting: the gradient of a broadcast batch sums over it.
  check_gradients({{{2, 1, 3, 4}}, {{5, 4, 2}, Form::Transposed}},
                  [](const std::vector<Tensor>& x) { return x[0].broadcast_matmul(x[1]); });
  check_gradients({{{3, 4}}, {{2, 4, 2}}},
                  [](const std::vector<Tensor>& x) { return x[0].broadcast_matmul(x[1]); });
  // Only one side tracked.
  Tensor constant = random_tensor({4, 2}, DType::F64);
  check_gradients({{{3, 4}}}, [&](const std::vector<Tensor>& x) { return x[0].matmul(constant); });
}

TEST(AutogradGradients, TwoLayerClassifier) {
  Tensor labels = tensor_from({0, 2, 1, 2, 0, 1}, {6, 1}, DType::U32);
  check_gradients({{{6, 2}}, {{2, 5}}, {{5}}, {{5, 3}}, {{3}}}, [&](const std::vector<Tensor>& p) {
    Tensor h = p[0].matmul(p[1]).broadcast_add(p[2]).relu();
    Tensor logits = h.matmul(p[3]).broadcast_add(p[4]);
    Tensor m = logits.max_keepdim(1).detach();
    Tensor shifted = logits.broadcast_sub(m);
    Tensor logp = shifted.broadcast_sub(shifted.exp().sum_keepdim({1}).log());
    return logp.gather(labels, 1).mean_all().neg();
  });
}

TEST(AutogradGradients, ToDTypeCastsTheGradientBack) {
  Tensor x = random_tensor({3, 4}, DType::F32).requires_grad();
  std::vector<double> w = random_values(12);
  Tensor loss = x.to_dtype(DType::F64).mul(tensor_from(w, {3, 4}, DType::F64)).sum_all();
  std::optional<Tensor> g = loss.backward().get(x);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->dtype(), DType::F32);
  std::vector<double> expected;
  for (double v : w) expected.push_back(static_cast<float>(v));
  EXPECT_EQ(g->to_vec_f64(), expected);

  Tensor y = random_tensor({5}, DType::F64).requires_grad();
  std::optional<Tensor> gy = y.to_dtype(DType::BF16).sum_all().backward().get(y);
  ASSERT_TRUE(gy.has_value());
  EXPECT_EQ(gy->dtype(), DType::F64);
  EXPECT_EQ(gy->to_vec_f64(), std::vector<double>(5, 1.0));
}

TEST(AutogradGradients, EmptyTensor) {
  Tensor x = Tensor::zeros({0, 3}, DType::F64, cpu).requires_grad();
  std::optional<Tensor> g = x.sum_all().backward().get(x);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->shape(), Shape({0, 3}));
}

// Gradients in lower precision agree with the f64 ones.
TEST(AutogradGradients, FloatDTypesMatchF64) {
  std::vector<double> xv = random_values(12), wv = random_values(20), bv = random_values(5);
  auto grads_in = [&](DType dt) {
    Tensor x = tensor_from(xv, {3, 4}, dt).requires_grad();
    Tensor w = tensor_from(wv, {4, 5}, dt).requires_grad();
    Tensor b = tensor_from(bv, {5}, dt).requires_grad();
    Tensor y = x.matmul(w).broadcast_add(b).gelu().softmax(1).sqr().mean_all();
    GradStore g = y.backward();
    std::vector<std::vector<double>> out;
    for (const Tensor& t : {x, w, b}) {
      EXPECT_EQ(g.get(t)->dtype(), dt);
      out.push_back(g.get(t)->to_vec_f64());
    }
    return out;
  };
  auto ref = grads_in(DType::F64);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto got = grads_in(dt);
    double scale = 0;
    for (const auto& v : ref)
      for (double e : v) scale = std::max(scale, std::abs(e));
    for (size_t i = 0; i < ref.size(); ++i) {
      // A chain of five ops and their backward passes: 32 roundings of the dtype, relative to the
      // largest gradient.
      double u = numerics::unit_roundoff(dt);
      EXPECT_TRUE(all_close(got[i], ref[i], 0, 32 * u * scale)) << i;
    }
  }
}

// ---- recording rules ----

TEST(AutogradRecording, OnlyTrackedInputsRecord) {
  Tensor a = random_tensor({3}, DType::F32);
  Tensor b = random_tensor({3}, DType::F32);
  EXPECT_FALSE(a.is_tracked());
  Tensor c = a.add(b).exp().sum_all();
  EXPECT_FALSE(c.is_tracked());
  EXPECT_EQ(detail::graph_stats(c).ops, 0u);
  Tensor x = a.requires_grad();
  EXPECT_TRUE(x.is_tracked());
  EXPECT_TRUE(x.same_storage(a));
  EXPECT_TRUE(x.add(b).is_tracked());
  EXPECT_TRUE(b.add(x).is_tracked());
  EXPECT_TRUE(x.narrow(0, 1, 1).is_tracked());
}

TEST(AutogradRecording, NonDifferentiableOpsRecordNothing) {
  Tensor x = random_tensor({3, 4}, DType::F32).requires_grad();
  EXPECT_FALSE(x.argmax(1).is_tracked());
  EXPECT_FALSE(x.argmin_keepdim(0).is_tracked());
  EXPECT_FALSE(x.gt(x.sin()).is_tracked());
  EXPECT_FALSE(x.eq(x).is_tracked());
}

TEST(AutogradRecording, DetachCutsTheGraph) {
  Tensor x = random_tensor({4}, DType::F64).requires_grad();
  Tensor d = x.detach();
  EXPECT_FALSE(d.is_tracked());
  EXPECT_TRUE(d.same_storage(x));
  EXPECT_FALSE(d.affine(2, 0).is_tracked());
  // Only the tracked path contributes: d(2x + 3 detach(x)) / dx = 2.
  GradStore grads = x.affine(2, 0).add(d.affine(3, 0)).sum_all().backward();
  EXPECT_EQ(grads.get(x)->to_vec_f64(), std::vector<double>(4, 2.0));
  EXPECT_FALSE(grads.get(d).has_value());
}

TEST(AutogradRecording, NoGradGuardStopsRecording) {
  Tensor x = random_tensor({4}, DType::F32).requires_grad();
  EXPECT_TRUE(grad_enabled());
  {
    NoGradGuard outer;
    EXPECT_FALSE(grad_enabled());
    Tensor y = x.mul(x).sum_all();
    EXPECT_FALSE(y.is_tracked());
    EXPECT_THROW(y.backward(), Error);
    {
      NoGradGuard inner;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled());  // the inner guard restores "off", not "on"
    // The switch is per thread.
    bool other_thread = false;
    std::thread([&] { other_thread = grad_enabled() && x.exp().is_tracked(); }).join();
    EXPECT_TRUE(other_thread);
    EXPECT_TRUE(x.is_tracked());  // leaves stay leaves
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_TRUE(x.mul(x).is_tracked());
}

TEST(AutogradRecording, ContiguousOfRowMajorTensorAddsNoNode) {
  Tensor x = random_tensor({3, 4}, DType::F64).requires_grad();
  Tensor y = x.contiguous();
  EXPECT_EQ(y.id(), x.id());
  EXPECT_EQ(detail::graph_stats(x).ops, 0u);
  EXPECT_EQ(x.to_dtype(DType::F64).id(), x.id());
  GradStore grads = y.sum_all().backward();
  EXPECT_EQ(grads.get(x)->to_vec_f64(), std::vector<double>(12, 1.0));
}

// ---- backward ----

TEST(AutogradBackward, NonScalarLossThrows) {
  Tensor x = random_tensor({3, 2}, DType::F32).requires_grad();
  try {
    x.sqr().backward();
    FAIL() << "expected ShapeMismatch";
  } catch (const ShapeMismatch& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("backward", 0), 0u) << msg;
    EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  }
  EXPECT_THROW(x.sum({0}).backward(), ShapeMismatch);
  EXPECT_THROW(Tensor::zeros({0}, DType::F32, cpu).requires_grad().backward(), ShapeMismatch);
  // One element of any rank is a valid loss.
  Tensor y = random_tensor({1, 1}, DType::F32).requires_grad();
  EXPECT_EQ(y.sqr().backward().get(y)->shape(), Shape({1, 1}));
}

TEST(AutogradBackward, UntrackedOrEmptyLossThrows) {
  EXPECT_THROW(random_tensor({1}, DType::F32).backward(), Error);
  EXPECT_THROW(Tensor().backward(), Error);
}

TEST(AutogradBackward, LeafLossAndUnrelatedLeaves) {
  Tensor x = Tensor::scalar(3.0, cpu).requires_grad();
  Tensor unrelated = random_tensor({2}, DType::F64).requires_grad();
  GradStore grads = x.backward();
  EXPECT_EQ(grads.get(x)->to_scalar<double>(), 1.0);
  EXPECT_FALSE(grads.get(unrelated).has_value());
  EXPECT_EQ(grads.size(), 1u);
}

TEST(AutogradBackward, GradStoreHoldsLeavesAndHeldIntermediates) {
  Tensor x = random_tensor({3}, DType::F64).requires_grad();
  Tensor mid = x.sqr();  // held here, so its gradient is kept
  Tensor loss = mid.affine(3.0, 1.0).sum_all();
  GradStore grads = loss.backward();
  ASSERT_TRUE(grads.get(x).has_value());
  ASSERT_TRUE(grads.get(mid).has_value());
  EXPECT_EQ(grads.get(mid)->to_vec1<double>(), std::vector<double>(3, 3.0));
  // x, mid and the loss: the affine result nobody holds is released during backward.
  EXPECT_EQ(grads.size(), 3u);
  EXPECT_EQ(detail::last_backward_stats().leaf_grads, 1u);
}

TEST(AutogradBackward, RunsTwiceWithSameResult) {
  Tensor x = random_tensor({4}, DType::F64).requires_grad();
  Tensor loss = x.sin().mul(x).sum_all();
  auto first = loss.backward().get(x)->to_vec_f64();
  auto second = loss.backward().get(x)->to_vec_f64();
  EXPECT_EQ(first, second);
}

TEST(AutogradBackward, TenThousandOpChain) {
  Tensor x = random_tensor({4}, DType::F64, cpu, 0.5, 1.5).requires_grad();
  Tensor y = x;
  for (int i = 0; i < 10000; ++i) y = y.affine(1.0001, i % 2 ? 0.5 : -0.5);
  GradStore grads = y.sum_all().backward();
  EXPECT_EQ(detail::last_backward_stats().nodes, 10003u);  // leaf, chain, sum, reshape
  std::vector<double> expected(4, std::pow(1.0001, 10000));
  EXPECT_TRUE(all_close(grads.get(x)->to_vec_f64(), expected, 1e-9, 0));
  // Destroying the chain must not recurse once per op either.
  y = Tensor();
}

// Runs `f` on a thread with a `bytes` stack, so that recursion per op would overflow at once.
void run_with_stack(size_t bytes, const std::function<void()>& f) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, bytes);
  pthread_t thread;
  auto body = [](void* arg) -> void* {
    (*static_cast<const std::function<void()>*>(arg))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attr, body, const_cast<std::function<void()>*>(&f)), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
}

TEST(AutogradBackward, HundredThousandOpGraphOnASmallStack) {
  // 100,000 ops built, differentiated and freed on a 512 KiB stack.
  bool done = false;
  run_with_stack(512 << 10, [&] {
    Tensor x = random_tensor({1}, DType::F32).requires_grad();
    Tensor y = x;
    for (int i = 0; i < 100000; ++i) y = i % 2 ? y.neg() : y.affine(1.0, 0.0);
    EXPECT_EQ(y.sum_all().backward().get(x)->to_vec_f64(), std::vector<double>{1.0});
    EXPECT_EQ(detail::last_backward_stats().nodes, 100003u);
    y = Tensor();  // frees the whole graph
    EXPECT_TRUE(x.is_tracked());
    done = true;
  });
  EXPECT_TRUE(done);
}
TEST(AutogradBackward, IntermediateGradientsAreReleased) {
  const size_t n = 4096, depth = 100;
  Tensor x = random_tensor({n}, DType::F64, cpu, -1, 1).requires_grad();
  Tensor y = x;
  for (size_t i = 0; i < depth; ++i) y = i % 2 ? y.tanh() : y.affine(1.01, 0.1);
  GradStore grads = y.sum_all().backward();
  ASSERT_TRUE(grads.get(x).has_value());
  detail::BackwardStats stats = detail::last_backward_stats();
  // A chain needs the gradient in process and the one it produces: never one per op.
  EXPECT_LE(stats.peak_live_grads, 2u);
  EXPECT_LE(stats.peak_live_bytes, 2 * n * sizeof(double));
  EXPECT_GE(stats.peak_live_bytes, n * sizeof(double));
  EXPECT_EQ(stats.accumulations, 0u);  // each first contribution is moved in, never added to 0
}

TEST(AutogradBackward, SharedInputsAccumulate) {
  Tensor x = random_tensor({3}, DType::F64).requires_grad();
  Tensor a = x.sin();
  GradStore grads = a.mul(a.cos()).add(x).sum_all().backward();
  EXPECT_EQ(detail::last_backward_stats().accumulations, 2u);  // a twice, x twice
  std::vector<double> xv = x.to_vec_f64(), expected;
  for (double v : xv) {
    double s = std::sin(v), c = std::cos(v);
    // d/dx [sin x cos(sin x) + x]
    expected.push_back(c * std::cos(s) - s * std::sin(s) * c + 1);
  }
  EXPECT_TRUE(all_close(grads.get(x)->to_vec_f64(), expected, 1e-12, 1e-12));
}

TEST(AutogradBackward, GraphStatsCountWhatTheGraphHolds) {
  Tensor x = random_tensor({256}, DType::F32).requires_grad();
  Tensor y = x.exp().sin().sum_all();
  detail::GraphStats s = detail::graph_stats(y);
  EXPECT_EQ(s.ops, 4u);  // exp, sin, sum, reshape (a view)
  EXPECT_EQ(s.tensors, 5u);
  EXPECT_EQ(s.bytes, 3 * 256 * 4u + 4u);  // x, exp, sin, the sum (shared by its reshape view)
}

// ---- GradStore ----

TEST(GradStoreTest, InsertGetRemove) {
  Tensor a = random_tensor({2, 3}, DType::F32);
  Tensor b = random_tensor({2, 3}, DType::F32);
  GradStore store;
  EXPECT_EQ(store.size(), 0u);
  EXPECT_FALSE(store.get(a).has_value());
  store.insert(a, b);
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(store.get(a)->id(), b.id());
  Tensor c = b.affine(2, 0);
  store.insert(a, c);  // replaces
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(store.get(a)->id(), c.id());
  EXPECT_FALSE(store.get(b).has_value());
  EXPECT_FALSE(store.get(a.detach()).has_value());  // keyed by tensor id, not by storage
  std::optional<Tensor> removed = store.remove(a);
  ASSERT_TRUE(removed.has_value());
  EXPECT_EQ(removed->id(), c.id());
  EXPECT_EQ(store.size(), 0u);
  EXPECT_FALSE(store.remove(a).has_value());
}

TEST(GradStoreTest, InsertChecksShapeDTypeAndHandle) {
  Tensor a = random_tensor({2, 3}, DType::F32);
  GradStore store;
  EXPECT_THROW(store.insert(a, random_tensor({3, 2}, DType::F32)), ShapeMismatch);
  EXPECT_THROW(store.insert(a, random_tensor({2, 3}, DType::F64)), DTypeMismatch);
  EXPECT_THROW(store.insert(a, Tensor()), Error);
  EXPECT_EQ(store.size(), 0u);
}

}  // namespace
}  // namespace wick

namespace wick {
namespace {

TEST(AutogradBackward, EmptyMatmulGivesZeroGradients) {
  Tensor a = testing::random_tensor({3, 4}, DType::F64).requires_grad();
  Tensor b = Tensor::zeros({4, 0}, DType::F64, Device::cpu()).requires_grad();
  Tensor loss = a.matmul(b).sum_all();
  GradStore grads = loss.backward();
  ASSERT_TRUE(grads.get(a).has_value());
  EXPECT_EQ(grads.get(a)->shape(), Shape({3, 4}));
  EXPECT_EQ(grads.get(a)->to_vec_f64(), std::vector<double>(12, 0.0));
  ASSERT_TRUE(grads.get(b).has_value());
  EXPECT_EQ(grads.get(b)->shape(), Shape({4, 0}));
}

}  // namespace
}  // namespace wick
