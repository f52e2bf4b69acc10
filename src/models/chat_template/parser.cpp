#include "models/chat_template/parser.h"

#include <algorithm>

namespace wick::jinja {
namespace {

constexpr int kMaxDepth = 200;

// jinja2 rejects a template naming a filter or test it does not have when it compiles it, even in
// a branch never taken; the ones it has and wick does not implement fail when they run.
bool known_filter(const std::string& n) {
  static const char* const kNames[] = {
      "abs",    "attr",       "batch",       "capitalize", "center",   "count",
      "d",      "default",    "dictsort",    "e",          "escape",   "filesizeformat",
      "first",  "float",      "forceescape", "format",     "groupby",  "indent",
      "int",    "items",      "join",        "last",       "length",   "list",
      "lower",  "map",        "max",         "min",        "pprint",   "random",
      "reject", "rejectattr", "replace",     "reverse",    "round",    "safe",
      "select", "selectattr", "slice",       "sort",       "string",   "striptags",
      "sum",    "title",      "tojson",      "trim",       "truncate", "unique",
      "upper",  "urlencode",  "urlize",      "wordcount",  "wordwrap", "xmlattr"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

bool known_test(const std::string& n) {
  static const char* const kNames[] = {
      "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto",     "escaped",
      "even",    "false",    "filter",   "float",       "ge",       "greaterthan", "gt",
      "in",      "integer",  "iterable", "le",          "lessthan", "lower",       "lt",
      "mapping", "ne",       "none",     "number",      "odd",      "sameas",      "sequence",
      "string",  "test",     "true",     "undefined",   "upper",    "==",          "!=",
      "<",       "<=",       ">",        ">="};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (cur().type != Tok::Eof) fail("unexpected tag");
    return body;
  }

 private:
  // --- token helpers ---
  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  Token next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++p_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++p_;
    return true;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw ParseError("chat template line " + std::to_string(cur().line) + ": " + what + " (at " +
                     describe(cur()) + ")");
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Text:
        return "text";
      case Tok::VarBegin:
        return "'{{'";
      case Tok::VarEnd:
        return "'}}'";
      case Tok::BlockBegin:
        return "'{%'";
      case Tok::BlockEnd:
        return "'%}'";
      case Tok::Name:
        return "'" + t.text + "'";
      case Tok::String:
        return "a string";
      case Tok::Int:
      case Tok::Float:
        return "a number";
      case Tok::Op:
        return "'" + t.text + "'";
      case Tok::Eof:
        return "the end of the template";
    }
    return "?";
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "'");
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail("expected a name");
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail("expected '%}'");
    ++p_;
  }
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxDepth) p_.fail("template nested deeper than 200");
    }
    ~DepthGuard() { --p_.depth_; }
    Parser& p_;
  };

  ExprPtr node(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // --- statements ---
  // Statements up to one of the end tags `ends` (left unconsumed: the BlockBegin stays current).
  Body parse_body(const std::vector<std::string>& ends) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (!ends.empty()) fail("missing '" + ends.back() + "'");
        return body;
      }
      if (t.type == Tok::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        ++p_;
      } else if (t.type == Tok::VarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->line = t.line;
        ++p_;
        s->expr = parse_tuple(true);
        if (cur().type != Tok::VarEnd) fail("expected '}}'");
        ++p_;
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        const Token& kw = peek();
        if (kw.type == Tok::Name && std::find(ends.begin(), ends.end(), kw.text) != ends.end())
          return body;
        ++p_;
        body.push_back(parse_statement());
      } else {
        fail("unexpected token");
      }
    }
  }

  // After `{% kw`: consumes the closing tag `{% kw %}` of a block.
  void end_tag(const char* kw) {
    ++p_;  // BlockBegin
    if (!skip_name(kw)) fail(std::string("expected '") + kw + "'");
    expect_block_end();
  }

  StmtPtr parse_statement() {
    if (cur().type != Tok::Name) fail("expected a statement name");
    Token kw = next();
    auto s = std::make_unique<Stmt>();
    s->line = kw.line;
    const std::string& k = kw.text;
    if (k == "if") {
      parse_if(*s);
    } else if (k == "for") {
      s->kind = StmtKind::For;
      s->targets = parse_targets();
      if (!skip_name("in")) fail("expected 'in'");
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->cond = parse_expression(true);
      if (is_name("recursive")) fail("recursive loops are not supported");
      expect_block_end();
      s->body = parse_body({"else", "endfor"});
      if (peek().text == "else") {
        end_tag("else");
        s->else_body = parse_body({"endfor"});
      }
      end_tag("endfor");
    } else if (k == "set") {
      parse_set(*s);
    } else if (k == "macro") {
      s->kind = StmtKind::Macro;
      s->name = expect_name();
      s->params = parse_params();
      expect_block_end();
      s->body = parse_body({"endmacro"});
      end_tag("endmacro");
    } else if (k == "call") {
      s->kind = StmtKind::CallBlock;
      if (is_op("(")) s->params = parse_params();
      s->expr = parse_expression(true);
      if (s->expr->kind != ExprKind::Call) fail("expected a call in 'call'");
      expect_block_end();
      s->body = parse_body({"endcall"});
      end_tag("endcall");
    } else if (k == "filter") {
      s->kind = StmtKind::FilterBlock;
      s->expr = parse_filter_chain(nullptr, true);
      expect_block_end();
      s->body = parse_body({"endfilter"});
      end_tag("endfilter");
    } else if (k == "break" || k == "continue") {
      s->kind = k == "break" ? StmtKind::Break : StmtKind::Continue;
      expect_block_end();
    } else if (k == "with") {
      s->kind = StmtKind::Scope;
      while (cur().type != Tok::BlockEnd) {
        if (!s->params.empty()) expect_op(",");
        Param p;
        p.name = expect_name();
        expect_op("=");
        p.default_value = parse_expression(true);
        s->params.push_back(std::move(p));
      }
      expect_block_end();
      s->body = parse_body({"endwith"});
      end_tag("endwith");
    } else if (k == "generation") {
      s->kind = StmtKind::Scope;
      expect_block_end();
      s->body = parse_body({"endgeneration"});
      end_tag("endgeneration");
    } else {
      --p_;
      fail("unsupported tag '" + k + "'");
    }
    return s;
  }

  void parse_if(Stmt& s) {
    s.kind = StmtKind::If;
    s.expr = parse_tuple(false);
    expect_block_end();
    s.body = parse_body({"elif", "else", "endif"});
    const std::string which = peek().text;
    if (which == "elif") {
      ++p_;  // BlockBegin; `elif` is read as a nested `if`
      ++p_;
      auto inner = std::make_unique<Stmt>();
      inner->line = t_[p_ - 1].line;
      parse_if(*inner);
      s.else_body.push_back(std::move(inner));
      return;  // the nested if consumed the endif
    }
    if (which == "else") {
      end_tag("else");
      s.else_body = parse_body({"endif"});
    }
    end_tag("endif");
  }

  void parse_set(Stmt& s) {
    if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      s.kind = StmtKind::Set;
      s.targets.push_back(next().text);
      ++p_;
      s.attr = expect_name();
      expect_op("=");
      s.expr = parse_tuple(true);
      expect_block_end();
      return;
    }
    s.targets = parse_targets();
    if (skip_op("=")) {
      s.kind = StmtKind::Set;
      s.expr = parse_tuple(true);
      expect_block_end();
      return;
    }
    if (s.targets.size() != 1) fail("a block set takes one name");
    s.kind = StmtKind::SetBlock;
    if (is_op("|")) s.cond = parse_filter_chain(nullptr, false);
    expect_block_end();
    s.body = parse_body({"endset"});
    end_tag("endset");
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    do {
      if (paren && is_op(")")) break;
      names.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  std::vector<Param> parse_params() {
    std::vector<Param> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      Param p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression(true);
      params.push_back(std::move(p));
    }
    ++p_;
    return params;
  }

  // --- expressions ---
  bool tuple_end() const {
    return cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")") ||
           cur().type == Tok::Eof;
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens = false) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (tuple_end()) break;
      items.push_back(with_condexpr ? parse_expression(true) : parse_or());
      if (!is_op(",")) break;
    }
    if (!comma && items.size() == 1) return std::move(items[0]);
    if (items.empty() && !explicit_parens) fail("expected an expression");
    auto e = node(ExprKind::Tuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto c = node(ExprKind::Cond, cur().line);
      ++p_;
      c->b = parse_or();
      if (skip_name("else")) c->c = parse_expression(true);
      c->a = std::move(e);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      auto o = node(ExprKind::Or, cur().line);
      ++p_;
      o->a = std::move(e);
      o->b = parse_and();
      e = std::move(o);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      auto o = node(ExprKind::And, cur().line);
      ++p_;
      o->a = std::move(e);
      o->b = parse_not();
      e = std::move(o);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto n = node(ExprKind::Not, cur().line);
      ++p_;
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr e = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        p_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(ExprKind::Compare, line);
        cmp->a = std::move(e);
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }

  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = node(ExprKind::Binary, line);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      Token op = next();
      e = binary(op.text, std::move(e), parse_concat(), op.line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      Token op = next();
      e = binary("~", std::move(e), parse_math2(), op.line);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      Token op = next();
      e = binary(op.text, std::move(e), parse_pow(), op.line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      Token op = next();
      e = binary("**", std::move(e), parse_unary(true), op.line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      Token op = next();
      e = node(op.text == "-" ? ExprKind::Neg : ExprKind::Pos, op.line);
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == Tok::Name) {
      std::string n = next().text;
      if (n == "true" || n == "True") return konst(Value::boolean(true), line);
      if (n == "false" || n == "False") return konst(Value::boolean(false), line);
      if (n == "none" || n == "None") return konst(Value::none(), line);
      auto e = node(ExprKind::Name, line);
      e->name = n;
      return e;
    }
    if (t.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += next().text;
      return konst(Value::str(s), line);
    }
    if (t.type == Tok::Int) return konst(Value::integer(next().i), line);
    if (t.type == Tok::Float) return konst(Value::real(next().f), line);
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = node(ExprKind::List, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      ++p_;
      return e;
    }
    if (skip_op("{")) {
      auto e = node(ExprKind::Dict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->keys.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      ++p_;
      return e;
    }
    fail("expected an expression");
  }

  ExprPtr konst(Value v, int line) {
    auto e = node(ExprKind::Const, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        int line = next().line;
        if (cur().type == Tok::Int) {
          auto g = node(ExprKind::GetItem, line);
          g->a = std::move(e);
          g->b = konst(Value::integer(next().i), line);
          e = std::move(g);
        } else {
          auto g = node(ExprKind::GetAttr, line);
          g->a = std::move(e);
          g->name = expect_name();
          e = std::move(g);
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target) {
    int line = next().line;  // '['
    std::vector<ExprPtr> parts;
    while (!is_op("]")) {
      if (!parts.empty()) expect_op(",");
      if (is_op("]")) break;
      ExprPtr start, stop, step;
      bool slice = false;
      if (!is_op(":")) start = parse_expression(true);
      if (skip_op(":")) {
        slice = true;
        if (!is_op("]") && !is_op(",") && !is_op(":")) stop = parse_expression(true);
        if (skip_op(":") && !is_op("]") && !is_op(",")) step = parse_expression(true);
      }
      if (slice) {
        auto s = node(ExprKind::Slice, line);
        s->b = std::move(start);
        s->c = std::move(stop);
        s->d = std::move(step);
        parts.push_back(std::move(s));
      } else {
        parts.push_back(std::move(start));
      }
    }
    ++p_;
    if (parts.empty()) fail("expected a subscript");
    ExprPtr index;
    if (parts.size() == 1) {
      index = std::move(parts[0]);
    } else {
      for (const ExprPtr& part : parts)
        if (part->kind == ExprKind::Slice)
          fail("a slice inside a tuple subscript is not supported");
      index = node(ExprKind::Tuple, line);
      index->args = std::move(parts);
    }
    if (index->kind == ExprKind::Slice) {
      index->a = std::move(target);
      return index;
    }
    auto g = node(ExprKind::GetItem, line);
    g->a = std::move(target);
    g->b = std::move(index);
    return g;
  }

  // `(args)` into e->args / e->kwargs.
  void parse_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (!e.args.empty() || !e.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string key = next().text;
        ++p_;
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("positional argument after a keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    ++p_;
  }

  ExprPtr parse_call(ExprPtr target) {
    auto c = node(ExprKind::Call, cur().line);
    c->a = std::move(target);
    parse_args(*c);
    return c;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter_chain(std::move(e), false);
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // `| f(args) | g ...`; with `start_without_bar` the first filter has no bar (filter blocks).
  ExprPtr parse_filter_chain(ExprPtr e, bool start_without_bar) {
    bool first = true;
    while ((first && start_without_bar) || is_op("|")) {
      if (!(first && start_without_bar)) ++p_;
      first = false;
      auto f = node(ExprKind::Filter, cur().line);
      f->name = expect_name();
      if (!known_filter(f->name)) fail("no filter named '" + f->name + "'");
      if (is_op("(")) parse_args(*f);
      f->a = std::move(e);
      e = std::move(f);
    }
    return e;
  }

  ExprPtr parse_test(ExprPtr e) {
    auto t = node(ExprKind::Test, cur().line);
    ++p_;  // is
    t->negated = skip_name("not");
    t->name = expect_name();
    if (!known_test(t->name)) fail("no test named '" + t->name + "'");
    if (is_op("(")) {
      parse_args(*t);
    } else if ((cur().type == Tok::Name && cur().text != "else" && cur().text != "or" &&
                cur().text != "and") ||
               cur().type == Tok::String || cur().type == Tok::Int || cur().type == Tok::Float ||
               is_op("[") || is_op("{")) {
      if (is_name("is")) fail("expected a test argument");
      ExprPtr arg = parse_primary();
      t->args.push_back(parse_postfix(std::move(arg)));
    }
    t->a = std::move(e);
    return t;
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(std::string_view source) {
  return Parser(lex(source)).parse_all();
}

}  // namespace wick::jinja
