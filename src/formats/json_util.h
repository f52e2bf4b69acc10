#pragma once
// JSON parsing for file headers: nlohmann-json with duplicate keys rejected (nlohmann keeps the
// last one silently; a header naming a tensor twice is malformed).

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "formats/format_util.h"

namespace wick::formats {

/// Parses `text`; FormatError "<format> <file>: <what> ..." for invalid JSON or a duplicate key.
inline nlohmann::json parse_json(const char* first, const char* last, const char* format,
                                 const std::string& file, const char* what) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      keys.emplace_back();
    } else if (event == E::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == E::key && !keys.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  nlohmann::json j = nlohmann::json::parse(first, last, callback, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(format, file, what, " is not valid JSON");
  if (!duplicate.empty()) fail(format, file, what, " names '", duplicate, "' twice");
  return j;
}

}  // namespace wick::formats
