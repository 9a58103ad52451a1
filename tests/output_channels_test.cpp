// A chat answer parsed by token id (issue 19, point 3): reasoning between <think> tags, tool
// calls between <tool_call> tags, the rest content; only the tag tokens switch channels, never
// text that spells them; a call that is no call stays as content; the request policy splits a
// chat's answer and never a plain completion's.
#include "runtime/serve/output_channels.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/serve/request_policy.hpp"
#include "tests/support/bpe_vocab_file.hpp"
#include "tests/support/engine_harness.hpp"

namespace troupe::serve {
namespace {

// The small BPE vocabulary (ids 0..255 are the bytes) with the tags added: the think pair
// user-defined, as Qwen3's GGUF has them, the tool-call pair as control tokens.
constexpr std::int32_t think_open = 261, think_close = 262, tool_open = 263, tool_close = 264;

/// The small BPE vocabulary (ids 0..255 are the bytes, 261 tokens in all) with `tags` added after
/// it, each of its token type (3 control, 4 user-defined).
tokenizer vocab_with(const std::vector<std::pair<const char*, int>>& tags, const char* name) {
  const std::string bytes = testing::small_bpe_gguf([&](testing::gguf_metadata& meta) {
    for (auto& [key, value] : meta)
      for (const auto& [text, type] : tags) {
        if (key == "tokenizer.ggml.tokens") value.array.push_back(model::gguf_value::of_string(text));
        if (key == "tokenizer.ggml.token_type")
          value.array.push_back(model::gguf_value::of_int(model::gguf_type::i32, type));
      }
  });
  auto t = tokenizer::from_bytes(bytes, 261 + static_cast<int32_t>(tags.size()), name);
  TROUPE_ASSERT_MSG(t.has_value(), "a tagged test vocabulary loads");
  return std::move(*t);
}

const tokenizer& tagged_vocab() {
  static const tokenizer tok =
      vocab_with({{"<think>", 4}, {"</think>", 4}, {"<tool_call>", 3}, {"</tool_call>", 3}}, "tagged.gguf");
  return tok;
}

/// The byte tokens of `text` (ids 0..255 are the bytes).
std::vector<std::int32_t> bytes_of(const std::string& text) {
  std::vector<std::int32_t> ids;
  for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::vector<std::int32_t> join(std::initializer_list<std::vector<std::int32_t>> parts) {
  std::vector<std::int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

/// Everything `tokens` give, pushed one by one then finished; invariants checked after each.
output_channels::delta run(output_channels& out, const std::vector<std::int32_t>& tokens) {
  output_channels::delta all;
  const auto add = [&](output_channels::delta d) {
    all.content += d.content;
    all.reasoning += d.reasoning;
    all.tool_calls.insert(all.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    all.stopped = all.stopped || d.stopped;
  };
  for (const std::int32_t t : tokens) {
    add(out.push(t));
    out.check_invariants();
    if (all.stopped) return all;
  }
  add(out.finish());
  out.check_invariants();
  return all;
}

output_channels::delta run(const std::vector<std::int32_t>& tokens, std::vector<std::string> stop = {},
                           const std::vector<std::int32_t>& prompt = {258}) {
  output_channels out(tagged_vocab(), prompt, std::move(stop), output_tags::of(tagged_vocab()));
  return run(out, tokens);
}

TEST(OutputTags, AreFoundAsAddedTokensAndOnlyAsWholePairs) {
  const output_tags t = output_tags::of(tagged_vocab());
  EXPECT_EQ(t.think_open, think_open);
  EXPECT_EQ(t.think_close, think_close);
  EXPECT_EQ(t.tool_open, tool_open);
  EXPECT_EQ(t.tool_close, tool_close);
  EXPECT_FALSE(output_tags::of(testing::model_and_tokenizer().tok).any());  // stories260K: none
  // An ordinary token spelling "<think>" is no tag, and half a pair is none.
  const std::string bytes = testing::small_bpe_gguf([](testing::gguf_metadata& meta) {
    for (auto& [key, value] : meta) {
      if (key == "tokenizer.ggml.tokens")
        for (const char* t : {"<think>", "</think>", "<tool_call>"}) value.array.push_back(model::gguf_value::of_string(t));
      if (key == "tokenizer.ggml.token_type")
        for (const int type : {1, 3, 3}) value.array.push_back(model::gguf_value::of_int(model::gguf_type::i32, type));
    }
  });
  const auto partial = tokenizer::from_bytes(bytes, 264, "partial.gguf");
  ASSERT_TRUE(partial.has_value()) << partial.error().message;
  EXPECT_FALSE(output_tags::of(*partial).any());
}

TEST(OutputChannels, SplitReasoningToolCallsAndContentByTagTokens) {
  const auto d = run(join({{think_open}, bytes_of("let me see"), {think_close}, bytes_of("Sure. "), {tool_open},
                           bytes_of("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"), {tool_close},
                           {tool_open}, bytes_of(R"({"name":"now","arguments":"{}"})"), {tool_close}, bytes_of(" ok")}));
  EXPECT_EQ(d.reasoning, "let me see");
  EXPECT_EQ(d.content, "Sure.  ok");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0], (tool_call{"get_weather", R"({"city":"Paris"})"}));
  EXPECT_EQ(d.tool_calls[1], (tool_call{"now", "{}"}));
}

TEST(OutputChannels, TextThatSpellsATagIsContent) {
  // "<think>" spelled by byte tokens (the model wrote the characters): by id it is no tag.
  const auto d = run(bytes_of("<think>x</think><tool_call>{}</tool_call>"));
  EXPECT_EQ(d.content, "<think>x</think><tool_call>{}</tool_call>");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_TRUE(d.tool_calls.empty());
  // A closing tag outside its channel, or an opening one inside another, is an ordinary token:
  // these user-defined ones show their text.
  const auto stray = run(join({{think_close}, bytes_of("a"), {tool_open}, {think_open}, bytes_of("{}"), {tool_close}}));
  EXPECT_EQ(stray.content, "</think>a<think>{}");  // no name: no call, its text stays
  EXPECT_EQ(stray.reasoning, "");
}

TEST(OutputChannels, WhatIsNoCallStaysContentInOrder) {
  for (const std::string& bad : std::vector<std::string>{"not json", "[1, 2]", R"({"arguments": {}})", R"({"name": 3})", R"({"name": ""})",
                                R"({"name": "f", "arguments": [1]})", std::string(100, '[') + std::string(100, ']'),
                                "{\"name\": \"f\", \"arguments\": " + std::string(65, '[') + std::string(65, ']') + "}"}) {
    const auto d = run(join({bytes_of("a "), {tool_open}, bytes_of(bad), {tool_close}, bytes_of(" b")}));
    EXPECT_EQ(d.content, "a " + bad + " b");
    EXPECT_TRUE(d.tool_calls.empty()) << bad;
  }
  // Brackets inside strings do not count towards the nesting bound.
  const std::string deep_string = "{\"name\": \"f\", \"arguments\": {\"s\": \"" + std::string(200, '[') + "\"}}";
  const auto d = run(join({{tool_open}, bytes_of(deep_string), {tool_close}}));
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"s\":\"" + std::string(200, '[') + "\"}");
  // The answer ends inside a call: it is no call.
  const auto unclosed = run(join({bytes_of("x"), {tool_open}, bytes_of(R"({"name": "f")")}));
  EXPECT_EQ(unclosed.content, R"(x{"name": "f")");
  EXPECT_TRUE(unclosed.tool_calls.empty());
}

// Llama 3.x's and Mistral's call tags as control tokens, as their GGUFs have them.
constexpr std::int32_t python_tag = 261, mistral_calls = 262;

const tokenizer& llama_mistral_vocab() {
  static const tokenizer tok = vocab_with({{"<|python_tag|>", 3}, {"[TOOL_CALLS]", 3}}, "calls.gguf");
  return tok;
}

output_channels::delta run_calls(const std::vector<std::int32_t>& tokens, bool bare_json_calls = false) {
  output_channels out(llama_mistral_vocab(), {258}, {}, output_tags::of(llama_mistral_vocab()), bare_json_calls);
  return run(out, tokens);
}

TEST(OutputChannels, LlamasPythonTagAndMistralsToolCallsTagCallToTheEndOfTheAnswer) {
  const output_tags t = output_tags::of(llama_mistral_vocab());
  EXPECT_EQ(t.python_tag, python_tag);
  EXPECT_EQ(t.mistral_calls, mistral_calls);
  EXPECT_EQ(t.tool_open, -1);
  // Llama 3.x: the JSON form after <|python_tag|>, one call or several separated by ";".
  const auto one = run_calls(join({bytes_of("Let me look. "), {python_tag},
                                   bytes_of(R"({"name": "get_weather", "parameters": {"city": "Paris"}})")}));
  EXPECT_EQ(one.content, "Let me look. ");
  EXPECT_EQ(one.tool_calls, (std::vector<tool_call>{{"get_weather", R"({"city":"Paris"})"}}));
  const auto two = run_calls(join({{python_tag}, bytes_of(R"({"name": "a", "parameters": {"s": "x;y"}}; {"name": "b", "parameters": {}})")}));
  EXPECT_EQ(two.content, "");
  EXPECT_EQ(two.tool_calls, (std::vector<tool_call>{{"a", R"({"s":"x;y"})"}, {"b", "{}"}}));
  // Mistral: a list of calls after [TOOL_CALLS].
  const auto list = run_calls(join({{mistral_calls}, bytes_of(R"([{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": "{}"}])")}));
  EXPECT_EQ(list.tool_calls, (std::vector<tool_call>{{"f", R"({"a":1})"}, {"g", "{}"}}));
  // What is not calls stays content, without the tag: Llama's built-in tools' Python form, a
  // half-written list, text that spells the tags.
  for (const std::string& bad : {std::string(R"(brave_search.call(query="weather"))"), std::string(R"([{"name": "f")"),
                                 std::string("[]"), std::string(R"({"name": "a"}; 5)")}) {
    const auto d = run_calls(join({bytes_of("x"), {python_tag}, bytes_of(bad)}));
    EXPECT_EQ(d.content, "x" + bad);
    EXPECT_TRUE(d.tool_calls.empty()) << bad;
  }
  const auto spelled = run_calls(bytes_of(R"(<|python_tag|>{"name": "f"})"));
  EXPECT_EQ(spelled.content, R"(<|python_tag|>{"name": "f"})");
  EXPECT_TRUE(spelled.tool_calls.empty());
}

// Command R7B's tags as control tokens, as its GGUF has them.
constexpr std::int32_t start_thinking = 261, end_thinking = 262, start_action = 263, end_action = 264,
                       start_response = 265, end_response = 266;

const tokenizer& command_r_vocab() {
  static const tokenizer tok = vocab_with({{"<|START_THINKING|>", 3}, {"<|END_THINKING|>", 3}, {"<|START_ACTION|>", 3},
                                           {"<|END_ACTION|>", 3}, {"<|START_RESPONSE|>", 3}, {"<|END_RESPONSE|>", 3}},
                                          "command-r.gguf");
  return tok;
}

TEST(OutputChannels, CommandRsThinkingActionAndResponseTagsSplitItsAnswer) {
  const output_tags t = output_tags::of(command_r_vocab());
  EXPECT_EQ(t.think_open, start_thinking);
  EXPECT_EQ(t.think_close, end_thinking);
  EXPECT_EQ(t.tool_open, start_action);
  EXPECT_EQ(t.tool_close, end_action);
  const auto run_command_r = [&](const std::vector<std::int32_t>& tokens) {
    output_channels out(command_r_vocab(), {258}, {}, t);
    return run(out, tokens);
  };
  // Its plan, then a list of calls between the action tags.
  const auto calls = run_command_r(join(
      {{start_thinking}, bytes_of("I will look it up."), {end_thinking, start_action},
       bytes_of(R"([{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}},)"
                R"( {"tool_call_id": "1", "tool_name": "get_time", "parameters": {}}])"),
       {end_action}}));
  EXPECT_EQ(calls.reasoning, "I will look it up.");
  EXPECT_EQ(calls.content, "");
  EXPECT_EQ(calls.tool_calls, (std::vector<tool_call>{{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}));
  // An answer between the response tags is content, the tags showing nothing.
  const auto answer = run_command_r(join({{start_response}, bytes_of("It is sunny."), {end_response}}));
  EXPECT_EQ(answer.content, "It is sunny.");
  EXPECT_TRUE(answer.tool_calls.empty());
  // An action that is no list of calls stays content, without the tags.
  const auto broken = run_command_r(join({{start_action}, bytes_of(R"([{"tool_call_id": "0"}])"), {end_action}}));
  EXPECT_EQ(broken.content, R"([{"tool_call_id": "0"}])");
  EXPECT_TRUE(broken.tool_calls.empty());
}

TEST(OutputChannels, LlamasBareJsonFormIsCallsWhenAChatWithToolsAsksForIt) {
  const std::string call = R"({"name": "get_weather", "parameters": {"city": "Paris"}})";
  const auto d = run_calls(bytes_of(" \n" + call), true);
  EXPECT_EQ(d.content, "");
  EXPECT_EQ(d.tool_calls, (std::vector<tool_call>{{"get_weather", R"({"city":"Paris"})"}}));
  // Without the flag (no tools), the same text is content.
  EXPECT_EQ(run_calls(bytes_of(call)).content, call);
  // An answer that does not start with "{" streams as content from its first character on; one
  // that is JSON but no call is given back whole; blanks alone stay content.
  output_channels out(llama_mistral_vocab(), {258}, {}, output_tags::of(llama_mistral_vocab()), true);
  EXPECT_EQ(out.push('H').content, "H");
  EXPECT_EQ(run_calls(bytes_of(R"( {"a": 1})"), true).content, R"( {"a": 1})");
  EXPECT_EQ(run_calls(bytes_of(" \n"), true).content, " \n");
}

TEST(OutputChannels, APromptEndingWithTheThinkTagStartsInReasoning) {
  const auto d = run(join({bytes_of("hmm"), {think_close}, bytes_of("yes")}), {}, {258, think_open});
  EXPECT_EQ(d.reasoning, "hmm");
  EXPECT_EQ(d.content, "yes");
  const auto unfinished = run(bytes_of("still thinking"), {}, {258, think_open});
  EXPECT_EQ(unfinished.reasoning, "still thinking");
  EXPECT_EQ(unfinished.content, "");
}

TEST(OutputChannels, StopStringsAreLookedForInTheContentOnly) {
  const auto d = run(join({{think_open}, bytes_of("END here"), {think_close}, bytes_of("a END b")}), {"END"});
  EXPECT_EQ(d.reasoning, "END here");
  EXPECT_EQ(d.content, "a ");
  EXPECT_TRUE(d.stopped);
  // A failed call's text is content: a stop string in it ends the answer.
  const auto in_call = run(join({{tool_open}, bytes_of("xENDy"), {tool_close}, bytes_of("z")}), {"END"});
  EXPECT_EQ(in_call.content, "x");
  EXPECT_TRUE(in_call.stopped);
}

TEST(OutputChannels, WithoutTagsEveryTokenIsContentAsBefore) {
  const std::vector<std::int32_t> tokens = join({{think_open}, bytes_of("a"), {tool_open}, bytes_of("b")});
  output_channels out(tagged_vocab(), {258}, {}, output_tags{});
  const auto d = run(out, tokens);
  EXPECT_EQ(d.content, tagged_vocab().decode(tokens));  // the user-defined <think> shows as text
  EXPECT_EQ(d.content, "<think>ab");                     // the control <tool_call> decodes to ""
}

/// What the request policy of `o` sends for `answer` (its last token finishes it), chunks joined.
completion_chunk sent_for(const request_policy_options& o, const std::vector<std::int32_t>& answer) {
  request_policy h(o);
  (void)h.start(0);
  placed_engines p;
  p.has_decode = true;
  (void)h.placed(p);
  completion_chunk got;
  for (size_t i = 0; i < answer.size(); i++) {
    engine::sample_event s;
    s.sample.token = answer[i];
    if (i + 1 == answer.size()) s.finish = engine::finish_reason::stop;
    for (const effect& e : h.on_token(s, 0, 1)) {
      if (const auto* c = std::get_if<send_chunk>(&e)) {
        got.text += c->chunk.text;
        got.reasoning_text += c->chunk.reasoning_text;
        got.tool_calls.insert(got.tool_calls.end(), c->chunk.tool_calls.begin(), c->chunk.tool_calls.end());
        got.tokens.insert(got.tokens.end(), c->chunk.tokens.begin(), c->chunk.tokens.end());
      }
    }
    h.check_invariants();
  }
  EXPECT_TRUE(h.done());
  return got;
}

request_policy_options policy_options(const tokenizer& vocab) {
  request_policy_options o;
  o.id = 1;
  o.tok = std::make_shared<const tokenizer>(vocab);
  o.tags = output_tags::of(vocab);
  o.drawn_seed = 1;
  o.params.max_tokens = 64;
  return o;
}

TEST(OutputChannels, TheRequestPolicySplitsAChatsAnswerAndNotAPlainCompletions) {
  const std::vector<std::int32_t> answer =
      join({{think_open}, bytes_of("hm"), {think_close}, bytes_of("ok"), {tool_open}, bytes_of(R"({"name":"f"})"),
            {tool_close}, {258}});
  for (const bool chat : {true, false}) {
    request_policy_options o = policy_options(tagged_vocab());
    if (chat)
      o.params.messages = {{"user", "ab"}};
    else
      o.params.prompt = "ab";
    const completion_chunk got = sent_for(o, answer);
    EXPECT_EQ(got.tokens, answer);  // every token is reported, tags included
    if (chat) {
      EXPECT_EQ(got.text, "ok");
      EXPECT_EQ(got.reasoning_text, "hm");
      EXPECT_EQ(got.tool_calls, (std::vector<tool_call>{{"f", "{}"}}));
    } else {
      EXPECT_EQ(got.text, R"(<think>hm</think>ok{"name":"f"})");
      EXPECT_EQ(got.reasoning_text, "");
      EXPECT_TRUE(got.tool_calls.empty());
    }
  }
}

TEST(OutputChannels, TheRequestPolicyReadsLlamasBareJsonOnlyInAChatWithToolsAndNoGrammar) {
  const std::string call = R"({"name":"f","parameters":{}})";
  const std::vector<std::int32_t> answer = join({bytes_of(call), {258}});
  request_policy_options o = policy_options(llama_mistral_vocab());
  o.params.messages = {{"user", "ab"}};
  o.chat = *served_template::jinja("{% for m in messages %}{{ m.content }}{% endfor %}",
                                   jinja_options_for(llama_mistral_vocab(), {}));
  EXPECT_EQ(sent_for(o, answer).text, call);  // no tools: an answer in JSON is content
  o.params.tools = R"([{"type":"function","function":{"name":"f"}}])";
  completion_chunk got = sent_for(o, answer);
  EXPECT_EQ(got.text, "");
  EXPECT_EQ(got.tool_calls, (std::vector<tool_call>{{"f", "{}"}}));
  // Under a grammar (a forced tool_choice's, say) the gateway reads the text itself.
  o.params.grammar_kind = "json_schema";
  o.params.grammar = R"({"type":"object"})";
  EXPECT_EQ(sent_for(o, answer).text, call);
}

}  // namespace
}  // namespace troupe::serve
