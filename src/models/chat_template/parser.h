#pragma once
// Tokens to a syntax tree, with jinja2's grammar and operator precedence.

#include <string_view>

#include "models/chat_template/ast.h"
#include "models/chat_template/lexer.h"

namespace wick::jinja {

/// The statements of a template; a ParseError names the line and the construct it cannot read.
Body parse(std::string_view source);

}  // namespace wick::jinja
