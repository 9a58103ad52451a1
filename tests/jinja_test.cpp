// The Jinja interpreter (runtime/jinja/, docs/chat-templates.md): each construct with its exact
// output, the limits and malformed templates as error values, provenance through concatenation
// and filters, and the oracle: every vendored template (tests/data/templates) rendered on a
// shared set of conversations by troupe and by npm @huggingface/jinja, byte for byte.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/jinja/jinja.hpp"
#include "tests/support/npm_packages.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

/// The render's text, or "error: " and its message.
std::string render_or_error(const std::string& source, const std::string& context_json = "{}",
                            const jinja::render_options& options = {}) {
  auto r = jinja::render(source, ordered_json::parse(context_json), options);
  return r ? r->str() : "error: " + r.error().message;
}

struct render_case {
  const char* source;
  const char* context;
  const char* expected;
};

void expect_renders(const std::vector<render_case>& cases) {
  for (const render_case& c : cases) EXPECT_EQ(render_or_error(c.source, c.context), c.expected) << c.source;
}

TEST(Jinja, TextExpressionsAndOperators) {
  expect_renders({
      {"Hello {{ name }}!", R"({"name": "Ann"})", "Hello Ann!"},
      {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }}", "{}", "7 9 3 -4 1 2 1024"},
      {"{{ 7 / 2 }} {{ 1.5 + 1 }} {{ 10 / 5 }}", "{}", "3.5 2.5 2.0"},
      {"{{ 'a' ~ 1 ~ none }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 'ab' * 3 }}", "{}", "a1None ab [1, 2] ababab"},
      {"{{ 1 < 2 and 2 <= 2 }} {{ 'b' > 'a' }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ not 1 }} {{ 0 or 'x' }} {{ '' and 'y' }}", "{}",
       "True True True True False x "},
      {"{{ 'yes' if x else 'no' }} {{ 'yes' if y else 'no' }} [{{ 'z' if false }}]", R"({"x": true, "y": []})", "yes no []"},
      {"{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 'q' not in d }}", R"({"d": {"k": 1}})", "True True True True"},
      {"{{ x is defined }} {{ y is not defined }} {{ none is none }} {{ d is mapping }} {{ l is sequence }} {{ 's' is string }}",
       R"({"x": 1, "d": {}, "l": []})", "True True True True True True"},
      {"{{ 3 is number }} {{ 3 is integer }} {{ 3.0 is integer }} {{ true is boolean }} {{ l is iterable }} {{ 1 is iterable }} {{ true is number }} {{ true is integer }}",
       R"({"l": [1]})", "True True False True True False True False"},
      {"{{ 'a' is equalto 'a' }} {{ 2 is eq 3 }} {{ 'a' is in ['a'] }} {{ 4 is even }} {{ 3 is odd }} {{ x is undefined }}", "{}",
       "True False True True True True"},
      {"{{ {'a': 1, 'b': [1, 'x']} }} {{ [true, none, 1.5] }} {{ \"it's\" }}", "{}", "{'a': 1, 'b': [1, 'x']} [True, None, 1.5] it's"},
      {"{{ 'a' 'b' }} {{ \"q\\\"\\n\" }}", "{}", "ab q\"\n"},
  });
}

TEST(Jinja, SubscriptsSlicesAndAttributes) {
  expect_renders({
      {"{{ m[0]['role'] }} {{ m[0].role }} {{ m[-1].content }} {{ m[5] }}|{{ m[0].nope }}|", R"({"m": [{"role": "user"}, {"content": "hi"}]})",
       "user user hi ||"},
      {"{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[1:-1] }} {{ l[::2] }}", R"({"l": [1, 2, 3, 4]})",
       "[2, 3, 4] [1, 2] [4, 3, 2, 1] [3, 4] [2, 3] [1, 3]"},
      {"{{ s[0] }}{{ s[-1] }} {{ s[1:3] }} {{ s[::-1] }}", R"({"s": "héllo"})", "ho él olléh"},
      {"{{ x.a }}", "{}", "error: line 1, column 4: 'x' is undefined"},
  });
}

TEST(Jinja, StringListAndDictMethods) {
  expect_renders({
      {"[{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}]", R"({"s": "  a b  "})", "[a b|a b  |  a b|a]"},
      {"{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }}", "{}", "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c']"},
      {"{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.endswith('x') }}", "{}", "True True False"},
      {"{{ 'aBc'.upper() }} {{ 'aBc'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}", "{}",
       "ABC abc Hello World Hello"},
      {"{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} {{ 'ab'.replace('', '.') }}", "{}", "a+b+c ab-c .a.b."},
      {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d.keys() }} {{ d.values() }} {{ d.get('a') }} {{ d.get('z', 9) }} {{ d.get('z') }}",
       R"({"d": {"b": 2, "a": 1}})", "b=2;a=1; ['b', 'a'] [2, 1] 1 9 None"},
      {"{% set l = [] %}{{ l.append(1) }}{{ l.append(2) }}{{ l }} {{ l.pop() }} {{ l }}", "{}", "NoneNone[1, 2] 2 [1]"},
  });
}

TEST(Jinja, Filters) {
  expect_renders({
      {"[{{ '  a  '|trim }}] {{ 'abc'|length }} {{ [1, 2]|count }} {{ {'a': 1}|length }} {{ [1, 2, 3]|join('-') }} {{ ['a', 'b']|join }}", "{}",
       "[a] 3 2 1 1-2-3 ab"},
      {"{{ x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ [3, 4]|first }} {{ [3, 4]|last }} {{ 'xy'|first }}", "{}",
       "d  d 3 4 x"},
      {"{{ l|map(attribute='n')|list }} {{ l|map(attribute='q', default=0)|list }} {{ ['a', 'b']|map('upper')|join }}",
       R"({"l": [{"n": 1}, {"n": 2}]})", "[1, 2] [0, 0] AB"},
      {"{{ [0, 1, 2]|select|list }} {{ [1, 2, 3, 4]|select('even')|list }} {{ [1, 2, 3]|reject('equalto', 2)|list }}", "{}",
       "[1, 2] [2, 4] [1, 3]"},
      {"{{ l|selectattr('t', 'equalto', 'f')|map(attribute='n')|list }} {{ l|rejectattr('t', 'equalto', 'f')|map(attribute='n')|list }} {{ l|selectattr('x')|list|length }}",
       R"({"l": [{"t": "f", "n": 1, "x": true}, {"t": "g", "n": 2}]})", "[1] [2] 1"},
      {"{{ ['a', 'A', 'b', 'a']|unique|list }} {{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ 'ab'|reverse }} {{ [1, 2]|reverse|list }}",
       "{}", "['a', 'b'] [1, 2, 3] [3, 2, 1] ba [2, 1]"},
      {"{{ d|dictsort }} {{ d|items|list }} {{ d|tojson }}", R"({"d": {"b": 1, "a": [2, "é"]}})",
       "[['a', [2, 'é']], ['b', 1]] [['b', 1], ['a', [2, 'é']]] {\"b\": 1, \"a\": [2, \"é\"]}"},
      {"{{ d|tojson(indent=2) }}", R"({"d": {"a": [1, {"b": null}], "c": {}, "e": []}})",
       "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": {},\n  \"e\": []\n}"},
      {"{{ '\"\\\\\n\u0001'|tojson }}", "{}", "\"\\\"\\\\\\n\\u0001\""},
      {"{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, first=true) }}|{{ 'a\n\nb'|indent(1, blank=true) }}", "{}",
       "a\n  b\n\n  c|  a\n  b|a\n \n b"},
      {"{{ 'x'|safe }} {{ 1|string ~ 2 }} {{ '42'|int + 1 }} {{ 'z'|int }} {{ 3.9|int }}{{ ' 3.5'|int }} {{ '2.5'|float }} {{ 2|float }} {{ 'ab'|list }}", "{}",
       "x 12 43 0 33 2.5 2.0 ['a', 'b']"},
      {"{{ '%s has %d items, %.2f%%'|format('cart', 3, 12.345) }} {{ '%s-%s' % ('a', 'b') }}", "{}", "cart has 3 items, 12.35% a-b"},
      {"{{ 'aBc'|upper }} {{ 'aBc'|lower }} {{ 'ab cd'|title }} {{ 'aB'|capitalize }} {{ 'aaa'|replace('a', 'b', 2) }}", "{}",
       "ABC abc Ab Cd Ab bba"},
      {"{{ 2.567|round(2) }} {{ 2.5|round }} {{ 2.1|round(0, 'ceil') }} {{ -3|abs }} {{ -(3|abs) }}", "{}", "2.57 3.0 3.0 3 -3"},
      {"{{ x|nope }}", "{}", "error: line 1, column 6: unknown filter 'nope'"},
  });
}

TEST(Jinja, ControlStructures) {
  expect_renders({
      {"{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}", R"({"x": 2})", "two"},
      {"{% for i in [1, 2, 3] %}{{ i }}{% if not loop.last %},{% endif %}{% endfor %}", "{}", "1,2,3"},
      {"{% for i in 'ab' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.length }};{% endfor %}",
       "{}", "1021True2;2110False2;"},
      {"{% for i in [1, 2, 3] %}{{ loop.previtem }}<{{ i }}>{{ loop.nextitem }} {% endfor %}", "{}", "<1>2 1<2>3 2<3> "},
      {"{% for i in range(10) if i % 3 == 0 %}{{ i }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", "{}", "0:1/4 3:2/4 6:3/4 9:4/4 "},
      {"{% for i in [] %}x{% else %}empty{% endfor %} {% for i in none_such %}x{% endfor %}.", "{}", "empty ."},
      {"{% for k, v in {'a': 1, 'b': 2}|items %}{{ k }}{{ v }}{% endfor %} {% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}", "{}", "a1b2 ab"},
      {"{% for i in range(1, 10, 3) %}{{ i }}{% endfor %} {% for i in range(3, 0, -1) %}{{ i }}{% endfor %}", "{}", "147 321"},
      {"{% for i in range(9) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}", "{}", "013"},
      {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", "{}", "21"},
      {"{% set ns = namespace(n=0, s='') %}{% for i in [1, 2] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", "{}", "3"},
      {"{% set x %}a{{ 1 + 1 }}b{% endset %}[{{ x }}]", "{}", "[a2b]"},
      {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}",
       "{}", "Hi A! Hi B? Hi C."},
      {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", "{}", "321"},
      {"{% macro box(t) %}[{{ t }}:{{ caller() }}]{% endmacro %}{% call box('x') %}in{% endcall %}", "{}", "[x:in]"},
      {"{% macro row(v) %}{{ caller(v * 2) }}{% endmacro %}{% call(d) row(4) %}<{{ d }}>{% endcall %}", "{}", "<8>"},
      {"{% filter upper %}a{{ 'b' }}{% endfilter %} {% filter trim | upper %}  c  {% endfilter %}", "{}", "AB C"},
      {"{# comment #}a{# {{ x }} #}b", "{}", "ab"},
      {"{{ raise_exception('bad role') }}", "{}", "error: line 1, column 4: raise_exception: bad role"},
      {"{{ strftime_now('%Y-%m-%d %a %d %b %B %A') }}", "{}", "1970-01-01 Thu 01 Jan January Thursday"},
  });
}

TEST(Jinja, StrftimeNowFormatsTheCallersDateNeverTheClock) {
  jinja::render_options options;
  options.date = {2024, 7, 26, 15, 4, 5};
  EXPECT_EQ(render_or_error("{{ strftime_now('%d %b %Y, %A %H:%M:%S %I%p %j %-d/%-m/%y') }}", "{}", options),
            "26 Jul 2024, Friday 15:04:05 03PM 208 26/7/24");
}

TEST(Jinja, WhitespaceControlAsHuggingFaceConfiguresJinja2) {
  expect_renders({
      {"a  {{- ' b ' -}}  c", "{}", "a b c"},
      {"a\n  {%- if true -%}\n  b\n  {%- endif %}\nc", "{}", "abc"},
      // trim_blocks: the newline after a block tag goes; lstrip_blocks: a block tag's indentation goes.
      {"{% if true %}\n  x\n{% endif %}\ny", "{}", "  x\ny"},
      {"    {% if true %}x{% endif %}\n", "{}", "x"},
      {"a {% if true %}b{% endif %}", "{}", "a b"},
      {"{{ 'v' }}\nz", "{}", "v\nz"},
      {"  {# c #}\nq", "{}", "q"},
      {"  {%+ if true %}r{% endif %}", "{}", "  r"},
      {"x\n", "{}", "x"},
  });
}

TEST(Jinja, MalformedTemplatesAreErrorsWithLineAndColumn) {
  expect_renders({
      {"ab\n{{ x", "{}", "error: line 2, column 1: unterminated tag (no '}}')"},
      {"{% if x %}a", "{}", "error: line 1, column 11: unterminated block: expected 'elif' before the end of the template"},
      {"{% for %}", "{}", "error: line 1, column 8: expected a name, got the end of the tag"},
      {"{{ 'abc }}", "{}", "error: line 1, column 4: unterminated string literal"},
      {"{# x", "{}", "error: line 1, column 1: unterminated comment"},
      {"{% endif %}", "{}", "error: line 1, column 4: unknown statement 'endif'"},
      {"{{ 1 + }}", "{}", "error: line 1, column 8: expected an expression, got the end of the tag"},
      {"{{ x ? 1 }}", "{}", "error: line 1, column 6: unexpected character '?'"},
      {"{{ f() }}", "{}", "error: line 1, column 4: 'f' is undefined"},
      {"{{ 1 + 'a' }}", "{}", "error: line 1, column 6: unsupported operand types for +: int and string"},
      {"{{ 1 < 'a' }}", "{}", "error: line 1, column 6: cannot compare int with string"},
      {"{{ 1 // 0 }}", "{}", "error: line 1, column 6: division by zero"},
      {"{% set ns = 1 %}{% set ns.x = 2 %}", "{}", "error: line 1, column 20: cannot assign an attribute of 'ns': not a namespace()"},
      {"{% for a, b in [1] %}{% endfor %}", "{}", "error: line 1, column 4: cannot unpack int into 2 names"},
      {"{% for x in 1 %}{% endfor %}", "{}", "error: line 1, column 13: cannot iterate, got int"},
      {"{{ 2 ** 70 }}", "{}", "error: line 1, column 6: integer overflow in **"},
  });
}

TEST(Jinja, LimitsAreErrorValues) {
  const std::string deep_ifs = [] {
    std::string s;
    for (int i = 0; i < 10000; ++i) s += "{% if true %}";
    for (int i = 0; i < 10000; ++i) s += "{% endif %}";
    return s;
  }();
  EXPECT_EQ(render_or_error(deep_ifs), "error: line 1, column 826: nested deeper than nesting_depth_max (128)");
  std::string elifs = "{% if false %}";
  for (int i = 0; i < 10000; ++i) elifs += "{% elif false %}";
  EXPECT_EQ(render_or_error(elifs + "{% endif %}"), "error: line 1, column 2007: nested deeper than nesting_depth_max (128)");
  EXPECT_EQ(render_or_error("{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}"),
            "error: line 1, column 67: nested deeper than nesting_depth_max (128)");
  std::string chain = "{{ 1";
  for (int i = 0; i < 10000; ++i) chain += " ~ 1";
  EXPECT_EQ(render_or_error(chain + " }}"), "error: line 1, column 510: nested deeper than nesting_depth_max (128)");
  EXPECT_EQ(render_or_error("{% for x in range(10**9) %}{% endfor %}"),
            "error: line 1, column 13: range of 1000000000 items passes loop_iterations_max (1048576)");
  EXPECT_EQ(render_or_error("{% for x in range(1100) %}{% for y in range(1000) %}{% endfor %}{% endfor %}"),
            "error: line 1, column 30: loops pass loop_iterations_max (1048576)");
  EXPECT_EQ(render_or_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
            "error: line 1, column 21: macro calls nested deeper than call_depth_max (32)");
  // Each call sits under a chain of 100 `~`: the evaluation depth, not the call depth, runs out first.
  std::string under_chain = "{% macro f(n) %}{{ f(n + 1)";
  for (int i = 0; i < 100; ++i) under_chain += " ~ 'a'";
  EXPECT_EQ(render_or_error(under_chain + " }}{% endmacro %}{{ f(0) }}"),
            "error: line 1, column 329: evaluation nested deeper than eval_depth_max");
  EXPECT_EQ(render_or_error("{% set l = [] %}{{ l.append(l) }}"),
            "error: line 1, column 21: append: the list would contain itself or nest deeper than nesting_depth_max");
  EXPECT_EQ(render_or_error("{% set ns = namespace(x=[]) %}{% for i in range(200) %}{% set ns.x = [ns.x] %}{% endfor %}"),
            "error: line 1, column 59: the value would contain itself or nest deeper than nesting_depth_max");
  EXPECT_EQ(render_or_error("{% set ns = namespace() %}{% set ns.me = ns %}"),
            "error: line 1, column 30: the value would contain itself or nest deeper than nesting_depth_max");
  EXPECT_EQ(render_or_error("{{ x }}", std::string(1000, '[').insert(0, "{\"x\": ") + std::string(1000, ']') + "}"),
            "error: the context's 'x' nests deeper than nesting_depth_max (128)");
  EXPECT_EQ(render_or_error("{{ 'x' * 10**8 }}"), "error: line 1, column 8: a value passes output_bytes_max (16777216 bytes)");
  jinja::render_options small;
  small.bounds.output_bytes_max = 10;
  EXPECT_EQ(render_or_error("{% for i in range(20) %}{{ i }}{% endfor %}", "{}", small),
            "error: line 1, column 25: output passes output_bytes_max (10 bytes)");
  small.bounds.template_bytes_max = 4;
  EXPECT_EQ(render_or_error("hello", "{}", small), "error: the template has 5 bytes, more than template_bytes_max (4)");
}

std::vector<std::pair<std::string, std::string>> vendored_templates();

/// Real templates cut, spliced and corrupted at seeded positions: whatever each does, the
/// render returns (text or error) within its bounds; a template is input, never a crash.
TEST(Jinja, CorruptedRealTemplatesRenderOrFailNeverCrash) {
  const ordered_json context = ordered_json::parse(R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
      {"role": "assistant", "content": "A"}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
      "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object",
      "properties": {"x": {"type": "string", "description": "x"}}, "required": ["x"]}}}]})");
  jinja::render_options options;
  options.bounds.output_bytes_max = 1 << 16;
  options.bounds.loop_iterations_max = 1 << 12;
  std::mt19937_64 rng(49);
  const std::string pieces[] = {"{%", "%}", "{{", "}}", "{#", "-", "(", ")", "[", "]", "'", "\"", " for ", " if ", " endfor ",
                                " endif ", " macro ", " set ", " in ", "|", ".", ",", "*", "**", "loop", "range(9)", "x", "\n"};
  size_t num_renders = 0, num_errors = 0;
  for (const auto& [name, source] : vendored_templates())
    for (int trial = 0; trial < 300; ++trial) {
      std::string s = source;
      for (int edit = 0; edit < 1 + trial % 4; ++edit) {
        const size_t at = rng() % (s.size() + 1);
        switch (rng() % 3) {
          case 0: s.erase(at, rng() % 16); break;
          case 1: s.insert(at, pieces[rng() % std::size(pieces)]); break;
          default: s = s.substr(0, at) + s.substr(rng() % (s.size() + 1));
        }
      }
      auto r = jinja::render(s, context, options);
      ++num_renders;
      if (!r) {
        ++num_errors;
        EXPECT_NE(r.error().message, "") << name << " trial " << trial;
      } else {
        EXPECT_LE(r->size(), options.bounds.output_bytes_max) << name << " trial " << trial;
      }
    }
  EXPECT_EQ(num_renders, 11u * 300u);
  EXPECT_GT(num_errors, 0u);  // the corruption does reach the error paths
  EXPECT_LT(num_errors, num_renders);
}

/// Byte ranges of `t` that are data, as "begin-end" pairs.
std::string data_ranges(const jinja::text& t) {
  std::string out;
  for (const jinja::origin_span& s : t.spans())
    if (s.from == jinja::origin::data) out += std::to_string(s.begin) + "-" + std::to_string(s.end) + " ";
  return out;
}

TEST(Jinja, DataStaysDataThroughConcatenationAndFilters) {
  const ordered_json context = ordered_json::parse(
      R"({"bos_token": "<s>", "m": {"role": "user", "content": "  <|im_end|> hi  "}, "tools": [{"name": "<|x|>"}]})");
  auto r = jinja::render(
      "{{ bos_token }}<|im_start|>{{ m.role ~ '\n' + m.content|trim|upper }}<|im_end|>{{ m.content|replace('hi', '<|eot|>') }}"
      "{{ tools|tojson }}{{ tools|map(attribute='name')|join('<|sep|>') }}{{ m.content.split('|')[1] }}{{ m['content'][2:4]|indent(2, true) }}",
      context);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->str(),
            "<s><|im_start|>user\n<|IM_END|> HI<|im_end|>  <|im_end|> <|eot|>  [{\"name\": \"<|x|>\"}]<|x|>im_end  <|");
  // Template-owned: bos_token, the literals, the indent's spaces. Data: every byte that came
  // from messages or tools, transformed (upper, trim, replace, tojson, split, slice) or not.
  EXPECT_EQ(data_ranges(*r), "15-19 20-33 43-95 97-99 ");
  EXPECT_EQ(r->str().substr(15, 4), "user");
  EXPECT_EQ(r->str().substr(20, 13), "<|IM_END|> HI");
  EXPECT_EQ(r->str().substr(43, 22), "  <|im_end|> <|eot|>  ");  // a replacement of a data match is data
  EXPECT_EQ(r->str().substr(95, 4), "  <|");
}

// ---- the oracle: @huggingface/jinja on every vendored template ----

const char* const weather_tool = R"({"type": "function", "function": {"name": "get_weather",
  "description": "Get the weather in a city", "parameters": {"type": "object", "properties": {
  "city": {"type": "string", "description": "The city's name"},
  "days": {"type": "integer", "description": "How many days"}}, "required": ["city"]}}})";

/// Array parameters are left out here: the tool-use templates render them differently in Jinja2
/// and @huggingface/jinja (ArrayParametersRenderAsJinja2Does pins Jinja2's rendering).
const char* const search_tool = R"({"type": "function", "function": {"name": "search",
  "description": "Search the web", "parameters": {"type": "object", "properties": {
  "query": {"type": "string", "description": "What to look for"},
  "lang": {"type": "string", "enum": ["en", "fr"], "description": "The pages' language"}}, "required": ["query"]}}})";

/// A named conversation; `tools` when it defines tools.
struct conversation {
  std::string name;
  std::string messages;  ///< JSON
  bool with_tools = false;
};

std::vector<conversation> conversations() {
  return {
      {"user", R"([{"role": "user", "content": "Hello there"}])"},
      {"system+user", R"([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}])"},
      {"multi-turn",
       R"([{"role": "system", "content": "Be kind."}, {"role": "user", "content": "What is 2+2?"},
           {"role": "assistant", "content": "4"}, {"role": "user", "content": "  And 3+3? ü 日本 \"q\" <|im_end|>  "}])"},
      {"no-system-multi-turn",
       R"([{"role": "user", "content": "A"}, {"role": "assistant", "content": "B"}, {"role": "user", "content": "C"}])"},
      {"thinking",
       R"([{"role": "user", "content": "Think"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nDone."},
           {"role": "user", "content": "Again"}])"},
      {"tools", R"([{"role": "user", "content": "Weather in Paris?"}])", true},
      {"tool-call-object-arguments",
       R"([{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
           {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
           {"role": "assistant", "content": "It is 21 degrees."}, {"role": "user", "content": "Thanks"}])",
       true},
      {"tool-call-string-arguments",
       R"([{"role": "user", "content": "Weather in Paris and Rome?"},
           {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
           {"role": "tool", "tool_call_id": "call_2", "content": "rainy"}])",
       true},
  };
}

/// The templates in tests/data/templates, by file name.
std::vector<std::pair<std::string, std::string>> vendored_templates() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& entry : fs::directory_iterator(fs::path(TROUPE_TEST_DATA_DIR) / "templates"))
    if (entry.path().extension() == ".jinja") {
      std::ifstream in(entry.path(), std::ios::binary);
      std::stringstream bytes;
      bytes << in.rdbuf();
      out.emplace_back(entry.path().filename().string(), bytes.str());
    }
  std::sort(out.begin(), out.end());
  return out;
}

/// Where @huggingface/jinja differs from Jinja2 as transformers runs it, the test follows Jinja2:
/// the oracle gets a context that Jinja2 renders the same way as troupe's (`adjust`), or, with
/// no adjust, Jinja2 raises and troupe must fail where @huggingface/jinja renders.
struct deviation {
  std::vector<std::string> templates;
  const char* reason;
  bool (*applies)(const conversation&);
  void (*adjust)(ordered_json& oracle_context);
};

const std::vector<deviation>& deviations() {
  static const std::vector<deviation> list = {
      {{"CohereForAI-c4ai-command-r-plus-tool_use.jinja", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"},
       "`for tool in tools` without tools: Jinja2 iterates an undefined value as empty, @huggingface/jinja raises; the oracle "
       "gets tools=[]",
       [](const conversation& c) { return !c.with_tools; }, [](ordered_json& context) { context["tools"] = ordered_json::array(); }},
      {{"CohereForAI-c4ai-command-r-plus-tool_use.jinja"},
       "`message.content|trim` on an assistant's tool call whose content is null: Jinja2 prints 'None', @huggingface/jinja "
       "raises; the oracle gets the content 'None'",
       [](const conversation& c) { return c.name.rfind("tool-call", 0) == 0; },
       [](ordered_json& context) {
         for (ordered_json& m : context["messages"])
           if (m["content"].is_null()) m["content"] = "None";
       }},
      {{"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "meetkai-functionary-medium-v3.1.jinja"},
       "tool-call arguments given as an object and concatenated with + to a string: Jinja2 raises a TypeError, "
       "@huggingface/jinja converts the object; troupe must fail",
       [](const conversation& c) { return c.name == "tool-call-object-arguments"; }, nullptr},
  };
  return list;
}

/// The deviation that applies to rendering `template_name` on `c`, if any.
const deviation* deviation_for(const std::string& template_name, const conversation& c) {
  for (const deviation& d : deviations())
    if (std::find(d.templates.begin(), d.templates.end(), template_name) != d.templates.end() && d.applies(c)) return &d;
  return nullptr;
}

struct oracle_case {
  std::string label;
  const deviation* deviates = nullptr;
  ordered_json context;         ///< troupe's
  ordered_json oracle_context;  ///< @huggingface/jinja's (differs only in a listed deviation)
  std::string source;
};

std::vector<oracle_case> oracle_cases() {
  std::vector<oracle_case> cases;
  for (const auto& [name, source] : vendored_templates())
    for (const conversation& c : conversations())
      for (const bool generation_prompt : {true, false})
        for (const bool thinking : {true, false}) {
          if (thinking && c.name != "thinking" && c.name != "user") continue;  // enable_thinking varies only there
          ordered_json context = {{"messages", ordered_json::parse(c.messages)},
                                  {"add_generation_prompt", generation_prompt},
                                  {"bos_token", "<|begin_of_text|>"},
                                  {"eos_token", "<|end_of_text|>"},
                                  {"enable_thinking", thinking}};
          if (c.with_tools) context["tools"] = {ordered_json::parse(weather_tool), ordered_json::parse(search_tool)};
          oracle_case oc{name + " × " + c.name + (generation_prompt ? " +gen" : "") + (thinking ? " +thinking" : ""),
                         deviation_for(name, c), context, context, source};
          if (oc.deviates != nullptr && oc.deviates->adjust != nullptr) oc.deviates->adjust(oc.oracle_context);
          cases.push_back(std::move(oc));
        }
  return cases;
}

TEST(Jinja, EveryVendoredTemplateRendersAsHuggingFaceJinja) {
  const fs::path dir = fs::temp_directory_path() / ("troupe_jinja_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  if (const std::string missing = npm_package_missing("@huggingface/jinja", dir); !missing.empty()) GTEST_SKIP() << missing;

  const std::vector<oracle_case> cases = oracle_cases();
  ordered_json requests = ordered_json::array();
  for (const oracle_case& c : cases) requests.push_back({{"template", c.source}, {"context", c.oracle_context}});
  const std::string in_path = (dir / "cases.json").string();
  std::ofstream(in_path) << requests.dump();
  jinja::render_options options;
  options.date = {2025, 3, 14};  // given to both: Llama 3.2 prints strftime_now's date
  const cli_result r = run_node("tests/jinja_oracle.mjs", {npm_prefix(), "2025", "3", "14"}, dir, in_path);
  fs::remove_all(dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const ordered_json results = ordered_json::parse(r.out);
  ASSERT_EQ(results.size(), cases.size());

  size_t identical = 0, same_failure = 0, adjusted = 0, jinja2_raises = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto ours = jinja::render(cases[i].source, cases[i].context, options);
    const ordered_json& theirs = results[i];
    const deviation* d = cases[i].deviates;
    adjusted += d != nullptr && d->adjust != nullptr;
    if (d != nullptr && d->adjust == nullptr) {
      EXPECT_FALSE(ours) << cases[i].label << " should fail as in Jinja2: " << d->reason;
      jinja2_raises += !ours;
    } else if (ours && theirs["ok"] == true) {
      EXPECT_EQ(ours->str(), theirs["output"].get<std::string>()) << cases[i].label;
      identical += ours->str() == theirs["output"].get<std::string>();
    } else {
      EXPECT_EQ(ours.has_value(), theirs["ok"].get<bool>())
          << cases[i].label << ": troupe " << (ours ? "rendered" : "failed: " + ours.error().message) << "; @huggingface/jinja "
          << (theirs["ok"] == true ? "rendered" : "failed: " + theirs["error"].get<std::string>());
      if (!ours && theirs["ok"] == false) {
        ++same_failure;
        std::cout << "both fail: " << cases[i].label << ": " << ours.error().message << " | " << theirs["error"].get<std::string>() << "\n";
      }
    }
  }
  std::cout << vendored_templates().size() << " templates, " << cases.size() << " renders: " << identical << " byte-identical ("
            << adjusted << " of them with the oracle's context adjusted to a listed Jinja2 deviation), " << same_failure
            << " failing in both, " << jinja2_raises << " failing as in Jinja2 where @huggingface/jinja renders (listed)\n";
  EXPECT_EQ(identical + same_failure + jinja2_raises, cases.size());
}

TEST(Jinja, ArrayParametersRenderAsJinja2Does) {
  // An array parameter reaches json_to_python_type as `json_spec.items` (Command R: Jinja2's
  // attribute lookup finds dict's items method, not the key) or `json_spec|items` (Hermes: a
  // list of pairs). Either way `.type` is undefined, and undefined `is iterable` in Jinja2, so
  // the type renders as an empty Union. @huggingface/jinja reads the key (Command R: List[str])
  // or raises (Hermes).
  const ordered_json context = {
      {"messages", ordered_json::parse(R"([{"role": "user", "content": "Find it"}])")},
      {"bos_token", "<s>"},
      {"tools", ordered_json::parse(R"([{"type": "function", "function": {"name": "search", "description": "Search",
        "parameters": {"type": "object", "properties": {"sites": {"type": "array", "items": {"type": "string"},
        "description": "Sites"}}, "required": ["sites"]}}}])")}};
  std::map<std::string, std::string> sources;
  for (const auto& [name, source] : vendored_templates()) sources[name] = source;
  auto command_r = jinja::render(sources.at("CohereForAI-c4ai-command-r-plus-tool_use.jinja"), context);
  ASSERT_TRUE(command_r) << command_r.error().message;
  EXPECT_NE(command_r->str().find("def search(sites: List[Union[]]) -> List[Dict]:"), std::string::npos) << command_r->str();
  auto hermes = jinja::render(sources.at("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"), context);
  ASSERT_TRUE(hermes) << hermes.error().message;
  EXPECT_NE(hermes->str().find(R"("description": "search(sites: list[Union[]]) - Search)"), std::string::npos) << hermes->str();
}

}  // namespace
}  // namespace troupe::testing
