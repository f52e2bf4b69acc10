#include "models/chat_template/strings.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <stdexcept>

namespace wick::jinja {

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if (ok) {
      // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
      static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
      if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) ok = false;
    }
    if (!ok) {
      out.push_back(0xdc00 + c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c >= 0xdc80 && c <= 0xdcff) {
      out.push_back(static_cast<char>(c - 0xdc00));
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    }
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  return utf8_decode(s).size();
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  std::u32string u = utf8_decode(s);
  std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_this = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : py_isspace(c);
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_this(u[b])) ++b;
  if (right)
    while (e > b && strip_this(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  long maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<long>(out.size()) < maxsplit) {
      size_t at = s.find(*sep, pos);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, at - pos));
      pos = at + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::u32string u = utf8_decode(s);
  size_t i = 0;
  while (true) {
    while (i < u.size() && py_isspace(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit >= 0 && static_cast<long>(out.size()) == maxsplit) {
      size_t e = u.size();
      while (e > i && py_isspace(u[e - 1])) --e;
      out.push_back(utf8_encode(std::u32string_view(u).substr(i, e - i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !py_isspace(u[j])) ++j;
    out.push_back(utf8_encode(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   long maxsplit) {
  if (maxsplit < 0) return py_split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (static_cast<long>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    std::u32string u = utf8_decode(s);
    size_t e = u.size();
    while (true) {
      while (e > 0 && py_isspace(u[e - 1])) --e;
      if (e == 0) break;
      if (static_cast<long>(out.size()) == maxsplit) {
        size_t b = 0;
        while (b < e && py_isspace(u[b])) ++b;
        out.push_back(utf8_encode(std::u32string_view(u).substr(b, e - b)));
        break;
      }
      size_t j = e;
      while (j > 0 && !py_isspace(u[j - 1])) --j;
      out.push_back(utf8_encode(std::u32string_view(u).substr(j, e - j)));
      e = j;
    }
  }
  return {out.rbegin(), out.rend()};
}

std::string py_replace(std::string_view s, std::string_view from, std::string_view to, long count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` before every code point and at the end.
    std::u32string u = utf8_decode(s);
    long n = 0;
    for (char32_t c : u) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += utf8_encode(std::u32string_view(&c, 1));
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t pos = 0;
  long n = 0;
  while (count < 0 || n < count) {
    size_t at = s.find(from, pos);
    if (at == std::string_view::npos) break;
    out.append(s.substr(pos, at - pos));
    out.append(to);
    pos = at + from.size();
    ++n;
  }
  out.append(s.substr(pos));
  return out;
}

namespace {

char32_t to_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c >= 0xd800 && c <= 0xdfff) return c;
  return static_cast<char32_t>(u_toupper(static_cast<UChar32>(c)));
}
char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xd800 && c <= 0xdfff) return c;
  return static_cast<char32_t>(u_tolower(static_cast<UChar32>(c)));
}
bool is_cased(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (c >= 0xd800 && c <= 0xdfff) return false;
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED);
}

}  // namespace

// Full case mapping (ß -> SS, final sigma) as Python's str.upper/lower, through ICU's root
// locale; text holding escaped bytes maps one code point at a time.
static std::string full_case(std::string_view s, bool upper) {
  std::u32string u = utf8_decode(s);
  bool ascii = true, escaped = false;
  for (char32_t c : u) {
    ascii = ascii && c < 0x80;
    escaped = escaped || (c >= 0xd800 && c <= 0xdfff);
  }
  if (ascii || escaped) {
    for (char32_t& c : u) c = upper ? to_upper(c) : to_lower(c);
    return utf8_encode(u);
  }
  std::u16string src;
  for (char32_t c : u) {
    if (c < 0x10000) {
      src.push_back(static_cast<char16_t>(c));
    } else {
      src.push_back(static_cast<char16_t>(0xd800 + ((c - 0x10000) >> 10)));
      src.push_back(static_cast<char16_t>(0xdc00 + ((c - 0x10000) & 0x3ff)));
    }
  }
  std::u16string dst(src.size() * 3 + 8, u'\0');
  UErrorCode err = U_ZERO_ERROR;
  int32_t n =
      upper ? u_strToUpper(reinterpret_cast<UChar*>(dst.data()), static_cast<int32_t>(dst.size()),
                           reinterpret_cast<const UChar*>(src.data()),
                           static_cast<int32_t>(src.size()), "", &err)
            : u_strToLower(reinterpret_cast<UChar*>(dst.data()), static_cast<int32_t>(dst.size()),
                           reinterpret_cast<const UChar*>(src.data()),
                           static_cast<int32_t>(src.size()), "", &err);
  if (U_FAILURE(err)) {
    for (char32_t& c : u) c = upper ? to_upper(c) : to_lower(c);
    return utf8_encode(u);
  }
  std::u32string out;
  for (int32_t k = 0; k < n; ++k) {
    char32_t c = dst[static_cast<size_t>(k)];
    if (c >= 0xd800 && c < 0xdc00 && k + 1 < n) {
      char32_t lo = dst[static_cast<size_t>(++k)];
      c = 0x10000 + ((c - 0xd800) << 10) + (lo - 0xdc00);
    }
    out.push_back(c);
  }
  return utf8_encode(out);
}

std::string py_upper(std::string_view s) {
  return full_case(s, true);
}

std::string py_lower(std::string_view s) {
  return full_case(s, false);
}

std::string py_title(std::string_view s) {
  std::u32string u = utf8_decode(s);
  bool prev_cased = false;
  for (char32_t& c : u) {
    bool cased = is_cased(c);
    c = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = cased;
  }
  return utf8_encode(u);
}

std::string py_capitalize(std::string_view s) {
  std::u32string u = utf8_decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? to_upper(u[i]) : to_lower(u[i]);
  return utf8_encode(u);
}

std::string unescape_literal(std::string_view body) {
  std::u32string in = utf8_decode(body), out;
  auto hex = [&](size_t at, int n, char32_t& v) {
    if (at + n > in.size()) return false;
    v = 0;
    for (int k = 0; k < n; ++k) {
      char32_t c = in[at + k];
      int d = c >= '0' && c <= '9'   ? static_cast<int>(c - '0')
              : c >= 'a' && c <= 'f' ? static_cast<int>(c - 'a' + 10)
              : c >= 'A' && c <= 'F' ? static_cast<int>(c - 'A' + 10)
                                     : -1;
      if (d < 0) return false;
      v = v * 16 + static_cast<char32_t>(d);
    }
    return true;
  };
  for (size_t i = 0; i < in.size(); ++i) {
    char32_t c = in[i];
    if (c != '\\' || i + 1 == in.size()) {
      out.push_back(c);
      continue;
    }
    char32_t e = in[++i];
    char32_t v = 0;
    switch (e) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back(7);
        break;
      case 'b':
        out.push_back(8);
        break;
      case 'f':
        out.push_back(12);
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back(11);
        break;
      case 'x':
      case 'u':
      case 'U': {
        int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        if (!hex(i + 1, n, v) || v > 0x10ffff)
          throw std::invalid_argument("truncated \\" + std::string(1, static_cast<char>(e)) +
                                      " escape in a string literal");
        out.push_back(v);
        i += n;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          v = e - '0';
          for (int k = 0; k < 2 && i + 1 < in.size() && in[i + 1] >= '0' && in[i + 1] <= '7'; ++k)
            v = v * 8 + (in[++i] - '0');
          out.push_back(v);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return utf8_encode(out);
}

}  // namespace wick::jinja
