// Autograd on CUDA: the gradients of every differentiable op match the CPU's for the same inputs,
// gradients cross devices through to_device, and intermediate gradients are released during
// backward (checked with the caching allocator's statistics).

#include <algorithm>
#include <functional>
#include <random>

#include "test_util.h"
#include "wick/cuda.h"

namespace wick {
namespace {

using testing::all_close;

enum class Form { Contiguous, Transposed, Narrowed };

struct Arg {
  Shape shape;
  Form form = Form::Contiguous;
  double lo = -2.0;
  double hi = 2.0;
};

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

std::vector<double> uniform(std::mt19937_64& gen, size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// `values` as a `shape` tensor of `dt` on `dev`, laid out as `form` says (built on the device).
Tensor make_input(const std::vector<double>& values, const Shape& shape, Form form, DType dt,
                  const Device& dev) {
  Tensor base = Tensor::from_vec(values, shape, Device::cpu()).to_dtype(dt).to_device(dev);
  switch (form) {
    case Form::Contiguous:
      return base;
    case Form::Transposed:
      return base.t().copy().t();
    case Form::Narrowed: {
      size_t last = shape.rank() - 1;
      std::vector<size_t> pad_dims = shape.dims();
      pad_dims[last] = 3;
      Tensor pad = Tensor::ones(Shape(pad_dims), dt, dev);
      return Tensor::cat({pad, base, pad}, last).narrow(last, 3, shape[last]);
    }
  }
  return base;
}

// Gradients of sum(f(inputs) * w) on `dev`, as f64 vectors; each lives on its input's device.
std::vector<std::vector<double>> grads_on(const Device& dev, DType dt, const std::vector<Arg>& args,
                                          const std::vector<std::vector<double>>& values,
                                          const std::vector<double>& w_values, const Fn& f) {
  std::vector<Tensor> xs;
  for (size_t k = 0; k < args.size(); ++k) {
    xs.push_back(make_input(values[k], args[k].shape, args[k].form, dt, dev).requires_grad());
  }
  Tensor y = f(xs);
  Tensor w = Tensor::from_vec(w_values, y.shape(), Device::cpu()).to_dtype(dt).to_device(dev);
  GradStore grads = y.mul(w).sum_all().backward();
  std::vector<std::vector<double>> out;
  for (size_t k = 0; k < xs.size(); ++k) {
    std::optional<Tensor> g = grads.get(xs[k]);
    EXPECT_TRUE(g.has_value()) << "no gradient for input " << k << " on " << dev;
    if (!g) return {};
    EXPECT_EQ(g->device(), xs[k].device());
    EXPECT_EQ(g->dtype(), dt);
    EXPECT_EQ(g->shape(), xs[k].shape());
    out.push_back(g->to_vec_f64());
  }
  return out;
}

void expect_same_gradients(const std::vector<Arg>& args, const Fn& f, DType dt = DType::F32) {
  static std::mt19937_64 gen(2024);
  std::vector<std::vector<double>> values;
  for (const Arg& a : args) values.push_back(uniform(gen, a.shape.elem_count(), a.lo, a.hi));
  size_t out_count;
  {
    NoGradGuard no_grad;
    std::vector<Tensor> xs;
    for (size_t k = 0; k < args.size(); ++k) {
      xs.push_back(make_input(values[k], args[k].shape, args[k].form, dt, Device::cpu()));
    }
    out_count = f(xs).elem_count();
  }
  std::vector<double> w = uniform(gen, out_count, -1.5, 1.5);
  auto cpu = grads_on(Device::cpu(), dt, args, values, w, f);
  auto gpu = grads_on(Device::cuda(), dt, args, values, w, f);
  ASSERT_EQ(cpu.size(), gpu.size());
  double rtol = dt == DType::F32 ? 1e-4 : 3e-2;
  for (size_t k = 0; k < cpu.size(); ++k) {
    EXPECT_TRUE(all_close(gpu[k], cpu[k], rtol, rtol)) << "input " << k;
  }
}

TEST(CudaAutograd, UnaryOps) {
  WICK_REQUIRE_GPU();
  // Every op without parameters, on its domain (within [-2, 2]) from the op table
  // (wick/unary_ops.def); those with parameters at sample values.
  std::vector<std::tuple<const char*, std::function<Tensor(const Tensor&)>, double, double>> cases{
#define WICK_UNARY_OP(K, name, dtypes, doc, rel_cpu, rel_cuda, abs, why, lo, hi, ...) \
  {#name, [](const Tensor& x) { return x.name(); }, std::max<double>(lo, -2),         \
   std::min<double>(hi, 2)},
#define WICK_UNARY_PARAM_OP(...)
#include "wick/unary_ops.def"
      {"affine", [](const Tensor& x) { return x.affine(1.5, -0.25); }, -2, 2},
      {"powf", [](const Tensor& x) { return x.powf(2.5); }, 0.2, 2},
      {"clamp", [](const Tensor& x) { return x.clamp(-0.5, 0.8); }, -2, 2},
      {"elu", [](const Tensor& x) { return x.elu(0.7); }, -2, 2},
  };
  for (const auto& [name, f, lo, hi] : cases) {
    for (Form form : {Form::Contiguous, Form::Transposed, Form::Narrowed}) {
      SCOPED_TRACE(name);
      expect_same_gradients({{{33, 17}, form, lo, hi}},
                            [&f = f](const std::vector<Tensor>& x) { return f(x[0]); });
    }
  }
}

TEST(CudaAutograd, BinaryAndBroadcastOps) {
  WICK_REQUIRE_GPU();
  std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>> cases{
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return a.broadcast_maximum(b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return a.broadcast_minimum(b); }},
  };
  for (const auto& [name, f] : cases) {
    SCOPED_TRACE(name);
    expect_same_gradients({{{20, 30}, Form::Transposed}, {{20, 30}, Form::Narrowed, 0.5}},
                          [&f = f](const std::vector<Tensor>& x) { return f(x[0], x[1]); });
    expect_same_gradients({{{4, 20, 30}}, {{20, 1}, Form::Contiguous, 0.5}},
                          [&f = f](const std::vector<Tensor>& x) { return f(x[0], x[1]); });
  }
}

TEST(CudaAutograd, ReductionsAndSoftmax) {
  WICK_REQUIRE_GPU();
  std::vector<std::function<Tensor(const Tensor&)>> cases{
      [](const Tensor& x) { return x.sum({1}); },
      [](const Tensor& x) { return x.sum_keepdim({0, 2}); },
      [](const Tensor& x) { return x.mean({2}); },
      [](const Tensor& x) { return x.mean_all(); },
      [](const Tensor& x) { return x.max(1); },
      [](const Tensor& x) { return x.min_keepdim(2); },
      [](const Tensor& x) { return x.softmax(2); },
      [](const Tensor& x) { return x.softmax(0); },
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    for (Form form : {Form::Contiguous, Form::Transposed}) {
      expect_same_gradients({{{6, 7, 40}, form}},
                            [&](const std::vector<Tensor>& x) { return cases[i](x[0]); });
    }
  }
}

TEST(CudaAutograd, ViewsCatAndIndexing) {
  WICK_REQUIRE_GPU();
  expect_same_gradients({{{4, 5, 6}, Form::Transposed}}, [](const std::vector<Tensor>& x) {
    return x[0].permute({2, 0, 1}).narrow(1, 1, 2).reshape({6, 10}).t().unsqueeze(0).sqr();
  });
  expect_same_gradients({{{3, 1}}}, [](const std::vector<Tensor>& x) {
    return x[0].broadcast_as({2, 3, 4}).exp();
  });
  expect_same_gradients({{{3, 4}}, {{3, 2}, Form::Narrowed}}, [](const std::vector<Tensor>& x) {
    return Tensor::cat({x[0], x[1], x[0]}, 1);
  });
  expect_same_gradients({{{3, 4}}, {{3, 4}}}, [](const std::vector<Tensor>& x) {
    return Tensor::stack({x[0], x[1]}, 1);
  });
  Device gpu = Device::cuda();
  for (DType id_type : {DType::U32, DType::I64}) {
    SCOPED_TRACE(dtype_name(id_type));
    // The ids live on the device of the data: one id tensor per device.
    auto ids = [&](std::vector<double> v, Shape s, const Tensor& like) {
      return Tensor::from_vec(v, s, Device::cpu()).to_dtype(id_type).to_device(like.device());
    };
    expect_same_gradients({{{6, 5}}}, [&](const std::vector<Tensor>& x) {
      return x[0].index_select(ids({5, 0, 5, 2, 5}, {5}, x[0]), 0);
    });
    expect_same_gradients({{{3, 6}, Form::Transposed}}, [&](const std::vector<Tensor>& x) {
      return x[0].gather(ids({0, 5, 5, 1, 1, 1, 2, 2, 0}, {3, 3}, x[0]), 1);
    });
    expect_same_gradients({{{7, 4}}}, [&](const std::vector<Tensor>& x) {
      return x[0].embedding(ids({1, 6, 1, 0, 3, 6}, {2, 3}, x[0]));
    });
    expect_same_gradients({{{5, 2}}, {{3, 2}}}, [&](const std::vector<Tensor>& x) {
      return x[0].index_add(ids({4, 0, 4}, {3}, x[0]), x[1], 0);
    });
    expect_same_gradients({{{2, 4}}, {{2, 3}}}, [&](const std::vector<Tensor>& x) {
      return x[0].scatter_add(ids({0, 3, 3, 2, 2, 2}, {2, 3}, x[0]), x[1], 1);
    });
  }
  (void)gpu;
}

TEST(CudaAutograd, WhereCondAndMatmul) {
  WICK_REQUIRE_GPU();
  expect_same_gradients({{{8, 9}}, {{8, 9}, Form::Transposed}}, [](const std::vector<Tensor>& x) {
    return x[0].gt(x[1]).where_cond(x[0].sin(), x[1]);
  });
  expect_same_gradients({{{33, 64}, Form::Transposed}, {{64, 17}}},
                        [](const std::vector<Tensor>& x) { return x[0].matmul(x[1]); });
  expect_same_gradients({{{3, 16, 8}}, {{3, 8, 5}, Form::Transposed}},
                        [](const std::vector<Tensor>& x) { return x[0].matmul(x[1]); });
  expect_same_gradients({{{2, 1, 6, 8}}, {{5, 8, 4}}},
                        [](const std::vector<Tensor>& x) { return x[0].broadcast_matmul(x[1]); });
}

TEST(CudaAutograd, LowerPrecisionClassifier) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    expect_same_gradients(
        {{{16, 8}}, {{8, 32}}, {{32}}, {{32, 4}}},
        [](const std::vector<Tensor>& p) {
          Tensor h = p[0].matmul(p[1]).broadcast_add(p[2]).gelu();
          return h.matmul(p[3]).softmax(1);
        },
        dt);
  }
}

TEST(CudaAutograd, GradientsCrossDevices) {
  WICK_REQUIRE_GPU();
  std::vector<double> v{0.5, -1.0, 2.0, 0.25};
  Tensor x = Tensor::from_vec(v, {4}, Device::cpu()).to_dtype(DType::F32).requires_grad();
  Tensor y = x.to_device(Device::cuda()).sqr().to_device(Device::cpu()).sum_all();
  std::optional<Tensor> g = y.backward().get(x);
  ASSERT_TRUE(g.has_value());
  EXPECT_TRUE(g->device().is_cpu());
  EXPECT_TRUE(all_close(g->to_vec_f64(), {1.0, -2.0, 4.0, 0.5}, 1e-6, 1e-6));

  Tensor z = Tensor::from_vec(v, {4}, Device::cuda()).requires_grad();
  std::optional<Tensor> gz = z.to_device(Device::cpu()).exp().sum_all().backward().get(z);
  ASSERT_TRUE(gz.has_value());
  EXPECT_TRUE(gz->device().is_cuda());
  std::vector<double> expected;
  for (double e : v) expected.push_back(std::exp(e));
  EXPECT_TRUE(all_close(gz->to_vec_f64(), expected, 1e-12, 1e-12));
}

TEST(CudaAutograd, LongChain) {
  WICK_REQUIRE_GPU();
  Tensor x = Tensor::ones({256}, DType::F32, Device::cuda()).requires_grad();
  Tensor y = x;
  for (int i = 0; i < 10000; ++i) y = y.affine(1.0001, 0.0);
  std::vector<double> g = y.sum_all().backward().get(x)->to_vec_f64();
  EXPECT_TRUE(all_close(g, std::vector<double>(256, std::pow(1.0001, 10000)), 1e-3, 0));
}

TEST(CudaAutograd, IntermediateGradientsReleasedDuringBackward) {
  WICK_REQUIRE_GPU();
  const size_t n = 4 << 20, depth = 24;  // 16 MB per tensor
  const size_t bytes = n * sizeof(float);
  Device gpu = Device::cuda();
  // cuBLASLt's warm-up thread allocates (workspace, GEMM operands) from the same allocator: a
  // matmul on the cuBLAS path waits for it, so that it does not run during the measurement.
  cuda_set_matmul_path(CudaMatmulPath::Cublas);
  (void)Tensor::ones({8, 8}, DType::F32, gpu).matmul(Tensor::ones({8, 8}, DType::F32, gpu));
  cuda_set_matmul_path(CudaMatmulPath::Auto);
  Tensor x = Tensor::ones({n}, DType::F32, gpu).requires_grad();
  Tensor y = x;
  for (size_t i = 0; i < depth; ++i) y = i % 2 ? y.tanh() : y.affine(0.5, 0.25);
  Tensor loss = y.sum_all();
  gpu.synchronize();
  size_t before = cuda_memory_stats().in_use;  // the graph's forward tensors
  GradStore grads = loss.backward();
  gpu.synchronize();
  CudaMemoryStats after = cuda_memory_stats();
  ASSERT_TRUE(grads.get(x).has_value());
  // Holding every intermediate gradient would need depth * 16 MB more; the chain needs the
  // gradient in process, the one it produces and a few temporaries.
  EXPECT_LE(after.peak, before + 6 * bytes)
      << "peak " << after.peak << ", in use before backward " << before;
  EXPECT_LE(after.in_use, before + 2 * bytes);  // only the leaf's gradient remains
}

}  // namespace
}  // namespace wick
