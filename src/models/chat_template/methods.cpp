// Python's methods of str, dict and list that templates call, as jinja2's immutable sandbox
// allows them: the methods that modify a list or dict exist but raise when called.

#include <algorithm>

#include "models/chat_template/builtins.h"
#include "models/chat_template/strings.h"

namespace wick::jinja {
namespace {

std::optional<std::string> opt_str(const CallArgs& a, size_t k, const char* name,
                                   const char* method) {
  const Value* v = a.get(k, name);
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string())
    throw RenderError(std::string(method) + " arg must be None or str, not " + type_name(*v));
  return v->s;
}

const std::string& req_str(const CallArgs& a, size_t k, const char* name, const char* method) {
  const Value* v = a.get(k, name);
  if (!v) throw RenderError(std::string(method) + "() missing argument '" + name + "'");
  if (!v->is_string())
    throw RenderError(std::string(method) + "() argument must be str, not " + type_name(*v));
  return v->s;
}

int64_t opt_int(const CallArgs& a, size_t k, const char* name, int64_t dflt) {
  const Value* v = a.get(k, name);
  if (!v || v->is_none()) return dflt;
  if (v->kind == Kind::Int) return v->i;
  if (v->kind == Kind::Bool) return v->b;
  throw RenderError(std::string("'") + type_name(*v) +
                    "' object cannot be interpreted as an integer");
}

Value str_list(const std::vector<std::string>& parts) {
  List out;
  for (const std::string& p : parts) out.push_back(Value::str(p));
  return Value::make_list(std::move(out));
}

bool affix(const std::string& s, const Value& what, bool prefix, const char* method) {
  auto one = [&](const Value& p) {
    if (!p.is_string())
      throw RenderError(std::string(method) + " first arg must be str or a tuple of str, not " +
                        type_name(p));
    if (p.s.size() > s.size()) return false;
    return prefix ? s.compare(0, p.s.size(), p.s) == 0
                  : s.compare(s.size() - p.s.size(), p.s.size(), p.s) == 0;
  };
  if (what.is_list() && what.tuple) {
    for (const Value& p : *what.list)
      if (one(p)) return true;
    return false;
  }
  return one(what);
}

std::string str_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    char c = fmt[k];
    if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}')
        ++k;
      else
        throw RenderError("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    size_t end = fmt.find('}', k);
    if (end == std::string::npos) throw RenderError("Single '{' encountered in format string");
    std::string field = fmt.substr(k + 1, end - k - 1);
    k = end;
    char conv = 0;
    if (field.find(':') != std::string::npos)
      throw RenderError("str.format: format specs are not supported");
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 0;
      field.resize(bang);
    }
    const Value* v = nullptr;
    if (field.empty()) {
      v = auto_index < a.pos.size() ? &a.pos[auto_index] : nullptr;
      ++auto_index;
    } else if (std::all_of(field.begin(), field.end(),
                           [](char d) { return d >= '0' && d <= '9'; })) {
      size_t idx = std::stoul(field.substr(0, 9));
      v = idx < a.pos.size() ? &a.pos[idx] : nullptr;
    } else {
      for (const auto& [name, x] : a.kw)
        if (name == field) v = &x;
    }
    if (!v) throw RenderError("str.format: no argument for field '{" + field + "}'");
    out += conv == 'r' ? repr(*v) : to_str(*v);
  }
  return out;
}

Value unsafe(const std::string& type, const std::string& name) {
  return Value::callable(name, [type, name](const CallArgs&) -> Value {
    throw RenderError("access to attribute '" + name + "' of '" + type +
                      "' object is unsafe (the sandbox is immutable)");
  });
}

std::optional<Value> str_method(const Value& obj, const std::string& name) {
  const std::string s = obj.s;
  const bool mk = obj.markup;
  auto bind = [&](auto fn) { return Value::callable("str." + name, fn); };
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return bind([s, name, mk](const CallArgs& a) {
      return Value::str(
          py_strip(s, opt_str(a, 0, "chars", name.c_str()), name != "rstrip", name != "lstrip"),
          mk);
    });
  if (name == "split" || name == "rsplit")
    return bind([s, name](const CallArgs& a) {
      std::optional<std::string> sep = opt_str(a, 0, "sep", name.c_str());
      if (sep && sep->empty()) throw RenderError("empty separator");
      long maxsplit = static_cast<long>(opt_int(a, 1, "maxsplit", -1));
      return str_list(name == "split" ? py_split(s, sep, maxsplit) : py_rsplit(s, sep, maxsplit));
    });
  if (name == "startswith" || name == "endswith")
    return bind([s, name](const CallArgs& a) {
      const Value* p = a.get(0, "prefix");
      if (!p) throw RenderError(name + "() takes at least 1 argument");
      if (a.pos.size() > 1) throw RenderError(name + "(): start/end are not supported");
      return Value::boolean(affix(s, *p, name == "startswith", name.c_str()));
    });
  if (name == "replace")
    return bind([s, mk](const CallArgs& a) {
      return Value::str(py_replace(s, req_str(a, 0, "old", "replace"),
                                   req_str(a, 1, "new", "replace"), opt_int(a, 2, "count", -1)),
                        mk);
    });
  if (name == "upper") return bind([s](const CallArgs&) { return Value::str(py_upper(s)); });
  if (name == "lower" || name == "casefold")
    return bind([s](const CallArgs&) { return Value::str(py_lower(s)); });
  if (name == "title") return bind([s](const CallArgs&) { return Value::str(py_title(s)); });
  if (name == "capitalize")
    return bind([s](const CallArgs&) { return Value::str(py_capitalize(s)); });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count")
    return bind([s, name](const CallArgs& a) {
      const std::string& sub = req_str(a, 0, "sub", name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
          ++n;
        return Value::integer(n);
      }
      size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
      if (at == std::string::npos) {
        if (name == "index" || name == "rindex") throw RenderError("substring not found");
        return Value::integer(-1);
      }
      return Value::integer(static_cast<int64_t>(utf8_length(s.substr(0, at))));
    });
  if (name == "join")
    return bind([s](const CallArgs& a) {
      const Value* items = a.get(0, "iterable");
      if (!items) throw RenderError("join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const Value& x : iterate(*items)) {
        if (!x.is_string())
          throw RenderError("sequence item: expected str instance, " + type_name(x) + " found");
        if (!first) out += s;
        first = false;
        out += x.s;
      }
      return Value::str(std::move(out));
    });
  if (name == "format")
    return bind([s](const CallArgs& a) { return Value::str(str_format(s, a)); });
  if (name == "splitlines") return bind([s](const CallArgs&) { return str_list(split_lines(s)); });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "isupper" || name == "islower")
    return bind([s, name](const CallArgs&) {
      std::u32string u = utf8_decode(s);
      if (name == "isupper" || name == "islower") {
        bool cased = false;
        for (char32_t c : u) {
          bool lo = c >= 'a' && c <= 'z', up = c >= 'A' && c <= 'Z';
          if ((name == "isupper" && lo) || (name == "islower" && up)) return Value::boolean(false);
          cased = cased || lo || up;
        }
        return Value::boolean(cased);
      }
      if (u.empty()) return Value::boolean(false);
      for (char32_t c : u) {
        bool digit = c >= '0' && c <= '9';
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        bool ok = name == "isdigit"   ? digit
                  : name == "isalpha" ? alpha
                  : name == "isalnum" ? digit || alpha
                                      : py_isspace(c);
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    });
  if (name == "removeprefix" || name == "removesuffix")
    return bind([s, name](const CallArgs& a) {
      const std::string& x = req_str(a, 0, "affix", name.c_str());
      bool pre = name == "removeprefix";
      if (x.size() <= s.size() &&
          (pre ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0))
        return Value::str(pre ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
      return Value::str(s);
    });
  return std::nullopt;
}

std::optional<Value> dict_method(const Value& obj, const std::string& name) {
  std::shared_ptr<Dict> d = obj.dict;
  auto bind = [&](auto fn) { return Value::callable("dict." + name, fn); };
  if (name == "items")
    return bind([d](const CallArgs&) {
      List out;
      for (const auto& [k, v] : d->items) out.push_back(Value::make_list({key_value(k), v}, true));
      return Value::make_list(std::move(out));
    });
  if (name == "keys")
    return bind([d](const CallArgs&) {
      List out;
      for (const auto& kv : d->items) out.push_back(key_value(kv.first));
      return Value::make_list(std::move(out));
    });
  if (name == "values")
    return bind([d](const CallArgs&) {
      List out;
      for (const auto& kv : d->items) out.push_back(kv.second);
      return Value::make_list(std::move(out));
    });
  if (name == "get")
    return bind([d](const CallArgs& a) {
      const Value* key = a.get(0, "key");
      if (!key) throw RenderError("get expected at least 1 argument, got 0");
      if (const Value* v = d->find(dict_key(*key))) return *v;
      const Value* dflt = a.get(1, "default");
      return dflt ? *dflt : Value::none();
    });
  if (name == "copy") return bind([d](const CallArgs&) { return Value::make_dict(*d); });
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" ||
      name == "clear")
    return unsafe("dict", name);
  return std::nullopt;
}

std::optional<Value> list_method(const Value& obj, const std::string& name) {
  std::shared_ptr<List> l = obj.list;
  if (name == "index" || name == "count")
    return Value::callable("list." + name, [l, name](const CallArgs& a) {
      const Value* x = a.get(0, "value");
      if (!x) throw RenderError(name + "() takes exactly one argument");
      int64_t n = 0;
      for (size_t k = 0; k < l->size(); ++k) {
        if (!equals((*l)[k], *x)) continue;
        if (name == "index") return Value::integer(static_cast<int64_t>(k));
        ++n;
      }
      if (name == "index") throw RenderError("list.index(x): x not in list");
      return Value::integer(n);
    });
  if (!obj.tuple && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                     name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
    return unsafe("list", name);
  return std::nullopt;
}

}  // namespace

std::optional<Value> method(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Kind::String:
      return str_method(obj, name);
    case Kind::Dict:
      return obj.namespace_ ? std::nullopt : dict_method(obj, name);
    case Kind::List:
      return list_method(obj, name);
    default:
      return std::nullopt;
  }
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::u32string u = utf8_decode(s), line;
  for (size_t k = 0; k < u.size(); ++k) {
    char32_t c = u[k];
    bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
               c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      line.push_back(c);
      continue;
    }
    if (c == '\r' && k + 1 < u.size() && u[k + 1] == '\n') ++k;
    out.push_back(utf8_encode(line));
    line.clear();
  }
  if (!line.empty()) out.push_back(utf8_encode(line));
  return out;
}

std::string percent_format(const std::string& fmt, const Value& args) {
  List items = args.is_list() && args.tuple ? *args.list : List{args};
  size_t next = 0;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    if (++k == fmt.size()) throw RenderError("incomplete format");
    char c = fmt[k];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= items.size()) throw RenderError("not enough arguments for format string");
    const Value& v = items[next++];
    if (c == 's') {
      out += to_str(v);
    } else if (c == 'r') {
      out += repr(v);
    } else if (c == 'd' || c == 'i') {
      if (v.kind == Kind::Int || v.kind == Kind::Bool)
        out += std::to_string(v.kind == Kind::Int ? v.i : v.b);
      else if (v.kind == Kind::Float)
        out += std::to_string(static_cast<int64_t>(v.f));
      else
        throw RenderError("%d format: a real number is required, not " + type_name(v));
    } else {
      throw RenderError(std::string("unsupported format character '") + c + "'");
    }
  }
  // Python treats a list or dict argument as a mapping: left unused, it is no error.
  bool mapping = (args.is_list() && !args.tuple) || args.is_dict();
  if (next < items.size() && !mapping)
    throw RenderError("not all arguments converted during string formatting");
  return out;
}

}  // namespace wick::jinja
