// GGUF on CUDA: every dequantisation kernel against the CPU's (which matches the gguf Python
// package bit for bit) and the staged upload of safetensors data from the file mapping.

#include <cstring>
#include <filesystem>

#include "../format_test_util.h"
#include "test_util.h"

namespace wick::testing {
namespace {

std::vector<uint32_t> bits_of(const Tensor& t) {
  auto v = t.flatten_all().to_vec1<float>();
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

std::string ref_file() {
  return std::string(WICK_FORMAT_DATA_DIR) + "/py_quant.gguf";
}

TEST(CudaDequant, EveryTypeMatchesTheCpuBitForBit) {
  WICK_REQUIRE_GPU();
  auto f = gguf::File::open(ref_file());
  for (const char* type : {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"}) {
    std::string name = std::string("q.") + type;
    Tensor gpu = f.get(name, Device::cuda(0));
    ASSERT_TRUE(gpu.device().is_cuda());
    ASSERT_EQ(gpu.dtype(), DType::F32);
    ASSERT_EQ(gpu.shape(), Shape({2, 512}));
    EXPECT_EQ(bits_of(gpu), bits_of(f.get(std::string("expected.") + type))) << type;
    QTensor q = f.get_quantized(name, Device::cuda(0));
    EXPECT_TRUE(q.device().is_cuda());
    EXPECT_EQ(bits_of(q.dequantize()), bits_of(f.get(name))) << type;
  }
  // F16 / BF16 through the kernels too (QTensor of plain types).
  for (const char* name : {"plain.f16", "plain.bf16"}) {
    QTensor q = f.get_quantized(name, Device::cuda(0));
    Tensor d = q.dequantize();
    for (size_t i = 0; i < 12; ++i) EXPECT_EQ(d.to_vec_f64()[i], i * 0.5 - 2) << name;
  }
}

// The types of scripts/make_quant_refs.py: Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS.
TEST(CudaDequant, MoreTypesMatchThePythonPackageBitForBit) {
  WICK_REQUIRE_GPU();
  auto f = gguf::File::open(std::string(WICK_FORMAT_DATA_DIR) + "/py_quant_more.gguf");
  for (const char* type : {"Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS"}) {
    SCOPED_TRACE(type);
    std::string name = std::string("q.") + type;
    Tensor gpu = f.get(name, Device::cuda(0));
    ASSERT_TRUE(gpu.device().is_cuda());
    ASSERT_EQ(gpu.shape(), Shape({2, 512}));
    EXPECT_EQ(bits_of(gpu), bits_of(f.get(std::string("expected.") + type)));
    QTensor q = f.get_quantized(name, Device::cuda(0));
    EXPECT_EQ(bits_of(q.dequantize()), bits_of(f.get(std::string("expected.") + type)));
  }
}

TEST(CudaDequant, LargeTensorUsesEveryBlock) {
  WICK_REQUIRE_GPU();
  // 4096 Q6_K blocks (1M values, > one grid-stride pass at small grids): CPU and GPU agree.
  auto f = gguf::File::open(ref_file());
  QTensor one = f.get_quantized("q.Q6_K");
  auto raw = one.data().to_vec1<uint8_t>();
  std::vector<uint8_t> big;
  for (int i = 0; i < 1024; ++i) big.insert(big.end(), raw.begin(), raw.end());
  QTensor cpu(GgmlType::Q6_K, Shape({2048, 512}),
              Tensor::from_vec(big, {big.size()}, Device::cpu()));
  EXPECT_EQ(bits_of(cpu.to_device(Device::cuda(0)).dequantize()), bits_of(cpu.dequantize()));
}

TEST(CudaSafetensors, StagedUploadFromTheMapping) {
  WICK_REQUIRE_GPU();
  TempDir dir;
  std::string path = dir.file("big.safetensors");
  // 40 MB: several 16 MB staging chunks plus a partial one; and a small tensor (direct upload).
  Tensor big = random_tensor({10 * 1024 * 1024 + 7}, DType::F32);
  Tensor small = random_tensor({3, 5}, DType::BF16);
  safetensors::save({{"big", big}, {"small", small}}, path);
  auto f = safetensors::File::open(path);
  Tensor g = f.get("big", Device::cuda(0));
  Tensor s = f.get("small", Device::cuda(0));
  EXPECT_TRUE(g.device().is_cuda());
  EXPECT_EQ(g.to_device(Device::cpu()).to_vec1<float>(), big.to_vec1<float>());
  EXPECT_EQ(s.to_vec_f64(), small.to_vec_f64());
  // Ops on the loaded tensor see the data (queue ordering with the staging stream).
  EXPECT_EQ(g.affine(2.0, 0.0).to_vec1<float>()[12345], 2.0f * big.to_vec1<float>()[12345]);
}

}  // namespace
}  // namespace wick::testing
