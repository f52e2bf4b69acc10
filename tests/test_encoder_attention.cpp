// Unpadded (varlen) self-attention of packed sequences (nn::detail::varlen_attention,
// fused::VarlenAttentionOp) against a float64 reference at numerics.h's attention bound, for
// lengths that are not whole key blocks and head sizes that are not whole vectors; a sequence
// alone equals it inside a batch, bit for bit; Bert::encode_packed against encode().

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "bert_test_util.h"
#include "expect_error.h"
#include "nn/varlen_attention.h"
#include "test_util.h"

namespace {

using namespace wick;
using wick::testing::random_values;

std::vector<uint32_t> offsets_of(const std::vector<size_t>& lengths) {
  std::vector<uint32_t> o{0};
  for (size_t len : lengths) o.push_back(o.back() + static_cast<uint32_t>(len));
  return o;
}

// varlen_attention of random qkv for `lengths` in `dtype` against float64, element by element.
void check_attention(const std::vector<size_t>& lengths, size_t heads, size_t d, DType dtype) {
  const size_t h = heads * d;
  const auto o = offsets_of(lengths);
  const size_t t = o.back();
  auto values = random_values(t * 3 * h);
  auto qkv = Tensor::from_vec(values, {t, 3 * h}, Device::cpu()).to_dtype(dtype);
  auto x = qkv.to_vec_f64();  // the operands as the op sees them
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  auto got = nn::detail::varlen_attention(qkv, Tensor::from_vec(o, {o.size()}, Device::cpu()),
                                          heads, scale)
                 .to_vec_f64();
  ASSERT_EQ(got.size(), t * h);
  size_t bad = 0;
  for (size_t seq = 0; seq < lengths.size(); ++seq) {
    const size_t s = lengths[seq], first = o[seq];
    for (size_t head = 0; head < heads; ++head) {
      for (size_t i = 0; i < s; ++i) {
        const double* q = &x[(first + i) * 3 * h + head * d];
        std::vector<double> sc(s), err(s), p(s);
        double mx = -1e300, mn = 1e300;
        for (size_t j = 0; j < s; ++j) {
          const double* k = &x[(first + j) * 3 * h + h + head * d];
          double dot = 0, abs = 0;
          for (size_t c = 0; c < d; ++c) dot += q[c] * k[c], abs += std::abs(q[c] * k[c]);
          sc[j] = dot * scale;
          err[j] = numerics::attention_score_error(dtype, d, abs * scale, sc[j], false);
          mx = std::max(mx, sc[j]);
          mn = std::min(mn, sc[j]);
        }
        double sum = 0;
        for (size_t j = 0; j < s; ++j) sum += p[j] = std::exp(sc[j] - mx);
        for (size_t c = 0; c < d; ++c) {
          double want = 0, pv = 0, pev = 0;
          for (size_t j = 0; j < s; ++j) {
            const double vj = x[(first + j) * 3 * h + 2 * h + head * d + c];
            want += p[j] / sum * vj;
            pv += p[j] / sum * std::abs(vj);
            pev += p[j] / sum * err[j] * std::abs(vj);
          }
          double bound = numerics::attention_bound(dtype, s, want, pv, pev, mx - mn, false);
          double g = got[(first + i) * h + head * d + c];
          if (!(std::abs(g - want) <= bound) && ++bad <= 5) {
            ADD_FAILURE() << "sequence " << seq << " head " << head << " query " << i << " col "
                          << c << ": got " << g << " want " << want << " bound " << bound;
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(VarlenAttention, F32MatchesFloat64) {
  check_attention({1, 5, 16, 17, 33, 70}, 3, 8, DType::F32);
  check_attention({11, 2, 40}, 2, 32, DType::F32);
  check_attention({7, 19}, 4, 12, DType::F32);  // d not a multiple of 8
}

// f64 takes the op's composed fallback (scaled_dot_product_attention per sequence).
TEST(VarlenAttention, F64FallbackMatchesFloat64) {
  check_attention({3, 9, 1}, 2, 8, DType::F64);
}

// A sequence's rows do not depend on the sequences beside it.
TEST(VarlenAttention, SequenceAloneEqualsItInTheBatch) {
  const size_t heads = 3, d = 16, h = heads * d;
  const std::vector<size_t> lengths{9, 40, 1, 23};
  const auto o = offsets_of(lengths);
  auto qkv = Tensor::from_vec(random_values(o.back() * 3 * h), {o.back(), 3 * h}, Device::cpu())
                 .to_dtype(DType::F32);
  auto all =
      nn::detail::varlen_attention(qkv, Tensor::from_vec(o, {o.size()}, Device::cpu()), heads, 0.25)
          .to_vec_f64();
  for (size_t seq = 0; seq < lengths.size(); ++seq) {
    std::vector<uint32_t> one{0, static_cast<uint32_t>(lengths[seq])};
    auto alone =
        nn::detail::varlen_attention(qkv.narrow(0, o[seq], lengths[seq]).contiguous(),
                                     Tensor::from_vec(one, {2}, Device::cpu()), heads, 0.25)
            .to_vec_f64();
    for (size_t i = 0; i < alone.size(); ++i) {
      ASSERT_EQ(alone[i], all[o[seq] * h + i]) << "sequence " << seq << ", element " << i;
    }
  }
}

TEST(VarlenAttention, BadOperandsThrow) {
  auto qkv = Tensor::zeros({5, 12}, DType::F32, Device::cpu());
  auto off = [](std::vector<uint32_t> v) { return Tensor::from_vec(v, {v.size()}, Device::cpu()); };
  EXPECT_BAD(ShapeMismatch, "varlen_attention",
             nn::detail::varlen_attention(qkv, off({0, 4}), 2, 1));
  EXPECT_BAD(ShapeMismatch, "varlen_attention",
             nn::detail::varlen_attention(qkv, off({0, 3, 3, 5}), 2, 1));
  EXPECT_BAD(ShapeMismatch, "varlen_attention",
             nn::detail::varlen_attention(qkv, off({0, 5}), 5, 1));
  EXPECT_BAD(DTypeMismatch, "varlen_attention",
             nn::detail::varlen_attention(qkv, off({0, 5}).to_dtype(DType::I64), 2, 1));
}

// encode_packed's rows are encode()'s unpadded rows (a tiny random BERT).
TEST(BertPacked, RowsMatchThePaddedEncoder) {
  using namespace wick::testing::bert;
  TinyConfig c;
  TempDir dir("packed");
  write_tiny_model(dir.path, c, tiny_weights(c, 606));
  auto bert = models::Bert::load(dir.path, Device::cpu(), DType::F32);
  const std::vector<std::vector<uint32_t>> seqs{{2, 5, 9, 13, 1, 30, 3}, {2, 17, 4, 3}, {2}};
  const size_t len = 7;
  std::vector<uint32_t> padded(seqs.size() * len, 0), packed;
  std::vector<float> mask(seqs.size() * len, 0.0f);
  std::vector<size_t> lengths;
  for (size_t b = 0; b < seqs.size(); ++b) {
    for (size_t t = 0; t < seqs[b].size(); ++t)
      padded[b * len + t] = seqs[b][t], mask[b * len + t] = 1;
    packed.insert(packed.end(), seqs[b].begin(), seqs[b].end());
    lengths.push_back(seqs[b].size());
  }
  auto want = bert.encode(Tensor::from_vec(padded, {seqs.size(), len}, Device::cpu()),
                          Tensor::from_vec(mask, {seqs.size(), len}, Device::cpu()))
                  .to_vec_f64();
  auto got = bert.encode_packed(Tensor::from_vec(packed, {packed.size()}, Device::cpu()), lengths);
  ASSERT_EQ(got.shape(), Shape({packed.size(), c.hidden}));
  auto g = got.to_vec_f64();
  size_t row = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    for (size_t t = 0; t < seqs[b].size(); ++t, ++row) {
      for (size_t j = 0; j < c.hidden; ++j) {
        // Layer norms keep values O(1): a few f32 units, as BertTiny's f32 bound.
        EXPECT_NEAR(g[row * c.hidden + j], want[(b * len + t) * c.hidden + j], 2e-5)
            << "sequence " << b << " token " << t << " col " << j;
      }
    }
  }
  auto ids = Tensor::from_vec(packed, {packed.size()}, Device::cpu());
  EXPECT_BAD(ShapeMismatch, "encode_packed", bert.encode_packed(ids, {7, 4}));
  EXPECT_BAD(ShapeMismatch, "encode_packed", bert.encode_packed(ids, {7, 0, 4, 1}));
  EXPECT_BAD(ShapeMismatch, "encode_packed", bert.encode_packed(ids.reshape({3, 4}), {12}));
  EXPECT_BAD(UnsupportedDType, "encode_packed",
             bert.encode_packed(ids.to_dtype(DType::F32), lengths));
}

}  // namespace
