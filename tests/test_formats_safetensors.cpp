// safetensors: round trips for every dtype and layout, views of the mapping, atomic saves,
// sharded checkpoints, files written by Python, and one test per malformed-input class.

#include <filesystem>

#include "format_test_util.h"
#include "test_util.h"

namespace wick::testing {
namespace {

constexpr DType kAllDTypes[] = {DType::U8,  DType::U32, DType::I64, DType::BF16,
                                DType::F16, DType::F32, DType::F64};

// A safetensors file from a header text and data bytes.
std::vector<uint8_t> st_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  append_le(out, header.size(), 8);
  append_str(out, header);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(a.to_vec_f64(), b.to_vec_f64()) << what;
}

TEST(Safetensors, RoundTripEveryDTypeAndLayout) {
  TempDir dir;
  std::map<std::string, Tensor> tensors;
  for (DType dt : kAllDTypes) {
    tensors[std::string("c_") + dtype_name(dt)] = random_tensor({3, 5, 2}, dt);
    tensors[std::string("t_") + dtype_name(dt)] = random_tensor({4, 3}, dt).t();
    tensors[std::string("n_") + dtype_name(dt)] = random_tensor({6, 7}, dt).narrow(1, 2, 3);
  }
  tensors["scalar"] = Tensor::scalar<float>(2.5f, Device::cpu());
  tensors["empty"] = Tensor::zeros({0, 4}, DType::F32, Device::cpu());
  std::string path = dir.file("m.safetensors");
  safetensors::save(tensors, path, {{"format", "pt"}, {"note", "wick"}});
  auto file = safetensors::File::open(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    EXPECT_EQ(file.info(name).dtype, t.dtype()) << name;
    EXPECT_EQ(file.info(name).shape, t.shape()) << name;
    expect_same(file.get(name), t, name);
  }
  auto all = safetensors::load(path);
  EXPECT_EQ(all.size(), tensors.size());
  for (const auto& [name, t] : tensors) expect_same(all.at(name), t, name);
  // No temporary file is left behind.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
}

TEST(Safetensors, CpuGetViewsTheMappingAndOutlivesTheFile) {
  TempDir dir;
  std::string path = dir.file("v.safetensors");
  Tensor w = random_tensor({64, 32}, DType::F32);
  safetensors::save({{"w", w}, {"b", random_tensor({3}, DType::BF16)}}, path);
  reset_format_load_stats();
  Tensor got;
  {
    auto file = safetensors::File::open(path);
    got = file.get("w");
  }
  EXPECT_EQ(format_load_stats().bytes_viewed, 64u * 32u * 4u);
  EXPECT_EQ(format_load_stats().bytes_copied, 0u);
  expect_same(got, w, "w after the File is gone");
  // Writing to the view (copy-on-write) leaves the file as it was.
  Tensor doubled = got.affine(2.0, 0.0);
  EXPECT_EQ(doubled.to_vec_f64()[5], 2.0 * w.to_vec_f64()[5]);
  expect_same(safetensors::load(path).at("w"), w, "file unchanged");
}

TEST(Safetensors, UnalignedDataIsCopied) {
  TempDir dir;
  // Header of odd length: the f32 data starts at an odd address.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  if (header.size() % 2 == 0) header += " ";
  std::vector<uint8_t> data;
  float v[2] = {1.5f, -3.25f};
  data.resize(8);
  std::memcpy(data.data(), v, 8);
  std::string path = dir.file("u.safetensors");
  write_file(path, st_file(header, data));
  reset_format_load_stats();
  Tensor x = safetensors::File::open(path).get("x");
  EXPECT_EQ(format_load_stats().bytes_copied, 8u);
  EXPECT_EQ(x.to_vec1<float>(), (std::vector<float>{1.5f, -3.25f}));
}

TEST(Safetensors, BoolReadsAsU8) {
  std::string header = R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})";
  auto f = safetensors::File::from_bytes(st_file(header, {1, 0, 1}), "b.safetensors");
  EXPECT_EQ(f.get("m").to_vec1<uint8_t>(), (std::vector<uint8_t>{1, 0, 1}));
}

TEST(Safetensors, SaveIsAtomic) {
  TempDir dir;
  std::string path = dir.file("a.safetensors");
  Tensor w = random_tensor({4}, DType::F32);
  safetensors::save({{"w", w}}, path);
  auto before = read_file(path);
  // A failing save (an empty handle) leaves the old file whole and no temporary behind.
  EXPECT_THROW(safetensors::save({{"a", w}, {"z", Tensor()}}, path), Error);
  EXPECT_EQ(read_file(path), before);
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  // Saving over an open, mapped file keeps the old mapping valid.
  auto old = safetensors::File::open(path);
  Tensor view = old.get("w");
  safetensors::save({{"w", random_tensor({4}, DType::F32)}}, path);
  expect_same(view, w, "old mapping after overwrite");
}

TEST(Safetensors, ShardedIndex) {
  TempDir dir;
  Tensor a = random_tensor({2, 3}, DType::F32), b = random_tensor({5}, DType::F16);
  safetensors::save({{"a", a}}, dir.file("model-00001-of-00002.safetensors"));
  safetensors::save({{"b", b}}, dir.file("model-00002-of-00002.safetensors"));
  std::string index = dir.file("model.safetensors.index.json");
  std::string text =
      R"({"metadata":{"total_size":34},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})";
  write_file(index, std::vector<uint8_t>(text.begin(), text.end()));
  auto ck = safetensors::ShardedFile::open(index);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ck.shards().size(), 2u);
  EXPECT_EQ(ck.metadata().at("total_size"), "34");
  expect_same(ck.get("a"), a, "a");
  expect_same(ck.get("b"), b, "b");
  auto all = safetensors::load_sharded(index);
  EXPECT_EQ(all.size(), 2u);
  // A tensor listed in the index but missing from its shard.
  std::string bad = R"({"weight_map":{"c":"model-00001-of-00002.safetensors"}})";
  write_file(dir.file("bad.index.json"), std::vector<uint8_t>(bad.begin(), bad.end()));
  EXPECT_THROWS_NAMING(safetensors::ShardedFile::open(dir.file("bad.index.json")), FormatError,
                       "bad.index.json", "'c'");
}

// Written by scripts/make_format_refs.py with safetensors.numpy: tensor "<dtype>" holds
// arange(12).reshape(3, 4) * 0.5 - 2 for floats, arange(12) * 7 for integers.
TEST(Safetensors, ReadsFilesWrittenByPython) {
  auto f = safetensors::File::open(data_dir() + "/py_dtypes.safetensors");
  EXPECT_EQ(f.metadata().at("made_by"), "make_format_refs.py");
  for (DType dt : kAllDTypes) {
    std::string name = dtype_name(dt);
    Tensor t = f.get(name);
    ASSERT_EQ(t.dtype(), dt) << name;
    ASSERT_EQ(t.shape(), Shape({3, 4})) << name;
    auto v = t.to_vec_f64();
    for (size_t i = 0; i < 12; ++i) {
      double want = is_float(dt) ? i * 0.5 - 2 : static_cast<double>(i * 7);
      EXPECT_EQ(v[i], want) << name << "[" << i << "]";
    }
  }
}

// ---- malformed inputs: each throws the documented type and names the file ----

const char* kName = "bad.safetensors";

void expect_format_error(const std::vector<uint8_t>& bytes, const std::string& part) {
  EXPECT_THROWS_NAMING(safetensors::File::from_bytes(bytes, kName), FormatError, kName, part);
}

std::vector<uint8_t> zeros(size_t n) {
  return std::vector<uint8_t>(n, 0);
}

TEST(SafetensorsMalformed, ShorterThanTheLength) {
  expect_format_error({1, 2, 3}, "too short");
}

TEST(SafetensorsMalformed, HeaderLengthPastTheEnd) {
  std::vector<uint8_t> b;
  append_le(b, 1000, 8);
  append_str(b, "{}");
  expect_format_error(b, "past the end");
  std::vector<uint8_t> huge;
  append_le(huge, ~uint64_t{0}, 8);
  expect_format_error(huge, "past the end");
}

TEST(SafetensorsMalformed, NotJson) {
  expect_format_error(st_file("{\"a\": ", {}), "not valid JSON");
}

TEST(SafetensorsMalformed, JsonNotAnObject) {
  expect_format_error(st_file("[1, 2]", {}), "not a JSON object");
  expect_format_error(st_file(R"({"a": 3})", {}), "'a'");
  expect_format_error(st_file(R"({"__metadata__": {"k": 1}})", {}), "__metadata__");
}

TEST(SafetensorsMalformed, MissingFields) {
  expect_format_error(st_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", zeros(4)), "dtype");
  expect_format_error(
      st_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", zeros(4)), "negative");
  expect_format_error(st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", zeros(4)),
                      "data_offsets");
}

TEST(SafetensorsMalformed, OffsetsOutOfOrder) {
  expect_format_error(
      st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", zeros(4)),
      "out of order");
}

TEST(SafetensorsMalformed, OffsetsOverlap) {
  std::string h =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_format_error(st_file(h, zeros(12)), "overlaps");
}

TEST(SafetensorsMalformed, OffsetsPastTheEnd) {
  expect_format_error(
      st_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", zeros(8)),
      "past the end");
}

TEST(SafetensorsMalformed, TruncatedFile) {
  TempDir dir;
  std::string path = dir.file("t.safetensors");
  safetensors::save({{"w", random_tensor({16}, DType::F32)}}, path);
  auto bytes = read_file(path);
  bytes.resize(bytes.size() - 5);
  write_file(path, bytes);
  EXPECT_THROWS_NAMING(safetensors::File::open(path), FormatError, path, "'w'");
}

TEST(SafetensorsMalformed, ShapeSizeMismatch) {
  expect_format_error(
      st_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", zeros(8)),
      "needs 12 bytes");
  // Dims whose product overflows.
  expect_format_error(
      st_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
              zeros(8)),
      "overflow");
}

TEST(SafetensorsMalformed, DuplicateNames) {
  std::string h =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  expect_format_error(st_file(h, zeros(2)), "twice");
}

TEST(SafetensorsMalformed, UnsupportedDTypeNamesTheTensor) {
  std::string h =
      R"({"q":{"dtype":"I8","shape":[2],"data_offsets":[0,2]},"r":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[2,4]}})";
  auto f = safetensors::File::from_bytes(st_file(h, zeros(4)), kName);
  EXPECT_THROWS_NAMING(f.get("q"), UnsupportedDType, kName, "'q'");
  EXPECT_THROWS_NAMING(f.info("r"), UnsupportedDType, kName, "F8_E5M2");
  EXPECT_THROW(f.get("missing"), Error);
}

// A dtype the specification does not name is a malformed file, found when the file is opened.
TEST(SafetensorsMalformed, UnknownDTypeIsAFormatError) {
  for (const char* dtype : {"F8_E9", "WEIRD", "f32", ""}) {
    std::string h =
        std::string(R"({"r":{"dtype":")") + dtype + R"(","shape":[2],"data_offsets":[0,2]}})";
    EXPECT_THROWS_NAMING(safetensors::File::from_bytes(st_file(h, zeros(2)), kName), FormatError,
                         kName, "'r'");
  }
  std::string h = R"({"r":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})";
  expect_format_error(st_file(h, zeros(2)), "F8_E9");
}

TEST(SafetensorsMalformed, SaveRejectsReservedName) {
  TempDir dir;
  EXPECT_THROW(safetensors::save({{"__metadata__", random_tensor({1}, DType::F32)}}, dir.file("x")),
               Error);
}

}  // namespace
}  // namespace wick::testing
