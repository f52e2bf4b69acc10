#include "models/chat_template/eval.h"

#include "models/chat_template/builtins.h"

namespace wick::jinja {

Renderer::Renderer(const Body& body, Dict context, Limits limits, std::optional<std::time_t> now)
    : body_(body), limits_(limits), now_(now) {
  add_globals(*this, globals_);
  for (auto& [k, v] : context.items) globals_.set(k, std::move(v));
  scope_ = std::make_shared<Scope>();
}

Renderer::~Renderer() {
  for (auto& d : namespaces_) d->items.clear();
  for (auto& s : closures_) s->vars.items.clear();
}

Value Renderer::make_namespace(Dict d) {
  Value v = Value::make_dict(std::move(d));
  v.namespace_ = true;
  namespaces_.push_back(v.dict);
  return v;
}

std::string Renderer::render() {
  std::string out;
  exec(body_, out);
  return out;
}

void Renderer::step(uint64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps)
    throw RenderError("rendering takes more than " + std::to_string(limits_.max_steps) + " steps");
}

void Renderer::charge(const Value& v) {
  if (v.kind == Kind::String) step(v.s.size() / 256);
  if (v.kind == Kind::List) step(v.list->size() / 8);
  if (v.kind == Kind::Dict) step(v.dict->items.size() / 8);
}

void Renderer::append(std::string& out, const std::string& text) {
  if (out.size() + text.size() > limits_.max_output)
    throw RenderError("output larger than " + std::to_string(limits_.max_output) + " bytes");
  out += text;
}

Value Renderer::lookup(const std::string& name) const {
  for (const Scope* s = scope_.get(); s; s = s->parent.get())
    if (const Value* v = s->vars.find(name)) return *v;
  if (const Value* v = globals_.find(name)) return *v;
  return Value::undefined(name);
}

Renderer::Flow Renderer::exec(const Body& body, std::string& out) {
  for (const StmtPtr& s : body) {
    Flow f = exec_one(*s, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec_one(const Stmt& s, std::string& out) {
  try {
    return exec_stmt(s, out);
  } catch (const RenderError& e) {
    // The innermost statement names the line; errors already located pass through.
    throw ChatTemplateError("chat template line " + std::to_string(s.line) + ": " + e.what());
  }
}

Renderer::Flow Renderer::exec_stmt(const Stmt& s, std::string& out) {
  step();
  line_ = s.line;
  switch (s.kind) {
    case StmtKind::Text:
      append(out, s.text);
      return Flow::Normal;
    case StmtKind::Output:
      append(out, to_str(eval(*s.expr)));
      return Flow::Normal;
    case StmtKind::If:
      return exec(truthy(eval(*s.expr)) ? s.body : s.else_body, out);
    case StmtKind::For:
      exec_for(s, out);
      return Flow::Normal;
    case StmtKind::Set:
      exec_set(s);
      return Flow::Normal;
    case StmtKind::SetBlock: {
      auto saved = scope_;
      scope_ = std::make_shared<Scope>(Scope{{}, saved});
      std::string text;
      exec(s.body, text);
      scope_ = saved;
      Value v = Value::str(std::move(text));
      if (s.cond) v = apply_filters(*s.cond, v);
      scope_->vars.set(s.targets[0], std::move(v));
      return Flow::Normal;
    }
    case StmtKind::Macro:
      scope_->vars.set(s.name, make_macro(s, scope_, false));
      return Flow::Normal;
    case StmtKind::CallBlock: {
      const Expr& call = *s.expr;
      Value callee = eval(*call.a);
      if (callee.is_undefined()) undefined_error(callee);
      CallArgs args;
      eval_args(call, args);
      args.kw.emplace_back("caller", make_macro(s, scope_, true));
      append(out, to_str(this->call(callee, args)));
      return Flow::Normal;
    }
    case StmtKind::FilterBlock: {
      auto saved = scope_;
      scope_ = std::make_shared<Scope>(Scope{{}, saved});
      std::string text;
      exec(s.body, text);
      scope_ = saved;
      append(out, to_str(apply_filters(*s.expr, Value::str(std::move(text)))));
      return Flow::Normal;
    }
    case StmtKind::Break:
      return Flow::Break;
    case StmtKind::Continue:
      return Flow::Continue;
    case StmtKind::Scope: {
      Dict bound;  // `with` values, read in the enclosing scope
      for (const Param& p : s.params) bound.set(p.name, eval(*p.default_value));
      auto saved = scope_;
      scope_ = std::make_shared<Scope>(Scope{std::move(bound), saved});
      exec(s.body, out);
      scope_ = saved;
      return Flow::Normal;
    }
  }
  return Flow::Normal;
}

namespace {

void bind_targets(Dict& vars, const std::vector<std::string>& targets, const Value& item) {
  if (targets.size() == 1) {
    vars.set(targets[0], item);
    return;
  }
  List parts = iterate(item);
  if (parts.size() != targets.size())
    throw RenderError(
        parts.size() < targets.size()
            ? "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                  std::to_string(parts.size()) + ")"
            : "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
  for (size_t k = 0; k < targets.size(); ++k) vars.set(targets[k], parts[k]);
}

}  // namespace

void Renderer::exec_for(const Stmt& s, std::string& out) {
  Value seq = eval(*s.expr);
  if (seq.kind == Kind::Dict && seq.namespace_)
    throw RenderError("'Namespace' object is not iterable");
  List items = iterate(seq);
  auto outer = scope_;
  if (s.cond) {
    List kept;
    for (const Value& item : items) {
      step();
      scope_ = std::make_shared<Scope>(Scope{{}, outer});
      bind_targets(scope_->vars, s.targets, item);
      bool keep = truthy(eval(*s.cond));
      scope_ = outer;
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < n; ++k) {
    step();
    scope_ = std::make_shared<Scope>(Scope{{}, outer});
    bind_targets(scope_->vars, s.targets, items[static_cast<size_t>(k)]);
    Dict loop;
    loop.set("index", Value::integer(k + 1));
    loop.set("index0", Value::integer(k));
    loop.set("revindex", Value::integer(n - k));
    loop.set("revindex0", Value::integer(n - k - 1));
    loop.set("first", Value::boolean(k == 0));
    loop.set("last", Value::boolean(k == n - 1));
    loop.set("length", Value::integer(n));
    loop.set("depth", Value::integer(1));
    loop.set("depth0", Value::integer(0));
    loop.set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("previtem"));
    loop.set("nextitem",
             k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined("nextitem"));
    loop.set("cycle", Value::callable("cycle", [k](const CallArgs& a) {
               if (a.pos.empty()) throw RenderError("no items for cycling given");
               return a.pos[static_cast<size_t>(k) % a.pos.size()];
             }));
    Value lv = Value::make_dict(std::move(loop));
    lv.namespace_ = true;
    lv.loop_object = true;
    scope_->vars.set("loop", std::move(lv));
    Flow f = exec(s.body, out);
    scope_ = outer;
    if (f == Flow::Break) break;
  }
  if (n == 0 && !s.else_body.empty()) {
    scope_ = std::make_shared<Scope>(Scope{{}, outer});
    exec(s.else_body, out);
    scope_ = outer;
  }
}

void Renderer::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  if (!s.attr.empty()) {
    Value ns = lookup(s.targets[0]);
    if (ns.kind != Kind::Dict || !ns.namespace_ || ns.loop_object)
      throw RenderError("can't assign attribute '" + s.attr + "' on non-namespace object '" +
                        s.targets[0] + "'");
    ns.dict->set(s.attr, std::move(v));
    return;
  }
  bind_targets(scope_->vars, s.targets, v);
}

Value Renderer::make_macro(const Stmt& s, std::shared_ptr<Scope> closure, bool is_caller) {
  const Stmt* sp = &s;
  std::string name = is_caller ? "caller" : s.name;
  closures_.push_back(closure);
  std::weak_ptr<Scope> weak = closure;
  return Value::callable(name, [this, sp, weak, name](const CallArgs& args) -> Value {
    std::shared_ptr<Scope> closure = weak.lock();
    if (!closure) throw RenderError("macro '" + name + "' called after its scope ended");
    if (call_depth_ >= limits_.max_call_depth)
      throw RenderError("macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
    const auto& params = sp->params;
    if (args.pos.size() > params.size())
      throw RenderError("macro '" + name + "' takes not more than " +
                        std::to_string(params.size()) + " argument(s)");
    auto frame = std::make_shared<Scope>(Scope{{}, closure});
    for (const auto& [k, v] : args.kw) {
      bool known = k == "caller";
      for (const Param& p : params) known = known || p.name == k;
      if (!known) throw RenderError("macro '" + name + "' takes no keyword argument '" + k + "'");
      if (k == "caller") frame->vars.set("caller", v);
    }
    auto saved = scope_;
    scope_ = frame;
    for (size_t k = 0; k < params.size(); ++k) {
      const Param& p = params[k];
      const Value* given = args.get(k, p.name);
      if (k < args.pos.size()) given = &args.pos[k];
      if (given) {
        frame->vars.set(p.name, *given);
      } else if (p.default_value) {
        frame->vars.set(p.name, eval(*p.default_value));
      } else {
        frame->vars.set(p.name, Value::undefined(p.name));
      }
    }
    ++call_depth_;
    std::string out;
    exec(sp->body, out);
    --call_depth_;
    scope_ = saved;
    return Value::str(std::move(out));
  });
}

Value Renderer::call(const Value& fn, const CallArgs& args) {
  if (fn.kind == Kind::Undefined) undefined_error(fn);
  if (fn.kind != Kind::Callable)
    throw RenderError("'" + type_name(fn) + "' object is not callable");
  step();
  Value out = fn.fn->fn(args);
  charge(out);
  return out;
}

void Renderer::eval_args(const Expr& e, CallArgs& args) {
  for (const ExprPtr& a : e.args) args.pos.push_back(eval(*a));
  for (const auto& [k, a] : e.kwargs) args.kw.emplace_back(k, eval(*a));
}

Value Renderer::apply_filters(const Expr& f, Value input) {
  Value v = !f.a                            ? std::move(input)
            : f.a->kind == ExprKind::Filter ? apply_filters(*f.a, std::move(input))
                                            : eval(*f.a);
  CallArgs args;
  eval_args(f, args);
  step();
  charge(v);
  Value out = apply_filter(*this, f.name, v, args);
  charge(out);
  return out;
}

Value Renderer::eval_compare(const Expr& e) {
  Value left = eval(*e.a);
  for (size_t k = 0; k < e.ops.size(); ++k) {
    Value right = eval(*e.args[k]);
    const std::string& op = e.ops[k];
    bool ok;
    if (op == "==") {
      ok = equals(left, right);
    } else if (op == "!=") {
      ok = !equals(left, right);
    } else if (op == "in" || op == "notin") {
      charge(right);
      ok = contains(right, left) == (op == "in");
    } else {
      if (left.is_undefined()) undefined_error(left);
      if (right.is_undefined()) undefined_error(right);
      int c = compare(left, right);
      ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
    }
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Renderer::eval(const Expr& e) {
  step();
  switch (e.kind) {
    case ExprKind::Const:
      return e.value;
    case ExprKind::Name:
      return lookup(e.name);
    case ExprKind::GetAttr: {
      Value obj = eval(*e.a);
      if (obj.is_undefined()) undefined_error(obj);
      return get_attribute(obj, e.name);
    }
    case ExprKind::GetItem: {
      Value obj = eval(*e.a);
      if (obj.is_undefined()) undefined_error(obj);
      return get_item(obj, eval(*e.b));
    }
    case ExprKind::Slice: {
      if (!e.a) throw RenderError("a slice outside a subscript");
      Value obj = eval(*e.a);
      if (obj.is_undefined()) undefined_error(obj);
      Value none = Value::none();
      return get_slice(obj, e.b ? eval(*e.b) : none, e.c ? eval(*e.c) : none,
                       e.d ? eval(*e.d) : none);
    }
    case ExprKind::List:
    case ExprKind::Tuple: {
      List items;
      for (const ExprPtr& a : e.args) items.push_back(eval(*a));
      return Value::make_list(std::move(items), e.kind == ExprKind::Tuple);
    }
    case ExprKind::Dict: {
      Dict d;
      for (size_t k = 0; k < e.keys.size(); ++k) {
        Value key = eval(*e.keys[k]);
        d.set(dict_key(key), eval(*e.args[k]));
      }
      return Value::make_dict(std::move(d));
    }
    case ExprKind::Not:
      return Value::boolean(!truthy(eval(*e.a)));
    case ExprKind::Neg:
    case ExprKind::Pos: {
      Value v = eval(*e.a);
      if (v.is_undefined()) undefined_error(v);
      if (v.kind == Kind::Bool) v = Value::integer(v.b);
      if (v.kind == Kind::Int) {
        if (e.kind == ExprKind::Neg && v.i == INT64_MIN) throw RenderError("integer overflow");
        return e.kind == ExprKind::Neg ? Value::integer(-v.i) : v;
      }
      if (v.kind == Kind::Float) return e.kind == ExprKind::Neg ? Value::real(-v.f) : v;
      throw RenderError("bad operand type for unary " +
                        std::string(e.kind == ExprKind::Neg ? "-" : "+") + ": '" + type_name(v) +
                        "'");
    }
    case ExprKind::Binary: {
      Value a = eval(*e.a);
      Value b = eval(*e.b);
      Value out = binary_op(e.name, a, b, limits_.max_output);
      charge(out);
      return out;
    }
    case ExprKind::And: {
      Value a = eval(*e.a);
      return truthy(a) ? eval(*e.b) : a;
    }
    case ExprKind::Or: {
      Value a = eval(*e.a);
      return truthy(a) ? a : eval(*e.b);
    }
    case ExprKind::Compare:
      return eval_compare(e);
    case ExprKind::Cond:
      if (truthy(eval(*e.b))) return eval(*e.a);
      return e.c ? eval(*e.c) : Value::undefined();
    case ExprKind::Filter:
      return apply_filters(e, Value::undefined());
    case ExprKind::Test: {
      Value v = eval(*e.a);
      CallArgs args;
      eval_args(e, args);
      return Value::boolean(apply_test(*this, e.name, v, args) != e.negated);
    }
    case ExprKind::Call: {
      Value callee = eval(*e.a);
      CallArgs args;
      eval_args(e, args);
      return call(callee, args);
    }
  }
  return Value::undefined();
}

}  // namespace wick::jinja
