#pragma once
// Renders a parsed template: Jinja's scoping (a loop body and a macro call are scopes, `if` is
// not), loop variables, macros and call blocks, break/continue, with bounds on output size,
// work and call depth so that no template runs away.

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/chat_template/ast.h"

namespace wick::jinja {

using Limits = ChatTemplateLimits;

class Renderer {
 public:
  /// `context`: the template's variables; `now`: a fixed time for strftime_now (UTC), else the
  /// local clock.
  Renderer(const Body& body, Dict context, Limits limits, std::optional<std::time_t> now);
  ~Renderer();
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;
  std::string render();

  /// Calls a callable value (macro, method, global).
  Value call(const Value& fn, const CallArgs& args);
  /// A namespace() object, kept so that the reference cycles a template can build through
  /// namespaces (ns.self = ns) are broken when the render ends.
  Value make_namespace(Dict d);
  /// Counts `n` units of work against the step budget.
  void step(uint64_t n = 1);
  /// Counts the work of copying or scanning `v` (long strings and lists cost more than one step).
  void charge(const Value& v);
  const Limits& limits() const { return limits_; }
  std::optional<std::time_t> now() const { return now_; }

 private:
  struct Scope {
    Dict vars;
    std::shared_ptr<Scope> parent;
  };
  enum class Flow { Normal, Break, Continue };

  Flow exec(const Body& body, std::string& out);
  Flow exec_one(const Stmt& s, std::string& out);
  Flow exec_stmt(const Stmt& s, std::string& out);
  void exec_for(const Stmt& s, std::string& out);
  void exec_set(const Stmt& s);
  Value eval(const Expr& e);
  Value eval_compare(const Expr& e);
  void eval_args(const Expr& e, CallArgs& args);
  Value apply_filters(const Expr& chain, Value input);
  Value make_macro(const Stmt& s, std::shared_ptr<Scope> closure, bool is_caller);
  Value lookup(const std::string& name) const;
  void append(std::string& out, const std::string& text);

  const Body& body_;
  Dict globals_;
  Limits limits_;
  std::optional<std::time_t> now_;
  std::shared_ptr<Scope> scope_;
  // Macros hold their defining scope weakly (the scope holds the macro); these keep them alive.
  std::vector<std::shared_ptr<Scope>> closures_;
  std::vector<std::shared_ptr<Dict>> namespaces_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  int line_ = 0;
};

}  // namespace wick::jinja
