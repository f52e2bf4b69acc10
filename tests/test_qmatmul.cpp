// qmatmul on the CPU against dequantise-then-matmul in float64, under the bound of
// docs/NUMERICS.md (the activations' 8-bit rounding plus an f32 accumulation).

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "../tools/teacher_forced.h"
#include "qmatmul_test_util.h"
#include "test_util.h"
#include "wick/quantized.h"
#include "wick/tokenizer.h"

namespace wick {
namespace {

using testing::rng;

using testing::random_qtensor;

struct Case {
  GgmlType type;
  size_t m, n, k;
};

// The two parts of Q4_1's and Q5_1's (d q + m) and Q4_K's, Q5_K's and Q2_K's (d sc q - dmin m)
// weights, each exact in f32: the scale part (the min zeroed) and the min part (the scale
// zeroed). The kernels scale and sum them apart, so their f32 roundings go with |scale part| +
// |min part| rather than |w|. Other types: {w, 0}.
std::pair<std::vector<double>, std::vector<double>> weight_parts(const QTensor& w) {
  auto values = [](const QTensor& q) {
    return q.dequantize().to_dtype(DType::F64).flatten_all().to_vec1<double>();
  };
  const GgmlType t = w.type();
  // The byte offset of the f16 scale d in each block; the min's (m or dmin) follows it.
  size_t d_at = 0;
  if (t == GgmlType::Q2_K) {
    d_at = 80;
  } else if (t != GgmlType::Q4_1 && t != GgmlType::Q5_1 && t != GgmlType::Q4_K &&
             t != GgmlType::Q5_K) {
    std::vector<double> v = values(w);
    return {v, std::vector<double>(v.size(), 0.0)};
  }
  std::vector<uint8_t> raw = w.data().to_vec1<uint8_t>();
  auto with_zeroed = [&](size_t at) {
    std::vector<uint8_t> r = raw;
    for (size_t off = 0; off < r.size(); off += ggml_type_size(t))
      r[off + at] = r[off + at + 1] = 0;
    return values(QTensor(t, w.shape(), Tensor::from_vec(r, {r.size()}, Device::cpu())));
  };
  return {with_zeroed(d_at + 2), with_zeroed(d_at)};
}

void check(const Case& c, const std::vector<size_t>& x_lead = {}) {
  SCOPED_TRACE(ggml_type_name(c.type) + " m " + std::to_string(c.m) + " n " + std::to_string(c.n) +
               " k " + std::to_string(c.k));
  QTensor w = random_qtensor(c.type, c.n, c.k);
  std::vector<size_t> xd = x_lead.empty() ? std::vector<size_t>{c.m} : x_lead;
  xd.push_back(c.k);
  Tensor x = testing::random_tensor(Shape(xd), DType::F32);
  testing::poison_allocations(c.m * c.n, DType::F32, Device::cpu());
  Tensor y = qmatmul(x, w);
  std::vector<size_t> yd = xd;
  yd.back() = c.n;
  ASSERT_EQ(y.shape(), Shape(yd));
  std::vector<double> wv = w.dequantize().to_dtype(DType::F64).flatten_all().to_vec1<double>();
  auto [scale_part, min_part] = weight_parts(w);
  std::vector<double> xv = x.to_dtype(DType::F64).flatten_all().to_vec1<double>();
  std::vector<double> got = y.to_dtype(DType::F64).flatten_all().to_vec1<double>();
  // Half the step of each activation's 8- or 16-bit block (0 where x stays f32).
  const int bits = qmatmul_cpu_activation_bits(c.type);
  const bool quantized_x = bits != 0;
  const double top = bits == 16 ? 32512 : 127;  // the block's max |x| scales to this integer
  std::vector<double> half_step(xv.size(), 0.0);
  if (quantized_x) {
    for (size_t b = 0; b < xv.size(); b += 32) {
      double amax = 0;
      for (size_t j = b; j < b + 32; ++j) amax = std::max(amax, std::abs(xv[j]));
      for (size_t j = b; j < b + 32; ++j) half_step[j] = amax / (2 * top);
    }
  }
  std::vector<double> want(c.m * c.n), abs_sum(want.size()), quant_abs(want.size());
  for (size_t i = 0; i < c.m; ++i) {
    for (size_t j = 0; j < c.n; ++j) {
      double s = 0, a = 0, q = 0;
      for (size_t p = 0; p < c.k; ++p) {
        double w_jp = wv[j * c.k + p], x_ip = xv[i * c.k + p];
        s += w_jp * x_ip;
        a += (std::abs(scale_part[j * c.k + p]) + std::abs(min_part[j * c.k + p])) * std::abs(x_ip);
        q += std::abs(w_jp) * half_step[i * c.k + p];
      }
      want[i * c.n + j] = s;
      abs_sum[i * c.n + j] = a;
      quant_abs[i * c.n + j] = q;
    }
  }
  auto bound = [&](size_t i, double e) {
    return numerics::qmatmul_bound(DType::F32, c.k, e, abs_sum[i], quant_abs[i]);
  };
  if (bits == 8) {
    // 8-bit activations: the worst case bounds small outputs loosely enough to accept zero for
    // many of them, so the rms check below is what tells a wrong kernel; each element still
    // stays within its worst case.
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_LE(std::abs(got[i] - want[i]), bound(i, want[i])) << "element " << i;
    }
  } else {
    EXPECT_TRUE(testing::within_bounds(got, want, bound));
  }
  // The bound is the worst case; the rounding errors of x are independent, so the typical
  // error is far smaller: a kernel that mishandles a block (a scale, an offset) stands out.
  // With 16-bit x the f32 sums over the k / 32 blocks are of the same order, so they count too.
  if (quantized_x) {
    double err2 = 0, expect2 = 0;
    const double f32_sum = 2 * std::sqrt(c.k / 32.0) * 0x1p-24;
    for (size_t i = 0; i < want.size(); ++i) {
      err2 += (got[i] - want[i]) * (got[i] - want[i]);
      expect2 += quant_abs[i] * quant_abs[i] / c.k;  // ~ sum w^2 h^2 per output
      expect2 += (f32_sum * abs_sum[i]) * (f32_sum * abs_sum[i]);
    }
    EXPECT_LE(err2, 4 * expect2 + 1e-12) << "rms error above the rounding's expected spread";
  }
}

class QMatmulTypes : public ::testing::TestWithParam<GgmlType> {};

TEST_P(QMatmulTypes, DecodeAndPrefillShapes) {
  GgmlType t = GetParam();
  size_t kb = ggml_block_size(t);
  // m = 1 (decode), 5 (a group of four and one more), 9, 19 (past a tile's 16); n with and
  // without a partial tile.
  check({t, 1, 37, 8 * kb > 512 ? 2 * kb : 8 * kb});
  check({t, 1, 16, kb});
  check({t, 5, 64, 2 * kb});
  check({t, 9, 23, kb});
  check({t, 19, 40, 2 * kb});
  check({t, 6, 48, 4 * kb}, {2, 3});
}

INSTANTIATE_TEST_SUITE_P(Types, QMatmulTypes, ::testing::ValuesIn(testing::qmatmul_block_types()),
                         [](const auto& info) { return ggml_type_name(info.param); });

TEST(QMatmul, ReusesTheRepackedWeights) {
  QTensor w = random_qtensor(GgmlType::Q4_1, 32, 64);
  QTensor copy = w;  // shares the repacked tiles
  Tensor x = testing::random_tensor({3, 64}, DType::F32);
  std::vector<float> a = qmatmul(x, w).flatten_all().to_vec1<float>();
  std::vector<float> b = qmatmul(x, copy).flatten_all().to_vec1<float>();
  EXPECT_EQ(a, b);
}

TEST(QMatmul, NonContiguousActivations) {
  QTensor w = random_qtensor(GgmlType::Q8_0, 16, 64);
  Tensor x = testing::random_tensor({64, 4}, DType::F32).t();
  std::vector<float> a = qmatmul(x, w).flatten_all().to_vec1<float>();
  std::vector<float> b = qmatmul(x.contiguous(), w).flatten_all().to_vec1<float>();
  EXPECT_EQ(a, b);
}

TEST(QMatmul, Errors) {
  QTensor w = random_qtensor(GgmlType::Q4_0, 8, 64);
  EXPECT_THROW(qmatmul(testing::random_tensor({2, 32}, DType::F32), w), ShapeMismatch);
  EXPECT_THROW(qmatmul(testing::random_tensor({2, 64}, DType::F64), w), UnsupportedDType);
  EXPECT_THROW(qmatmul(testing::random_tensor({2, 64}, DType::BF16), w), UnsupportedDType);
  QTensor w3(GgmlType::Q4_0, {2, 4, 64},
             Tensor::zeros({ggml_bytes(GgmlType::Q4_0, 512)}, DType::U8, Device::cpu()));
  EXPECT_THROW(qmatmul(testing::random_tensor({2, 64}, DType::F32), w3), ShapeMismatch);
  QTensor iq2(GgmlType::IQ2_XXS, {2, 256},
              Tensor::zeros({ggml_bytes(GgmlType::IQ2_XXS, 512)}, DType::U8, Device::cpu()));
  EXPECT_THROW(qmatmul(testing::random_tensor({2, 256}, DType::F32), iq2), UnsupportedDType);
  EXPECT_THROW(qmatmul(Tensor(), w), Error);
  EXPECT_FALSE(qmatmul_supports(GgmlType::IQ2_XXS));
  EXPECT_FALSE(qmatmul_supports(GgmlType::Q8_1));
  EXPECT_TRUE(qmatmul_supports(GgmlType::Q6_K));
  EXPECT_TRUE(qmatmul_supports(GgmlType::Q3_K));
}

// A small Llama as a GGUF file at a temporary path named by `tag`, for the caller to load and
// remove: hidden 256, feed-forward 512, 4 heads of 2 k/v heads, vocabulary 64, a context of 64;
// random f32 embeddings, norms of 0.05 (small norm weights keep the random matrices' outputs
// moderate: a smooth softmax) and 1 at the output; the head, then each layer's projections in
// order, from head() and matrix(layer, n, k).
std::string write_random_llama(const std::string& tag, size_t layers,
                               const std::function<QTensor()>& head,
                               const std::function<QTensor(size_t, size_t, size_t)>& matrix) {
  using gguf::Value;
  using gguf::ValueType;
  const size_t hidden = 256, ff = 512, heads = 4, kv_heads = 2, vocab = 64;
  auto u32 = [](size_t v) { return Value::u64(v, ValueType::U32); };
  const std::map<std::string, Value> md{
      {"general.architecture", Value::string("llama")},
      {"llama.embedding_length", u32(hidden)},
      {"llama.feed_forward_length", u32(ff)},
      {"llama.block_count", u32(layers)},
      {"llama.attention.head_count", u32(heads)},
      {"llama.attention.head_count_kv", u32(kv_heads)},
      {"llama.rope.dimension_count", u32(hidden / heads)},
      {"llama.context_length", u32(64)},
      {"llama.attention.layer_norm_rms_epsilon", Value::f64(1e-5, ValueType::F32)},
      {"llama.rope.freq_base", Value::f64(10000.0, ValueType::F32)}};
  std::map<std::string, Tensor> plain{
      {"token_embd.weight", testing::random_tensor({vocab, hidden}, DType::F32)},
      {"output_norm.weight", Tensor::ones({hidden}, DType::F32, Device::cpu())}};
  std::map<std::string, QTensor> quantized{{"output.weight", head()}};
  const size_t kv = hidden / heads * kv_heads;
  for (size_t i = 0; i < layers; ++i) {
    std::string g = "blk." + std::to_string(i) + ".";
    plain[g + "attn_norm.weight"] = Tensor::full(0.05f, Shape{hidden}, Device::cpu());
    plain[g + "ffn_norm.weight"] = Tensor::full(0.05f, Shape{hidden}, Device::cpu());
    quantized[g + "attn_q.weight"] = matrix(i, hidden, hidden);
    quantized[g + "attn_k.weight"] = matrix(i, kv, hidden);
    quantized[g + "attn_v.weight"] = matrix(i, kv, hidden);
    quantized[g + "attn_output.weight"] = matrix(i, hidden, hidden);
    quantized[g + "ffn_gate.weight"] = matrix(i, ff, hidden);
    quantized[g + "ffn_up.weight"] = matrix(i, ff, hidden);
    quantized[g + "ffn_down.weight"] = matrix(i, hidden, ff);
  }
  std::string path = (std::filesystem::temp_directory_path() /
                      ("wick_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
                         .string();
  gguf::save(plain, path, md, quantized);
  return path;
}

// A GGUF Llama whose matrices mix the types of llama.cpp's Q2_K, Q3_K_M, Q5_K_M and IQ4 files
// (random blocks): load_gguf_quantized keeps them as blocks, and its logits equal those of the
// same file dequantised at load (within the rounding of the activations).
TEST(QMatmul, KQuantMixLlamaLoadsKeptQuantized) {
  const size_t layers = 2;
  const GgmlType types[] = {GgmlType::Q2_K,   GgmlType::Q3_K, GgmlType::Q5_K,
                            GgmlType::IQ4_XS, GgmlType::Q5_1, GgmlType::IQ4_NL};
  size_t next = 0;
  auto matrix = [&](size_t n, size_t k) { return random_qtensor(types[next++ % 6], n, k); };
  const std::string path = write_random_llama(
      "kmix", layers, [&] { return matrix(64, 256); },
      [&](size_t, size_t n, size_t k) { return matrix(n, k); });
  models::Llama q = models::Llama::load(path, Device::cpu(), DType::F32, true);
  models::Llama f = models::Llama::load(path, Device::cpu(), DType::F32, false);
  std::remove(path.c_str());
  EXPECT_LT(q.weight_bytes() * 4, f.weight_bytes());
  std::vector<uint32_t> prompt{3, 17, 42, 5, 63, 0, 9};
  Tensor ids = Tensor::from_vec(prompt, {1, prompt.size()}, Device::cpu());
  models::KvCache qc = q.make_cache(1, prompt.size()), fc = f.make_cache(1, prompt.size());
  std::vector<double> got = q.forward(ids, qc).to_vec_f64();
  std::vector<double> want = f.forward(ids, fc).to_vec_f64();
  double range = testing::range_of(want);
  EXPECT_GT(range, 1.0);
  // The dequantised load runs f32 matmuls; the kept-quantized one the integer kernels over
  // activations rounded to 16 (or 8) bits (with f32 activations, f32 dots over the same f32
  // weights summed in another order: a few 2^-24 sqrt(k) per dot, ~1e-6 of the range here).
  // Each projection's rounding is a half step of each block's maximum, relative 1/65024 (or
  // 1/254), carried to the logits with a gain below 1 in this network; the logits go through
  // 4 such projections in sequence per layer (q/k/v, o, gate/up, down) and the head, and the
  // errors add. A block decoded wrongly differs by O(range).
  const int bits = qmatmul_cpu_activation_bits(GgmlType::Q3_K);
  const double half_step = bits == 8 ? 1.0 / 254 : bits == 16 ? 1.0 / 65024 : 0.0;
  const double chain = 4.0 * layers + 1;
  EXPECT_LE(testing::max_abs_diff(got, want), (1e-4 + chain * half_step) * range);
}

// A GGUF Llama whose projections have a tile layout (the CPU decode plan's weights, one type per
// layer, Q8_0's head), kept quantized: 3 layers, 4 heads of 2 k/v heads, vocabulary 64.
models::Llama tiled_llama() {
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0};
  const std::string path = write_random_llama(
      "tiled", 3, [] { return random_qtensor(GgmlType::Q8_0, 64, 256); },
      [&](size_t layer, size_t n, size_t k) { return random_qtensor(types[layer], n, k); });
  models::Llama q = models::Llama::load(path, Device::cpu(), DType::F32, true);
  std::remove(path.c_str());
  return q;
}

// tiled_llama(): the logits of each token decoded alone (the plan, which reads and writes the
// cache) equal those of the whole sequence run at once (the composed prefill, whose attention and
// norms are other kernels), within the rounding of the activations.
TEST(QMatmul, TiledLlamaDecodesTokenByTokenAsItsPrefill) {
  const size_t layers = 3, vocab = 64;
  models::Llama q = tiled_llama();
  const std::vector<uint32_t> prompt{3, 17, 42, 5, 63, 0, 9, 21, 33};
  const size_t n = prompt.size();
  Tensor ids = Tensor::from_vec(prompt, {1, n}, Device::cpu());
  models::KvCache all = q.make_cache(1, n);
  std::vector<double> want = q.forward(ids, all).to_vec_f64();  // (1, n, vocab)
  models::KvCache one = q.make_cache(1, n);
  const int bits = qmatmul_cpu_activation_bits(GgmlType::Q4_0);
  const double half_step = bits == 8 ? 1.0 / 254 : bits == 16 ? 1.0 / 65024 : 0.0;
  const double chain = 4.0 * layers + 1;
  for (size_t t = 0; t < n; ++t) {
    Tensor logits = q.forward_last(ids.narrow(1, t, 1), one);
    ASSERT_EQ(logits.shape(), (Shape{1, vocab}));
    EXPECT_EQ(one.length(), t + 1);
    std::vector<double> w(want.begin() + t * vocab, want.begin() + (t + 1) * vocab);
    const double range = testing::range_of(w);
    EXPECT_GT(range, 1.0);
    EXPECT_LE(testing::max_abs_diff(logits.to_vec_f64(), w), (1e-4 + chain * half_step) * range)
        << "token " << t;
  }
  // The keys and values the steps wrote are those of the prefill.
  for (size_t li = 0; li < layers; ++li) {
    EXPECT_LE(testing::max_abs_diff(one.k(li).to_vec_f64(), all.k(li).to_vec_f64()),
              1e-3 * testing::range_of(all.k(li).to_vec_f64()))
        << "layer " << li;
    EXPECT_LE(testing::max_abs_diff(one.v(li).to_vec_f64(), all.v(li).to_vec_f64()),
              1e-3 * testing::range_of(all.v(li).to_vec_f64()))
        << "layer " << li;
  }
}

// The serving engine's steps of tiled_llama(): a sequence's tokens one step each alone (the CPU
// decode plan's paged step) give the bits they get beside another sequence in every step (the
// composed batch), logits and pools, and the logits of the prefill within the activations'
// rounding.
TEST(QMatmul, TiledLlamaPagedStepAloneIsTheBitsOfTheBatch) {
  const size_t layers = 3, vocab = 64, page_size = 4;
  models::Llama q = tiled_llama();
  const std::vector<uint32_t> prompt{3, 17, 42, 5, 63, 0, 9, 21, 33},
      other{8, 1, 60, 2, 2, 7, 50, 11, 4};
  const size_t n = prompt.size();
  models::KvCache cache = q.make_cache(1, n);
  std::vector<double> want =
      q.forward(Tensor::from_vec(prompt, {1, n}, Device::cpu()), cache).to_vec_f64();
  models::PagedKvCache alone = q.make_paged_cache(8, page_size);
  models::PagedKvCache batched = q.make_paged_cache(8, page_size);
  const std::vector<uint32_t> pages_a{5, 1, 6}, pages_b{0, 3, 7};
  const int bits = qmatmul_cpu_activation_bits(GgmlType::Q4_0);
  const double half_step = bits == 8 ? 1.0 / 254 : bits == 16 ? 1.0 / 65024 : 0.0;
  const double chain = 4.0 * layers + 1;
  for (size_t t = 0; t < n; ++t) {
    const models::PagedSequence a{{prompt[t]}, t, pages_a}, b{{other[t]}, t, pages_b};
    Tensor one = q.forward_paged({a}, alone);
    Tensor both = q.forward_paged({b, a}, batched);
    ASSERT_EQ(one.shape(), (Shape{1, vocab}));
    EXPECT_EQ(one.to_vec_f64(), both.narrow(0, 1, 1).to_vec_f64()) << "token " << t;
    std::vector<double> w(want.begin() + t * vocab, want.begin() + (t + 1) * vocab);
    const double range = testing::range_of(w);
    EXPECT_LE(testing::max_abs_diff(one.to_vec_f64(), w), (1e-4 + chain * half_step) * range)
        << "token " << t;
  }
  for (size_t li = 0; li < layers; ++li) {
    for (uint32_t page : pages_a) {
      EXPECT_EQ(alone.k(li).get(page).to_vec_f64(), batched.k(li).get(page).to_vec_f64());
      EXPECT_EQ(alone.v(li).get(page).to_vec_f64(), batched.v(li).get(page).to_vec_f64());
    }
  }
}

// SmolLM2-135M-Instruct Q4_1 kept quantized against the same file dequantised to f32,
// teacher-forced over 512 tokens of English text: top-1 next-token agreement >= 97% and
// perplexity within 1%. The model from WICK_SMOLLM2_GGUF or .ci/run's cache (98 MB, not in the
// repository; CI sets WICK_REQUIRE_SMOLLM2=1). The same file requantized by
// scripts/requantize_gguf.py (Q5_0, Q4_K, Q6_K) checks those kernels.
TEST(QMatmulSmolLM2, KeptQuantizedAgreesWithDequantised) {
  WICK_REQUIRE_SMOLLM2(path);
  std::ifstream in(std::string(WICK_SOURCE_DIR) + "/docs/NUMERICS.md");
  std::stringstream text;
  text << in.rdbuf();
  Tokenizer tok = models::load_gguf_tokenizer(path);
  std::vector<uint32_t> ids = tok.encode(text.str(), true);
  ASSERT_GE(ids.size(), 512u);
  ids.resize(512);
  models::Llama q = models::Llama::load(path, Device::cpu(), DType::F32, true);
  models::Llama f = models::Llama::load(path, Device::cpu(), DType::F32, false);
  EXPECT_LT(q.weight_bytes() * 2, f.weight_bytes());
  tools::TeacherForced r = tools::teacher_forced(q, f, ids);
  std::printf("agreement %.4f, perplexity %.4f (quantized) vs %.4f (dequantised)\n", r.agreement,
              r.perplexity_a, r.perplexity_b);
  EXPECT_GE(r.agreement, 0.97);
  EXPECT_NEAR(r.perplexity_a / r.perplexity_b, 1.0, 0.01);
}

}  // namespace
}  // namespace wick
