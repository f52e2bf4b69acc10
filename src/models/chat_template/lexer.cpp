#include "models/chat_template/lexer.h"

#include <cmath>
#include <cstdlib>

#include "models/chat_template/strings.h"

namespace wick::jinja {
namespace {

[[noreturn]] void fail(int line, const std::string& what) {
  throw ParseError("chat template line " + std::to_string(line) + ": " + what);
}

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// Python's \s (str.isspace) over a UTF-8 range.
bool all_space(std::string_view s) {
  for (char32_t c : utf8_decode(s))
    if (!py_isspace(c)) return false;
  return true;
}

// Length of the whitespace run (Python's \s*) at the start of s.
size_t space_run(std::string_view s) {
  size_t n = 0;
  while (n < s.size()) {
    // One code point at a time: a UTF-8 sequence is at most 4 bytes.
    size_t len = 1;
    while (len < 4 && n + len < s.size() && (static_cast<unsigned char>(s[n + len]) & 0xc0) == 0x80)
      ++len;
    std::u32string u = utf8_decode(s.substr(n, len));
    if (u.empty() || !py_isspace(u[0])) break;
    n += utf8_encode(std::u32string_view(u.data(), 1)).size();
  }
  return n;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t tag = find_tag(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      if (tag == src_.size()) {
        emit_text(text, pos_);
        pos_ = tag;
        break;
      }
      char kind = src_[tag + 1];  // '{', '%' or '#'
      char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')
                      ? src_[tag + 2]
                      : 0;
      if (sign == '-') {
        text = py_strip(text, std::nullopt, false, true);
      } else if (sign != '+' && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            all_space(std::string_view(text).substr(l_pos)))
          text.resize(l_pos);
      }
      emit_text(text, pos_);
      advance_to(tag);
      size_t after = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        line_starting = comment(after);
      } else if (kind == '%' && raw_block(after)) {
        line_starting = false;
      } else {
        line_starting = tag_body(kind == '{', after);
      }
    }
    out_.push_back(Token{Tok::Eof, "", line_, 0, 0});
    return std::move(out_);
  }

 private:
  size_t find_tag(size_t from) const {
    while (true) {
      size_t at = src_.find('{', from);
      if (at == std::string::npos || at + 1 >= src_.size()) return src_.size();
      char c = src_[at + 1];
      if (c == '{' || c == '%' || c == '#') return at;
      from = at + 1;
    }
  }

  void advance_to(size_t to) {
    for (size_t k = pos_; k < to; ++k) line_ += src_[k] == '\n';
    pos_ = to;
  }

  void emit_text(const std::string& text, size_t at) {
    if (text.empty()) return;
    int line = line_;
    (void)at;
    out_.push_back(Token{Tok::Text, text, line, 0, 0});
  }

  // `#}` ends a comment; `-#}` eats the whitespace after it, plain `#}` one newline (trim_blocks).
  bool comment(size_t from) {
    size_t end = src_.find("#}", from);
    if (end == std::string::npos) fail(line_, "unclosed comment");
    size_t next = end + 2;
    bool minus = end > from && src_[end - 1] == '-';
    bool plus = end > from && src_[end - 1] == '+';
    if (minus) {
      next += space_run(std::string_view(src_).substr(next));
    } else if (!plus && next < src_.size() && src_[next] == '\n') {
      ++next;
    }
    advance_to(next);
    return next > 0 && src_[next - 1] == '\n';
  }

  // {% raw %}...{% endraw %}: the body is text, untouched.
  bool raw_block(size_t from) {
    size_t p = from;
    while (p < src_.size() && is_ascii_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3])))
      return false;
    p += 3;
    while (p < src_.size() && is_ascii_space(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      p += space_run(std::string_view(src_).substr(p));
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      fail(line_, "malformed raw tag");
    }
    size_t search = p;
    while (true) {
      size_t at = src_.find("{%", search);
      if (at == std::string::npos) fail(line_, "missing endraw");
      size_t q = at + 2;
      char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      while (q < src_.size() && is_ascii_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = at + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && is_ascii_space(src_[q])) ++q;
      std::string body = src_.substr(p, at - p);
      if (sign == '-') body = py_strip(body, std::nullopt, false, true);
      if (src_.compare(q, 3, "-%}") == 0) {
        q += 3;
        q += space_run(std::string_view(src_).substr(q));
      } else if (src_.compare(q, 3, "+%}") == 0) {
        q += 3;
      } else if (src_.compare(q, 2, "%}") == 0) {
        q += 2;
        if (q < src_.size() && src_[q] == '\n') ++q;
      } else {
        fail(line_, "malformed endraw tag");
      }
      emit_text(body, p);
      advance_to(q);
      return true;
    }
  }

  // The expression tokens of one {{ }} or {% %} tag; returns whether its end ate a newline.
  bool tag_body(bool variable, size_t from) {
    out_.push_back(Token{variable ? Tok::VarBegin : Tok::BlockBegin, "", line_, 0, 0});
    advance_to(from);
    int depth = 0;
    const char close = variable ? '}' : '%';
    while (true) {
      while (pos_ < src_.size() && is_ascii_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) fail(line_, variable ? "unclosed '{{'" : "unclosed '{%'");
      if (depth == 0) {
        size_t end = 0;
        bool eat_space = false, eat_newline = false;
        if (src_[pos_] == '-' && pos_ + 2 < src_.size() + 0 && src_[pos_ + 1] == close &&
            src_[pos_ + 2] == '}') {
          end = pos_ + 3;
          eat_space = true;
        } else if (!variable && src_.compare(pos_, 3, "+%}") == 0) {
          end = pos_ + 3;
        } else if (src_[pos_] == close && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') {
          end = pos_ + 2;
          eat_newline = !variable;
        }
        if (end) {
          out_.push_back(Token{variable ? Tok::VarEnd : Tok::BlockEnd, "", line_, 0, 0});
          if (eat_space) end += space_run(std::string_view(src_).substr(end));
          if (eat_newline && end < src_.size() && src_[end] == '\n') ++end;
          advance_to(end);
          return end > 0 && (eat_space || eat_newline) && src_[end - 1] == '\n';
        }
      }
      lex_one(depth);
    }
  }

  void lex_one(int& depth) {
    char c = src_[pos_];
    int line = line_;
    if (is_digit(c)) {
      size_t p = pos_;
      auto digits = [&] {
        while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() &&
                                                         is_digit(src_[p + 1]))))
          ++p;
      };
      digits();
      bool is_float = false;
      if (p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
        ++p;
        digits();
        is_float = true;
      }
      if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t q = p + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < src_.size() && is_digit(src_[q])) {
          p = q;
          digits();
          is_float = true;
        }
      }
      std::string spelled;
      for (size_t k = pos_; k < p; ++k)
        if (src_[k] != '_') spelled += src_[k];
      Token t{is_float ? Tok::Float : Tok::Int, spelled, line, 0, 0};
      if (is_float) {
        t.f = std::strtod(spelled.c_str(), nullptr);
      } else {
        errno = 0;
        t.i = std::strtoll(spelled.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(line, "integer literal " + spelled + " out of range");
      }
      out_.push_back(t);
      advance_to(p);
      return;
    }
    if (is_name_start(c)) {
      size_t p = pos_;
      while (p < src_.size() && is_name_char(src_[p])) ++p;
      out_.push_back(Token{Tok::Name, src_.substr(pos_, p - pos_), line, 0, 0});
      advance_to(p);
      return;
    }
    if (c == '\'' || c == '"') {
      size_t p = pos_ + 1;
      while (p < src_.size() && src_[p] != c) p += src_[p] == '\\' ? 2 : 1;
      if (p >= src_.size()) fail(line, "unterminated string literal");
      std::string body = src_.substr(pos_ + 1, p - pos_ - 1);
      try {
        out_.push_back(Token{Tok::String, unescape_literal(body), line, 0, 0});
      } catch (const std::invalid_argument& e) {
        fail(line, e.what());
      }
      advance_to(p + 1);
      return;
    }
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                       "/",  "%",  "~",  "<",  ">",  "=",  ".", ":", "|",
                                       ",",  "(",  ")",  "[",  "]",  "{",  "}", ";"};
    for (const char* op : kOps) {
      size_t n = std::char_traits<char>::length(op);
      if (src_.compare(pos_, n, op) == 0) {
        if (n == 1 && (c == '(' || c == '[' || c == '{')) {
          if (++depth > 256) fail(line, "brackets nested deeper than 256");
        }
        if (n == 1 && (c == ')' || c == ']' || c == '}')) {
          if (depth == 0) fail(line, std::string("unexpected '") + c + "'");
          --depth;
        }
        out_.push_back(Token{Tok::Op, op, line, 0, 0});
        advance_to(pos_ + n);
        return;
      }
    }
    fail(line, std::string("unexpected character '") + c + "'");
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

// Newlines as "\n" and one trailing newline dropped, as jinja2's lexer does.
std::string normalize(std::string_view source) {
  std::string s;
  s.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      s += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      s += source[k];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

std::vector<Token> lex(std::string_view source) {
  return Lexer(normalize(source)).run();
}

}  // namespace wick::jinja
