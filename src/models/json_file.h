#pragma once
// Reading the JSON files of a model folder (config.json, modules.json, tokenizer.json, ...)
// through the bounded parser (formats/json_util.h), with typed accessors whose errors name the
// file and the key and quote at most a short prefix of the value.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "formats/format_util.h"
#include "formats/json_util.h"
#include "wick/error.h"

namespace wick::json_file {

using Json = nlohmann::json;

/// Size limit of a small configuration file (config.json, modules.json, ...).
constexpr size_t kMaxConfigBytes = size_t{16} << 20;
/// Size limit of a tokenizer.json (the largest published ones are tens of MB).
constexpr size_t kMaxTokenizerBytes = size_t{512} << 20;

/// Parses `text` under the size and depth limits; FormatError "<origin>: ..." otherwise.
inline Json parse(std::string_view text, const std::string& origin,
                  size_t max_bytes = kMaxConfigBytes) {
  formats::JsonLimits limits;
  limits.max_bytes = max_bytes;
  return formats::parse_json_bounded(text.data(), text.data() + text.size(), origin, limits);
}

/// Reads and parses `path`; FormatError naming it when it is missing, unreadable, not a regular
/// file, over `max_bytes`, nested too deeply or not JSON.
inline Json read(const std::filesystem::path& path, size_t max_bytes = kMaxConfigBytes) {
  std::string text = formats::read_file_bounded(path.string(), max_bytes);
  return parse(text, path.string(), max_bytes);
}

/// FormatError "<file>: field "<key>" must be <want>, got <a short description>".
[[noreturn]] inline void bad_field(const std::string& file, const std::string& key,
                                   const char* want, const Json& got) {
  throw FormatError(file + ": field \"" + key + "\" must be " + want + ", got " +
                    formats::describe(got));
}

/// An integer in [0, max]: FormatError naming file and key otherwise.
inline uint64_t as_uint(const Json& v, const std::string& key, const std::string& file,
                        uint64_t max = std::numeric_limits<uint64_t>::max()) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u <= max) return u;
  } else if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i >= 0 && static_cast<uint64_t>(i) <= max) return static_cast<uint64_t>(i);
  }
  bool any = max == std::numeric_limits<uint64_t>::max();
  bad_field(
      file, key,
      any ? "a non-negative integer" : ("an integer in [0, " + std::to_string(max) + "]").c_str(),
      v);
}

/// A non-negative integer field; FormatError when missing (without a fallback) or not one.
inline size_t get_size(const Json& j, const char* key, const std::filesystem::path& file,
                       const size_t* fallback = nullptr) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (fallback) return *fallback;
    throw FormatError(file.string() + ": missing field \"" + key + "\"");
  }
  return as_uint(*it, key, file.string());
}

/// A number field with a fallback.
inline double get_number(const Json& j, const char* key, const std::filesystem::path& file,
                         double fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_number()) bad_field(file.string(), key, "a number", *it);
  return it->get<double>();
}

/// A string field with a fallback.
inline std::string get_string(const Json& j, const char* key, const std::filesystem::path& file,
                              const std::string& fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) bad_field(file.string(), key, "a string", *it);
  return it->get<std::string>();
}

/// A boolean field with a fallback.
inline bool get_bool(const Json& j, const char* key, const std::filesystem::path& file,
                     bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad_field(file.string(), key, "true or false", *it);
  return it->get<bool>();
}

/// FormatError "<dir>: not a model folder (...)" unless `dir` is a directory.
inline void require_model_folder(const std::filesystem::path& dir) {
  std::error_code ec;
  auto status = std::filesystem::status(dir, ec);
  if (std::filesystem::is_directory(status)) return;
  const bool missing = status.type() == std::filesystem::file_type::not_found;
  throw FormatError(dir.string() + ": not a model folder (" +
                    (missing ? std::string("no such directory")
                     : ec    ? ec.message()
                             : std::string("not a directory")) +
                    ")");
}

}  // namespace wick::json_file
