#pragma once
// Reading the small JSON files of a model folder (config.json, modules.json, ...) with errors that
// name the file and the field.

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "wick/error.h"

namespace wick::json_file {

using Json = nlohmann::json;

/// Parses `path`; FormatError when it is missing, unreadable or not JSON.
inline Json read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(path.string() + ": cannot open (missing or unreadable)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return Json::parse(text.str());
  } catch (const Json::exception& e) {
    throw FormatError(path.string() + ": malformed JSON: " + e.what());
  }
}

/// A non-negative integer field; FormatError when missing (without a fallback) or not one.
inline size_t get_size(const Json& j, const char* key, const std::filesystem::path& file,
                       const size_t* fallback = nullptr) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (fallback) return *fallback;
    throw FormatError(file.string() + ": missing field \"" + key + "\"");
  }
  if (!it->is_number_integer() || it->get<long long>() < 0) {
    throw FormatError(file.string() + ": field \"" + key + "\" must be a non-negative integer, got " +
                      it->dump());
  }
  return it->get<size_t>();
}

/// A number field with a fallback.
inline double get_number(const Json& j, const char* key, const std::filesystem::path& file,
                         double fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_number()) {
    throw FormatError(file.string() + ": field \"" + key + "\" must be a number, got " + it->dump());
  }
  return it->get<double>();
}

/// A string field with a fallback.
inline std::string get_string(const Json& j, const char* key, const std::filesystem::path& file,
                              const std::string& fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) {
    throw FormatError(file.string() + ": field \"" + key + "\" must be a string, got " + it->dump());
  }
  return it->get<std::string>();
}

/// A boolean field with a fallback.
inline bool get_bool(const Json& j, const char* key, const std::filesystem::path& file,
                     bool fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_boolean()) {
    throw FormatError(file.string() + ": field \"" + key + "\" must be true or false, got " +
                      it->dump());
  }
  return it->get<bool>();
}

}  // namespace wick::json_file
