#pragma once
// The values a chat template computes with: Python's types as Jinja sees them (None, bool, int,
// float, str, list, tuple, dict with insertion order, Jinja's Undefined, Markup strings, namespace
// objects and callables), with Python's printing, truthiness, equality and ordering.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "wick/chat_template.h"

namespace wick::jinja {

/// A failure while rendering (a Python exception in jinja2), before the renderer adds the line.
class RenderError : public ChatTemplateError {
 public:
  using ChatTemplateError::ChatTemplateError;
};

struct Value;
struct Callable;
using List = std::vector<Value>;

/// A Python dict with string keys, in insertion order.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value v);
};

/// Arguments of a call: positional then keyword, as written.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  /// The argument at `index` or named `name`; nullptr when absent.
  const Value* get(size_t index, std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> fn;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  bool markup = false;       // String: a jinja2 Markup (from |safe)
  bool tuple = false;        // List: a Python tuple
  bool namespace_ = false;   // Dict: an object with attributes (a namespace, a loop), no mapping
  bool loop_object = false;  // Dict: the `loop` variable (its attributes are read-only)
  int depth = 0;             // List, Dict: 1 + the deepest element's (namespaces count 1)
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; Undefined: the missing name; List from range(): how it prints
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Callable> fn;

  Value() = default;
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value str(std::string v, bool markup = false);
  static Value make_list(List items, bool tuple = false);
  static Value make_dict(Dict d = {});
  static Value callable(std::string name, std::function<Value(const CallArgs&)> fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict && !namespace_; }
};

/// The Dict spelling of a hashable key: a str as itself, an int, float, bool or None tagged with a
/// leading 0xff byte (never in UTF-8) so that 1 and "1" stay apart; True is 1 as in Python. A
/// RenderError for unhashable keys (list, dict).
std::string dict_key(const Value& key);
/// The key back from its Dict spelling.
Value key_value(const std::string& spelled);

/// Containers nest at most this deep (Python's own limit is its recursion limit).
constexpr int kMaxNesting = 200;

/// Python's type name of a value, for messages ("str", "int", "NoneType", ...).
std::string type_name(const Value& v);
/// bool(v) in Python (Undefined is false).
bool truthy(const Value& v);
/// str(v) in Python (Undefined prints as ""), as `{{ v }}` writes it.
std::string to_str(const Value& v);
/// repr(v) in Python.
std::string repr(const Value& v);
/// Python's float repr (shortest round trip: "1.0", "1e-05", "1e+16").
std::string float_repr(double v);
/// v1 == v2 in Python.
bool equals(const Value& a, const Value& b);
/// a < b in Python: -1, 0 or 1; a RenderError for types Python cannot order.
int compare(const Value& a, const Value& b);
/// The items `for x in v` yields (a dict's keys, a string's characters); Undefined yields none.
List iterate(const Value& v);
/// len(v), a RenderError for values without one.
int64_t length(const Value& v);

/// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...), as
/// transformers' tojson filter calls it; indent < 0 is None.
std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys);

/// A value from JSON data (objects keep their key order).
Value from_json(const nlohmann::ordered_json& j);

/// The `escape` of markupsafe: & < > ' " as HTML entities.
std::string html_escape(std::string_view s);

}  // namespace wick::jinja
