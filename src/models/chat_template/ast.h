#pragma once
// The syntax tree of a chat template: expressions and statements as jinja2's parser builds them.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/chat_template/value.h"

namespace wick::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Const,    // value
  Name,     // name
  GetAttr,  // a.name
  GetItem,  // a[b]
  Slice,    // a[b:c:d] (absent parts are null)
  List,     // [args...]
  Tuple,    // (args...)
  Dict,     // {keys[k]: args[k]}
  Not,      // not a
  Neg,      // -a
  Pos,      // +a
  Binary,   // a op b: + - * / // % ** ~
  And,      // a and b
  Or,       // a or b
  Compare,  // a ops[0] args[0] ops[1] args[1] ... (== != < > <= >= in notin)
  Cond,     // a if b else c (c null: undefined)
  Filter,   // a | name(args, kwargs); a null in a filter block
  Test,     // a is [not] name(args, kwargs)
  Call,     // a(args, kwargs)
};

struct Expr {
  ExprKind kind = ExprKind::Const;
  int line = 0;
  Value value;
  std::string name;  // Name, GetAttr, Filter, Test; Binary: the operator
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> args;
  std::vector<std::string> ops;  // Compare
  std::vector<ExprPtr> keys;     // Dict
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // Test: `is not`
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  Text,         // text
  Output,       // {{ expr }}
  If,           // if expr: body, else: else_body (elif chains nest in else_body)
  For,          // for targets in expr [if cond]: body, else: else_body
  Set,          // set targets = expr; or ns.attr = expr (attr non-empty)
  SetBlock,     // set target [| filters] ... endset
  Macro,        // macro name(params) body
  CallBlock,    // call(params) expr ... endcall
  FilterBlock,  // filter chain ... endfilter
  Break,
  Continue,
  Scope,  // a body in a new scope: {% generation %}, {% with a = x, ... %} (params)
};

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind = StmtKind::Text;
  int line = 0;
  std::string text;
  ExprPtr expr;  // Output, If, For (iterable), Set, CallBlock (the call), FilterBlock (chain)
  ExprPtr cond;  // For: the loop filter; SetBlock: the filter chain
  std::vector<std::string> targets;  // For, Set, SetBlock: names (several unpack a tuple)
  std::string attr;                  // Set: ns.attr
  std::string name;                  // Macro
  std::vector<Param> params;         // Macro, CallBlock
  Body body, else_body;
};

}  // namespace wick::jinja
