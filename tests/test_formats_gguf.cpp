// GGUF: metadata of every value type, tensors of every dequantisable type checked bit for bit
// against the gguf Python package's dequantisers (committed reference file), round trips, and
// one test per malformed-input class.

#include <cmath>

#include "format_test_util.h"
#include "test_util.h"

namespace wick::testing {
namespace {

using gguf::Value;
using gguf::ValueType;

const char* kQuantTypes[] = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"};

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

TEST(Gguf, ReadsPythonMetadataOfEveryType) {
  auto f = gguf::File::open(data_dir() + "/py_quant.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.value("test.u8").type(), ValueType::U8);
  EXPECT_EQ(f.get_uint("test.u8"), 200u);
  EXPECT_EQ(f.get_int("test.i8"), -100);
  EXPECT_EQ(f.get_uint("test.u16"), 60000u);
  EXPECT_EQ(f.get_int("test.i16"), -30000);
  EXPECT_EQ(f.get_uint("test.u32"), 4000000000u);
  EXPECT_EQ(f.get_int("test.i32"), -2000000000);
  EXPECT_EQ(f.value("test.f32").type(), ValueType::F32);
  EXPECT_EQ(f.get_float("test.f32"), 1.5);
  EXPECT_EQ(f.get_uint("test.u64"), (uint64_t{1} << 63) + 5);
  EXPECT_THROW(f.get_int("test.u64"), Error);  // does not fit int64
  EXPECT_EQ(f.get_int("test.i64"), -(int64_t{1} << 62));
  EXPECT_EQ(f.get_float("test.f64"), -0.125);
  EXPECT_TRUE(f.get_bool("test.bool"));
  EXPECT_EQ(f.get_string("test.string"), "h\xc3\xa9llo wick");
  EXPECT_EQ(f.get_string_array("test.strings"),
            (std::vector<std::string>{"a", "bc", "", "\xc3\xbc"}));
  EXPECT_EQ(f.get_int_array("test.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get_float_array("test.floats"), (std::vector<double>{0.5, -1.25}));
  const auto& nested = f.value("test.nested").as_array();
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested[0].as_int_array(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(nested[1].as_int_array(), (std::vector<int64_t>{3}));
  EXPECT_EQ(f.get_int("llama.context_length"), 4096);
  // Wrong type or missing key: an error naming the file and the key.
  EXPECT_THROWS_NAMING(f.get_string("test.u8"), Error, "py_quant.gguf", "test.u8");
  EXPECT_THROWS_NAMING(f.get_int("no.such.key"), Error, "py_quant.gguf", "no.such.key");
}

TEST(Gguf, ReadsVersion2) {
  // Version 2 has the layout of version 3 (64-bit counts); only the number differs.
  auto bytes = read_file(data_dir() + "/py_quant.gguf");
  bytes[4] = 2;
  auto f = gguf::File::from_bytes(bytes, "v2.gguf");
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get_int("llama.context_length"), 4096);
  EXPECT_EQ(f.get("plain.f32").to_vec_f64()[3], -0.5);
}

TEST(Gguf, PlainTensorsFromPython) {
  auto f = gguf::File::open(data_dir() + "/py_quant.gguf");
  for (const char* name : {"plain.f32", "plain.f16", "plain.bf16"}) {
    Tensor t = f.get(name);
    ASSERT_EQ(t.shape(), Shape({3, 4})) << name;
    for (size_t i = 0; i < 12; ++i) EXPECT_EQ(t.to_vec_f64()[i], i * 0.5 - 2) << name;
  }
  EXPECT_EQ(f.get("plain.f16").dtype(), DType::F16);
  EXPECT_EQ(f.get("plain.bf16").dtype(), DType::BF16);
  EXPECT_EQ(f.info("plain.f32").type, GgmlType::F32);
}

// q.<type> holds random blocks (every bit pattern, finite scales); expected.<type> is what
// gguf.quants.dequantize made of them. wick's CPU dequantisation must match bit for bit.
TEST(Gguf, DequantisationMatchesThePythonPackageBitForBit) {
  auto f = gguf::File::open(data_dir() + "/py_quant.gguf");
  for (const char* type : kQuantTypes) {
    std::string q = std::string("q.") + type, e = std::string("expected.") + type;
    ASSERT_TRUE(f.contains(q)) << q;
    Tensor got = f.get(q);
    ASSERT_EQ(got.dtype(), DType::F32) << type;
    ASSERT_EQ(got.shape(), Shape({2, 512})) << type;
    auto g = got.flatten_all().to_vec1<float>();
    auto w = f.get(e).flatten_all().to_vec1<float>();
    EXPECT_EQ(bits_of(g), bits_of(w)) << type;
    double norm = 0;
    for (float x : w) norm += std::abs(x);
    EXPECT_GT(norm, 0.0) << type;  // the reference is not all zeros
    QTensor qt = f.get_quantized(q);
    EXPECT_EQ(ggml_type_name(qt.type()), [&] {
      std::string s = type;
      for (auto& c : s) c = static_cast<char>(std::tolower(c));
      return s;
    }());
    EXPECT_EQ(qt.shape(), Shape({2, 512}));
    EXPECT_EQ(qt.data().dtype(), DType::U8);
    EXPECT_EQ(bits_of(qt.dequantize().flatten_all().to_vec1<float>()), bits_of(w)) << type;
  }
}

// The same for the types read since (scripts/make_quant_refs.py): Q5_1, Q2_K, Q3_K, Q5_K,
// IQ4_NL, IQ4_XS.
TEST(Gguf, MoreTypesMatchThePythonPackageBitForBit) {
  auto f = gguf::File::open(data_dir() + "/py_quant_more.gguf");
  for (const char* type : {"Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS"}) {
    SCOPED_TRACE(type);
    std::string q = std::string("q.") + type;
    ASSERT_TRUE(f.contains(q));
    auto w = f.get(std::string("expected.") + type).flatten_all().to_vec1<float>();
    double norm = 0;
    for (float x : w) norm += std::abs(x);
    EXPECT_GT(norm, 0.0);  // the reference is not all zeros
    Tensor got = f.get(q);
    ASSERT_EQ(got.shape(), Shape({2, 512}));
    EXPECT_EQ(bits_of(got.flatten_all().to_vec1<float>()), bits_of(w));
    QTensor qt = f.get_quantized(q);
    EXPECT_TRUE(ggml_can_dequantize(qt.type()));
    EXPECT_EQ(bits_of(qt.dequantize().flatten_all().to_vec1<float>()), bits_of(w));
  }
}

TEST(Gguf, HandMadeQ4_0Block) {
  // d = 0.5 (f16 0x3800); nibbles: byte j = (j << 4) | j for j < 16 -> values j - 8 twice.
  std::vector<uint8_t> block = {0x00, 0x38};
  for (int j = 0; j < 16; ++j) block.push_back(static_cast<uint8_t>((j << 4) | j));
  QTensor q(GgmlType::Q4_0, Shape({32}), Tensor::from_vec(block, {18}, Device::cpu()));
  auto v = q.dequantize().to_vec1<float>();
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v[j], 0.5f * (j - 8));
    EXPECT_EQ(v[j + 16], 0.5f * (j - 8));
  }
  EXPECT_THROW(QTensor(GgmlType::Q4_0, Shape({32}),
                       Tensor::from_vec(block, {18}, Device::cpu()).narrow(0, 0, 17)),
               ShapeMismatch);
  EXPECT_THROW(QTensor(GgmlType::Q4_0, Shape({31}), Tensor::from_vec(block, {18}, Device::cpu())),
               ShapeMismatch);
}

std::map<std::string, Value> every_value_type() {
  return {
      {"general.architecture", Value::string("llama")},
      {"t.u8", Value::u64(255, ValueType::U8)},
      {"t.i8", Value::i64(-128, ValueType::I8)},
      {"t.u16", Value::u64(65535, ValueType::U16)},
      {"t.i16", Value::i64(-32768, ValueType::I16)},
      {"t.u32", Value::u64(4294967295u, ValueType::U32)},
      {"t.i32", Value::i64(-2147483647 - 1, ValueType::I32)},
      {"t.u64", Value::u64(~uint64_t{0})},
      {"t.i64", Value::i64(INT64_MIN)},
      {"t.f32", Value::f64(0.1f, ValueType::F32)},
      {"t.f64", Value::f64(0.1)},
      {"t.bool", Value::boolean(false)},
      {"t.str", Value::string(std::string("a\0b", 3))},
      {"t.strs", Value::array(ValueType::String, {Value::string("x"), Value::string("")})},
      {"t.empty", Value::array(ValueType::I32, {})},
      {"t.nested", Value::array(ValueType::Array,
                                {Value::array(ValueType::F32, {Value::f64(1.5, ValueType::F32)})})},
  };
}

TEST(Gguf, RoundTripMetadataAndTensors) {
  TempDir dir;
  std::map<std::string, Tensor> tensors = {
      {"a.f32", random_tensor({3, 5}, DType::F32).t()},
      {"b.f16", random_tensor({2, 3, 4}, DType::F16)},
      {"c.bf16", random_tensor({7}, DType::BF16)},
      {"d.f64", random_tensor({2, 2}, DType::F64)},
      {"e.i64", random_tensor({4}, DType::I64)},
  };
  auto src = gguf::File::open(data_dir() + "/py_quant.gguf");
  std::map<std::string, QTensor> quantized = {{"q.Q4_K", src.get_quantized("q.Q4_K")},
                                              {"q.Q8_0", src.get_quantized("q.Q8_0")}};
  auto md = every_value_type();
  for (size_t alignment : {size_t{32}, size_t{64}}) {
    std::string path = dir.file(str_of("rt", alignment, ".gguf"));
    gguf::save(tensors, path, md, quantized, alignment);
    auto f = gguf::File::open(path);
    EXPECT_EQ(f.alignment(), alignment);
    for (const auto& [k, v] : md) {
      ASSERT_TRUE(f.contains_key(k)) << k;
      EXPECT_EQ(f.value(k).type(), v.type()) << k;
      EXPECT_EQ(f.value(k).to_string(), v.to_string()) << k;
    }
    EXPECT_EQ(f.get_string("t.str"), std::string("a\0b", 3));
    EXPECT_EQ(f.get_float("t.f32"), static_cast<double>(0.1f));
    EXPECT_EQ(f.get_uint("t.u64"), ~uint64_t{0});
    EXPECT_EQ(f.get_int("t.i64"), INT64_MIN);
    EXPECT_EQ(f.value("t.nested").as_array()[0].as_float_array(), (std::vector<double>{1.5}));
    EXPECT_EQ(f.value("t.empty").elem_type(), ValueType::I32);
    for (const auto& [name, t] : tensors) {
      Tensor g = f.get(name);
      ASSERT_EQ(g.dtype(), t.dtype()) << name;
      ASSERT_EQ(g.shape(), t.shape()) << name;
      EXPECT_EQ(g.to_vec_f64(), t.to_vec_f64()) << name;
    }
    for (const auto& [name, q] : quantized) {
      EXPECT_EQ(f.info(name).type, q.type());
      EXPECT_EQ(f.get_quantized(name).data().to_vec1<uint8_t>(), q.data().to_vec1<uint8_t>())
          << name;
    }
  }
  EXPECT_THROW(gguf::save({{"u", random_tensor({2}, DType::U32)}}, dir.file("u.gguf")),
               UnsupportedDType);
}

TEST(Gguf, CpuGetViewsTheMapping) {
  auto f = gguf::File::open(data_dir() + "/py_quant.gguf");
  reset_format_load_stats();
  Tensor t = f.get("plain.f32");
  EXPECT_EQ(format_load_stats().bytes_viewed, 48u);
  EXPECT_EQ(format_load_stats().bytes_copied, 0u);
}

// ---- malformed inputs ----

// A GGUF file built field by field.
struct Builder {
  std::vector<uint8_t> b;
  Builder& u32(uint32_t v) {
    append_le(b, v, 4);
    return *this;
  }
  Builder& u64(uint64_t v) {
    append_le(b, v, 8);
    return *this;
  }
  Builder& s(const std::string& v) {
    u64(v.size());
    append_str(b, v);
    return *this;
  }
  Builder& header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    return u32(0x46554747u).u32(version).u64(tensors).u64(kvs);
  }
  // A tensor info: name, dims (ne order), type, offset.
  Builder& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                  uint64_t offset) {
    s(name).u32(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Builder& pad_to(size_t alignment) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
  Builder& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

const char* kName = "bad.gguf";

void expect_format_error(const std::vector<uint8_t>& bytes, const std::string& part) {
  EXPECT_THROWS_NAMING(gguf::File::from_bytes(bytes, kName), FormatError, kName, part);
}

TEST(GgufMalformed, BadMagicOrVersion) {
  expect_format_error({'G', 'G', 'U', 'X', 3, 0, 0, 0}, "magic");
  expect_format_error(Builder().header(0, 0, 1).b, "version 1");
  expect_format_error({'G', 'G'}, "truncated");
}

TEST(GgufMalformed, CountsThatWouldOverflow) {
  expect_format_error(Builder().header(0, ~uint64_t{0}).b, "metadata count");
  expect_format_error(Builder().header(uint64_t{1} << 62, 0).b, "tensor count");
  // An array claiming 2^60 u64 elements.
  expect_format_error(Builder().header(0, 1).s("k").u32(9).u32(10).u64(uint64_t{1} << 60).b,
                      "array count");
  // A string longer than the file.
  expect_format_error(Builder().header(0, 1).s("k").u32(8).u64(~uint64_t{0}).b, "truncated");
  // Dims whose product overflows.
  expect_format_error(
      Builder().header(1, 0).tensor("t", {uint64_t{1} << 33, uint64_t{1} << 33}, 0, 0).pad_to(32).b,
      "overflow");
}

TEST(GgufMalformed, TruncatedAnywhere) {
  TempDir dir;
  gguf::save({{"w", random_tensor({64}, DType::F32)}}, dir.file("t.gguf"), every_value_type());
  auto full = read_file(dir.file("t.gguf"));
  // Every cut point inside the header and tensor infos, and one in the data.
  size_t checked = 0;
  for (size_t cut = 0; cut < full.size(); cut += (cut < 600 ? 1 : 97)) {
    std::vector<uint8_t> part(full.begin(), full.begin() + cut);
    try {
      gguf::File::from_bytes(part, kName);
      ADD_FAILURE() << "cut at " << cut << " loaded";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(kName), std::string::npos) << e.what();
      ++checked;
    }
  }
  EXPECT_GT(checked, 500u);
}

TEST(GgufMalformed, DuplicateKeysAndNames) {
  expect_format_error(Builder().header(0, 2).s("k").u32(4).u32(1).s("k").u32(4).u32(2).b,
                      "'k' appears twice");
  expect_format_error(
      Builder().header(2, 0).tensor("t", {4}, 0, 0).tensor("t", {4}, 0, 32).pad_to(32).zeros(64).b,
      "'t' appears twice");
}

TEST(GgufMalformed, UnknownTypes) {
  expect_format_error(Builder().header(0, 1).s("k").u32(13).u32(0).b, "unknown value type 13");
  expect_format_error(Builder().header(1, 0).tensor("t", {4}, 99, 0).pad_to(32).zeros(32).b,
                      "unknown GGML type 99");
  expect_format_error(Builder().header(0, 1).s("k").u32(7).u32(5).b, "neither 0 nor 1");
}

TEST(GgufMalformed, BadTensorInfos) {
  expect_format_error(
      Builder().header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).pad_to(32).zeros(4).b, "5 dims");
  expect_format_error(Builder().header(1, 0).tensor("q", {33}, 2, 0).pad_to(32).zeros(64).b,
                      "whole number of 32-value blocks");
  expect_format_error(Builder().header(1, 0).tensor("t", {4}, 0, 8).pad_to(32).zeros(64).b,
                      "not a multiple of the alignment");
  expect_format_error(Builder().header(1, 0).tensor("t", {64}, 0, 0).pad_to(32).zeros(100).b,
                      "past the end");
  expect_format_error(Builder()
                          .header(2, 0)
                          .tensor("a", {16}, 0, 0)
                          .tensor("b", {16}, 0, 32)
                          .pad_to(32)
                          .zeros(96)
                          .b,
                      "overlaps");
}

TEST(GgufMalformed, BadAlignment) {
  expect_format_error(Builder().header(0, 1).s("general.alignment").u32(4).u32(48).b,
                      "not a power of two");
  expect_format_error(Builder().header(0, 1).s("general.alignment").u32(8).s("x").b,
                      "not a power of two");
}

TEST(GgufMalformed, NestedTooDeep) {
  Builder b;
  b.header(0, 1).s("k").u32(9);
  for (int i = 0; i < 20; ++i) b.u32(9).u64(1);
  expect_format_error(b.b, "nested");
}

TEST(GgufMalformed, UnsupportedTypeNamesTheTensor) {
  // An iq2_xxs tensor (type 16, 66-byte blocks of 256): valid file, but wick does not
  // dequantise iq2_xxs.
  auto f = gguf::File::from_bytes(
      Builder().header(1, 0).tensor("w", {256}, 16, 0).pad_to(32).zeros(66).b, kName);
  EXPECT_THROWS_NAMING(f.get("w"), UnsupportedDType, kName, "'w'");
  EXPECT_EQ(f.get_quantized("w").data().elem_count(), 66u);  // the raw blocks are still there
}

}  // namespace
}  // namespace wick::testing
