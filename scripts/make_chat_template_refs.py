#!/usr/bin/env python3
"""Writes tests/data/chat_templates/expected.json: every template in ../shared/chat_templates/
rendered for each conversation below, with add_generation_prompt off and on, by Python's jinja2
set up as transformers' apply_chat_template sets it up (transformers/utils/chat_template_utils.py:
_compile_jinja_template and render_jinja_template), without importing transformers.

    pip install jinja2==3.1.6
    python3 scripts/make_chat_template_refs.py [--templates DIR] [--out FILE]

tests/test_chat_template.cpp renders the same templates and conversations with wick::ChatTemplate
and compares byte for byte; a template that raises here must raise wick::ChatTemplateError there.
"""

import argparse
import json
import pathlib
from datetime import datetime, timezone

import jinja2
import jinja2.ext
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

JINJA2_VERSION = "3.1.6"
# strftime_now reads this instant (UTC); the C++ test fixes the same one with set_now.
FIXED_TIME = 1767225600 + 12 * 86400 + 3600 * 9 + 60 * 30  # 2026-01-13 09:30:00 UTC
BOS, EOS = "<|bos|>", "<|eos|>"


class TemplateRaised(jinja2.exceptions.TemplateError):
    """raise_exception(message) called by the template."""


class GenerationTag(Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

    def _generation(self, caller):
        return caller()


def compile_template(source):
    def raise_exception(message):
        raise TemplateRaised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.fromtimestamp(FIXED_TIME, tz=timezone.utc).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                         "description": "Temperature unit"},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "What to look for"},
                           "max_results": {"type": "integer", "description": "At most this many"}},
            "required": ["query"],
        },
    },
}


def tool_call(arguments):
    return {"id": "call0a1b2", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}


# Each conversation: messages and the extra variables the template sees (bos/eos always).
CONVERSATIONS = [
    {"name": "system_user",
     "messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is the capital of France?"}]},
    {"name": "user_only",
     "messages": [{"role": "user", "content": "Hello!"}]},
    {"name": "multi_turn",
     "messages": [{"role": "user", "content": "Hi, who are you?"},
                  {"role": "assistant", "content": "I am an assistant. How can I help?"},
                  {"role": "user", "content": "Tell me a joke."}]},
    {"name": "assistant_last",
     "messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "2 + 2?"},
                  {"role": "assistant", "content": "4"},
                  {"role": "user", "content": "And 3 + 3?"},
                  {"role": "assistant", "content": "6"}]},
    {"name": "unicode",
     "messages": [{"role": "system", "content": "Réponds en français, s'il te plaît. \"Quotes\" & <tags>"},
                  {"role": "user", "content": "日本語のテキスト 🌍🚀 — ümlaut, tab\there\nnew line"},
                  {"role": "assistant", "content": "Привет! Ça va? 😀"},
                  {"role": "user", "content": "Ελληνικά «guillemets» \\ backslash"}]},
    {"name": "empty_content",
     "messages": [{"role": "user", "content": ""},
                  {"role": "assistant", "content": ""},
                  {"role": "user", "content": "   "}]},
    {"name": "whitespace_and_thinking",
     "messages": [{"role": "user", "content": "  leading and trailing spaces  \n\n"},
                  {"role": "assistant",
                   "content": "<think>\nThe user wants spaces.\n</think>\n\nHere you go.  "},
                  {"role": "user", "content": "\nThanks\n"}]},
    {"name": "tool_call_dict_arguments",
     "tools": [WEATHER_TOOL, SEARCH_TOOL],
     "messages": [{"role": "system", "content": "You can call tools."},
                  {"role": "user", "content": "What's the weather in Paris?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [tool_call({"city": "Paris", "unit": "celsius"})]},
                  {"role": "tool", "tool_call_id": "call0a1b2", "name": "get_weather",
                   "content": "{\"temperature\": 21, \"condition\": \"sunny\"}"},
                  {"role": "assistant", "content": "It is 21 °C and sunny in Paris."},
                  {"role": "user", "content": "Thanks!"}]},
    {"name": "tool_call_string_arguments",
     "tools": [WEATHER_TOOL],
     "messages": [{"role": "user", "content": "Weather in Tokyo?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [tool_call("{\"city\": \"Tokyo\"}")]},
                  {"role": "tool", "tool_call_id": "call0a1b2", "name": "get_weather",
                   "content": "rainy, 12 degrees"}]},
    {"name": "tools_no_call",
     "tools": [SEARCH_TOOL],
     "messages": [{"role": "system", "content": "Use tools when needed."},
                  {"role": "user", "content": "Find recent news about Mars."}]},
    {"name": "functions_and_datetime",
     "extra": {"functions": json.dumps([WEATHER_TOOL["function"]], indent=2),
               "datetime": "2026-01-13"},
     "messages": [{"role": "system", "content": "You are a weather bot."},
                  {"role": "user", "content": "Is it cold in Oslo?"},
                  {"role": "assistant", "content": "Let me check."},
                  {"role": "user", "content": "Please do."}]},
    {"name": "tools_assistant_last",
     "tools": [WEATHER_TOOL, SEARCH_TOOL],
     "messages": [{"role": "user", "content": "Hello"},
                  {"role": "assistant", "content": "Hi! I can check the weather or search."},
                  {"role": "user", "content": "Not now, thanks."},
                  {"role": "assistant", "content": "Alright."}]},
    {"name": "reasoning_off",
     "extra": {"enable_thinking": False},
     "messages": [{"role": "user", "content": "Quick answer: 7 * 6?"},
                  {"role": "assistant", "content": "42", "reasoning_content": "Multiply."},
                  {"role": "user", "content": "Now 8 * 9?"}]},
]


# Small templates, one construct each, rendered with the variables given: the engine's semantics
# (printing, truthiness, operators, filters, tests, methods, whitespace control, scoping) against
# jinja2's own.
SNIPPETS = [
    ("{{ x }}|{{ y }}|{{ z }}|{{ n }}|{{ t }}|{{ f }}", {"x": 1, "y": 1.5, "z": None, "n": "s", "t": True, "f": False}),
    ("{{ 1.0 }} {{ 1e20 }} {{ 1e-5 }} {{ 0.0001 }} {{ 10/2 }} {{ 7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 0.1+0.2 }} {{ 1/3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("{{ [1, 'a', None, True, 1.0, {'k': \"it's\"}] }} {{ (1,) }} {{ (1, 'x') }} {{ {} }} {{ [] }}", {}),
    ("{{ 'a\\nb' }}|{{ \"q'\" }}|{{ 'tab\\t' ~ 'x' }}|{{ '\\u00e9\\x41' }}", {}),
    ("{{ d }}", {"d": {"b": 1, "a": [1, 2.5, "x"], "c": {"z": None}}}),
    ("{{ s[1:3] }}|{{ s[::-1] }}|{{ s[-2:] }}|{{ s[:-1] }}|{{ l[1:] }}|{{ l[::2] }}|{{ l[-1] }}|{{ s[0] }}|{{ l[5] is defined }}", {"s": "héllo", "l": [1, 2, 3, 4]}),
    ("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.previtem }}{{ loop.nextitem }},{% endfor %}", {"l": ["a", "b", "c"]}),
    ("{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}", {"l": [1, 2, 3]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %}", {"d": {"b": 2, "a": 1, "C": 3}}),
    ("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% set x = 1 %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}{% endfor %}<{{ x }}>{% if true %}{% set y = 3 %}{% endif %}{{ y }}", {}),
    ("{% set ns = namespace(a=1, b='x') %}{% for i in [1, 2, 3] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}", {}),
    ("{% macro m(a, b='dflt', c=none) %}<{{ a }}|{{ b }}|{{ c }}>{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m('x', c=3) }}{{ m() }}", {}),
    ("{% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}inside {{ v }}{% endcall %}", {"v": 5}),
    ("{% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}", {}),
    ("{% filter upper %}hello {{ n }}{% endfilter %}|{% set b %}  block {{ n }}  {% endset %}[{{ b }}]{% set c | trim %}  trimmed  {% endset %}[{{ c }}]", {"n": "w"}),
    ("a\n  {% if true %}\n  b\n  {% endif %}\n  c\n{# comment #}\n  d {{- ' e ' -}} f\n  {%- if true %} g {% endif -%}\n h\n", {}),
    ("  {%+ if true %}x{% endif +%}\n  {{ 'y' }}\n{%- raw %} {{ not parsed }} {% endraw %}\n", {}),
    ("{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ x is string }}{{ x is not string }}{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is boolean }}{{ d is mapping }}{{ l is iterable }}{{ x is iterable }}{{ 1 is iterable }}{{ l is sequence }}{{ false is false }}{{ 1 is true }}{{ 3 is odd }}{{ 4 is even }}{{ 6 is divisibleby 3 }}{{ 6 is divisibleby(4) }}{{ 'a' is in 'abc' }}{{ 2 is eq 2 }}{{ 'ab' is lower }}{{ 'AB' is upper }}", {"x": "s", "n": None, "d": {}, "l": [1]}),
    ("{{ l|length }}{{ s|length }}{{ d|length }}{{ s|upper }}{{ s|lower }}{{ ' pad '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ s|capitalize }}{{ 'hello wor-ld (x'|title }}|{{ l|first }}{{ l|last }}{{ l|join('-') }}{{ l|join }}{{ s|list }}{{ l|reverse|list }}{{ s|reverse }}", {"l": [3, 1, 2], "s": "héLLo", "d": {"a": 1}}),
    ("{{ u|default('dflt') }}|{{ e|default('dflt') }}|{{ e|default('dflt', true) }}|{{ n|default('x') }}|{{ n|d('x', true) }}", {"e": "", "n": None}),
    ("{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ l|tojson }}|{{ 'é\\\"<>&'|tojson }}|{{ d|tojson(sort_keys=true) }}|{{ 1.0|tojson }}|{{ n|tojson }}|{{ d|tojson(separators=(',', ':')) }}|{{ 'é'|tojson(ensure_ascii=true) }}", {"d": {"z": [1, {"y": None}], "a": "ü", "e": {}, "f": []}, "l": [True, False, 1.5], "n": None}),
    ("{{ l|map(attribute='name')|join(',') }}|{{ l|selectattr('on')|map(attribute='name')|list }}|{{ l|rejectattr('on')|list|length }}|{{ l|selectattr('name', 'equalto', 'b')|list }}|{{ [1, 2, 3, 4]|select('odd')|list }}|{{ [1, 2, 3]|reject('odd')|list }}|{{ ['1', '2']|map('int')|sum }}|{{ l|map(attribute='missing', default='m')|list }}", {"l": [{"name": "a", "on": True}, {"name": "b", "on": False}, {"name": "c", "on": 1}]}),
    ("{{ ['b', 'A', 'a', 'B']|unique|list }}|{{ ['b', 'A', 'c']|sort }}|{{ ['b', 'A', 'c']|sort(case_sensitive=true) }}|{{ [3, 1, 2]|sort(reverse=true) }}|{{ l|sort(attribute='n')|map(attribute='n')|list }}|{{ [3, 1, 2]|max }}{{ [3, 1, 2]|min }}", {"l": [{"n": 2}, {"n": 1}]}),
    ("{{ 'a b  c'.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}|{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'aaa'.replace('a', 'b', 2) }}{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'hi there'.title() }}{{ 'hi'.capitalize() }}{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}{{ 'abcb'.count('b') }}{{ '-'.join(['a', 'b']) }}{{ '{} and {}'.format(1, 'x') }}{{ 'a\\nb\\r\\nc'.splitlines() }}{{ '12'.isdigit() }}", {}),
    ("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list }}{{ d['a'] }}{{ d.a }}{{ d.missing is defined }}{{ 'a' in d }}{{ 'z' not in d }}{{ 2 in [1, 2] }}{{ 'b' in 'abc' }}", {"d": {"a": 1, "b": [2]}}),
    ("{{ 1 + 2 * 3 }}{{ (1 + 2) * 3 }}{{ 'a' ~ 1 ~ none }}{{ 'ab' * 3 }}{{ [1] + [2] }}{{ [0] * 3 }}{{ -2 ** 2 }}{{ not true or false }}{{ 1 < 2 < 3 }}{{ 1 < 2 > 3 }}{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ none or 'x' }}{{ 0 and 'y' }}{{ '' or [] }}{{ 'x' if false }}|{{ 'y' if 0 else 'z' }}", {}),
    ("{{ 'a %s b %d' % ('x', 3) }}|{{ '%s!'|format('hi') }}|{{ 5|string ~ 'x' }}|{{ '42'|int + 1 }}|{{ 'x'|int }}|{{ '3.5'|float }}|{{ 3.7|int }}|{{ -3|abs }}|{{ 2.567|round(2) }}|{{ 2.5|round }}", {}),
    ("{{ text|indent(2) }}|{{ text|indent(2, true) }}|{{ text|indent(2, blank=true) }}|{{ text|replace('\\n', ' / ') }}|{{ 'x'|safe + '<y>' }}|{{ '<a>'|e }}", {"text": "line1\n\nline2\nline3"}),
    ("{{ strftime_now('%Y-%m-%d %H:%M') }} {{ strftime_now('%d %B %Y') }}", {}),
    ("{{ raise_exception('custom failure ' ~ 42) }}", {}),
    ("{{ x.y.z }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ u + 'a' }}", {}),
    ("{% for x in 5 %}{% endfor %}", {}),
    ("{{ [].append(1) }}", {}),
    ("{% set d = {'a': 1} %}{{ d.update({'b': 2}) }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ range(200000)|length }}", {}),
    ("{{ [1, 2, 3]|sum }}{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}{{ dict(a=1, b='x') }}", {}),
    ("{%- for m in messages -%}{%- if loop.first and m.role == 'system' -%}S:{{ m.content }}{%- elif m['role'] == 'user' -%}\n U:{{ m['content'] | trim }}{%- endif -%}{%- endfor -%}\n", {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": " hi "}]}),
    ("{{ none.attr is defined }}|{{ 5.attr is defined }}|{{ d['x'] is defined }}|{{ l['k'] is defined }}|{{ (d|items|list) }}|{{ u|items|list }}", {"d": {"a": 1}, "l": [1]}),
    ("{{ 'abc'[5] is defined }}{{ 'π'|length }}{{ '🌍x'[1] }}{{ 'ÀÉ'|lower }}{{ 'straße'|upper }}", {}),
    ("{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }}{% for p, q in [[1, 2], [3, 4]] %}{{ p * q }}{% endfor %}{{ l.0 }}{{ \"a\" 'b' }}", {"l": [9]}),
    ("{% for x in l %}{{ loop.cycle('odd', 'even') }}{{ loop.previtem is defined }}{% endfor %}", {"l": [1, 2, 3]}),
    ("{{ none == none }}{{ u == u2 }}{{ [] is sameas [] }}{{ none is sameas none }}{{ 1 is sameas 1 }}{{ ns is mapping }}{{ {} is mapping }}", {}),
    ("{{ [3, 2, 1]|sort|first }}{{ {'b': 1, 'a': 2}|dictsort(by='value') }}{{ range(3)|map('string')|join }}{{ 'abc'|replace('b', '') }}{{ {'a': 1}|join('|') }}{{ []|first }}|{{ 'xy'|list|last }}", {}),
    ("{{ 10 // 3 }}{{ 2 ** -1 }}{{ 7 % -3 }}{{ true and 'x' }}{{ [] or none }}{{ -7 // 2 }}{{ 3 * 'ab' }}{{ 1.5 + true }}{{ 2 ** 62 }}{{ 10 / 4 }}", {}),
    ("{{ 'x' in none }}", {}),
    ("{{ 1 in 'abc' }}", {}),
    ("{{ u.x }}", {}),
    ("{{ 1 < 'a' }}", {}),
    ("{{ u|tojson }}", {}),
    ("{{ d.x.y }}", {"d": {"x": None}}),
    ("{{ l[1:2].x is defined }}{{ d[1:] is defined }}{{ d[none] is defined }}", {"l": [1, 2], "d": {"a": 1}}),
    ("a  \n\t{% if true %}x{% endif %}  \n  {#- c -#}  y\r\nz {{- 'q' }}\n\n", {}),
    ("{%- macro m(x) -%}[{{ x }}]{%- endmacro -%}\n{{ m(1) }}\n  {{ m(2) }}\n", {}),
    ("{% macro m() %}<{{ caller(1, 2) }}>{% endmacro %}{% call(a, b) m() %}{{ a + b }}{% endcall %}{% filter indent(2, true) %}a\nb{% endfilter %}", {}),
    ("{% if a %}A{% elif b %}B{% elif c %}C{% else %}D{% endif %}{% if not a and not b %}!{% endif %}", {"b": 0, "c": [1]}),
    ("{{ messages[-1] }}|{{ messages|length }}|{{ messages[0].content|default('none', true) }}", {"messages": [{"role": "user", "content": "it's \"q\" \\ é\n"}, {"role": "assistant", "content": None, "tool_calls": [{"a": 1.5e-7, "b": 1e300}]}]}),
    ("{{ x|tojson }}{{ x|string }}{{ x|float }}{{ x|int }}", {"x": 12345678901234.5}),
    ("{{ 'a\u00a0b\u3000c'.split() }}{{ ' \u2003x\u2003 '|trim }}|{{ 'ǅx'|upper }}{{ 'ΣΑΣ ΣΑΣ'|lower }}", {}),
    ("{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.items }}{{ ns.items|tojson }}", {}),
    ("{% for m in messages %}{% set content = m.content %}{% if content is string %}{{ content }}{% else %}{% for part in content %}{{ part.text }}{% endfor %}{% endif %}{% endfor %}", {"messages": [{"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}, {"role": "user", "content": "C"}]}),
    ("{{ d|items|list }}{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}{{ d.values()|list|tojson }}", {"d": {"z": 1, "a": {"n": [True]}}}),
    ("{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% set c = 3 %}{% endwith %}{{ a }}{{ c is defined }}", {}),
    ("{{ 'abcdef'[1::9223372036854775807] }}{{ [1, 2, 3][-1::-9223372036854775807] }}{{ range(9223372036854775806, 9223372036854775807, 1000)|list }}{{ 'abc'[5:1:-1] }}{{ 'abc'[-9:9] }}", {}),
    ("{{ 2.0 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3.0 }}{{ ['b']|map(attribute='x')|list }}{{ range(3) }}{{ range(1, 9, 2) }}{{ 'abc' % [] }}", {}),
    ("{{ 'a' is even }}", {}),
    ("{{ {}|indent(2) }}", {}),
    ("{{ 'abc' % 2 }}", {}),
    ("{{ (1, 2) + (3,) }}{{ [1, [2, (3, 4)]] }}{{ 'a'.join(['x', 'y']) }}{{ 'é'|length }}{{ 'a-b_c d'|title }}{{ 'ab'|center(6) if false else 'no' }}", {}),
]


def render(template, conv, add_generation_prompt):
    extra = {"bos_token": BOS, "eos_token": EOS}
    extra.update(conv.get("extra", {}))
    tools = conv.get("tools")
    try:
        out = template.render(messages=conv["messages"], tools=tools, documents=None,
                              add_generation_prompt=add_generation_prompt, **extra)
        return {"output": out}
    except TemplateRaised as e:
        return {"error": "raise_exception", "message": str(e)}
    except Exception as e:  # noqa: BLE001 - any failure of the template is recorded
        return {"error": type(e).__name__, "message": str(e)}


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--templates", default=str(root.parent / "shared" / "chat_templates"))
    ap.add_argument("--out", default=str(root / "tests/data/chat_templates/expected.json"))
    args = ap.parse_args()
    if jinja2.__version__ != JINJA2_VERSION:
        raise SystemExit(f"jinja2 {JINJA2_VERSION} is required (found {jinja2.__version__})")

    conversations = []
    for conv in CONVERSATIONS:
        extra = {"bos_token": BOS, "eos_token": EOS}
        extra.update(conv.get("extra", {}))
        if "tools" in conv:
            extra["tools"] = conv["tools"]
        conversations.append({"name": conv["name"], "messages": conv["messages"], "extra": extra})

    templates = {}
    for path in sorted(pathlib.Path(args.templates).glob("*.jinja")):
        template = compile_template(path.read_text(encoding="utf-8"))
        results = []
        for conv in CONVERSATIONS:
            for agp in (False, True):
                r = render(template, conv, agp)
                r.update({"conversation": conv["name"], "add_generation_prompt": agp})
                results.append(r)
        templates[path.name] = results
    snippets = []
    for source, variables in SNIPPETS:
        entry = {"template": source, "variables": variables}
        try:
            entry["output"] = compile_template(source).render(**variables)
        except TemplateRaised as e:
            entry.update({"error": "raise_exception", "message": str(e)})
        except Exception as e:  # noqa: BLE001
            entry.update({"error": type(e).__name__, "message": str(e)})
        snippets.append(entry)
    doc = {"jinja2": JINJA2_VERSION, "fixed_time": FIXED_TIME, "conversations": conversations,
           "templates": templates, "snippets": snippets}
    pathlib.Path(args.out).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n",
                                      encoding="utf-8")
    errors = sum(1 for rs in templates.values() for r in rs if "error" in r)
    total = sum(len(rs) for rs in templates.values())
    print(f"{len(templates)} templates x {len(CONVERSATIONS)} conversations x 2: {total} renders, "
          f"{errors} raise")


if __name__ == "__main__":
    main()
