#pragma once
// Jinja's filters and tests, Python's str/dict/list methods (as jinja2's immutable sandbox allows
// them), operators, attribute and item access, and the globals transformers adds.

#include <optional>
#include <string>
#include <vector>

#include "models/chat_template/eval.h"
#include "models/chat_template/value.h"

namespace wick::jinja {

/// `value | name(args)`; a RenderError for an unknown filter.
Value apply_filter(Renderer& r, const std::string& name, const Value& value, const CallArgs& args);
/// `value is name(args)`; a RenderError for an unknown test.
bool apply_test(Renderer& r, const std::string& name, const Value& value, const CallArgs& args);
/// `obj.name` as the sandbox resolves it: a method first, then an item, else Undefined.
Value get_attribute(const Value& obj, const std::string& name);
/// `obj[key]`: an item first, then (for a string key) a method, else Undefined.
Value get_item(const Value& obj, const Value& key);
/// `obj[start:stop:step]` (absent parts are Undefined or None).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
/// `a op b` for + - * / // % ** ~.
Value binary_op(const std::string& op, const Value& a, const Value& b, size_t max_size);
/// `a in b`.
bool contains(const Value& container, const Value& item);
/// The globals: range, namespace, dict, raise_exception, strftime_now.
void add_globals(Renderer& r, Dict& globals);
/// Throws the error a use of an Undefined value raises.
[[noreturn]] void undefined_error(const Value& v);

/// The attribute `name` of a str, dict or list that Python has (a bound method), or nullopt.
std::optional<Value> method(const Value& obj, const std::string& name);
/// Python's str % args (printf-style formatting: %s %r %d %i %%; others raise).
std::string percent_format(const std::string& fmt, const Value& args);
/// str.splitlines().
std::vector<std::string> split_lines(const std::string& s);

}  // namespace wick::jinja
