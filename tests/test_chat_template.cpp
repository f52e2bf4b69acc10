// wick::ChatTemplate against Python's jinja2 set up as transformers' apply_chat_template sets it
// up: the 26 released templates in ../shared/chat_templates/ x the conversations of
// scripts/make_chat_template_refs.py x add_generation_prompt off and on, and one-construct
// snippets, byte for byte (references committed in tests/data/chat_templates/expected.json);
// the same templates through Tokenizer::apply_chat_template from the files a model ships, and the
// end-of-turn tokens the templates name.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bert_test_util.h"
#include "test_util.h"
#include "wick/chat_template.h"
#include "wick/llama.h"
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

// ---- through Tokenizer: the template files a model ships ----

namespace fs = std::filesystem;

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

// A folder holding a small WordPiece tokenizer.json whose added tokens are `specials` (special,
// ids after the words) and `plain` (not special); removed with the object.
class TokenizerFolder {
 public:
  explicit TokenizerFolder(const std::vector<std::string>& specials,
                           const std::vector<std::string>& plain = {}) {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("wick_chat_tokenizer_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
    Json vocab = Json::object();
    vocab["[UNK]"] = 0;
    uint32_t id = 1;
    for (const char* w : {"hello", "hi", "user", "assistant", "system", "model", "the", "a"}) {
      vocab[w] = id++;
    }
    Json added = Json::array();
    added.push_back({{"id", 0}, {"content", "[UNK]"}, {"special", true}, {"normalized", false}});
    for (const auto* list : {&specials, &plain}) {
      for (const std::string& t : *list) {
        ids_[t] = id;
        added.push_back(
            {{"id", id++}, {"content", t}, {"special", list == &specials}, {"normalized", false}});
      }
    }
    Json tok = {{"version", "1.0"},
                {"added_tokens", added},
                {"normalizer", nullptr},
                {"pre_tokenizer", {{"type", "Whitespace"}}},
                {"post_processor", nullptr},
                {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}}},
                {"model",
                 {{"type", "WordPiece"},
                  {"unk_token", "[UNK]"},
                  {"continuing_subword_prefix", "##"},
                  {"vocab", vocab}}}};
    write_text(dir_ / "tokenizer.json", tok.dump());
  }
  ~TokenizerFolder() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const fs::path& dir() const { return dir_; }
  uint32_t id(const std::string& token) const { return ids_.at(token); }
  void config(const Json& j) const { write_text(dir_ / "tokenizer_config.json", j.dump()); }
  wick::Tokenizer load() const { return wick::Tokenizer::from_file(dir_.string()); }

 private:
  fs::path dir_;
  std::map<std::string, uint32_t> ids_;
};

// The conversation's extra without the bos/eos placeholders, which the tokenizer supplies.
Json without_tokens(Json extra) {
  extra.erase("bos_token");
  extra.erase("eos_token");
  return extra;
}

// Renders every expected case of `file` through `tok`; returns the number matched.
size_t check_tokenizer_cases(const wick::Tokenizer& tok, const std::string& file,
                             const std::map<std::string, const Json*>& convs, const Json& cases,
                             const std::string& how) {
  size_t ok = 0;
  for (const Json& want : cases) {
    const Json& conv = *convs.at(want["conversation"].get<std::string>());
    bool agp = want["add_generation_prompt"].get<bool>();
    std::string what = file + " (" + how + ") / " + want["conversation"].get<std::string>() +
                       (agp ? " / add_generation_prompt" : "");
    try {
      std::string got =
          tok.apply_chat_template_json(conv["messages"], agp, without_tokens(conv["extra"]));
      if (want.contains("error")) {
        ADD_FAILURE() << what << ": jinja2 raises, wick rendered";
      } else if (got == want["output"].get<std::string>()) {
        ++ok;
      } else {
        ADD_FAILURE() << what << ": " << first_difference(got, want["output"]);
      }
    } catch (const ChatTemplateError& e) {
      if (want.contains("error")) {
        ++ok;
      } else {
        ADD_FAILURE() << what << ": wick throws " << e.what();
      }
    }
  }
  return ok;
}

TEST(TokenizerChatTemplate, RealTemplatesFromEachFileForm) {
  // Each real template as a model folder ships it, in turn: tokenizer_config.json's string, its
  // list of named templates, chat_template.jinja (replacing a config template) and
  // chat_template.json; bos and eos come from tokenizer_config.json (one as an AddedToken
  // object). Templates that read the clock (strftime_now) are left to RealTemplatesMatchJinja2,
  // which fixes it.
  const Json& doc = expected();
  std::map<std::string, const Json*> convs;
  for (const Json& c : doc["conversations"]) convs[c["name"].get<std::string>()] = &c;
  size_t total = 0, matched = 0, forms[4] = {0, 0, 0, 0}, k = 0;
  for (const auto& [file, cases] : doc["templates"].items()) {
    std::string source = read_text(templates_dir() + "/" + file);
    if (source.find("strftime_now") != std::string::npos) continue;
    TokenizerFolder folder({"<|bos|>", "<|eos|>"});
    Json config = {{"bos_token", "<|bos|>"},
                   {"eos_token", {{"content", "<|eos|>"}, {"special", true}}}};
    const int form = static_cast<int>(k++ % 4);
    const char* how[] = {"config string", "config list", "chat_template.jinja",
                         "chat_template.json"};
    if (form == 0) config["chat_template"] = source;
    if (form == 1) {
      config["chat_template"] = Json::array({Json{{"name", "rag"}, {"template", "RAG"}},
                                             Json{{"name", "default"}, {"template", source}}});
    }
    if (form == 2) {
      config["chat_template"] = "{{ raise_exception('the config template was used') }}";
      write_text(folder.dir() / "chat_template.jinja", source);
    }
    if (form == 3)
      write_text(folder.dir() / "chat_template.json", Json{{"chat_template", source}}.dump());
    folder.config(config);
    wick::Tokenizer tok = folder.load();
    EXPECT_EQ(tok.chat_template(), source) << file;
    matched += check_tokenizer_cases(tok, file, convs, cases, how[form]);
    total += cases.size();
    ++forms[form];
  }
  EXPECT_EQ(matched, total);
  EXPECT_GE(total, 200u);
  for (size_t n : forms) EXPECT_GE(n, 4u);
}

TEST(TokenizerChatTemplate, NoTemplateIsAnErrorNamingTheFile) {
  TokenizerFolder folder({"<|im_start|>", "<|im_end|>"});
  folder.config({{"eos_token", "<|im_end|>"}});
  wick::Tokenizer tok = folder.load();
  EXPECT_EQ(tok.chat_template(), "");
  auto expect_no_template = [](const wick::Tokenizer& t, const std::string& file) {
    try {
      (void)t.apply_chat_template({{"user", "hi"}});
      ADD_FAILURE() << "rendered without a template";
    } catch (const wick::TokenizerError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("no chat template"), std::string::npos) << msg;
      EXPECT_NE(msg.find(file), std::string::npos) << msg;
    }
  };
  expect_no_template(tok, (folder.dir() / "tokenizer.json").string());
  // The hard-coded formats are gone: ChatML tokens alone make no template.
  EXPECT_THROW(wick::Tokenizer::from_json(read_text((folder.dir() / "tokenizer.json").string()))
                   .apply_chat_template({{"user", "hi"}}),
               wick::TokenizerError);
  // all-MiniLM-L6-v2's folder has a tokenizer_config.json without one.
  auto minilm = wick::testing::bert::minilm_dir();
  if (minilm.empty()) GTEST_SKIP() << "set WICK_MINILM_DIR for the MiniLM half";
  wick::Tokenizer bert = wick::Tokenizer::from_file(minilm.string());
  expect_no_template(bert, (minilm / "tokenizer.json").string());
}

TEST(TokenizerChatTemplate, NamedTemplatesSpecialTokensAndErrors) {
  TokenizerFolder folder({"<s>", "</s>"});
  // transformers passes each named special token (a string or an AddedToken's content) and the
  // model-specific extra_special_tokens; "tool_use" is used when there are tools.
  folder.config(
      {{"bos_token", "<s>"},
       {"eos_token", {{"content", "</s>"}, {"lstrip", false}}},
       {"unk_token", "[UNK]"},
       {"sep_token", "[SEP]"},
       {"pad_token", nullptr},
       {"cls_token", "[CLS]"},
       {"mask_token", "[MASK]"},
       {"extra_special_tokens", {{"image_token", "<img>"}}},
       {"chat_template",
        Json::array({Json{{"name", "default"},
                          {"template",
                           "{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ sep_token }}|"
                           "{{ pad_token is defined }}|{{ cls_token }}|{{ mask_token }}|"
                           "{{ image_token }}|{{ messages[0].content }}"}},
                     Json{{"name", "tool_use"}, {"template", "T{{ tools|length }}"}}})}});
  wick::Tokenizer tok = folder.load();
  EXPECT_EQ(tok.apply_chat_template({{"user", "hi"}}, false),
            "<s>|</s>|[UNK]|[SEP]|False|[CLS]|[MASK]|<img>|hi");
  EXPECT_EQ(tok.apply_chat_template({{"user", "hi"}}, false, {{"tools", {1, 2}}}), "T2");
  EXPECT_EQ(tok.apply_chat_template({{"user", "hi"}}, false, {{"tools", nullptr}}).substr(0, 3),
            "<s>");
  // extra replaces a special token.
  EXPECT_EQ(tok.apply_chat_template({{"user", "hi"}}, false, {{"bos_token", "B"}}).substr(0, 2),
            "B|");

  // Templates in additional_chat_templates/ beside chat_template.jinja, as transformers saves
  // several.
  fs::create_directories(folder.dir() / "additional_chat_templates");
  write_text(folder.dir() / "chat_template.jinja", "D{{ add_generation_prompt }}");
  write_text(folder.dir() / "additional_chat_templates" / "tool_use.jinja", "U");
  wick::Tokenizer files = folder.load();
  EXPECT_EQ(files.apply_chat_template({{"user", "hi"}}, true), "DTrue");
  EXPECT_EQ(files.apply_chat_template({{"user", "hi"}}, true, {{"tools", Json::array()}}), "U");

  // Several templates and none named default: transformers refuses too.
  fs::remove(folder.dir() / "chat_template.jinja");
  EXPECT_THROW(folder.load().apply_chat_template({{"user", "hi"}}), wick::TokenizerError);
  fs::remove_all(folder.dir() / "additional_chat_templates");

  // A template wick cannot read loads, and fails when used; a raising one raises.
  folder.config({{"chat_template", "{% include 'x' %}"}});
  wick::Tokenizer bad = folder.load();
  EXPECT_THROW(bad.apply_chat_template({{"user", "hi"}}), ChatTemplateError);
  EXPECT_EQ(bad.end_of_turn_ids(), std::vector<uint32_t>{folder.id("</s>")});  // eos alone
  folder.config({{"chat_template", "{{ raise_exception('no users') }}"}});
  EXPECT_THROW(folder.load().apply_chat_template({{"user", "hi"}}), ChatTemplateError);
  // Malformed template lists are a TokenizerError at load.
  folder.config({{"chat_template", Json::array({Json{{"name", "default"}}})}});
  EXPECT_THROW(folder.load(), wick::TokenizerError);
  folder.config({{"chat_template", 3}});
  EXPECT_THROW(folder.load(), wick::TokenizerError);
  write_text(folder.dir() / "chat_template.json", "{\"template\": \"x\"}");
  EXPECT_THROW(folder.load(), wick::TokenizerError);
}

TEST(TokenizerChatTemplate, EndOfTurnTokensComeFromTheTemplate) {
  // The token each released template ends an assistant turn with (from the models' model
  // cards and generation configs), beside the tokenizer's eos.
  struct Case {
    const char* file;
    const char* turn_end;
  };
  for (const Case& c : {Case{"Qwen-Qwen2.5-7B-Instruct.jinja", "<|im_end|>"},
                        Case{"HuggingFaceTB-SmolLM2-135M-Instruct.jinja", "<|im_end|>"},
                        Case{"meta-llama-Llama-3.1-8B-Instruct.jinja", "<|eot_id|>"},
                        Case{"google-gemma-2-2b-it.jinja", "<end_of_turn>"},
                        Case{"microsoft-Phi-3.5-mini-instruct.jinja", "<|end|>"},
                        Case{"mistralai-Mistral-Nemo-Instruct-2407.jinja", "</s>"}}) {
    TokenizerFolder folder({"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<bos>",
                            "<start_of_turn>", "<end_of_turn>", "<|user|>", "<|assistant|>",
                            "<|end|>", "<s>", "</s>", "[INST]", "[/INST]"});
    std::string eos = std::string(c.turn_end) == "</s>" ? "</s>" : "<|endoftext|>";
    folder.config({{"bos_token", "<s>"},
                   {"eos_token", eos},
                   {"chat_template", read_text(templates_dir() + "/" + c.file)}});
    std::vector<uint32_t> want = {folder.id(eos)};
    if (eos != c.turn_end) want.push_back(folder.id(c.turn_end));
    EXPECT_EQ(folder.load().end_of_turn_ids(), want) << c.file;
  }
  // A turn-end token the tokenizer does not mark special, or an unknown word after the reply,
  // is no stop token; without eos or template there is none.
  TokenizerFolder folder({"<|im_start|>"}, {"<|im_end|>"});
  folder.config(
      {{"chat_template", read_text(templates_dir() + "/Qwen-Qwen2.5-7B-Instruct.jinja")}});
  EXPECT_EQ(folder.load().end_of_turn_ids(), std::vector<uint32_t>{});
  folder.config({{"chat_template", "{% for m in messages %}{{ m.content }} zzz {% endfor %}"}});
  EXPECT_EQ(folder.load().end_of_turn_ids(), std::vector<uint32_t>{});
  folder.config(Json::object());
  EXPECT_EQ(folder.load().end_of_turn_ids(), std::vector<uint32_t>{});
}

TEST(TokenizerChatTemplate, SmolLM2GgufTemplate) {
  // SmolLM2-135M-Instruct's GGUF stores its template in tokenizer.chat_template: rendered
  // through the GGUF tokenizer it equals jinja2's rendering of the same template.
  WICK_REQUIRE_SMOLLM2(path);
  wick::Tokenizer tok = wick::models::load_gguf_tokenizer(path);
  const std::string file = "HuggingFaceTB-SmolLM2-135M-Instruct.jinja";
  EXPECT_EQ(tok.chat_template(), read_text(templates_dir() + "/" + file));
  const Json& doc = expected();
  std::map<std::string, const Json*> convs;
  for (const Json& c : doc["conversations"]) convs[c["name"].get<std::string>()] = &c;
  const Json& cases = doc["templates"][file];
  EXPECT_EQ(check_tokenizer_cases(tok, file, convs, cases, "GGUF"), cases.size());
  std::vector<uint32_t> ends = tok.end_of_turn_ids();
  ASSERT_TRUE(tok.token_to_id("<|im_end|>").has_value());
  EXPECT_NE(std::find(ends.begin(), ends.end(), *tok.token_to_id("<|im_end|>")), ends.end());
}

}  // namespace
