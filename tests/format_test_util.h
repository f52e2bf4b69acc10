#pragma once
// Helpers shared by the format tests: a scratch folder per test, raw file writing, and the
// "throws T naming the file" check.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "wick/formats.h"

namespace wick::testing {

/// A fresh folder under the temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("wick_") + info->test_suite_name() + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
}

inline void append_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

inline void append_str(std::vector<uint8_t>& out, const std::string& s) {
  // A byte loop: GCC 12 reports a false -Wstringop-overflow for vector::insert of a string range.
  for (char c : s) out.push_back(static_cast<uint8_t>(c));
}

template <class... Args>
std::string str_of(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

/// The folder of committed reference files (tests/data/formats).
inline std::string data_dir() {
  return std::string(WICK_FORMAT_DATA_DIR);
}

}  // namespace wick::testing

/// Asserts that `stmt` throws `Type` with a message containing `file` (and `part`, if not empty).
#define EXPECT_THROWS_NAMING(stmt, Type, file, part)                                               \
  do {                                                                                             \
    try {                                                                                          \
      stmt;                                                                                        \
      ADD_FAILURE() << #stmt " did not throw";                                                     \
    } catch (const Type& e) {                                                                      \
      std::string msg = e.what();                                                                  \
      EXPECT_NE(msg.find(file), std::string::npos) << "message does not name the file: " << msg;   \
      EXPECT_NE(msg.find(part), std::string::npos) << "message lacks '" << (part) << "': " << msg; \
    } catch (const std::exception& e) {                                                            \
      ADD_FAILURE() << #stmt " threw another type: " << e.what();                                  \
    }                                                                                              \
  } while (0)
