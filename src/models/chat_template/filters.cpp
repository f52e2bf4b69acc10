// Jinja's built-in filters as jinja2 3.1 defines them, and transformers' tojson.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "models/chat_template/builtins.h"
#include "models/chat_template/strings.h"

namespace wick::jinja {
namespace {

const Value* arg(const CallArgs& a, size_t k, const char* name) {
  return a.get(k, name);
}

bool arg_bool(const CallArgs& a, size_t k, const char* name, bool dflt) {
  const Value* v = arg(a, k, name);
  return v ? truthy(*v) : dflt;
}

std::string arg_string(const CallArgs& a, size_t k, const char* name, const std::string& dflt) {
  const Value* v = arg(a, k, name);
  return v ? to_str(*v) : dflt;
}

// Jinja's make_attrgetter: "a.b.0" looks up items one part at a time.
Value attr_get(const Value& item, const std::string& path) {
  Value v = item;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits =
        !part.empty() && part.size() < 18 &&
        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (v.is_undefined()) undefined_error(v);
    v = get_item(v, digits ? Value::integer(std::stoll(part)) : Value::str(part));
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::str(py_lower(v.s));
  return v;
}

std::string ensure_ascii(const std::string& s) {
  std::string out;
  for (char32_t c : utf8_decode(s)) {
    char buf[16];
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x10000) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      char32_t v = c - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                    static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
      out += buf;
    }
  }
  return out;
}

Value tojson(const Value& v, const CallArgs& a) {
  bool ascii = arg_bool(a, 0, "ensure_ascii", false);
  int indent = -1;
  if (const Value* ind = arg(a, 1, "indent"); ind && !ind->is_none()) {
    if (ind->kind != Kind::Int) throw RenderError("tojson: indent must be an integer");
    indent = static_cast<int>(std::clamp<int64_t>(ind->i, 0, 64));
  }
  std::string isep = indent < 0 ? ", " : ",", ksep = ": ";
  if (const Value* sep = arg(a, 2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->list->size() != 2 || !(*sep->list)[0].is_string() ||
        !(*sep->list)[1].is_string())
      throw RenderError("tojson: separators must be a pair of strings");
    isep = (*sep->list)[0].s;
    ksep = (*sep->list)[1].s;
  }
  std::string out = to_json(v, indent, isep, ksep, arg_bool(a, 3, "sort_keys", false));
  return Value::str(ascii ? ensure_ascii(out) : out);
}

std::string jinja_title(const std::string& s) {
  std::u32string u = utf8_decode(s);
  auto sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
  };
  std::u32string out;
  for (size_t k = 0; k < u.size(); ++k) {
    std::string one = utf8_encode(std::u32string_view(&u[k], 1));
    bool start = k == 0 || sep(u[k - 1]) != sep(u[k]);
    out += utf8_decode(start ? py_upper(one) : py_lower(one));
  }
  return utf8_encode(out);
}

std::string indent(const std::string& text, const CallArgs& a) {
  std::string pad;
  const Value* w = arg(a, 0, "width");
  if (!w) {
    pad = "    ";
  } else if (w->is_string()) {
    pad = w->s;
  } else if (w->kind == Kind::Int || w->kind == Kind::Bool) {
    int64_t n = w->kind == Kind::Int ? w->i : w->b;
    pad.assign(static_cast<size_t>(std::clamp<int64_t>(n, 0, 4096)), ' ');
  } else {
    throw RenderError("indent: width must be an integer or a string");
  }
  bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
  std::vector<std::string> lines = split_lines(text + "\n");
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + pad : "") + lines[k];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k)
      rv += "\n" + (lines[k].empty() ? lines[k] : pad + lines[k]);
  }
  return first ? pad + rv : rv;
}

Value to_int(const Value& v, const CallArgs& a) {
  const Value* d = arg(a, 0, "default");
  Value dflt = d ? *d : Value::integer(0);
  if (v.kind == Kind::Int) return v;
  if (v.kind == Kind::Bool) return Value::integer(v.b);
  if (v.kind == Kind::Float) {
    if (!std::isfinite(v.f) || std::fabs(v.f) > 9e18) return dflt;
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.is_string()) {
    std::string s = py_strip(v.s, std::nullopt, true, true), digits;
    for (char c : s)
      if (c != '_') digits += c;
    if (!digits.empty()) {
      char* end = nullptr;
      errno = 0;
      long long x = std::strtoll(digits.c_str(), &end, 10);
      if (end && *end == 0 && errno == 0) return Value::integer(x);
      double f = std::strtod(digits.c_str(), &end);
      if (end && *end == 0 && std::isfinite(f) && std::fabs(f) < 9e18)
        return Value::integer(static_cast<int64_t>(f));
    }
  }
  return dflt;
}

Value to_float(const Value& v, const CallArgs& a) {
  const Value* d = arg(a, 0, "default");
  Value dflt = d ? *d : Value::real(0);
  if (v.kind == Kind::Float) return v;
  if (v.kind == Kind::Int) return Value::real(static_cast<double>(v.i));
  if (v.kind == Kind::Bool) return Value::real(v.b);
  if (v.is_string()) {
    std::string s = py_strip(v.s, std::nullopt, true, true);
    char* end = nullptr;
    double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == 0) return Value::real(f);
  }
  return dflt;
}

// select / reject / selectattr / rejectattr.
Value select(Renderer& r, const Value& v, const CallArgs& a, bool attr, bool keep) {
  size_t first = 0;
  std::string path;
  if (attr) {
    if (a.pos.empty()) throw RenderError("selectattr/rejectattr need an attribute");
    path = to_str(a.pos[0]);
    first = 1;
  }
  std::string test;
  CallArgs targs;
  if (a.pos.size() > first) {
    test = to_str(a.pos[first]);
    targs.pos.assign(a.pos.begin() + static_cast<long>(first) + 1, a.pos.end());
    targs.kw = a.kw;
  }
  List out;
  if (!truthy(v)) return Value::make_list({});  // jinja2 yields nothing for a falsy value
  for (const Value& item : iterate(v)) {
    r.step();
    Value x = attr ? attr_get(item, path) : item;
    bool ok = test.empty() ? truthy(x) : apply_test(r, test, x, targs);
    if (ok == keep) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Value sorted(const Value& v, const CallArgs& a) {
  bool reverse = arg_bool(a, 0, "reverse", false);
  bool cs = arg_bool(a, 1, "case_sensitive", false);
  const Value* attribute = arg(a, 2, "attribute");
  List items = iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& x : items)
    keyed.emplace_back(sort_key(attribute ? attr_get(x, to_str(*attribute)) : x, cs), x);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& p, const auto& q) {
    return reverse ? compare(q.first, p.first) < 0 : compare(p.first, q.first) < 0;
  });
  List out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::make_list(std::move(out));
}

}  // namespace

Value apply_filter(Renderer& r, const std::string& name, const Value& v, const CallArgs& a) {
  if (name == "tojson") return tojson(v, a);
  if (name == "safe") return Value::str(to_str(v), true);
  if (name == "string") return v.is_string() ? v : Value::str(to_str(v));
  if (name == "length" || name == "count") return Value::integer(length(v));
  if (name == "trim") {
    const Value* chars = arg(a, 0, "chars");
    std::optional<std::string> set;
    if (chars && !chars->is_none()) set = to_str(*chars);
    return Value::str(py_strip(to_str(v), set, true, true), v.markup);
  }
  if (name == "lower") return Value::str(py_lower(to_str(v)), v.markup);
  if (name == "upper") return Value::str(py_upper(to_str(v)), v.markup);
  if (name == "capitalize") return Value::str(py_capitalize(to_str(v)), v.markup);
  if (name == "title") return Value::str(jinja_title(to_str(v)), v.markup);
  if (name == "default" || name == "d") {
    bool boolean = arg_bool(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !truthy(v))) {
      const Value* d = arg(a, 0, "default_value");
      return d ? *d : Value::str("");
    }
    return v;
  }
  if (name == "join") {
    std::string sep = arg_string(a, 0, "d", "");
    const Value* attribute = arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += to_str(attribute ? attr_get(x, to_str(*attribute)) : x);
      if (out.size() > r.limits().max_output) throw RenderError("join: result too large");
    }
    return Value::str(std::move(out));
  }
  if (name == "list") return Value::make_list(iterate(v));
  if (name == "first") {
    List items = iterate(v);
    return items.empty() ? Value::undefined("first item") : items.front();
  }
  if (name == "last") {
    List items = iterate(v);
    return items.empty() ? Value::undefined("last item") : items.back();
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list({});
    if (!v.is_dict()) throw RenderError("Can only get item pairs from a mapping.");
    return r.call(*method(v, "items"), {});
  }
  if (name == "dictsort") {
    if (!v.is_dict()) throw RenderError("You can only sort by either a mapping");
    bool cs = arg_bool(a, 0, "case_sensitive", false);
    std::string by = arg_string(a, 1, "by", "key");
    bool reverse = arg_bool(a, 2, "reverse", false);
    if (by != "key" && by != "value")
      throw RenderError("You can only sort by either 'key' or 'value'");
    List pairs =
        r.call(*method(v, "items"), {}).list ? *r.call(*method(v, "items"), {}).list : List{};
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& p, const Value& q) {
      size_t k = by == "key" ? 0 : 1;
      Value x = sort_key((*p.list)[k], cs), y = sort_key((*q.list)[k], cs);
      return reverse ? compare(y, x) < 0 : compare(x, y) < 0;
    });
    return Value::make_list(std::move(pairs));
  }
  if (name == "map") {
    List out;
    if (!truthy(v)) return Value::make_list({});
    for (const auto& [k, x] : a.kw) {
      if (k != "attribute" && k != "default")
        throw RenderError("map: unknown argument '" + k + "'");
    }
    const Value* attribute = nullptr;
    const Value* dflt = nullptr;
    for (const auto& [k, x] : a.kw) (k == "attribute" ? attribute : dflt) = &x;
    if (attribute) {
      for (const Value& item : iterate(v)) {
        Value x = attr_get(item, to_str(*attribute));
        out.push_back(x.is_undefined() && dflt ? *dflt : x);
      }
      return Value::make_list(std::move(out));
    }
    if (a.pos.empty()) throw RenderError("map: needs a filter name or attribute=");
    CallArgs fargs;
    fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
    std::string f = to_str(a.pos[0]);
    for (const Value& item : iterate(v)) {
      r.step();
      out.push_back(apply_filter(r, f, item, fargs));
    }
    return Value::make_list(std::move(out));
  }
  if (name == "select") return select(r, v, a, false, true);
  if (name == "reject") return select(r, v, a, false, false);
  if (name == "selectattr") return select(r, v, a, true, true);
  if (name == "rejectattr") return select(r, v, a, true, false);
  if (name == "unique") {
    bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* attribute = arg(a, 1, "attribute");
    List out;
    std::set<std::string> seen;  // a Python set: unhashable keys raise
    for (const Value& item : iterate(v)) {
      Value key = sort_key(attribute ? attr_get(item, to_str(*attribute)) : item, cs);
      if (seen.insert(dict_key(key)).second) out.push_back(item);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "sort") return sorted(v, a);
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = utf8_decode(v.s);
      std::reverse(u.begin(), u.end());
      return Value::str(utf8_encode(u));
    }
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "replace") {
    const Value* count = arg(a, 2, "count");
    int64_t n = count && count->kind == Kind::Int && count->i != 0 ? count->i : -1;
    return Value::str(
        py_replace(to_str(v), arg_string(a, 0, "old", ""), arg_string(a, 1, "new", ""), n),
        v.markup);
  }
  if (name == "indent") {
    if (!v.is_string())  // jinja2 appends "\n" to the value itself
      throw RenderError("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
    return Value::str(indent(v.s, a), v.markup);
  }
  if (name == "int") return to_int(v, a);
  if (name == "float") return to_float(v, a);
  if (name == "abs") {
    if (v.kind == Kind::Int) {
      if (v.i == INT64_MIN) throw RenderError("integer overflow");
      return Value::integer(v.i < 0 ? -v.i : v.i);
    }
    if (v.kind == Kind::Bool) return Value::integer(v.b);
    if (v.kind == Kind::Float) return Value::real(std::fabs(v.f));
    throw RenderError("bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (name == "escape" || name == "e")
    return v.is_string() && v.markup ? v : Value::str(html_escape(to_str(v)), true);
  if (name == "format") {
    if (!v.is_string()) throw RenderError("format: the value must be a string");
    return Value::str(percent_format(v.s, Value::make_list(a.pos, true)));
  }
  if (name == "attr") return get_attribute(v, arg_string(a, 0, "name", ""));
  if (name == "max" || name == "min") {
    bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* attribute = arg(a, 1, "attribute");
    List items = iterate(v);
    if (items.empty()) return Value::undefined("no " + name + " item");
    size_t best = 0;
    for (size_t k = 1; k < items.size(); ++k) {
      Value x = sort_key(attribute ? attr_get(items[k], to_str(*attribute)) : items[k], cs);
      Value y = sort_key(attribute ? attr_get(items[best], to_str(*attribute)) : items[best], cs);
      int c = compare(x, y);
      if (name == "max" ? c > 0 : c < 0) best = k;
    }
    return items[best];
  }
  if (name == "sum") {
    const Value* attribute = arg(a, 0, "attribute");
    const Value* start = arg(a, 1, "start");
    Value total = start ? *start : Value::integer(0);
    for (const Value& x : iterate(v))
      total = binary_op("+", total, attribute ? attr_get(x, to_str(*attribute)) : x,
                        r.limits().max_output);
    return total;
  }
  if (name == "round") {
    const Value* p = arg(a, 0, "precision");
    std::string how = arg_string(a, 1, "method", "common");
    int64_t prec = p && p->kind == Kind::Int ? p->i : 0;
    double x = v.kind == Kind::Float ? v.f : v.kind == Kind::Int ? double(v.i) : double(v.b);
    if (!v.is_number()) throw RenderError("round: the value must be a number");
    double scale = std::pow(10.0, static_cast<double>(std::clamp<int64_t>(prec, -300, 300)));
    double y = x * scale;
    y = how == "ceil" ? std::ceil(y) : how == "floor" ? std::floor(y) : std::nearbyint(y);
    return Value::real(y / scale);
  }
  throw RenderError("unknown filter '" + name + "'");
}

}  // namespace wick::jinja
