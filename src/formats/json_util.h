#pragma once
// The one JSON reading path for every JSON text wick reads (config.json, tokenizer.json,
// tokenizer_config.json, sentence-transformers files, safetensors headers and indexes).
// Untrusted text is parsed in linear time under a size and a nesting-depth limit, so that
// no later step (destruction, copies) recurses deeper than the limit; messages quote at most
// a short prefix of a value, never a whole dump().

#include <algorithm>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "wick/error.h"

namespace wick::formats {

/// Limits on one JSON text.
struct JsonLimits {
  size_t max_bytes = size_t{64} << 20;
  size_t max_depth = 128;  // objects and arrays nested inside each other
  bool reject_duplicate_keys = false;
  /// Joins the origin and the parser's words for invalid text.
  const char* invalid = ": malformed JSON: ";
};

namespace detail {

// nlohmann's DOM builder, with the depth counted and duplicate keys seen. Returning false
// stops the parse at once (nlohmann's callback parser, in contrast, rescans the parent object
// after every child and is quadratic in the number of keys).
class BoundedSax : public nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
 public:
  using Base = nlohmann::detail::json_sax_dom_parser<nlohmann::json>;
  BoundedSax(nlohmann::json& root, const JsonLimits& limits)
      : Base(root, /*allow_exceptions=*/false), limits_(limits) {}

  bool start_object(size_t len) {
    if (!enter()) return false;
    if (limits_.reject_duplicate_keys) keys_.emplace_back();
    return Base::start_object(len);
  }
  bool end_object() {
    --depth_;
    if (limits_.reject_duplicate_keys) keys_.pop_back();
    return Base::end_object();
  }
  bool start_array(size_t len) {
    if (!enter()) return false;
    return Base::start_array(len);
  }
  bool end_array() {
    --depth_;
    return Base::end_array();
  }
  bool key(std::string& k) {
    if (limits_.reject_duplicate_keys && !keys_.back().insert(k).second) {
      duplicate = k;
      return false;
    }
    return Base::key(k);
  }
  template <class Exception>
  bool parse_error(size_t position, const std::string& token, const Exception& ex) {
    if (syntax.empty()) syntax = ex.what();
    return Base::parse_error(position, token, ex);
  }

  bool too_deep = false;
  std::string duplicate;
  std::string syntax;

 private:
  bool enter() {
    if (++depth_ > limits_.max_depth) {
      too_deep = true;
      return false;
    }
    return true;
  }
  const JsonLimits& limits_;
  size_t depth_ = 0;
  std::vector<std::unordered_set<std::string>> keys_;  // one per open object
};

}  // namespace detail

/// The first characters of `s` for a message: quoted, cut after 40 bytes.
inline std::string quote_prefix(const std::string& s) {
  std::string out(1, '"');
  out.append(s, 0, std::min<size_t>(s.size(), 40));
  if (s.size() <= 40) return out += '"';
  out += "...\" (";
  out += std::to_string(s.size());
  out += " bytes)";
  return out;
}

/// A short description of a JSON value for a message: its type, and its value when scalar
/// (strings cut to a prefix). Never recursive.
inline std::string describe(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "the string " + quote_prefix(v.get_ref<const std::string&>());
    case nlohmann::json::value_t::null:
      return "null";
    default:
      return v.dump();  // a number or a boolean
  }
}

/// Parses [first, last) under `limits`. Throws FormatError "<origin>: <what> ..." for text over
/// the size limit, nesting over the depth limit, invalid JSON or (when asked) a duplicate key.
inline nlohmann::json parse_json_bounded(const char* first, const char* last,
                                         const std::string& origin, const JsonLimits& limits) {
  size_t size = static_cast<size_t>(last - first);
  if (size > limits.max_bytes) {
    throw FormatError(origin + ": JSON text of " + std::to_string(size) +
                      " bytes is over the limit of " + std::to_string(limits.max_bytes));
  }
  nlohmann::json j;
  detail::BoundedSax sax(j, limits);
  bool ok = nlohmann::json::sax_parse(first, last, &sax);
  if (sax.too_deep) {
    throw FormatError(origin + ": JSON nested deeper than the limit of " +
                      std::to_string(limits.max_depth) + " levels");
  }
  if (!sax.duplicate.empty()) {
    throw FormatError(origin + " names '" + sax.duplicate.substr(0, 40) + "' twice");
  }
  if (!ok || sax.is_errored()) {
    std::string why = sax.syntax.empty() ? std::string("not valid JSON") : sax.syntax;
    if (why.size() > 200) why = why.substr(0, 200) + "...";
    throw FormatError(origin + limits.invalid + why);
  }
  return j;
}

/// The file headers' form: FormatError "<format> <file>: <what> ..." for invalid JSON or a
/// duplicate key, with the header limits.
inline nlohmann::json parse_json(const char* first, const char* last, const char* format,
                                 const std::string& file, const char* what,
                                 size_t max_bytes = size_t{100} << 20) {
  JsonLimits limits;
  limits.max_bytes = max_bytes;
  limits.reject_duplicate_keys = true;
  limits.invalid = " is not valid JSON: ";
  return parse_json_bounded(first, last, std::string(format) + " " + file + ": " + what, limits);
}

}  // namespace wick::formats
