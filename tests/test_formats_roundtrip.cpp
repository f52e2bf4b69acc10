// The C++ half of the Python round trip (scripts/make_format_refs.py, run by .ci/run): with
// WICK_FORMAT_ROUNDTRIP_DIR set, reads every py_rt* file Python wrote there and writes it back
// with wick as wick_rt*, which Python then compares byte for byte. Skipped without the variable.

#include <cstdlib>

#include "format_test_util.h"
#include "test_util.h"

namespace wick::testing {
namespace {

TEST(FormatsRoundTrip, RewritePythonFiles) {
  const char* env = std::getenv("WICK_FORMAT_ROUNDTRIP_DIR");
  if (env == nullptr || *env == '\0') {
    GTEST_SKIP()
        << "WICK_FORMAT_ROUNDTRIP_DIR not set (run scripts/make_format_refs.py roundtrip-make)";
  }
  std::string dir = env;
  // safetensors: every tensor and the metadata; a copy without bf16 for safetensors.numpy.
  auto st = safetensors::File::open(dir + "/py_rt.safetensors");
  auto tensors = st.load_all();
  ASSERT_EQ(tensors.size(), 7u);
  safetensors::save(tensors, dir + "/wick_rt.safetensors", st.metadata());
  tensors.erase("bf16");
  safetensors::save(tensors, dir + "/wick_rt_nobf16.safetensors", st.metadata());
  // npy / npz.
  for (const char* dt : {"u8", "u32", "i64", "f16", "f32", "f64"}) {
    npy::save(npy::load(dir + "/py_rt_" + dt + ".npy"), dir + "/wick_rt_" + dt + ".npy");
  }
  npz::save(npz::load(dir + "/py_rt_stored.npz"), dir + "/wick_rt_stored.npz", false);
  npz::save(npz::load(dir + "/py_rt_deflated.npz"), dir + "/wick_rt_deflated.npz", true);
  // gguf: metadata as read, plain tensors as tensors, quantized ones as raw blocks.
  auto g = gguf::File::open(dir + "/py_rt.gguf");
  std::map<std::string, Tensor> plain;
  std::map<std::string, QTensor> quantized;
  for (const auto& name : g.tensor_names()) {
    GgmlType t = g.info(name).type;
    if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
      plain[name] = g.get(name);
    } else {
      quantized[name] = g.get_quantized(name);
    }
  }
  EXPECT_EQ(quantized.size(), 6u);
  gguf::save(plain, dir + "/wick_rt.gguf", g.metadata(), quantized, g.alignment());
}

}  // namespace
}  // namespace wick::testing
