// The msgpack protocol's frames (messages/msgpack_rpc, docs/msgpack.md) byte for byte: the expected
// bytes are written by hand from the msgpack spec, not produced by msgpack-c.
#include <gtest/gtest.h>

#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <msgpack.hpp>

#include "messages/msgpack_rpc.hpp"
#include "runtime/openai/api.hpp"

namespace troupe::wire {
namespace {

/// Raw bytes, so that text next to them is never read as more hex digits.
std::string b(std::initializer_list<int> bytes) {
  std::string out;
  for (const int x : bytes) out.push_back(static_cast<char>(x));
  return out;
}

TEST(Wire, AFrameIsABigEndianLengthAndTheBody) {
  EXPECT_EQ(frame("ab"), b({0, 0, 0, 2}) + "ab");
  EXPECT_EQ(frame_length(b({0x01, 0x02, 0x03, 0x04})), 0x01020304u);
  EXPECT_EQ(frame_length(b({0xff, 0xff, 0xff, 0xff})), 0xffffffffu);
}

TEST(Wire, AnErrorFrameNamesItsCodeAndCarriesTheIdOrNil) {
  EXPECT_EQ(encode_error(7, {errc::invalid_argument, "bad"}),
            b({0, 0, 0, 50, 0x84, 0xa4}) + "type" + b({0xa5}) + "error" + b({0xa2}) + "id" + b({0x07, 0xa4}) + "code" +
                b({0xb0}) + "invalid_argument" + b({0xa7}) + "message" + b({0xa3}) + "bad");
  EXPECT_EQ(encode_error(std::nullopt, {errc::too_long, ""}),
            b({0, 0, 0, 39, 0x84, 0xa4}) + "type" + b({0xa5}) + "error" + b({0xa2}) + "id" + b({0xc0, 0xa4}) + "code" +
                b({0xa8}) + "too_long" + b({0xa7}) + "message" + b({0xa0}));
}

TEST(Wire, AChunkFrameHasItsSequenceTextTokensAndFloat32Logprobs) {
  const msg::completion_chunk chunk{9, 0, 1, "hi", {5, 300}, {-0.5f}, {{{5, -0.5f}}}};
  EXPECT_EQ(encode_chunk(3, chunk), b({0, 0, 0, 83, 0x87, 0xa4}) + "type" + b({0xa5}) + "chunk" + b({0xa2}) + "id" +
                                        b({0x03, 0xa8}) + "sequence" + b({0x01, 0xa4}) + "text" + b({0xa2}) + "hi" +
                                        b({0xa6}) + "tokens" + b({0x92, 0x05, 0xcd, 0x01, 0x2c, 0xa8}) + "logprobs" +
                                        b({0x91, 0xca, 0xbf, 0x00, 0x00, 0x00, 0xac}) + "top_logprobs" +
                                        b({0x91, 0x91, 0x92, 0x05, 0xca, 0xbf, 0x00, 0x00, 0x00}));
}

TEST(Wire, AChatChunkCarriesItsReasoningAndToolCallsOnlyWhenItHasThem) {
  msg::completion_chunk chunk;
  chunk.sequence = 1;
  chunk.reasoning_text = "hm";
  chunk.tool_calls = {{"f", "{}"}};
  const std::string frame = encode_chunk(3, chunk);
  // 9 keys (0x89): the 7 of every chunk, then "reasoning" and "tool_calls" [{name, arguments}].
  EXPECT_EQ(static_cast<unsigned char>(frame[4]), 0x89);
  const std::string tail = b({0xa9}) + "reasoning" + b({0xa2}) + "hm" + b({0xaa}) + "tool_calls" + b({0x91, 0x82, 0xa4}) +
                           "name" + b({0xa1}) + "f" + b({0xa9}) + "arguments" + b({0xa2}) + "{}";
  EXPECT_EQ(frame.substr(frame.size() - tail.size()), tail);
}

TEST(Wire, AnEndFrameHasTheFinishReasonSeedUsageAndTimings) {
  msg::completion_end end;
  end.request_id = 12;
  end.finish_reason = engine::finish_reason::stop;
  end.seed = 0xffffffffffffffffull;
  end.num_prompt_tokens = 5;
  end.num_generated_tokens = 3;
  end.queue_ns = 1000;
  end.ttft_ns = 2000;
  end.e2e_ns = 70000;
  end.itl_ns = {300, 65536};
  EXPECT_EQ(encode_end(1, end),
            b({0, 0, 0, 175, 0x87, 0xa4}) + "type" + b({0xa3}) + "end" + b({0xa2}) + "id" + b({0x01, 0xaa}) + "request_id" +
                b({0x0c, 0xad}) + "finish_reason" + b({0xa4}) + "stop" + b({0xa4}) + "seed" +
                b({0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xa5}) + "usage" + b({0x83, 0xad}) + "prompt_tokens" +
                b({0x05, 0xb1}) + "completion_tokens" + b({0x03, 0xad}) + "cached_tokens" + b({0x00, 0xa7}) + "timings" +
                b({0x84, 0xa8}) + "queue_ns" + b({0xcd, 0x03, 0xe8, 0xa7}) + "ttft_ns" + b({0xcd, 0x07, 0xd0, 0xa6}) +
                "e2e_ns" + b({0xce, 0x00, 0x01, 0x11, 0x70, 0xa6}) + "itl_ns" +
                b({0x92, 0xcd, 0x01, 0x2c, 0xce, 0x00, 0x01, 0x00, 0x00}));
}

TEST(Wire, AHandWrittenRequestDecodesWithDefaultsForWhatItLeavesOut) {
  // {"id": 5, "prompt": "hi", "temperature": 0, "seed": 42, "stop": "."}
  const std::string body = b({0x85, 0xa2}) + "id" + b({0x05, 0xa6}) + "prompt" + b({0xa2}) + "hi" + b({0xab}) +
                           "temperature" + b({0x00, 0xa4}) + "seed" + b({0x2a, 0xa4}) + "stop" + b({0xa1}) + ".";
  auto frame = decode_frame(body);
  ASSERT_TRUE(frame.has_value()) << frame.error().problem.message;
  const request* r = std::get_if<request>(&*frame);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->id, 5u);
  EXPECT_EQ(r->completion.prompt, "hi");
  EXPECT_EQ(r->completion.temperature, 0.0f);
  EXPECT_TRUE(r->completion.has_seed);
  EXPECT_EQ(r->completion.seed, 42u);
  EXPECT_EQ(r->completion.stop, std::vector<std::string>{"."});
  EXPECT_EQ(r->completion.max_tokens, 16);  // msg::completion_request's defaults
  EXPECT_EQ(r->completion.top_p, 1.0f);
  EXPECT_TRUE(r->completion.stream);
}

TEST(Wire, AnEncodedRequestDecodesToEveryField) {
  msg::completion_request c;
  c.prompt = "Once";
  c.prompt_tokens = {1, 2};
  c.max_tokens = 40;
  c.temperature = 0.5f;
  c.top_p = 0.25f;
  c.top_k = 7;
  c.min_p = 0.125f;
  c.presence_penalty = -0.5f;
  c.frequency_penalty = 1.75f;
  c.repetition_penalty = 1.25f;
  c.logit_bias = {{300, -100.0f}, {5, 2.5f}};
  c.has_seed = true;
  c.seed = 0xfedcba9876543210ull;
  c.stop = {"a", "b"};
  c.stop_token_ids = {2, 13};
  c.ignore_eos = true;
  c.priority = -3;
  c.cache_class = "agent";
  c.num_top_logprobs = 2;
  c.stream = false;
  c.messages = {{"system", "be brief"},
                {"user", "hi"},
                {"assistant", "", R"({"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"x":1}}}]})"},
                {"tool", "18 C", R"({"tool_call_id":"c1","name":"f"})"}};
  c.grammar_kind = "gbnf";
  c.grammar = "root ::= [a-z]+";
  c.grammar_trigger_token_ids = {42};
  c.grammar_trigger_strings = {"<call>"};
  c.chat_template_kwargs = R"({"enable_thinking":false})";
  c.tools = R"([{"type":"function","function":{"name":"f"}}])";
  c.add_generation_prompt = false;
  const std::string f = encode_request(99, c);
  ASSERT_EQ(frame_length(f.substr(0, 4)), f.size() - 4);
  auto frame = decode_frame(std::string_view(f).substr(4));
  ASSERT_TRUE(frame.has_value()) << frame.error().problem.message;
  const request* r = std::get_if<request>(&*frame);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->id, 99u);
  const msg::completion_request& d = r->completion;
  EXPECT_EQ(std::tie(d.prompt, d.prompt_tokens, d.max_tokens, d.temperature, d.top_p, d.top_k, d.min_p, d.has_seed, d.seed,
                     d.stop, d.stop_token_ids, d.ignore_eos, d.priority, d.num_top_logprobs, d.stream),
            std::tie(c.prompt, c.prompt_tokens, c.max_tokens, c.temperature, c.top_p, c.top_k, c.min_p, c.has_seed, c.seed,
                     c.stop, c.stop_token_ids, c.ignore_eos, c.priority, c.num_top_logprobs, c.stream));
  EXPECT_EQ(std::tie(d.presence_penalty, d.frequency_penalty, d.repetition_penalty, d.logit_bias, d.cache_class),
            std::tie(c.presence_penalty, c.frequency_penalty, c.repetition_penalty, c.logit_bias, c.cache_class));
  EXPECT_EQ(std::tie(d.grammar_kind, d.grammar, d.grammar_trigger_token_ids, d.grammar_trigger_strings),
            std::tie(c.grammar_kind, c.grammar, c.grammar_trigger_token_ids, c.grammar_trigger_strings));
  EXPECT_EQ(std::tie(d.chat_template_kwargs, d.tools, d.add_generation_prompt),
            std::tie(c.chat_template_kwargs, c.tools, c.add_generation_prompt));
  ASSERT_EQ(d.messages.size(), 4u);
  for (size_t i = 0; i < 4; i++)
    EXPECT_EQ(std::tie(d.messages[i].role, d.messages[i].content, d.messages[i].extras),
              std::tie(c.messages[i].role, c.messages[i].content, c.messages[i].extras));
}

/// A request frame's body packed from `fields` (string values, keys in order) after "id": 5.
std::string packed_request(const std::vector<std::pair<std::string, msgpack::object>>& fields) {
  msgpack::sbuffer body;
  msgpack::packer<msgpack::sbuffer> p(body);
  p.pack_map(static_cast<uint32_t>(fields.size() + 1));
  p.pack(std::string("id"));
  p.pack(5);
  for (const auto& [key, value] : fields) {
    p.pack(key);
    p.pack(value);
  }
  return std::string(body.data(), body.size());
}

TEST(Wire, AChatsToolCallsToolResultsAndToolChoiceReadAsTheHttpGatewayReadsThem) {
  msgpack::zone z;
  const std::string tools =
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";
  const std::map<std::string, std::string> assistant{
      {"role", "assistant"},
      {"tool_calls", R"([{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}])"}};
  const std::map<std::string, std::string> result{{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "18 C"}};
  const std::vector<std::map<std::string, std::string>> messages{{{"role", "user"}, {"content", "Weather?"}}, assistant, result};
  const std::string body = packed_request({{"messages", msgpack::object(messages, z)},
                                           {"tools", msgpack::object(tools, z)},
                                           {"tool_choice", msgpack::object("required", z)},
                                           {"parallel_tool_calls", msgpack::object(false, z)}});
  auto frame = decode_frame(body);
  ASSERT_TRUE(frame.has_value()) << frame.error().problem.message;
  const request& r = std::get<request>(*frame);
  ASSERT_EQ(r.completion.messages.size(), 3u);
  EXPECT_EQ(r.completion.messages[1].extras,
            R"({"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]})");
  EXPECT_EQ(r.completion.messages[2].extras, R"({"tool_call_id":"c1"})");
  EXPECT_EQ(r.tool_mode, (openai::tool_choice{openai::tool_choice::mode::required, "", false}));
  // The same grammar as the HTTP gateway's for the same request.
  const std::string http = R"({"messages":[{"role":"user","content":"Weather?"}],"tools":)" + tools +
                           R"(,"tool_choice":"required","parallel_tool_calls":false})";
  auto p = openai::parse_request(openai::endpoint::chat_completions, http, {"m", "", 0});
  ASSERT_TRUE(p);
  EXPECT_EQ(std::tie(r.completion.grammar_kind, r.completion.grammar, r.completion.tools),
            std::tie(p->request.grammar_kind, p->request.grammar, p->request.tools));
  // A named function, as the JSON text of OpenAI's object.
  auto named = decode_frame(packed_request(
      {{"messages", msgpack::object(messages, z)},
       {"tools", msgpack::object(tools, z)},
       {"tool_choice", msgpack::object(std::string(R"({"type":"function","function":{"name":"get_weather"}})"), z)}}));
  ASSERT_TRUE(named.has_value()) << named.error().problem.message;
  EXPECT_EQ(std::get<request>(*named).tool_mode, (openai::tool_choice{openai::tool_choice::mode::named, "get_weather", true}));
  EXPECT_EQ(std::get<request>(*named).completion.grammar, R"({"type":"object","properties":{"city":{"type":"string"}}})");
  // "none": the template gets no tools.
  auto none = decode_frame(packed_request({{"tools", msgpack::object(tools, z)}, {"tool_choice", msgpack::object("none", z)}}));
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(std::get<request>(*none).completion.tools, "");
}

TEST(Wire, BadToolCallingFieldsAreErrorsAsTheHttpGatewaysAre) {
  msgpack::zone z;
  const std::string tools = R"([{"type":"function","function":{"name":"f"}}])";
  const auto message = [&](std::map<std::string, std::string> m) {
    return msgpack::object(std::vector<std::map<std::string, std::string>>{std::move(m)}, z);
  };
  const std::vector<std::pair<std::string, std::string>> cases{
      {packed_request({{"tools", msgpack::object(tools, z)},
                       {"tool_choice", msgpack::object(std::string(R"({"type":"function","function":{"name":"g"}})"), z)}}),
       "'tool_choice' names the function 'g', which is not among the request's tools (f)"},
      {packed_request({{"tool_choice", msgpack::object("required", z)}}), R"('tool_choice' "required" needs 'tools')"},
      {packed_request({{"tool_choice", msgpack::object("any", z)}}), "'tool_choice' must be \"auto\""},
      {packed_request({{"tool_choice", msgpack::object("{", z)}}), "'tool_choice' is not valid JSON"},
      {packed_request({{"tools", msgpack::object("[1]", z)}}), "'tools' must be a list of"},
      {packed_request({{"tools", msgpack::object(tools, z)},
                       {"tool_choice", msgpack::object("required", z)},
                       {"grammar_kind", msgpack::object("regex", z)},
                       {"grammar", msgpack::object("a", z)}}),
       "'tool_choice' \"required\" or naming a function constrains the output itself"},
      {packed_request({{"messages", message({{"role", "tool"}, {"content", "x"}})}}),
       "messages: a 'tool' message needs the string 'tool_call_id' of the call it answers"},
      {packed_request({{"messages", message({{"role", "assistant"}, {"tool_calls", "{"}})}}),
       "messages: a message's 'tool_calls' is not valid JSON"},
      {packed_request({{"messages", message({{"role", "assistant"}, {"tool_calls", "{}"}})}}),
       "messages: an assistant's 'tool_calls' must be a list"},
      {packed_request({{"messages", message({{"role", "robot"}})}}),
       "messages: each message needs a 'role' of system, developer, user, assistant or tool"},
      {packed_request({{"parallel_tool_calls", msgpack::object("no", z)}}), "'parallel_tool_calls' must be a boolean"},
  };
  for (const auto& [body, message_start] : cases) {
    auto r = decode_frame(body);
    ASSERT_FALSE(r.has_value()) << message_start;
    EXPECT_EQ(r.error().id, 5u);
    EXPECT_EQ(r.error().problem.code, errc::invalid_argument);
    EXPECT_EQ(r.error().problem.message.rfind(message_start, 0), 0u) << r.error().problem.message;
  }
}

TEST(Wire, AForcedAnswersChunksCarryItsCallsWholeAndACutCallComesBeforeTheEnd) {
  openai::forced_call_reader reader({openai::tool_choice::mode::required, "", true});
  msg::completion_chunk first;
  first.text = R"([{"name":"f","parameters":{}}, {"name":"g","param)";
  first.tool_calls = {{"own", "{}"}};  // the model's own come after
  msg::completion_chunk expected = first;
  expected.text = "";
  expected.tool_calls = {{"f", "{}"}, {"own", "{}"}};
  EXPECT_EQ(encode_forced_chunk(3, first, reader), encode_chunk(3, expected));
  msg::completion_chunk second;
  second.sequence = 1;
  second.text = R"(eters":{"x":[1)";
  msg::completion_chunk nothing = second;
  nothing.text = "";
  EXPECT_EQ(encode_forced_chunk(3, second, reader), encode_chunk(3, nothing));
  msg::completion_end end;
  end.num_chunks = 2;
  end.finish_reason = engine::finish_reason::length;
  msg::completion_chunk cut;
  cut.sequence = 2;
  cut.tool_calls = {{"g", R"({"x":[1)"}};
  EXPECT_EQ(encode_cut_call(3, end, reader), encode_chunk(3, cut));
  EXPECT_EQ(encode_cut_call(3, end, reader), "");  // nothing open any more
}

TEST(Wire, ALogitBiasMapTakesIntegerOrDecimalStringKeys) {
  // {"id": 5, "logit_bias": {"13": -100, 7: 1.5}} (a JavaScript object's keys are strings)
  const std::string body = b({0x82, 0xa2}) + "id" + b({0x05, 0xaa}) + "logit_bias" + b({0x82, 0xa2}) + "13" +
                           b({0xd0, 0x9c, 0x07, 0xca, 0x3f, 0xc0, 0x00, 0x00});
  auto frame = decode_frame(body);
  ASSERT_TRUE(frame.has_value()) << frame.error().problem.message;
  EXPECT_EQ(std::get<request>(*frame).completion.logit_bias,
            (std::vector<sampling::token_bias>{{13, -100.0f}, {7, 1.5f}}));
}

TEST(Wire, ACancelFrameIsItsBytesAndDecodesToItsId) {
  // {"type": "cancel", "id": 7}
  const std::string f = encode_cancel(7);
  EXPECT_EQ(f, b({0, 0, 0, 17, 0x82, 0xa4}) + "type" + b({0xa6}) + "cancel" + b({0xa2}) + "id" + b({0x07}));
  auto frame = decode_frame(std::string_view(f).substr(4));
  ASSERT_TRUE(frame.has_value()) << frame.error().problem.message;
  const cancel* c = std::get_if<cancel>(&*frame);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->id, 7u);
  // The keys in the other order, and the largest id.
  auto reversed = decode_frame(b({0x82, 0xa2}) + "id" + b({0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xa4}) +
                               "type" + b({0xa6}) + "cancel");
  ASSERT_TRUE(reversed.has_value()) << reversed.error().problem.message;
  EXPECT_EQ(std::get<cancel>(*reversed).id, 0xffffffffffffffffull);
}

struct bad_request {
  std::string body;
  std::optional<uint64_t> id;
  errc code;
  std::string message;
};

TEST(Wire, EachBadRequestIsAnErrorNamingTheProblem) {
  const std::string id5 = b({0xa2}) + "id" + b({0x05});
  const std::vector<bad_request> cases{
      {b({0x82}) + id5 + b({0xab}) + "tempurature" + b({0x00}), 5, errc::invalid_argument, "unknown key 'tempurature'"},
      {b({0x82}) + id5 + b({0xab}) + "temperature" + b({0xa3}) + "hot", 5, errc::invalid_argument, "'temperature' must be a number"},
      {b({0x82}) + id5 + b({0xaa}) + "max_tokens" + b({0xce, 0x80, 0, 0, 0}), 5, errc::invalid_argument,
       "'max_tokens' must be an integer in the range of a 32-bit int"},
      {b({0x82}) + id5 + b({0xa4}) + "stop" + b({0x91, 0x01}), 5, errc::invalid_argument, "'stop' must be a string or a list of strings"},
      {b({0x82}) + id5 + b({0xab}) + "cache_class" + b({0xa5}) + "batch", 5, errc::invalid_argument,
       "cache_class must be chat or agent, got 'batch'"},
      {b({0x82}) + id5 + b({0xab}) + "cache_class" + b({0x01}), 5, errc::invalid_argument, "'cache_class' must be a string"},
      {b({0x82}) + id5 + b({0xb4}) + "chat_template_kwargs" + b({0x80}), 5, errc::invalid_argument,
       "'chat_template_kwargs' must be a string"},  // a JSON text, not a map
      {b({0x82}) + id5 + b({0xb5}) + "add_generation_prompt" + b({0x01}), 5, errc::invalid_argument,
       "'add_generation_prompt' must be a boolean"},
      // {"messages": [{"content": "x"}]}: no role
      {b({0x82}) + id5 + b({0xa8}) + "messages" + b({0x91, 0x81, 0xa7}) + "content" + b({0xa1}) + "x", 5,
       errc::invalid_argument, "messages: each message needs a 'role' of system, developer, user, assistant or tool"},
      {b({0x82}) + id5 + b({0xa8}) + "messages" + b({0x91, 0x81, 0xa7}) + "content" + b({0x01}), 5,
       errc::invalid_argument, "'messages' must be an array of maps of strings: role, content, tool_calls (JSON text), tool_call_id, name"},
      {b({0x82}) + id5 + b({0xb0}) + "presence_penalty" + b({0xc3}), 5, errc::invalid_argument,
       "'presence_penalty' must be a number"},
      {b({0x82}) + id5 + b({0xaa}) + "logit_bias" + b({0x91, 0x01}), 5, errc::invalid_argument,
       "'logit_bias' must be a map of token ids (int32 or decimal strings) to numbers"},
      {b({0x82}) + id5 + b({0xaa}) + "logit_bias" + b({0x81, 0xa1}) + "x" + b({0x01}), 5, errc::invalid_argument,
       "'logit_bias' must be a map of token ids (int32 or decimal strings) to numbers"},
      {b({0x82}) + id5 + b({0xaa}) + "logit_bias" + b({0x81, 0x01, 0xa1}) + "x", 5, errc::invalid_argument,
       "'logit_bias' must be a number"},
      {b({0x82}) + id5 + b({0xa6}) + "prompt" + b({0xa2, 0xc3, 0x28}), 5, errc::invalid_utf8,
       "'prompt' is not valid UTF-8: "},
      {b({0x82}) + id5 + b({0x01, 0x02}), 5, errc::invalid_argument, "a request key is not a string"},
      {b({0x81, 0xa6}) + "prompt" + b({0xa1}) + "x", std::nullopt, errc::invalid_argument, "the request has no 'id'"},
      {b({0x81, 0xa2}) + "id" + b({0xff}), std::nullopt, errc::invalid_argument, "'id' must be an integer from 0 to 2^64 - 1"},
      {b({0x90}), std::nullopt, errc::invalid_argument, "the request is not a map"},
      {b({0x82}) + id5 + b({0xa4}) + "type" + b({0xa4}) + "stop", 5, errc::invalid_argument,
       "'type' must be \"cancel\" or \"auth\" (a request frame has no 'type')"},
      {b({0x82}) + id5 + b({0xa4}) + "type" + b({0x01}), 5, errc::invalid_argument,
       "'type' must be \"cancel\" or \"auth\" (a request frame has no 'type')"},
      {b({0x83}) + id5 + b({0xa4}) + "type" + b({0xa6}) + "cancel" + b({0xa6}) + "prompt" + b({0xa1}) + "x", 5,
       errc::invalid_argument, "a cancel frame has the keys 'type' and 'id' only"},
      {b({0x81, 0xa4}) + "type" + b({0xa6}) + "cancel", std::nullopt, errc::invalid_argument, "the request has no 'id'"},
      {b({0x80, 0x80}), std::nullopt, errc::invalid_argument, "the frame holds more than one msgpack value"},
      {b({0xa5}) + "ab", std::nullopt, errc::invalid_argument, "the frame is not one msgpack value: "},
      {"", std::nullopt, errc::invalid_argument, "the frame is not one msgpack value: "},
      // An array header announcing 2^32 - 1 elements in a 5-byte frame: refused, nothing allocated.
      {b({0xdd, 0xff, 0xff, 0xff, 0xff}), std::nullopt, errc::invalid_argument, "the frame is not one msgpack value: "},
  };
  for (const bad_request& c : cases) {
    auto r = decode_frame(c.body);
    ASSERT_FALSE(r.has_value()) << c.message;
    EXPECT_EQ(r.error().id, c.id) << c.message;
    EXPECT_EQ(r.error().problem.code, c.code) << c.message;
    EXPECT_EQ(r.error().problem.message.rfind(c.message, 0), 0u) << r.error().problem.message;
  }
}

// An error frame echoes at most 64 bytes of a client's key or value (cut at a character's
// start), not a whole 1 MiB key. Before: the message held the 1 MiB key ("unknown key 'xxx…'",
// 1048590 bytes).
TEST(Wire, AnErrorEchoesAtMost64BytesOfTheClientsKeyOrValue) {
  const std::string id5 = b({0xa2}) + "id" + b({0x05});
  const std::string key(1 << 20, 'k');
  auto r = decode_frame(b({0x82}) + id5 + b({0xdb, 0x00, 0x10, 0x00, 0x00}) + key + b({0x00}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().problem.message, "unknown key '" + std::string(64, 'k') + "...'");
  // 63 ASCII bytes and a 2-byte character: the cut falls before the character.
  const std::string value = std::string(63, 'v') + "\xc3\xa9" + std::string(100, 'v');
  r = decode_frame(b({0x82}) + id5 + b({0xab}) + "cache_class" + b({0xd9, static_cast<int>(value.size())}) + value);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().problem.message, "cache_class must be chat or agent, got '" + std::string(63, 'v') + "...'");
}

}  // namespace
}  // namespace troupe::wire
