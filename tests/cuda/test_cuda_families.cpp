// The decoder families of load_causal_lm on the GPU (tests/data/families, made by
// scripts/make_family_refs.py): transformers' logits in f32 and bf16, the Generator's greedy tokens
// with the decode step captured as a CUDA graph and op by op, and the attention's sliding window
// and soft-cap (the composition on CUDA) against the CPU kernels.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda/tuning_from_env.h"
#include "test_util.h"
#include "wick/cuda.h"
#include "wick/formats.h"
#include "wick/generator.h"
#include "wick/models.h"
#include "wick/nn/attention.h"
#include "wick/numerics.h"
#include "wick/wick.h"

namespace wick {
namespace {

using testing::max_abs_diff;
using testing::range_of;

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

std::string family_dir(const std::string& name) {
  return std::string(WICK_TEST_DATA_DIR) + "/families/" + name;
}

std::vector<uint32_t> to_u32(const Tensor& t) {
  std::vector<uint32_t> out;
  for (double v : t.to_vec_f64()) out.push_back(static_cast<uint32_t>(v));
  return out;
}

const char* const kFamilies[] = {
    "qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "phi3_partial", "phi3_partial_longrope"};

// f32 as on the CPU (256 unit roundoffs of the logits' range, tests/test_families.cpp); bf16
// within 16 of its unit roundoffs.
double bound_for(DType dt) {
  return dt == DType::F32 ? 256 * numerics::unit_roundoff(DType::F32)
                          : 16 * numerics::unit_roundoff(dt);
}

TEST(CudaFamilies, LogitsAndGreedyTokensEqualTransformers) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  for (const char* family : kFamilies) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(::testing::Message() << family << " " << dt);
      const std::string dir = family_dir(family);
      std::shared_ptr<const models::CausalLM> model = models::load_causal_lm(dir, gpu, dt);
      Tensor prompts = npy::load(dir + "/prompt.npy", Device::cpu());
      auto expected = npy::load(dir + "/logits.npy", Device::cpu()).to_vec_f64();
      Tensor ids = Tensor::from_vec(to_u32(prompts), {2, 12}, gpu);
      models::KvCache cache = model->make_cache(2, 28);
      Tensor logits = model->forward(ids, cache);
      EXPECT_LE(max_abs_diff(logits.to_vec_f64(), expected), bound_for(dt) * range_of(expected));
      if (dt != DType::F32) continue;
      // Greedy through the device-side decode step, captured as graphs and op by op.
      auto greedy = to_u32(npy::load(dir + "/greedy.npy", Device::cpu()));
      auto first = to_u32(prompts.get(0));
      for (bool graph : {true, false}) {
        GenerateOptions opt;
        opt.max_new_tokens = 10;
        opt.stop_tokens = {100000};
        opt.cuda_graph = graph;
        EXPECT_EQ(Generator(model, opt).generate(first), greedy) << "graph " << graph;
      }
    }
  }
}

// One decode step in bf16 after a prefill (the backend's decode plan where the family has one:
// Gemma's f32 norms, GELU gate, post-norms and local rope tables inside the fused projections)
// against transformers' logits of the same position, for key windows that the sliding windows
// of the configs (8) mask and that they do not.
TEST(CudaFamilies, DecodeStepInBf16GivesTransformersLogits) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  for (const char* family : kFamilies) {
    SCOPED_TRACE(family);
    const std::string dir = family_dir(family);
    std::shared_ptr<const models::CausalLM> model = models::load_causal_lm(dir, gpu, DType::BF16);
    const size_t vocab = model->config().vocab_size, last = 11;
    auto prompt = to_u32(npy::load(dir + "/prompt.npy", Device::cpu()).get(0));
    auto expected = npy::load(dir + "/logits.npy", Device::cpu()).get(0).get(last).to_vec_f64();
    ASSERT_EQ(expected.size(), vocab);
    for (size_t key_window : {size_t{12}, size_t{28}}) {
      models::KvCache cache = model->make_cache(1, 28);
      std::vector<uint32_t> head(prompt.begin(), prompt.begin() + last);
      model->forward(Tensor::from_vec(head, {1, last}, gpu), cache);
      Tensor token = Tensor::from_vec(std::vector<uint32_t>{prompt[last]}, {1, 1}, gpu);
      Tensor position =
          Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(last)}, {1}, gpu);
      Tensor logits;
      Tensor next = model->decode_step(token, position, cache, &logits, key_window);
      auto got = logits.to_vec_f64();
      EXPECT_LE(max_abs_diff(got, expected), bound_for(DType::BF16) * range_of(expected))
          << "key window " << key_window;
      EXPECT_EQ(to_u32(next), to_u32(logits.argmax(1))) << "key window " << key_window;
    }
  }
}

TEST(CudaFamilies, AttentionWindowAndSoftCapEqualTheCpu) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  std::vector<float> qv(2 * 4 * 40 * 16), kv(2 * 2 * 40 * 16);
  for (size_t i = 0; i < qv.size(); ++i) qv[i] = static_cast<float>(std::sin(0.37 * i));
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(std::cos(0.21 * i));
  Tensor q = Tensor::from_vec(qv, {2, 4, 40, 16}, Device::cpu());
  Tensor k = Tensor::from_vec(kv, {2, 2, 40, 16}, Device::cpu());
  for (size_t s : {40u, 1u}) {
    nn::AttentionOptions opt;
    opt.causal = true;
    opt.window = 9;
    opt.softcap = 1.5;
    Tensor qs = q.narrow(2, 40 - s, s).contiguous();
    auto want = nn::scaled_dot_product_attention(qs, k, k, opt).to_vec_f64();
    auto got =
        nn::scaled_dot_product_attention(qs.to_device(gpu), k.to_device(gpu), k.to_device(gpu), opt)
            .to_vec_f64();
    EXPECT_LE(max_abs_diff(got, want), 64 * numerics::unit_roundoff(DType::F32)) << s;
  }
}

}  // namespace
}  // namespace wick
