// npy / npz: round trips, files written by numpy (C and Fortran order, big-endian, stored and
// deflated npz), and malformed inputs.

#include "format_test_util.h"
#include "test_util.h"

namespace wick::testing {
namespace {

constexpr DType kNumpyDTypes[] = {DType::U8,  DType::U32, DType::I64,
                                  DType::F16, DType::F32, DType::F64};

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(a.to_vec_f64(), b.to_vec_f64()) << what;
}

TEST(Npy, RoundTripEveryDTypeAndLayout) {
  TempDir dir;
  for (DType dt : kNumpyDTypes) {
    std::vector<Tensor> cases = {random_tensor({3, 4, 2}, dt), random_tensor({5, 3}, dt).t(),
                                 random_tensor({7}, dt), Tensor::zeros({}, dt, Device::cpu()),
                                 Tensor::zeros({0, 3}, dt, Device::cpu())};
    for (size_t i = 0; i < cases.size(); ++i) {
      std::string path = dir.file(str_of(dtype_name(dt), i, ".npy"));
      npy::save(cases[i], path);
      expect_same(npy::load(path), cases[i], path);
    }
  }
  EXPECT_THROW(npy::save(random_tensor({2}, DType::BF16), dir.file("b.npy")), UnsupportedDType);
}

TEST(Npy, ReadsFilesWrittenByNumpy) {
  for (DType dt : kNumpyDTypes) {
    std::string path = data_dir() + "/py_" + dtype_name(dt) + ".npy";
    Tensor t = npy::load(path);
    ASSERT_EQ(t.dtype(), dt) << path;
    ASSERT_EQ(t.shape(), Shape({3, 4})) << path;
    auto v = t.to_vec_f64();
    for (size_t i = 0; i < 12; ++i) {
      EXPECT_EQ(v[i], is_float(dt) ? i * 0.5 - 2 : i * 7.0) << path << "[" << i << "]";
    }
  }
  Tensor f = npy::load(data_dir() + "/py_fortran.npy");
  Tensor be = npy::load(data_dir() + "/py_bigendian.npy");
  ASSERT_EQ(f.shape(), Shape({3, 4}));
  ASSERT_EQ(be.dtype(), DType::F64);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(f.to_vec_f64()[i], i * 0.5 - 2);
    EXPECT_EQ(be.to_vec_f64()[i], i * 0.5 - 2);
  }
}

TEST(Npz, ReadsStoredAndDeflatedArchivesFromNumpy) {
  for (const char* name : {"py_stored.npz", "py_deflated.npz"}) {
    auto m = npz::load(data_dir() + "/" + name);
    ASSERT_EQ(m.size(), 2u) << name;
    EXPECT_EQ(m.at("a").dtype(), DType::F32);
    EXPECT_EQ(m.at("b").dtype(), DType::I64);
    for (size_t i = 0; i < 12; ++i) {
      EXPECT_EQ(m.at("a").to_vec_f64()[i], i * 0.5 - 2) << name;
      EXPECT_EQ(m.at("b").to_vec_f64()[i], i * 7.0) << name;
    }
  }
}

TEST(Npz, RoundTripStoredAndDeflated) {
  TempDir dir;
  std::map<std::string, Tensor> tensors;
  for (DType dt : kNumpyDTypes) tensors[dtype_name(dt)] = random_tensor({4, 6}, dt).t();
  for (bool compress : {false, true}) {
    std::string path = dir.file(compress ? "d.npz" : "s.npz");
    npz::save(tensors, path, compress);
    auto back = npz::load(path);
    ASSERT_EQ(back.size(), tensors.size());
    for (const auto& [k, t] : tensors) expect_same(back.at(k), t, k);
  }
  // Random-valued floats do not compress; zeros do.
  npz::save({{"z", Tensor::zeros({4096}, DType::F32, Device::cpu())}}, dir.file("z.npz"), true);
  EXPECT_LT(read_file(dir.file("z.npz")).size(), 2048u);
}

// ---- malformed ----

std::vector<uint8_t> npy_file(const std::string& header, size_t data_bytes, uint8_t major = 1) {
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', major, 0};
  append_le(out, header.size(), major == 1 ? 2 : 4);
  append_str(out, header);
  out.resize(out.size() + data_bytes, 0);
  return out;
}

const char* kNpy = "bad.npy";

TEST(NpyMalformed, NoMagic) {
  EXPECT_THROWS_NAMING(npy::load_bytes({1, 2, 3}, kNpy), FormatError, kNpy, "magic");
}

TEST(NpyMalformed, HeaderLengthPastTheEnd) {
  auto b = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  b[8] = 0xff;
  b[9] = 0xff;
  EXPECT_THROWS_NAMING(npy::load_bytes(b, kNpy), FormatError, kNpy, "past the end");
}

TEST(NpyMalformed, BadHeaderDict) {
  EXPECT_THROWS_NAMING(npy::load_bytes(npy_file("{'descr': '<f4', 'shape': (2,)}", 8), kNpy),
                       FormatError, kNpy, "fortran_order");
  EXPECT_THROWS_NAMING(npy::load_bytes(npy_file("['descr']", 8), kNpy), FormatError, kNpy,
                       "offset");
  EXPECT_THROWS_NAMING(
      npy::load_bytes(npy_file("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}", 8), kNpy),
      FormatError, kNpy, "True or False");
}

TEST(NpyMalformed, UnsupportedDType) {
  EXPECT_THROWS_NAMING(
      npy::load_bytes(npy_file("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16),
                      kNpy),
      UnsupportedDType, kNpy, "<c8");
}

TEST(NpyMalformed, TruncatedData) {
  EXPECT_THROWS_NAMING(
      npy::load_bytes(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 40),
                      kNpy),
      FormatError, kNpy, "truncated");
}

TEST(NpyMalformed, ShapeOverflow) {
  EXPECT_THROWS_NAMING(
      npy::load_bytes(
          npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
                   8),
          kNpy),
      FormatError, kNpy, "overflow");
  EXPECT_THROWS_NAMING(
      npy::load_bytes(
          npy_file(
              "{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999999,), }", 8),
          kNpy),
      FormatError, kNpy, "overflow");
}

TEST(NpzMalformed, NotAZip) {
  EXPECT_THROWS_NAMING(npz::load_bytes({'P', 'K', 3, 4, 0, 0}, "bad.npz"), FormatError, "bad.npz",
                       "zip");
}

TEST(NpzMalformed, TruncatedArchive) {
  TempDir dir;
  npz::save({{"a", random_tensor({64}, DType::F32)}}, dir.file("t.npz"));
  auto b = read_file(dir.file("t.npz"));
  b.resize(b.size() / 2);
  EXPECT_THROWS_NAMING(npz::load_bytes(b, "cut.npz"), FormatError, "cut.npz", "");
}

TEST(NpzMalformed, BadMemberNamesTheMember) {
  TempDir dir;
  npz::save({{"a", random_tensor({4}, DType::F32)}}, dir.file("m.npz"));
  auto b = read_file(dir.file("m.npz"));
  // Corrupt the member's npy magic (the data of a stored member follows its local header).
  for (size_t i = 0; i + 6 < b.size(); ++i) {
    if (b[i] == 0x93 && b[i + 1] == 'N' && b[i + 2] == 'U') {
      b[i + 1] = 'X';
      break;
    }
  }
  // libzip's CRC check or the npy magic check: either way a FormatError naming the archive.
  EXPECT_THROWS_NAMING(npz::load_bytes(b, "m.npz"), FormatError, "m.npz", "a.npy");
}

}  // namespace
}  // namespace wick::testing
