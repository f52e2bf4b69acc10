// The CUDA-graph decode step against the op-by-op CUDA path and the CPU: same tokens. And
// CudaGraph itself: replays read the inputs' current contents, reserved memory is never handed
// to other tensors while the graph lives.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../qmatmul_test_util.h"
#include "cpu/qmatmul.h"
#include "cuda/decode_fusions.h"
#include "cuda/gpu_tolerance.h"
#include "cuda/tuning_from_env.h"
#include "nn/kv_write.h"
#include "nn_reference.h"
#include "test_util.h"
#include "token_mailbox.h"
#include "wick/cuda.h"
#include "wick/generator.h"
#include "wick/llama.h"
#include "wick/nn/decoder_ops.h"
#include "wick/wick.h"

namespace wick {
namespace {

bool have_gpu() {
  return cuda_is_available() && cuda_device_count() > 0;
}

#define SKIP_WITHOUT_GPU()                                                      \
  do {                                                                          \
    if (!have_gpu()) {                                                          \
      if (std::getenv("WICK_REQUIRE_CUDA") != nullptr) FAIL() << "no CUDA GPU"; \
      GTEST_SKIP() << "no CUDA GPU on this machine";                            \
    }                                                                           \
  } while (0)

TEST(CudaGraphCapture, ReplayReadsCurrentInputs) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  Tensor x = Tensor::zeros({1000}, DType::F32, gpu);
  Tensor y;
  CudaGraph g = CudaGraph::capture(gpu, [&] { y = x.affine(2.0, 1.0).exp().sum_all(); });
  EXPECT_GT(g.node_count(), 0u);
  EXPECT_GT(g.reserved_bytes(), 0u);
  for (float v : {0.0f, 0.5f, -1.0f}) {
    x.assign(Tensor::full(v, {1000}, gpu));
    g.replay();
    EXPECT_NEAR(y.to_scalar<float>(), 1000 * std::exp(2 * v + 1),
                1e-3 * 1000 * std::exp(2 * v + 1));
  }
}

TEST(CudaGraphCapture, ReservedMemoryIsNotReused) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  Tensor x = Tensor::full(1.0f, {4096}, gpu);
  Tensor out;
  CudaGraph g = CudaGraph::capture(gpu, [&] {
    Tensor tmp = x.affine(3.0, 0.0);  // dropped inside the capture, still written by replays
    out = tmp.add(x);
  });
  // Fresh tensors of the same size after the capture must not land on the graph's blocks.
  std::vector<Tensor> others;
  for (int i = 0; i < 8; ++i) others.push_back(Tensor::full(7.0f, {4096}, gpu));
  g.replay();
  g.replay();
  for (const auto& t : others) EXPECT_EQ(t.max(0).to_scalar<float>(), 7.0f);
  EXPECT_EQ(out.min(0).to_scalar<float>(), 4.0f);
}

TEST(CudaGraphCapture, RefusesReadBackInsideAndCpuDevices) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  Tensor x = Tensor::full(1.0f, {16}, gpu);
  EXPECT_THROW(CudaGraph::capture(gpu, [&] { (void)x.sum_all().to_scalar<float>(); }),
               BackendError);
  // The device stays usable afterwards.
  EXPECT_EQ(x.sum_all().to_scalar<float>(), 16.0f);
  EXPECT_THROW(CudaGraph::capture(Device::cpu(), [] {}), DeviceMismatch);
}

models::LlamaConfig small_config() {
  models::LlamaConfig c;
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  return c;
}

std::map<std::string, Tensor> random_weights(const models::LlamaConfig& c) {
  Device cpu = Device::cpu();
  cpu.set_seed(42);
  std::map<std::string, Tensor> w;
  size_t d = c.hidden_size, qo = c.num_attention_heads * c.head_dim;
  size_t kvo = c.num_key_value_heads * c.head_dim, in = c.intermediate_size;
  auto r = [&](Shape s, float mean = 0.0f) { return Tensor::randn(mean, 0.15f, s, cpu); };
  w["model.embed_tokens.weight"] = r({c.vocab_size, d});
  w["model.norm.weight"] = r({d}, 1.0f);
  w["lm_head.weight"] = r({c.vocab_size, d});
  for (size_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    w[p + "input_layernorm.weight"] = r({d}, 1.0f);
    w[p + "post_attention_layernorm.weight"] = r({d}, 1.0f);
    w[p + "self_attn.q_proj.weight"] = r({qo, d});
    w[p + "self_attn.k_proj.weight"] = r({kvo, d});
    w[p + "self_attn.v_proj.weight"] = r({kvo, d});
    w[p + "self_attn.o_proj.weight"] = r({d, qo});
    w[p + "mlp.gate_proj.weight"] = r({in, d});
    w[p + "mlp.up_proj.weight"] = r({in, d});
    w[p + "mlp.down_proj.weight"] = r({d, in});
  }
  return w;
}

TEST(CudaLlama, GraphDecodeTokensEqualOpByOpAndCpu) {
  SKIP_WITHOUT_GPU();
  auto c = small_config();
  auto w = random_weights(c);
  std::vector<uint32_t> prompt = {5, 77, 300, 12, 9, 411, 2};
  GenerateOptions opt;
  opt.max_new_tokens = 40;
  opt.stop_tokens = {100000};
  opt.max_len = 64;
  auto cpu = Generator(models::Llama::from_weights(c, w, Device::cpu()), opt).generate(prompt);
  models::Llama gpu_model = models::Llama::from_weights(c, w, Device::cuda(0));
  opt.cuda_graph = false;
  auto plain = Generator(gpu_model, opt).generate(prompt);
  opt.cuda_graph = true;
  Generator graph_gen(gpu_model, opt);
  auto graph = graph_gen.generate(prompt);
  EXPECT_TRUE(graph_gen.stats().used_cuda_graph);
  // GPU and CPU sum in different orders (f32, no TF32): the first 16 tokens must agree; later
  // ones may part at a near-tie.
  ASSERT_EQ(plain.size(), cpu.size());
  EXPECT_EQ(std::vector<uint32_t>(plain.begin(), plain.begin() + 16),
            std::vector<uint32_t>(cpu.begin(), cpu.begin() + 16));
  EXPECT_EQ(graph, plain);
  // The captured graph and cache are reused by a second call.
  EXPECT_EQ(graph_gen.generate(prompt), graph);
  std::vector<uint32_t> other = {1, 2, 3};
  opt.cuda_graph = false;
  EXPECT_EQ(graph_gen.generate(other), Generator(gpu_model, opt).generate(other));
}

// The decode step run op by op (not captured), greedy: the graph must give the same tokens.
std::vector<uint32_t> uncaptured_steps(const models::Llama& m, const std::vector<uint32_t>& prompt,
                                       size_t n, size_t max_len) {
  Device dev = m.device();
  models::KvCache cache = m.make_cache(1, max_len);
  Tensor ids = Tensor::from_vec(prompt, {1, prompt.size()}, dev);
  uint32_t next = m.forward_last(ids, cache).argmax(1).to_vec1<uint32_t>()[0];
  std::vector<uint32_t> out = {next};
  while (out.size() < n) {
    Tensor tok = Tensor::from_vec(std::vector<uint32_t>{next}, {1, 1}, dev);
    uint32_t p = static_cast<uint32_t>(cache.length());
    Tensor pos = Tensor::from_vec(std::vector<uint32_t>{p}, {1}, dev);
    next = m.decode_step(tok, pos, cache).to_vec1<uint32_t>()[0];
    cache.set_length(p + 1);
    out.push_back(next);
  }
  return out;
}

TEST(CudaLlama, GraphDecodeBf16EqualsUncapturedSteps) {
  SKIP_WITHOUT_GPU();
  auto c = small_config();
  auto w = random_weights(c);
  models::Llama m = models::Llama::from_weights(c, w, Device::cuda(0), DType::BF16);
  std::vector<uint32_t> prompt = {8, 19, 250, 3};
  GenerateOptions opt;
  opt.max_new_tokens = 32;
  opt.max_len = 48;
  opt.stop_tokens = {100000};
  auto graph = Generator(m, opt).generate(prompt);
  // Same kernels on the same data in the same order: bit-equal logits, equal tokens.
  EXPECT_EQ(graph, uncaptured_steps(m, prompt, opt.max_new_tokens, opt.max_len));
}

TEST(CudaLlama, SampledGraphDecodeIsSeeded) {
  SKIP_WITHOUT_GPU();
  auto c = small_config();
  models::Llama m = models::Llama::from_weights(c, random_weights(c), Device::cuda(0));
  GenerateOptions opt;
  opt.max_new_tokens = 20;
  opt.stop_tokens = {100000};
  opt.temperature = 0.8;
  opt.top_k = 40;
  opt.seed = 3;
  auto a = Generator(m, opt).generate({1, 2, 3});
  opt.cuda_graph = false;
  auto b = Generator(m, opt).generate({1, 2, 3});
  EXPECT_EQ(a, b);
}

// Greedy graph decoding queues each step before the host has read the token of the one before:
// a stop token, or an end asked by on_token, leaves one step run past it. The result must end at
// the stop, and the next call must not see that step (its token, its cache row).
TEST(CudaLlama, GreedyGraphDecodeEndsAtStopsAndRunsAgain) {
  SKIP_WITHOUT_GPU();
  auto c = small_config();
  models::Llama m = models::Llama::from_weights(c, random_weights(c), Device::cuda(0));
  std::vector<uint32_t> prompt = {4, 90, 17, 333};
  GenerateOptions opt;
  opt.max_new_tokens = 24;
  opt.max_len = 40;
  opt.stop_tokens = {100000};
  opt.cuda_graph = false;
  const auto plain = Generator(m, opt).generate(prompt);
  ASSERT_EQ(plain.size(), 24u);
  // A stop: the first token after the fifth that has not been seen before it.
  size_t at = 5;
  while (at < plain.size() && std::find(plain.begin(), plain.begin() + static_cast<ptrdiff_t>(at),
                                        plain[at]) != plain.begin() + static_cast<ptrdiff_t>(at)) {
    ++at;
  }
  ASSERT_LT(at, plain.size()) << "random weights gave no fresh token to stop at";
  opt.cuda_graph = true;
  opt.stop_tokens = {plain[at]};
  Generator gen(m, opt);
  const std::vector<uint32_t> to_stop(plain.begin(),
                                      plain.begin() + static_cast<ptrdiff_t>(at) + 1);
  EXPECT_EQ(gen.generate(prompt), to_stop);
  EXPECT_TRUE(gen.stats().used_cuda_graph);
  size_t seen = 0;
  auto three = gen.generate(prompt, [&](uint32_t) { return ++seen < 3; });
  EXPECT_EQ(three, std::vector<uint32_t>(plain.begin(), plain.begin() + 3));
  EXPECT_EQ(gen.generate(prompt), to_stop);
  // The last token the budget allows: no step is queued past it.
  opt.stop_tokens = {100000};
  opt.max_new_tokens = 36;
  Generator full(m, opt);
  auto all = full.generate(prompt);
  ASSERT_EQ(all.size(), 36u);
  EXPECT_EQ(std::vector<uint32_t>(all.begin(), all.begin() + 24), plain);
}

TEST(CudaDecoderOps, TokenMailboxPostsTokensByPosition) {
  SKIP_WITHOUT_GPU();
  Device dev = Device::cuda(0);
  detail::TokenMailbox mailbox(dev);
  Tensor input = Tensor::from_vec(std::vector<uint32_t>{7, 41}, {2}, dev);
  mailbox.advance(Tensor::from_vec(std::vector<uint32_t>{123}, {1}, dev), input);
  mailbox.advance(Tensor::from_vec(std::vector<uint32_t>{9}, {1}, dev), input);
  EXPECT_EQ(mailbox.wait(42), 123u);
  EXPECT_EQ(mailbox.wait(43), 9u);
  EXPECT_EQ(input.to_vec1<uint32_t>(), (std::vector<uint32_t>{9, 43}));
  // Nothing will post position 44: the wait ends once the device is idle.
  EXPECT_THROW(mailbox.wait(44), BackendError);
  mailbox.clear();
  EXPECT_THROW(mailbox.wait(43), BackendError);
  EXPECT_THROW(mailbox.advance(Tensor::from_vec(std::vector<uint32_t>{1, 2}, {2}, dev), input),
               ShapeMismatch);
  EXPECT_THROW(detail::TokenMailbox mailbox_on_cpu(Device::cpu()), DeviceMismatch);
}

// ---- the fused decoder ops: GPU against the CPU's (tested there against f64 compositions) ----

TEST(CudaDecoderOps, AddRmsNormAndSiluMulMatchCpu) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (size_t d : {size_t{64}, size_t{576}, size_t{2048}, size_t{5000}}) {
      Tensor x = testing::random_tensor({3, d}, dt), delta = testing::random_tensor({3, d}, dt);
      Tensor w = testing::random_tensor({d}, dt);
      nn::ResidualNorm c = nn::add_rms_norm(x, delta, w, 1e-5);
      nn::ResidualNorm g =
          nn::add_rms_norm(x.to_device(gpu), delta.to_device(gpu), w.to_device(gpu), 1e-5);
      EXPECT_TRUE(testing::close_to(g.residual, testing::f64(c.residual), testing::tolerance(dt)))
          << dt << " " << d;
      EXPECT_TRUE(testing::close_to(g.normed, testing::f64(c.normed), 2 * testing::tolerance(dt)))
          << dt << " " << d;
      Tensor gu = testing::random_tensor({2, 2 * d}, dt);
      EXPECT_TRUE(testing::close_to(nn::silu_mul(gu.to_device(gpu)), testing::f64(nn::silu_mul(gu)),
                                    2 * testing::tolerance(dt)))
          << dt << " " << d;
    }
  }
}

// add_rms_normed on the GPU keeps the bits of x.add(delta.rms_norm(w)) there: rows the norm's
// warp kernel (d <= 1024), vector row kernel (2560, 1152), register block kernel (1030: not whole
// vectors) and looping block kernel (9000) take, weights of the dtype and f32 (Gemma's 1 + w).
TEST(CudaDecoderOps, AddRmsNormedEqualsCompositionBitForBit) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  const double eps = 1e-6;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    std::vector<DType> weights{dt};
    if (dt != DType::F32) weights.push_back(DType::F32);
    for (DType wt : weights) {
      for (size_t d :
           {size_t{1152}, size_t{2560}, size_t{64}, size_t{40}, size_t{1030}, size_t{9000}}) {
        for (size_t rows : {size_t{1}, size_t{4}, size_t{33}}) {
          Tensor x = testing::random_tensor({rows, d}, dt);
          Tensor delta = testing::random_tensor({rows, d}, dt);
          Tensor w = testing::random_tensor({d}, wt);
          Tensor xg = x.to_device(gpu), dg = delta.to_device(gpu), wg = w.to_device(gpu);
          std::vector<double> got = nn::add_rms_normed(xg, dg, wg, eps).to_vec_f64();
          std::vector<double> want = xg.add(dg.rms_norm(wg, eps)).to_vec_f64();
          size_t differ = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            differ += got[i] != want[i] || std::signbit(got[i]) != std::signbit(want[i]);
          }
          EXPECT_EQ(differ, 0u) << dt << " weight " << wt << " rows " << rows << " d " << d;
          // And near the CPU's (tested there against a float64 reference).
          EXPECT_TRUE(testing::close_to(nn::add_rms_normed(xg, dg, wg, eps),
                                        testing::f64(nn::add_rms_normed(x, delta, w, eps)),
                                        2 * testing::tolerance(dt)))
              << dt << " weight " << wt << " rows " << rows << " d " << d;
        }
      }
    }
  }
  Tensor x = testing::random_tensor({2, 8}, DType::BF16).to_device(gpu);
  EXPECT_THROW(nn::add_rms_normed(x, x.to_device(Device::cpu()),
                                  testing::random_tensor({8}, DType::F32).to_device(gpu), eps),
               DeviceMismatch);
}

// Tables of d / 2 (whole heads rotate) and of d / 4 (partial rotary: the first half of each head
// rotates, the rest passes through).
TEST(CudaDecoderOps, RopeWriteAtPositionMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  size_t b = 2, s = 3, h = 4, hkv = 2, d = 16, max_len = 12, p = 7;
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool with_bias : {false, true}) {
      const size_t rot_half = with_bias ? d / 4 : d / 2;
      Tensor qkv = testing::random_tensor({b, s, (h + 2 * hkv) * d}, dt);
      Tensor bias = with_bias ? testing::random_tensor({(h + 2 * hkv) * d}, dt) : Tensor();
      Tensor cos = testing::random_tensor({max_len, rot_half}, dt);
      Tensor sin = testing::random_tensor({max_len, rot_half}, dt);
      Tensor pos =
          Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(p)}, {1}, Device::cpu());
      auto run = [&](const Device& dev, Tensor& kc, Tensor& vc) {
        kc = Tensor::zeros({b, hkv, max_len, d}, dt, dev);
        vc = Tensor::zeros({b, hkv, max_len, d}, dt, dev);
        return nn::detail::rope_write_at_position(
            qkv.to_device(dev), with_bias ? bias.to_device(dev) : bias, h, hkv, cos.to_device(dev),
            sin.to_device(dev), kc, vc, pos.to_device(dev));
      };
      Tensor kc, vc, kg, vg;
      Tensor qc = run(Device::cpu(), kc, vc), qg = run(gpu, kg, vg);
      double tol = 2 * testing::tolerance(dt);
      EXPECT_TRUE(testing::close_to(qg, testing::f64(qc), tol)) << dt << with_bias;
      EXPECT_TRUE(testing::close_to(kg, testing::f64(kc), tol)) << dt << with_bias;
      EXPECT_TRUE(testing::close_to(vg, testing::f64(vc), tol)) << dt << with_bias;
    }
  }
}

// The rope + cache write with per-head norms (weights of the dtype, or f32), at a position and
// into a paged cache's slots, on the GPU against the CPU's composition: head widths of 1, 2 and 4
// pairs a lane, and one past the kernel's (its composition on the GPU); the bf16 runs with f32
// norms rotate the first 3/4 of each head only (partial rotary).
TEST(CudaDecoderOps, RopeWriteWithNormsAndPagesMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  const Device cpu = Device::cpu();
  const size_t s = 3, h = 4, hkv = 2, rows = 12, p = 7;
  // bf16 with f32 norm weights: Gemma's, normalised in f32 and rounded once.
  for (auto [dtype, norm_dtype] :
       {std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::BF16},
        std::pair{DType::BF16, DType::F32}}) {
    const DType dt = dtype, norm_dt = norm_dtype;  // lambdas below capture them (not bindings)
    for (size_t d : {size_t{16}, size_t{128}, size_t{256}, size_t{512}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " norms " + dtype_name(norm_dt) + " d " +
                   std::to_string(d));
      Tensor qkv = testing::random_tensor({1, s, (h + 2 * hkv) * d}, dt);
      Tensor bias = testing::random_tensor({(h + 2 * hkv) * d}, dt);
      Tensor qn = testing::random_tensor({d}, norm_dt), kn = testing::random_tensor({d}, norm_dt);
      const size_t rot_half = norm_dt != dt ? 3 * d / 8 : d / 2;
      Tensor cos = testing::random_tensor({rows, rot_half}, dt);
      Tensor sin = testing::random_tensor({rows, rot_half}, dt);
      std::vector<uint32_t> positions = {11, 0, 4}, slots = {9, 2, 7};
      auto on = [&](const Tensor& t, const Device& dev) { return t.to_device(dev); };
      auto run = [&](const Device& dev, Tensor& kc, Tensor& vc, Tensor& kp, Tensor& vp) {
        nn::detail::HeadNorms norms{on(qn, dev), on(kn, dev), 1e-6};
        kc = Tensor::zeros({1, hkv, rows, d}, dt, dev);
        vc = Tensor::zeros({1, hkv, rows, d}, dt, dev);
        kp = Tensor::zeros({3, hkv, 4, d}, dt, dev);
        vp = Tensor::zeros({3, hkv, 4, d}, dt, dev);
        Tensor pos = Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(p)}, {1}, dev);
        Tensor q = nn::detail::rope_write_at_position(
            on(qkv, dev), on(bias, dev), h, hkv, on(cos, dev), on(sin, dev), kc, vc, pos, norms);
        Tensor q_paged = nn::detail::rope_write_paged(
            on(qkv, dev).reshape({s, (h + 2 * hkv) * d}), on(bias, dev), h, hkv, on(cos, dev),
            on(sin, dev), kp, vp, Tensor::from_vec(positions, {s}, dev),
            Tensor::from_vec(slots, {s}, dev), norms);
        return std::make_pair(q, q_paged);
      };
      Tensor kc, vc, kp, vp, kg, vg, kpg, vpg;
      auto [qc, qpc] = run(cpu, kc, vc, kp, vp);
      auto [qg, qpg] = run(gpu, kg, vg, kpg, vpg);
      double tol = 2 * testing::tolerance(dt);
      EXPECT_TRUE(testing::close_to(qg, testing::f64(qc), tol));
      EXPECT_TRUE(testing::close_to(kg, testing::f64(kc), tol));
      EXPECT_TRUE(testing::close_to(vg, testing::f64(vc), tol));
      EXPECT_TRUE(testing::close_to(qpg, testing::f64(qpc), tol));
      EXPECT_TRUE(testing::close_to(kpg, testing::f64(kp), tol));
      EXPECT_TRUE(testing::close_to(vpg, testing::f64(vp), tol));
    }
  }
}

// The graph step's attention to the cache rows up to a device position, against attention over
// those rows alone (f64 on the CPU). Rows past the position hold NaN: they must not be read.
TEST(CudaDecoderOps, AttendToPositionReadsRowsUpToIt) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  namespace md = nn::detail;
  size_t b = 2, h = 8, hkv = 2;
  for (DType dt : {DType::BF16, DType::F16}) {
    for (size_t d : {size_t{64}, size_t{128}, size_t{256}}) {
      // 2000 rows: several key splits; 40: one tile-row short of three tiles.
      for (size_t len : {size_t{40}, size_t{2000}}) {
        for (size_t p : {size_t{0}, size_t{17}, len - 1, len + 5}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " d " + std::to_string(d) + " len " +
                       std::to_string(len) + " position " + std::to_string(p));
          size_t last = std::min(p, len - 1);
          Tensor q = testing::random_tensor({b, h, 1, d}, dt);
          Tensor k = testing::random_tensor({b, hkv, len, d}, dt);
          Tensor v = testing::random_tensor({b, hkv, len, d}, dt);
          if (last + 1 < len) {
            Tensor nan = Tensor::full(std::numeric_limits<float>::quiet_NaN(),
                                      {b, hkv, len - last - 1, d}, Device::cpu())
                             .to_dtype(dt);
            k.narrow(2, last + 1, len - last - 1).assign(nan);
            v.narrow(2, last + 1, len - last - 1).assign(nan);
          }
          Tensor pos = Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(p)}, {1}, gpu);
          Tensor out;
          ASSERT_TRUE(md::attend_to_position(q.to_device(gpu), k.to_device(gpu), v.to_device(gpu),
                                             pos, &out));
          EXPECT_EQ(out.shape(), Shape({b, h, 1, d}));
          Tensor want = nn::scaled_dot_product_attention(
              testing::f64(q), testing::f64(k.narrow(2, 0, last + 1)),
              testing::f64(v.narrow(2, 0, last + 1)), {});
          EXPECT_TRUE(testing::close_to(out, want, 2 * testing::tolerance(dt)));
        }
      }
    }
  }
  // Not for f32 (no decode kernel) nor the CPU: the caller masks. Mismatched shapes throw.
  Tensor q = testing::random_tensor({1, 4, 1, 64}, DType::F32),
         k = testing::random_tensor({1, 2, 30, 64}, DType::F32);
  Tensor pos_cpu = Tensor::from_vec(std::vector<uint32_t>{3}, {1}, Device::cpu()), out;
  EXPECT_FALSE(md::attend_to_position(q, k, k, pos_cpu, &out));
  EXPECT_FALSE(md::attend_to_position(q.to_device(gpu), k.to_device(gpu), k.to_device(gpu),
                                      pos_cpu.to_device(gpu), &out));
  EXPECT_THROW(md::attend_to_position(q, k.narrow(3, 0, 32), k.narrow(3, 0, 32), pos_cpu, &out),
               ShapeMismatch);
  EXPECT_THROW(md::attend_to_position(q.to_device(gpu), k, k, pos_cpu, &out), DeviceMismatch);
}

// A key window covering the position gives the logits of the whole-cache step.
TEST(CudaLlama, DecodeStepKeyWindowEqualsWholeCache) {
  SKIP_WITHOUT_GPU();
  auto c = small_config();
  models::Llama m = models::Llama::from_weights(c, random_weights(c), Device::cuda(0));
  models::KvCache cache = m.make_cache(1, 300);
  std::vector<uint32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<uint32_t>((i * 37) % 500);
  (void)m.forward_last(Tensor::from_vec(prompt, {1, prompt.size()}, Device::cuda(0)), cache);
  Tensor tok = Tensor::from_vec(std::vector<uint32_t>{11}, {1, 1}, Device::cuda(0));
  Tensor pos = Tensor::from_vec(std::vector<uint32_t>{40}, {1}, Device::cuda(0));
  Tensor whole, windowed;
  uint32_t a = m.decode_step(tok, pos, cache, &whole).to_vec1<uint32_t>()[0];
  uint32_t b = m.decode_step(tok, pos, cache, &windowed, 64).to_vec1<uint32_t>()[0];
  EXPECT_EQ(a, b);
  EXPECT_TRUE(testing::all_close(windowed.to_vec_f64(), whole.to_vec_f64(), 1e-4, 1e-4));
  EXPECT_THROW(m.decode_step(tok, pos, cache, nullptr, 301), IndexOutOfRange);
}

// The decode step's attention reads the cache rows before the position while the projection that
// writes the position's row finishes: that row must be the one just written. The rows from the
// position on hold NaN before the step; its logits must be those of the whole sequence's forward.
TEST(CudaLlama, DecodeStepAttendsToTheRowItWrites) {
  SKIP_WITHOUT_GPU();
  auto c = small_config();
  Device gpu = Device::cuda(0);
  models::Llama m = models::Llama::from_weights(c, random_weights(c), gpu, DType::BF16);
  std::vector<uint32_t> ids(41);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 61 + 5) % 500);
  const std::vector<uint32_t> prompt(ids.begin(), ids.end() - 1);
  models::KvCache cache = m.make_cache(1, 64);
  for (size_t li = 0; li < cache.layers(); ++li) {
    for (const Tensor& t : {cache.k(li), cache.v(li)}) {
      t.assign(Tensor::full(std::numeric_limits<float>::quiet_NaN(), t.shape(), gpu)
                   .to_dtype(DType::BF16));
    }
  }
  (void)m.forward_last(Tensor::from_vec(prompt, {1, prompt.size()}, gpu), cache);
  Tensor tok = Tensor::from_vec(std::vector<uint32_t>{ids.back()}, {1, 1}, gpu);
  Tensor pos = Tensor::from_vec(std::vector<uint32_t>{40}, {1}, gpu);
  Tensor step;
  (void)m.decode_step(tok, pos, cache, &step);
  models::KvCache fresh = m.make_cache(1, 64);
  Tensor whole = m.forward_last(Tensor::from_vec(ids, {1, ids.size()}, gpu), fresh);
  const std::vector<double> got = step.to_vec_f64(), want = whole.to_vec_f64();
  const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
  const double tol = testing::tolerance(DType::BF16) * (*hi - *lo);
  EXPECT_TRUE(testing::all_close(got, want, 0, tol)) << "logit range " << *hi - *lo;
}

// Generation past one 256-row key window: the graph of the next window takes over.
TEST(CudaLlama, GraphDecodeAcrossKeyWindows) {
  SKIP_WITHOUT_GPU();
  auto c = small_config();
  auto w = random_weights(c);
  models::Llama m = models::Llama::from_weights(c, w, Device::cuda(0));
  std::vector<uint32_t> prompt(250);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<uint32_t>((i * 53) % 500);
  GenerateOptions opt;
  opt.max_new_tokens = 20;
  opt.stop_tokens = {100000};
  opt.max_len = 600;
  auto graph = Generator(m, opt).generate(prompt);
  opt.cuda_graph = false;
  auto plain = Generator(m, opt).generate(prompt);
  ASSERT_EQ(graph.size(), plain.size());
  EXPECT_EQ(std::vector<uint32_t>(graph.begin(), graph.begin() + 10),
            std::vector<uint32_t>(plain.begin(), plain.begin() + 10));
}

// The head's argmax inside the projection kernel: the first of equal maxima, the first NaN (as
// Tensor::argmax), -0 equal to +0, and launch after launch (the pick leaves the blocks' offer
// slots at zero each time; 750 blocks share 64 slots).
TEST(CudaDecodeGemv, FusedArgmaxTakesTheFirstOfEquals) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  const size_t n = 3000, k = 256;
  Tensor x = Tensor::ones({1, k}, DType::BF16, gpu);
  // Row r's logit is k * value[r]: each row holds one value.
  auto argmax_of = [&](const std::vector<float>& value) {
    std::vector<float> w(n * k);
    for (size_t r = 0; r < n; ++r) std::fill_n(w.begin() + r * k, k, value[r]);
    nn::QLinear wl(Tensor::from_vec(w, {n, k}, Device::cpu()).to_dtype(DType::BF16).to_device(gpu));
    Tensor y, ids;
    EXPECT_TRUE(cuda::fused_linear(x, Tensor(), 0, wl, &y, &ids));
    const uint32_t want = y.argmax(1).to_vec1<uint32_t>()[0];
    const uint32_t got = ids.to_vec1<uint32_t>()[0];
    EXPECT_EQ(got, want);
    return got;
  };
  std::vector<float> v(n, -0.25f);
  v[2999] = 0.5f;
  EXPECT_EQ(argmax_of(v), 2999u);
  v[1234] = v[17] = 0.5f;
  EXPECT_EQ(argmax_of(v), 17u);
  std::fill(v.begin(), v.end(), -0.25f);
  v[900] = 0.0f;
  v[40] = -0.0f;
  EXPECT_EQ(argmax_of(v), 40u);
  v[2500] = std::nanf("");
  v[700] = -std::nanf("");
  EXPECT_EQ(argmax_of(v), 700u);
  std::fill(v.begin(), v.end(), -1.0f);  // all equal
  EXPECT_EQ(argmax_of(v), 0u);
}

// The fused one-token projections on the GPU against the same step composed from separate ops on
// the CPU (linear, then rope_write_at_position / silu_mul / add_rms_norm), for plain weights and
// for Q4_0 / Q4_1 / Q8_0 blocks. Quantized weights are compared with their dequantised values
// composed in f32 (exact weights; the only difference is the output's rounding).
TEST(CudaDecodeGemv, FusedProjectionsMatchComposition) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  namespace md = cuda;
  std::vector<std::optional<GgmlType>> formats = {std::nullopt};
  for (GgmlType t : testing::qmatmul_block_types()) formats.push_back(t);
  for (const auto& format : formats) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE((format ? ggml_type_name(*format) : std::string("dense")) + " " +
                   dtype_name(dt));
      // The composition's dtype: x's for plain weights, f32 for dequantised ones.
      DType ref_dt = format ? DType::F32 : dt;
      double tol = 4 * testing::tolerance(dt);
      // A weight on the GPU (plain or quantized) and its values on the CPU in ref_dt.
      auto weight = [&](size_t n, size_t k, Tensor* ref) -> nn::QLinear {
        if (!format) {
          Tensor w = testing::random_tensor({n, k}, dt).affine(0.1, 0);
          *ref = w;
          return w.to_device(gpu);
        }
        QTensor q = testing::random_qtensor(*format, n, k);
        *ref = q.dequantize();
        return nn::QLinear(std::vector<QTensor>{q.to_device(gpu)});
      };
      // GGML weights: the kernel dots the activations quantized as the CPU's qmatmul takes them
      // (16-bit blocks of 32, cpu/qmatmul.h), so the composition takes them so too; what is left
      // is f32 rounding (without it, the 16-bit rounding alone reaches 3/4 of tol for f32).
      auto activations = [&](const Tensor& x) {
        Tensor v = x.to_dtype(ref_dt);
        if (!format) return v;
        std::vector<float> f = v.flatten_all().to_vec1<float>();
        cpu::Q8Rows q;
        q.quantize(f.data(), 1, f.size(), /*wide=*/true);
        for (size_t j = 0; j < f.size(); ++j) f[j] = (255.0f * q.qs[j] + q.lo[j]) * q.d[j / 32];
        return Tensor::from_vec(f, v.shape(), Device::cpu());
      };
      auto linear = [&](const Tensor& x, const Tensor& w) {
        return activations(x)
            .reshape({1, x.elem_count()})
            .matmul(w.t())
            .reshape({1, 1, w.dims()[0]});
      };
      // k = 2304: rows longer than one round of the block's threads; 2048 and 6144: GGML rows
      // in warp-owned pairs, one unit of x a lane in registers and three from shared memory.
      for (size_t k : {size_t{192}, size_t{2304}, size_t{2048}, size_t{6144}}) {
        SCOPED_TRACE("k " + std::to_string(k));
        size_t max_len = 9, p = 5;
        double eps = 1e-5;
        Tensor x = testing::random_tensor({1, 1, k}, dt), xg = x.to_device(gpu);
        // Rows of whole blocks (super-blocks of 256: no row of 192). The kernel copies rows 4
        // bytes at a time at least: rows of 2 bytes more (Q3_K's and Q6_K's odd super-block
        // counts) are left to the composition.
        if (format && k % ggml_block_size(*format) != 0) continue;
        if (format && ggml_bytes(*format, k) % 4 != 0) {
          Tensor unused, y;
          EXPECT_FALSE(md::fused_linear(xg, Tensor(), eps, weight(64, k, &unused), &y));
          continue;
        }
        // Each projection that takes a norm in, with and without it.
        Tensor nw = testing::random_tensor({k}, dt), nwg = nw.to_device(gpu);
        // Small outputs run blocks of 2 rows, large ones blocks of 8 (the last block partly past
        // the end when the pairs are not a multiple of 4).
        for (bool norm : {false, true}) {
          for (bool large : {false, true}) {
            SCOPED_TRACE(std::string(norm ? "norm in" : "no norm") +
                         (large ? ", large" : ", small"));
            size_t h = large ? 32 : 4, hkv = large ? 8 : 2, d = large ? 64 : 16;
            size_t n_out = large ? 2050 : 130, n_gate = large ? 1042 : 96;
            Tensor in = norm ? x.to_dtype(ref_dt).rms_norm(nw.to_dtype(ref_dt), eps) : x;
            Tensor norm_g = norm ? nwg : Tensor();
            // Plain output (the quantized lm_head).
            Tensor wl_ref;
            nn::QLinear wl = weight(n_out, k, &wl_ref);
            Tensor y, ids;
            ASSERT_TRUE(md::fused_linear(xg, norm_g, eps, wl, &y, format ? nullptr : &ids));
            EXPECT_EQ(y.shape(), Shape({1, 1, n_out}));
            EXPECT_TRUE(testing::close_to(y, testing::f64(linear(in, wl_ref)), tol));
            if (!format) {  // the argmax of the logits the kernel stored
              ASSERT_EQ(ids.shape(), Shape({1, 1}));
              EXPECT_EQ(ids.to_device(Device::cpu()).flatten_all().to_vec1<uint32_t>(),
                        y.argmax(2).to_device(Device::cpu()).flatten_all().to_vec1<uint32_t>());
            } else {
              EXPECT_FALSE(md::fused_linear(xg, norm_g, eps, wl, &y, &ids));
            }
            // qkv + rope + cache write, with a bias; with the norm in, partial rotary (the first
            // 3/4 of each head rotate, as Phi-4-mini's).
            Tensor w_ref;
            nn::QLinear w = weight((h + 2 * hkv) * d, k, &w_ref);
            Tensor bias = testing::random_tensor({(h + 2 * hkv) * d}, dt);
            const size_t rot_half = norm ? 3 * d / 8 : d / 2;
            Tensor cos = testing::random_tensor({max_len, rot_half}, dt);
            Tensor sin = testing::random_tensor({max_len, rot_half}, dt);
            Tensor pos = Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(p)}, {1},
                                          Device::cpu());
            Tensor kc = Tensor::zeros({1, hkv, max_len, d}, ref_dt, Device::cpu()), vc = kc.copy();
            Tensor q_ref = nn::detail::rope_write_at_position(
                linear(in, w_ref), bias.to_dtype(ref_dt), h, hkv, cos.to_dtype(ref_dt),
                sin.to_dtype(ref_dt), kc, vc, pos);
            Tensor kg = Tensor::zeros({1, hkv, max_len, d}, dt, gpu), vg = kg.copy(), q;
            ASSERT_TRUE(md::fused_qkv_rope(xg, norm_g, eps, w, bias.to_device(gpu), h, hkv,
                                           cos.to_device(gpu), sin.to_device(gpu), kg, vg,
                                           pos.to_device(gpu), &q));
            EXPECT_TRUE(testing::close_to(q, testing::f64(q_ref), tol));
            EXPECT_TRUE(testing::close_to(kg, testing::f64(kc), tol));
            EXPECT_TRUE(testing::close_to(vg, testing::f64(vc), tol));
            // gate/up + silu * up.
            Tensor wgu_ref;
            nn::QLinear wgu = weight(2 * n_gate, k, &wgu_ref);
            Tensor act;
            ASSERT_TRUE(md::fused_gate_up(xg, norm_g, eps, wgu, GatedActivation::SiLU, &act));
            EXPECT_TRUE(
                testing::close_to(act, testing::f64(nn::silu_mul(linear(in, wgu_ref))), tol));
            // Not for two rows: the caller composes.
            Tensor two = testing::random_tensor({1, 2, k}, dt).to_device(gpu);
            EXPECT_FALSE(md::fused_gate_up(two, norm_g, eps, wgu, GatedActivation::SiLU, &act));
          }
        }
        // projection + residual add; n = 4096 takes the kernel's 8-row blocks; n = 16388 gives
        // GGML rows more groups of 8 than the streaming kernel has blocks (the last one partial).
        for (size_t n : {size_t{576}, size_t{2050}, size_t{4096}, size_t{16388}}) {
          Tensor wo_ref;
          nn::QLinear wo = weight(n, k, &wo_ref);
          Tensor res = testing::random_tensor({1, 1, n}, dt), sum;
          Tensor ref = res.to_dtype(ref_dt).add(linear(x, wo_ref));
          ASSERT_TRUE(md::fused_project_add(xg, wo, res.to_device(gpu), &sum));
          EXPECT_TRUE(testing::close_to(sum, testing::f64(ref), tol)) << n;
        }
      }
    }
  }
  // Nor for the CPU, nor for rows the kernel cannot copy (one Q3_K super-block: 110 bytes).
  Tensor x = testing::random_tensor({1, 1, 256}, DType::F32), act;
  EXPECT_FALSE(md::fused_gate_up(x, Tensor(), 0, testing::random_tensor({64, 256}, DType::F32),
                                 GatedActivation::SiLU, &act));
  nn::QLinear q3_k(
      std::vector<QTensor>{testing::random_qtensor(GgmlType::Q3_K, 64, 256).to_device(gpu)});
  EXPECT_FALSE(md::fused_gate_up(x.to_device(gpu), Tensor(), 0, q3_k, GatedActivation::SiLU, &act));
}

// Gemma's pieces of the fused projections: an f32 norm weight of bf16 / f16 activations (the norm
// in f32, rounded once, as Tensor::rms_norm takes it) and the GELU-gated FFN, on the GPU against
// the same ops composed on the CPU, for plain and Q8_0 weights.
TEST(CudaDecodeGemv, F32NormWeightsAndGeluGateMatchComposition) {
  SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  for (bool quantized : {false, true}) {
    for (DType dt : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(quantized ? "q8_0 " : "dense ") + dtype_name(dt));
      const double tol = 4 * testing::tolerance(dt);
      const size_t k = 1152, n = 384;  // Gemma 3 1B's hidden size
      auto weight = [&](size_t rows, Tensor* ref) -> nn::QLinear {
        if (!quantized) {
          Tensor w = testing::random_tensor({rows, k}, dt).affine(0.1, 0);
          *ref = w;
          return w.to_device(gpu);
        }
        QTensor q = testing::random_qtensor(GgmlType::Q8_0, rows, k);
        *ref = q.dequantize();
        return nn::QLinear(std::vector<QTensor>{q.to_device(gpu)});
      };
      Tensor x = testing::random_tensor({1, 1, k}, dt);
      const double eps = 1e-6;
      // The input: x's norm by an f32 weight (1 + w: in f32, one rounding to dt). GGML weights:
      // the kernel dots the activations quantized as the CPU's qmatmul takes them, and so does
      // the composition (in f32, with the dequantised weights).
      auto input = [&](const Tensor& nw) {
        Tensor normed = x.rms_norm(nw, eps);
        EXPECT_EQ(normed.dtype(), dt);
        if (!quantized) return normed.reshape({1, k});
        std::vector<float> f = normed.to_dtype(DType::F32).flatten_all().to_vec1<float>();
        cpu::Q8Rows q;
        q.quantize(f.data(), 1, f.size(), /*wide=*/true);
        for (size_t j = 0; j < f.size(); ++j) f[j] = (255.0f * q.qs[j] + q.lo[j]) * q.d[j / 32];
        return Tensor::from_vec(f, {1, k}, Device::cpu());
      };
      Tensor nw = testing::random_tensor({k}, DType::F32).affine(0.5, 1);
      Tensor w_ref, y;
      nn::QLinear w = weight(n, &w_ref);
      ASSERT_TRUE(cuda::fused_linear(x.to_device(gpu), nw.to_device(gpu), eps, w, &y));
      Tensor want = input(nw).matmul(w_ref.t()).reshape({1, 1, n});
      EXPECT_TRUE(testing::close_to(y, testing::f64(want), tol));
      // gate/up with the tanh GELU: gelu(gate) rounded, times up. The norm weight scaled so that
      // the gates are about 1 in size, where the GELU and the SiLU differ most.
      Tensor wgu_ref, act;
      nn::QLinear wgu = weight(2 * n, &wgu_ref);
      const double gate_rms = std::sqrt(input(nw)
                                            .matmul(wgu_ref.narrow(0, 0, n).t())
                                            .to_dtype(DType::F64)
                                            .sqr()
                                            .mean_all()
                                            .to_vec_f64()[0]);
      Tensor nw_gu = nw.affine(1 / gate_rms, 0);
      ASSERT_TRUE(cuda::fused_gate_up(x.to_device(gpu), nw_gu.to_device(gpu), eps, wgu,
                                      GatedActivation::GeluTanh, &act));
      Tensor gu = input(nw_gu).matmul(wgu_ref.t()).reshape({1, 1, 2 * n});
      Tensor act_ref = gu.narrow(2, 0, n).gelu().mul(gu.narrow(2, n, n));
      EXPECT_TRUE(testing::close_to(act, testing::f64(act_ref), tol));
      if (dt == DType::F16) {
        // Within f16's bound the SiLU's products are not the GELU's: the kernel's are.
        EXPECT_FALSE(testing::close_to(nn::silu_mul(gu), testing::f64(act_ref), tol));
        Tensor silu;
        ASSERT_TRUE(cuda::fused_gate_up(x.to_device(gpu), nw_gu.to_device(gpu), eps, wgu,
                                        GatedActivation::SiLU, &silu));
        EXPECT_TRUE(testing::close_to(silu, testing::f64(nn::silu_mul(gu)), tol));
      }
    }
  }
}

}  // namespace
}  // namespace wick
