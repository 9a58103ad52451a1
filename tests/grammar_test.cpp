// The grammar library: GBNF, regex and JSON Schema compile to byte grammars whose automaton
// accepts exactly the right texts; token masks over a vocabulary; cursors and triggers.

#include <gtest/gtest.h>

#include <memory>
#include <algorithm>
#include <cctype>
#include <optional>
#include <random>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/resumed.hpp"
#include "runtime/engine/step_executor.hpp"
#include "runtime/grammar/constraint.hpp"
#include "runtime/grammar/grammar.hpp"
#include "tests/support/engine_harness.hpp"

namespace troupe::grammar {
namespace {

/// How `g`'s automaton ends after `text`: alive (a prefix of something it accepts) and accepting.
struct outcome {
  bool alive = false;
  bool accepting = false;
};

outcome run_text(const grammar& g, const std::string& text) {
  auto a = automaton::start(std::make_shared<const grammar>(g)).value();
  int32_t s = automaton::initial();
  for (const char c : text) {
    s = a.advance(s, static_cast<uint8_t>(c)).value();
    if (s == automaton::dead) return {};
  }
  a.check_invariants();
  return {true, a.accepting(s)};
}

/// Whether the automaton of `g` accepts `text` exactly (complete match).
bool accepts(const grammar& g, const std::string& text) { return run_text(g, text).accepting; }

/// Whether `text` is a prefix of something the automaton accepts.
bool alive(const grammar& g, const std::string& text) { return run_text(g, text).alive; }

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
  auto object = parse_json_schema(R"({"type": "object"})");  // response_format json_object
  ASSERT_TRUE(object.has_value());
  EXPECT_TRUE(accepts(*object, R"({"a": [1], "b": {}})"));
  EXPECT_FALSE(accepts(*object, R"([1])"));
  auto closed = parse_json_schema(R"({"type": "object", "additionalProperties": false})");
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(accepts(*closed, "{}"));
  EXPECT_FALSE(accepts(*closed, R"({"a":1})"));
}

TEST(JsonSchema, UnsupportedKeywordsAndBadSchemasAreErrors) {
  const auto error_of = [](const std::string& schema) {
    auto g = parse_json_schema(schema);
    return g ? std::string("no error") : g.error().message;
  };
  EXPECT_EQ(error_of(R"({"type": "string", "format": "date"})"),
            "#: the JSON Schema keyword 'format' is not supported");
  EXPECT_EQ(error_of(R"({"properties": {"a": {"type": "integer", "minimum": 0}}})"),
            "#/properties/a: the JSON Schema keyword 'minimum' is not supported");
  EXPECT_EQ(error_of(R"({"type": "decimal"})"), "#/type: unknown type 'decimal'");
  EXPECT_EQ(error_of(R"({"required": ["x"], "properties": {}})"),
            "#/required: \"x\" is not one of the properties");
  EXPECT_EQ(error_of(R"({"$ref": "#/nowhere"})"), "$ref '#/nowhere' points at nothing in the schema");
  EXPECT_EQ(error_of(R"({"properties": {}, "additionalProperties": true})"),
            "#/additionalProperties: with properties, only false is supported (no extra properties)");
  EXPECT_EQ(error_of("{\"type\": ").substr(0, 32), "the JSON schema is not valid JSO");
  EXPECT_EQ(error_of("false"), "#: the schema false matches nothing");
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
  auto compiled = compile(grammar_spec{grammar_kind::gbnf, R"(root ::= "{\"" [a-z]+ "\":" ("true" | [0-9]+) "}")", {}, {}});
  ASSERT_TRUE(compiled.has_value()) << compiled.error().message;
  matcher m(*compiled, vocab);
  cursor c(m);
  const token_mask* first = c.mask().value();
  ASSERT_NE(first, nullptr);
  std::vector<int32_t> allowed_first;
  for (int32_t t = 0; t < vocab->size(); t++)
    if (allowed(*first, t)) allowed_first.push_back(t);
  EXPECT_EQ(allowed_first, (std::vector<int32_t>{token_of(*vocab, "{"), token_of(*vocab, "{\"")}));
  for (const char* piece : {"{\"", "ab", "c", "\":", "12"}) ASSERT_TRUE(c.feed(token_of(*vocab, piece)).has_value());
  const token_mask* after_digits = c.mask().value();
  EXPECT_TRUE(allowed(*after_digits, token_of(*vocab, "}")));
  EXPECT_TRUE(allowed(*after_digits, token_of(*vocab, "7")));
  EXPECT_FALSE(allowed(*after_digits, token_of(*vocab, "\"}")));
  EXPECT_FALSE(allowed(*after_digits, 1));  // EOS only where the text is complete
  ASSERT_TRUE(c.feed(token_of(*vocab, "}")).has_value());
  const token_mask* done = c.mask().value();
  for (int32_t t = 0; t < vocab->size(); t++) EXPECT_EQ(allowed(*done, t), t == 1) << t;
  m.check_invariants();
}

TEST(TokenMask, NeverEmptyOnAnyValidPrefix) {
  // Property: walk random allowed tokens under several grammars; every mask on the way allows
  // something, and the walk ends only with an end token.
  auto vocab = toy_vocabulary();
  const std::vector<grammar_spec> specs = {
      {grammar_kind::json_schema, R"({"type":"object","properties":{"a":{"type":"string","maxLength":3},"b":{"type":"array","items":{"type":"integer"},"maxItems":2}},"required":["a","b"]})", {}, {}},
      {grammar_kind::regex, "(ab|c)+[0-9]{1,3}", {}, {}},
      {grammar_kind::gbnf, "root ::= (\"x\" root \"y\")? \"z\"", {}, {}},
  };
  std::mt19937 rng(7);
  for (const grammar_spec& spec : specs) {
    auto compiled = compile(spec);
    ASSERT_TRUE(compiled.has_value()) << compiled.error().message;
    matcher m(*compiled, vocab);
    for (int walk = 0; walk < 50; walk++) {
      cursor c(m);
      for (int step = 0; step < 200; step++) {
        const token_mask* mask = c.mask().value();
        std::vector<int32_t> choices;
        for (int32_t t = 0; t < vocab->size(); t++)
          if (allowed(*mask, t)) choices.push_back(t);
        ASSERT_FALSE(choices.empty()) << to_string(spec.kind) << " walk " << walk << " step " << step;
        const int32_t t = choices[rng() % choices.size()];
        ASSERT_TRUE(c.feed(t).has_value());
        if (t == 1) break;
      }
    }
    m.check_invariants();
  }
}

// Issue 47: tokens a request resumes with (after a drain or a lost engine) come from a peer and
// are replayed through the automaton where the request enters, never first in a step.
TEST(TokenMask, ResumedTokensMustBeInTheVocabularyAndFitTheGrammar) {
  auto vocab = toy_vocabulary();
  auto digits = compile(grammar_spec{grammar_kind::regex, "[0-9]+", {}, {}});
  ASSERT_TRUE(digits.has_value());
  const int32_t d12 = token_of(*vocab, "12"), d7 = token_of(*vocab, "7"), ab = token_of(*vocab, "ab");
  const auto error_of = [&](const std::shared_ptr<const compiled_grammar>& g, const std::vector<int32_t>& tokens) {
    auto ok = engine::check_generated(g, vocab, tokens, 1);  // tokens[0] is the prompt
    return ok ? std::string("fits") : ok.error().message;
  };
  EXPECT_EQ(error_of(*digits, {ab, d12, d7, 1}), "fits");  // 127, then EOS where it accepts
  EXPECT_EQ(error_of(*digits, {ab}), "fits");               // nothing resumed
  EXPECT_EQ(error_of(*digits, {ab, d12, ab}), "resumed token 1 (" + std::to_string(ab) +
                                                  ") leaves the request's grammar: it cannot have been generated under it");
  EXPECT_EQ(error_of(*digits, {ab, 1}),
            "resumed token 0 (1) leaves the request's grammar: it cannot have been generated under it");  // EOS first
  const std::string size = std::to_string(vocab->size());
  EXPECT_EQ(error_of(*digits, {ab, vocab->size()}),
            "resumed token 0 (" + size + ") is outside the vocabulary [0, " + size + ")");
  EXPECT_EQ(error_of(*digits, {ab, -1}), "resumed token 0 (-1) is outside the vocabulary [0, " + size + ")");
  // Before a trigger string the text is free; after it, the grammar holds.
  auto triggered = compile(grammar_spec{grammar_kind::regex, "[0-9]+", {}, {"a"}});
  ASSERT_TRUE(triggered.has_value());
  const int32_t x = token_of(*vocab, "x"), a = token_of(*vocab, "a");
  EXPECT_EQ(error_of(*triggered, {ab, x, a, d7}), "fits");
  EXPECT_EQ(error_of(*triggered, {ab, x, a, x}), "resumed token 2 (" + std::to_string(x) +
                                                      ") leaves the request's grammar: it cannot have been generated under it");
  EXPECT_EQ(error_of(*triggered, {ab, ab}), "resumed token 0 (" + std::to_string(ab) +
                                                ") leaves the request's grammar: it cannot have been generated under it");
}

TEST(TokenMask, TriggerTokensArmTheGrammar) {
  auto vocab = toy_vocabulary();
  const int32_t trigger = token_of(*vocab, " {");
  auto compiled = compile(grammar_spec{grammar_kind::regex, "[0-9]+", {trigger}, {}});
  ASSERT_TRUE(compiled.has_value());
  matcher m(*compiled, vocab);
  cursor c(m);
  EXPECT_EQ(c.mask().value(), nullptr);
  ASSERT_TRUE(c.feed(token_of(*vocab, "ab")).has_value());
  EXPECT_EQ(c.mask().value(), nullptr);
  ASSERT_TRUE(c.feed(trigger).has_value());
  ASSERT_NE(c.mask().value(), nullptr);
  EXPECT_TRUE(allowed(*c.mask().value(), token_of(*vocab, "12")));
  EXPECT_FALSE(allowed(*c.mask().value(), token_of(*vocab, "ab")));
}

TEST(TokenMask, ATriggerStringArmsTheGrammarEvenInsideAToken) {
  auto vocab = toy_vocabulary();
  auto compiled = compile(grammar_spec{grammar_kind::regex, "[0-9]+", {}, {"a"}});
  ASSERT_TRUE(compiled.has_value());
  matcher m(*compiled, vocab);
  cursor c(m);
  // Before the trigger: free, except tokens that complete "a" and go on with a non-digit.
  const token_mask* before = c.mask().value();
  ASSERT_NE(before, nullptr);
  EXPECT_FALSE(c.active());
  EXPECT_FALSE(allowed(*before, token_of(*vocab, "ab")));  // "a" then "b": the grammar would reject "b"
  EXPECT_TRUE(allowed(*before, token_of(*vocab, "a")));
  EXPECT_TRUE(allowed(*before, token_of(*vocab, "x")));
  EXPECT_TRUE(allowed(*before, token_of(*vocab, "true")));
  EXPECT_TRUE(allowed(*before, 1));  // free text may end
  ASSERT_TRUE(c.feed(token_of(*vocab, "x")).has_value());
  EXPECT_FALSE(c.active());
  ASSERT_TRUE(c.feed(token_of(*vocab, "a")).has_value());
  ASSERT_TRUE(c.active());
  EXPECT_TRUE(allowed(*c.mask().value(), token_of(*vocab, "12")));
  EXPECT_FALSE(allowed(*c.mask().value(), token_of(*vocab, "x")));
  EXPECT_FALSE(allowed(*c.mask().value(), 1));  // nothing after the trigger yet: not a match
  // A token that ends a trigger and goes on: the grammar takes the rest of its bytes.
  auto two = compile(grammar_spec{grammar_kind::regex, "2[0-9]*", {}, {"1"}});
  ASSERT_TRUE(two.has_value());
  matcher m2(*two, vocab);
  cursor c2(m2);
  EXPECT_TRUE(allowed(*c2.mask().value(), token_of(*vocab, "12")));  // "1" then "2": the grammar's first byte
  ASSERT_TRUE(c2.feed(token_of(*vocab, "12")).has_value());
  ASSERT_TRUE(c2.active());
  EXPECT_TRUE(allowed(*c2.mask().value(), 1));  // "2" is a complete match
  EXPECT_TRUE(allowed(*c2.mask().value(), token_of(*vocab, "7")));
  EXPECT_FALSE(allowed(*c2.mask().value(), token_of(*vocab, "x")));
  m2.check_invariants();
}

// Issue 47 (found by EdgeFuzz.GrammarSourcesCompileOrFailAndTheirAutomataStayWithinBudget): a
// number too large for a 64-bit integer made nlohmann throw out_of_range, which only parse
// errors were caught for, out of the grammar compile (the grammar actor would have died). And
// errors quote at most echo_bytes_max bytes of the schema's names.
TEST(GrammarSpec, OutOfRangeNumbersAndLongNamesInASchemaAreBoundedErrors) {
  const std::string digits(400, '9');
  auto huge = parse_json_schema(R"({"type":"string","maxLength":)" + digits + "}");
  ASSERT_FALSE(huge.has_value());
  EXPECT_EQ(huge.error().message.rfind("the JSON schema is not valid JSON: [json.exception.out_of_range.406] number overflow", 0), 0u)
      << huge.error().message;
  EXPECT_LE(huge.error().message.size(), std::string("the JSON schema is not valid JSON: ").size() + 264 + 3);
  const std::string name(100000, 'n');
  auto unknown = parse_json_schema(R"({")" + name + R"(":1})");
  ASSERT_FALSE(unknown.has_value());
  EXPECT_EQ(unknown.error().message, "#: the JSON Schema keyword '" + std::string(64, 'n') + "...' is not supported");
  auto undefined = parse_gbnf("root ::= " + name);
  ASSERT_FALSE(undefined.has_value());
  EXPECT_LT(undefined.error().message.size(), 200u) << undefined.error().message.substr(0, 200);
}

TEST(GrammarSpec, HostileNestingIsAnErrorNotACrash) {
  const std::string deep(20000, '(');
  EXPECT_EQ(parse_gbnf("root ::= " + deep).error().message,
            "grammar line 1, column 74: expected groups nested at most 64 deep, found '('");
  EXPECT_EQ(parse_regex(deep).error().message, "regex line 1, column 65: expected groups nested at most 64 deep, found '('");
  std::string schema;
  for (int i = 0; i < 10000; i++) schema += R"({"items":)";
  schema += "{}";
  for (int i = 0; i < 10000; i++) schema += "}";
  EXPECT_EQ(parse_json_schema(schema).error().message,
            "JSON schema: the JSON nests arrays and objects more than 64 deep at byte 576 (nesting_max)");
  // Sizes: a 64 KiB source is the most a request may carry (validate), and it compiles quickly.
  std::string wide = "root ::= ";
  while (wide.size() < grammar_source_bytes_max - 16) wide += "\"abcdefgh\" | ";
  wide += "\"z\"";
  auto big = parse_gbnf(wide);
  ASSERT_TRUE(big.has_value()) << big.error().message;
  EXPECT_TRUE(accepts(*big, "abcdefgh"));
}

TEST(GrammarSpec, ValidateAndCache) {
  EXPECT_EQ(validate(grammar_spec{grammar_kind::regex, "", {}, {}}, 10).error().message, "the regex is empty");
  EXPECT_EQ(validate(grammar_spec{grammar_kind::regex, "a", {10}, {}}, 10).error().message,
            "trigger token id 10 is outside the vocabulary");
  EXPECT_EQ(validate(grammar_spec{grammar_kind::none, "a", {}, {}}, 10).error().message,
            "triggers or a grammar source need a grammar kind");
  EXPECT_EQ(validate(grammar_spec{grammar_kind::regex, "a", {}, {""}}, 10).error().message,
            "a trigger string must have 1 to 256 bytes");
  EXPECT_EQ(validate(grammar_spec{grammar_kind::gbnf, std::string(grammar_source_bytes_max + 1, 'x'), {}, {}}, 10).error().message,
            "the gbnf has 65537 bytes, more than the 65536 accepted");
  EXPECT_TRUE(validate(grammar_spec{grammar_kind::gbnf, "root ::= \"a\"", {3}, {}}, 10).has_value());
  grammar_limits two;
  two.num_cached_max = 2;
  grammar_cache cache(two);
  const grammar_spec a{grammar_kind::regex, "a+", {}, {}};
  const grammar_spec b{grammar_kind::regex, "b+", {}, {}};
  auto first = cache.get(a);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(cache.get(a)->get(), first->get());
  EXPECT_EQ(cache.num_hits(), 1);
  EXPECT_FALSE(cache.get(grammar_spec{grammar_kind::regex, "(", {}, {}}).has_value());
  ASSERT_TRUE(cache.get(b).has_value());
  ASSERT_TRUE(cache.get(grammar_spec{grammar_kind::regex, "c+", {}, {}}).has_value());
  EXPECT_EQ(cache.size(), 2u);  // a, the least recently used, was dropped
  EXPECT_NE(cache.get(a)->get(), first->get());
}

// ---- limits: what one grammar may cost (grammar_limits) ------------------------------------

/// The issue's 33-byte recipe: on the code before grammar_limits it compiled, and the executor
/// then built its automaton's first state inside a step, without bound (RSS +300 MB every 3 s,
/// every other request stalled).
const std::string recipe = "a{0,1000}{0,1000}{0,1000}{0,1000}";

std::string too_many_stacks_of(int64_t n) {
  return "the grammar's automaton needs more than " + std::to_string(n) +
         " stacks for one state (num_stacks_per_state_max): its repeats or recursion are ambiguous; simplify the grammar";
}
const std::string too_many_stacks = too_many_stacks_of(65536);

TEST(GrammarLimits, TheStallingRegexRecipeFailsToCompileNamingTheLimit) {
  // Before: compile succeeded (has_value() was true) and a matcher on it never finished.
  auto compiled = compile(grammar_spec{grammar_kind::regex, recipe, {}, {}});
  ASSERT_FALSE(compiled.has_value());
  EXPECT_EQ(compiled.error().message, too_many_stacks);
  EXPECT_EQ(compiled.error().code, errc::invalid_argument);
}

TEST(GrammarLimits, RulesAndElementsACompileCreatesAreBounded) {
  // Each {0,1000} costs 1,000 rules: ten of them and the root pass 10,000. Before: compiled
  // (10,001 rules; 64 KiB of source could ask for 7 million).
  std::string ten;
  for (int i = 0; i < 10; i++) ten += "a{0,1000}";
  EXPECT_EQ(parse_regex(ten).error().message,
            "the grammar needs more than 10000 rules (num_rules_max; each repeat {m,n} costs n - m of them)");
  EXPECT_TRUE(parse_regex("a{0,1000}b{0,1000}").has_value());
  grammar_limits small;
  small.num_elements_max = 100;
  const std::string long_literal = "root ::= \"" + std::string(200, 'x') + "\" \"y\"";
  EXPECT_EQ(parse_gbnf(long_literal, small).error().message, "the grammar needs more than 100 elements (num_elements_max)");
  EXPECT_EQ(parse_json_schema(R"({"type": "string", "maxLength": 200})", small).error().message,
            "#: the grammar needs more than 100 elements (num_elements_max)");
  small.num_rules_max = 3;
  EXPECT_EQ(parse_gbnf("root ::= a b c d\na ::= \"a\"\nb ::= \"b\"\nc ::= \"c\"\nd ::= \"d\"", small).error().message,
            "the grammar needs more than 3 rules (num_rules_max; each repeat {m,n} costs n - m of them)");
}

TEST(GrammarLimits, TheAutomatonsStackAndMemoryBudgetsAreErrorsWithExactCounts) {
  // root ::= "a" x, x ::= "b" | "c" | "d" | "e": the first state visits 1 stack top ('a'),
  // the state after "a" 5 (the return into root, then x's four alternatives).
  auto g = std::make_shared<const grammar>(gbnf("root ::= \"a\" x\nx ::= \"b\" | \"c\" | \"d\" | \"e\""));
  grammar_limits limits;
  limits.num_stacks_per_state_max = 0;
  EXPECT_EQ(automaton::start(g, limits).error().message, too_many_stacks_of(0));
  limits.num_stacks_per_state_max = 4;
  auto a = automaton::start(g, limits);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->advance(automaton::initial(), 'a').error().message, too_many_stacks_of(4));
  EXPECT_EQ(a->num_states(), 1u);  // nothing kept from the failed state
  limits.num_stacks_per_state_max = 5;
  auto five = automaton::start(g, limits);
  ASSERT_TRUE(five.has_value());
  const int32_t after_a = five->advance(automaton::initial(), 'a').value();
  EXPECT_EQ(five->advance(after_a, 'e').value(), 2);  // the accepting state
  five->check_invariants();
  // Memory: a limit at what the first state holds refuses the next state, whose transition
  // table (256 x 4 bytes) alone crosses it.
  auto measured = automaton::start(g).value();
  limits.matcher_memory_bytes_max = measured.memory_bytes();
  auto tight = automaton::start(g, limits);
  ASSERT_TRUE(tight.has_value());
  EXPECT_EQ(tight->advance(automaton::initial(), 'a').error().message,
            "the grammar's automaton grew to " + std::to_string(measured.memory_bytes() + 1024) + " bytes, more than the " +
                std::to_string(measured.memory_bytes()) + " allowed (matcher_memory_bytes_max); simplify the grammar");
  tight->check_invariants();
}

/// How many `byte`s the automaton of `g` takes before an error (at most `n`), and the error.
std::pair<int, std::string> bytes_until_error(const grammar& g, char byte, int n) {
  auto a = automaton::start(std::make_shared<const grammar>(g));
  if (!a) return {0, a.error().message};
  int32_t s = automaton::initial();
  for (int i = 0; i < n; i++) {
    auto next = a->advance(s, static_cast<uint8_t>(byte));
    if (!next) {
      EXPECT_LE(a->memory_bytes(), grammar_limits{}.matcher_memory_bytes_max);
      a->check_invariants();
      return {i, next.error().message};
    }
    EXPECT_NE(*next, automaton::dead);
    s = *next;
  }
  return {n, ""};
}

TEST(GrammarLimits, AmbiguousRecursionAndAlternativesAreBounded) {
  // Two alternatives that read the same byte and return to different places double the stacks
  // with each byte (2^n after n), in GBNF recursion and in a schema's anyOf alike. Before: no
  // bound, the memory doubled with every byte. Building the state after n bytes visits a few
  // stack tops per stack (the recursion's: the rule's two references, its three alternatives,
  // the returns to "b" and "c"): the state after the 14th byte (2^14 stacks) is the first past
  // 65,536 visits, so 13 bytes are taken.
  const grammar recursion = gbnf("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"\"");
  EXPECT_EQ(bytes_until_error(recursion, 'a', 40), std::make_pair(13, too_many_stacks));
  auto any_of = parse_json_schema(R"({"$ref": "#/$defs/v", "$defs": {"v": {"anyOf": [
      {"type": "array", "items": {"$ref": "#/$defs/v"}}, {"type": "array", "items": {"$ref": "#/$defs/v"}}]}}})");
  ASSERT_TRUE(any_of.has_value()) << any_of.error().message;
  EXPECT_EQ(bytes_until_error(*any_of, '[', 40), std::make_pair(12, too_many_stacks));  // more tops per level (ws)
  // Nested repeats: `a{0,1000}{0,1000}` starts within the budget (2,000 rules; its first state
  // has about 1,000 stacks per level of the outer repeat) and grows by as much with every byte.
  EXPECT_EQ(bytes_until_error(*parse_regex("a{0,1000}{0,1000}"), 'a', 1000), std::make_pair(14, too_many_stacks));
}

TEST(GrammarLimits, AMatcherPastItsLimitFailsItsCursorsWithTheError) {
  auto vocab = toy_vocabulary();
  grammar_limits limits;
  limits.num_stacks_per_state_max = 4;
  auto compiled = compile(grammar_spec{grammar_kind::gbnf, "root ::= \"a\" x\nx ::= \"b\" | \"c\" | \"d\" | \"e\"", {}, {}}, limits);
  ASSERT_TRUE(compiled.has_value()) << compiled.error().message;
  matcher m(*compiled, vocab);
  cursor c(m);
  const auto mask = c.mask();  // the trie walk reaches the state after "a"
  ASSERT_FALSE(mask.has_value());
  EXPECT_EQ(mask.error().message, too_many_stacks_of(4));
  EXPECT_EQ(c.feed(token_of(*vocab, "a")).error().message, too_many_stacks_of(4));
  m.check_invariants();
}

TEST(GrammarLimits, TheWorkOfOneTokenMaskIsBoundedWithExactCounts) {
  // The first mask of root ::= "a" x walks the toy vocabulary's trie: "a" builds the state after
  // it (5 stack tops: the return into root, x's four alternatives), "ab" the accepting one (2:
  // the end of x's "b", the end of root); every other first byte is dead at once (0).
  auto vocab = toy_vocabulary();
  const grammar_spec spec{grammar_kind::gbnf, "root ::= \"a\" x\nx ::= \"b\" | \"c\" | \"d\" | \"e\"", {}, {}};
  grammar_limits limits;
  limits.num_stacks_per_mask_max = 7;
  matcher seven(compile(spec, limits).value(), vocab);
  const auto mask = seven.mask(automaton::initial());
  ASSERT_TRUE(mask.has_value()) << mask.error().message;
  EXPECT_TRUE(allowed(**mask, token_of(*vocab, "ab")));
  EXPECT_EQ(seven.states().num_visits(), 1 + 7);  // the compile's first state, then the mask's
  limits.num_stacks_per_mask_max = 6;
  matcher six(compile(spec, limits).value(), vocab);
  EXPECT_EQ(six.mask(automaton::initial()).error().message,
            "the grammar's automaton visited more than 6 stack tops for one token mask (num_stacks_per_mask_max); "
            "simplify the grammar");
}

TEST(GrammarLimits, TheCacheIsBoundedInBytes) {
  const grammar_spec a{grammar_kind::regex, "[a-z]{0,100}", {}, {}};
  const grammar_spec b{grammar_kind::regex, "[0-9]{0,100}", {}, {}};
  const int64_t a_bytes = compile(a).value()->memory_bytes;
  const int64_t b_bytes = compile(b).value()->memory_bytes;
  EXPECT_GT(a_bytes, 100 * 4 * static_cast<int64_t>(sizeof(element)));  // 100 rules of 4 elements at least
  grammar_limits limits;
  limits.cache_memory_bytes_max = a_bytes + b_bytes - 1;
  grammar_cache cache(limits);
  ASSERT_TRUE(cache.get(a).has_value());
  EXPECT_EQ(cache.memory_bytes(), a_bytes);
  ASSERT_TRUE(cache.get(b).has_value());
  EXPECT_EQ(cache.size(), 1u);  // a went to make room for b
  EXPECT_EQ(cache.memory_bytes(), b_bytes);
  limits.cache_memory_bytes_max = a_bytes - 1;  // a alone is too large: compiled, never kept
  grammar_cache small(limits);
  ASSERT_TRUE(small.get(a).has_value());
  EXPECT_EQ(small.size(), 0u);
  EXPECT_EQ(small.memory_bytes(), 0);
}

TEST(GrammarLimits, ASchemaNestedDeeperThan64IsRefusedBeforeItIsParsed) {
  // `const` and `enum` values are printed with nlohmann's dump(), which recurses once per level
  // (400,000 levels end the process). Before: this compiled.
  const std::string nested = R"({"const": )" + std::string(30000, '[') + std::string(30000, ']') + "}";
  EXPECT_EQ(parse_json_schema(nested).error().message,
            "JSON schema: the JSON nests arrays and objects more than 64 deep at byte 73 (nesting_max)");
  // 64 levels are fine; brackets inside strings do not count.
  const std::string deep64 = R"({"const": )" + std::string(63, '[') + std::string(63, ']') + "}";
  EXPECT_TRUE(parse_json_schema(deep64).has_value());
  EXPECT_TRUE(parse_json_schema(R"({"const": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"[["})").has_value());
  EXPECT_TRUE(check_json_depth(std::string(64, '{'), 64).has_value());
  EXPECT_EQ(check_json_depth(std::string(65, '{'), 64).error().message,
            "the JSON nests arrays and objects more than 64 deep at byte 64");
}

// ---- the engine on the bundled model ------------------------------------------------------

using testing::outputs;

engine::request grammar_request(engine::request_id id, int32_t seed, grammar_kind kind, const std::string& source,
                                int32_t max_tokens = 400) {
  engine::request r = testing::make_request(id, testing::varied_prompt(seed), max_tokens, 1.0f, 9000 + seed);
  r.grammar = grammar_spec{kind, source, {}, {}};
  return r;
}

/// Runs `requests` together in one engine; every sample must end by the grammar (stop).
outputs run_all(const std::vector<engine::request>& requests, const engine::engine_config& config = {}) {
  auto e = testing::make_engine(config);
  for (const engine::request& r : requests) {
    auto ok = e->add_request(r);
    EXPECT_TRUE(ok.has_value()) << ok.error().message;
  }
  outputs out = testing::run_to_completion(*e);
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
  return out;
}

const char* person_schema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer"},
    "happy": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
  "required": ["name", "age", "happy"]})";

/// Checks `text` against person_schema independently of the grammar: JSON that validates.
void expect_valid_person(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << "not JSON: " << text << " (" << e.what() << ")";
    return;
  }
  ASSERT_TRUE(j.is_object()) << text;
  ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
  EXPECT_LE(j["name"].get<std::string>().size(), 10u * 4) << text;
  ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << text;
  ASSERT_TRUE(j.contains("happy") && j["happy"].is_boolean()) << text;
  for (const auto& [key, v] : j.items()) EXPECT_TRUE(key == "name" || key == "age" || key == "happy" || key == "tags") << text;
  if (j.contains("tags")) {
    ASSERT_TRUE(j["tags"].is_array()) << text;
    EXPECT_LE(j["tags"].size(), 3u) << text;
    for (const auto& t : j["tags"]) EXPECT_TRUE(t.is_string()) << text;
  }
}

TEST(GrammarEngine, EveryOutputUnderAJsonSchemaValidates) {
  std::vector<engine::request> requests;
  for (int32_t seed = 0; seed < 100; seed++) requests.push_back(grammar_request(seed, seed, grammar_kind::json_schema, person_schema));
  const outputs out = run_all(requests);
  ASSERT_EQ(out.size(), 100u);
  for (const auto& [key, s] : out) {
    EXPECT_EQ(s.finish, engine::finish_reason::stop) << s.text;
    expect_valid_person(s.text);
  }
}

TEST(GrammarEngine, EveryOutputUnderARegexMatchesIt) {
  const std::string pattern = "(Once|One day), [a-z]{1,8} (ran|saw) [0-9]{1,2}( times)?!";
  std::vector<engine::request> requests;
  for (int32_t seed = 0; seed < 100; seed++) requests.push_back(grammar_request(seed, seed, grammar_kind::regex, pattern));
  const std::regex reference(pattern);
  for (const auto& [key, s] : run_all(requests)) {
    EXPECT_EQ(s.finish, engine::finish_reason::stop) << s.text;
    EXPECT_TRUE(std::regex_match(s.text, reference)) << s.text;
  }
}

/// A recursive-descent check of the arithmetic grammar's language, independent of it.
struct arithmetic {
  const std::string& s;
  size_t i = 0;
  bool number() {
    const size_t start = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) i++;
    return i > start && i - start <= 3 && (s[start] != '0' || i - start == 1);
  }
  bool op() { return i < s.size() && std::string("+-*/").find(s[i]) != std::string::npos && ++i; }
  void space() {
    if (i < s.size() && s[i] == ' ') i++;
  }
  bool term() {
    if (i < s.size() && s[i] == '(') {
      i++;
      if (!number()) return false;
      while (i < s.size() && s[i] != ')')
        if (!op() || !number()) return false;
      return i < s.size() && s[i++] == ')';
    }
    return number();
  }
  bool expression() {
    if (!term()) return false;
    while (i < s.size()) {
      space();
      if (!op()) return false;
      space();
      if (!term()) return false;
    }
    return true;
  }
};

TEST(GrammarEngine, EveryOutputUnderAGbnfArithmeticGrammarParses) {
  const std::string gbnf = R"g(root ::= term (ws op ws term){0,3}
term ::= num | "(" num (op num){0,2} ")"
num ::= [1-9] [0-9]{0,2} | "0"
op ::= [-+*/]
ws ::= " "?
)g";
  std::vector<engine::request> requests;
  for (int32_t seed = 0; seed < 100; seed++) requests.push_back(grammar_request(seed, seed, grammar_kind::gbnf, gbnf));
  for (const auto& [key, s] : run_all(requests)) {
    EXPECT_EQ(s.finish, engine::finish_reason::stop) << s.text;
    arithmetic parser{s.text};
    EXPECT_TRUE(parser.expression()) << s.text;
  }
}

TEST(GrammarEngine, BatchInvarianceHoldsWithGrammars) {
  std::vector<engine::request> requests;
  for (int32_t i = 0; i < 6; i++) {
    engine::request r = i % 2 == 0 ? grammar_request(i, i, grammar_kind::json_schema, person_schema)
                                   : testing::make_request(i, testing::varied_prompt(i), 40, 1.0f, 77 + i);
    requests.push_back(r);
  }
  testing::expect_same(run_all(requests), testing::run_each_alone(requests), "grammar batch vs alone");
}

TEST(GrammarEngine, ForksAndPreemptionsReplayEachSamplesGrammarStateFromItsTokens) {
  // n = 3 forks after the first sample; a pool of 40 blocks of 8 forces preemptions, whose
  // readmitted sequences (and the fork's children) rebuild their cursors from their tokens.
  std::vector<engine::request> requests;
  for (int32_t i = 0; i < 8; i++) {
    engine::request r = grammar_request(i, i, grammar_kind::json_schema, person_schema, 150);
    r.n = 3;
    requests.push_back(r);
  }
  engine::engine_config roomy;
  roomy.block_size = 8;
  const outputs want = run_all(requests, roomy);
  engine::engine_config tight = roomy;
  tight.num_kv_blocks = 40;
  tight.scheduler.max_num_batched_tokens = 48;
  auto e = testing::make_engine(tight);
  for (const engine::request& r : requests) ASSERT_TRUE(e->add_request(r).has_value());
  const outputs got = testing::run_to_completion(*e);
  EXPECT_GT(e->stats().num_preemptions, 0);
  ASSERT_EQ(got.size(), 24u);
  testing::expect_same(got, want, "preempted vs roomy");
  for (const auto& [key, s] : got)
    if (s.finish == engine::finish_reason::stop) expect_valid_person(s.text);
}

TEST(GrammarEngine, ASpeculatingEngineGivesGrammarRequestsNoDraftsAndTheSameOutput) {
  engine::engine_config spec;
  spec.speculation.drafter = spec::drafter_kind::ngram;
  spec.speculation.num_speculative_tokens = 3;
  std::vector<engine::request> requests;
  for (int32_t i = 0; i < 4; i++) requests.push_back(grammar_request(i, i, grammar_kind::json_schema, person_schema));
  testing::expect_same(run_all(requests, spec), run_all(requests), "speculating vs plain engine");
}

TEST(GrammarEngine, OutputBeforeATriggerIsFreeAndAfterItFollowsTheGrammar) {
  const testing::bundled& b = testing::model_and_tokenizer();
  const std::optional<int32_t> period = b.tok.find_piece(".");
  ASSERT_TRUE(period.has_value());
  for (int32_t seed = 0; seed < 20; seed++) {
    engine::request free = testing::make_request(seed, testing::varied_prompt(seed), 80, 1.0f, 300 + seed);
    free.ignore_eos = true;
    engine::request triggered = free;
    triggered.ignore_eos = false;
    triggered.grammar = grammar_spec{grammar_kind::regex, " [0-9]{3}", {*period}, {}};
    const outputs unconstrained = run_all({free});
    const outputs constrained = run_all({triggered});
    const std::vector<int32_t>& want = unconstrained.begin()->second.tokens;
    const testing::sample_output& got = constrained.begin()->second;
    const auto at = std::find(got.tokens.begin(), got.tokens.end(), *period);
    if (at == got.tokens.end()) {  // no trigger: free text all along (it may end at EOS)
      EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), want.begin())) << seed;
      continue;
    }
    const size_t n = static_cast<size_t>(at - got.tokens.begin()) + 1;
    EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.begin() + static_cast<std::ptrdiff_t>(n), want.begin())) << seed;
    const std::vector<int32_t> after(got.tokens.begin() + static_cast<std::ptrdiff_t>(n), got.tokens.end());
    std::string text;
    for (const int32_t t : after)
      if (!b.tok.is_control(t)) text += b.tok.piece(tokenizer::no_token, t);
    EXPECT_TRUE(std::regex_match(text, std::regex(" [0-9]{3}"))) << seed << ": '" << text << "'";
    EXPECT_EQ(got.finish, engine::finish_reason::stop) << seed;
  }
}

TEST(GrammarEngine, ATriggerStringLeavesTheTextBeforeItFreeAndTheRestFollowsTheGrammar) {
  int32_t num_triggered = 0;
  for (int32_t seed = 0; seed < 20; seed++) {
    engine::request r = testing::make_request(seed, testing::varied_prompt(seed), 80, 1.0f, 300 + seed);
    r.grammar = grammar_spec{grammar_kind::regex, " [0-9]{3}", {}, {"."}};
    const outputs out = run_all({r});
    const testing::sample_output& got = out.begin()->second;
    const size_t at = got.text.find('.');
    if (at == std::string::npos) continue;  // never triggered: free text all along
    num_triggered++;
    EXPECT_TRUE(std::regex_match(got.text.substr(at + 1), std::regex(" [0-9]{3}"))) << seed << ": " << got.text;
    EXPECT_EQ(got.finish, engine::finish_reason::stop) << seed;
  }
  EXPECT_GT(num_triggered, 10);  // stories have periods
}

// Issue 47: a request resumed with a token its grammar rejects (forged by a peer) used to be
// admitted, and the step executor's cursor then aborted the process ("a grammar-constrained
// sequence left its grammar") on every engine the request went to. Now it fails alone, at
// admission, and the engine serves on.
TEST(GrammarEngine, AResumedTokenOutsideTheGrammarFailsItsRequestAloneAtAdmission) {
  const testing::bundled& b = testing::model_and_tokenizer();
  const std::shared_ptr<const vocabulary> vocab = vocabulary_of(b.tok, {});
  int32_t letters = -1, other = -1;  // a token of [a-z]+, and one with a byte outside it
  for (int32_t t = 0; t < vocab->size(); t++) {
    const std::string& bytes = vocab->bytes(t);
    if (bytes.empty()) continue;
    const bool lower = std::all_of(bytes.begin(), bytes.end(), [](char c) { return c >= 'a' && c <= 'z'; });
    if (lower && letters < 0) letters = t;
    if (!lower && other < 0) other = t;
  }
  ASSERT_GE(letters, 0);
  ASSERT_GE(other, 0);
  auto e = testing::make_engine();
  const auto resumed = [&](engine::request_id id, std::vector<int32_t> tokens) {
    engine::request r = grammar_request(id, static_cast<int32_t>(id), grammar_kind::regex, "[a-z]+", 24);
    r.prompt.insert(r.prompt.end(), tokens.begin(), tokens.end());
    r.num_resumed_tokens = static_cast<int32_t>(tokens.size());
    r.max_tokens -= r.num_resumed_tokens;
    return r;
  };
  auto forged = e->add_request(resumed(1, {letters, other}));
  ASSERT_FALSE(forged.has_value()) << "admitted";
  EXPECT_EQ(forged.error().code, errc::invalid_argument);
  EXPECT_EQ(forged.error().message, "resumed token 1 (" + std::to_string(other) +
                                        ") leaves the request's grammar: it cannot have been generated under it");
  auto honest = e->add_request(resumed(2, {letters}));
  ASSERT_TRUE(honest.has_value()) << honest.error().message;
  const outputs out = testing::run_to_completion(*e);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out.begin()->second.tokens.empty());
}

TEST(GrammarEngine, BadGrammarsAreClearErrorsBeforeAdmission) {
  auto e = testing::make_engine();
  const auto error_of = [&](engine::request r) {
    auto ok = e->add_request(std::move(r));
    return ok ? std::string("admitted") : ok.error().message;
  };
  EXPECT_EQ(error_of(grammar_request(1, 1, grammar_kind::regex, "(a")), "regex line 1, column 3: expected ')', found the end");
  EXPECT_EQ(error_of(grammar_request(2, 2, grammar_kind::json_schema, R"({"type": "strin"})")), "#/type: unknown type 'strin'");
  EXPECT_EQ(error_of(grammar_request(3, 3, grammar_kind::gbnf, "root ::= foo")),
            "the grammar uses rule 'foo' but never defines it");
  engine::request eos = grammar_request(4, 4, grammar_kind::regex, "a");
  eos.ignore_eos = true;
  EXPECT_EQ(error_of(eos), "ignore_eos cannot be combined with a grammar: a complete match allows only end tokens");
  engine::request trigger = grammar_request(5, 5, grammar_kind::regex, "a");
  trigger.grammar.trigger_token_ids = {512};
  EXPECT_EQ(error_of(trigger), "trigger token id 512 is outside the vocabulary");
  EXPECT_FALSE(e->has_unfinished());
}

TEST(GrammarEngine, AGrammarPastALimitFailsOnlyItsRequestAndTheOthersGoOn) {
  engine::engine_config config;
  config.grammar.num_stacks_per_state_max = 16;
  auto e = testing::make_engine(config);
  // The recipe is refused when it is added: its first state is built by the compile.
  EXPECT_EQ(e->add_request(grammar_request(1, 1, grammar_kind::regex, recipe)).error().message, too_many_stacks_of(16));
  // This one's first state fits (1 stack) and the state after "a" does not (1 + 20): its first
  // mask fails inside a step, and only it.
  std::string x = "x ::= \"b\"";
  for (char c = 'c'; c <= 'u'; c++) x += std::string(" | \"") + c + "\"";
  const engine::request blowup = grammar_request(2, 2, grammar_kind::gbnf, "root ::= \"a\" x\n" + x);
  const std::vector<engine::request> others = {
      grammar_request(3, 3, grammar_kind::regex, " (He|She) had [1-9] (dogs|cats)[.]"),
      testing::make_request(4, testing::varied_prompt(4), 40, 1.0f, 9004)};
  ASSERT_TRUE(e->add_request(blowup).has_value());
  for (const engine::request& r : others) ASSERT_TRUE(e->add_request(r).has_value());
  const outputs got = testing::run_to_completion(*e);
  const std::vector<engine::failed_request> failed = e->take_failed();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].id, 2);
  EXPECT_EQ(failed[0].reason.message, too_many_stacks_of(16));
  EXPECT_EQ(got.count({2, 0}), 0u);  // no token
  outputs want = testing::run_each_alone(others, config);
  testing::expect_same(got, want, "beside a grammar past its limit");
}

TEST(GrammarEngine, APlanNamesGrammarsByIdAndTheExecutorLooksThemUpInTheTableBesideIt) {
  // The plan is plain data (issue 52): a chunk carries its grammar's id, numbered by admission,
  // and the engine hands its executor the compiled grammars beside the plan.
  const testing::bundled& b = testing::model_and_tokenizer();
  auto core = engine::engine_core::create(b.ck.config(), b.tok.end_ids(), {});
  ASSERT_TRUE(core.has_value()) << core.error().message;
  engine::request digits = grammar_request(1, 1, grammar_kind::regex, "[0-9]+");
  digits.compiled_grammar = compile(digits.grammar).value();
  engine::request letters = grammar_request(2, 2, grammar_kind::regex, "[a-z]+");
  letters.compiled_grammar = compile(letters.grammar).value();
  for (const engine::request& r : {digits, testing::make_request(3, testing::varied_prompt(3), 4, 1.0f, 3), letters})
    ASSERT_TRUE((*core)->add_request(r).has_value());
  const std::optional<engine::exec_plan> plan = (*core)->plan_step();
  ASSERT_TRUE(plan.has_value());
  std::map<engine::request_id, grammar_id> ids;
  for (const engine::exec_chunk& chunk : plan->chunks) ids[(*core)->request_of(chunk.seq).value()] = chunk.grammar;
  EXPECT_EQ(ids, (std::map<engine::request_id, grammar_id>{{1, 1}, {2, 2}, {3, no_grammar}}));
  const grammar_table table = (*core)->grammars_of(*plan);
  EXPECT_EQ(table, (grammar_table{{1, digits.compiled_grammar}, {2, letters.compiled_grammar}}));

  const engine::engine_config& config = (*core)->config();
  engine::step_executor executor(b.ck, config.num_kv_blocks, config.block_size, model::kernel_path::fast, nullptr, {},
                                 nullptr, vocabulary_of(b.tok, engine::end_token_ids(config, b.tok.end_ids())));
  const auto first = std::find_if(plan->chunks.begin(), plan->chunks.end(),
                                  [](const engine::exec_chunk& c) { return c.grammar != no_grammar; });
  ASSERT_NE(first, plan->chunks.end());
  EXPECT_EQ(executor.check(*plan).error().message, "sequence " + std::to_string(first->seq) + " names grammar " +
                                                       std::to_string(first->grammar) + ", which did not come with the plan");
  EXPECT_TRUE(executor.check(*plan, table).has_value());
}

}  // namespace
}  // namespace troupe::grammar
