// nn::Weights (prefixes, shapes, errors, conversion) and the layers (Linear, Embedding,
// LayerNorm, RmsNorm) against their definitions in f64.

#include <string>

#include "test_util.h"
#include "wick/formats.h"

namespace wick {
namespace {

using testing::all_close;
using testing::random_tensor;

const Device cpu = Device::cpu();

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no throw";
}

nn::Weights sample_weights(std::optional<DType> dtype = DType::F32) {
  std::map<std::string, Tensor> m;
  m["encoder.layer.0.dense.weight"] = random_tensor({3, 4}, DType::F64);
  m["encoder.layer.0.dense.bias"] = random_tensor({3}, DType::F64);
  m["encoder.layer.1.norm.weight"] = random_tensor({4}, DType::BF16);
  m["ids"] = Tensor::from_vec<uint32_t>({1, 2}, {2}, cpu);
  return nn::Weights::from_map(m, dtype, cpu);
}

TEST(NnWeights, PrefixesAndLookup) {
  nn::Weights w = sample_weights();
  nn::Weights l0 = w.pp("encoder").pp("layer").pp(0);
  EXPECT_EQ(l0.prefix(), "encoder.layer.0");
  EXPECT_EQ(l0.path("dense.weight"), "encoder.layer.0.dense.weight");
  EXPECT_TRUE(l0.contains("dense.weight"));
  EXPECT_FALSE(l0.contains("dense.missing"));
  EXPECT_EQ(l0.names(), (std::vector<std::string>{"dense.bias", "dense.weight"}));
  Tensor t = l0.pp("dense").get("weight", {3, 4});
  EXPECT_EQ(t.dtype(), DType::F32);  // converted on get
  EXPECT_EQ(t.shape(), Shape({3, 4}));
  // Integer tensors keep their dtype.
  EXPECT_EQ(w.get("ids").dtype(), DType::U32);
  // No dtype: kept as stored.
  EXPECT_EQ(sample_weights(std::nullopt).get("encoder.layer.1.norm.weight").dtype(), DType::BF16);
  EXPECT_EQ(w.with_dtype(DType::F16).get("encoder.layer.1.norm.weight").dtype(), DType::F16);
}

TEST(NnWeights, ErrorsNameTheFullPathAndShapes) {
  nn::Weights l0 = sample_weights().pp("encoder").pp("layer").pp(0);
  std::string m = message_of([&] { l0.get("dense.weight", {4, 3}); });
  EXPECT_NE(m.find("encoder.layer.0.dense.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 3]"), std::string::npos) << m;
  EXPECT_THROW(l0.get("dense.weight", {4, 3}), ShapeMismatch);
  m = message_of([&] { l0.get("attention.weight", {3}); });
  EXPECT_NE(m.find("encoder.layer.0.attention.weight"), std::string::npos) << m;
  EXPECT_THROW(nn::Weights::from_map({{"x", Tensor()}}), Error);
}

TEST(NnLayers, LinearMatchesDefinitionForAnyLeadingDims) {
  nn::Weights w = sample_weights(DType::F64).pp("encoder.layer.0.dense");
  nn::Linear lin = nn::linear(w, 4, 3, true);
  for (Shape s : {Shape{4}, Shape{5, 4}, Shape{2, 5, 4}}) {
    for (bool transposed : {false, true}) {
      Tensor x = random_tensor(s, DType::F64);
      if (transposed && s.rank() == 3) x = random_tensor({5, 2, 4}, DType::F64).transpose(0, 1);
      Tensor y = lin.forward(x);
      std::vector<size_t> want = s.dims();
      want.back() = 3;
      ASSERT_EQ(y.shape(), Shape(want));
      Tensor x2 = x.reshape(Shape{x.elem_count() / 4, 4});
      Tensor ref = x2.matmul(lin.weight().t()).broadcast_add(*lin.bias()).reshape(Shape(want));
      EXPECT_TRUE(all_close(y.to_vec_f64(), ref.to_vec_f64(), 1e-12, 1e-12));
    }
  }
  EXPECT_THROW(lin.forward(random_tensor({2, 5}, DType::F64)), ShapeMismatch);
  EXPECT_THROW(nn::linear(w, 3, 4, true), ShapeMismatch);
}

TEST(NnLayers, FreshLayersFollowPytorchInit) {
  nn::Linear lin(100, 50, true);
  auto wv = lin.weight().to_vec_f64();
  double bound = 0.1, mx = 0;
  for (double v : wv) mx = std::max(mx, std::abs(v));
  EXPECT_LE(mx, bound);
  EXPECT_GT(mx, 0.9 * bound);
  EXPECT_EQ(lin.weight().shape(), Shape({50, 100}));
  EXPECT_EQ(lin.bias()->shape(), Shape({50}));
  nn::Embedding emb(1000, 8);
  auto ev = emb.table().to_vec_f64();
  double mean = 0, var = 0;
  for (double v : ev) mean += v / ev.size();
  for (double v : ev) var += (v - mean) * (v - mean) / ev.size();
  EXPECT_NEAR(mean, 0, 0.05);
  EXPECT_NEAR(var, 1, 0.1);
  nn::LayerNorm ln(8, 1e-5);
  EXPECT_EQ(ln.weight().to_vec1<float>(), std::vector<float>(8, 1.0f));
  EXPECT_EQ(ln.bias()->to_vec1<float>(), std::vector<float>(8, 0.0f));
}

TEST(NnLayers, TrainableLayersGetGradients) {
  nn::Linear lin = nn::Linear(4, 3, true).requires_grad();
  nn::RmsNorm norm = nn::RmsNorm(3, 1e-6).requires_grad();
  nn::Embedding emb = nn::Embedding(10, 4).requires_grad();
  for (const Tensor& p : lin.parameters()) EXPECT_TRUE(p.is_tracked());
  Tensor ids = Tensor::from_vec<uint32_t>({1, 7, 7}, {3}, cpu);
  Tensor loss = norm.forward(lin.forward(emb.forward(ids))).sqr().sum_all();
  GradStore g = loss.backward();
  for (const Tensor& p : lin.parameters()) EXPECT_TRUE(g.get(p).has_value());
  EXPECT_TRUE(g.get(norm.weight()).has_value());
  auto ge = g.get(emb.table())->to_vec2<float>();
  EXPECT_EQ(ge[0], std::vector<float>(4, 0.0f));  // row 0 unused
  EXPECT_NE(ge[7], std::vector<float>(4, 0.0f));
}

TEST(NnLayers, NormLayersFromWeights) {
  std::map<std::string, Tensor> m{{"ln.weight", random_tensor({6}, DType::F32)},
                                  {"ln.bias", random_tensor({6}, DType::F32)},
                                  {"rms.weight", random_tensor({6}, DType::F32)},
                                  {"emb.weight", random_tensor({5, 6}, DType::F32)}};
  nn::Weights w = nn::Weights::from_map(m);
  Tensor x = random_tensor({2, 6}, DType::F32);
  nn::LayerNorm ln = nn::layer_norm(w.pp("ln"), 6, 1e-5);
  EXPECT_TRUE(ln.bias().has_value());
  EXPECT_EQ(ln.forward(x).to_vec_f64(),
            x.layer_norm(m["ln.weight"], m["ln.bias"], 1e-5).to_vec_f64());
  nn::RmsNorm rms = nn::rms_norm(w.pp("rms"), 6, 1e-6);
  EXPECT_EQ(rms.forward(x).to_vec_f64(), x.rms_norm(m["rms.weight"], 1e-6).to_vec_f64());
  nn::Embedding emb = nn::embedding(w.pp("emb"), 5, 6);
  Tensor ids = Tensor::from_vec<int64_t>({4, 0}, {1, 2}, cpu);
  EXPECT_EQ(emb.forward(ids).shape(), Shape({1, 2, 6}));
  EXPECT_THROW(nn::embedding(w.pp("emb"), 6, 5), ShapeMismatch);
}

TEST(NnWeights, FromSafetensorsIsLazyPrefixedAndConverted) {
  std::string dir = ::testing::TempDir();
  std::string a = dir + "/nn_weights_a.safetensors", b = dir + "/nn_weights_b.safetensors";
  Tensor w = random_tensor({3, 4}, DType::BF16), bias = random_tensor({3}, DType::F32);
  safetensors::save({{"model.dense.weight", w}}, a);
  safetensors::save(
      {{"model.dense.bias", bias}, {"model.ids", Tensor::from_vec<int64_t>({7}, {1}, cpu)}}, b);
  nn::Weights ws = nn::Weights::from_safetensors({a, b}, DType::F32, cpu);
  EXPECT_EQ(ws.names(),
            (std::vector<std::string>{"model.dense.bias", "model.dense.weight", "model.ids"}));
  nn::Linear lin = nn::linear(ws.pp("model").pp("dense"), 4, 3, true);
  EXPECT_EQ(lin.weight().dtype(), DType::F32);
  EXPECT_EQ(lin.weight().to_vec_f64(), w.to_vec_f64());
  EXPECT_EQ(lin.bias()->to_vec_f64(), bias.to_vec_f64());
  EXPECT_EQ(ws.get("model.ids").dtype(), DType::I64);
  std::string m = message_of([&] { ws.pp("model").get("dense.weight", {4, 3}); });
  EXPECT_NE(m.find("model.dense.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
  // A name in two files is an error.
  EXPECT_THROW(nn::Weights::from_safetensors({a, a}, DType::F32, cpu), Error);
  EXPECT_THROW(nn::Weights::from_safetensors({dir + "/nn_missing.safetensors"}, DType::F32, cpu),
               Error);
}

}  // namespace
}  // namespace wick
