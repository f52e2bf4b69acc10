// models::Bert and SentenceEmbedder on the GPU: a tiny random BERT against the float64 forward
// pass, and all-MiniLM-L6-v2 against sentence-transformers' pipeline in float64 (f32: cosine
// >= 0.99999 per sentence; bf16 and f16: >= 0.999). Skipped without a GPU or without the model
// folder (WICK_MINILM_DIR); WICK_REQUIRE_CUDA=1 / WICK_REQUIRE_MINILM=1 make those failures.

#include <gtest/gtest.h>

#include "bert_test_util.h"
#include "test_util.h"

namespace {

using namespace wick;
using namespace wick::testing::bert;

TEST(CudaBert, TinyMatchesFloat64Reference) {
  WICK_REQUIRE_GPU();
  TinyConfig c;
  auto w = tiny_weights(c, 707);
  TempDir dir("cuda-tiny");
  write_tiny_model(dir.path, c, w);
  std::vector<std::vector<uint32_t>> ids{{2, 5, 9, 13, 1}, {2, 17, 3, 0, 0}};
  std::vector<std::vector<int>> mask{{1, 1, 1, 1, 1}, {1, 1, 1, 0, 0}};
  auto want = reference_encode(c, w, ids, mask);
  std::vector<uint32_t> flat_ids;
  std::vector<float> flat_mask;
  for (size_t b = 0; b < 2; ++b)
    for (size_t t = 0; t < 5; ++t) flat_ids.push_back(ids[b][t]), flat_mask.push_back(mask[b][t]);
  for (auto [dtype, tol] : {std::pair{DType::F32, 2e-5}, {DType::F16, 2e-2}, {DType::BF16, 8e-2}}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto bert = models::Bert::load(dir.path, Device::cuda(), dtype);
    auto out = bert.encode(Tensor::from_vec(flat_ids, {2, 5}, Device::cuda()),
                           Tensor::from_vec(flat_mask, {2, 5}, Device::cuda()));
    EXPECT_TRUE(out.device().is_cuda());
    auto got = out.to_vec_f64();
    double err = 0, scale = 0;
    for (size_t b = 0; b < 2; ++b)
      for (size_t t = 0; t < 5; ++t) {
        if (!mask[b][t]) continue;
        for (size_t j = 0; j < c.hidden; ++j) {
          size_t i = (b * 5 + t) * c.hidden + j;
          err = std::max(err, std::abs(got[i] - want[i]));
          scale = std::max(scale, std::abs(want[i]));
        }
      }
    EXPECT_LE(err, tol * scale);
  }
}

void check_minilm(const fs::path& dir, DType dtype, double min_cosine) {
  SentenceEmbedderOptions options;
  options.dtype = dtype;
  options.batch_size = 64;
  auto embedder = SentenceEmbedder::load(dir, Device::cuda(), options);
  auto emb = embedder.embed(sentences());
  EXPECT_TRUE(emb.device().is_cuda());
  EXPECT_TRUE(rows_match(emb, reference_embeddings(dir), min_cosine));
}

TEST(CudaMiniLM, EmbeddingsF32) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_MINILM(dir);
  check_minilm(dir, DType::F32, 0.99999);
}

TEST(CudaMiniLM, EmbeddingsBf16) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_MINILM(dir);
  check_minilm(dir, DType::BF16, 0.999);
}

TEST(CudaMiniLM, EmbeddingsF16) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_MINILM(dir);
  check_minilm(dir, DType::F16, 0.999);
}

}  // namespace
