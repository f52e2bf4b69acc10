// The decoder families of load_causal_lm (Qwen3, Mistral, Phi-3, Gemma 2, Gemma 3 text) against
// transformers itself: tiny random-weight models and their references made by
// scripts/make_family_refs.py (tests/data/families/<family>). Two 12-token prompts with a window
// of 8 exercise the sliding windows; Gemma 2's soft-caps are on; Phi-3's cache exceeds its
// original context, so long-rope's long factors are in use. Each model is read from its folder
// and, where llama.cpp names the architecture, from a GGUF file written by `gguf` with
// llama.cpp's tensor names and metadata.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_util.h"
#include "wick/formats.h"
#include "wick/generator.h"
#include "wick/models.h"
#include "wick/numerics.h"

namespace wick {
namespace {

using testing::max_abs_diff;
using testing::range_of;

// f32 end to end against transformers' f32: the two round differently at each of the few dozen
// ops of these 2-3 layer models; 256 f32 unit roundoffs of the logits' range covers that with
// margin, while a wrong mask, scale or rope moves logits by 1e-2 of the range and more.
const double kLogitBound = 256 * numerics::unit_roundoff(DType::F32);

std::string family_dir(const std::string& name) {
  return std::string(WICK_TEST_DATA_DIR) + "/families/" + name;
}

std::vector<uint32_t> to_u32(const Tensor& t) {
  std::vector<uint32_t> out;
  for (double v : t.to_vec_f64()) out.push_back(static_cast<uint32_t>(v));
  return out;
}

struct Case {
  const char* folder;        // tests/data/families/<folder>
  const char* architecture;  // config().architecture
  bool gguf;                 // read model.gguf instead of the folder
};

std::string case_name(const Case& c) {
  return std::string(c.folder) + (c.gguf ? "_gguf" : "_folder");
}

class Family : public ::testing::TestWithParam<Case> {};

TEST_P(Family, BatchLogitsChunksAndGreedyTokensEqualTransformers) {
  const Case f = GetParam();
  const std::string dir = family_dir(f.folder);
  const std::string path = f.gguf ? dir + "/model.gguf" : dir;
  std::shared_ptr<const models::CausalLM> model =
      models::load_causal_lm(path, Device::cpu(), DType::F32);
  const models::CausalLMConfig& c = model->config();
  EXPECT_EQ(c.architecture, f.architecture);
  EXPECT_EQ(model->dtype(), DType::F32);

  Tensor prompts = npy::load(dir + "/prompt.npy", Device::cpu());  // (2, 12)
  ASSERT_EQ(prompts.shape(), Shape({2, 12}));
  Tensor ref = npy::load(dir + "/logits.npy", Device::cpu());  // (2, 12, vocab)
  ASSERT_EQ(ref.shape(), Shape({2, 12, c.vocab_size}));
  const auto expected = ref.to_vec_f64();
  const double range = range_of(expected);
  ASSERT_GT(range, 1.0);
  const double bound = kLogitBound * range;

  // The batch of both prompts in one forward.
  Tensor ids = Tensor::from_vec(to_u32(prompts), {2, 12}, Device::cpu());
  models::KvCache cache = model->make_cache(2, 28);
  Tensor logits = model->forward(ids, cache);
  ASSERT_EQ(logits.shape(), ref.shape());
  EXPECT_LE(max_abs_diff(logits.to_vec_f64(), expected), bound);
  EXPECT_EQ(cache.length(), 12u);

  // Chunks of 5 positions continue from the cache (windows straddle the chunks).
  models::KvCache chunked = model->make_cache(2, 28);
  std::vector<Tensor> parts;
  for (size_t at = 0; at < 12; at += 5) {
    parts.push_back(model->forward(ids.narrow(1, at, std::min<size_t>(5, 12 - at)), chunked));
  }
  EXPECT_LE(max_abs_diff(Tensor::cat(parts, 1).to_vec_f64(), expected), bound);

  // The last positions alone.
  models::KvCache last_cache = model->make_cache(2, 28);
  Tensor last = model->forward_last(ids, last_cache);
  ASSERT_EQ(last.shape(), Shape({2, c.vocab_size}));
  std::vector<double> last_ref;
  for (size_t b = 0; b < 2; ++b) {
    auto row = ref.get(b).get(11).to_vec_f64();
    last_ref.insert(last_ref.end(), row.begin(), row.end());
  }
  EXPECT_LE(max_abs_diff(last.to_vec_f64(), last_ref), bound);

  // Greedy decoding after the first prompt (past the window: positions 12 to 21).
  GenerateOptions opt;
  opt.max_new_tokens = 10;
  opt.stop_tokens = {100000};
  auto first = to_u32(prompts.get(0));
  auto greedy = to_u32(npy::load(dir + "/greedy.npy", Device::cpu()));
  EXPECT_EQ(Generator(model, opt).generate(first), greedy);
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, Family,
    ::testing::Values(Case{"qwen3", "qwen3", false}, Case{"qwen3", "qwen3", true},
                      Case{"mistral", "mistral", false}, Case{"phi3", "phi3", false},
                      Case{"phi3", "phi3", true}, Case{"gemma2", "gemma2", false},
                      Case{"gemma2", "gemma2", true}, Case{"gemma3_text", "gemma3_text", false},
                      Case{"gemma3_text", "gemma3", true}),
    [](const auto& info) { return case_name(info.param); });

TEST(Families, UnknownModelTypeIsAFormatErrorListingTheKnownOnes) {
  auto dir = std::filesystem::temp_directory_path() / "wick_families_unknown";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "falcon_mamba"})";
  try {
    models::load_causal_lm(dir.string(), Device::cpu());
    FAIL() << "no error";
  } catch (const FormatError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("falcon_mamba"), std::string::npos) << m;
    for (const std::string& known : models::causal_lm_architectures()) {
      EXPECT_NE(m.find(known), std::string::npos) << known << " not listed in: " << m;
    }
  }
  for (const char* family : {"qwen3", "mistral", "phi3", "gemma2", "gemma3_text"}) {
    auto known = models::causal_lm_architectures();
    EXPECT_NE(std::find(known.begin(), known.end(), family), known.end()) << family;
  }
  std::filesystem::remove_all(dir);
}

// A copy of a family's folder with its config.json edited by `edit`.
std::string edited_copy(const std::string& family,
                        const std::function<void(nlohmann::json&)>& edit) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("wick_families_" + family + "_edited");
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(family_dir(family) + "/model.safetensors", dir / "model.safetensors");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(family_dir(family) + "/config.json"));
  edit(j);
  std::ofstream(dir / "config.json") << j.dump(2);
  return dir.string();
}

// The FormatError's message, or a failure when `load` succeeds or throws something else.
template <typename E = FormatError>
std::string error_of(const std::function<void()>& load) {
  try {
    load();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::string load_error(const std::string& path) {
  return error_of([&] { models::load_causal_lm(path, Device::cpu()); });
}

TEST(Families, ConfigsTheyCannotRunAreFormatErrorsNamingTheKey) {
  std::string m = load_error(edited_copy("qwen3", [](nlohmann::json& j) {
    j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 10000.0}};
  }));
  EXPECT_NE(m.find("yarn"), std::string::npos) << m;
  m = load_error(edited_copy("phi3", [](nlohmann::json& j) {
    j["rope_parameters"]["short_factor"] = {1.0, 2.0};
  }));
  EXPECT_NE(m.find("short_factor"), std::string::npos) << m;
  m = load_error(edited_copy("gemma2", [](nlohmann::json& j) { j["hidden_activation"] = "relu"; }));
  EXPECT_NE(m.find("relu"), std::string::npos) << m;
  m = load_error(edited_copy("gemma3_text", [](nlohmann::json& j) {
    j["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention"};
  }));
  EXPECT_NE(m.find("layer_types"), std::string::npos) << m;
  m = load_error(edited_copy("gemma2", [](nlohmann::json& j) { j["eos_token_id"] = 96; }));
  EXPECT_NE(m.find("eos_token_id"), std::string::npos) << m;
  // A weight of another shape than the config gives is named.
  m = error_of<ShapeMismatch>([&] {
    models::load_causal_lm(
        edited_copy("mistral", [](nlohmann::json& j) { j["intermediate_size"] = 40; }),
        Device::cpu());
  });
  EXPECT_NE(m.find("mlp.gate_proj"), std::string::npos) << m;
}

// Llama's own loader has no sliding window: it refuses a Mistral whose window is below the
// context instead of running full attention.
TEST(Families, LlamaRefusesAMistralWithASlidingWindow) {
  std::string dir = family_dir("mistral");
  std::string m = error_of([&] { models::Llama::load(dir, Device::cpu()); });
  EXPECT_NE(m.find("sliding_window"), std::string::npos) << m;
  // Without the window it is Llama's decoder, loaded as one.
  auto model = models::load_causal_lm(
      edited_copy("mistral", [](nlohmann::json& j) { j["sliding_window"] = nullptr; }),
      Device::cpu());
  EXPECT_NE(dynamic_cast<const models::Llama*>(model.get()), nullptr);
  EXPECT_EQ(model->config().architecture, "mistral");
}

// The composed families have no device-side decode step (no decode plan covers their layers):
// they say so, and decode_step refuses rather than running another family's math.
TEST(Families, ComposedFamiliesDeclineTheDecodeStep) {
  for (const char* family : {"qwen3", "mistral", "phi3", "gemma2", "gemma3_text"}) {
    auto model = models::load_causal_lm(family_dir(family), Device::cpu());
    EXPECT_FALSE(model->has_decode_step()) << family;
    models::KvCache cache = model->make_cache(1, 4);
    Tensor token = Tensor::from_vec(std::vector<uint32_t>{3}, {1, 1}, Device::cpu());
    Tensor pos = Tensor::from_vec(std::vector<uint32_t>{0}, {1}, Device::cpu());
    EXPECT_THROW(model->decode_step(token, pos, cache), Error) << family;
  }
}

}  // namespace
}  // namespace wick
