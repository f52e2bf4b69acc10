// CPU storage basics through the public API: read-back of every kind of view, strided copies,
// dtype conversions (all 49 pairs, with an independent f16/bf16 rounding oracle), fills and the
// random generators.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

#include "test_util.h"

namespace wick {
namespace {

using testing::random_values;
using testing::tensor_from;

const Device kCpu = Device::cpu();

// ---------------------------------------------------------------------------------------------
// Reference helpers

// The row-major elements of `layout` picked out of `base` (the storage's values) by index
// arithmetic on the layout's strides: an oracle independent of the backend's walkers.
std::vector<double> elements_of(const std::vector<double>& base, const Layout& layout) {
  std::vector<double> out;
  size_t n = layout.elem_count();
  std::vector<size_t> idx(layout.rank(), 0);
  for (size_t e = 0; e < n; ++e) {
    size_t off = layout.start_offset();
    for (size_t d = 0; d < layout.rank(); ++d) off += idx[d] * layout.strides()[d];
    out.push_back(base.at(off));
    for (size_t d = layout.rank(); d-- > 0;) {
      if (++idx[d] < layout.dims()[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Small integers for integer dtypes (exact in every dtype), random reals for floats.
std::vector<double> values_for(DType dtype, size_t n) {
  auto v = random_values(n, -4.0, 4.0);
  if (!is_float(dtype)) {
    for (auto& x : v) x = std::floor(std::abs(x) * 30);  // [0, 120): fits u8
  }
  return v;
}

// Decodes binary16 / bfloat16 bits by hand (no use of wick's conversions).
double decode_f16(uint16_t b) {
  int sign = b >> 15, exp = (b >> 10) & 0x1f, mant = b & 0x3ff;
  double v;
  if (exp == 0x1f) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

double decode_bf16(uint16_t b) {
  int sign = b >> 15, exp = (b >> 7) & 0xff, mant = b & 0x7f;
  double v;
  if (exp == 0xff) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(mant, -133);
  } else {
    v = std::ldexp(128 + mant, exp - 134);
  }
  return sign ? -v : v;
}

// Round-to-nearest-even oracle: the nearest of all finite values, ties to the even bit pattern,
// infinity from max + half an ulp on.
class HalfOracle {
 public:
  explicit HalfOracle(double (*decode)(uint16_t)) {
    for (uint32_t b = 0; b < 0x8000; ++b) {
      double v = decode(static_cast<uint16_t>(b));
      if (std::isfinite(v))
        values_.push_back({v, static_cast<uint16_t>(b)});
      else
        inf_bits_ = std::min<uint16_t>(inf_bits_, static_cast<uint16_t>(b));
    }
    double max = values_.back().first, prev = values_[values_.size() - 2].first;
    overflow_ = max + (max - prev) / 2;
  }
  uint16_t round(double d) const {
    uint16_t sign = std::signbit(d) ? 0x8000 : 0;
    double a = std::abs(d);
    if (a >= overflow_) return sign | inf_bits_;
    auto it = std::lower_bound(values_.begin(), values_.end(), a,
                               [](const auto& p, double x) { return p.first < x; });
    if (it == values_.end()) return sign | values_.back().second;  // between max and overflow
    if (it->first == a) return sign | it->second;
    auto lo = it - 1;  // lo->first < a < it->first
    double dl = a - lo->first, dh = it->first - a;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | it->second;
    return sign | ((lo->second & 1) ? it->second : lo->second);
  }

 private:
  std::vector<std::pair<double, uint16_t>> values_;
  uint16_t inf_bits_ = 0xffff;
  double overflow_;
};

const HalfOracle& f16_oracle() {
  static const HalfOracle o(decode_f16);
  return o;
}
const HalfOracle& bf16_oracle() {
  static const HalfOracle o(decode_bf16);
  return o;
}

// Calls f(T{}) with the element type of `dtype`.
template <class F>
decltype(auto) with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::U8:
      return f(uint8_t{});
    case DType::U32:
      return f(uint32_t{});
    case DType::I64:
      return f(int64_t{});
    case DType::BF16:
      return f(bf16{});
    case DType::F16:
      return f(f16{});
    case DType::F32:
      return f(float{});
    case DType::F64:
      return f(double{});
  }
  throw Error("bad dtype");
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

// Reads a tensor of rank 0-3 with the exact element type (copy_to_host on the view's layout).
std::vector<double> read_exact(const Tensor& t) {
  return with_type(t.dtype(), [&]<class T>(T) {
    std::vector<double> out;
    if (t.rank() == 0) {
      out.push_back(to_double(t.to_scalar<T>()));
    } else if (t.rank() == 1) {
      for (T x : t.to_vec1<T>()) out.push_back(to_double(x));
    } else if (t.rank() == 2) {
      for (auto& r : t.to_vec2<T>())
        for (T x : r) out.push_back(to_double(x));
    } else {
      for (auto& m : t.to_vec3<T>())
        for (auto& r : m)
          for (T x : r) out.push_back(to_double(x));
    }
    return out;
  });
}

// ---------------------------------------------------------------------------------------------
// Read-back of views (copy_to_host, to_dtype, copy_into)

struct ViewCase {
  const char* name;
  Shape base;
  Tensor (*view)(const Tensor&);
};

const std::vector<ViewCase>& view_cases() {
  static const std::vector<ViewCase> cases{
      {"contiguous", {3, 5}, [](const Tensor& t) { return t; }},
      {"transposed", {5, 7}, [](const Tensor& t) { return t.t(); }},
      {"narrowed", {6, 9}, [](const Tensor& t) { return t.narrow(1, 2, 5).narrow(0, 1, 4); }},
      {"offset_row", {4, 6}, [](const Tensor& t) { return t.get(2); }},
      {"strided_1d", {8, 3}, [](const Tensor& t) { return t.narrow(1, 1, 1).squeeze(1); }},
      {"broadcast",
       {1, 6},
       [](const Tensor& t) {
         return t.broadcast_as({4, 6});
       }},
      {"broadcast_col",
       {5, 1},
       [](const Tensor& t) {
         return t.broadcast_as({2, 5, 3});
       }},
      {"permuted",
       {3, 4, 5},
       [](const Tensor& t) {
         return t.permute({2, 0, 1});
       }},
      {"large_transposed", {301, 259}, [](const Tensor& t) { return t.t(); }},
      {"large_permuted_4d",
       {7, 33, 5, 41},
       [](const Tensor& t) {
         return t.permute({1, 3, 0, 2}).narrow(1, 3, 35);
       }},
      {"scalar", {}, [](const Tensor& t) { return t; }},
      {"empty", {0, 4}, [](const Tensor& t) { return t.t(); }},
  };
  return cases;
}

TEST(CpuReadBack, EveryViewEveryDType) {
  for (DType dt : testing::all_dtypes()) {
    for (const auto& c : view_cases()) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + c.name);
      auto base_vals = values_for(dt, c.base.elem_count());
      Tensor base = tensor_from(base_vals, c.base, dt);
      // The stored values after conversion to dt (exactly representable, by construction of
      // values_for for integers; for floats read back contiguously).
      std::vector<double> stored = base.to_vec_f64();
      Tensor v = c.view(base);
      std::vector<double> expected = elements_of(stored, v.layout());
      EXPECT_EQ(v.to_vec_f64(), expected);               // strided to_dtype
      EXPECT_EQ(v.contiguous().to_vec_f64(), expected);  // strided copy_into
      EXPECT_EQ(v.copy().to_vec_f64(), expected);
      if (v.rank() <= 3) {
        EXPECT_EQ(read_exact(v), expected);  // strided copy_to_host
      }
    }
  }
}

TEST(CpuReadBack, ContiguousBlocksAreBitExact) {
  // A large contiguous read (memcpy fast path, threaded) of a narrowed, offset block.
  auto vals = random_values(1000 * 700);
  Tensor base = Tensor::from_vec(vals, {1000, 700}, kCpu);
  Tensor block = base.narrow(0, 100, 800);
  std::vector<double> got = block.flatten_all().to_vec1<double>();
  ASSERT_EQ(got.size(), 800u * 700u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), vals.begin() + 100 * 700));
}

TEST(CpuCopyInto, AssignIntoStridedTargets) {
  for (DType dt : testing::all_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    // Target: columns 2..5 of a 6 x 8 tensor; then the transpose of a 7 x 6 tensor.
    auto target_vals = values_for(dt, 48);
    Tensor target = tensor_from(target_vals, {6, 8}, dt);
    auto src_vals = values_for(dt, 24);
    Tensor src = tensor_from(src_vals, {4, 6}, dt);
    std::vector<double> before = target.to_vec_f64(), srcv = src.to_vec_f64();
    target.narrow(1, 2, 4).assign(src.t());  // strided source, strided target
    std::vector<double> after = target.to_vec_f64();
    for (size_t i = 0; i < 6; ++i) {
      for (size_t j = 0; j < 8; ++j) {
        double want = (j >= 2 && j < 6) ? srcv[(j - 2) * 6 + i] : before[i * 8 + j];
        EXPECT_EQ(after[i * 8 + j], want) << i << "," << j;
      }
    }
    Tensor big = tensor_from(values_for(dt, 300 * 200), {300, 200}, dt);
    Tensor big_src = tensor_from(values_for(dt, 300 * 200), {200, 300}, dt);
    big.t().assign(big_src);  // transposed target, large enough for threads
    EXPECT_EQ(big.t().to_vec_f64(), big_src.to_vec_f64());
  }
}

TEST(CpuCopyInto, CatOfViews) {
  auto a_vals = random_values(12), b_vals = random_values(15);
  Tensor a = Tensor::from_vec(a_vals, {4, 3}, kCpu).to_dtype(DType::F32);
  Tensor b = Tensor::from_vec(b_vals, {3, 5}, kCpu).to_dtype(DType::F32).t();  // 5 x 3, strided
  Tensor c = Tensor::cat({a, b}, 0);
  std::vector<double> expected = a.to_vec_f64();
  for (double x : b.to_vec_f64()) expected.push_back(x);
  EXPECT_EQ(c.to_vec_f64(), expected);
}

// ---------------------------------------------------------------------------------------------
// Dtype conversions

// The exact value held by a tensor element: integers as int64 (u32 fits), floats as double.
struct Exact {
  bool is_int;
  int64_t i;
  double d;
};

std::vector<Exact> exact_values(const Tensor& t) {
  Tensor flat = t.flatten_all();
  return with_type(t.dtype(), [&]<class T>(T) {
    std::vector<Exact> out;
    for (T x : flat.to_vec1<T>()) {
      if constexpr (std::is_integral_v<T>) {
        out.push_back({true, static_cast<int64_t>(x), 0});
      } else {
        out.push_back({false, 0, to_double(x)});
      }
    }
    return out;
  });
}

// Reference conversion of one exact value to `to`, as bits in a uint64 (NaN canonicalised).
uint64_t convert_ref(const Exact& v, DType to) {
  double d = v.is_int ? static_cast<double>(v.i) : v.d;
  auto float_to_int = [&](double lo, double hi_excl, auto min, auto max) -> uint64_t {
    using I = decltype(min);
    if (std::isnan(d)) return 0;
    double t = std::trunc(d);
    if (t <= lo) return static_cast<uint64_t>(min);
    if (t >= hi_excl) return static_cast<uint64_t>(max);
    return static_cast<uint64_t>(static_cast<I>(t));
  };
  switch (to) {
    case DType::U8:
      if (v.is_int) return static_cast<uint8_t>(v.i);
      return float_to_int(0.0, 256.0, uint8_t{0}, uint8_t{255});
    case DType::U32:
      if (v.is_int) return static_cast<uint32_t>(v.i);
      return float_to_int(0.0, 4294967296.0, uint32_t{0}, uint32_t{4294967295u});
    case DType::I64:
      if (v.is_int) return static_cast<uint64_t>(v.i);
      return float_to_int(-9223372036854775808.0, 9223372036854775808.0,
                          std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    case DType::F16:
      if (std::isnan(d)) return 0x7e00;
      return f16_oracle().round(d);
    case DType::BF16:
      if (std::isnan(d)) return 0x7fc0;
      return bf16_oracle().round(d);
    case DType::F32: {
      if (std::isnan(d)) return 0x7fc00000;
      float f = v.is_int ? static_cast<float>(v.i) : static_cast<float>(d);
      return std::bit_cast<uint32_t>(f);
    }
    case DType::F64:
      if (std::isnan(d)) return 0x7ff8000000000000ull;
      return std::bit_cast<uint64_t>(d);
  }
  return 0;
}

// The bits of every element of `t` (NaN canonicalised like convert_ref).
std::vector<uint64_t> bits_of(const Tensor& t) {
  Tensor flat = t.flatten_all();
  return with_type(t.dtype(), [&]<class T>(T) {
    std::vector<uint64_t> out;
    for (T x : flat.to_vec1<T>()) {
      if constexpr (std::is_same_v<T, f16>) {
        out.push_back(std::isnan(static_cast<float>(x)) ? 0x7e00 : x.bits);
      } else if constexpr (std::is_same_v<T, bf16>) {
        out.push_back(std::isnan(static_cast<float>(x)) ? 0x7fc0 : x.bits);
      } else if constexpr (std::is_same_v<T, float>) {
        out.push_back(std::isnan(x) ? 0x7fc00000 : std::bit_cast<uint32_t>(x));
      } else if constexpr (std::is_same_v<T, double>) {
        out.push_back(std::isnan(x) ? 0x7ff8000000000000ull : std::bit_cast<uint64_t>(x));
      } else {
        out.push_back(static_cast<uint64_t>(x));
      }
    }
    return out;
  });
}

// Random values over many magnitudes plus the edge cases of every conversion.
std::vector<double> conversion_inputs() {
  std::vector<double> v = random_values(400, -300.0, 300.0);
  for (double x : random_values(200, -30.0, 30.0)) v.push_back(std::ldexp(1.0, int(x)) * x);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double x : {0.0,
                   -0.0,
                   0.5,
                   -0.5,
                   1.5,
                   2.5,
                   -2.5,
                   0.99999,
                   255.0,
                   255.5,
                   256.0,
                   300.7,
                   -1.0,
                   -200.9,
                   65504.0,
                   65519.99,
                   65520.0,
                   70000.0,
                   1e10,
                   -1e10,
                   4294967295.0,
                   4294967296.0,
                   9.2233720368547748e18,
                   1e19,
                   -1e19,
                   1e-8,
                   3e-5,
                   5.96e-8,
                   2.98e-8,
                   1.0 + std::ldexp(1.0, -11),
                   1.0 + std::ldexp(1.0, -8),
                   1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40),
                   1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40),
                   3.4e38,
                   3.4e39,
                   1e-40,
                   -1e-45,
                   inf,
                   -inf,
                   nan}) {
    v.push_back(x);
  }
  return v;
}

TEST(CpuToDType, All49PairsAgainstReference) {
  std::vector<double> inputs = conversion_inputs();
  const size_t n = inputs.size();
  Tensor f64 = Tensor::from_vec(inputs, {n}, kCpu);
  for (DType from : testing::all_dtypes()) {
    Tensor src = f64.to_dtype(from);
    {
      SCOPED_TRACE(std::string("f64 -> ") + dtype_name(from));
      std::vector<Exact> f64_exact = exact_values(f64);
      std::vector<uint64_t> want(n);
      for (size_t i = 0; i < n; ++i) want[i] = convert_ref(f64_exact[i], from);
      EXPECT_EQ(bits_of(src), want);
    }
    // Laid out 2-D and transposed so the strided path runs as well as the contiguous one.
    Tensor src2 = src.narrow(0, 0, n - n % 4).reshape({4, (n - n % 4) / 4}).t();
    for (const Tensor& s : {src, src2}) {
      std::vector<Exact> exact = exact_values(s);
      for (DType to : testing::all_dtypes()) {
        SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to) +
                     (s.is_contiguous() ? " contiguous" : " transposed"));
        Tensor out = s.to_dtype(to);
        ASSERT_EQ(out.dtype(), to);
        ASSERT_EQ(out.shape(), s.shape());
        std::vector<uint64_t> want(exact.size());
        for (size_t i = 0; i < exact.size(); ++i) want[i] = convert_ref(exact[i], to);
        std::vector<uint64_t> got = bits_of(out);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(got[i], want[i]) << "element " << i << " value "
                                     << (exact[i].is_int ? double(exact[i].i) : exact[i].d);
        }
      }
    }
  }
}

TEST(CpuToDType, KnownHalfBitPatterns) {
  struct Case {
    float value;
    uint16_t f16_bits, bf16_bits;
  };
  const float two_m11 = std::ldexp(1.0f, -11), two_m8 = std::ldexp(1.0f, -8);
  const std::vector<Case> cases{
      {1.0f, 0x3c00, 0x3f80},
      {-2.0f, 0xc000, 0xc000},
      {0.0f, 0x0000, 0x0000},
      {-0.0f, 0x8000, 0x8000},
      {65504.0f, 0x7bff, 0x4780},
      {65520.0f, 0x7c00, 0x4780},               // f16: the tie above max rounds to inf
      {1.0f + two_m11, 0x3c00, 0x3f80},         // f16 tie: to even (down)
      {1.0f + 3 * two_m11, 0x3c02, 0x3f80},     // f16 tie: to even (up)
      {1.0f + two_m8, 0x3c04, 0x3f80},          // bf16 tie: to even (down)
      {1.0f + 3 * two_m8, 0x3c0c, 0x3f82},      // bf16 tie: to even (up)
      {std::ldexp(1.0f, -24), 0x0001, 0x3380},  // smallest f16 subnormal
      {std::ldexp(1.0f, -25), 0x0000, 0x3300},  // f16 tie with 0: to even (0)
      {std::ldexp(3.0f, -25), 0x0002, 0x33c0},  // f16 tie between 1 and 2 ulp: to 2
      {std::numeric_limits<float>::infinity(), 0x7c00, 0x7f80},
      {-std::numeric_limits<float>::infinity(), 0xfc00, 0xff80},
      {3.0e38f, 0x7c00, 0x7f62},
  };
  std::vector<float> vals;
  for (const auto& c : cases) vals.push_back(c.value);
  Tensor t = Tensor::from_vec(vals, {vals.size()}, kCpu);
  std::vector<f16> h = t.to_dtype(DType::F16).to_vec1<f16>();
  std::vector<bf16> b = t.to_dtype(DType::BF16).to_vec1<bf16>();
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(h[i].bits, cases[i].f16_bits) << "f16 of " << cases[i].value;
    EXPECT_EQ(b[i].bits, cases[i].bf16_bits) << "bf16 of " << cases[i].value;
    EXPECT_EQ(h[i].bits, f16_oracle().round(cases[i].value));
    EXPECT_EQ(b[i].bits, bf16_oracle().round(cases[i].value));
  }
  // NaN stays NaN.
  Tensor nan = Tensor::from_vec(std::vector<float>{std::nanf("")}, {1}, kCpu);
  EXPECT_TRUE(std::isnan(static_cast<float>(nan.to_dtype(DType::F16).to_vec1<f16>()[0])));
  EXPECT_TRUE(std::isnan(static_cast<float>(nan.to_dtype(DType::BF16).to_vec1<bf16>()[0])));
}

TEST(CpuToDType, F64ToHalfRoundsOnce) {
  // Just above a tie: nearest-even through f32 would round down (double rounding); correct is up.
  std::vector<double> v{1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40),
                        1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)};
  Tensor t = Tensor::from_vec(v, {2}, kCpu);
  EXPECT_EQ(t.to_dtype(DType::F16).to_vec1<f16>()[0].bits, 0x3c01);
  EXPECT_EQ(t.to_dtype(DType::BF16).to_vec1<bf16>()[1].bits, 0x3f81);
}

TEST(CpuToDType, FloatToIntSaturatesAndNanIsZero) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v{-1.7, 1.7, 300.0, -inf, inf, std::nan(""), 4294967296.5, -3e19, 3e19};
  Tensor t = Tensor::from_vec(v, {v.size()}, kCpu);
  EXPECT_EQ(t.to_dtype(DType::U8).to_vec1<uint8_t>(),
            (std::vector<uint8_t>{0, 1, 255, 0, 255, 0, 255, 0, 255}));
  EXPECT_EQ(t.to_dtype(DType::U32).to_vec1<uint32_t>(),
            (std::vector<uint32_t>{0, 1, 300, 0, 4294967295u, 0, 4294967295u, 0, 4294967295u}));
  const int64_t mn = std::numeric_limits<int64_t>::min(), mx = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(t.to_dtype(DType::I64).to_vec1<int64_t>(),
            (std::vector<int64_t>{-1, 1, 300, mn, mx, 0, 4294967296, mn, mx}));
  // Integer to integer wraps modulo 2^bits.
  Tensor i = Tensor::from_vec(std::vector<int64_t>{-1, 256, 257, 4294967297}, {4}, kCpu);
  EXPECT_EQ(i.to_dtype(DType::U8).to_vec1<uint8_t>(), (std::vector<uint8_t>{255, 0, 1, 1}));
  EXPECT_EQ(i.to_dtype(DType::U32).to_vec1<uint32_t>(),
            (std::vector<uint32_t>{4294967295u, 256, 257, 1}));
}

TEST(CpuToDType, EmptyAndScalar) {
  for (DType from : testing::all_dtypes()) {
    for (DType to : testing::all_dtypes()) {
      Tensor e = Tensor::zeros({0, 3}, from, kCpu).to_dtype(to);
      EXPECT_EQ(e.shape(), Shape({0, 3}));
      EXPECT_EQ(e.dtype(), to);
      EXPECT_TRUE(e.to_vec_f64().empty());
      Tensor s = Tensor::full<double>(7.0, {}, kCpu).to_dtype(from).to_dtype(to);
      EXPECT_EQ(s.to_vec_f64(), std::vector<double>{7.0});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Fills and host copies

TEST(CpuDevice, FilledEveryDTypeLargeAndEmpty) {
  for (DType dt : testing::all_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    for (Shape s : {Shape{}, Shape{0}, Shape{7, 3}, Shape{512, 300}}) {
      std::vector<double> z = Tensor::zeros(s, dt, kCpu).to_vec_f64();
      std::vector<double> o = Tensor::ones(s, dt, kCpu).to_vec_f64();
      ASSERT_EQ(z.size(), s.elem_count());
      EXPECT_TRUE(std::all_of(z.begin(), z.end(), [](double x) { return x == 0.0; }));
      EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](double x) { return x == 1.0; }));
    }
  }
  std::vector<double> f = Tensor::full<int64_t>(-5, {1000, 100}, kCpu).to_vec_f64();
  EXPECT_TRUE(std::all_of(f.begin(), f.end(), [](double x) { return x == -5.0; }));
  std::vector<f16> h = Tensor::full(f16(0.3f), {70000}, kCpu).to_vec1<f16>();
  EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](f16 x) { return x.bits == f16(0.3f).bits; }));
}

TEST(CpuDevice, FromVecRoundTripsExactly) {
  std::vector<uint32_t> u{0, 1, 4294967295u, 123456789};
  EXPECT_EQ(Tensor::from_vec(u, {2, 2}, kCpu).flatten_all().to_vec1<uint32_t>(), u);
  std::vector<int64_t> i{std::numeric_limits<int64_t>::min(), -1, 0,
                         std::numeric_limits<int64_t>::max()};
  EXPECT_EQ(Tensor::from_vec(i, {4}, kCpu).to_vec1<int64_t>(), i);
  auto d = random_values(100000);
  EXPECT_EQ(Tensor::from_vec(d, {100000}, kCpu).to_vec1<double>(), d);
  EXPECT_TRUE(Tensor::from_vec(std::vector<float>{}, {0, 2}, kCpu).to_vec_f64().empty());
}

// ---------------------------------------------------------------------------------------------
// Random generators

// rand (normal = false, in [a, b)) or randn (normal = true, mean a, std b) of dtype dt.
Tensor random_of(DType dt, bool normal, double a, double b, const Shape& shape) {
  return with_type(dt, [&]<class T>(T) {
    return normal ? Tensor::randn<T>(T(a), T(b), shape, kCpu)
                  : Tensor::rand<T>(T(a), T(b), shape, kCpu);
  });
}

double mean_of(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
double var_of(const std::vector<double>& v) {
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / static_cast<double>(v.size());
}

TEST(CpuDevice, LargeBuffersFreedAndReusedAcrossThreads) {
  // Buffers of 1 MiB and more go through a cache of freed buffers by size class: results stay
  // right when sizes of one class (and others) come and go, from several threads at once.
  auto work = [](size_t seed) {
    for (size_t i = 0; i < 12; ++i) {
      size_t n = (size_t{1} << 18) + ((seed * 7 + i) % 5) * 20000;  // 1 MiB and up, in f32
      float v = static_cast<float>(seed + i);
      Tensor x = Tensor::full(v, {n}, kCpu);
      Tensor y = x + x;
      std::vector<float> got = y.to_vec1<float>();
      for (size_t j = 0; j < n; j += 4097) {
        if (got[j] != 2 * v) return false;
      }
      if (got.back() != 2 * v) return false;
    }
    return true;
  };
  std::vector<std::thread> threads;
  std::vector<char> ok(4, 0);
  for (size_t t = 0; t < ok.size(); ++t) threads.emplace_back([&, t] { ok[t] = work(t); });
  for (auto& t : threads) t.join();
  for (size_t t = 0; t < ok.size(); ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

TEST(CpuRandom, UniformStatisticsEveryFloatDType) {
  kCpu.set_seed(7);
  for (DType dt : testing::float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    const double lo = -1.5, hi = 2.5;
    Tensor t = random_of(dt, false, lo, hi, {400, 500});
    ASSERT_EQ(t.dtype(), dt);
    std::vector<double> v = t.to_vec_f64();
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [&](double x) { return x >= lo && x < hi; }));
    // Mean (hi + lo) / 2, variance (hi - lo)^2 / 12; 200k samples: errors ~0.003 and ~0.003.
    EXPECT_NEAR(mean_of(v), 0.5, 0.02);
    EXPECT_NEAR(var_of(v), 16.0 / 12.0, 0.03);
    // Every part of the range is reached: 8 buckets each near 1/8.
    std::vector<size_t> buckets(8, 0);
    for (double x : v) buckets[std::min<size_t>(7, static_cast<size_t>((x - lo) / 0.5))]++;
    for (size_t b : buckets) EXPECT_NEAR(double(b) / double(v.size()), 0.125, 0.01);
  }
}

TEST(CpuRandom, NormalStatisticsEveryFloatDType) {
  kCpu.set_seed(11);
  for (DType dt : testing::float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor t = random_of(dt, true, 3.0, 0.5, {300, 401});
    ASSERT_EQ(t.dtype(), dt);
    std::vector<double> v = t.to_vec_f64();
    EXPECT_NEAR(mean_of(v), 3.0, 0.01);
    EXPECT_NEAR(std::sqrt(var_of(v)), 0.5, 0.01);
    // About 68.3% within one std, 95.4% within two.
    double in1 = 0, in2 = 0;
    for (double x : v) {
      in1 += std::abs(x - 3.0) < 0.5;
      in2 += std::abs(x - 3.0) < 1.0;
    }
    if (dt != DType::BF16) {  // bf16 spacing at 3.5 is 1/64: the +-1 std edges are coarse
      EXPECT_NEAR(in1 / double(v.size()), 0.6827, 0.01);
      EXPECT_NEAR(in2 / double(v.size()), 0.9545, 0.01);
    }
  }
}

TEST(CpuRandom, SeedingIsReproducible) {
  for (DType dt : testing::float_dtypes()) {
    for (bool normal : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (normal ? " randn" : " rand"));
      // 210k elements: several generator blocks, filled by several threads.
      auto draw = [&] { return random_of(dt, normal, 0.0, 1.0, {70000, 3}).to_vec_f64(); };
      kCpu.set_seed(1234);
      auto a = draw();
      auto a2 = draw();
      kCpu.set_seed(1234);
      auto b = draw();
      kCpu.set_seed(1235);
      auto c = draw();
      EXPECT_EQ(a, b);   // same seed, same numbers
      EXPECT_NE(a, a2);  // the generator advances
      EXPECT_NE(a, c);   // another seed, other numbers
    }
  }
}

TEST(CpuRandom, EdgeCasesAndErrors) {
  EXPECT_TRUE(Tensor::rand<float>(0.0f, 1.0f, {0, 5}, kCpu).to_vec_f64().empty());
  EXPECT_TRUE(Tensor::randn<double>(0.0, 1.0, {5, 0}, kCpu).to_vec_f64().empty());
  std::vector<double> same = Tensor::rand<double>(2.0, 2.0, {10}, kCpu).to_vec_f64();
  EXPECT_TRUE(std::all_of(same.begin(), same.end(), [](double x) { return x == 2.0; }));
  std::vector<double> zero_std = Tensor::randn<float>(4.0f, 0.0f, {10}, kCpu).to_vec_f64();
  EXPECT_TRUE(std::all_of(zero_std.begin(), zero_std.end(), [](double x) { return x == 4.0; }));
  // A range narrower than bf16's spacing still stays inside [lo, hi).
  std::vector<double> narrow =
      Tensor::rand(bf16(1.0f), bf16(1.0078125f), {1000}, kCpu).to_vec_f64();
  EXPECT_TRUE(std::all_of(narrow.begin(), narrow.end(), [](double x) { return x == 1.0; }));
  EXPECT_THROW(Tensor::rand<uint8_t>(0, 1, {3}, kCpu), UnsupportedDType);
  EXPECT_THROW(Tensor::randn<int64_t>(0, 1, {3}, kCpu), UnsupportedDType);
  EXPECT_THROW(Tensor::rand<uint32_t>(0, 1, {3}, kCpu), UnsupportedDType);
  EXPECT_THROW(Tensor::rand<double>(1.0, 0.0, {3}, kCpu), Error);
  EXPECT_THROW(Tensor::randn<double>(0.0, -1.0, {3}, kCpu), Error);
}

}  // namespace
}  // namespace wick
