// models::Bert and SentenceEmbedder on the CPU: tiny random-weight BERTs against a float64 forward
// pass written in the test, config and folder errors, and all-MiniLM-L6-v2 against
// sentence-transformers' pipeline computed in float64 (tests/data/minilm, skipped without the
// model folder).

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "bert_test_util.h"
#include "test_util.h"

namespace {

using namespace wick;
using namespace wick::testing::bert;

// A batch of 3 sequences of lengths 7, 4 and 1, padded to 7 with id 0.
struct TinyBatch {
  std::vector<std::vector<uint32_t>> ids{{2, 5, 9, 13, 1, 30, 3}, {2, 17, 4, 3}, {2}};
  std::vector<std::vector<int>> mask;
  std::vector<uint32_t> flat_ids;
  std::vector<float> flat_mask;
  size_t len = 7;
  TinyBatch() {
    for (const auto& row : ids) {
      mask.emplace_back(len, 0);
      for (size_t t = 0; t < len; ++t) {
        bool real = t < row.size();
        mask.back()[t] = real;
        flat_ids.push_back(real ? row[t] : 0);
        flat_mask.push_back(real ? 1.0f : 0.0f);
      }
    }
  }
  std::vector<std::vector<uint32_t>> padded_ids() const {
    std::vector<std::vector<uint32_t>> out;
    for (size_t b = 0; b < ids.size(); ++b) {
      out.emplace_back(flat_ids.begin() + b * len, flat_ids.begin() + (b + 1) * len);
    }
    return out;
  }
};

// Max |got - want| over the unpadded positions, relative to the largest |want|.
double max_rel_error_unpadded(const std::vector<double>& got, const std::vector<double>& want,
                              const TinyBatch& batch, size_t h) {
  double err = 0, scale = 0;
  for (size_t b = 0; b < batch.ids.size(); ++b)
    for (size_t t = 0; t < batch.ids[b].size(); ++t)
      for (size_t j = 0; j < h; ++j) {
        size_t i = (b * batch.len + t) * h + j;
        err = std::max(err, std::abs(got[i] - want[i]));
        scale = std::max(scale, std::abs(want[i]));
      }
  return err / scale;
}

TEST(BertTiny, MatchesFloat64ReferenceInEveryDtype) {
  TinyConfig c;
  auto w = tiny_weights(c, 101);
  TempDir dir("tiny");
  write_tiny_model(dir.path, c, w);
  TinyBatch batch;
  auto want = reference_encode(c, w, batch.padded_ids(), batch.mask);
  // Layer norms keep values O(1); the bounds are a few units of each dtype's rounding.
  for (auto [dtype, tol] : {std::pair{DType::F32, 2e-5}, {DType::F16, 2e-2}, {DType::BF16, 8e-2}}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto bert = models::Bert::load(dir.path, Device::cpu(), dtype);
    EXPECT_EQ(bert.dtype(), dtype);
    auto ids = Tensor::from_vec(batch.flat_ids, {3, batch.len}, Device::cpu());
    auto mask = Tensor::from_vec(batch.flat_mask, {3, batch.len}, Device::cpu());
    auto out = bert.encode(ids, mask);
    ASSERT_EQ(out.shape(), Shape({3, batch.len, c.hidden}));
    EXPECT_EQ(out.dtype(), dtype);
    double err = max_rel_error_unpadded(out.to_vec_f64(), want, batch, c.hidden);
    EXPECT_LE(err, tol);
    std::printf("    %s: max error %.3g of the largest value\n", dtype_name(dtype), err);
  }
}

// f32 activations with bf16 projections (Bert::load's matmul dtype): the reference is the f64
// forward pass of the same bf16-rounded projection weights; the activations' bf16 rounding at
// each projection input is the remaining error, a few bf16 units at most after the layer norms.
TEST(BertTiny, Bf16ProjectionsMatchFloat64Reference) {
  TinyConfig c;
  auto w = tiny_weights(c, 505);
  TempDir dir("bf16-proj");
  write_tiny_model(dir.path, c, w);
  auto bert = models::Bert::load(dir.path, Device::cpu(), DType::F32, DType::BF16);
  EXPECT_EQ(bert.dtype(), DType::F32);
  EXPECT_EQ(bert.matmul_dtype(), DType::BF16);
  WeightMap rounded = w;
  for (auto& [name, v] : rounded) {
    bool projection = name.find("LayerNorm") == std::string::npos &&
                      name.find("embeddings") == std::string::npos && name.size() > 7 &&
                      name.compare(name.size() - 7, 7, ".weight") == 0;
    if (projection) {
      v = Tensor::from_vec(v, {v.size()}, Device::cpu()).to_dtype(DType::BF16).to_vec_f64();
    }
  }
  TinyBatch batch;
  auto want = reference_encode(c, rounded, batch.padded_ids(), batch.mask);
  auto out = bert.encode(Tensor::from_vec(batch.flat_ids, {3, batch.len}, Device::cpu()),
                         Tensor::from_vec(batch.flat_mask, {3, batch.len}, Device::cpu()));
  EXPECT_EQ(out.dtype(), DType::F32);
  double err = max_rel_error_unpadded(out.to_vec_f64(), want, batch, c.hidden);
  std::printf("    bf16 projections: max error %.3g of the largest value (f32 weights: ", err);
  // Far tighter than the all-bf16 model (8e-2), and far looser than f32 (2e-5): the products
  // must have been rounded, within 16 bf16 units of the largest value.
  double err_f32 = max_rel_error_unpadded(
      out.to_vec_f64(), reference_encode(c, w, batch.padded_ids(), batch.mask), batch, c.hidden);
  std::printf("%.3g)\n", err_f32);
  EXPECT_LE(err, 16 * 0x1p-8);
  EXPECT_THROW(models::Bert::load(dir.path, Device::cpu(), DType::BF16, DType::F32),
               UnsupportedDType);
  EXPECT_THROW(models::Bert::load(dir.path, Device::cpu(), DType::F32, DType::F16),
               UnsupportedDType);
}

TEST(BertTiny, PaddingDoesNotChangeRealTokens) {
  TinyConfig c;
  auto w = tiny_weights(c, 202);
  TempDir dir("pad");
  write_tiny_model(dir.path, c, w);
  auto bert = models::Bert::load(dir.path, Device::cpu(), DType::F32);
  TinyBatch batch;
  auto batched = bert.encode(Tensor::from_vec(batch.flat_ids, {3, batch.len}, Device::cpu()),
                             Tensor::from_vec(batch.flat_mask, {3, batch.len}, Device::cpu()));
  // The second sequence alone (4 tokens, no padding), with i64 ids and a u8 mask.
  std::vector<int64_t> ids(batch.ids[1].begin(), batch.ids[1].end());
  auto alone = bert.encode(Tensor::from_vec(ids, {1, 4}, Device::cpu()),
                           Tensor::ones({1, 4}, DType::U8, Device::cpu()));
  auto a = alone.to_vec_f64();
  auto b = batched.get(1).narrow(0, 0, 4).contiguous().to_vec_f64();
  EXPECT_TRUE(wick::testing::all_close(a, b, 1e-5, 1e-5));
}

TEST(BertTiny, ReadsPrefixedAndHalfPrecisionCheckpoints) {
  TinyConfig c;
  auto w = tiny_weights(c, 303);
  TempDir dir("prefix");
  // A BertForMaskedLM-style file: "bert." names, bf16 tensors, loaded as f32.
  write_tiny_model(dir.path, c, w, DType::BF16, "bert.");
  auto bert = models::Bert::load(dir.path, Device::cpu(), DType::F32);
  TinyBatch batch;
  auto out = bert.encode(Tensor::from_vec(batch.flat_ids, {3, batch.len}, Device::cpu()),
                         Tensor::from_vec(batch.flat_mask, {3, batch.len}, Device::cpu()));
  // The reference uses the same bf16-rounded weights.
  WeightMap rounded = w;
  for (auto& [name, v] : rounded) {
    v = Tensor::from_vec(v, {v.size()}, Device::cpu()).to_dtype(DType::BF16).to_vec_f64();
  }
  auto want = reference_encode(c, rounded, batch.padded_ids(), batch.mask);
  EXPECT_LE(max_rel_error_unpadded(out.to_vec_f64(), want, batch, c.hidden), 2e-5);
}

TEST(BertTiny, EncodeRejectsBadInputs) {
  TinyConfig c;
  TempDir dir("bad-input");
  write_tiny_model(dir.path, c, tiny_weights(c, 404));
  auto bert = models::Bert::load(dir.path, Device::cpu(), DType::F32);
  auto ids = Tensor::zeros({2, 3}, DType::U32, Device::cpu());
  auto mask = Tensor::ones({2, 3}, DType::F32, Device::cpu());
  EXPECT_THROW(bert.encode(ids, Tensor::ones({2, 4}, DType::F32, Device::cpu())), ShapeMismatch);
  EXPECT_THROW(bert.encode(ids.reshape({6}), mask.reshape({6})), ShapeMismatch);
  EXPECT_THROW(bert.encode(ids.to_dtype(DType::F32), mask), UnsupportedDType);
  size_t too_long = c.positions + 1;
  EXPECT_THROW(bert.encode(Tensor::zeros({1, too_long}, DType::U32, Device::cpu()),
                           Tensor::ones({1, too_long}, DType::F32, Device::cpu())),
               ShapeMismatch);
  EXPECT_THROW(models::Bert::load(dir.path, Device::cpu(), DType::F64), UnsupportedDType);
}

// The message of the FormatError thrown by `f`, or "" when nothing was thrown.
template <class F>
std::string format_error(F&& f) {
  try {
    f();
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

TEST(BertFolder, ErrorsNameTheFileAndField) {
  TinyConfig c;
  TempDir dir("errors");
  EXPECT_NE(format_error([&] {
              models::Bert::load(dir.path / "nope", Device::cpu());
            }).find("no such directory"),
            std::string::npos);
  // No config.json.
  EXPECT_NE(format_error([&] { models::Bert::load(dir.path, Device::cpu()); }).find("config.json"),
            std::string::npos);
  auto write_config = [&](const std::string& text) {
    std::ofstream(dir.path / "config.json") << text;
  };
  write_config("{\"hidden_size\": 16,");
  EXPECT_NE(
      format_error([&] { models::Bert::load(dir.path, Device::cpu()); }).find("malformed JSON"),
      std::string::npos);
  write_config("{\"hidden_size\": 16}");
  EXPECT_NE(format_error([&] { models::Bert::load(dir.path, Device::cpu()); }).find("vocab_size"),
            std::string::npos);
  write_tiny_model(dir.path, c, tiny_weights(c, 505));
  write_config(
      "{\"vocab_size\": 40, \"hidden_size\": 15, \"num_hidden_layers\": 2, "
      "\"num_attention_heads\": 4, \"intermediate_size\": 24, "
      "\"max_position_embeddings\": 20}");
  EXPECT_NE(format_error([&] { models::Bert::load(dir.path, Device::cpu()); }).find("multiple"),
            std::string::npos);
  write_config("{\"vocab_size\": \"many\"}");
  EXPECT_NE(format_error([&] {
              models::Bert::load(dir.path, Device::cpu());
            }).find("\"vocab_size\" must be a non-negative integer"),
            std::string::npos);
  // A config whose sizes disagree with the weights: the weight's name is in the message.
  write_config(
      "{\"vocab_size\": 41, \"hidden_size\": 16, \"num_hidden_layers\": 2, "
      "\"num_attention_heads\": 4, \"intermediate_size\": 24, "
      "\"max_position_embeddings\": 20}");
  try {
    models::Bert::load(dir.path, Device::cpu());
    ADD_FAILURE() << "a mis-shaped weight was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("word_embeddings"), std::string::npos) << e.what();
  }
  // A valid config without weights.
  write_tiny_model(dir.path, c, tiny_weights(c, 505));
  fs::remove(dir.path / "model.safetensors");
  EXPECT_NE(format_error([&] { models::Bert::load(dir.path, Device::cpu()); }).find("safetensors"),
            std::string::npos);
}

TEST(SentenceEmbedderFolder, ErrorsNameTheFile) {
  TinyConfig c;
  TempDir dir("st-errors");
  write_tiny_model(dir.path, c, tiny_weights(c, 606));
  // No tokenizer.json.
  EXPECT_NE(
      format_error([&] { SentenceEmbedder::load(dir.path, Device::cpu()); }).find("tokenizer.json"),
      std::string::npos);
  std::ofstream(dir.path / "modules.json")
      << "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
         "\"sentence_transformers.models.Transformer\"}, {\"idx\": 1, \"name\": \"1\", \"path\": "
         "\"2_Dense\", \"type\": \"sentence_transformers.models.Dense\"}]";
  EXPECT_NE(format_error([&] {
              SentenceEmbedder::load(dir.path, Device::cpu());
            }).find("sentence_transformers.models.Dense"),
            std::string::npos);
  std::ofstream(dir.path / "modules.json") << "{}";
  EXPECT_NE(
      format_error([&] { SentenceEmbedder::load(dir.path, Device::cpu()); }).find("modules.json"),
      std::string::npos);
}

TEST(SentenceEmbedderTiny, TokenizesAndTruncates) {
  TinyConfig c;
  TempDir dir("st-tok");
  write_tiny_model(dir.path, c, tiny_weights(c, 808));
  write_tiny_tokenizer(dir.path);
  auto embedder = SentenceEmbedder::load(dir.path, Device::cpu());
  // Without sentence_bert_config.json the limit is the model's positions.
  EXPECT_EQ(embedder.max_seq_length(), c.positions);
  EXPECT_EQ(embedder.pooling(), Pooling::Mean);
  EXPECT_FALSE(embedder.normalizes());
  EXPECT_EQ(embedder.tokenize("The cat sat on the mat."),
            (std::vector<uint32_t>{2, 5, 6, 7, 8, 5, 9, 13, 3}));
  EXPECT_EQ(embedder.tokenize("dogs"), (std::vector<uint32_t>{2, 10, 12, 3}));
  EXPECT_EQ(embedder.tokenize(""), (std::vector<uint32_t>{2, 3}));
  SentenceEmbedderOptions options;
  options.max_seq_length = 6;
  auto short_embedder = SentenceEmbedder::load(dir.path, Device::cpu(), options);
  EXPECT_EQ(short_embedder.tokenize("the the the the the the the"),
            (std::vector<uint32_t>{2, 5, 5, 5, 5, 3}));
  std::ofstream(dir.path / "sentence_bert_config.json") << "{\"max_seq_length\": 8}";
  EXPECT_EQ(SentenceEmbedder::load(dir.path, Device::cpu()).max_seq_length(), 8u);
}

TEST(SentenceEmbedderTiny, PoolingModesMatchFloat64Reference) {
  TinyConfig c;
  auto w = tiny_weights(c, 909);
  TempDir dir("st-pool");
  write_tiny_model(dir.path, c, w);
  write_tiny_tokenizer(dir.path);
  std::vector<std::string> texts{"The cat sat on the mat.",
                                 "A big red fox ran!",
                                 "dogs",
                                 "",
                                 "the cat the dog the mat the fox the cat the dog the mat the fox "
                                 "the cat the dog the mat",
                                 "red"};
  for (auto [mode, normalize] : {std::pair{"mean_tokens", true},
                                 {"mean_tokens", false},
                                 {"cls_token", true},
                                 {"max_tokens", false},
                                 {"mean_sqrt_len_tokens", false}}) {
    SCOPED_TRACE(std::string(mode) + (normalize ? " + normalize" : ""));
    write_st_files(dir.path, mode, normalize);
    SentenceEmbedderOptions options;
    options.batch_size = 4;         // sorted by length across batches
    options.max_batch_tokens = 24;  // and fewer sentences in the batches of long ones
    auto embedder = SentenceEmbedder::load(dir.path, Device::cpu(), options);
    EXPECT_EQ(embedder.normalizes(), normalize);
    auto emb = embedder.embed(texts);
    ASSERT_EQ(emb.shape(), Shape({texts.size(), c.hidden}));
    auto got = emb.to_vec2<float>();
    for (size_t i = 0; i < texts.size(); ++i) {
      auto ids = embedder.tokenize(texts[i]);
      std::vector<std::vector<int>> mask{std::vector<int>(ids.size(), 1)};
      auto hidden = reference_encode(c, w, {ids}, mask);
      auto want = reference_pool(hidden, ids.size(), c.hidden, mode, normalize);
      std::vector<double> row(got[i].begin(), got[i].end());
      EXPECT_TRUE(wick::testing::all_close(row, want, 1e-4, 1e-4)) << "text " << i;
    }
  }
}

// ---- all-MiniLM-L6-v2 ----

TEST(MiniLM, TokensMatchHuggingFace) {
  WICK_REQUIRE_MINILM(dir);
  auto embedder = SentenceEmbedder::load(dir, Device::cpu());
  EXPECT_EQ(embedder.dim(), 384u);
  EXPECT_EQ(embedder.max_seq_length(), 256u);
  EXPECT_EQ(embedder.pooling(), Pooling::Mean);
  EXPECT_TRUE(embedder.normalizes());
  auto texts = sentences();
  auto ids = npy::load((data_dir() / "token_ids.npy").string(), Device::cpu()).to_vec1<uint32_t>();
  auto lengths =
      npy::load((data_dir() / "token_lengths.npy").string(), Device::cpu()).to_vec1<uint32_t>();
  ASSERT_EQ(texts.size(), lengths.size());
  size_t at = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<uint32_t> want(ids.begin() + at, ids.begin() + at + lengths[i]);
    at += lengths[i];
    EXPECT_EQ(embedder.tokenize(texts[i]), want) << "sentence " << i << ": " << texts[i];
  }
}

TEST(MiniLM, HiddenStatesMatchTransformers) {
  WICK_REQUIRE_MINILM(dir);
  auto bert = models::Bert::load(dir, Device::cpu(), DType::F32);
  auto want = npy::load((data_dir() / "hidden_f32w.npy").string(), Device::cpu());
  auto embedder = SentenceEmbedder::load(dir, Device::cpu());
  auto texts = sentences();
  size_t b = want.dim(0), s = want.dim(1);
  std::vector<uint32_t> ids(b * s, 0);
  std::vector<float> mask(b * s, 0.0f);
  for (size_t i = 0; i < b; ++i) {
    auto row = embedder.tokenize(texts[i]);
    ASSERT_LE(row.size(), s);
    std::copy(row.begin(), row.end(), ids.begin() + i * s);
    std::fill_n(mask.begin() + i * s, row.size(), 1.0f);
  }
  auto got = bert.encode(Tensor::from_vec(ids, {b, s}, Device::cpu()),
                         Tensor::from_vec(mask, {b, s}, Device::cpu()));
  ASSERT_EQ(got.shape(), want.shape());
  // Every position, padding included (transformers computes those rows too).
  auto g = got.to_vec_f64(), w = want.to_vec_f64();
  double err = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    err = std::max(err, std::abs(g[i] - w[i]));
    scale = std::max(scale, std::abs(w[i]));
  }
  std::printf("    max |wick - f64 reference| %.3g (largest value %.3g), %zu values\n", err, scale,
              g.size());
  // The reference comes from the f32 weights: f16-stored ones are off by their rounding (2^-11).
  EXPECT_LE(err, (weights_are_f16(dir) ? 2e-3 : 1e-4) * scale);
}

TEST(MiniLM, EmbeddingsMatchSentenceTransformersF32) {
  WICK_REQUIRE_MINILM(dir);
  SentenceEmbedderOptions options;
  options.batch_size = 48;  // several batches, the last one partial
  auto embedder = SentenceEmbedder::load(dir, Device::cpu(), options);
  auto texts = sentences();
  size_t calls = 0, last = 0;
  auto emb = embedder.embed(texts, [&](size_t done, size_t total) {
    ++calls;
    EXPECT_EQ(total, texts.size());
    EXPECT_GT(done, last);
    last = done;
  });
  EXPECT_EQ(last, texts.size());
  // At least one pass per 48 sentences, more for the long ones (2048 tokens per pass).
  EXPECT_GE(calls, (texts.size() + 47) / 48);
  ASSERT_EQ(emb.shape(), Shape({texts.size(), 384}));
  EXPECT_EQ(emb.dtype(), DType::F32);
  EXPECT_TRUE(rows_match(emb, reference_embeddings(dir), 0.99999));
}

TEST(MiniLM, EmbeddingsBf16OnCpu) {
  WICK_REQUIRE_MINILM(dir);
  SentenceEmbedderOptions options;
  options.dtype = DType::BF16;
  options.batch_size = 32;
  auto embedder = SentenceEmbedder::load(dir, Device::cpu(), options);
  auto texts = sentences();
  texts.resize(32);
  auto ref = reference_embeddings(dir);
  ref.resize(32);
  EXPECT_TRUE(rows_match(embedder.embed(texts), ref, 0.999));
}

// The CPU's bf16 (bf16 projections, f32 elsewhere) against the f32 embeddings of the same
// sentences, at docs/NUMERICS.md's bound for bf16 projections: cosine >= 1 - 2^-10 and every
// element of the unit-length embeddings within 2^-8 (bf16's unit roundoff).
TEST(MiniLM, Bf16EmbeddingsWithinTheBoundOfF32) {
  WICK_REQUIRE_MINILM(dir);
  SentenceEmbedderOptions options;
  auto texts = sentences();
  texts.resize(64);
  auto f32 = SentenceEmbedder::load(dir, Device::cpu(), options).embed(texts).to_vec2<float>();
  options.dtype = DType::BF16;
  auto embedder = SentenceEmbedder::load(dir, Device::cpu(), options);
  EXPECT_EQ(embedder.bert().matmul_dtype(), DType::BF16);
  EXPECT_EQ(embedder.bert().dtype(), DType::F32);
  auto bf = embedder.embed(texts).to_vec2<float>();
  ASSERT_EQ(bf.size(), f32.size());
  double worst_cos = 2, worst_elem = 0;
  for (size_t i = 0; i < bf.size(); ++i) {
    worst_cos = std::min(worst_cos, cosine(bf[i], f32[i]));
    for (size_t j = 0; j < bf[i].size(); ++j) {
      worst_elem = std::max(worst_elem, std::abs(double(bf[i][j]) - f32[i][j]));
    }
  }
  std::printf("    bf16 vs f32: min cosine %.9f, max |element difference| %.3g\n", worst_cos,
              worst_elem);
  EXPECT_GE(worst_cos, 1 - 0x1p-10);
  EXPECT_LE(worst_elem, 0x1p-8);
  // bf16 products change the result: identical embeddings would mean f32 ran.
  EXPECT_GT(worst_elem, 0.0);
}

TEST(MiniLM, EmptyInputGivesNoRows) {
  WICK_REQUIRE_MINILM(dir);
  auto embedder = SentenceEmbedder::load(dir, Device::cpu());
  auto emb = embedder.embed({});
  EXPECT_EQ(emb.shape(), Shape({0, 384}));
}

}  // namespace
