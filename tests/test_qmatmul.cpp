// qmatmul on the CPU against dequantise-then-matmul in float64, under the bound of
// docs/NUMERICS.md (the activations' 8-bit rounding plus an f32 accumulation).

#include <cstring>
#include <fstream>
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

// The two parts of Q4_1's (d q + m) and Q4_K's (d sc q - dmin m) weights, each exact in f32:
// the scale part (the min zeroed) and the min part (the scale zeroed). The kernels scale and sum
// them apart, so their f32 roundings go with |scale part| + |min part| rather than |w|.
// Other types: {w, 0}.
std::pair<std::vector<double>, std::vector<double>> weight_parts(const QTensor& w) {
  auto values = [](const QTensor& q) {
    return q.dequantize().to_dtype(DType::F64).flatten_all().to_vec1<double>();
  };
  const GgmlType t = w.type();
  if (t != GgmlType::Q4_1 && t != GgmlType::Q4_K) {
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
  return {with_zeroed(2), with_zeroed(0)};  // d or dmin / m at bytes 0 and 2 of each block
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
