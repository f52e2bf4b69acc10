// The CUDA device: the queue and its batches, read-back of views, deferred errors, out-of-memory,
// the caching allocator, several threads on one device.

#include <cstdlib>
#include <string>
#include <thread>

#include "test_util.h"
#include "wick/cuda.h"

namespace wick {
namespace {

using testing::all_close;
using testing::random_values;
using testing::tensor_from;

// The allocator tests count the bytes in use: cuBLASLt's warm-up thread (its workspace and test
// buffers, 56 MiB) must not allocate under them. Set before the device is first used.
[[maybe_unused]] const bool no_warm_up = setenv("WICK_CUDA_WARMUP", "0", 0) == 0;

const Device cpu = Device::cpu();
const Device gpu = Device::cuda(0);

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(CudaDevice, MissingOrdinalIsABackendError) {
  WICK_REQUIRE_GPU();
  EXPECT_GE(cuda_device_count(), 1);
  try {
    Tensor::zeros({2}, DType::F32, Device::cuda(97));
    FAIL() << "cuda:97 should not exist";
  } catch (const BackendError& e) {
    EXPECT_TRUE(contains(e.what(), "no CUDA device")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cuda:97")) << e.what();
  }
}

TEST(CudaDevice, ReadBackOfViewsCopiesTheRightElements) {
  WICK_REQUIRE_GPU();
  auto v = random_values(64 * 48);
  Tensor x = tensor_from(v, {64, 48}, DType::F32);
  Tensor g = x.to_device(gpu);
  // One element, from a contiguous and from a strided view.
  EXPECT_EQ(g.get(5).narrow(0, 7, 1).to_scalar<float>(),
            x.get(5).narrow(0, 7, 1).to_scalar<float>());
  EXPECT_EQ(g.t().get(7).narrow(0, 5, 1).to_scalar<float>(), static_cast<float>(v[5 * 48 + 7]));
  // A column (stride 48), a transposed block, a broadcast view.
  EXPECT_EQ(g.t().get(3).to_vec1<float>(), x.t().get(3).to_vec1<float>());
  EXPECT_EQ(g.narrow(0, 10, 5).narrow(1, 3, 9).t().to_vec2<float>(),
            x.narrow(0, 10, 5).narrow(1, 3, 9).t().to_vec2<float>());
  EXPECT_EQ(g.get(2).unsqueeze(0).broadcast_as({3, 48}).to_vec2<float>(),
            x.get(2).unsqueeze(0).broadcast_as({3, 48}).to_vec2<float>());
  // Rank 0 and every dtype.
  for (DType dt : testing::all_dtypes()) {
    Tensor t = x.narrow(0, 1, 3).to_dtype(dt);
    EXPECT_EQ(t.to_device(gpu).t().to_vec_f64(), t.t().to_vec_f64()) << dtype_name(dt);
  }
  EXPECT_EQ(Tensor::scalar(7.25f, gpu).to_scalar<float>(), 7.25f);
}

TEST(CudaDevice, LargeReadBackAndUpload) {
  WICK_REQUIRE_GPU();
  // 96 MB: past the pinned staging buffer, straight to pageable memory.
  size_t n = size_t{24} << 20;
  Tensor g = Tensor::arange(0.0f, static_cast<float>(n), gpu).affine(0.5, 1);
  auto back = g.to_vec1<float>();
  ASSERT_EQ(back.size(), n);
  for (size_t i : {size_t{0}, size_t{12345}, n / 2, n - 1}) {
    EXPECT_EQ(back[i], static_cast<float>(i) * 0.5f + 1) << i;
  }
  Tensor again = Tensor::from_vec(back, {n}, gpu);
  EXPECT_EQ(again.narrow(0, n - 3, 3).to_vec1<float>(),
            std::vector<float>(back.end() - 3, back.end()));
}

TEST(CudaDevice, OutOfRangeIdsSurfaceAtReadBackAndTheDeviceStaysUsable) {
  WICK_REQUIRE_GPU();
  Tensor x = tensor_from(random_values(12), {4, 3}, DType::F32, gpu);
  Tensor bad = tensor_from({0, 99, 1}, {3}, DType::U32, gpu);
  Tensor r = x.index_select(bad, 0);  // enqueued: the id is only seen by the GPU
  try {
    r.to_vec2<float>();
    FAIL() << "the out-of-range id was not reported";
  } catch (const IndexOutOfRange& e) {
    EXPECT_TRUE(contains(e.what(), "index_select")) << e.what();
  }
  // Reported once; the device keeps working.
  EXPECT_NO_THROW(gpu.synchronize());
  auto ok = x.index_select(tensor_from({3, 0}, {2}, DType::I64, gpu), 0).to_vec2<float>();
  auto xs = x.to_vec2<float>();
  EXPECT_EQ(ok[0], xs[3]);
  EXPECT_EQ(ok[1], xs[0]);

  Tensor gids = tensor_from({0, 5, 1, 2}, {2, 2}, DType::I64, gpu);
  Tensor g = x.narrow(1, 0, 2).gather(gids, 0);
  (void)g;
  try {
    gpu.synchronize();
    FAIL() << "the out-of-range gather id was not reported";
  } catch (const IndexOutOfRange& e) {
    EXPECT_TRUE(contains(e.what(), "gather")) << e.what();
  }
  EXPECT_EQ((x + x).to_vec2<float>()[1][2], 2 * xs[1][2]);
}

TEST(CudaDevice, OutOfMemoryIsABackendErrorAndTheNextOpWorks) {
  WICK_REQUIRE_GPU();
  CudaMemoryStats before = cuda_memory_stats();
  try {
    Tensor huge = Tensor::zeros({size_t{1} << 40}, DType::F32, gpu);  // 4 TiB
    FAIL() << "4 TiB were allocated";
  } catch (const BackendError& e) {
    EXPECT_TRUE(contains(e.what(), "out of memory")) << e.what();
    EXPECT_TRUE(contains(e.what(), "requested 4398046511104 bytes")) << e.what();
    EXPECT_TRUE(contains(e.what(), "free")) << e.what();
  }
  EXPECT_EQ(cuda_memory_stats().in_use, before.in_use);
  Tensor a = Tensor::ones({1000}, DType::F32, gpu);
  EXPECT_EQ((a + a).sum_all().to_scalar<float>(), 2000.0f);
}

TEST(CudaDevice, CachingAllocatorReusesFreedBlocks) {
  WICK_REQUIRE_GPU();
  gpu.synchronize();
  CudaMemoryStats s0 = cuda_memory_stats();
  {
    Tensor t = Tensor::ones({3 << 20}, DType::F32, gpu);  // 12 MiB
    CudaMemoryStats s1 = cuda_memory_stats();
    EXPECT_GE(s1.in_use, s0.in_use + (size_t{12} << 20));
    EXPECT_GE(s1.peak, s1.in_use);
  }
  CudaMemoryStats s2 = cuda_memory_stats();
  EXPECT_EQ(s2.in_use, s0.in_use);
  EXPECT_GE(s2.cached, size_t{12} << 20);
  {
    Tensor t = Tensor::ones({3 << 20}, DType::F32, gpu);
    CudaMemoryStats s3 = cuda_memory_stats();
    EXPECT_EQ(s3.cached + (size_t{12} << 20), s2.cached) << "the freed block was not reused";
    EXPECT_EQ(t.sum_all().to_scalar<float>(), static_cast<float>(3 << 20));
  }
  cuda_empty_cache();
  EXPECT_EQ(cuda_memory_stats().cached, 0u);
  EXPECT_EQ(Tensor::ones({5}, DType::F32, gpu).sum_all().to_scalar<float>(), 5.0f);
}

TEST(CudaDevice, OpsAreGroupedIntoBatches) {
  WICK_REQUIRE_GPU();
  gpu.synchronize();
  CudaQueueStats q0 = cuda_queue_stats();
  EXPECT_EQ(q0.open_batch_ops, 0u);
  ASSERT_GT(q0.ops_per_batch, 0);
  size_t per = static_cast<size_t>(q0.ops_per_batch);
  Tensor x = Tensor::ones({256}, DType::F32, gpu);
  for (size_t i = 0; i < 2 * per + 3; ++i) x = x.affine(1, 1);
  CudaQueueStats q1 = cuda_queue_stats();
  EXPECT_GE(q1.closed_batches, q0.closed_batches + 2);
  EXPECT_LT(q1.open_batch_ops, per);
  EXPECT_EQ(x.to_vec1<float>()[17], static_cast<float>(2 * per + 4));
  CudaQueueStats q2 = cuda_queue_stats();
  EXPECT_EQ(q2.open_batch_ops, 0u);  // read-back closed the batch
  EXPECT_GT(q2.closed_batches, q1.closed_batches);
}

TEST(CudaDevice, SeveralThreadsOnOneDevice) {
  WICK_REQUIRE_GPU();
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &ok] {
      Tensor x = Tensor::full(static_cast<float>(t), {1000}, gpu);
      for (int i = 0; i < 60; ++i) x = x + 1.0;
      Tensor m =
          Tensor::ones({64, 64}, DType::F32, gpu).matmul(Tensor::ones({64, 64}, DType::F32, gpu));
      ok[t] = x.sum_all().to_scalar<float>() == 1000.0f * static_cast<float>(t + 60) &&
              m.to_vec2<float>()[3][4] == 64.0f;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 1) << "thread " << t;
}

TEST(CudaDevice, SynchronizeAndToDeviceBothWays) {
  WICK_REQUIRE_GPU();
  EXPECT_NO_THROW(gpu.synchronize());
  auto v = random_values(30);
  Tensor c = tensor_from(v, {5, 6}, DType::F64);
  Tensor g = c.t().to_device(gpu);
  EXPECT_EQ(g.device(), gpu);
  EXPECT_TRUE(g.is_contiguous());
  Tensor back = g.to_device(cpu);
  EXPECT_EQ(back.device(), cpu);
  EXPECT_EQ(back.to_vec2<double>(), c.t().to_vec2<double>());
  EXPECT_TRUE(all_close(g.exp().to_device(cpu).to_vec_f64(), c.t().exp().to_vec_f64(), 1e-12, 0));
}

}  // namespace
}  // namespace wick
