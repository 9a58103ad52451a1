// tool_choice "required" and a named function (runtime/openai/tool_calls): the request's parsing,
// the exact schema that constrains the answer (and that the grammar engine takes it and accepts
// what the reader expects), and the reading of the constrained answer into calls, whole and
// streamed byte by byte.
#include <gtest/gtest.h>

#include <memory>

#include <nlohmann/json.hpp>

#include "runtime/grammar/automaton.hpp"
#include "runtime/grammar/grammar.hpp"
#include "runtime/openai/api.hpp"
#include "runtime/openai/tool_calls.hpp"

namespace troupe::openai {
namespace {

using json = nlohmann::ordered_json;

const served_model model{"m", "fp", 0};

const std::string weather =
    R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":)"
    R"({"city":{"type":"string"}},"required":["city"]}}})";
const std::string now = R"({"type":"function","function":{"name":"now"}})";
const std::string tools = "[" + weather + "," + now + "]";
const std::string chat = R"({"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":)" + tools + ",";

tl::expected<parsed_request, api_error> parse(const std::string& body) {
  return parse_request(endpoint::chat_completions, body, model);
}

/// Whether the grammar of JSON Schema `schema` accepts exactly `text`.
bool schema_accepts(const std::string& schema, const std::string& text) {
  auto g = grammar::parse_json_schema(schema);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.error().message);
  if (!g) return false;
  auto a = grammar::automaton::start(std::make_shared<const grammar::grammar>(std::move(*g))).value();
  int32_t s = grammar::automaton::initial();
  for (const char c : text) {
    s = a.advance(s, static_cast<uint8_t>(c)).value();
    if (s == grammar::automaton::dead) return false;
  }
  return a.accepting(s);
}

const std::string required_schema =
    R"({"type":"array","minItems":1,"items":{"anyOf":[)"
    R"({"type":"object","properties":{"name":{"type":"string","enum":["get_weather"]},"parameters":)"
    R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},"required":["name","parameters"]},)"
    R"({"type":"object","properties":{"name":{"type":"string","enum":["now"]},"parameters":)"
    R"({"type":"object","properties":{}}},"required":["name","parameters"]}]}})";

TEST(ToolChoice, RequiredConstrainsTheAnswerToAListOfCallsToTheTools) {
  const auto p = parse(chat + R"("tool_choice":"required"})");
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(p->tool_mode, (tool_choice{tool_choice::mode::required, "", true}));
  EXPECT_EQ(p->request.grammar_kind, "json_schema");
  EXPECT_EQ(p->request.grammar, required_schema);
  EXPECT_EQ(p->request.tools, tools);  // the template still gets the tools
  // parallel_tool_calls false: one call at most.
  const auto one = parse(chat + R"("tool_choice":"required","parallel_tool_calls":false})");
  ASSERT_TRUE(one);
  std::string one_schema = required_schema;
  one_schema.insert(one_schema.find(R"("items")"), R"("maxItems":1,)");
  EXPECT_EQ(one->request.grammar, one_schema);
  // What the reader below expects is what the grammar takes.
  const std::string two = R"([{"name":"get_weather","parameters":{"city":"Paris"}}, {"name": "now", "parameters": {}}])";
  EXPECT_TRUE(schema_accepts(p->request.grammar, two));
  EXPECT_FALSE(schema_accepts(one->request.grammar, two));
  EXPECT_FALSE(schema_accepts(p->request.grammar, "[]"));
  EXPECT_FALSE(schema_accepts(p->request.grammar, R"([{"name":"get_time","parameters":{}}])"));
  EXPECT_FALSE(schema_accepts(p->request.grammar, R"([{"name":"get_weather","parameters":{}}])"));  // city is required
}

TEST(ToolChoice, ANamedFunctionConstrainsTheAnswerToItsParameters) {
  const auto p = parse(chat + R"("tool_choice":{"type":"function","function":{"name":"get_weather"}}})");
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(p->tool_mode, (tool_choice{tool_choice::mode::named, "get_weather", true}));
  EXPECT_EQ(p->request.grammar, R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
  // A function without parameters takes {} only.
  const auto q = parse(chat + R"("tool_choice":{"type":"function","function":{"name":"now"}}})");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->request.grammar, R"({"type":"object","properties":{}})");
  EXPECT_TRUE(schema_accepts(q->request.grammar, "{}"));
  EXPECT_FALSE(schema_accepts(q->request.grammar, R"({"a":1})"));
}

TEST(ToolChoice, RefsInsideAToolsParametersPointAtThemInTheBuiltSchema) {
  const json t = json::parse(
      R"([{"type":"function","function":{"name":"f","parameters":{"$defs":{"p":{"type":"integer"}},)"
      R"("type":"object","properties":{"x":{"$ref":"#/$defs/p"}},"required":["x"]}}}])");
  const auto schema = forced_call_schema(t, {tool_choice::mode::required, "", true});
  ASSERT_TRUE(schema) << schema.error().message;
  EXPECT_NE(schema->find(R"({"$ref":"#/items/anyOf/0/properties/parameters/$defs/p"})"), std::string::npos) << *schema;
  EXPECT_TRUE(schema_accepts(*schema, R"([{"name":"f","parameters":{"x":5}}])"));
  EXPECT_FALSE(schema_accepts(*schema, R"([{"name":"f","parameters":{"x":"5"}}])"));
  // Named, the parameters are the root: their refs stay as written.
  const auto named = forced_call_schema(t, {tool_choice::mode::named, "f", true});
  ASSERT_TRUE(named);
  EXPECT_TRUE(schema_accepts(*named, R"({"x":5})"));
}

TEST(ToolChoice, WhatCannotBeConstrainedIsA400NamingTheParameter) {
  const std::string hi = R"({"messages":[{"role":"user","content":"x"}],)";
  const std::vector<std::tuple<std::string, std::string, std::string>> cases{
      {chat + R"("tool_choice":{"type":"function","function":{"name":"get_time"}}})", "tool_choice",
       "'tool_choice' names the function 'get_time', which is not among the request's tools (get_weather, now)"},
      {hi + R"("tool_choice":"required"})", "tool_choice", R"('tool_choice' "required" needs 'tools')"},
      {hi + R"("tools":[],"tool_choice":{"type":"function","function":{"name":"f"}}})", "tool_choice",
       "'tool_choice' naming a function needs 'tools'"},
      {chat + R"("tool_choice":"required","response_format":{"type":"json_object"}})", "tool_choice",
       R"('tool_choice' "required" or naming a function constrains the output itself: give no other grammar )"
       R"((response_format, guided_json, guided_regex, guided_grammar) with it)"},
      {chat + R"("tool_choice":{"type":"function"}})", "tool_choice",
       R"('tool_choice' must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}})"},
      {hi + R"("tools":[{"type":"function","function":{"name":""}}],"tool_choice":"required"})", "tools",
       R"('tools' must be a list of {"type": "function", "function": {"name" (not empty), "description", "parameters" (an object)}} objects)"},
  };
  for (const auto& [body, param, message] : cases) {
    const auto p = parse(body);
    ASSERT_FALSE(p) << body;
    EXPECT_EQ(p.error().status, 400);
    EXPECT_EQ(p.error().param, param) << body;
    EXPECT_EQ(p.error().message, message) << body;
  }
}

TEST(ToolChoice, TheBuiltSchemaIsBoundedAsAGrammarIs) {
  // Parameters 61 levels deep fit a grammar as a named function's (nesting_max 64), not inside
  // the five levels "required" wraps them in.
  std::string deep = R"({"type":"object"})";
  for (int i = 0; i < 30; i++) deep = R"({"type":"object","properties":{"a":)" + deep + "}}";
  const std::string t = R"([{"type":"function","function":{"name":"f","parameters":)" + deep + "}}]";
  const auto named = forced_call_schema(json::parse(t), {tool_choice::mode::named, "f", true});
  EXPECT_TRUE(named) << named.error().message;
  const auto required = forced_call_schema(json::parse(t), {tool_choice::mode::required, "", true});
  ASSERT_FALSE(required);
  EXPECT_EQ(required.error().message.rfind("the tools' schema for 'tool_choice': the JSON nests arrays and objects more than 64 deep", 0), 0u)
      << required.error().message;
  // Over the grammar's 64 KiB of source.
  json many = json::array();
  for (int i = 0; i < 1200; i++)
    many.push_back({{"type", "function"}, {"function", {{"name", "function_number_" + std::to_string(i)}}}});
  const auto big = forced_call_schema(many, {tool_choice::mode::required, "", true});
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().message.find("more than the 65536 a grammar takes"), std::string::npos) << big.error().message;
}

/// Every part of `text` pushed one byte at a time, consecutive fragments of a call joined.
std::vector<tool_call_part> byte_by_byte(forced_call_reader& r, const std::string& text,
                                         std::vector<serve::tool_call>& ended) {
  std::vector<tool_call_part> parts;
  for (const char c : text) {
    forced_call_reader::delta d = r.push(std::string_view(&c, 1));
    r.check_invariants();
    for (tool_call_part& p : d.parts) {
      if (!p.opens && !parts.empty() && parts.back().index == p.index && !parts.back().opens)
        parts.back().arguments += p.arguments;
      else
        parts.push_back(std::move(p));
    }
    for (serve::tool_call& c : d.ended) ended.push_back(std::move(c));
  }
  return parts;
}

TEST(ForcedCallReader, ARequiredAnswerBecomesItsCallsAsItStreams) {
  const std::string text =
      R"([{"name":"get_weather","parameters":{"city":"Pa\"ris]}"}}, {"name": "now", "parameters": {}}])";
  forced_call_reader r({tool_choice::mode::required, "", true});
  std::vector<serve::tool_call> ended;
  const std::vector<tool_call_part> parts = byte_by_byte(r, text, ended);
  // Each call opens when its name is whole; its arguments follow.
  EXPECT_EQ(parts, (std::vector<tool_call_part>{{0, true, "get_weather", ""},
                                                {0, false, "", R"({"city":"Pa\"ris]}"})"},
                                                {1, true, "now", ""},
                                                {1, false, "", "{}"}}));
  EXPECT_EQ(ended, (std::vector<serve::tool_call>{{"get_weather", R"({"city":"Pa\"ris]}"})"}, {"now", "{}"}}));
  EXPECT_EQ(r.finish(), std::nullopt);
  // Whole, each call is one part.
  forced_call_reader whole({tool_choice::mode::required, "", true});
  const forced_call_reader::delta d = whole.push(text);
  EXPECT_EQ(d.parts, (std::vector<tool_call_part>{{0, true, "get_weather", R"({"city":"Pa\"ris]}"})"}, {1, true, "now", "{}"}}));
  EXPECT_EQ(d.ended.size(), 2u);
}

TEST(ForcedCallReader, ANamedAnswerIsTheArgumentsOfOneCall) {
  forced_call_reader r({tool_choice::mode::named, "get_weather", true});
  std::vector<serve::tool_call> ended;
  const std::vector<tool_call_part> parts = byte_by_byte(r, R"({"city": "Paris", "days": [1, 2]})", ended);
  EXPECT_EQ(parts, (std::vector<tool_call_part>{{0, true, "get_weather", "{"}, {0, false, "", R"("city": "Paris", "days": [1, 2]})"}}));
  EXPECT_EQ(ended, (std::vector<serve::tool_call>{{"get_weather", R"({"city": "Paris", "days": [1, 2]})"}}));
}

TEST(ForcedCallReader, AnAnswerCutShortLeavesItsOpenCallAsFarAsItCame) {
  forced_call_reader r({tool_choice::mode::required, "", true});
  const forced_call_reader::delta d = r.push(R"([{"name":"now","parameters":{}},{"name":"get_weather","parameters":{"ci)");
  EXPECT_EQ(d.ended, (std::vector<serve::tool_call>{{"now", "{}"}}));
  EXPECT_EQ(r.finish(), (serve::tool_call{"get_weather", R"({"ci)"}));
  // Cut before a name is whole: no call.
  forced_call_reader early({tool_choice::mode::required, "", true});
  EXPECT_TRUE(early.push(R"([{"name":"get_w)").parts.empty());
  EXPECT_EQ(early.finish(), std::nullopt);
}

TEST(StreamedCalls, AForcedChoicesTextBecomesCallsNumberedWithTheModelsOwn) {
  streamed_calls calls(tool_choice{tool_choice::mode::required, "", true});
  std::string text = R"([{"name":"now","parameters":{)";
  EXPECT_EQ(calls.push(text, {}), (std::vector<tool_call_part>{{0, true, "now", "{"}}));
  EXPECT_EQ(text, "");  // taken: a forced answer's text is its calls
  // The model's own (whole) calls take the next numbers.
  text = "}},";
  EXPECT_EQ(calls.push(text, {{"f", "{}"}}), (std::vector<tool_call_part>{{0, false, "", "}"}, {1, true, "f", "{}"}}));
  text = R"({"name":"now","parameters":{}}])";
  EXPECT_EQ(calls.push(text, {}), (std::vector<tool_call_part>{{2, true, "now", "{}"}}));
  EXPECT_EQ(calls.num_calls(), 3);
  // Without a forced choice the text stays content.
  streamed_calls free;
  text = "hello";
  EXPECT_EQ(free.push(text, {{"f", "{}"}}), (std::vector<tool_call_part>{{0, true, "f", "{}"}}));
  EXPECT_EQ(text, "hello");
  // A whole answer's calls, joined.
  text = R"([{"name":"now","parameters":{}},{"name":"get_weather","parameters":{"city":"Paris"}}])";
  EXPECT_EQ(whole_calls({tool_choice::mode::required, "", true}, text, {}),
            (std::vector<tool_call_part>{{0, true, "now", "{}"}, {1, true, "get_weather", R"({"city":"Paris"})"}}));
  EXPECT_EQ(text, "");
}

}  // namespace
}  // namespace troupe::openai
