#include "models/chat_template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "models/chat_template/strings.h"

namespace wick::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

Value* Dict::find(std::string_view key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(std::string key, Value v) {
  if (Value* slot = find(key)) {
    *slot = std::move(v);
    return;
  }
  items.emplace_back(std::move(key), std::move(v));
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < pos.size()) return &pos[index];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.b = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.i = i;
  return v;
}
Value Value::real(double f) {
  Value v;
  v.kind = Kind::Float;
  v.f = f;
  return v;
}
Value Value::str(std::string s, bool markup) {
  Value v;
  v.kind = Kind::String;
  v.s = std::move(s);
  v.markup = markup;
  return v;
}
namespace {

int nesting(const Value& element) {
  return element.namespace_ ? 1 : element.depth;
}

void check_depth(int depth) {
  if (depth > kMaxNesting)
    throw RenderError("values nested deeper than " + std::to_string(kMaxNesting));
}

// repr, ==, < and json walk values recursively; namespaces can hold themselves.
class NestGuard {
 public:
  NestGuard() {
    if (++depth_ > 2 * kMaxNesting) {
      --depth_;
      throw RenderError("values nested deeper than " + std::to_string(kMaxNesting));
    }
  }
  ~NestGuard() { --depth_; }
  NestGuard(const NestGuard&) = delete;
  NestGuard& operator=(const NestGuard&) = delete;

 private:
  static thread_local int depth_;
};
thread_local int NestGuard::depth_ = 0;

}  // namespace

Value Value::make_list(List items, bool tuple) {
  Value v;
  for (const Value& x : items) v.depth = std::max(v.depth, nesting(x));
  check_depth(++v.depth);
  v.kind = Kind::List;
  v.list = std::make_shared<List>(std::move(items));
  v.tuple = tuple;
  return v;
}
Value Value::make_dict(Dict d) {
  Value v;
  for (const auto& kv : d.items) v.depth = std::max(v.depth, nesting(kv.second));
  check_depth(++v.depth);
  v.kind = Kind::Dict;
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::callable(std::string name, std::function<Value(const CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

namespace {
const std::string kTag = "\xff";
}  // namespace

std::string dict_key(const Value& key) {
  switch (key.kind) {
    case Kind::String:
      return key.s;
    case Kind::Int:
      return kTag + "i" + std::to_string(key.i);
    case Kind::Bool:
      return key.b ? kTag + "i1" : kTag + "i0";
    case Kind::Float:
      if (std::isfinite(key.f) && key.f == std::floor(key.f) && std::fabs(key.f) < 9e18)
        return kTag + "i" + std::to_string(static_cast<int64_t>(key.f));
      return kTag + "f" + float_repr(key.f);
    case Kind::None:
      return kTag + "n";
    case Kind::List:
      if (key.tuple) return kTag + "t" + repr(key);
      break;
    default:
      break;
  }
  throw RenderError("unhashable type: '" + type_name(key) + "'");
}

Value key_value(const std::string& spelled) {
  if (spelled.size() < 2 || spelled[0] != kTag[0]) return Value::str(spelled);
  switch (spelled[1]) {
    case 'i':
      return Value::integer(std::strtoll(spelled.c_str() + 2, nullptr, 10));
    case 'f':
      return Value::real(std::strtod(spelled.c_str() + 2, nullptr));
    case 'n':
      return Value::none();
    default:
      return Value::str(spelled.substr(2));
  }
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return v.markup ? "Markup" : "str";
    case Kind::List:
      return v.tuple ? "tuple" : "list";
    case Kind::Dict:
      return v.namespace_ ? "Namespace" : "dict";
    case Kind::Callable:
      return "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return v.b;
    case Kind::Int:
      return v.i != 0;
    case Kind::Float:
      return v.f != 0;
    case Kind::String:
      return !v.s.empty();
    case Kind::List:
      return !v.list->empty();
    case Kind::Dict:
      return v.namespace_ || !v.dict->items.empty();
    case Kind::Callable:
      return true;
  }
  return false;
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: positional for exponents in [-4, 16).
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits +
            std::string(static_cast<size_t>(exp + 1 - static_cast<int>(digits.size())), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
            digits.substr(static_cast<size_t>(exp + 1));
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return neg ? "-" + out : out;
}

namespace {

std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    char buf[16];
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7f && c < 0xa0) || (c >= 0xd800 && c <= 0xdfff)) {
      std::snprintf(buf, sizeof buf, c < 0x100 ? "\\x%02x" : "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += utf8_encode(std::u32string_view(&c, 1));
    }
  }
  out += q;
  return out;
}

}  // namespace

std::string repr(const Value& v) {
  NestGuard guard;
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::String:
      return v.markup ? "Markup(" + repr_string(v.s) + ")" : repr_string(v.s);
    case Kind::List: {
      if (!v.s.empty()) return v.s;
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Kind::Dict: {
      if (v.namespace_) {
        Value plain = v;
        plain.namespace_ = false;
        return "<Namespace " + repr(plain) + ">";
      }
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr(key_value(k)) + ": " + repr(x);
      }
      return out + "}";
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.b ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.i);
    case Kind::Float:
      return float_repr(v.f);
    case Kind::String:
      return v.s;
    case Kind::Callable:
      return "<function " + v.fn->name + ">";
    default:
      return repr(v);
  }
}

bool equals(const Value& a, const Value& b) {
  NestGuard guard;
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      double x = a.kind == Kind::Float ? a.f : a.kind == Kind::Int ? double(a.i) : double(a.b);
      double y = b.kind == Kind::Float ? b.f : b.kind == Kind::Int ? double(b.i) : double(b.b);
      return x == y;
    }
    int64_t x = a.kind == Kind::Int ? a.i : a.b, y = b.kind == Kind::Int ? b.i : b.b;
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.s == b.s;
    case Kind::List:
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Kind::Dict:
      if (a.namespace_ || b.namespace_) return a.dict == b.dict;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->find(k);
        if (!y || !equals(x, *y)) return false;
      }
      return true;
    case Kind::Callable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b) {
  NestGuard guard;
  if (a.is_number() && b.is_number()) {
    double x = a.kind == Kind::Float ? a.f : a.kind == Kind::Int ? double(a.i) : double(a.b);
    double y = b.kind == Kind::Float ? b.f : b.kind == Kind::Int ? double(b.i) : double(b.b);
    if (a.kind != Kind::Float && b.kind != Kind::Float) {
      int64_t p = a.kind == Kind::Int ? a.i : a.b, q = b.kind == Kind::Int ? b.i : b.b;
      return p < q ? -1 : p > q ? 1 : 0;
    }
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::String && b.kind == Kind::String) {
    int c = a.s.compare(b.s);  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind == Kind::List && b.kind == Kind::List && a.tuple == b.tuple) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (equals((*a.list)[k], (*b.list)[k])) continue;
      return compare((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  throw RenderError("'<' not supported between instances of '" + type_name(a) + "' and '" +
                    type_name(b) + "'");
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return {};
    case Kind::String: {
      List out;
      for (char32_t c : utf8_decode(v.s)) out.push_back(Value::str(utf8_encode({&c, 1})));
      return out;
    }
    case Kind::List:
      return *v.list;
    case Kind::Dict: {
      if (v.namespace_) break;
      List out;
      for (const auto& kv : v.dict->items) out.push_back(key_value(kv.first));
      return out;
    }
    default:
      break;
  }
  throw RenderError("'" + type_name(v) + "' object is not iterable");
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return 0;
    case Kind::String:
      return static_cast<int64_t>(utf8_length(v.s));
    case Kind::List:
      return static_cast<int64_t>(v.list->size());
    case Kind::Dict:
      if (!v.namespace_) return static_cast<int64_t>(v.dict->items.size());
      break;
    default:
      break;
  }
  throw RenderError("object of type '" + type_name(v) + "' has no len()");
}

namespace {

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, int indent, int depth, const std::string& isep,
                const std::string& ksep, bool sort_keys) {
  if (depth > 2 * kMaxNesting) throw RenderError("tojson: values nested too deep");
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(d), ' ');
  };
  switch (v.kind) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.b ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.i);
      return;
    case Kind::Float:
      out += std::isnan(v.f)   ? "NaN"
             : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                               : float_repr(v.f);
      return;
    case Kind::String:
      json_string(out, v.s);
      return;
    case Kind::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += isep;
        newline(depth + 1);
        json_value(out, (*v.list)[k], indent, depth + 1, isep, ksep, sort_keys);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.namespace_) break;
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* x, auto* y) {
          return compare(key_value(x->first), key_value(y->first)) < 0;
        });
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += isep;
        first = false;
        newline(depth + 1);
        Value key = key_value(kv->first);
        json_string(out, key.is_string() ? key.s : key.is_none() ? "null" : to_str(key));
        out += ksep;
        json_value(out, kv->second, indent, depth + 1, isep, ksep, sort_keys);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      break;
  }
  throw RenderError("Object of type " + type_name(v) + " is not JSON serializable");
}

}  // namespace

std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys) {
  std::string out;
  json_value(out, v, indent, 0, item_sep, key_sep, sort_keys);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::real(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& x : j) items.push_back(from_json(x));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, x] : j.items()) d.set(k, from_json(x));
      return Value::make_dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace wick::jinja
