// Graph mode of the CUDA queue (WICK_CUDA_GRAPHS=1): batches captured into CUDA graphs, cached
// and updated in place. Long random op sequences against the CPU, repeated batches hitting the
// cache, read-backs and uploads mid-batch, big ops starting at once, failures during capture, and
// several threads. The oracle and matmul tests run again in both modes through CTest
// (tests/CMakeLists.txt: cuda_test_cuda_*_graphs0 / _graphs1).

#include <cmath>
#include <random>
#include <string>
#include <thread>

#include "cuda/cuda_device.h"
#include "test_util.h"
#include "wick/cuda.h"

namespace wick {
namespace {

using testing::all_close;
using testing::random_values;
using testing::tensor_from;

const Device cpu = Device::cpu();
const Device gpu = Device::cuda(0);

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Every test runs in graph mode and restores the mode it found.
class CudaGraphs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::cuda_missing()) GTEST_SKIP() << "no CUDA device available";
    ASSERT_TRUE(cuda_is_available()) << "WICK_REQUIRE_CUDA=1 but no CUDA device is available";
    dev_ = &cuda::cuda_device(0);
    was_ = dev_->queue().graph_mode();
    dev_->queue().set_graph_mode(true);
  }
  void TearDown() override {
    if (dev_ == nullptr) return;
    try {
      gpu.synchronize();
    } catch (...) {
    }
    dev_->queue().set_graph_mode(was_);
  }
  cuda::CudaDevice* dev_ = nullptr;
  bool was_ = false;
};

// The same values on both devices.
struct Pair {
  Tensor c, g;
};

Pair pair_from(const std::vector<double>& v, const Shape& shape) {
  Tensor c = tensor_from(v, shape, DType::F32);
  return {c, c.to_device(gpu)};
}

::testing::AssertionResult same(const Pair& p, double tol = 2e-4) {
  return all_close(p.g.to_vec_f64(), p.c.to_vec_f64(), tol, tol);
}

TEST_F(CudaGraphs, RepeatedBatchesHitTheCacheAndUpdateAddresses) {
  size_t per = static_cast<size_t>(dev_->queue().ops_per_batch());
  gpu.synchronize();
  cuda::GraphStats s0 = dev_->queue().graph_stats();
  Pair y = pair_from(random_values(64), {8, 8});
  Pair x = y;
  // 6 full batches of the same structure; buffers move between allocator blocks as they go.
  std::vector<Tensor> keep;
  for (size_t i = 0; i < 6 * per; ++i) {
    x.g = (x.g + y.g).affine(0.5, 0.0);  // two ops per step
    x.c = (x.c + y.c).affine(0.5, 0.0);
    if (i % 7 == 3) keep.push_back(x.g);  // shifts later buffers to other addresses
  }
  cuda::GraphStats s1 = dev_->queue().graph_stats();
  EXPECT_GE(s1.commits, s0.commits + 10);
  EXPECT_GE(s1.updates, s0.updates + 8) << "repeated batches should update the cached graph";
  EXPECT_LE(s1.instantiations, s0.instantiations + 3);
  EXPECT_EQ(s1.lost, s0.lost);
  EXPECT_TRUE(same(x));
  EXPECT_EQ(dev_->queue().open_batch_ops(), 0u);  // the read-back closed the batch
}

// exp then softmax over rows of 64 (the warp kernel, launched the ordinary way) and of 4096 (a
// row kernel launched programmatically: it may start before exp ends and waits for it). The
// batches have the same ops, dtypes and node count, but other kernels, launch shapes and edge
// types, which an update does not always carry over (graph.cpp, structure_key): each structure
// gets an executable of its own, and a batch of either updates only its own.
TEST_F(CudaGraphs, AnUpdateNeverChangesKernelsOrAProgrammaticEdge) {
  // First uses of exp and softmax, which WICK_TRACE=1 times outside any graph.
  Pair w = pair_from(random_values(16), {2, 8});
  w.g = w.g.exp().softmax_last_dim();
  w.c = w.c.exp().softmax_last_dim();
  EXPECT_TRUE(same(w, 1e-6));
  for (int round = 0; round < 4; ++round) {
    const size_t cols = round % 2 == 0 ? 64 : 4096;
    Pair x = pair_from(random_values(4 * cols), {4, cols});
    gpu.synchronize();
    cuda::GraphStats s0 = dev_->queue().graph_stats();
    x.g = x.g.exp().softmax_last_dim();
    x.c = x.c.exp().softmax_last_dim();
    EXPECT_TRUE(same(x, 1e-6)) << "round " << round;
    cuda::GraphStats s1 = dev_->queue().graph_stats();
    ASSERT_EQ(s1.commits, s0.commits + 1) << "round " << round;
    if (round == 1) {
      EXPECT_EQ(s1.updates, s0.updates)
          << "the programmatic batch updated the ordinary one's graph";
      EXPECT_EQ(s1.instantiations, s0.instantiations + 1);
    }
    if (round >= 2) {
      EXPECT_EQ(s1.updates, s0.updates + 1) << "round " << round;
    }
  }
}

TEST_F(CudaGraphs, ReadBacksAndUploadsMidBatch) {
  Pair a = pair_from(random_values(30), {5, 6});
  Pair b = pair_from(random_values(30), {5, 6});
  for (int round = 0; round < 5; ++round) {
    a.g = a.g.mul(b.g).tanh();
    a.c = a.c.mul(b.c).tanh();
    EXPECT_GT(dev_->queue().open_batch_ops(), 0u);
    // A read-back in the middle of a batch: the captured ops run before the copy.
    EXPECT_TRUE(same(a)) << "round " << round;
    EXPECT_EQ(dev_->queue().open_batch_ops(), 0u);
    // A small (pinned, captured) upload between captured ops.
    auto v = random_values(30);
    b = pair_from(v, {5, 6});
    a.g = a.g + b.g;
    a.c = a.c + b.c;
  }
  // A large upload (pageable: never captured) while a batch is open.
  a.g = a.g.exp();
  a.c = a.c.exp();
  size_t n = size_t{3} << 20;  // 12 MB
  auto big = random_values(n);
  Tensor bg = tensor_from(big, {n}, DType::F32, gpu);
  Tensor bsum = bg.sum_all();
  EXPECT_TRUE(same(a));
  double want = 0;
  for (double x : big) want += static_cast<double>(static_cast<float>(x));
  EXPECT_NEAR(bsum.to_scalar<float>(), want, 20.0);
  Tensor e = Tensor::zeros({0, 3}, DType::F32, gpu).exp();
  EXPECT_TRUE(e.to_vec_f64().empty());
}

TEST_F(CudaGraphs, ABigMatmulStartsAtOnce) {
  Pair s = pair_from(random_values(16), {4, 4});
  s.g = s.g.sqr();  // a small op opens a capture
  s.c = s.c.sqr();
  ASSERT_GT(dev_->queue().open_batch_ops(), 0u);
  cuda::GraphStats s0 = dev_->queue().graph_stats();
  size_t n = 1024;  // 2.1 GFLOP: far past the batch work limit
  Pair a = pair_from(random_values(n * n), {n, n});
  Pair b = pair_from(random_values(n * n), {n, n});
  Tensor cg = a.g.matmul(b.g);
  cuda::GraphStats s1 = dev_->queue().graph_stats();
  EXPECT_EQ(dev_->queue().open_batch_ops(), 0u) << "the matmul should not wait for more ops";
  EXPECT_GE(s1.direct, s0.direct + 1);
  EXPECT_GE(s1.commits, s0.commits + 1) << "the ops before it were launched first";
  Tensor cc = a.c.matmul(b.c);
  auto got = cg.narrow(0, 100, 3).to_vec_f64();
  auto want = cc.narrow(0, 100, 3).to_vec_f64();
  EXPECT_TRUE(all_close(got, want, 1e-4, 1e-2));
  EXPECT_TRUE(same(s));
}

TEST_F(CudaGraphs, StreamAndGraphModesAgree) {
  // Same kernels either way (cuBLASLt for every matmul, not wick's GEMM while it warms up).
  CudaMatmulPath path = cuda_matmul_path();
  cuda_set_matmul_path(CudaMatmulPath::Cublas);
  std::vector<Tensor> w, b;
  for (int l = 0; l < 6; ++l) {
    w.push_back(tensor_from(random_values(64 * 64, -0.25, 0.25), {64, 64}, DType::F32, gpu));
    b.push_back(tensor_from(random_values(64), {64}, DType::F32, gpu));
  }
  Tensor x = tensor_from(random_values(3 * 64), {3, 64}, DType::F32, gpu);
  auto forward = [&] {
    Tensor h = x;
    for (int l = 0; l < 6; ++l) h = h.matmul(w[l]).broadcast_add(b[l]).relu();
    return h.softmax(1);
  };
  dev_->queue().set_graph_mode(false);
  auto stream = forward().to_vec_f64();
  dev_->queue().set_graph_mode(true);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(all_close(forward().to_vec_f64(), stream, 1e-6, 1e-7));
  cuda_set_matmul_path(path);
}

TEST_F(CudaGraphs, OutOfRangeIdsAreReportedAfterAGraphRan) {
  Tensor x = tensor_from(random_values(12), {4, 3}, DType::F32, gpu);
  Tensor bad = tensor_from({0, 7, 1}, {3}, DType::U32, gpu);
  Tensor r = x.index_select(bad, 0).exp();
  try {
    r.to_vec2<float>();
    FAIL() << "the out-of-range id was not reported";
  } catch (const IndexOutOfRange& e) {
    EXPECT_TRUE(contains(e.what(), "index_select")) << e.what();
  }
  EXPECT_EQ((x + x).to_vec2<float>()[2][1], 2 * x.to_vec2<float>()[2][1]);
}

TEST_F(CudaGraphs, ALaunchThatThrowsDuringCaptureLeavesTheDeviceUsable) {
  Pair a = pair_from(random_values(20), {4, 5});
  Tensor lost = a.g.exp().sin();  // captured, then lost with the batch
  cuda::GraphStats s0 = dev_->queue().graph_stats();
  try {
    dev_->queue().enqueue("boom", DType::F32,
                          [](cudaStream_t) { throw BackendError("boom: refused"); });
    FAIL() << "the launch error was swallowed";
  } catch (const BackendError& e) {
    EXPECT_TRUE(contains(e.what(), "boom")) << e.what();
  }
  EXPECT_FALSE(dev_->queue().graph_capturing());
  EXPECT_EQ(dev_->queue().graph_stats().lost, s0.lost + 1);
  try {
    gpu.synchronize();
    FAIL() << "the lost batch was not reported";
  } catch (const BackendError& e) {
    EXPECT_TRUE(contains(e.what(), "synchronize")) << e.what();
    EXPECT_TRUE(contains(e.what(), "never ran")) << e.what();
    EXPECT_TRUE(contains(e.what(), "exp")) << e.what();
    EXPECT_TRUE(contains(e.what(), "boom")) << e.what();
  }
  EXPECT_NO_THROW(gpu.synchronize());  // reported once
  a.g = a.g.exp().sin();
  a.c = a.c.exp().sin();
  EXPECT_TRUE(same(a));
}

TEST_F(CudaGraphs, AnInvalidatedCaptureIsReportedAtTheNextSync) {
  Pair a = pair_from(random_values(20), {4, 5});
  Tensor t = a.g.cos();
  // A forbidden call inside the capture invalidates it without an exception here.
  dev_->queue().enqueue("stray_sync", DType::F32, [](cudaStream_t s) {
    (void)cudaStreamSynchronize(s);
    (void)cudaGetLastError();
  });
  try {
    (void)t.tanh();  // launching into the invalidated capture may fail at once
  } catch (const BackendError&) {
  }
  try {
    gpu.synchronize();
    FAIL() << "the invalidated capture was not reported";
  } catch (const BackendError& e) {
    EXPECT_TRUE(contains(e.what(), "never ran")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cos")) << e.what();
  }
  EXPECT_NO_THROW(gpu.synchronize());
  a.g = a.g.cos().tanh();
  a.c = a.c.cos().tanh();
  EXPECT_TRUE(same(a));
}

TEST_F(CudaGraphs, SeveralThreadsShareTheCapture) {
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &ok] {
      Tensor x = Tensor::full(static_cast<float>(t), {333}, gpu);
      for (int i = 0; i < 120; ++i) x = x + 1.0;
      Tensor m =
          Tensor::ones({32, 48}, DType::F32, gpu).matmul(Tensor::ones({48, 8}, DType::F32, gpu));
      ok[t] = x.sum_all().to_scalar<float>() == 333.0f * static_cast<float>(t + 120) &&
              m.to_vec2<float>()[3][4] == 48.0f;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 1) << "thread " << t;
}

// Long random sequences of element-wise ops, reductions, matmuls, views, in-place assignments and
// read-backs on a pool of square tensors, mirrored on the CPU. Values stay in [-4, 4]: every op
// is bounded (tanh, averages, clamps, scaled matmuls).
TEST_F(CudaGraphs, RandomOpSequencesMatchTheCpu) {
  constexpr size_t n = 12;
  constexpr int kSlots = 6;
  cuda::GraphStats s0 = dev_->queue().graph_stats();
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 r(seed * 7919);
    auto pick = [&](int k) { return static_cast<int>(r() % static_cast<uint64_t>(k)); };
    std::vector<Pair> pool;
    for (int i = 0; i < kSlots; ++i) pool.push_back(pair_from(random_values(n * n), {n, n}));
    // A view of slot `i` of shape [n, n], the same on both devices.
    auto view = [&](const Tensor& t, int kind, size_t k) -> Tensor {
      switch (kind) {
        case 0:
          return t;
        case 1:
          return t.t();
        case 2:
          return t.narrow(0, k, 1).broadcast_as({n, n});
        case 3:
          return t.permute({1, 0}).narrow(1, k, 1).broadcast_as({n, n});
        default:
          return t.narrow(1, k, 1).broadcast_as({n, n}).t();
      }
    };
    auto operand = [&](int slot, int kind, size_t k) {
      return Pair{view(pool[slot].c, kind, k), view(pool[slot].g, kind, k)};
    };
    size_t readbacks = 0;
    for (int step = 0; step < 400; ++step) {
      int op = pick(16);
      int sa = pick(kSlots), sb = pick(kSlots), dst = pick(kSlots);
      size_t k = static_cast<size_t>(pick(static_cast<int>(n)));
      Pair a = operand(sa, pick(5), k), b = operand(sb, pick(5), (k * 5) % n);
      auto both = [&](auto f) { return Pair{f(a.c, b.c), f(a.g, b.g)}; };
      Pair out;
      switch (op) {
        case 0:
          out = both([](const Tensor& x, const Tensor&) { return x.tanh(); });
          break;
        case 1:
          out = both([](const Tensor& x, const Tensor&) { return x.sigmoid(); });
          break;
        case 2:
          out = both([](const Tensor& x, const Tensor&) { return x.relu(); });
          break;
        case 3:
          out = both([](const Tensor& x, const Tensor& y) { return (x + y).affine(0.5, 0.1); });
          break;
        case 4:
          out = both([](const Tensor& x, const Tensor& y) { return x.maximum(y); });
          break;
        case 5:
          out = both([](const Tensor& x, const Tensor& y) { return x.minimum(y); });
          break;
        case 6:
          out = both([](const Tensor& x, const Tensor& y) { return (x * y).tanh(); });
          break;
        case 7:
          out = both([](const Tensor& x, const Tensor& y) {
            return x.matmul(y).affine(1.0 / static_cast<double>(n), 0).tanh();
          });
          break;
        case 8:
          out = both([](const Tensor& x, const Tensor&) {
            return x.mean_keepdim({1}).broadcast_as({n, n}).contiguous();
          });
          break;
        case 9:
          out = both([](const Tensor& x, const Tensor&) {
            return x.max_keepdim(0).broadcast_as({n, n}).sub(x).affine(0.25, 0);
          });
          break;
        case 10:
          out = both([](const Tensor& x, const Tensor&) { return x.softmax(1); });
          break;
        case 11:
          out = both([](const Tensor& x, const Tensor& y) {
            return x.gt(y).where_cond(x, y);  // continuous: never flips on rounding
          });
          break;
        case 12: {
          std::vector<double> ids;
          for (size_t i = 0; i < n; ++i)
            ids.push_back(static_cast<double>(pick(static_cast<int>(n))));
          Tensor idc = tensor_from(ids, {n}, DType::I64);
          Tensor idg = idc.to_device(gpu);
          out = Pair{a.c.index_select(idc, 0), a.g.index_select(idg, 0)};
          break;
        }
        case 13:
          // In place: a copy into an existing buffer, through a strided destination view.
          pool[dst].c.t().assign(a.c.clamp(-1.5, 1.5));
          pool[dst].g.t().assign(a.g.clamp(-1.5, 1.5));
          continue;
        case 14:
          out = both([](const Tensor& x, const Tensor&) {
            return x.sum({0}).unsqueeze(0).broadcast_as({n, n}).affine(1.0 / static_cast<double>(n),
                                                                       0);
          });
          break;
        default: {
          // A read-back in the middle of the sequence.
          ASSERT_TRUE(same(pool[sa])) << "seed " << seed << " step " << step << " slot " << sa;
          ++readbacks;
          continue;
        }
      }
      pool[dst] = out;
    }
    for (int i = 0; i < kSlots; ++i) {
      EXPECT_TRUE(same(pool[i])) << "seed " << seed << " slot " << i;
    }
    EXPECT_GT(readbacks, 5u);
  }
  EXPECT_EQ(dev_->queue().graph_stats().lost, s0.lost);
  EXPECT_GT(dev_->queue().graph_stats().commits, s0.commits + 10);
}

}  // namespace
}  // namespace wick
