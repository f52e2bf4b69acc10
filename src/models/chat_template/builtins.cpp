#include "models/chat_template/builtins.h"

#include <cmath>
#include <ctime>

#include "models/chat_template/strings.h"

namespace wick::jinja {

void undefined_error(const Value& v) {
  throw RenderError(v.s.empty() ? std::string("undefined value used")
                                : "'" + v.s + "' is undefined");
}

namespace {

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  throw RenderError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                    type_name(b) + "'");
}

bool as_int(const Value& v, int64_t& out) {
  if (v.kind == Kind::Int) {
    out = v.i;
    return true;
  }
  if (v.kind == Kind::Bool) {
    out = v.b;
    return true;
  }
  return false;
}

double as_double(const Value& v) {
  return v.kind == Kind::Float ? v.f : v.kind == Kind::Int ? static_cast<double>(v.i) : v.b;
}

Value checked(bool overflow, const int64_t& r) {
  if (overflow) throw RenderError("integer overflow (wick's ints are 64-bit)");
  return Value::integer(r);
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  int64_t x = 0, y = 0, r = 0;
  if (as_int(a, x) && as_int(b, y)) {
    if (op == "+") return checked(__builtin_add_overflow(x, y, &r), r);
    if (op == "-") return checked(__builtin_sub_overflow(x, y, &r), r);
    if (op == "*") return checked(__builtin_mul_overflow(x, y, &r), r);
    if (op == "/") {
      if (y == 0) throw RenderError("division by zero");
      return Value::real(static_cast<double>(x) / static_cast<double>(y));
    }
    if (op == "//" || op == "%") {
      if (y == 0) throw RenderError("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) throw RenderError("integer overflow (wick's ints are 64-bit)");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::integer(op == "//" ? q : m);
    }
    if (op == "**") {
      if (y < 0) return Value::real(std::pow(static_cast<double>(x), static_cast<double>(y)));
      int64_t result = 1, base = x;
      bool overflow = false;
      for (int64_t e = y; e > 0;) {
        if (e & 1) overflow |= __builtin_mul_overflow(result, base, &result);
        e >>= 1;
        if (e) overflow |= __builtin_mul_overflow(base, base, &base);
        if (overflow) break;
      }
      return checked(overflow, result);
    }
  }
  double p = as_double(a), q = as_double(b);
  if (op == "+") return Value::real(p + q);
  if (op == "-") return Value::real(p - q);
  if (op == "*") return Value::real(p * q);
  if (op == "/") {
    if (q == 0) throw RenderError("float division by zero");
    return Value::real(p / q);
  }
  if (op == "//" || op == "%") {
    if (q == 0) throw RenderError("float modulo");
    double m = std::fmod(p, q);
    if (m != 0 && ((m < 0) != (q < 0))) m += q;
    return Value::real(op == "//" ? std::floor((p - m) / q) : m);
  }
  if (op == "**") {
    if (p == 0 && q < 0) throw RenderError("0.0 cannot be raised to a negative power");
    return Value::real(std::pow(p, q));
  }
  type_error(op, a, b);
}

Value repeat(const Value& seq, int64_t n, size_t max_size) {
  if (n < 0) n = 0;
  if (seq.kind == Kind::String) {
    if (!seq.s.empty() && static_cast<uint64_t>(n) > max_size / seq.s.size())
      throw RenderError("string repetition larger than " + std::to_string(max_size) + " bytes");
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    return Value::str(std::move(out), seq.markup);
  }
  if (!seq.list->empty() && static_cast<uint64_t>(n) > (max_size / 16) / seq.list->size())
    throw RenderError("list repetition too large");
  List out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::make_list(std::move(out), seq.tuple);
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b, size_t max_size) {
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    if (s.size() > max_size) throw RenderError("string larger than the output limit");
    return Value::str(std::move(s));
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.s.size() + b.s.size() > max_size)
        throw RenderError("string larger than the output limit");
      if (a.markup || b.markup)
        return Value::str((a.markup ? a.s : html_escape(a.s)) + (b.markup ? b.s : html_escape(b.s)),
                          true);
      return Value::str(a.s + b.s);
    }
    if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(out), a.tuple);
    }
    if (a.is_string())
      throw RenderError("can only concatenate str (not \"" + type_name(b) + "\") to str");
    if (a.is_list())
      throw RenderError("can only concatenate list (not \"" + type_name(b) + "\") to list");
    type_error(op, a, b);
  }
  if (op == "*") {
    int64_t n;
    if ((a.is_string() || a.is_list()) && as_int(b, n)) return repeat(a, n, max_size);
    if ((b.is_string() || b.is_list()) && as_int(a, n)) return repeat(b, n, max_size);
  }
  if (op == "%" && a.is_string()) return Value::str(percent_format(a.s, b), a.markup);
  type_error(op, a, b);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::Undefined:
      return false;
    case Kind::String:
      if (!item.is_string())
        throw RenderError("'in <string>' requires string as left operand, not " + type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case Kind::List:
      for (const Value& x : *container.list)
        if (equals(x, item)) return true;
      return false;
    case Kind::Dict:
      if (container.namespace_) break;
      return container.dict->find(dict_key(item)) != nullptr;
    default:
      break;
  }
  throw RenderError("argument of type '" + type_name(container) + "' is not iterable");
}

Value get_attribute(const Value& obj, const std::string& name) {
  if (obj.kind == Kind::Dict && obj.namespace_) {
    const Value* v = obj.dict->find(name);
    return v ? *v : Value::undefined(name);
  }
  if (std::optional<Value> m = method(obj, name)) return *m;
  if (obj.kind == Kind::Dict)
    if (const Value* v = obj.dict->find(name)) return *v;
  return Value::undefined(name);
}

Value get_item(const Value& obj, const Value& key) {
  int64_t index;
  if (obj.kind == Kind::Dict) {
    if (obj.namespace_) return key.is_string() ? get_attribute(obj, key.s) : Value::undefined();
    if (key.kind != Kind::Dict && key.kind != Kind::Undefined && !(key.is_list() && !key.tuple))
      if (const Value* v = obj.dict->find(dict_key(key))) return *v;
  } else if ((obj.kind == Kind::List || obj.kind == Kind::String) && as_int(key, index)) {
    if (obj.kind == Kind::List) {
      int64_t n = static_cast<int64_t>(obj.list->size());
      if (index < 0) index += n;
      if (index >= 0 && index < n) return (*obj.list)[static_cast<size_t>(index)];
    } else {
      std::u32string u = utf8_decode(obj.s);
      int64_t n = static_cast<int64_t>(u.size());
      if (index < 0) index += n;
      if (index >= 0 && index < n)
        return Value::str(
            utf8_encode(std::u32string_view(u).substr(static_cast<size_t>(index), 1)));
    }
  }
  if (key.is_string())
    if (std::optional<Value> m = method(obj, key.s)) return *m;
  return Value::undefined(key.is_string() ? key.s : repr(key));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  // jinja2 slices with Python's own subscription (no sandbox fallback to Undefined).
  if (obj.kind == Kind::Dict && !obj.namespace_) throw RenderError("unhashable type: 'slice'");
  if (obj.kind != Kind::List && obj.kind != Kind::String)
    throw RenderError("'" + type_name(obj) + "' object is not subscriptable");
  auto index = [](const Value& v, int64_t& out) {
    if (v.is_none()) return false;
    if (!as_int(v, out))
      throw RenderError("slice indices must be integers or None or have an __index__ method");
    return true;
  };
  int64_t st = 1, b = 0, e = 0;
  if (index(step, st) && st == 0) throw RenderError("slice step cannot be zero");
  std::u32string u;
  int64_t n;
  if (obj.kind == Kind::String) {
    u = utf8_decode(obj.s);
    n = static_cast<int64_t>(u.size());
  } else {
    n = static_cast<int64_t>(obj.list->size());
  }
  int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? n : n - 1;
  auto adjust = [&](const Value& v, int64_t dflt) {
    int64_t x;
    if (!index(v, x)) return dflt;
    if (x < 0) {
      x += n;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  b = adjust(start, st > 0 ? lower : upper);
  e = adjust(stop, st > 0 ? upper : lower);
  if (obj.kind == Kind::String) {
    std::u32string out;
    for (int64_t k = b; st > 0 ? k < e : k > e;) {
      out.push_back(u[static_cast<size_t>(k)]);
      if (__builtin_add_overflow(k, st, &k)) break;
    }
    return Value::str(utf8_encode(out), obj.markup);
  }
  List out;
  for (int64_t k = b; st > 0 ? k < e : k > e;) {
    out.push_back((*obj.list)[static_cast<size_t>(k)]);
    if (__builtin_add_overflow(k, st, &k)) break;
  }
  return Value::make_list(std::move(out), obj.tuple);
}

bool apply_test(Renderer& r, const std::string& name, const Value& v, const CallArgs& args) {
  (void)r;
  const Value* arg = args.get(0, "value");
  auto need_arg = [&]() -> const Value& {
    if (!arg) throw RenderError("test '" + name + "' needs an argument");
    return *arg;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind == Kind::Bool;
  if (name == "true") return v.kind == Kind::Bool && v.b;
  if (name == "false") return v.kind == Kind::Bool && !v.b;
  if (name == "integer") return v.kind == Kind::Int;
  if (name == "float") return v.kind == Kind::Float;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "callable") return v.kind == Kind::Callable;
  if (name == "escaped") return v.is_string() && v.markup;
  if (name == "lower") return v.is_string() && py_lower(v.s) == v.s;
  if (name == "upper") return v.is_string() && py_upper(v.s) == v.s;
  if (name == "odd" || name == "even" || name == "divisibleby") {
    // jinja2: value % 2 == 1, value % 2 == 0, value % num == 0, with Python's %.
    Value d = name == "divisibleby" ? need_arg() : Value::integer(2);
    Value m = binary_op("%", v, d, SIZE_MAX);
    return equals(m, Value::integer(name == "odd" ? 1 : 0));
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, need_arg());
  if (name == "ne" || name == "!=") return !equals(v, need_arg());
  if (name == "sameas") {
    const Value& o = need_arg();
    if (v.kind != o.kind) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.kind == Kind::Bool) return v.b == o.b;
    if (v.kind == Kind::Int) return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython's cache
    if (v.is_list()) return v.list == o.list;
    if (v.kind == Kind::Dict) return v.dict == o.dict;
    return false;
  }
  if (name == "in") return contains(need_arg(), v);
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, need_arg()) < 0;
  if (name == "le" || name == "<=") return compare(v, need_arg()) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, need_arg()) > 0;
  if (name == "ge" || name == ">=") return compare(v, need_arg()) >= 0;
  throw RenderError("unknown test '" + name + "'");
}

void add_globals(Renderer& r, Dict& globals) {
  globals.set("range", Value::callable("range", [](const CallArgs& a) {
                int64_t start = 0, stop = 0, step = 1;
                auto arg = [&](size_t k) {
                  int64_t x;
                  if (!as_int(a.pos[k], x))
                    throw RenderError("range: '" + type_name(a.pos[k]) +
                                      "' object cannot be interpreted as an integer");
                  return x;
                };
                if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty())
                  throw RenderError("range expects 1 to 3 positional arguments");
                if (a.pos.size() == 1) {
                  stop = arg(0);
                } else {
                  start = arg(0);
                  stop = arg(1);
                  if (a.pos.size() == 3) step = arg(2);
                }
                if (step == 0) throw RenderError("range() arg 3 must not be zero");
                long double count = std::ceil((static_cast<long double>(stop) - start) / step);
                if (count > 100000)
                  throw RenderError(
                      "Range too big. The sandbox blocks ranges larger than "
                      "MAX_RANGE (100000).");
                List out;
                for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
                  out.push_back(Value::integer(k));
                  if (__builtin_add_overflow(k, step, &k)) break;
                }
                Value list = Value::make_list(std::move(out));
                // Printed as Python prints a range object.
                list.s = "range(" + std::to_string(start) + ", " + std::to_string(stop) +
                         (step != 1 ? ", " + std::to_string(step) : "") + ")";
                return list;
              }));
  Renderer* rp = &r;
  auto make_dict = [rp](const CallArgs& a, bool ns) {
    Dict d;
    for (const Value& p : a.pos) {
      if (!p.is_dict()) throw RenderError("namespace/dict takes a mapping or keywords");
      for (const auto& [k, v] : p.dict->items) d.set(k, v);
    }
    for (const auto& [k, v] : a.kw) d.set(k, v);
    return ns ? rp->make_namespace(std::move(d)) : Value::make_dict(std::move(d));
  };
  globals.set("namespace", Value::callable("namespace", [make_dict](const CallArgs& a) {
                return make_dict(a, true);
              }));
  globals.set("dict", Value::callable(
                          "dict", [make_dict](const CallArgs& a) { return make_dict(a, false); }));
  globals.set("raise_exception", Value::callable("raise_exception", [](const CallArgs& a) -> Value {
                const Value* msg = a.get(0, "message");
                throw RenderError("raise_exception: " + (msg ? to_str(*msg) : std::string()));
              }));
  globals.set("strftime_now", Value::callable("strftime_now", [rp](const CallArgs& a) {
                const Value* fmt = a.get(0, "format");
                if (!fmt || !fmt->is_string())
                  throw RenderError("strftime_now expects a format string");
                std::time_t t = rp->now() ? *rp->now() : std::time(nullptr);
                std::tm tm{};
                if (rp->now()) {
                  gmtime_r(&t, &tm);
                } else {
                  localtime_r(&t, &tm);
                }
                if (fmt->s.size() > 256) throw RenderError("strftime_now: format too long");
                char buf[1024];
                size_t n = fmt->s.empty() ? 0 : std::strftime(buf, sizeof buf, fmt->s.c_str(), &tm);
                return Value::str(std::string(buf, n));
              }));
}

}  // namespace wick::jinja
