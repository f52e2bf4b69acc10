#pragma once
// Python's str methods on UTF-8 text: code points, not bytes, are what lengths, slices and
// strips count. Bytes that are not UTF-8 map to lone surrogates (Python's surrogateescape) so
// that they come back unchanged.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace wick::jinja {

std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
/// Code points in s.
size_t utf8_length(std::string_view s);

/// str.isspace for one code point.
bool py_isspace(char32_t c);
/// str.strip / lstrip / rstrip; chars absent strips whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
/// str.split(sep, maxsplit) (maxsplit < 0: no limit); sep absent splits on runs of whitespace.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  long maxsplit);
/// str.rsplit(sep, maxsplit).
std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   long maxsplit);
/// str.replace(old, new, count) (count < 0: all).
std::string py_replace(std::string_view s, std::string_view from, std::string_view to, long count);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
/// str.title: the first cased letter of each run of letters upper, the rest lower.
std::string py_title(std::string_view s);
/// str.capitalize: the first character upper, the rest lower.
std::string py_capitalize(std::string_view s);
/// The unicode_escape decoding Jinja applies to a string literal's body.
std::string unescape_literal(std::string_view body);

}  // namespace wick::jinja
