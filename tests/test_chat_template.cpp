// wick::ChatTemplate against Python's jinja2 set up as transformers' apply_chat_template sets it
// up: the 26 released templates in ../shared/chat_templates/ x the conversations of
// scripts/make_chat_template_refs.py x add_generation_prompt off and on, and one-construct
// snippets, byte for byte (references committed in tests/data/chat_templates/expected.json).

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "wick/chat_template.h"
#include "wick/tokenizer.h"

namespace {

using wick::ChatMessage;
using wick::ChatTemplate;
using wick::ChatTemplateError;
using Json = nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The templates are data shared beside the repository; WICK_CHAT_TEMPLATES overrides the path.
std::string templates_dir() {
  if (const char* env = std::getenv("WICK_CHAT_TEMPLATES")) return env;
  return std::string(WICK_SOURCE_DIR) + "/../shared/chat_templates";
}

// WICK_CHAT_TEMPLATE_REFS names another references file (the script's --out), to check
// templates beyond the committed ones.
const char* other_refs() {
  return std::getenv("WICK_CHAT_TEMPLATE_REFS");
}

const Json& expected() {
  static const Json doc = Json::parse(
      read_text(other_refs() ? other_refs()
                             : std::string(WICK_TEST_DATA_DIR) + "/chat_templates/expected.json"));
  return doc;
}

// The first differing byte, with some context, for a readable failure.
std::string first_difference(const std::string& got, const std::string& want) {
  size_t k = 0;
  while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
  size_t from = k > 40 ? k - 40 : 0;
  return "first difference at byte " + std::to_string(k) +
         "\n  got:  " + Json(got.substr(from, 100)).dump() +
         "\n  want: " + Json(want.substr(from, 100)).dump();
}

// Renders one expected case; returns whether it matched (failures are reported as they occur).
bool check_case(const ChatTemplate& tpl, const Json& messages, const Json& extra, bool agp,
                const Json& want, const std::string& what) {
  if (want.contains("error")) {
    try {
      std::string got = tpl.render_json(messages, agp, extra);
      ADD_FAILURE() << what << ": jinja2 raises " << want["error"] << " ("
                    << want["message"].get<std::string>() << "), wick rendered "
                    << Json(got.substr(0, 200)).dump();
      return false;
    } catch (const ChatTemplateError& e) {
      if (want["error"] == "raise_exception" &&
          std::string(e.what()).find(want["message"].get<std::string>()) == std::string::npos) {
        ADD_FAILURE() << what << ": message " << e.what() << " lacks "
                      << want["message"].get<std::string>();
        return false;
      }
      return true;
    }
  }
  try {
    std::string got = tpl.render_json(messages, agp, extra);
    const std::string& ref = want["output"].get_ref<const std::string&>();
    if (got == ref) return true;
    ADD_FAILURE() << what << ": " << first_difference(got, ref);
  } catch (const wick::Error& e) {
    ADD_FAILURE() << what << ": wick throws " << e.what();
  }
  return false;
}

TEST(ChatTemplate, RealTemplatesMatchJinja2) {
  const Json& doc = expected();
  std::map<std::string, const Json*> convs;
  for (const Json& c : doc["conversations"]) convs[c["name"].get<std::string>()] = &c;
  if (!other_refs()) {
    ASSERT_EQ(doc["templates"].size(), 26u);
  }
  ASSERT_GE(convs.size(), 8u);
  size_t total = 0, matched = 0;
  for (const auto& [file, cases] : doc["templates"].items()) {
    std::string path = templates_dir() + "/" + file;
    ASSERT_TRUE(std::filesystem::exists(path))
        << path << " is missing (set WICK_CHAT_TEMPLATES to the shared chat_templates folder)";
    ChatTemplate tpl(read_text(path));
    tpl.set_now(doc["fixed_time"].get<std::time_t>());
    size_t ok = 0;
    for (const Json& want : cases) {
      const Json& conv = *convs.at(want["conversation"].get<std::string>());
      bool agp = want["add_generation_prompt"].get<bool>();
      std::string what = file + " / " + want["conversation"].get<std::string>() +
                         (agp ? " / add_generation_prompt" : "");
      ok += check_case(tpl, conv["messages"], conv["extra"], agp, want, what);
    }
    total += cases.size();
    matched += ok;
  }
  EXPECT_EQ(matched, total);
  std::printf("chat templates: %zu of %zu renders byte-identical to jinja2 (raises included)\n",
              matched, total);
}

TEST(ChatTemplate, SnippetsMatchJinja2) {
  const Json& doc = expected();
  size_t k = 0;
  for (const Json& s : doc["snippets"]) {
    std::string what = "snippet " + std::to_string(k++) + " " + s["template"].dump();
    try {
      ChatTemplate tpl(s["template"].get<std::string>());
      tpl.set_now(doc["fixed_time"].get<std::time_t>());
      Json vars = s["variables"];
      Json messages = vars.contains("messages") ? vars["messages"] : Json::array();
      vars.erase("messages");
      check_case(tpl, messages, vars, false, s, what);
    } catch (const ChatTemplateError& e) {
      ADD_FAILURE() << what << ": does not parse: " << e.what();
    }
  }
}

TEST(ChatTemplate, ChatMessageFieldsAndExtra) {
  // The vector<ChatMessage> form equals the JSON form: fields after role and content, a
  // "content" field replacing content, and nlohmann::json extra.
  ChatTemplate tpl(
      "{% for m in messages %}{{ m.role }}:{{ m.content }}:{{ m.tool_call_id|default('-') }}"
      "{{ m|tojson }};{% endfor %}{{ bos_token }}{{ tools is none }}{{ add_generation_prompt }}");
  std::vector<ChatMessage> msgs = {{"user", "hi", Json::object()},
                                   {"tool", "r", Json{{"tool_call_id", "7"}}},
                                   {"assistant", "", Json{{"content", nullptr}}}};
  Json as_json = Json::array({Json{{"role", "user"}, {"content", "hi"}},
                              Json{{"role", "tool"}, {"content", "r"}, {"tool_call_id", "7"}},
                              Json{{"role", "assistant"}, {"content", nullptr}}});
  std::string a = tpl.render(msgs, true, nlohmann::json{{"bos_token", "<s>"}});
  std::string b = tpl.render_json(as_json, true, Json{{"bos_token", "<s>"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a.find("tool:r:7{\"role\": \"tool\", \"content\": \"r\", \"tool_call_id\": \"7\"}"),
            std::string::npos)
      << a;
  EXPECT_NE(a.find("assistant:None:-"), std::string::npos) << a;
  EXPECT_EQ(a.substr(a.size() - 11), "<s>TrueTrue");
}

void expect_error(const std::string& source, const std::string& fragment, bool at_parse,
                  const wick::ChatTemplateLimits& limits = {}) {
  try {
    ChatTemplate tpl(source);
    tpl.set_limits(limits);
    if (at_parse) {
      ADD_FAILURE() << source << " parsed";
      return;
    }
    tpl.render_json(Json::array(), false);
    ADD_FAILURE() << source << " rendered";
  } catch (const ChatTemplateError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << source << ": " << e.what() << " lacks " << fragment;
  }
}

TEST(ChatTemplate, ErrorsNameTheConstructAndLine) {
  expect_error("a\nb\n{% include 'x' %}", "line 3: unsupported tag 'include'", true);
  expect_error("{{ x | nosuchfilter }}", "line 1: no filter named 'nosuchfilter'", true);
  expect_error("\n{% if x is nosuchtest %}{% endif %}", "line 2: no test named 'nosuchtest'", true);
  expect_error("{% for x in y %}", "missing 'endfor'", true);
  expect_error("{{ 'abc }}", "unterminated string literal", true);
  expect_error("{{ (1 }}", "line 1:", true);
  expect_error("{# open", "unclosed comment", true);
  expect_error("x\n\n{{ 1 + }}", "line 3: expected an expression", true);
  expect_error("{% macro m() %}{% endfor %}", "line 1:", true);
  expect_error("{{ 'abc'[1:, 2] }}", "a slice inside a tuple subscript", true);
  // Filters jinja2 has and wick does not implement fail where they run, not before.
  EXPECT_EQ(ChatTemplate("{% if false %}{{ x|wordcount }}{% endif %}ok").render({}, false), "ok");
  expect_error("\n\n{{ 'x'|wordcount }}", "line 3: unknown filter 'wordcount'", false);
  expect_error("{{ raise_exception('Only user and assistant roles') }}",
               "raise_exception: Only user and assistant roles", false);
}

TEST(ChatTemplate, BoundsStopRunawayTemplates) {
  // Deep recursion, endless work, huge output and deep nesting end in ChatTemplateError.
  wick::ChatTemplateLimits small;
  small.max_steps = 100'000;
  small.max_output = 1 << 20;
  expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper", false);
  expect_error("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
               "steps", false, small);
  expect_error("{% set s = 'x' * 100000 %}{% for a in range(100) %}{{ s }}{% endfor %}",
               "output larger", false, small);
  expect_error("{{ 'x' * 10000000000 }}", "larger", false);
  expect_error("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}", "nested", true);
  expect_error("{{ " + std::string(5000, '[') + " }}", "nested", true);
  // Values built deeper than Python's recursion would allow, and namespaces holding themselves.
  expect_error(
      "{% set ns = namespace(x=[]) %}{% for i in range(300) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}",
      "nested deeper", false);
  expect_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", "nested deeper", false);
  // Work that grows with the size of what it copies counts against the budget too.
  expect_error(
      "{% set ns = namespace(s='', l=[]) %}{% for i in range(50000) %}"
      "{% set ns.l = ns.l + [i] %}{% endfor %}",
      "steps", false, small);
  expect_error(
      "{% set ns = namespace(s='') %}{% for i in range(50000) %}"
      "{% set ns.s = ns.s ~ 'xxxxxxxxxxxxxxxx' %}{% endfor %}",
      "steps", false, small);
  std::string deep;
  for (int k = 0; k < 300; ++k) deep += "{% if true %}";
  expect_error(deep, "nested", true);
}

TEST(ChatTemplate, TokenizerChatMessageIsTheSameType) {
  // Tokenizer::apply_chat_template and ChatTemplate take the same message type.
  std::vector<ChatMessage> msgs = {{"user", "hi"}};
  ChatTemplate tpl("{{ messages[0].content }}");
  EXPECT_EQ(tpl.render(msgs, false), "hi");
}

}  // namespace
