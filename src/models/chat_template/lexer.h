#pragma once
// Jinja's lexer as transformers configures it: text and tags, with trim_blocks, lstrip_blocks,
// the -/+ whitespace marks, comments dropped, newlines normalised to "\n" and one trailing
// newline of the source removed (keep_trailing_newline=False).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "wick/chat_template.h"

namespace wick::jinja {

/// A template that cannot be read: the message names the line and the construct.
class ParseError : public ChatTemplateError {
 public:
  using ChatTemplateError::ChatTemplateError;
};

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type = Tok::Eof;
  std::string text;  // Text: the data; Name, Op: the spelling; String: the decoded value
  int line = 1;
  int64_t i = 0;
  double f = 0;
};

std::vector<Token> lex(std::string_view source);

}  // namespace wick::jinja
