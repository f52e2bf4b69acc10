// models::CausalLM through load_causal_lm: each family's tiny model (random weights, references
// made by transformers itself: scripts/make_llama_refs.py tiny) gives transformers' logits and
// greedy tokens, whole and in chunks; unknown architectures are refused by name.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "wick/formats.h"
#include "wick/generator.h"
#include "wick/models.h"

namespace wick {
namespace {

using testing::max_abs_diff;
using testing::range_of;

std::string llama_data(const std::string& name) {
  return std::string(WICK_LLAMA_DATA) + "/" + name;
}

std::vector<uint32_t> to_u32(const Tensor& t) {
  std::vector<uint32_t> out;
  for (double v : t.to_vec_f64()) out.push_back(static_cast<uint32_t>(v));
  return out;
}

struct Family {
  const char* folder;
  const char* architecture;
};

class CausalLMFamily : public ::testing::TestWithParam<Family> {};

TEST_P(CausalLMFamily, LogitsChunksAndGreedyTokensEqualTransformers) {
  const Family f = GetParam();
  std::string dir = llama_data(f.folder);
  std::shared_ptr<const models::CausalLM> model =
      models::load_causal_lm(dir, Device::cpu(), DType::F32);
  const models::CausalLMConfig& c = model->config();
  EXPECT_EQ(c.architecture, f.architecture);
  EXPECT_GT(c.num_layers, 0u);
  EXPECT_EQ(c.num_heads % c.num_kv_heads, 0u);
  EXPECT_EQ(model->device(), Device::cpu());
  EXPECT_EQ(model->dtype(), DType::F32);

  auto prompt = to_u32(npy::load(dir + "/prompt.npy", Device::cpu()));
  Tensor ref = npy::load(dir + "/logits.npy", Device::cpu());
  auto expected = ref.to_vec_f64();
  const double range = range_of(expected);
  ASSERT_GT(range, 1.0);
  ASSERT_EQ(ref.dims()[1], c.vocab_size);

  // Whole prompt in one forward: transformers ran in f32 too, both within ~1e-6 of exact.
  models::KvCache cache = model->make_cache(1, prompt.size() + 16);
  Tensor ids = Tensor::from_vec(prompt, {1, prompt.size()}, Device::cpu());
  Tensor logits = model->forward(ids, cache).squeeze(0);
  ASSERT_EQ(logits.shape(), ref.shape());
  EXPECT_LE(max_abs_diff(logits.to_vec_f64(), expected), 1e-5 * range);
  EXPECT_EQ(cache.length(), prompt.size());

  // The same prompt in chunks of 3 positions continues from the cache.
  models::KvCache chunked = model->make_cache(1, prompt.size());
  std::vector<Tensor> parts;
  for (size_t at = 0; at < prompt.size(); at += 3) {
    size_t n = std::min<size_t>(3, prompt.size() - at);
    parts.push_back(model->forward(ids.narrow(1, at, n), chunked));
  }
  Tensor joined = Tensor::cat(parts, 1).squeeze(0);
  EXPECT_LE(max_abs_diff(joined.to_vec_f64(), expected), 1e-5 * range);

  // The last position alone, and greedy decoding through a Generator over the interface.
  models::KvCache last_cache = model->make_cache(1, prompt.size());
  Tensor last = model->forward_last(ids, last_cache);
  auto last_ref = ref.get(prompt.size() - 1).to_vec_f64();
  EXPECT_LE(max_abs_diff(last.squeeze(0).to_vec_f64(), last_ref), 1e-5 * range);

  GenerateOptions opt;
  opt.max_new_tokens = 16;
  opt.stop_tokens = {100000};
  auto greedy = to_u32(npy::load(dir + "/greedy.npy", Device::cpu()));
  EXPECT_EQ(Generator(model, opt).generate(prompt), greedy);
  EXPECT_EQ(Generator(*model, opt).generate(prompt), greedy);
}

INSTANTIATE_TEST_SUITE_P(Tiny, CausalLMFamily,
                         ::testing::Values(Family{"tiny_llama", "llama"},
                                           Family{"tiny_qwen2", "qwen2"},
                                           Family{"tiny_llama3_scaled", "llama"}),
                         [](const auto& info) { return std::string(info.param.folder); });

TEST(CausalLMLoad, DecodeStepOnTheCpuEqualsForward) {
  auto model = models::load_causal_lm(llama_data("tiny_qwen2"), Device::cpu());
  ASSERT_TRUE(model->has_decode_step());
  auto prompt = to_u32(npy::load(llama_data("tiny_qwen2") + "/prompt.npy", Device::cpu()));
  models::KvCache a = model->make_cache(1, prompt.size() + 1);
  models::KvCache b = model->make_cache(1, prompt.size() + 1);
  Tensor ids = Tensor::from_vec(prompt, {1, prompt.size()}, Device::cpu());
  model->forward(ids, a);
  model->forward(ids, b);
  Tensor token = Tensor::from_vec(std::vector<uint32_t>{7}, {1, 1}, Device::cpu());
  Tensor pos = Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(prompt.size())}, {1},
                                Device::cpu());
  Tensor step_logits;
  Tensor next = model->decode_step(token, pos, a, &step_logits);
  Tensor ref = model->forward_last(token, b);
  auto r = ref.to_vec_f64();
  EXPECT_LE(max_abs_diff(step_logits.to_vec_f64(), r), 1e-5 * range_of(r));
  EXPECT_EQ(next.to_vec1<uint32_t>(), ref.argmax(1).to_vec1<uint32_t>());
}

TEST(CausalLMLoad, RefusesPromptsLongerThanTheContextAndIntegerWeights) {
  std::string dir = llama_data("tiny_llama");
  std::shared_ptr<const models::CausalLM> model = models::load_causal_lm(dir, Device::cpu());
  const size_t context = model->config().max_position;
  ASSERT_GT(context, 0u);
  GenerateOptions opt;
  opt.max_new_tokens = 1;
  std::vector<uint32_t> too_long(context + 1, 1);
  try {
    Generator(model, opt).generate(too_long);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(context + 1)), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(context)), std::string::npos) << m;
  }
  // A weight of an integer dtype is a malformed model, named, not a silent conversion.
  auto weights = safetensors::load(dir + "/model.safetensors", Device::cpu());
  models::LlamaConfig config = models::LlamaConfig::from_file(dir + "/config.json");
  weights["model.norm.weight"] = weights["model.norm.weight"].to_dtype(DType::U8);
  try {
    models::Llama::from_weights(config, weights, Device::cpu());
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("model.norm.weight"), std::string::npos) << e.what();
  }
}

// A chat's next turn: continue_generation prefills only the new ids, the cache keeping the rest,
// and gives the tokens a fresh generate() gives for the whole sequence.
TEST(CausalLMLoad, ContinuedGenerationEqualsAFreshRunOverTheWholeSequence) {
  std::string dir = llama_data("tiny_qwen2");
  std::shared_ptr<const models::CausalLM> model = models::load_causal_lm(dir, Device::cpu());
  auto prompt = to_u32(npy::load(dir + "/prompt.npy", Device::cpu()));
  GenerateOptions opt;
  opt.max_new_tokens = 6;
  opt.stop_tokens = {100000};
  opt.max_len = 64;
  Generator chat(model, opt);
  std::vector<uint32_t> first = chat.generate(prompt);
  ASSERT_EQ(first.size(), 6u);
  std::vector<uint32_t> turn = {3, 14, 15, 9};
  std::vector<uint32_t> second = chat.continue_generation(turn);
  EXPECT_EQ(chat.stats().prompt_tokens, turn.size() + 1);  // the last new id, then the turn

  std::vector<uint32_t> whole = prompt;
  whole.insert(whole.end(), first.begin(), first.end());
  whole.insert(whole.end(), turn.begin(), turn.end());
  EXPECT_EQ(chat.history().size(), whole.size() + second.size());
  EXPECT_EQ(Generator(model, opt).generate(whole), second);

  // The conversation must fit the cache of the first call.
  opt.max_len = prompt.size() + 6;
  Generator tight(model, opt);
  tight.generate(prompt);
  EXPECT_THROW(tight.continue_generation(turn), Error);
  EXPECT_THROW(Generator(model, opt).continue_generation(turn), Error);
}

// A prefill in chunks reports each and gives the tokens of a prefill in one forward.
TEST(CausalLMLoad, ChunkedPrefillReportsProgressAndKeepsTheTokens) {
  std::string dir = llama_data("tiny_llama");
  std::shared_ptr<const models::CausalLM> model = models::load_causal_lm(dir, Device::cpu());
  auto prompt = to_u32(npy::load(dir + "/prompt.npy", Device::cpu()));
  ASSERT_GT(prompt.size(), 4u);
  GenerateOptions opt;
  opt.max_new_tokens = 8;
  opt.stop_tokens = {100000};
  std::vector<uint32_t> whole = Generator(model, opt).generate(prompt);
  std::vector<std::pair<size_t, size_t>> calls;
  opt.prefill_chunk = 3;
  opt.on_prefill = [&](size_t done, size_t total) { calls.emplace_back(done, total); };
  EXPECT_EQ(Generator(model, opt).generate(prompt), whole);
  ASSERT_EQ(calls.size(), (prompt.size() + 2) / 3);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].first, std::min(3 * (i + 1), prompt.size()));
    EXPECT_EQ(calls[i].second, prompt.size());
  }
}

TEST(CausalLMLoad, RefusesUnknownArchitecturesByName) {
  auto dir = std::filesystem::temp_directory_path() / "wick_causal_lm_unknown";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "gpt_neox", "vocab_size": 10})";
  try {
    models::load_causal_lm(dir.string(), Device::cpu());
    FAIL() << "no error";
  } catch (const FormatError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("gpt_neox"), std::string::npos) << m;
    EXPECT_NE(m.find("qwen2"), std::string::npos) << m;
    EXPECT_NE(m.find("config.json"), std::string::npos) << m;
  }
  EXPECT_THROW(models::load_causal_lm("/nonexistent/model", Device::cpu()), FormatError);
  std::filesystem::remove_all(dir);
  auto known = models::causal_lm_architectures();
  EXPECT_NE(std::find(known.begin(), known.end(), "llama"), known.end());
}

}  // namespace
}  // namespace wick
