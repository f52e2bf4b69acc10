// The serving engine's CUDA kernels: nn::paged_attention against a float64 reference and the
// same bits in any batch, nn::paged_kv_write against the CPU's, and Llama's forward_paged on the
// GPU against transformers' logits (tests/data/llama).

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "nn_reference.h"
#include "test_util.h"
#include "wick/formats.h"
#include "wick/models.h"
#include "wick/nn/paged_attention.h"

namespace wick {
namespace {

using namespace wick::testing;

const Device cpu = Device::cpu();

Device gpu() {
  return Device::cuda(0);
}

Tensor u32(const std::vector<uint32_t>& v, const Shape& s, const Device& d) {
  return Tensor::from_vec(v, s, d);
}

TEST(CudaPagedAttention, EachTokenWithinItsBoundAndTheSameBitsInAnyBatch) {
  WICK_REQUIRE_GPU();
  const size_t h = 8, h_kv = 2, d = 64, ps = 16, pages = 12;
  // Sequence 0: pages 5, 2, 9 (40 positions); sequence 1: pages 0, 11 (20 positions).
  std::vector<uint32_t> table = {5, 2, 9, 0, 11, 0};
  std::vector<uint32_t> seq = {0, 0, 1, 1, 1}, pos = {30, 39, 0, 7, 19};
  const size_t t = seq.size();
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const double q_range = dt == DType::BF16 ? 0.25 : 2.0;
    Tensor q = random_tensor({t, h, d}, dt, cpu, -q_range, q_range);
    // Values of one sign: the outputs (weighted means of ~30 values) stay away from zero, where
    // a bf16 bound would accept zero.
    Tensor k = random_tensor({pages, h_kv, ps, d}, dt);
    Tensor v = random_tensor({pages, h_kv, ps, d}, dt, cpu, 0.5, 1.5);
    Tensor out =
        nn::paged_attention(q.to_device(gpu()), k.to_device(gpu()), v.to_device(gpu()),
                            u32(table, {2, 3}, gpu()), u32(seq, {t}, gpu()), u32(pos, {t}, gpu()))
            .to_device(cpu);
    for (size_t i = 0; i < t; ++i) {
      std::vector<Tensor> kr, vr;
      for (size_t p = 0; p <= pos[i]; ++p) {
        kr.push_back(k.get(table[seq[i] * 3 + p / ps]).narrow(1, p % ps, 1));
        vr.push_back(v.get(table[seq[i] * 3 + p / ps]).narrow(1, p % ps, 1));
      }
      Tensor ki = Tensor::cat(kr, 1).unsqueeze(0), vi = Tensor::cat(vr, 1).unsqueeze(0);
      EXPECT_TRUE(attention_within(out.get(i).unsqueeze(1).unsqueeze(0),
                                   q.get(i).unsqueeze(1).unsqueeze(0), ki, vi,
                                   nn::AttentionOptions{}))
          << "token " << i << " " << dt;
    }
    // Token 3 alone gives the same bits.
    Tensor alone = nn::paged_attention(q.narrow(0, 3, 1).to_device(gpu()), k.to_device(gpu()),
                                       v.to_device(gpu()), u32(table, {2, 3}, gpu()),
                                       u32({1}, {1}, gpu()), u32({7}, {1}, gpu()))
                       .to_device(cpu);
    EXPECT_EQ(alone.to_vec_f64(), out.narrow(0, 3, 1).to_vec_f64()) << dt;
  }
}

TEST(CudaPagedAttention, KvWriteLandsWhereTheCpusDoes) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    Tensor k = random_tensor({3, 2, 8}, dt), v = random_tensor({3, 2, 8}, dt);
    std::vector<uint32_t> slots = {13, 2, 7};
    Tensor kc = Tensor::zeros({4, 2, 4, 8}, dt, cpu), vc = Tensor::zeros({4, 2, 4, 8}, dt, cpu);
    nn::paged_kv_write(kc, vc, k, v, u32(slots, {3}, cpu));
    Tensor kg = Tensor::zeros({4, 2, 4, 8}, dt, gpu()), vg = Tensor::zeros({4, 2, 4, 8}, dt, gpu());
    nn::paged_kv_write(kg, vg, k.to_device(gpu()), v.to_device(gpu()), u32(slots, {3}, gpu()));
    EXPECT_EQ(kg.to_device(cpu).to_vec_f64(), kc.to_vec_f64()) << dt;
    EXPECT_EQ(vg.to_device(cpu).to_vec_f64(), vc.to_vec_f64()) << dt;
  }
}

// The reference prompt in chunks of 3 beside another sequence, on the GPU: each chunk's last
// logits within transformers' (f32, no TF32).
TEST(CudaPagedForward, RaggedBatchGivesTransformersLogits) {
  WICK_REQUIRE_GPU();
  const std::string dir = std::string(WICK_TEST_DATA_DIR) + "/llama/tiny_qwen2";
  auto model = models::load_causal_lm(dir, gpu());
  std::vector<uint32_t> prompt;
  for (double x : npy::load(dir + "/prompt.npy", cpu).to_vec_f64()) {
    prompt.push_back(static_cast<uint32_t>(x));
  }
  Tensor ref = npy::load(dir + "/logits.npy", cpu);
  const double range = range_of(ref.to_vec_f64());
  models::PagedKvCache cache = model->make_paged_cache(16, 4);
  std::vector<uint32_t> pages_a = {7, 3, 12, 1, 9, 0}, pages_b = {2, 4, 5, 6, 8, 10};
  for (size_t at = 0; at < prompt.size(); at += 3) {
    const size_t n = std::min<size_t>(3, prompt.size() - at);
    std::vector<models::PagedSequence> batch = {
        {std::vector<uint32_t>{static_cast<uint32_t>(at % 50 + 1)}, at, pages_b},
        {std::vector<uint32_t>(prompt.begin() + at, prompt.begin() + at + n), at, pages_a}};
    Tensor logits = model->forward_paged(batch, cache).to_device(cpu);
    EXPECT_LE(max_abs_diff(logits.get(1).to_vec_f64(), ref.get(at + n - 1).to_vec_f64()),
              1e-5 * range)
        << "position " << at + n - 1;
  }
}

}  // namespace
}  // namespace wick
