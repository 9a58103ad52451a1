// The grammar library: GBNF, regex and JSON Schema compile to byte grammars whose automaton
// accepts exactly the right texts; token masks over a vocabulary; cursors and triggers.

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <regex>
#include <string>

#include "runtime/grammar/constraint.hpp"
#include "runtime/grammar/grammar.hpp"

namespace troupe::grammar {
namespace {

/// Whether the automaton of `g` accepts `text` exactly (complete match).
bool accepts(const grammar& g, const std::string& text) {
  automaton a(std::make_shared<const grammar>(g));
  int32_t s = automaton::initial();
  for (const char c : text) {
    s = a.advance(s, static_cast<uint8_t>(c));
    if (s == automaton::dead) return false;
  }
  a.check_invariants();
  return a.accepting(s);
}

/// Whether `text` is a prefix of something the automaton accepts (it stays alive).
bool alive(const grammar& g, const std::string& text) {
  automaton a(std::make_shared<const grammar>(g));
  int32_t s = automaton::initial();
  for (const char c : text) {
    s = a.advance(s, static_cast<uint8_t>(c));
    if (s == automaton::dead) return false;
  }
  return true;
}

grammar gbnf(const std::string& text) {
  auto g = parse_gbnf(text);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.error().message);
  return g ? *g : grammar{};
}

TEST(Gbnf, LiteralsAlternativesRepeatsAndClasses) {
  const grammar g = gbnf(R"(root ::= "ab" | digit{2,3} "x"? | [^a-z\n]+ "!"
digit ::= [0-9]  # a comment
)");
  EXPECT_TRUE(accepts(g, "ab"));
  EXPECT_TRUE(accepts(g, "12"));
  EXPECT_TRUE(accepts(g, "123x"));
  EXPECT_FALSE(accepts(g, "1234"));
  EXPECT_FALSE(accepts(g, "1"));
  EXPECT_TRUE(accepts(g, "ÄÖ!"));
  EXPECT_TRUE(accepts(g, "QQ!"));
  EXPECT_FALSE(accepts(g, "q!"));
  EXPECT_FALSE(accepts(g, "a"));
  EXPECT_TRUE(alive(g, "a"));
}

TEST(Gbnf, RecursionAndMultiLineRules) {
  const grammar g = gbnf(R"g(root ::= expr
expr ::= term (
    [-+] term
  )*
term ::= [0-9]+ | "(" expr ")"
)g");
  EXPECT_TRUE(accepts(g, "1+(2-3)+((4))"));
  EXPECT_FALSE(accepts(g, "1+(2-3"));
  EXPECT_TRUE(alive(g, "1+(2-3"));
  EXPECT_FALSE(accepts(g, "1++2"));
}

TEST(Gbnf, AnyCharacterIsOneCodePointOfWellFormedUtf8) {
  const grammar g = gbnf(R"(root ::= . .)");
  EXPECT_TRUE(accepts(g, "a\xE2\x82\xAC"));         // 'a' and the euro sign
  EXPECT_FALSE(accepts(g, "a\xED\xA0\x80"));        // an encoded surrogate
  EXPECT_FALSE(accepts(g, "a\xC0\x80"));            // an overlong form
  EXPECT_TRUE(accepts(g, "\xF4\x8F\xBF\xBF" "b"));  // U+10FFFF
  EXPECT_FALSE(accepts(g, "\xF4\x90\x80\x80" "b"));  // above U+10FFFF
}

TEST(Gbnf, ErrorsNameTheProblem) {
  const auto error_of = [](const std::string& text) {
    auto g = parse_gbnf(text);
    return g ? std::string("no error") : g.error().message;
  };
  EXPECT_EQ(error_of("expr ::= \"a\""), "the grammar defines no 'root' rule");
  EXPECT_EQ(error_of("root ::= item"), "the grammar uses rule 'item' but never defines it");
  EXPECT_EQ(error_of("root ::= root \"a\" | \"b\""),
            "rule 'root' is left-recursive (it can reach itself before matching any text, e.g. by repeating "
            "something that can match nothing)");
  EXPECT_NE(error_of("root ::= (\"a\"?)*").find("left-recursive"), std::string::npos);
  EXPECT_EQ(error_of("root ::= \"a"), "grammar line 1, column 12: expected the closing '\"', found the end");
  EXPECT_EQ(error_of("root = \"a\""), "grammar line 1, column 6: expected '::=' after 'root', found '='");
  EXPECT_EQ(error_of("root ::= [b-a]"), "grammar line 1, column 14: expected a range whose end is not below its start, found ']'");
  EXPECT_EQ(error_of("root ::= \"a\"{2000}"), "grammar line 1, column 18: expected a repeat count of at most 1000, found '}'");
  EXPECT_EQ(error_of("root ::= \"b\" | x\nx ::= \"a\" x"), "rule 'x' can never finish matching");
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""),
            "grammar line 2, column 9: expected a new rule, not a second definition of 'root', found ' '");
  EXPECT_EQ(error_of(std::string("root ::= \"\xFF\"")).substr(0, 9), "grammar: ");
}

TEST(Regex, MatchesTheWholeOutputLikeStdRegex) {
  const std::vector<std::string> patterns = {"[a-c]+x?", "(ab|cd){1,2}e", "\\d{3}-\\d{2,}", "^h(?:e|a)llo!*$",
                                             "\\w+\\s\\S", "a.c", "[^\\d]{2}"};
  const std::vector<std::string> texts = {"abc", "abcx", "x", "abe", "abcde", "cde", "123-45", "123-4", "123-4567",
                                          "hello", "hallo!!", "hullo", "ab_9 z", "ab  z", "abc", "a\nc", "xy", "x1"};
  for (const std::string& p : patterns) {
    auto g = parse_regex(p);
    ASSERT_TRUE(g.has_value()) << p << ": " << g.error().message;
    const std::regex reference(p);
    for (const std::string& t : texts) EXPECT_EQ(accepts(*g, t), std::regex_match(t, reference)) << p << " on " << t;
  }
}

TEST(Regex, UnsupportedSyntaxIsAnError) {
  EXPECT_EQ(parse_regex("(a)\\1").error().message, "regex line 1, column 4: expected no backreference (not supported), found '\\'");
  EXPECT_EQ(parse_regex("a(?=b)").error().message,
            "regex line 1, column 4: expected '?:' (lookaround and named groups are not supported), found '='");
  EXPECT_EQ(parse_regex("*a").error().message, "regex line 1, column 1: expected something to repeat before '*', found '*'");
  EXPECT_EQ(parse_regex("a)").error().message, "regex line 1, column 2: expected no unmatched ')', found ')'");
  EXPECT_EQ(parse_regex("(a").error().message, "regex line 1, column 3: expected ')', found the end");
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalMembers) {
  auto g = parse_json_schema(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 4},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["age"]})");
  ASSERT_TRUE(g.has_value()) << g.error().message;
  EXPECT_TRUE(accepts(*g, R"({"age":3})"));
  EXPECT_TRUE(accepts(*g, R"({ "name": "Tim", "age": -12 })"));
  EXPECT_TRUE(accepts(*g, R"({"name":"\u00e9\n","age":0,"tags":["a","b"]})"));
  EXPECT_TRUE(accepts(*g, R"({"age":0,"tags":[]})"));
  EXPECT_FALSE(accepts(*g, R"({"name":"Tim"})"));              // age is required
  EXPECT_FALSE(accepts(*g, R"({"age":1,"name":"Tim"})"));      // members in schema order
  EXPECT_FALSE(accepts(*g, R"({"name":"Timothy","age":1})"));  // maxLength
  EXPECT_FALSE(accepts(*g, R"({"age":01})"));
  EXPECT_FALSE(accepts(*g, R"({"age":1,"tags":["a","b","a"]})"));
  EXPECT_FALSE(accepts(*g, R"({"age":1,"tags":["c"]})"));
  EXPECT_FALSE(accepts(*g, R"({"name":"\ud800","age":1})"));  // a lone surrogate escape
}

TEST(JsonSchema, OptionalOnlyMembersNeedNoLeadingComma) {
  auto g = parse_json_schema(R"({"properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}})");
  ASSERT_TRUE(g.has_value()) << g.error().message;
  for (const char* ok : {"{}", R"({"a":true})", R"({"b":null})", R"({"a":false,"b":null})"}) EXPECT_TRUE(accepts(*g, ok)) << ok;
  for (const char* bad : {R"({,"b":null})", R"({"a":true,})", R"({"b":null,"a":true})"}) EXPECT_FALSE(accepts(*g, bad)) << bad;
}

TEST(JsonSchema, NumbersRefsAnyOfAndAnyValue) {
  auto g = parse_json_schema(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "number"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
      "required": ["v", "next"]}}, "$ref": "#/$defs/node"})");
  ASSERT_TRUE(g.has_value()) << g.error().message;
  EXPECT_TRUE(accepts(*g, R"({"v":1.5e+3,"next":{"v":-0.25,"next":null}})"));
  EXPECT_FALSE(accepts(*g, R"({"v":1.,"next":null})"));
  auto any = parse_json_schema("{}");
  ASSERT_TRUE(any.has_value());
  EXPECT_TRUE(accepts(*any, R"([1,{"a":[true,null,"x"]},-2.5])"));
  EXPECT_FALSE(accepts(*any, R"([1,])"));
}

TEST(JsonSchema, UnsupportedKeywordsAndBadSchemasAreErrors) {
  EXPECT_EQ(parse_json_schema(R"({"type": "string", "format": "date"})").error().message,
            "#: the JSON Schema keyword 'format' is not supported");
  EXPECT_EQ(parse_json_schema(R"({"properties": {"a": {"type": "integer", "minimum": 0}}})").error().message,
            "#/properties/a: the JSON Schema keyword 'minimum' is not supported");
  EXPECT_EQ(parse_json_schema(R"({"type": "decimal"})").error().message, "#/type: unknown type 'decimal'");
  EXPECT_EQ(parse_json_schema(R"({"required": ["x"], "properties": {}})").error().message,
            "#/required: \"x\" is not one of the properties");
  EXPECT_EQ(parse_json_schema(R"({"$ref": "#/nowhere"})").error().message, "$ref '#/nowhere' points at nothing in the schema");
  EXPECT_EQ(parse_json_schema(R"({"type": "object", "additionalProperties": true})").error().message,
            "#/additionalProperties: only false is supported (no extra properties)");
  EXPECT_EQ(parse_json_schema("{\"type\": ").error().message.substr(0, 32), "the JSON schema is not valid JSO");
  EXPECT_EQ(parse_json_schema("false").error().message, "#: the schema false matches nothing");
}

/// A toy vocabulary: single bytes, a few multi-byte pieces, a control token and EOS.
std::shared_ptr<const vocabulary> toy_vocabulary() {
  std::vector<std::string> bytes = {"", "</s>"};  // 0: control, 1: EOS (its bytes are never used)
  bytes[1] = "";
  for (int b = 0; b < 256; b++) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* piece : {"{\"", "\":", "true", "12", "ab", "\"}", " {"}) bytes.push_back(piece);
  return std::make_shared<const vocabulary>(bytes, std::vector<int32_t>{1});
}

int32_t token_of(const vocabulary& v, const std::string& piece) {
  for (int32_t t = 0; t < v.size(); t++)
    if (v.bytes(t) == piece) return t;
  return -1;
}

TEST(TokenMask, AllowsExactlyTheTokensTheGrammarCanTake) {
  auto vocab = toy_vocabulary();
  auto compiled = compile(grammar_spec{grammar_kind::gbnf, R"(root ::= "{\"" [a-z]+ "\":" ("true" | [0-9]+) "}")", {}});
  ASSERT_TRUE(compiled.has_value()) << compiled.error().message;
  matcher m(*compiled, vocab);
  cursor c(m);
  const token_mask* first = c.mask();
  ASSERT_NE(first, nullptr);
  std::vector<int32_t> allowed_first;
  for (int32_t t = 0; t < vocab->size(); t++)
    if (allowed(*first, t)) allowed_first.push_back(t);
  EXPECT_EQ(allowed_first, (std::vector<int32_t>{token_of(*vocab, "{"), token_of(*vocab, "{\"")}));
  for (const char* piece : {"{\"", "ab", "c", "\":", "12"}) c.feed(token_of(*vocab, piece));
  const token_mask* after_digits = c.mask();
  EXPECT_TRUE(allowed(*after_digits, token_of(*vocab, "}")));
  EXPECT_TRUE(allowed(*after_digits, token_of(*vocab, "7")));
  EXPECT_FALSE(allowed(*after_digits, token_of(*vocab, "\"}")));
  EXPECT_FALSE(allowed(*after_digits, 1));  // EOS only where the text is complete
  c.feed(token_of(*vocab, "}"));
  const token_mask* done = c.mask();
  for (int32_t t = 0; t < vocab->size(); t++) EXPECT_EQ(allowed(*done, t), t == 1) << t;
  m.check_invariants();
}

TEST(TokenMask, NeverEmptyOnAnyValidPrefix) {
  // Property: walk random allowed tokens under several grammars; every mask on the way allows
  // something, and the walk ends only with an end token.
  auto vocab = toy_vocabulary();
  const std::vector<grammar_spec> specs = {
      {grammar_kind::json_schema, R"({"type":"object","properties":{"a":{"type":"string","maxLength":3},"b":{"type":"array","items":{"type":"integer"},"maxItems":2}},"required":["a","b"]})", {}},
      {grammar_kind::regex, "(ab|c)+[0-9]{1,3}", {}},
      {grammar_kind::gbnf, "root ::= (\"x\" root \"y\")? \"z\"", {}},
  };
  std::mt19937 rng(7);
  for (const grammar_spec& spec : specs) {
    auto compiled = compile(spec);
    ASSERT_TRUE(compiled.has_value()) << compiled.error().message;
    matcher m(*compiled, vocab);
    for (int walk = 0; walk < 50; walk++) {
      cursor c(m);
      for (int step = 0; step < 200; step++) {
        const token_mask* mask = c.mask();
        std::vector<int32_t> choices;
        for (int32_t t = 0; t < vocab->size(); t++)
          if (allowed(*mask, t)) choices.push_back(t);
        ASSERT_FALSE(choices.empty()) << to_string(spec.kind) << " walk " << walk << " step " << step;
        const int32_t t = choices[rng() % choices.size()];
        c.feed(t);
        if (t == 1) break;
      }
    }
    m.check_invariants();
  }
}

TEST(TokenMask, TriggerTokensArmTheGrammar) {
  auto vocab = toy_vocabulary();
  const int32_t trigger = token_of(*vocab, " {");
  auto compiled = compile(grammar_spec{grammar_kind::regex, "[0-9]+", {trigger}});
  ASSERT_TRUE(compiled.has_value());
  matcher m(*compiled, vocab);
  cursor c(m);
  EXPECT_EQ(c.mask(), nullptr);
  c.feed(token_of(*vocab, "ab"));
  EXPECT_EQ(c.mask(), nullptr);
  c.feed(trigger);
  ASSERT_NE(c.mask(), nullptr);
  EXPECT_TRUE(allowed(*c.mask(), token_of(*vocab, "12")));
  EXPECT_FALSE(allowed(*c.mask(), token_of(*vocab, "ab")));
}

TEST(GrammarSpec, ValidateAndCache) {
  EXPECT_EQ(validate(grammar_spec{grammar_kind::regex, "", {}}, 10).error().message, "the regex is empty");
  EXPECT_EQ(validate(grammar_spec{grammar_kind::regex, "a", {10}}, 10).error().message,
            "trigger token id 10 is outside the vocabulary");
  EXPECT_EQ(validate(grammar_spec{grammar_kind::none, "a", {}}, 10).error().message,
            "trigger tokens or a grammar source need a grammar kind");
  EXPECT_EQ(validate(grammar_spec{grammar_kind::gbnf, std::string(grammar_source_bytes_max + 1, 'x'), {}}, 10).error().message,
            "the gbnf has 65537 bytes, more than the 65536 accepted");
  EXPECT_TRUE(validate(grammar_spec{grammar_kind::gbnf, "root ::= \"a\"", {3}}, 10).has_value());
  grammar_cache cache(2);
  const grammar_spec a{grammar_kind::regex, "a+", {}};
  const grammar_spec b{grammar_kind::regex, "b+", {}};
  auto first = cache.get(a);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(cache.get(a)->get(), first->get());
  EXPECT_EQ(cache.num_hits(), 1);
  EXPECT_FALSE(cache.get(grammar_spec{grammar_kind::regex, "(", {}}).has_value());
  ASSERT_TRUE(cache.get(b).has_value());
  ASSERT_TRUE(cache.get(grammar_spec{grammar_kind::regex, "c+", {}}).has_value());
  EXPECT_EQ(cache.size(), 2u);  // a, the least recently used, was dropped
  EXPECT_NE(cache.get(a)->get(), first->get());
}

}  // namespace
}  // namespace troupe::grammar
