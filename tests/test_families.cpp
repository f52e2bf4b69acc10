// The decoder families of load_causal_lm (Qwen3, Mistral, Phi-3, Gemma 2, Gemma 3 text) against
// transformers itself: tiny random-weight models and their references made by
// scripts/make_family_refs.py (tests/data/families/<family>). Two 12-token prompts with a window
// of 8 exercise the sliding windows; Gemma 2's soft-caps are on; Phi-3's cache exceeds its
// original context, so long-rope's long factors are in use; phi3_partial and phi3_partial_longrope
// rotate 4 and 6 of each head's 8 dims (partial_rotary_factor 0.5, and 0.75 at the config's top
// level with long-rope, as Phi-4-mini has it). Each model is read from its folder
// and, where llama.cpp names the architecture, from a GGUF file written by `gguf` with
// llama.cpp's tensor names and metadata.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_util.h"
#include "wick/formats.h"
#include "wick/generator.h"
#include "wick/half.h"
#include "wick/models.h"
#include "wick/nn/attention.h"
#include "wick/numerics.h"
#include "wick/quantized.h"

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
                      Case{"mistral", "mistral", false}, Case{"mistral", "mistral", true},
                      Case{"phi3", "phi3", false}, Case{"phi3", "phi3", true},
                      Case{"gemma2", "gemma2", false}, Case{"gemma2", "gemma2", true},
                      Case{"gemma3_text", "gemma3_text", false},
                      Case{"gemma3_text", "gemma3", true}, Case{"phi3_partial", "phi3", false},
                      Case{"phi3_partial", "phi3", true},
                      Case{"phi3_partial_longrope", "phi3", false},
                      Case{"phi3_partial_longrope", "phi3", true}),
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

// The temporary files and folders this process wrote (edited_copy, edited_gguf): the process id in
// their names, since ctest runs tests that edit the same family side by side; removed at exit.
struct TempPaths {
  std::vector<std::filesystem::path> paths;
  std::filesystem::path add(const std::string& name, const std::string& extension = "") {
    paths.push_back(std::filesystem::temp_directory_path() /
                    (name + "_" + std::to_string(::getpid()) + extension));
    return paths.back();
  }
  ~TempPaths() {
    std::error_code ec;
    for (const auto& p : paths) std::filesystem::remove_all(p, ec);
  }
} temp_paths;

// A copy of a family's folder with its config.json edited by `edit`.
std::string edited_copy(const std::string& family,
                        const std::function<void(nlohmann::json&)>& edit) {
  namespace fs = std::filesystem;
  fs::path dir = temp_paths.add("wick_families_" + family + "_edited");
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

// A GGUF copy of a family's file with `edit` applied to its tensors and metadata.
std::string edited_gguf(const std::string& family,
                        const std::function<void(std::map<std::string, Tensor>&,
                                                 std::map<std::string, gguf::Value>&)>& edit) {
  gguf::File f = gguf::File::open(family_dir(family) + "/model.gguf");
  std::map<std::string, Tensor> tensors;
  for (const std::string& name : f.tensor_names()) tensors[name] = f.get(name);
  std::map<std::string, gguf::Value> metadata(f.metadata().begin(), f.metadata().end());
  edit(tensors, metadata);
  auto path = temp_paths.add("wick_families_" + family, ".gguf");
  gguf::save(tensors, path.string(), metadata);
  return path.string();
}

TEST(Families, MalformedGgufFilesAreFormatErrorsNamingTheTensorOrKey) {
  using Tensors = std::map<std::string, Tensor>;
  using Metadata = std::map<std::string, gguf::Value>;
  std::string m = load_error(edited_gguf("qwen3", [](Tensors& t, Metadata&) {
    t["blk.1.attn_k_norm.weight"] = Tensor::ones({6}, DType::F32, Device::cpu());
  }));
  EXPECT_NE(m.find("blk.1.attn_k_norm.weight"), std::string::npos) << m;
  m = load_error(
      edited_gguf("phi3", [](Tensors& t, Metadata&) { t.erase("blk.0.attn_qkv.weight"); }));
  EXPECT_NE(m.find("blk.0.attn_qkv.weight"), std::string::npos) << m;
  m = load_error(edited_gguf("gemma2", [](Tensors&, Metadata& md) {
    md.erase("gemma2.attention.layer_norm_rms_epsilon");
  }));
  EXPECT_NE(m.find("layer_norm_rms_epsilon"), std::string::npos) << m;
  m = load_error(edited_gguf("gemma3_text", [](Tensors&, Metadata& md) {
    md["gemma3.attention.sliding_window_pattern"] =
        gguf::Value::array(gguf::ValueType::Bool, {gguf::Value::boolean(true)});
  }));
  EXPECT_NE(m.find("sliding_window_pattern"), std::string::npos) << m;
  m = load_error(edited_gguf("qwen3", [](Tensors&, Metadata& md) {
    md["general.architecture"] = gguf::Value::string("mamba");
  }));
  EXPECT_NE(m.find("mamba"), std::string::npos) << m;
}

// partial_rotary_factor where transformers reads it: in the rope object (phi3_partial's config, as
// transformers 5 saves it), else at the top level (phi3_partial_longrope's, as Phi-4-mini ships
// it); the rope object's wins over the top level's. Logits against transformers' f32.
TEST(Families, PartialRotaryFactorIsReadWhereTransformersReadsIt) {
  const std::string dir = family_dir("phi3_partial");
  auto expected = npy::load(dir + "/logits.npy", Device::cpu()).to_vec_f64();
  Tensor ids = Tensor::from_vec(to_u32(npy::load(dir + "/prompt.npy", Device::cpu())), {2, 12},
                                Device::cpu());
  auto logits_of = [&](const std::string& path) {
    auto model = models::load_causal_lm(path, Device::cpu());
    models::KvCache cache = model->make_cache(2, 12);
    return model->forward(ids, cache).to_vec_f64();
  };
  const double bound = kLogitBound * range_of(expected);
  // The top level's 0.75 loses to the rope object's 0.5.
  EXPECT_LE(max_abs_diff(
                logits_of(edited_copy(
                    "phi3_partial", [](nlohmann::json& j) { j["partial_rotary_factor"] = 0.75; })),
                expected),
            bound);
  // Moved to the top level (the rope object without it): the same model.
  EXPECT_LE(
      max_abs_diff(logits_of(edited_copy("phi3_partial",
                                         [](nlohmann::json& j) {
                                           j["partial_rotary_factor"] = 0.5;
                                           j["rope_parameters"].erase("partial_rotary_factor");
                                         })),
                   expected),
      bound);
  // Without it anywhere every dim rotates: logits move by far more than the bound.
  auto full = logits_of(edited_copy("phi3_partial", [](nlohmann::json& j) {
    j["rope_parameters"].erase("partial_rotary_factor");
  }));
  EXPECT_GT(max_abs_diff(full, expected), 100 * bound);
}

TEST(Families, PartialRotaryThatCannotRunIsAFormatErrorNamingTheKey) {
  for (double f : {0.0, -0.5, 1.5, 0.625, 0.1}) {  // 0.625 and 0.1: 5 and 0 rotated dims
    SCOPED_TRACE(f);
    std::string m = load_error(edited_copy("phi3_partial", [&](nlohmann::json& j) {
      j["rope_parameters"]["partial_rotary_factor"] = f;
    }));
    EXPECT_NE(m.find("partial_rotary_factor"), std::string::npos) << m;
    EXPECT_NE(m.find("config.json"), std::string::npos) << m;
  }
  std::string m = load_error(edited_copy("phi3_partial", [&](nlohmann::json& j) {
    j["rope_parameters"]["partial_rotary_factor"] = "half";
  }));
  EXPECT_NE(m.find("partial_rotary_factor"), std::string::npos) << m;
  // Long-rope factors count the rotated pairs: 3 for 6 of 8 dims, not 4.
  m = load_error(edited_copy("phi3_partial_longrope", [](nlohmann::json& j) {
    j["rope_scaling"]["short_factor"] = {1.0, 1.5, 2.0, 2.5};
  }));
  EXPECT_NE(m.find("short_factor"), std::string::npos) << m;
  using Tensors = std::map<std::string, Tensor>;
  using Metadata = std::map<std::string, gguf::Value>;
  for (uint64_t dims : {0, 5, 10}) {
    SCOPED_TRACE(dims);
    m = load_error(edited_gguf("phi3_partial", [&](Tensors&, Metadata& md) {
      md["phi3.rope.dimension_count"] = gguf::Value::u64(dims, gguf::ValueType::U32);
    }));
    EXPECT_NE(m.find("phi3.rope.dimension_count"), std::string::npos) << m;
  }
  // The long-rope factor tensors hold one factor per rotated pair.
  m = load_error(edited_gguf("phi3_partial_longrope", [](Tensors& t, Metadata&) {
    t["rope_factors_long.weight"] = Tensor::ones({4}, DType::F32, Device::cpu());
  }));
  EXPECT_NE(m.find("rope_factors_long.weight"), std::string::npos) << m;
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

// The same for a GGUF file (architecture llama, as llama.cpp writes Mistral): Llama::load refuses
// llama.attention.sliding_window below the context; without the key, or with a window covering
// the context, load_causal_lm reads it as Llama.
TEST(Families, LlamaRefusesAMistralGgufWithASlidingWindow) {
  std::string path = family_dir("mistral") + "/model.gguf";
  try {
    models::Llama::load(path, Device::cpu());
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("llama.attention.sliding_window"), std::string::npos)
        << e.what();
  }
  using Tensors = std::map<std::string, Tensor>;
  using Metadata = std::map<std::string, gguf::Value>;
  for (bool drop : {true, false}) {
    auto model =
        models::load_causal_lm(edited_gguf("mistral",
                                           [&](Tensors&, Metadata& md) {
                                             if (drop) {
                                               md.erase("llama.attention.sliding_window");
                                             } else {
                                               md["llama.attention.sliding_window"] =
                                                   gguf::Value::u64(64, gguf::ValueType::U32);
                                             }
                                           }),
                               Device::cpu());
    EXPECT_NE(dynamic_cast<const models::Llama*>(model.get()), nullptr);
    EXPECT_EQ(model->config().architecture, "llama");
  }
}

// Rows of k values (a multiple of 32) as Q8_0 blocks: d = max |x| / 127 (as f16), q = round(x / d).
QTensor to_q8_0(const Tensor& w) {
  std::vector<float> v = w.to_dtype(DType::F32).flatten_all().to_vec1<float>();
  std::vector<uint8_t> raw(ggml_bytes(GgmlType::Q8_0, v.size()));
  for (size_t b = 0; b < v.size() / 32; ++b) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::abs(v[32 * b + j]));
    const uint16_t bits = detail::float_to_half_bits(amax / 127);
    const float d = detail::half_bits_to_float(bits);
    std::memcpy(raw.data() + 34 * b, &bits, 2);
    for (size_t j = 0; j < 32; ++j) {
      long q = d != 0 ? std::lrint(v[32 * b + j] / d) : 0;
      raw[34 * b + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127L, 127L)));
    }
  }
  return QTensor(GgmlType::Q8_0, w.shape(), Tensor::from_vec(raw, {raw.size()}, Device::cpu()));
}

// The Mistral GGUF with its projections as Q8_0 blocks (q and k rows permuted as llama.cpp writes
// them, so the loader moves whole blocks back) against the same file with those blocks dequantised
// to f32: the logits differ only by qmatmul's rounding of its activations (16 or 8 bits: half a
// step of each block's maximum per projection, 4 projections in sequence per layer, gain below
// 1), while a row put back wrongly moves them by O(range).
TEST(Families, MistralGgufWithQuantizedPermutedRows) {
  gguf::File f = gguf::File::open(family_dir("mistral") + "/model.gguf");
  std::map<std::string, Tensor> dense, dequantised;
  std::map<std::string, QTensor> blocks;
  for (const std::string& name : f.tensor_names()) {
    Tensor t = f.get(name);
    if (name.rfind("blk.", 0) == 0 && t.rank() == 2 && t.dims()[1] % 32 == 0) {
      blocks[name] = to_q8_0(t);
      dequantised[name] = blocks[name].dequantize();
    } else {
      dense[name] = t;
      dequantised[name] = t;
    }
  }
  ASSERT_GE(blocks.size(), 10u);  // q, k, v, o, gate, up of both layers
  std::map<std::string, gguf::Value> metadata(f.metadata().begin(), f.metadata().end());
  auto dir = std::filesystem::temp_directory_path();
  const std::string q_path = (dir / "wick_families_mistral_q8.gguf").string();
  const std::string f_path = (dir / "wick_families_mistral_f32.gguf").string();
  gguf::save(dense, q_path, metadata, blocks);
  gguf::save(dequantised, f_path, metadata);
  auto q = models::load_causal_lm(q_path, Device::cpu());
  auto d = models::load_causal_lm(f_path, Device::cpu());
  EXPECT_EQ(q->config().architecture, "mistral");
  Tensor prompts = npy::load(family_dir("mistral") + "/prompt.npy", Device::cpu());
  Tensor ids = Tensor::from_vec(to_u32(prompts), {2, 12}, Device::cpu());
  models::KvCache qc = q->make_cache(2, 12), dc = d->make_cache(2, 12);
  std::vector<double> got = q->forward(ids, qc).to_vec_f64();
  std::vector<double> want = d->forward(ids, dc).to_vec_f64();
  std::remove(q_path.c_str());
  std::remove(f_path.c_str());
  const double range = range_of(want);
  ASSERT_GT(range, 1.0);
  const int bits = qmatmul_cpu_activation_bits(GgmlType::Q8_0);
  const double half_step = bits == 8 ? 1.0 / 254 : bits == 16 ? 1.0 / 65024 : 0.0;
  const double chain = 4.0 * q->config().num_layers;
  EXPECT_LE(max_abs_diff(got, want), (kLogitBound + chain * half_step) * range);
}

// The device-side decode step (what a CUDA graph records) gives forward's logits: after the
// 12-token prompt (past the window of 8), twice in a row, reading a key window shorter than the
// cache; then refuses a position tensor of the wrong kind.
TEST(Families, DecodeStepEqualsForward) {
  for (const char* family : {"qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "phi3_partial",
                             "phi3_partial_longrope"}) {
    SCOPED_TRACE(family);
    auto model = models::load_causal_lm(family_dir(family), Device::cpu());
    ASSERT_TRUE(model->has_decode_step());
    auto prompt = to_u32(npy::load(family_dir(family) + "/prompt.npy", Device::cpu()).get(0));
    Tensor ids = Tensor::from_vec(prompt, {1, prompt.size()}, Device::cpu());
    models::KvCache a = model->make_cache(1, 20), b = model->make_cache(1, 20);
    model->forward(ids, a);
    model->forward(ids, b);
    for (uint32_t t : {7u, 33u}) {
      const size_t pos = a.length();
      Tensor token = Tensor::from_vec(std::vector<uint32_t>{t}, {1, 1}, Device::cpu());
      Tensor position =
          Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(pos)}, {1}, Device::cpu());
      Tensor step_logits;
      Tensor next = model->decode_step(token, position, a, &step_logits, pos + 2);
      a.set_length(pos + 1);
      Tensor ref = model->forward_last(token, b);
      auto r = ref.to_vec_f64();
      EXPECT_LE(max_abs_diff(step_logits.to_vec_f64(), r), kLogitBound * range_of(r));
      EXPECT_EQ(next.to_vec1<uint32_t>(), ref.argmax(1).to_vec1<uint32_t>());
    }
    Tensor token = Tensor::from_vec(std::vector<uint32_t>{3}, {1, 1}, Device::cpu());
    Tensor wrong = Tensor::from_vec(std::vector<int64_t>{14}, {1}, Device::cpu());
    EXPECT_THROW(model->decode_step(token, wrong, a), ShapeMismatch);
    Tensor position = Tensor::from_vec(std::vector<uint32_t>{14}, {1}, Device::cpu());
    EXPECT_THROW(model->decode_step(token, position, a, nullptr, 21), IndexOutOfRange);
  }
}

// f16 and bf16 weights and compute: the same logits as transformers' f32 within the rounding of
// a few dozen half-precision ops (16 unit roundoffs of the dtype, times the logits' range: far
// below what a wrong dtype conversion or mask fill would give), bf16 the logits of transformers
// run in bf16, and the decode step agrees.
TEST(Families, HalfPrecisionModelsFollowTheF32Logits) {
  for (const char* family : {"qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "phi3_partial",
                             "phi3_partial_longrope"}) {
    for (DType dt : {DType::F16, DType::BF16}) {
      SCOPED_TRACE(::testing::Message() << family << " " << dt);
      auto model = models::load_causal_lm(family_dir(family), Device::cpu(), dt);
      EXPECT_EQ(model->dtype(), dt);
      Tensor prompts = npy::load(family_dir(family) + "/prompt.npy", Device::cpu());
      auto expected = npy::load(family_dir(family) + "/logits.npy", Device::cpu()).to_vec_f64();
      Tensor ids = Tensor::from_vec(to_u32(prompts), {2, 12}, Device::cpu());
      models::KvCache cache = model->make_cache(2, 13);
      Tensor logits = model->forward(ids, cache);
      EXPECT_EQ(logits.dtype(), dt);
      EXPECT_LE(max_abs_diff(logits.to_vec_f64(), expected),
                16 * numerics::unit_roundoff(dt) * range_of(expected));
      if (dt == DType::BF16) {
        // transformers run in bf16: wick rounds where it rounds (its norms, soft-caps, GeGLU,
        // rope and attention), so the logits of every position agree to well under one bf16 unit
        // roundoff of the range (a rounding point moved, such as Gemma's 1 + w rounded to bf16,
        // costs 2e-3 and more at every position). The products sum in another order than
        // PyTorch's, so one position may see one value round the other way (an MLP or output
        // head sum); that position stays within the f32 bound above.
        auto hf = npy::load(family_dir(family) + "/logits_bf16.npy", Device::cpu()).to_vec_f64();
        auto got = logits.to_vec_f64();
        const size_t vocab = got.size() / 24;
        size_t moved = 0;
        for (size_t row = 0; row < 24; ++row) {
          std::vector<double> a(got.begin() + row * vocab, got.begin() + (row + 1) * vocab);
          std::vector<double> b(hf.begin() + row * vocab, hf.begin() + (row + 1) * vocab);
          moved +=
              max_abs_diff(a, b) > numerics::unit_roundoff(DType::BF16) / 4 * range_of(expected);
        }
        EXPECT_LE(moved, 1u);
      }
      Tensor token = Tensor::from_vec(std::vector<uint32_t>{5, 9}, {2, 1}, Device::cpu());
      Tensor position = Tensor::from_vec(std::vector<uint32_t>{12}, {1}, Device::cpu());
      models::KvCache again = model->make_cache(2, 13);
      model->forward(ids, again);
      Tensor step;
      model->decode_step(token, position, cache, &step);
      Tensor ref = model->forward_last(token, again);
      EXPECT_LE(max_abs_diff(step.to_vec_f64(), ref.to_vec_f64()),
                4 * numerics::unit_roundoff(dt) * range_of(ref.to_vec_f64()));
    }
  }
}

// ---- the fused attention's sliding window and soft-cap (CPU kernels), against float64 ----

// softmax over visible keys of cap(scale q k) v in double: q (b, h, s, d), k and v (b, hk, n, d)
// as row-major f64 vectors; query i sees j <= i + n - s (causal) and j > i + n - s - window.
std::vector<double> reference_attention(const std::vector<double>& q, const std::vector<double>& k,
                                        const std::vector<double>& v, size_t b, size_t h, size_t hk,
                                        size_t s, size_t n, size_t d, double scale, bool causal,
                                        size_t window, double cap, double* max_score) {
  std::vector<double> out(b * h * s * d, 0.0);
  const long shift = static_cast<long>(n) - static_cast<long>(s);
  *max_score = 0;
  for (size_t bi = 0; bi < b; ++bi) {
    for (size_t hi = 0; hi < h; ++hi) {
      size_t kh = hi / (h / hk);
      for (size_t i = 0; i < s; ++i) {
        long last = causal ? static_cast<long>(i) + shift : static_cast<long>(n) - 1;
        long first = window > 0 ? static_cast<long>(i) + shift - static_cast<long>(window) + 1 : 0;
        std::vector<double> sc;
        std::vector<size_t> keys;
        for (size_t j = 0; j < n; ++j) {
          long jj = static_cast<long>(j);
          if (jj > last || jj < first) continue;
          double x = 0;
          for (size_t t = 0; t < d; ++t) {
            x += q[((bi * h + hi) * s + i) * d + t] * k[((bi * hk + kh) * n + j) * d + t];
          }
          x *= scale;
          if (cap > 0) x = cap * std::tanh(x / cap);
          *max_score = std::max(*max_score, std::abs(x));
          sc.push_back(x);
          keys.push_back(j);
        }
        if (sc.empty()) continue;
        double mx = *std::max_element(sc.begin(), sc.end()), sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (size_t u = 0; u < keys.size(); ++u) {
          for (size_t t = 0; t < d; ++t) {
            out[((bi * h + hi) * s + i) * d + t] +=
                sc[u] / sum * v[((bi * hk + kh) * n + keys[u]) * d + t];
          }
        }
      }
    }
  }
  return out;
}

std::vector<double> seeded(size_t count, uint32_t seed, double amplitude) {
  std::vector<double> out(count);
  uint64_t x = seed * 2654435761u + 1;
  for (double& v : out) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = amplitude * (static_cast<double>(x >> 11) / 9007199254740992.0 * 2 - 1);
  }
  return out;
}

struct WindowCase {
  size_t s, n, window;
  double cap;
  bool causal;
};

// Prefill over more than one key tile (64) with a window that skips whole tiles, a query block of
// several row vectors, decode-length queries (the kernels' few-rows path), and each soft-cap.
TEST(FusedAttention, SlidingWindowAndSoftCapEqualFloat64OnTheCpu) {
  const size_t b = 2, h = 4, hk = 2, d = 16;
  const WindowCase cases[] = {{150, 150, 40, 0, true}, {150, 150, 40, 5, true},
                              {150, 150, 0, 5, true},  {1, 150, 40, 5, true},
                              {3, 150, 8, 0, true},    {20, 90, 70, 2.5, true},
                              {12, 12, 8, 5, false},   {200, 200, 300, 0, true}};
  for (DType dt : {DType::F64, DType::F32, DType::F16, DType::BF16}) {
    for (const WindowCase& wc : cases) {
      SCOPED_TRACE(::testing::Message() << dt << " s " << wc.s << " n " << wc.n << " window "
                                        << wc.window << " cap " << wc.cap);
      auto qv = seeded(b * h * wc.s * d, 1, 1.5), kv = seeded(b * hk * wc.n * d, 2, 1.5);
      auto vv = seeded(b * hk * wc.n * d, 3, 1.0);
      // The inputs as the dtype holds them, so that the reference sees the same values.
      Tensor q = Tensor::from_vec(qv, {b, h, wc.s, d}, Device::cpu()).to_dtype(dt);
      Tensor k = Tensor::from_vec(kv, {b, hk, wc.n, d}, Device::cpu()).to_dtype(dt);
      Tensor v = Tensor::from_vec(vv, {b, hk, wc.n, d}, Device::cpu()).to_dtype(dt);
      nn::AttentionOptions opt;
      opt.causal = wc.causal;
      opt.window = wc.window;
      opt.softcap = wc.cap;
      const double scale = 1 / std::sqrt(static_cast<double>(d));
      double max_score = 0;
      auto want =
          reference_attention(q.to_vec_f64(), k.to_vec_f64(), v.to_vec_f64(), b, h, hk, wc.s, wc.n,
                              d, scale, wc.causal, wc.window, wc.cap, &max_score);
      auto got = nn::scaled_dot_product_attention(q, k, v, opt).to_vec_f64();
      // Each score is off by the roundings of its steps (f16/bf16 round the product, the
      // scaling and each soft-cap step to T, as transformers does) and a d-long sum in the compute
      // type; an error e in the scores moves the probabilities by at most 2e relative, hence the
      // output (|v| <= 1) by 2e; then an n-long sum and the output's rounding.
      const double u = numerics::unit_roundoff(dt), uc = numerics::compute_roundoff(dt);
      const double dot_abs = 1.5 * 1.5 * static_cast<double>(d) * scale;
      const double score_error = 5 * u * max_score + 2 * std::sqrt(double(d)) * uc * dot_abs;
      const double bound = 2 * score_error + 2 * std::sqrt(double(wc.n)) * uc + 2 * u;
      ASSERT_EQ(got.size(), want.size());
      EXPECT_LE(max_abs_diff(got, want), bound);
      // The bound is far below the outputs: zeros or another window's outputs would not pass.
      double biggest = 0;
      for (double x : want) biggest = std::max(biggest, std::abs(x));
      EXPECT_GT(biggest, 2 * bound);
      EXPECT_GT(range_of(want), 0.1);
    }
  }
  // A window needs no causal flag to be aligned: decoding one query, window 3 of 10 keys.
  Tensor q = Tensor::from_vec(seeded(8, 4, 1), {1, 1, 1, 8}, Device::cpu());
  Tensor kv = Tensor::from_vec(seeded(80, 5, 1), {1, 1, 10, 8}, Device::cpu());
  nn::AttentionOptions opt;
  opt.window = 3;
  Tensor got = nn::scaled_dot_product_attention(q, kv, kv, opt);
  Tensor last3 = nn::scaled_dot_product_attention(q, kv.narrow(2, 7, 3), kv.narrow(2, 7, 3));
  EXPECT_LE(max_abs_diff(got.to_vec_f64(), last3.to_vec_f64()),
            8 * numerics::unit_roundoff(DType::F32));
  opt.softcap = -1;
  EXPECT_THROW(nn::scaled_dot_product_attention(q, kv, kv, opt), Error);
}

// The gradient through a window and a soft-cap, against central finite differences in f64.
TEST(FusedAttention, SoftCapAndWindowGradientsMatchFiniteDifferences) {
  const size_t s = 6, d = 4;
  auto qv = seeded(2 * s * d, 7, 1.5), kv = seeded(s * d, 8, 1.5), vv = seeded(s * d, 9, 1);
  Tensor k = Tensor::from_vec(kv, {1, 1, s, d}, Device::cpu());
  Tensor v = Tensor::from_vec(vv, {1, 1, s, d}, Device::cpu());
  Tensor w = Tensor::from_vec(seeded(2 * s * d, 10, 1), {1, 2, s, d}, Device::cpu());
  nn::AttentionOptions opt;
  opt.causal = true;
  opt.window = 3;
  opt.softcap = 0.8;
  auto loss = [&](const std::vector<double>& qx) {
    Tensor q = Tensor::from_vec(qx, {1, 2, s, d}, Device::cpu());
    return nn::scaled_dot_product_attention(q, k, v, opt).mul(w).sum_all().to_vec_f64()[0];
  };
  Tensor q = Tensor::from_vec(qv, {1, 2, s, d}, Device::cpu()).requires_grad();
  Tensor l = nn::scaled_dot_product_attention(q, k, v, opt).mul(w).sum_all();
  auto grad = l.backward().get(q)->to_vec_f64();
  for (size_t i = 0; i < qv.size(); ++i) {
    auto up = qv, down = qv;
    up[i] += 1e-6;
    down[i] -= 1e-6;
    double fd = (loss(up) - loss(down)) / 2e-6;
    EXPECT_NEAR(grad[i], fd, 1e-7 + 1e-6 * std::abs(fd)) << i;
  }
}

}  // namespace
}  // namespace wick
