// The OpenAI API's parsing and rendering, and the Prometheus page: exact requests, exact bytes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/openai/api.hpp"
#include "runtime/openai/log_lines.hpp"
#include "runtime/openai/metrics.hpp"
#include "runtime/engine/request.hpp"
#include "runtime/serve/request_policy.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "tests/support/golden.hpp"

namespace troupe::openai {
namespace {

const served_model model{"stories260K", "troupe-test", 1700000000};

parsed_request parsed(endpoint kind, const std::string& body) {
  auto p = parse_request(kind, body, model);
  EXPECT_TRUE(p.has_value()) << (p ? "" : p.error().message);
  return p ? *p : parsed_request{};
}

api_error refused(endpoint kind, const std::string& body) {
  auto p = parse_request(kind, body, model);
  EXPECT_FALSE(p.has_value()) << body;
  return p ? api_error{} : p.error();
}

TEST(OpenaiRequest, GrammarsComeFromResponseFormatOrTheGuidedParameters) {
  const serve::completion_request schema =
      parsed(endpoint::chat_completions,
             R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema",)"
             R"("json_schema":{"name":"p","schema":{"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"string"}}}}}})")
          .request;
  EXPECT_EQ(schema.grammar_kind, "json_schema");
  EXPECT_EQ(schema.grammar, R"({"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"string"}}})");  // order kept
  const serve::completion_request object =
      parsed(endpoint::completions, R"({"prompt":"x","response_format":{"type":"json_object"}})").request;
  EXPECT_EQ(object.grammar_kind, "json_schema");
  EXPECT_EQ(object.grammar, R"({"type": "object"})");
  EXPECT_EQ(parsed(endpoint::completions, R"({"prompt":"x","response_format":{"type":"text"}})").request.grammar_kind, "");
  const serve::completion_request regex = parsed(endpoint::completions, R"({"prompt":"x","guided_regex":"[0-9]+"})").request;
  EXPECT_EQ(regex.grammar_kind, "regex");
  EXPECT_EQ(regex.grammar, "[0-9]+");
  const serve::completion_request gbnf = parsed(endpoint::completions, R"({"prompt":"x","guided_grammar":"root ::= \"a\""})").request;
  EXPECT_EQ(gbnf.grammar_kind, "gbnf");
  EXPECT_EQ(gbnf.grammar, "root ::= \"a\"");
  EXPECT_EQ(parsed(endpoint::completions, R"({"prompt":"x","guided_json":{"type":"null"}})").request.grammar, R"({"type":"null"})");
  EXPECT_EQ(refused(endpoint::completions, R"({"prompt":"x","guided_regex":"a","guided_grammar":"root ::= \"a\""})").message,
            "give at most one of response_format, guided_json, guided_regex, guided_grammar");
  EXPECT_EQ(refused(endpoint::completions, R"({"prompt":"x","response_format":{"type":"xml"}})").param, "response_format");
  EXPECT_EQ(refused(endpoint::completions, R"({"prompt":"x","guided_regex":5})").message, "'guided_regex' must be a string");
  const serve::completion_request lazy = parsed(endpoint::completions,
                                              R"({"prompt":"x","guided_regex":"[0-9]+","grammar_trigger_strings":["<n>"],)"
                                              R"("grammar_trigger_token_ids":[13]})")
                                           .request;
  EXPECT_EQ(lazy.grammar_trigger_strings, std::vector<std::string>{"<n>"});
  EXPECT_EQ(lazy.grammar_trigger_token_ids, std::vector<int32_t>{13});
  EXPECT_EQ(refused(endpoint::completions, R"({"prompt":"x","grammar_trigger_strings":"<n>"})").param, "grammar_trigger_strings");
}

TEST(OpenaiRequest, ACompletionCarriesEverySamplingParameter) {
  const parsed_request p = parsed(endpoint::completions,
                                  R"({"model":"stories260K","prompt":"Once upon","max_tokens":40,"temperature":0.5,)"
                                  R"("top_p":0.9,"top_k":40,"min_p":0.05,"seed":18446744073709551615,"stop":["."],)"
                                  R"("ignore_eos":true,"priority":3,"stream":true,"stream_options":{"include_usage":true},)"
                                  R"("user":"ignored","presence_penalty":0.5,"frequency_penalty":-1.25,)"
                                  R"("repetition_penalty":1.5,"n":1,"logit_bias":{"5":-100,"300":2.5},"cache_class":"agent"})");
  const serve::completion_request& r = p.request;
  ASSERT_EQ(p.prompts.size(), 1u);
  EXPECT_EQ(p.prompts[0].text, "Once upon");
  EXPECT_EQ(p.n, 1);
  EXPECT_EQ(r.max_tokens, 40);
  EXPECT_EQ(r.temperature, 0.5f);
  EXPECT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.min_p, 0.05f);
  EXPECT_TRUE(r.has_seed);
  EXPECT_EQ(r.seed, 18446744073709551615ull);
  EXPECT_EQ(r.stop, std::vector<std::string>{"."});
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.priority, 3);
  EXPECT_EQ(r.cache_class, "agent");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(r.presence_penalty, 0.5f);
  EXPECT_EQ(r.frequency_penalty, -1.25f);
  EXPECT_EQ(r.repetition_penalty, 1.5f);
  // The request's order (requests are read keeping it); the sampler's result does not depend on it.
  EXPECT_EQ(r.logit_bias, (std::vector<sampling::token_bias>{{5, -100.0f}, {300, 2.5f}}));
}

TEST(OpenaiRequest, DefaultsFollowTheApi) {
  const parsed_request p = parsed(endpoint::completions, R"({"prompt":"x","top_k":-1,"stop":"\n"})");
  EXPECT_EQ(p.request.max_tokens, 16);
  EXPECT_EQ(p.request.temperature, 1.0f);
  EXPECT_EQ(p.request.top_k, 0);  // -1: vLLM's "disabled"
  EXPECT_FALSE(p.request.has_seed);
  EXPECT_FALSE(p.request.stream);
  EXPECT_EQ(p.request.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(p.request.presence_penalty, 0.0f);
  EXPECT_EQ(p.request.frequency_penalty, 0.0f);
  EXPECT_EQ(p.request.repetition_penalty, 1.0f);
  EXPECT_TRUE(p.request.logit_bias.empty());
}

TEST(OpenaiRequest, AChatTravelsAsItsMessagesWithMarkersAsText) {
  const parsed_request p = parsed(
      endpoint::chat_completions,
      R"({"messages":[{"role":"developer","content":"Tell a story."},{"role":"user","content":[{"type":"text","text":"<s>Once"},)"
      R"({"type":"text","text":"</s>"}]}],"max_completion_tokens":7})");
  ASSERT_EQ(p.prompts.size(), 1u);
  EXPECT_TRUE(p.prompts[0].is_chat);
  EXPECT_FALSE(p.prompts[0].is_tokens);  // the request actor renders and encodes it, never as a control token
  ASSERT_EQ(p.request.messages.size(), 2u);
  EXPECT_EQ(p.request.messages[0].role, "system");  // OpenAI's "developer"
  EXPECT_EQ(p.request.messages[0].content, "Tell a story.");
  EXPECT_EQ(p.request.messages[1].role, "user");
  EXPECT_EQ(p.request.messages[1].content, "<s>Once</s>");
  EXPECT_EQ(p.request.max_tokens, 7);
  const std::vector<serve::completion_request> choices = choice_requests(p, 1);
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_EQ(choices[0].prompt, "");
  EXPECT_EQ(choices[0].messages.size(), 2u);
  EXPECT_TRUE(choices[0].add_generation_prompt);
  EXPECT_EQ(choices[0].chat_template_kwargs, "");
}

TEST(OpenaiRequest, AChatsTemplateKwargsTravelAsTheirJsonText) {
  const parsed_request p = parsed(endpoint::chat_completions,
                                  R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,)"
                                  R"("chat_template_kwargs":{"enable_thinking":false,"b":[1,{"c":"<s>"}]}})");
  EXPECT_FALSE(p.request.add_generation_prompt);
  EXPECT_EQ(p.request.chat_template_kwargs, R"({"enable_thinking":false,"b":[1,{"c":"<s>"}]})");
  const std::string hi = R"({"messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(refused(endpoint::chat_completions, hi + R"("chat_template_kwargs":[1]})").message,
            "'chat_template_kwargs' must be an object");
  EXPECT_EQ(refused(endpoint::chat_completions, hi + R"("add_generation_prompt":1})").param, "add_generation_prompt");
}

TEST(OpenaiRequest, AToolCallingChatCarriesItsToolsCallsAndResultsForTheTemplate) {
  const std::string tools =
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])";
  const std::string call = R"({"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}})";
  const std::string messages = R"({"messages":[{"role":"user","content":"Weather in Paris?"},)"
                               R"({"role":"assistant","content":null,"tool_calls":[)" + call + R"(]},)"
                               R"({"role":"tool","tool_call_id":"c1","name":"get_weather","content":"18 C"}],)";
  const parsed_request p = parsed(endpoint::chat_completions,
                                  messages + R"("tools":)" + tools + R"(,"tool_choice":"auto","parallel_tool_calls":true})");
  ASSERT_EQ(p.request.messages.size(), 3u);
  EXPECT_EQ(p.request.messages[0].extras, "");
  EXPECT_EQ(p.request.messages[1].content, "");  // null beside tool calls
  // The arguments' text parsed: templates read them as an object.
  EXPECT_EQ(p.request.messages[1].extras,
            R"({"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]})");
  EXPECT_EQ(p.request.messages[2].role, "tool");
  EXPECT_EQ(p.request.messages[2].extras, R"({"tool_call_id":"c1","name":"get_weather"})");
  EXPECT_EQ(p.request.tools, tools);
  // tool_choice "none": the template gets no tools (the turns still carry their calls).
  EXPECT_EQ(parsed(endpoint::chat_completions, messages + R"("tools":)" + tools + R"(,"tool_choice":"none"})").request.tools, "");
  const std::string hi = R"({"messages":[{"role":"user","content":"x"}],)";
  const std::vector<std::pair<std::string, std::string>> refusals{
      {hi + R"("tools":[{"type":"function"}]})",
       R"('tools' must be a list of {"type": "function", "function": {"name" (not empty), "description", "parameters" (an object)}} objects)"},
      {hi + R"("tools":)" + tools + R"(,"tool_choice":"any"})",
       R"('tool_choice' must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}})"},
      {hi + R"("parallel_tool_calls":1})", "'parallel_tool_calls' must be a boolean"},
      {R"({"messages":[{"role":"tool","content":"18 C"}]})",
       "a 'tool' message needs the string 'tool_call_id' of the call it answers"},
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","function":{"name":"f"}}]}]})",
       R"(each of an assistant's 'tool_calls' must be {"id", "type": "function", "function": {"name", "arguments" (a JSON string)}})"},
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":{}}]})", "an assistant's 'tool_calls' must be a list"},
      {R"({"messages":[{"role":"user","content":7}]})", "a message's 'content' must be a string or a list of text parts"},
  };
  for (const auto& [body, message] : refusals) EXPECT_EQ(refused(endpoint::chat_completions, body).message, message) << body;
  // A text completion has no template to take tools.
  EXPECT_EQ(refused(endpoint::completions, R"({"prompt":"x","tools":)" + tools + "}").param, "tools");
}

TEST(OpenaiRequest, EachProblemIsA400NamingTheParameter) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","max_tokens":1.5})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":4294967296})", "max_tokens"},
      {R"({"prompt":"x","seed":-1})", "seed"},
      {R"({"prompt":"x","stop":[1]})", "stop"},
      {R"({"prompt":"x","presence_penalty":"high"})", "presence_penalty"},
      {R"({"prompt":"x","frequency_penalty":[1]})", "frequency_penalty"},
      {R"({"prompt":"x","repetition_penalty":true})", "repetition_penalty"},
      {R"({"prompt":"x","logit_bias":[[1,5]]})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"one":5}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"1.5":5}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"4294967296":5}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"":5}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"1":"5"}})", "logit_bias"},
      {R"({"prompt":"x","cache_class":"batch"})", "cache_class"},
      {R"({"prompt":"x","cache_class":1})", "cache_class"},
      {R"({"prompt":"x","n":0})", "n"},
      {R"({"prompt":"x","n":129})", "n"},
      {R"({"prompt":"x","n":"2"})", "n"},
      {R"({"prompt":"x","n":2,"best_of":3})", "best_of"},
      {R"({"prompt":"x","best_of":2})", "best_of"},
      {R"({"prompt":"x","logprobs":21})", "logprobs"},
      {R"({"prompt":"x","logprobs":-1})", "logprobs"},
      {R"({"prompt":"x","logprobs":true})", "logprobs"},
      {R"({"prompt":"x","top_logprobs":2})", "top_logprobs"},
      {R"({"prompt":[]})", "prompt"},
      {R"({"prompt":[[]]})", "prompt"},
      {R"({"prompt":[1,"a"]})", "prompt"},
      {R"({"prompt":["a",{}]})", "prompt"},
      {R"({"prompt":[1,2.5]})", "prompt"},
      {R"({"prompt":[[1],[4294967296]]})", "prompt"},
      {R"({"prompt":["a","b"],"n":65})", "prompt"},
      {R"({"max_tokens":3})", "prompt"},
      {R"({"prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
  };
  for (const auto& [body, param] : cases) {
    const api_error e = refused(endpoint::completions, body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
    EXPECT_NE(e.message.find(param), std::string::npos) << e.message;
  }
  EXPECT_EQ(refused(endpoint::chat_completions, R"({"messages":[]})").param, "messages");
  EXPECT_EQ(refused(endpoint::chat_completions, R"({"messages":[{"role":"robot","content":"x"}]})").param, "messages");
  const std::string hi = R"({"messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(refused(endpoint::chat_completions, hi + R"("logprobs":1})").param, "logprobs");
  EXPECT_EQ(refused(endpoint::chat_completions, hi + R"("top_logprobs":2})").param, "top_logprobs");  // needs logprobs
  EXPECT_EQ(refused(endpoint::chat_completions, hi + R"("logprobs":true,"top_logprobs":21})").param, "top_logprobs");
}

TEST(OpenaiRequest, LogprobsAskTheEngineForTopLogprobs) {
  const parsed_request legacy = parsed(endpoint::completions, R"({"prompt":"x","logprobs":5})");
  EXPECT_TRUE(legacy.logprobs);
  EXPECT_EQ(legacy.request.num_top_logprobs, 5);
  const parsed_request chosen_only = parsed(endpoint::completions, R"({"prompt":"x","logprobs":0})");
  EXPECT_TRUE(chosen_only.logprobs);
  EXPECT_EQ(chosen_only.request.num_top_logprobs, 0);
  EXPECT_FALSE(parsed(endpoint::completions, R"({"prompt":"x","logprobs":null})").logprobs);
  const std::string hi = R"({"messages":[{"role":"user","content":"x"}],)";
  const parsed_request chat = parsed(endpoint::chat_completions, hi + R"("logprobs":true,"top_logprobs":20})");
  EXPECT_TRUE(chat.logprobs);
  EXPECT_EQ(chat.request.num_top_logprobs, 20);
  EXPECT_FALSE(parsed(endpoint::chat_completions, hi + R"("logprobs":false})").logprobs);
}

TEST(OpenaiRequest, ChoiceIOfNIsTheRequestSeededWithChildSeedI) {
  const parsed_request p = parsed(endpoint::completions, R"({"prompt":"Once","n":3,"best_of":3,"seed":42,"max_tokens":5})");
  EXPECT_EQ(p.n, 3);
  EXPECT_EQ(num_choices(p), 3);
  EXPECT_FALSE(needs_seed(p));
  const std::vector<serve::completion_request> requests = choice_requests(p, 0);
  ASSERT_EQ(requests.size(), 3u);
  for (int32_t i = 0; i < 3; i++) {
    const serve::completion_request& r = requests[static_cast<size_t>(i)];
    EXPECT_EQ(r.prompt, "Once");
    EXPECT_EQ(r.max_tokens, 5);
    EXPECT_TRUE(r.has_seed);
    EXPECT_EQ(r.seed, engine::child_seed(42, i)) << i;
  }
  EXPECT_EQ(requests[0].seed, 42u);  // child 0 is the seed itself: n = 1 replays choice 0
}

TEST(OpenaiRequest, SeveralChoicesWithoutASeedTakeTheGatewaysDraw) {
  const parsed_request several = parsed(endpoint::chat_completions, R"({"messages":[{"role":"user","content":"Hi"}],"n":2})");
  EXPECT_TRUE(needs_seed(several));
  const std::vector<serve::completion_request> requests = choice_requests(several, 7);
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].seed, 7u);
  EXPECT_EQ(requests[1].seed, engine::child_seed(7, 1));
  EXPECT_TRUE(requests[1].has_seed);
  // One choice without a seed: the request actor draws it (and the answer reports it).
  const parsed_request one = parsed(endpoint::completions, R"({"prompt":"x"})");
  EXPECT_FALSE(needs_seed(one));
  EXPECT_FALSE(choice_requests(one, 7)[0].has_seed);
}

TEST(OpenaiRequest, PromptsAreAStringOrListsOfStringsOrTokenIdsEachGivingNChoices) {
  const parsed_request p = parsed(endpoint::completions, R"({"prompt":["Once",[1,403],""],"n":2,"seed":9})");
  ASSERT_EQ(p.prompts.size(), 3u);
  EXPECT_EQ(p.prompts[0].text, "Once");
  EXPECT_FALSE(p.prompts[0].is_tokens);
  EXPECT_EQ(p.prompts[1].tokens, (std::vector<int32_t>{1, 403}));
  EXPECT_TRUE(p.prompts[1].is_tokens);
  EXPECT_EQ(p.prompts[2].text, "");
  const std::vector<serve::completion_request> requests = choice_requests(p, 0);
  ASSERT_EQ(requests.size(), 6u);  // choice k: prompt k / n, sample k % n
  EXPECT_EQ(requests[2].prompt_tokens, (std::vector<int32_t>{1, 403}));
  EXPECT_EQ(requests[2].prompt, "");
  EXPECT_EQ(requests[2].seed, 9u);
  EXPECT_EQ(requests[3].prompt_tokens, (std::vector<int32_t>{1, 403}));
  EXPECT_EQ(requests[3].seed, engine::child_seed(9, 1));
  EXPECT_EQ(requests[5].prompt, "");
  EXPECT_TRUE(requests[5].prompt_tokens.empty());
  const parsed_request ids = parsed(endpoint::completions, R"({"prompt":[1,403,407]})");
  ASSERT_EQ(ids.prompts.size(), 1u);  // one list of ids is one prompt
  EXPECT_EQ(ids.prompts[0].tokens, (std::vector<int32_t>{1, 403, 407}));
}

TEST(OpenaiRequest, TokenIdsOutsideTheVocabularyAre400sNamingTheParameter) {
  const tokenizer tok = *tokenizer::load(testing::bundled_tokenizer(), 512);
  auto outside = parse_request(endpoint::completions, R"({"prompt":[[1,403],[1,512]]})", model, &tok);
  ASSERT_FALSE(outside.has_value());
  EXPECT_EQ(outside.error().param, "prompt");
  EXPECT_EQ(outside.error().message, "'prompt' holds token 512, outside the vocabulary [0, 512)");
  auto negative = parse_request(endpoint::completions, R"({"prompt":[-1]})", model, &tok);
  ASSERT_FALSE(negative.has_value());
  EXPECT_EQ(negative.error().message, "'prompt' holds token -1, outside the vocabulary [0, 512)");
  EXPECT_TRUE(parse_request(endpoint::completions, R"({"prompt":[1,511]})", model, &tok).has_value());
}

TEST(OpenaiRequest, StopTokenIdsAreCheckedAndReachEveryChoice) {
  const tokenizer tok = *tokenizer::load(testing::bundled_tokenizer(), 512);
  auto p = parse_request(endpoint::completions, R"({"prompt":"x","stop_token_ids":[13,2],"n":2})", model, &tok);
  ASSERT_TRUE(p.has_value()) << p.error().message;
  for (const serve::completion_request& r : choice_requests(*p, 5))
    EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{13, 2}));
  EXPECT_TRUE(parse_request(endpoint::chat_completions, R"({"messages":[{"role":"user","content":"x"}],"stop_token_ids":[]})",
                            model, &tok).has_value());
  for (const char* bad : {R"({"prompt":"x","stop_token_ids":13})", R"({"prompt":"x","stop_token_ids":[1.5]})",
                          R"({"prompt":"x","stop_token_ids":["a"]})", R"({"prompt":"x","stop_token_ids":[512]})"}) {
    auto e = parse_request(endpoint::completions, bad, model, &tok);
    ASSERT_FALSE(e.has_value()) << bad;
    EXPECT_EQ(e.error().status, 400);
    EXPECT_EQ(e.error().param, "stop_token_ids") << bad;
    EXPECT_NE(e.error().message.find("'stop_token_ids'"), std::string::npos) << e.error().message;
  }
}

TEST(OpenaiRequest, BodyProblemsAre400s) {
  EXPECT_EQ(refused(endpoint::completions, "{\"prompt\": ").message.rfind("the request body is not valid JSON", 0), 0u);
  EXPECT_EQ(refused(endpoint::completions, "{\"prompt\":\"\xff\"}").message.rfind("the request body is not valid UTF-8", 0), 0u);
  EXPECT_EQ(refused(endpoint::completions, "[1]").message, "the request body must be a JSON object");
}

// Issue 47: an 800 KB body of 400,000 nested lists ended the server (every use of a JSON value
// recursed once per level; before this change this test died of a stack overflow in the
// parse's destructor/copy). The parse refuses the 65th level before the document exists.
TEST(OpenaiRequest, JsonNestedDeeperThanTheLimitIsRefusedWhileParsing) {
  const auto nested = [](int levels) {
    return R"({"prompt":"x","guided_json":)" + std::string(static_cast<size_t>(levels), '[') +
           std::string(static_cast<size_t>(levels), ']') + "}";
  };
  const std::string expected = "the request body nests objects and lists deeper than 64 levels";
  EXPECT_EQ(refused(endpoint::completions, nested(400000)).message, expected);
  EXPECT_EQ(refused(endpoint::completions, nested(64)).message, expected);  // the body object is level 1
  EXPECT_TRUE(parse_request(endpoint::completions, nested(63), model).has_value());  // 64 levels
  std::string objects = "{\"prompt\":\"x\",\"user\":";
  for (int i = 0; i < 100000; i++) objects += "{\"a\":";
  objects += "1" + std::string(100000, '}') + "}";
  EXPECT_EQ(refused(endpoint::completions, objects).message, expected);
  EXPECT_TRUE(parse_request(endpoint::completions, R"({"prompt":"x","user":)" + std::string(62, '[') + std::string(62, ']') + "}",
                            model).has_value());
}

// Issue 47: error messages quoted client values whole (a 1 MiB key came back in the error).
TEST(OpenaiRequest, ErrorsQuoteAtMost64BytesOfAClientsValue) {
  const std::string big(1 << 20, 'k');
  const api_error model_error = refused(endpoint::completions, R"({"model":")" + big + R"(","prompt":"x"})");
  EXPECT_EQ(model_error.message, "the model '" + std::string(64, 'k') + "...' does not exist; this server serves 'stories260K'");
  const api_error key = refused(endpoint::completions, R"({"prompt":"x","logit_bias":{")" + big + R"(":1}})");
  EXPECT_EQ(key.message, "'logit_bias' keys must be token ids, integers that fit 32 bits; got \"" + std::string(64, 'k') + "...\"");
  const api_error id = refused(endpoint::completions, R"({"prompt":[1,")" + big + R"("]})");
  EXPECT_EQ(id.message, "'prompt' must hold token ids (integers), got \"" + std::string(63, 'k') + "...");
  const api_error cls = refused(endpoint::completions, R"({"prompt":"x","cache_class":")" + big + R"("})");
  EXPECT_EQ(cls.message, "cache_class must be chat or agent, got '" + std::string(64, 'k') + "...'");
  // An unterminated megabyte string: nlohmann names the token it last read; quoted in part.
  const api_error json_error = refused(endpoint::completions, R"({"prompt":")" + big);
  EXPECT_EQ(json_error.message.size(), std::string("the request body is not valid JSON: ").size() + 264 + 3) << json_error.message;
  // A cut never splits a UTF-8 character: 21 three-byte characters are 63 bytes, the 22nd is left out.
  std::string euros, cut;
  for (int i = 0; i < 30; i++) euros += "\xE2\x82\xAC";
  for (int i = 0; i < 21; i++) cut += "\xE2\x82\xAC";
  EXPECT_EQ(echo(euros), cut + "...");
}

// Issue 47: n copies (and tokenizes) its prompt n times; their bytes together are bounded.
TEST(OpenaiRequest, TheChoicesPromptsTogetherAreBounded) {
  const std::string prompt(40000, 'a');
  EXPECT_EQ(num_choices(parsed(endpoint::completions, R"({"prompt":")" + prompt + R"(","n":100})")), 100);
  const api_error e = refused(endpoint::completions, R"({"prompt":")" + prompt + R"(","n":128})");
  EXPECT_EQ(e.param, "n");
  EXPECT_EQ(e.message, "the prompts of a request's choices carry at most 4194304 bytes together; 40000 bytes times n = 128 make 5120000");
  const std::string chat = R"({"messages":[{"role":"user","content":")" + std::string(40000, 'c') + R"("}],"n":128})";
  EXPECT_EQ(refused(endpoint::chat_completions, chat).param, "n");
}

TEST(OpenaiRequest, AnUnknownModelIsA404) {
  const api_error e = refused(endpoint::completions, R"({"model":"gpt-4","prompt":"x"})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(render_error(e),
            R"({"error":{"message":"the model 'gpt-4' does not exist; this server serves 'stories260K'",)"
            R"("type":"not_found_error","param":"model","code":"model_not_found"}})");
}

TEST(OpenaiRequest, EveryServedNameIsAcceptedAndTheIdIsReported) {
  served_model aliased = model;
  aliased.aliases = {"tiny", "stories"};
  for (const char* name : {"stories260K", "tiny", "stories"})
    EXPECT_TRUE(parse_request(endpoint::completions, std::string(R"({"model":")") + name + R"(","prompt":"x"})", aliased))
        << name;
  const auto other = parse_request(endpoint::completions, R"({"model":"stories2","prompt":"x"})", aliased);
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().status, 404);
  EXPECT_EQ(other.error().message, "the model 'stories2' does not exist; this server serves 'stories260K'");
}

TEST(OpenaiErrors, EngineErrorsMapToStatuses) {
  EXPECT_EQ(error_from({errc::invalid_argument, "top_p must be in (0, 1], got 2"}).status, 400);
  EXPECT_EQ(error_from({errc::invalid_utf8, "x"}).status, 400);
  EXPECT_EQ(error_from({errc::too_long, "x"}).status, 413);
  EXPECT_EQ(error_from({errc::overloaded, "x"}).status, 429);
  EXPECT_EQ(error_from({errc::unavailable, "x"}).status, 503);
  EXPECT_EQ(error_from({errc::internal, "x"}).status, 500);
  EXPECT_EQ(render_error(error_from({errc::too_long, "too long"})),
            R"({"error":{"message":"too long","type":"invalid_request_error","param":null,"code":"context_length_exceeded"}})");
}

TEST(OpenaiHealth, EachStateHasItsStatusAndBody) {
  EXPECT_EQ(health_status(serving_state::starting), 503);
  EXPECT_EQ(health_status(serving_state::ready), 200);
  EXPECT_EQ(health_status(serving_state::draining), 503);
  EXPECT_EQ(render_health(serving_state::starting), R"({"status":"starting"})");
  EXPECT_EQ(render_health(serving_state::ready), R"({"status":"ready"})");
  EXPECT_EQ(render_health(serving_state::draining), R"({"status":"draining"})");
  EXPECT_EQ(not_serving_error(serving_state::draining).status, 503);
  EXPECT_EQ(render_error(not_serving_error(serving_state::draining)),
            R"({"error":{"message":"the server is draining: it takes no new requests",)"
            R"("type":"service_unavailable_error","param":null,"code":"draining"}})");
  EXPECT_EQ(render_error(not_serving_error(serving_state::starting)),
            R"({"error":{"message":"the server is starting: its engines are not up yet",)"
            R"("type":"service_unavailable_error","param":null,"code":"starting"}})");
}

serve::completion_end an_end() {
  serve::completion_end end;
  end.request_id = 7;
  end.finish_reason = engine::finish_reason::length;
  end.seed = 42;
  end.num_prompt_tokens = 5;
  end.num_generated_tokens = 3;
  end.num_cached_tokens = 2;
  return end;
}

/// an_end() queued 1 ms, with a TTFT of 3 ms, inter-token gaps of 1 and 2 ms, and 6 ms end to end.
serve::completion_end an_end_with_latencies() {
  serve::completion_end end = an_end();
  end.queue_ns = 1'000'000;
  end.ttft_ns = 3'000'000;
  end.itl_ns = {1'000'000, 2'000'000};
  end.e2e_ns = 6'000'000;
  return end;
}

TEST(OpenaiResponse, ACompletionRendersByteForByte) {
  const response_context c{endpoint::completions, 7, 1700000001, &model, false};
  EXPECT_EQ(render_response(c, {{0, "Once \"upon\"", engine::finish_reason::length}}, 42, sum_usage({an_end()}, 1)),
            R"({"id":"cmpl-7","object":"text_completion","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","seed":42,"choices":[{"index":0,"text":"Once \"upon\"",)"
            R"("logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":3,)"
            R"("total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST(OpenaiResponse, ARequestIdWithTheTopBitSetRendersUnsigned) {
  const response_context c{endpoint::completions, -2, 1, &model, false};
  const std::string body = render_response(c, {{0, "x", engine::finish_reason::length}}, 42, sum_usage({an_end()}, 1));
  EXPECT_EQ(body.rfind(R"({"id":"cmpl-18446744073709551614",)", 0), 0u) << body;
}

TEST(OpenaiResponse, AChatCompletionRendersByteForByte) {
  const response_context c{endpoint::chat_completions, 7, 1700000001, &model, false};
  EXPECT_EQ(render_response(c, {{0, "Hi", engine::finish_reason::length}}, 42, sum_usage({an_end()}, 1)),
            R"({"id":"chatcmpl-7","object":"chat.completion","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","seed":42,"choices":[{"index":0,"message":{"role":"assistant",)"
            R"("content":"Hi"},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,)"
            R"("completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST(OpenaiResponse, StreamedChatChunksRenderByteForByte) {
  const response_context c{endpoint::chat_completions, 7, 1700000001, &model, true};
  const std::string head =
      R"({"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000001,"model":"stories260K","system_fingerprint":"troupe-test",)";
  EXPECT_EQ(sse_event(render_chunk(c, {0, "Hi"}, true)),
            "data: " + head +
                R"("choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":null}],"usage":null})"
                "\n\n");
  EXPECT_EQ(render_chunk(c, {0, " there"}, false),
            head + R"("choices":[{"index":0,"delta":{"content":" there"},"logprobs":null,"finish_reason":null}],"usage":null})");
  EXPECT_EQ(render_final_chunk(c, 0, engine::finish_reason::length, 42),
            head + R"("seed":42,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}],"usage":null})");
  const usage_counts usage = sum_usage({an_end()}, 1);  // asked for: in its own chunk, as OpenAI's
  EXPECT_EQ(render_final_chunk(c, 0, engine::finish_reason::length, 42, false, &usage),
            head + R"("seed":42,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}],"usage":null})");
  EXPECT_EQ(render_usage_chunk(c, 42, sum_usage({an_end()}, 1)),
            head + R"("seed":42,"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,)"
                   R"("prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST(OpenaiResponse, AChatAnswersReasoningAndToolCallsRenderAsOpenAiAndVllmDo) {
  const response_context c{endpoint::chat_completions, 7, 1700000001, &model, false};
  choice_output o{0, "", engine::finish_reason::stop};
  o.reasoning = "think";
  o.tool_calls = {{0, true, "get_weather", R"({"city":"Paris"})"}};
  EXPECT_EQ(render_response(c, {o}, 42, sum_usage({an_end()}, 1)),
            R"({"id":"chatcmpl-7","object":"chat.completion","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","seed":42,"choices":[{"index":0,"message":{"role":"assistant",)"
            R"("content":null,"reasoning_content":"think","tool_calls":[{"id":"call_7_0_0","type":"function",)"
            R"("function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"logprobs":null,)"
            R"("finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,)"
            R"("prompt_tokens_details":{"cached_tokens":2}}})");
  // Reasoning without calls: the content stays a string; a length finish stays "length".
  choice_output r{0, "", engine::finish_reason::length};
  r.reasoning = "hm";
  EXPECT_NE(render_response(c, {r}, 42, sum_usage({an_end()}, 1))
                .find(R"("message":{"role":"assistant","content":"","reasoning_content":"hm"},"logprobs":null,"finish_reason":"length")"),
            std::string::npos);

  const response_context s{endpoint::chat_completions, 7, 1700000001, &model, false};
  const std::string head =
      R"({"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000001,"model":"stories260K","system_fingerprint":"troupe-test",)";
  choice_output d{1, ""};
  d.reasoning = "so";
  EXPECT_EQ(render_chunk(s, d, false),
            head + R"("choices":[{"index":1,"delta":{"reasoning_content":"so"},"logprobs":null,"finish_reason":null}]})");
  d.reasoning.clear();
  d.tool_calls = {{2, true, "f", "{}"}};  // the choice's third call
  EXPECT_EQ(render_chunk(s, d, false),
            head + R"("choices":[{"index":1,"delta":{"tool_calls":[{"index":2,"id":"call_7_1_2","type":"function",)"
                   R"("function":{"name":"f","arguments":"{}"}}]},"logprobs":null,"finish_reason":null}]})");
  // A forced call streams its arguments in fragments: the first part opens the call (id, type,
  // name), the next ones carry more arguments under the call's index only, as OpenAI's do.
  d.tool_calls = {{0, true, "get_weather", R"({"ci)"}};
  EXPECT_EQ(render_chunk(s, d, false),
            head + R"("choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"id":"call_7_1_0","type":"function",)"
                   R"("function":{"name":"get_weather","arguments":"{\"ci"}}]},"logprobs":null,"finish_reason":null}]})");
  d.tool_calls = {{0, false, "", R"(ty":"Paris"})"}};
  EXPECT_EQ(render_chunk(s, d, false),
            head + R"("choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":\"Paris\"}"}}]},)"
                   R"("logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(render_final_chunk(s, 1, engine::finish_reason::stop, 42, true),
            head + R"("seed":42,"choices":[{"index":1,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}]})");
}

TEST(OpenaiResponse, StreamedCompletionChunksRenderByteForByte) {
  const response_context c{endpoint::completions, 3, 5, &model, false};
  EXPECT_EQ(render_chunk(c, {0, "a"}, true),
            R"({"id":"cmpl-3","object":"text_completion","created":5,"model":"stories260K","system_fingerprint":"troupe-test",)"
            R"("choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(std::string(sse_done), "data: [DONE]\n\n");
}

TEST(OpenaiResponse, SeveralChoicesRenderInIndexOrderWithSummedUsage) {
  const response_context c{endpoint::completions, 7, 1700000001, &model, false};
  serve::completion_end stopped = an_end();  // 5 prompt tokens (2 cached), 3 generated
  stopped.finish_reason = engine::finish_reason::stop;
  stopped.num_generated_tokens = 1;
  stopped.num_cached_tokens = 5;  // a later choice of the same prompt hits the prefix cache
  EXPECT_EQ(render_response(c, {{0, "a", engine::finish_reason::length}, {1, "b", engine::finish_reason::stop}}, 42,
                            sum_usage({an_end(), stopped}, 2)),
            R"({"id":"cmpl-7","object":"text_completion","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","seed":42,"choices":[{"index":0,"text":"a","logprobs":null,)"
            R"("finish_reason":"length"},{"index":1,"text":"b","logprobs":null,"finish_reason":"stop"}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":2}}})");
  EXPECT_EQ(render_final_chunk(c, 1, engine::finish_reason::stop, 42),
            R"({"id":"cmpl-7","object":"text_completion","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","seed":42,"choices":[{"index":1,"text":"","logprobs":null,"finish_reason":"stop"}]})");
}

TEST(OpenaiResponse, UsageCountsEachPromptOnceAndEveryChoicesTokens) {
  serve::completion_end a = an_end();  // 5 prompt tokens, 2 cached, 3 generated
  serve::completion_end b = an_end();
  b.num_prompt_tokens = 9;
  b.num_cached_tokens = 0;
  b.num_generated_tokens = 4;
  const usage_counts u = sum_usage({a, a, b, b}, 2);  // prompts a and b, two choices each
  EXPECT_EQ(u.prompt_tokens, 14);
  EXPECT_EQ(u.cached_tokens, 2);
  EXPECT_EQ(u.completion_tokens, 14);
}

// Token ids of tok512: " upon" = 407, " a" = 261; byte token <0xE2> = 3 + 0xE2 = 229.
const tokenizer& tok512() {
  static const tokenizer tok = *tokenizer::load(testing::bundled_tokenizer(), 512);
  return tok;
}
constexpr int32_t upon = 407, a = 261, byte_e2 = 229;

token_logprobs upon_a() {
  return {{upon, a}, {-0.5f, -0.1f}, {{{upon, -0.5f}, {a, -1.5f}}, {{a, -0.1f}, {byte_e2, -3.0f}}}, tokenizer::no_token, 0};
}

TEST(OpenaiResponse, CompletionLogprobsRenderInTheLegacyFormatByteForByte) {
  const response_context c{endpoint::completions, 7, 1700000001, &model, false, true, &tok512()};
  // A byte token alone is not UTF-8: its text reads U+FFFD; its offset counts its one byte.
  EXPECT_EQ(render_response(c, {{0, " upon a", engine::finish_reason::length, upon_a()}}, 42, sum_usage({an_end()}, 1)),
            R"({"id":"cmpl-7","object":"text_completion","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","seed":42,"choices":[{"index":0,"text":" upon a",)"
            R"("logprobs":{"tokens":[" upon"," a"],"token_logprobs":[-0.5,-0.1],"top_logprobs":[{" upon":-0.5," a":-1.5},)"
            R"({" a":-0.1,"�":-3.0}],"text_offset":[0,5]},"finish_reason":"length"}],"usage":{"prompt_tokens":5,)"
            R"("completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST(OpenaiResponse, ChatLogprobsRenderWithBytesAndStreamPartByPart) {
  const response_context c{endpoint::chat_completions, 7, 1700000001, &model, false, true, &tok512()};
  token_logprobs first = upon_a();
  first.tokens.pop_back();
  first.logprobs.pop_back();
  first.top_logprobs.pop_back();
  first.top_logprobs[0][1] = {byte_e2, -3.0f};
  EXPECT_EQ(render_chunk(c, {0, " upon", engine::finish_reason::none, first}, true),
            R"({"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","choices":[{"index":0,"delta":{"role":"assistant","content":" upon"},)"
            R"("logprobs":{"content":[{"token":" upon","logprob":-0.5,"bytes":[32,117,112,111,110],"top_logprobs":[)"
            R"({"token":" upon","logprob":-0.5,"bytes":[32,117,112,111,110]},{"token":"�","logprob":-3.0,"bytes":[226]}]}]},)"
            R"("finish_reason":null}]})");
  // The next part starts after " upon": 5 bytes in, with " upon" before it.
  const token_logprobs next = after(tok512(), first);
  EXPECT_EQ(next.prev_token, upon);
  EXPECT_EQ(next.text_offset, 5);
  EXPECT_TRUE(next.tokens.empty());
  EXPECT_EQ(render_final_chunk(c, 0, engine::finish_reason::length, 42),
            R"({"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","seed":42,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]})");
  // The stream's last choice to finish says the usage, without a chunk of no choices.
  const usage_counts usage = sum_usage({an_end()}, 1);
  EXPECT_EQ(render_final_chunk(c, 0, engine::finish_reason::length, 42, false, &usage),
            R"({"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","seed":42,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST(OpenaiResponse, ATokenAfterBosLosesItsLeadingSpace) {
  const tokenizer& tok = tok512();
  EXPECT_EQ(token_before_output({"", {}, false}, tok), tok.bos_id());  // an empty text prompt is BOS alone
  EXPECT_EQ(token_before_output({"Once", {}, false}, tok), tokenizer::no_token);
  EXPECT_EQ(token_before_output({"", {tok.bos_id(), upon}, true}, tok), upon);
  const response_context c{endpoint::completions, 7, 1700000001, &model, false, true, &tok};
  const token_logprobs after_bos{{upon}, {-0.5f}, {{}}, tok.bos_id(), 0};
  EXPECT_EQ(render_chunk(c, {0, "upon", engine::finish_reason::none, after_bos}, true),
            R"({"id":"cmpl-7","object":"text_completion","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","choices":[{"index":0,"text":"upon","logprobs":{"tokens":["upon"],)"
            R"("token_logprobs":[-0.5],"top_logprobs":[{}],"text_offset":[0]},"finish_reason":null}]})");
}

TEST(OpenaiResponse, ModelsListTheServedModelWithItsContext) {
  EXPECT_EQ(render_models(model, 512),
            R"({"object":"list","data":[{"id":"stories260K","object":"model","created":1700000000,"owned_by":"troupe",)"
            R"("root":"stories260K","max_model_len":512}]})");
  EXPECT_EQ(render_models(model, 0),  // before the engines are up
            R"({"object":"list","data":[{"id":"stories260K","object":"model","created":1700000000,"owned_by":"troupe",)"
            R"("root":"stories260K","max_model_len":null}]})");
}

TEST(OpenaiResponse, ModelsListEveryServedNameFirstTheId) {
  served_model aliased = model;
  aliased.aliases = {"tiny"};
  EXPECT_EQ(render_models(aliased, 256),
            R"({"object":"list","data":[{"id":"stories260K","object":"model","created":1700000000,"owned_by":"troupe",)"
            R"("root":"stories260K","max_model_len":256},{"id":"tiny","object":"model","created":1700000000,)"
            R"("owned_by":"troupe","root":"stories260K","max_model_len":256}]})");
}

tokenize_request tokenize_parsed(const std::string& body) {
  auto r = parse_tokenize_request(body, model);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return r ? *r : tokenize_request{};
}

std::vector<int32_t> tokens_of(const std::string& body, const served_template& chat = {}) {
  auto tokens = tokenize(tokenize_parsed(body), tok512(), chat);
  EXPECT_TRUE(tokens.has_value()) << (tokens ? "" : tokens.error().message);
  return tokens ? *tokens : std::vector<int32_t>{};
}

// A text is encoded as a completion's prompt is: BOS (tok512 asks for it), then " Once" = 403,
// " upon" = 407 and " a" = 261; add_special_tokens false leaves BOS out. vLLM's response shape,
// byte for byte (token_strs: the texts tok512 stores, its BOS's "\n<s>\n").
TEST(OpenaiTokenize, ATextIsACompletionsPromptInVllmsShape) {
  const std::vector<int32_t> upon_a = tokens_of(R"({"model":"stories260K","prompt":"Once upon a"})");
  EXPECT_EQ(upon_a, *tok512().encode("Once upon a", true, false));
  EXPECT_EQ(upon_a, (std::vector<int32_t>{1, 403, 407, 261}));
  EXPECT_EQ(tokens_of(R"({"prompt":"Once upon a","add_special_tokens":false})"), (std::vector<int32_t>{403, 407, 261}));
  EXPECT_EQ(render_tokenize(upon_a, 512, tok512(), false),
            R"({"count":4,"max_model_len":512,"tokens":[1,403,407,261],"token_strs":null})");
  EXPECT_EQ(render_tokenize(upon_a, 512, tok512(), true),
            R"({"count":4,"max_model_len":512,"tokens":[1,403,407,261],"token_strs":["\n<s>\n"," Once"," upon"," a"]})");
  EXPECT_TRUE(tokenize_parsed(R"({"prompt":"x","return_token_strs":true})").return_token_strs);
  // Special tokens are never parsed from text (contract 4): "<s>" is characters.
  EXPECT_EQ(tokens_of(R"({"prompt":"<s>"})"), *tok512().encode("<s>", true, false));
  EXPECT_GT(tokens_of(R"({"prompt":"<s>"})").size(), 2u);
}

// Messages give the chat completion's prompt: serve::chat_prompt_tokens of the same request
// parsed as a chat completion (the request actor's path), under the built-in format and a
// Jinja template; add_special_tokens (default false for a chat) puts BOS before it.
TEST(OpenaiTokenize, MessagesGiveTheChatCompletionsPromptTokens) {
  const std::string fields = R"("messages":[{"role":"system","content":"be brief"},{"role":"user","content":"<s>hi"}],)"
                             R"("add_generation_prompt":false,"chat_template_kwargs":{"tail":"end"})";
  const served_template jinja = *served_template::jinja(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
      "{% if add_generation_prompt %}assistant:{% endif %}{{ tail }}",
      jinja_options_for(tok512(), {}));
  for (const served_template& chat : {served_template{}, served_template::builtin(chat_template::plain), jinja}) {
    const parsed_request completion = parsed(endpoint::chat_completions, "{" + fields + "}");
    const auto want = serve::chat_prompt_tokens(completion.request, chat, tok512(), 0);
    ASSERT_TRUE(want.has_value()) << want.error().message;
    EXPECT_EQ(tokens_of("{" + fields + "}", chat), *want);
    std::vector<int32_t> with_bos = *want;
    with_bos.insert(with_bos.begin(), tok512().bos_id());
    EXPECT_EQ(tokens_of("{" + fields + R"(,"add_special_tokens":true})", chat), with_bos);
  }
  const std::vector<int32_t> generation = tokens_of(R"({"messages":[{"role":"user","content":"hi"}]})", jinja);
  // add_generation_prompt defaults to true; tok512 adds BOS, so the template's is dropped.
  const auto want = encode_segments(tok512(), {{"user", origin::user}, {": ", origin::template_text}, {"hi", origin::user},
                                               {"</s>", origin::template_text}, {"assistant:", origin::template_text}}, true);
  ASSERT_TRUE(want.has_value());
  EXPECT_EQ(generation, *want);
}

// /detokenize gives a text back byte for byte (UTF-8 of 2, 3 and 4 bytes, "<s>" as characters).
TEST(OpenaiTokenize, DetokenizeGivesTheTextBack) {
  const std::string text = "Once upon a time, caf\xC3\xA9 \xE2\x80\x94 \xF0\x9F\x99\x82 <s>";
  const std::vector<int32_t> tokens = tokens_of(nlohmann::json{{"prompt", text}}.dump());
  auto ids = parse_detokenize_request(nlohmann::json{{"model", "stories260K"}, {"tokens", tokens}}.dump(), model, tok512());
  ASSERT_TRUE(ids.has_value()) << ids.error().message;
  EXPECT_EQ(*ids, tokens);
  EXPECT_EQ(render_detokenize(*ids, tok512()), (nlohmann::json{{"prompt", text}}.dump()));
  EXPECT_EQ(render_detokenize(std::vector<int32_t>({1, 403, 407}), tok512()), R"({"prompt":"Once upon"})");
}

TEST(OpenaiTokenize, EachClassOfBadInputIsRefused) {
  struct bad {
    std::string body;
    int status;
    std::string message;
  };
  const std::vector<bad> tokenize_cases{
      {R"({"prompt": )", 400, "the request body is not valid JSON"},
      {"{\"prompt\": \"\xC3\x28\"}", 400, "the request body is not valid UTF-8"},
      {R"([1])", 400, "the request body must be a JSON object"},
      {R"({"model":"gpt-4","prompt":"x"})", 404, "the model 'gpt-4' does not exist; this server serves 'stories260K'"},
      {R"({})", 400, "/tokenize takes a 'prompt' (a string) or 'messages', one of them"},
      {R"({"prompt":"x","messages":[{"role":"user","content":"x"}]})", 400, "one of them"},
      {R"({"prompt":[1,2]})", 400, "'prompt' must be a string"},
      {R"({"prompt":"x","add_special_tokens":1})", 400, "'add_special_tokens' must be true or false"},
      {R"({"messages":"hi"})", 400, "'messages' must be a non-empty list"},
      {R"({"messages":[{"role":"user","content":"x"}],"continue_final_message":true})", 400,
       "'continue_final_message' is not supported yet"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template":"{{ 1 }}"})", 400, "'chat_template' is not supported yet"},
  };
  for (const bad& c : tokenize_cases) {
    auto r = parse_tokenize_request(c.body, model);
    ASSERT_FALSE(r.has_value()) << c.body;
    EXPECT_EQ(r.error().status, c.status) << c.body;
    EXPECT_NE(r.error().message.find(c.message), std::string::npos) << r.error().message;
  }
  const served_template raising = *served_template::jinja("{{ raise_exception('no') }}", jinja_options_for(tok512(), {}));
  auto raised = tokenize(tokenize_parsed(R"({"messages":[{"role":"user","content":"x"}]})"), tok512(), raising);
  ASSERT_FALSE(raised.has_value());
  EXPECT_EQ(raised.error().status, 400);
  EXPECT_NE(raised.error().message.find("raise_exception: no"), std::string::npos) << raised.error().message;
  const std::vector<bad> detokenize_cases{
      {R"({"tokens":[1,512]})", 400, "'tokens' holds token 512, outside the vocabulary [0, 512)"},
      {R"({"tokens":[-1]})", 400, "'tokens' holds token -1, outside the vocabulary [0, 512)"},
      {R"({"tokens":[4294967296]})", 400, "'tokens' must hold token ids (integers), got 4294967296"},
      {R"({"tokens":"1"})", 400, "'tokens' must be a list of token ids"},
      {R"({})", 400, "'tokens' must be a list of token ids"},
      {R"({"model":"gpt-4","tokens":[1]})", 404, "the model 'gpt-4' does not exist"},
      {"{\"tokens\": [1], \"x\": \"\xFF\"}", 400, "the request body is not valid UTF-8"},
  };
  for (const bad& c : detokenize_cases) {
    auto r = parse_detokenize_request(c.body, model, tok512());
    ASSERT_FALSE(r.has_value()) << c.body;
    EXPECT_EQ(r.error().status, c.status) << c.body;
    EXPECT_NE(r.error().message.find(c.message), std::string::npos) << r.error().message;
  }
}

using engine::pooling_mode;

embeddings_request embeddings_parsed(const std::string& body, pooling_mode fallback = pooling_mode::last) {
  auto r = parse_embeddings_request(body, model, tok512(), 64, fallback);
  EXPECT_TRUE(r.has_value()) << body << ": " << (r ? "" : r.error().message);
  return r ? *r : embeddings_request{};
}

// Every input shape gives one request each, in order: text as a completion's prompt (the request
// actor adds BOS), token ids as given; the pooling is the request's or the server's default.
TEST(OpenaiEmbeddings, EachInputIsAnEmbeddingRequestOfItsOwn) {
  const embeddings_request one = embeddings_parsed(R"({"model":"stories260K","input":"Once upon a","user":"u1"})");
  ASSERT_EQ(one.inputs.size(), 1u);
  EXPECT_EQ(one.pooling, pooling_mode::last);
  EXPECT_FALSE(one.base64);
  const std::vector<serve::completion_request> requests = embedding_requests(one);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].prompt, "Once upon a");
  EXPECT_EQ(requests[0].pooling, pooling_mode::last);
  EXPECT_EQ(requests[0].max_tokens, 0);
  EXPECT_FALSE(requests[0].stream);
  const embeddings_request many = embeddings_parsed(
      R"({"input":["a",[1,403],"b"],"pooling":"mean","encoding_format":"base64","dimensions":64})", pooling_mode::cls);
  const std::vector<serve::completion_request> three = embedding_requests(many);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0].prompt, "a");
  EXPECT_EQ(three[1].prompt_tokens, (std::vector<int32_t>{1, 403}));
  EXPECT_EQ(three[2].prompt, "b");
  for (const serve::completion_request& r : three) EXPECT_EQ(r.pooling, pooling_mode::mean);
  EXPECT_TRUE(many.base64);
  EXPECT_EQ(embeddings_parsed(R"({"input":[1,403,407]})", pooling_mode::cls).pooling, pooling_mode::cls);
  EXPECT_EQ(embedding_requests(embeddings_parsed(R"({"input":[1,403,407]})")).at(0).prompt_tokens,
            (std::vector<int32_t>{1, 403, 407}));
  EXPECT_EQ(embeddings_parsed(R"({"input":[[5],[6]],"encoding_format":"float"})").inputs.size(), 2u);
  // A list of token ids is one input, however long.
  const embeddings_request long_ids = embeddings_parsed(nlohmann::json{{"input", std::vector<int32_t>(300, 5)}}.dump());
  ASSERT_EQ(long_ids.inputs.size(), 1u);
  EXPECT_EQ(long_ids.inputs[0].tokens.size(), 300u);
}

TEST(OpenaiEmbeddings, EachClassOfBadInputIsRefused) {
  struct bad {
    std::string body;
    int status;
    std::string message;
  };
  std::string oversize = R"({"input":[)";
  for (int32_t i = 0; i <= embedding_inputs_max; i++) oversize += std::string(i > 0 ? "," : "") + "\"x\"";
  oversize += "]}";
  const std::string huge = nlohmann::json{{"input", {std::string(3 << 20, 'x'), std::string(2 << 20, 'y')}}}.dump();
  const std::vector<bad> cases{
      {R"({"input": )", 400, "the request body is not valid JSON"},
      {"{\"input\": \"\xC3\x28\"}", 400, "the request body is not valid UTF-8"},
      {R"(["x"])", 400, "the request body must be a JSON object"},
      {R"({"model":"gpt-4","input":"x"})", 404, "the model 'gpt-4' does not exist; this server serves 'stories260K'"},
      {R"({})", 400, "'input' must be a string, or a non-empty list"},
      {R"({"input":[]})", 400, "'input' must be a string, or a non-empty list"},
      {R"({"input":""})", 400, "an 'input' is empty"},
      {R"({"input":["x",[]]})", 400, "an 'input' is empty"},
      {R"({"input":7})", 400, "'input' must be a string, or a non-empty list"},
      {R"({"input":["x",{"a":1}]})", 400, "'input' must be a string, or a non-empty list"},
      {R"({"input":[1,512]})", 400, "'input' holds token 512, outside the vocabulary [0, 512)"},
      {R"({"input":[[1],[-1]]})", 400, "'input' holds token -1, outside the vocabulary [0, 512)"},
      {R"({"input":[1,"x"]})", 400, "'input' must hold token ids (integers), got \"x\""},
      {oversize, 400, "a request embeds at most 128 inputs, got 129"},
      {huge, 400, "a request's inputs carry at most 4194304 bytes together"},
      {R"({"input":"x","encoding_format":"hex"})", 400, "'encoding_format' must be \"float\" or \"base64\""},
      {R"({"input":"x","dimensions":32})", 400, "'dimensions' must be the model's 64 (embeddings are not truncated)"},
      {R"({"input":"x","dimensions":"64"})", 400, "'dimensions' must be an integer"},
      {R"({"input":"x","pooling":"max"})", 400, "'pooling' must be \"mean\", \"last\" or \"cls\""},
      {R"({"input":"x","pooling":"none"})", 400, "'pooling' must be"},
  };
  for (const bad& c : cases) {
    auto r = parse_embeddings_request(c.body, model, tok512(), 64, pooling_mode::last);
    ASSERT_FALSE(r.has_value()) << c.body.substr(0, 80);
    EXPECT_EQ(r.error().status, c.status) << c.body.substr(0, 80);
    EXPECT_NE(r.error().message.find(c.message), std::string::npos) << r.error().message;
  }
  auto named = parse_embeddings_request(R"({"input":"x","dimensions":8})", model, tok512(), 64, pooling_mode::last);
  ASSERT_FALSE(named.has_value());
  EXPECT_EQ(named.error().param, "dimensions");
}

TEST(OpenaiEmbeddings, AListRendersByteForByteInFloatsAndInBase64) {
  serve::completion_end a;
  a.num_prompt_tokens = 3;
  a.embedding = {0.1f, -0.5f, 1.0f};
  serve::completion_end b;
  b.num_prompt_tokens = 2;
  b.embedding = {0.0f, 0.6f, -0.8f};
  EXPECT_EQ(render_embeddings({a, b}, false, "stories260K"),
            R"({"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.5,1.0]},)"
            R"({"object":"embedding","index":1,"embedding":[0.0,0.6,-0.8]}],"model":"stories260K",)"
            R"("usage":{"prompt_tokens":5,"total_tokens":5}})");
  // 0.1f = 0x3dcccccd, -0.5f = 0xbf000000, 1.0f = 0x3f800000, little-endian.
  EXPECT_EQ(render_embeddings({a}, true, "m"),
            R"({"object":"list","data":[{"object":"embedding","index":0,"embedding":"zczMPQAAAL8AAIA/"}],"model":"m",)"
            R"("usage":{"prompt_tokens":3,"total_tokens":3}})");
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST(Metrics, HistogramBucketsAreUpperBoundsInclusive) {
  histogram h({0.1, 1.0});
  for (const double v : {0.05, 0.1, 0.5, 2.0}) h.observe(v);
  EXPECT_EQ(h.bucket_counts, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(h.count, 4);
  EXPECT_DOUBLE_EQ(h.sum, 2.65);
}

TEST(Metrics, ARequestMovesEachHistogramOnce) {
  request_metrics m(100);
  m.record(an_end_with_latencies(), 8);
  EXPECT_EQ(m.ttft_seconds.count, 1);
  EXPECT_EQ(m.time_per_output_token_seconds.count, 2);
  EXPECT_EQ(m.e2e_latency_seconds.count, 1);
  EXPECT_DOUBLE_EQ(m.queue_time_seconds.sum, 0.001);
  EXPECT_DOUBLE_EQ(m.prefill_time_seconds.sum, 0.002);  // first scheduled to first token
  EXPECT_DOUBLE_EQ(m.decode_time_seconds.sum, 0.003);   // first token to end
  EXPECT_DOUBLE_EQ(m.inference_time_seconds.sum, 0.005);
  EXPECT_DOUBLE_EQ(m.time_per_prefill_token_seconds.sum, 0.0004);
  EXPECT_DOUBLE_EQ(m.prompt_tokens.sum, 5);
  EXPECT_DOUBLE_EQ(m.generation_tokens.sum, 3);
  EXPECT_DOUBLE_EQ(m.params_max_tokens.sum, 8);
  EXPECT_EQ(m.num_prompt_tokens, 5);
  EXPECT_EQ(m.num_generation_tokens, 3);
  EXPECT_EQ(m.num_success_by_reason.at("length"), 1);
}

TEST(Metrics, TokenBucketsAreVllms125SeriesUpToTheContext) {
  EXPECT_EQ(request_metrics(100).prompt_tokens.upper_bounds, (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(request_metrics(99).params_max_tokens.upper_bounds, (std::vector<double>{1, 2, 5, 10, 20, 50}));
  EXPECT_TRUE(request_metrics(0).generation_tokens.upper_bounds.empty());  // the context unknown: +Inf only
}

TEST(Metrics, MaxTokensToTheContextCountsWhatTheContextLeft) {
  request_metrics m(100);
  m.record(an_end(), serve::max_tokens_to_context);
  EXPECT_DOUBLE_EQ(m.params_max_tokens.sum, 95);  // 100 - 5 prompt tokens
  request_metrics unknown(0);
  unknown.record(an_end(), serve::max_tokens_to_context);
  EXPECT_EQ(unknown.params_max_tokens.count, 0);
}

TEST(Metrics, ARequestWithoutTokensHasNoFirstTokenAndNoDecode) {
  request_metrics m(100);
  serve::completion_end end = an_end_with_latencies();
  end.num_generated_tokens = 0;
  end.itl_ns.clear();
  m.record(end, 8);
  EXPECT_EQ(m.ttft_seconds.count, 0);
  EXPECT_DOUBLE_EQ(m.prefill_time_seconds.sum, 0.005);
  EXPECT_DOUBLE_EQ(m.decode_time_seconds.sum, 0);
}

TEST(Metrics, IterationTokensAreTheEnginesStepsSummed) {
  engine::engine_report r;
  r.num_steps = 3;
  r.num_scheduled_tokens = 40;
  r.num_steps_by_tokens[0] = 1;  // 1 token
  r.num_steps_by_tokens[3] = 2;  // 17 to 32 tokens
  const std::string page = render_metrics(request_metrics(16), sum_reports({r, r}, {32, 16}), "m");
  const std::string label = "model_name=\"m\",engine=\"0\"";
  for (const std::string& line : std::vector<std::string>{
           "# TYPE vllm:iteration_tokens_total histogram\nvllm:iteration_tokens_total_bucket{" + label + ",le=\"1\"} 2\n",
           "vllm:iteration_tokens_total_bucket{" + label + ",le=\"16\"} 2\n",
           "vllm:iteration_tokens_total_bucket{" + label + ",le=\"32\"} 6\n",
           "vllm:iteration_tokens_total_bucket{" + label + ",le=\"16384\"} 6\n",
           "vllm:iteration_tokens_total_bucket{" + label + ",le=\"+Inf\"} 6\n",
           "vllm:iteration_tokens_total_sum{" + label + "} 80\nvllm:iteration_tokens_total_count{" + label + "} 6\n",
           "vllm:cache_config_info{" + label + ",block_size=\"16\",num_gpu_blocks=\"32\"} 1\n"})
    EXPECT_NE(page.find(line), std::string::npos) << line << "\nnot in\n" << page;
}

TEST(Metrics, ThePageRendersByteForByte) {
  request_metrics m(8);
  serve::completion_end failed_over = an_end_with_latencies();
  failed_over.num_failovers = 2;
  m.record(failed_over, 4);
  m.record_parallel(1, 3);
  m.num_in_flight = 7;
  engine::engine_report r;
  r.num_requests = 3;
  r.num_waiting = 1;
  r.num_blocks_in_use = 4;
  r.num_preemptions = 2;
  r.num_prefix_query_tokens = 100;
  r.num_prefix_hit_tokens = 48;
  r.num_host_hit_tokens = 32;
  r.num_disk_hit_tokens = 8;  // of the 32
  r.num_demoted_bytes = 1000;
  r.num_promoted_bytes = 600;
  r.num_handoffs_timed = 2;
  r.handoff_ns = 1500000;
  r.handoff_bytes = 4096;
  engine::engine_report r2 = r;
  r2.host_tier_expired_blocks = 5;  // the node's shared tier, as each engine reports it
  r.host_tier_expired_blocks = 3;
  r2.disk_tier_expired_blocks = 2;
  r2.num_swap_in_tokens = 16;
  r.num_swap_in_tokens = 32;
  r.num_tier_fetches = 5;
  r2.num_tier_fetches = 2;
  r2.num_tier_fetches_declined = 3;
  r.disk_tier_expired_blocks = 2;
  // Without an MoE engine's windows the page has no MoE lines; without drafts no spec_decode ones.
  const std::string plain = render_metrics(m, sum_reports({r, r2}, {16, 16}), "stories260K");
  EXPECT_EQ(plain.find("moe"), std::string::npos);
  EXPECT_EQ(plain.find("spec_decode"), std::string::npos);
  r.moe_lb_last_window = 1.25;
  r.num_moe_windows = 3;
  r.num_expert_moves = 1;
  r2.moe_lb_last_window = 2;  // the larger: the most imbalanced engine
  r2.num_moe_windows = 4;
  r.num_speculative_rows = 5;
  r.num_draft_slots = 10;
  r.num_accepted_drafts = 6;
  const std::string page = render_metrics(m, sum_reports({r, r2}, {16, 16}), "stories260K");
  const std::string v = "{model_name=\"stories260K\",engine=\"0\"}";
  const std::string vl = "{model_name=\"stories260K\",engine=\"0\",";
  const std::string label = "{model_name=\"stories260K\"}";
  for (const std::string& line : std::vector<std::string>{
           "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
           "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running" + v + " 4\n",
           "vllm:num_requests_waiting" + v + " 2\n", "vllm:kv_cache_usage_perc" + v + " 0.5\n",
           "vllm:gpu_cache_usage_perc" + v + " 0.5\n",
           "# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total" + v + " 200\n",
           "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total" + v + " 96\n",
           "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total" + v + " 4\n",
           "vllm:spec_decode_num_drafts_total" + v + " 5\n", "vllm:spec_decode_num_draft_tokens_total" + v + " 10\n",
           "vllm:spec_decode_num_accepted_tokens_total" + v + " 6\n",
           "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total" + v + " 5\n",
           "vllm:generation_tokens_total" + v + " 3\n",
           "# TYPE vllm:request_success_total counter\n"
           "vllm:request_success_total" + vl + "finished_reason=\"abort\"} 0\n"
           "vllm:request_success_total" + vl + "finished_reason=\"length\"} 1\n"
           "vllm:request_success_total" + vl + "finished_reason=\"stop\"} 0\n",
           "# TYPE vllm:request_prompt_tokens histogram\n"
           "vllm:request_prompt_tokens_bucket" + vl + "le=\"1\"} 0\n"
           "vllm:request_prompt_tokens_bucket" + vl + "le=\"2\"} 0\n"
           "vllm:request_prompt_tokens_bucket" + vl + "le=\"5\"} 1\n"
           "vllm:request_prompt_tokens_bucket" + vl + "le=\"+Inf\"} 1\n"
           "vllm:request_prompt_tokens_sum" + v + " 5\nvllm:request_prompt_tokens_count" + v + " 1\n",
           "vllm:request_generation_tokens_sum" + v + " 3\n",
           "vllm:request_max_num_generation_tokens_sum" + v + " 3\n",
           "vllm:request_params_n_bucket" + vl + "le=\"1\"} 1\n",
           "vllm:request_params_max_tokens_sum" + v + " 4\n",
           "# TYPE vllm:time_to_first_token_seconds histogram\n"
           "vllm:time_to_first_token_seconds_bucket" + vl + "le=\"0.001\"} 0\n"
           "vllm:time_to_first_token_seconds_bucket" + vl + "le=\"0.005\"} 1\n",
           "vllm:time_to_first_token_seconds_bucket" + vl + "le=\"+Inf\"} 1\n"
           "vllm:time_to_first_token_seconds_sum" + v + " 0.003\n"
           "vllm:time_to_first_token_seconds_count" + v + " 1\n",
           "vllm:time_per_output_token_seconds_bucket" + vl + "le=\"0.01\"} 2\n",
           "vllm:time_per_output_token_seconds_count" + v + " 2\n",
           "vllm:time_per_prefill_token_request_seconds_sum" + v + " 4e-04\n",
           "vllm:e2e_request_latency_seconds_sum" + v + " 0.006\n",
           "vllm:request_queue_time_seconds_bucket" + vl + "le=\"0.3\"} 1\n"
           "vllm:request_queue_time_seconds_bucket" + vl + "le=\"0.5\"} 1\n",
           "vllm:request_queue_time_seconds_sum" + v + " 0.001\n",
           "vllm:request_inference_time_seconds_sum" + v + " 0.005\n",
           "vllm:request_prefill_time_seconds_sum" + v + " 0.002\n",
           "vllm:request_decode_time_seconds_sum" + v + " 0.003\n",
           "troupe:http_requests_in_flight" + label + " 7\n",
           "troupe:num_kv_blocks_in_use" + label + " 8\n", "troupe:num_kv_blocks" + label + " 16\n",
           "# TYPE troupe:request_failovers_total counter\ntroupe:request_failovers_total" + label + " 2\n",
        std::string("# TYPE troupe:kv_tier_hit_tokens_total counter\n") +
            "troupe:kv_tier_hit_tokens_total{model_name=\"stories260K\",tier=\"pool\"} 32\n" +
            "troupe:kv_tier_hit_tokens_total{model_name=\"stories260K\",tier=\"host\"} 48\n" +
            "troupe:kv_tier_hit_tokens_total{model_name=\"stories260K\",tier=\"disk\"} 16\n",
        std::string("troupe:kv_tier_moved_bytes_total{model_name=\"stories260K\",from=\"pool\",to=\"host\"} 2000\n") +
            "troupe:kv_tier_moved_bytes_total{model_name=\"stories260K\",from=\"host\",to=\"pool\"} 1200\n",
        "# TYPE troupe:kv_swap_in_tokens_total counter\ntroupe:kv_swap_in_tokens_total" + label + " 48\n",
        std::string("# TYPE troupe:kv_tier_fetches_total counter\n") +
            "troupe:kv_tier_fetches_total{model_name=\"stories260K\",decision=\"fetch\"} 7\n" +
            "troupe:kv_tier_fetches_total{model_name=\"stories260K\",decision=\"recompute\"} 3\n",
        "# TYPE troupe:kv_handoffs_total counter\ntroupe:kv_handoffs_total" + label + " 4\n",
        "# TYPE troupe:kv_handoff_seconds_total counter\ntroupe:kv_handoff_seconds_total" + label + " 0.003\n",
        "# TYPE troupe:kv_handoff_bytes_total counter\ntroupe:kv_handoff_bytes_total" + label + " 8192\n",
        "# TYPE troupe:moe_lb gauge\ntroupe:moe_lb" + label + " 2\n",
        "# TYPE troupe:moe_windows_total counter\ntroupe:moe_windows_total" + label + " 7\n",
        "# TYPE troupe:expert_moves_total counter\ntroupe:expert_moves_total" + label + " 1\n",
        std::string("troupe:kv_tier_expired_blocks_total{model_name=\"stories260K\",tier=\"host\"} 5\n") +
            "troupe:kv_tier_expired_blocks_total{model_name=\"stories260K\",tier=\"disk\"} 2\n"})
    EXPECT_NE(page.find(line), std::string::npos) << line << "\nnot in\n" << page;
}

/// A completion's access record: 5 prompt tokens, 20 generated, a TTFT of 3.25 ms.
access_record a_completion_record() {
  return {"cmpl-7", "POST /v1/completions", 200, "127.0.0.1:5000", 5, 20, 3.25, 40.1234567, "length",
          {"a \"quoted\"\nprompt"}};
}

TEST(AccessLog, TextLinesCarryEveryFieldAndThePromptOnlyWhenAsked) {
  EXPECT_EQ(render_access_text(a_completion_record(), {false, false}),
            R"(access request_id=cmpl-7 route="POST /v1/completions" status=200 client=127.0.0.1:5000 prompt_tokens=5 )"
            R"(completion_tokens=20 ttft_ms=3.25 e2e_ms=40.123 finish_reason=length)");
  EXPECT_EQ(render_access_text(a_completion_record(), {false, true}),
            R"(access request_id=cmpl-7 route="POST /v1/completions" status=200 client=127.0.0.1:5000 prompt_tokens=5 )"
            R"(completion_tokens=20 ttft_ms=3.25 e2e_ms=40.123 finish_reason=length prompts=["a \"quoted\"\nprompt"])");
  access_record other;
  other.route = "GET /health";
  other.status = 200;
  other.client = "::1";
  EXPECT_EQ(render_access_text(other, {false, true}),
            R"(access request_id=- route="GET /health" status=200 client=::1 prompt_tokens=- completion_tokens=- )"
            R"(ttft_ms=- e2e_ms=0.0 finish_reason=- prompts=[])");
}

TEST(AccessLog, JsonRecordsAreOneObjectWithNullsForWhatARouteLacks) {
  EXPECT_EQ(render_access_json(a_completion_record(), {true, false}),
            R"({"msg":"access","request_id":"cmpl-7","route":"POST /v1/completions","status":200,)"
            R"("client":"127.0.0.1:5000","prompt_tokens":5,"completion_tokens":20,"ttft_ms":3.25,"e2e_ms":40.123,)"
            R"("finish_reason":"length"})");
  access_record bad;
  bad.route = "POST /v1/completions";
  bad.status = 400;
  bad.prompts = {std::string("\xff")};  // invalid UTF-8 from a client: replaced, never a broken line
  EXPECT_EQ(render_access_json(bad, {true, true}),
            R"({"msg":"access","request_id":null,"route":"POST /v1/completions","status":400,"client":"",)"
            R"("prompt_tokens":null,"completion_tokens":null,"ttft_ms":null,"e2e_ms":0.0,"finish_reason":null,)"
            "\"prompts\":[\"\xef\xbf\xbd\"]}");
}

TEST(AccessLog, JsonLogLinesEscapeTheMessageAndMergeARecordsFields) {
  EXPECT_EQ(render_log_json("2026-12-06T03:00:17.123Z", "info", "troupe", "a \"b\"\n"),
            R"({"time":"2026-12-06T03:00:17.123Z","level":"info","logger":"troupe","msg":"a \"b\"\n"})");
  EXPECT_EQ(render_log_json("t", "info", "access", "", R"({"msg":"access","status":200})"),
            R"({"time":"t","level":"info","logger":"access","msg":"access","status":200})");
}

}  // namespace
}  // namespace troupe::openai
