// serve::request_policy without an actor system: each call's whole effect list, exactly. Prompt
// refusals, streamed and non-streamed runs (chunk numbering, text, end fields and timings from
// the given now_ns), stop strings, batch expansion with ages, untrusted values from engines,
// cancel, lost engines and a lost client. Tokens are those of the bundled tok512 tokenizer:
// "Once" = 403, " upon" = 407, " a" = 261, " time" = 378 (engine_api_test checks them).
#include "runtime/serve/request_policy.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <limits>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/kv/chain_hash.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "runtime/tokenizer/served_template.hpp"
#include "tests/support/bpe_vocab_file.hpp"
#include "tests/support/engine_harness.hpp"
#include "tests/support/effects_text.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/kv_blocks.hpp"

namespace troupe::serve {

namespace {

std::ostream& operator<<(std::ostream& o, const std::vector<int64_t>& v) {
  for (size_t i = 0; i < v.size(); i++) o << (i ? "," : "") << v[i];
  return o;
}

/// Effects in failure messages, one line each.
std::string describe(const effects& fx) {
  struct printer {
    std::ostream& o;
    void operator()(const ask_placement& a) {
      o << "ask_placement(r" << a.request_id << " prompt " << a.num_prompt_tokens << " max " << a.max_tokens;
      for (uint64_t hash : a.prefix_hashes) o << " " << hash;
      if (a.again) o << (a.lost == engine_role::decode ? " lost decode" : " lost prefill");
      o << ")";
    }
    void operator()(const submit& s) {
      o << "submit(r" << s.request.id << " prompt " << s.request.prompt.size() << " seed " << s.request.seed
        << " batch " << s.request.batch_tokens << (s.to_prefill ? " to prefill" : " to decode") << ")";
    }
    void operator()(const send_chunk& c) {
      o << "chunk(r" << c.chunk.request_id << " s" << c.chunk.stream << " #" << c.chunk.sequence << " '"
        << c.chunk.text << "' " << c.chunk.tokens.size() << " tokens";
      for (const auto& top : c.chunk.top_logprobs) o << " " << top.size() << " tops";
      o << ")";
    }
    void operator()(const send_end& e) {
      const completion_end& x = e.end;
      o << "end(r" << x.request_id << " s" << x.stream << " " << engine::to_string(x.finish_reason) << " seed "
        << x.seed << " prompt " << x.num_prompt_tokens << " gen " << x.num_generated_tokens << " queue "
        << x.queue_ns << " ttft " << x.ttft_ns << " e2e " << x.e2e_ns << " itl " << x.itl_ns << " cached "
        << x.num_cached_tokens << " preempted " << x.num_preemptions << " recomputed " << x.num_recomputed_tokens
        << " chunks " << x.num_chunks << ")";
    }
    void operator()(const send_error& e) {
      o << "error(r" << e.error.request_id << " s" << e.error.stream << " " << to_string(e.error.code) << " '"
        << e.error.message << "' chunks " << e.error.num_chunks << ")";
    }
    void operator()(const release_engines&) { o << "release_engines"; }
    void operator()(const stop&) { o << "stop"; }
  };
  return testing::effects_text<printer>(fx);
}

/// The whole effect list, compared with operator==; the policy's invariants hold after the call.
#define EXPECT_EFFECTS(host, call, ...)                                                           \
  do {                                                                                            \
    const effects got_ = (host).call;                                                             \
    const effects want_{__VA_ARGS__};                                                             \
    EXPECT_TRUE(got_ == want_) << "got:\n" << describe(got_) << "want:\n" << describe(want_);     \
    (host).check_invariants();                                                                    \
  } while (false)

#define EXPECT_NO_EFFECTS(host, call) EXPECT_EFFECTS(host, call, )

constexpr int64_t id = 5;
constexpr uint64_t stream_id = 9;
constexpr uint64_t drawn_seed = 77;
constexpr int32_t once = 403, upon = 407, a = 261, time_ = 378;

std::shared_ptr<const tokenizer> tok() {
  static const auto t = std::make_shared<const tokenizer>(testing::model_and_tokenizer().tok);
  return t;
}

request_policy_options options(bool stream, std::vector<std::string> stop = {}) {
  request_policy_options o;
  o.id = id;
  o.stream = stream_id;
  o.tok = tok();
  o.params.prompt = "Once";
  o.params.max_tokens = 3;
  o.params.stream = stream;
  o.params.stop = std::move(stop);
  o.drawn_seed = drawn_seed;
  return o;
}

/// The engine request `options(stream, stop)` becomes.
engine::request request_of(bool stream, std::vector<std::string> stop = {}) {
  engine::request r;
  r.id = id;
  r.prompt = {tokenizer::bos, once};
  r.max_tokens = 3;
  r.seed = drawn_seed;
  r.batch_tokens = !stream && stop.empty();
  r.stop = std::move(stop);
  return r;
}

placed_engines decode_only() { return {"", false, true, "", "engine 'decode0' on node 'n0'"}; }
placed_engines prefill_and_decode() {
  return {"", true, true, "engine 'prefill0' on node 'n0'", "engine 'decode0' on node 'n1'"};
}

engine::sample_event token(int32_t t, float logprob, engine::finish_reason finish = engine::finish_reason::none) {
  return {id, 0, {t, logprob, {}}, finish, 0, 0, 0};
}

/// A chunk whose tokens came with no top logprobs (none asked for).
completion_chunk chunk(int32_t sequence, std::string text, std::vector<int32_t> tokens, std::vector<float> logprobs) {
  const size_t num_tokens = tokens.size();
  return {id, stream_id, sequence, std::move(text), std::move(tokens), std::move(logprobs),
          std::vector<std::vector<sampling::token_logprob>>(num_tokens)};
}

completion_error error(errc code, std::string message, int32_t num_chunks) {
  return {id, stream_id, code, std::move(message), num_chunks};
}

/// A host started at t = 1000 and placed on `where`.
request_policy running(request_policy_options o, const placed_engines& where = decode_only()) {
  request_policy h(std::move(o));
  (void)h.start(1000);
  (void)h.placed(where);
  return h;
}

}  // namespace

TEST(RequestPolicyPrompt, TokenIdsTakeNoTextPromptAndWithoutATokenizerNoStopStrings) {
  request_policy_options text = options(true);
  text.params.prompt_tokens = {tokenizer::bos, once};
  request_policy with_text(text);
  EXPECT_EFFECTS(with_text, start(1000),
                 send_error{error(errc::invalid_argument, "a request with prompt_tokens takes no text prompt", 0)}, stop{});
  EXPECT_TRUE(with_text.done());

  request_policy_options stops = options(true, {"x"});
  stops.params.prompt.clear();
  stops.params.prompt_tokens = {tokenizer::bos, once};
  stops.tok = nullptr;
  request_policy with_stop(stops);
  EXPECT_EFFECTS(with_stop, start(1000),
                 send_error{error(errc::invalid_argument,
                                  "without a tokenizer a request takes prompt_tokens and no stop strings", 0)},
                 stop{});
}

TEST(RequestPolicyPrompt, TokenIdsOutsideTheVocabularyAreRefusedWhenItIsKnown) {
  request_policy_options o = options(true);
  o.params.prompt.clear();
  o.params.prompt_tokens = {tokenizer::bos, 512};
  request_policy h(o);
  EXPECT_EFFECTS(h, start(1000),
                 send_error{error(errc::invalid_argument, "prompt_tokens: token id 512 at position 1 is outside [0, 512)", 0)},
                 stop{});
}

TEST(RequestPolicyPrompt, ATextLongerThanTheContextCanHoldIsRefusedBeforeTokenizing) {
  request_policy_options o = options(true);
  o.context_tokens = 2;
  const int64_t bytes_max = 2 * tok()->max_token_length();
  o.params.prompt = std::string(static_cast<size_t>(bytes_max), 'a');
  request_policy fits(o);
  // 14 bytes: BOS, " a" and 13 times "a" (tok512 has no longer run of a's): the engine checks tokens.
  EXPECT_EFFECTS(fits, start(1000), ask_placement{id, 15, 3, {}});

  o.params.prompt += "a";
  request_policy too_long(o);
  EXPECT_EFFECTS(too_long, start(1000),
                 send_error{error(errc::too_long,
                                  "the prompt is 15 bytes; a 2-token context holds at most 14 (7 bytes per token at "
                                  "most)",
                                  0)},
                 stop{});
}

TEST(RequestPolicyPrompt, PenaltiesAndBiasesReachTheEngineRequestAndAreCheckedFirst) {
  request_policy_options o = options(true);
  o.params.presence_penalty = 0.5f;
  o.params.frequency_penalty = 0.25f;
  o.params.repetition_penalty = 1.5f;
  o.params.logit_bias = {{7, -100.0f}};
  request_policy h(o);
  (void)h.start(1000);
  engine::request want = request_of(true);
  want.sampling.presence_penalty = 0.5f;
  want.sampling.frequency_penalty = 0.25f;
  want.sampling.repetition_penalty = 1.5f;
  want.sampling.logit_bias = {{7, -100.0f}};
  EXPECT_EFFECTS(h, placed(decode_only()), submit{want, false, {}});

  o.params.logit_bias = {{512, 1.0f}};  // tok512: ids 0..511, checked before the request leaves
  request_policy outside(o);
  EXPECT_EFFECTS(outside, start(1000),
                 send_error{error(errc::invalid_argument, "logit_bias names token 512, outside the vocabulary [0, 512)", 0)},
                 stop{});
  o.params.logit_bias.clear();
  o.params.presence_penalty = std::numeric_limits<float>::infinity();
  request_policy infinite(o);
  EXPECT_EFFECTS(infinite, start(1000),
                 send_error{error(errc::invalid_argument, "presence_penalty must be in [-2, 2], got inf", 0)}, stop{});
}

TEST(RequestPolicyPrompt, ThePlacementCarriesThePromptsChainHashesWhenTheBalancerKeepsPrefixes) {
  request_policy_options o = options(true);
  o.params.prompt.clear();
  o.params.prompt_tokens = {tokenizer::bos, 10, 11, 12, 13, 14, 15, 16, 17};  // two full blocks of 4, one token
  o.prefix_block_size = 4;
  request_policy h(o);
  const int32_t* t = o.params.prompt_tokens.data();
  const uint64_t first = kv::chain_hash(kv::root_hash_seed, t, 4);
  EXPECT_EFFECTS(h, start(1000), ask_placement{id, 9, 3, {first, kv::chain_hash(first, t + 4, 4)}});
}

TEST(RequestPolicyPrompt, AChatIsRenderedByTheServedTemplateAndItsMessagesCannotSpellControlTokens) {
  request_policy_options o = options(true);
  o.params.prompt.clear();
  o.params.messages = {{"system", "Once"}, {"user", "upon a time </s>"}};
  request_policy bare(o);  // the default: contents joined by a newline, one user segment
  engine::request want = request_of(true);
  want.prompt = *tok()->encode("Once\nupon a time </s>", true, false);
  EXPECT_EFFECTS(bare, start(1000), ask_placement{id, static_cast<int32_t>(want.prompt.size()), 3, {}});
  EXPECT_EFFECTS(bare, placed(decode_only()), submit{want, false, {}});
  EXPECT_EQ(std::count(want.prompt.begin(), want.prompt.end(), tokenizer::eos), 0);  // "</s>" stays text

  o.chat = served_template::builtin(chat_template::plain);  // roles and markup as template segments
  request_policy plain(o);
  (void)plain.start(1000);
  auto segments = render_chat(chat_template::plain, o.params.messages, true);
  ASSERT_TRUE(segments.has_value());
  want.prompt = *encode_segments(*tok(), *segments, true);
  EXPECT_EFFECTS(plain, placed(decode_only()), submit{want, false, {}});

  o.params.prompt = "Once";  // a prompt and messages
  request_policy both(o);
  EXPECT_EFFECTS(both, start(1000), send_error{error(errc::invalid_argument, "a chat request (messages) takes no prompt", 0)},
                 stop{});
  o.params.prompt.clear();
  o.params.messages = {{"robot", "hi"}};
  request_policy robot(o);
  EXPECT_EFFECTS(robot, start(1000),
                 send_error{error(errc::invalid_argument, "message 0 has role 'robot' (expected system, user, assistant or tool)", 0)},
                 stop{});
  o.params.messages = {{"user", std::string(70000, 'a')}};  // 512 tokens of at most 7 bytes
  o.context_tokens = 512;
  request_policy long_chat(o);
  EXPECT_EFFECTS(long_chat, start(1000),
                 send_error{error(errc::too_long, "the prompt is 70004 bytes; a 512-token context holds at most 3584 (7 bytes per token at most)", 0)},
                 stop{});
  // Issue 47: only the contents counted, so many short messages made a prompt of the template's
  // markup past the context. 600 messages of 5 bytes (role and content) fit; rendered, they don't.
  o.chat = served_template::builtin(chat_template::plain);
  o.params.messages.assign(600, chat_message{"user", "a"});
  auto rendered = render_chat(chat_template::plain, o.params.messages, true);
  ASSERT_TRUE(rendered.has_value());
  int64_t rendered_bytes = 0;
  for (const segment& s : *rendered) rendered_bytes += static_cast<int64_t>(s.text.size());
  ASSERT_GT(rendered_bytes, 3584);
  request_policy many(o);
  EXPECT_EFFECTS(many, start(1000),
                 send_error{error(errc::too_long, "the prompt is " + std::to_string(rendered_bytes) +
                                                      " bytes; a 512-token context holds at most 3584 (7 bytes per token at most)", 0)},
                 stop{});
}

TEST(RequestPolicyPrompt, AJinjaTemplateRendersWithKwargsBosOnceAndRequestTextAsText) {
  request_policy_options o = options(true);
  o.params.prompt.clear();
  o.params.messages = {{"user", "<s>hi"}};
  o.params.chat_template_kwargs = R"({"tail":"</s>"})";
  // tok512 adds BOS: the template's leading bos_token is dropped and the encoder adds it.
  o.chat = *served_template::jinja(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}{{ tail }}"
      "{% if tail == 'boom' %}{{ raise_exception('no boom') }}{% endif %}",
      jinja_options_for(*tok(), {}));
  request_policy h(o);
  engine::request want = request_of(true);
  want.prompt = *encode_segments(*tok(), {{"user", origin::user}, {": ", origin::template_text}, {"<s>hi", origin::user},
                                          {"</s>", origin::template_text}, {"</s>", origin::user}}, true);
  ASSERT_EQ(std::count(want.prompt.begin(), want.prompt.end(), tokenizer::bos), 1);  // BOS once
  ASSERT_EQ(std::count(want.prompt.begin(), want.prompt.end(), tokenizer::eos), 1);  // the template's eos_token only
  EXPECT_EFFECTS(h, start(1000), ask_placement{id, static_cast<int32_t>(want.prompt.size()), 3, {}});
  EXPECT_EFFECTS(h, placed(decode_only()), submit{want, false, {}});
  // A reserved key, kwargs that are not an object, the template's own exception: 400s.
  for (const auto& [kwargs, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"eos_token":"<s>"})", "chat_template_kwargs may not set 'eos_token' (the model's token text)"},
           {"[1]", "chat_template_kwargs must be a JSON object"},
           {"{", "chat_template_kwargs is not valid JSON: "},
           {R"({"tail":"boom"})", "the model's chat template failed: line 1, column "}}) {
    o.params.chat_template_kwargs = kwargs;
    request_policy bad(o);
    const effects fx = bad.start(1000);
    ASSERT_EQ(fx.size(), 2u) << kwargs;
    const auto* e = std::get_if<send_error>(&fx[0]);
    ASSERT_NE(e, nullptr) << kwargs;
    EXPECT_EQ(e->error.code, errc::invalid_argument) << kwargs;
    EXPECT_EQ(e->error.message.rfind(message, 0), 0u) << e->error.message;
  }
}

TEST(RequestPolicyPrompt, AToolCallingChatGivesTheTemplateItsToolsCallsAndResults) {
  // Qwen2.5's own template (tests/data/templates): the prompt is what the template renders from
  // the request as an OpenAI client sends it, tools, the assistant's call and the tool's result
  // included (render-chat's renders of it match @huggingface/jinja's: ServedTemplate.*).
  using json = nlohmann::ordered_json;
  const std::string source = testing::read_file(testing::test_data("templates/Qwen-Qwen2.5-7B-Instruct.jinja"));
  const std::string tools = R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])";
  // The call as the gateway passes it on: its arguments parsed into an object (api.cpp).
  const std::string call = R"({"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]})";
  request_policy_options o = options(true);
  o.params.prompt.clear();
  o.params.messages = {{"user", "Weather in Paris?"}, {"assistant", "", call}, {"tool", "18 C", R"({"tool_call_id":"c1"})"}};
  o.params.tools = tools;
  o.chat = *served_template::jinja(source, jinja_options_for(*tok(), {}));
  request_policy h(o);
  json assistant = {{"role", "assistant"}, {"content", ""}};
  assistant["tool_calls"] = json::parse(call)["tool_calls"];
  const json request = {{"messages", json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}, assistant,
                                                  {{"role", "tool"}, {"content", "18 C"}, {"tool_call_id", "c1"}}})},
                        {"tools", json::parse(tools)},
                        {"add_generation_prompt", true}};
  auto segments = o.chat.render(request);
  ASSERT_TRUE(segments.has_value()) << segments.error().message;
  std::string text;
  for (const segment& s : *segments) text += s.text;
  for (const char* part : {"\"name\": \"get_weather\"", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
                           "<tool_response>\n18 C\n</tool_response>"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " in\n" << text;
  engine::request want = request_of(true);
  want.prompt = *encode_segments(*tok(), *segments, true);
  EXPECT_EFFECTS(h, start(1000), ask_placement{id, static_cast<int32_t>(want.prompt.size()), 3, {}});
  EXPECT_EFFECTS(h, placed(decode_only()), submit{want, false, {}});
  // Keys from another process that do not parse, and tool turns a built-in format cannot show.
  o.params.messages[2].extras = "{";
  request_policy broken(o);
  const effects fx = broken.start(1000);
  ASSERT_FALSE(fx.empty());
  const auto* e = std::get_if<send_error>(&fx[0]);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->error.message.rfind("a message's tool-calling keys is not valid JSON", 0), 0u) << e->error.message;
  o.params.messages[2].extras = R"({"tool_call_id":"c1"})";
  o.params.tools.clear();
  o.chat = served_template::builtin(chat_template::chatml);
  request_policy builtin(o);
  EXPECT_EFFECTS(builtin, start(1000),
                 send_error{error(errc::invalid_argument, "the built-in chatml chat template takes no tool calls or tool "
                                                          "results (the model has no template of its own)", 0)},
                 stop{});
}

TEST(RequestPolicyPrompt, ATextStartsWithBosOnlyWhenTheVocabularyAddsIt) {
  for (const bool adds_bos : {true, false}) {
    auto bpe = tokenizer::from_bytes(testing::small_bpe_gguf([&](testing::gguf_metadata& meta) {
                                       model::gguf_value add;
                                       add.type = model::gguf_type::boolean;
                                       add.boolean = adds_bos;
                                       testing::set_key(meta, "tokenizer.ggml.add_bos_token", add);
                                     }),
                                     261, "small.gguf");
    ASSERT_TRUE(bpe) << bpe.error().message;
    request_policy_options o = options(false);
    o.tok = std::make_shared<const tokenizer>(std::move(*bpe));
    o.params.prompt = "ab";
    request_policy h(o);
    engine::request want = request_of(false);
    want.prompt = adds_bos ? std::vector<int32_t>{258, 256} : std::vector<int32_t>{256};  // (BOS) "ab"
    EXPECT_EFFECTS(h, start(1000), ask_placement{id, static_cast<int32_t>(want.prompt.size()), 3, {}});
    EXPECT_EFFECTS(h, placed(decode_only()), submit{want, false, {}});
  }
}

TEST(RequestPolicyPrompt, TokenizerErrorsPassOn) {
  request_policy_options o = options(true);
  o.params.prompt = "ab\xff";
  request_policy h(o);
  EXPECT_EFFECTS(h, start(1000), send_error{error(errc::invalid_utf8, "invalid UTF-8 at byte offset 2: byte 0xFF never appears in UTF-8", 0)}, stop{});
}

TEST(RequestPolicyRun, AStreamedRunSendsAChunkPerTokenThenTheEndWithItsTimes) {
  request_policy h(options(true));
  EXPECT_EFFECTS(h, start(1000), ask_placement{id, 2, 3, {}});
  EXPECT_EFFECTS(h, placed(decode_only()), submit{request_of(true), false, {}});
  EXPECT_EFFECTS(h, on_token(token(upon, -0.5f), 0, 2000), send_chunk{chunk(0, " upon", {upon}, {-0.5f})});
  EXPECT_EFFECTS(h, on_token(token(a, -0.25f), 0, 2500), send_chunk{chunk(1, " a", {a}, {-0.25f})});
  engine::sample_event last = token(time_, -1.0f, engine::finish_reason::length);
  last.num_cached_tokens = 1;
  last.num_preemptions = 2;
  last.num_recomputed_tokens = 3;
  // The engine first scheduled it at 1500 (its clock is the policy's here): queued 500.
  EXPECT_EFFECTS(h, on_token(last, 1500, 4000), send_chunk{chunk(2, " time", {time_}, {-1.0f})},
                 send_end{{id, stream_id, engine::finish_reason::length, drawn_seed, 2, 3, 500, 1000, 3000,
                           {500, 1500}, 1, 2, 3, 3}},
                 stop{});
  EXPECT_TRUE(h.done());
}

TEST(RequestPolicyRun, AGivenSeedIsUsedAndReported) {
  request_policy_options o = options(true);
  o.params.has_seed = true;
  o.params.seed = 123;
  engine::request want = request_of(true);
  want.seed = 123;
  request_policy h(o);
  EXPECT_EFFECTS(h, start(1000), ask_placement{id, 2, 3, {}});
  EXPECT_EFFECTS(h, placed(prefill_and_decode()), submit{want, true, {}});
  EXPECT_EFFECTS(h, on_token(token(upon, 0.0f, engine::finish_reason::stop), 1000, 1200),
                 send_chunk{chunk(0, " upon", {upon}, {0.0f})},
                 send_end{{id, stream_id, engine::finish_reason::stop, 123, 2, 1, 0, 200, 200, {}, 0, 0, 0, 1}},
                 stop{});
}

TEST(RequestPolicyRun, ANonStreamedRunSendsOneChunkBeforeTheEnd) {
  // Stop strings keep the tokens coming one by one (batch_tokens off) though nothing is streamed.
  request_policy h(options(false, {"zz"}));
  EXPECT_EFFECTS(h, start(1000), ask_placement{id, 2, 3, {}});
  EXPECT_EFFECTS(h, placed(decode_only()), submit{request_of(false, {"zz"}), false, {}});
  EXPECT_NO_EFFECTS(h, on_token(token(upon, -0.5f), 0, 2000));
  EXPECT_NO_EFFECTS(h, on_token(token(a, -0.25f), 0, 3000));
  EXPECT_EFFECTS(h, on_token(token(time_, -1.0f, engine::finish_reason::length), 1000, 3500),
                 send_chunk{chunk(0, " upon a time", {upon, a, time_}, {-0.5f, -0.25f, -1.0f})},
                 send_end{{id, stream_id, engine::finish_reason::length, drawn_seed, 2, 3, 0, 1000, 2500,
                           {1000, 500}, 0, 0, 0, 1}},
                 stop{});
}

TEST(RequestPolicyRun, ABatchIsExpandedTokenByTokenAtTheTimesItsAgesGive) {
  request_policy h(options(false));
  EXPECT_EFFECTS(h, start(1000), ask_placement{id, 2, 3, {}});
  EXPECT_EFFECTS(h, placed(decode_only()), submit{request_of(false), false, {}});
  engine::token_batch b{id, {upon, a, time_}, {-0.5f, -0.25f, -1.0f}, {{}, {}, {}}, {3000, 2000, 0},
                        engine::finish_reason::length, 4, 5, 6, 8500, {}};
  // Received at 10000: sampled at 7000, 8000 and 10000, first scheduled at 1500.
  EXPECT_EFFECTS(h, on_batch(b, 10000),
                 send_chunk{chunk(0, " upon a time", {upon, a, time_}, {-0.5f, -0.25f, -1.0f})},
                 send_end{{id, stream_id, engine::finish_reason::length, drawn_seed, 2, 3, 500, 6000, 9000,
                           {1000, 2000}, 4, 5, 6, 1}},
                 stop{});
}

TEST(RequestPolicyRun, TopLogprobsTravelWithTheirTokensStreamedOrBatched) {
  request_policy_options o = options(true);
  o.params.num_top_logprobs = 2;
  request_policy streamed = running(o);
  engine::sample_event s = token(upon, -0.5f);
  s.sample.top_logprobs = {{upon, -0.5f}, {a, -1.5f}};
  completion_chunk want = chunk(0, " upon", {upon}, {-0.5f});
  want.top_logprobs = {{{upon, -0.5f}, {a, -1.5f}}};
  EXPECT_EFFECTS(streamed, on_token(s, 0, 2000), send_chunk{want});

  o.params.stream = false;
  request_policy batched = running(o);
  engine::token_batch b{id, {upon, a}, {-0.5f, -0.25f}, {{{upon, -0.5f}, {a, -1.5f}}, {{a, -0.25f}, {time_, -2.0f}}},
                        {0, 0}, engine::finish_reason::length, 0, 0, 0, 0, {}};
  want = chunk(0, " upon a", {upon, a}, {-0.5f, -0.25f});
  want.top_logprobs = b.top_logprobs;
  EXPECT_EFFECTS(batched, on_batch(b, 2000), send_chunk{want},
                 send_end{{id, stream_id, engine::finish_reason::length, drawn_seed, 2, 2, 1000, 1000, 1000, {0}, 0, 0,
                           0, 1}},
                 stop{});
}

TEST(RequestPolicyRun, StopTokenIdsReachTheEngine) {
  request_policy_options o = options(true);
  o.params.stop_token_ids = {a, time_};
  engine::request want = request_of(true);
  want.stop_token_ids = {a, time_};
  request_policy h(o);
  EXPECT_EFFECTS(h, start(1000), ask_placement{id, 2, 3, {}});
  EXPECT_EFFECTS(h, placed(decode_only()), submit{want, false, {}});
}

TEST(RequestPolicyRun, TokenIdsStreamTextWithATokenizerAndStopStringsApply) {
  request_policy_options o = options(true, {" a"});
  o.params.prompt.clear();
  o.params.prompt_tokens = {tokenizer::bos, once};
  request_policy h = running(o);
  EXPECT_EFFECTS(h, on_token(token(upon, -0.5f), 0, 2000), send_chunk{chunk(0, " upo", {upon}, {-0.5f})});
  EXPECT_EFFECTS(h, on_token(token(a, -0.25f), 0, 2500), send_chunk{chunk(1, "n", {a}, {-0.25f})}, release_engines{},
                 send_end{{id, stream_id, engine::finish_reason::stop, drawn_seed, 2, 2, 0, 1000, 1500, {500}, 0, 0,
                           0, 2}},
                 stop{});
}

TEST(RequestPolicyRun, TokenIdsStreamWithoutTextWithoutATokenizer) {
  request_policy_options o = options(true);
  o.params.prompt.clear();
  o.params.prompt_tokens = {tokenizer::bos, once};
  o.tok = nullptr;
  request_policy h = running(o);
  EXPECT_EFFECTS(h, on_token(token(upon, -0.5f, engine::finish_reason::length), 1000, 2000),
                 send_chunk{chunk(0, "", {upon}, {-0.5f})},
                 send_end{{id, stream_id, engine::finish_reason::length, drawn_seed, 2, 1, 0, 1000, 1000, {}, 0, 0,
                           0, 1}},
                 stop{});
}

TEST(RequestPolicyRun, AStopStringMidStreamReleasesTheEnginesAndFinishesWithStop) {
  // " a" may start at the last byte of " upon": that byte waits for the next token.
  request_policy h = running(options(true, {" a"}));
  EXPECT_EFFECTS(h, on_token(token(upon, -0.5f), 0, 2000), send_chunk{chunk(0, " upo", {upon}, {-0.5f})});
  EXPECT_EFFECTS(h, on_token(token(a, -0.25f), 0, 2500), send_chunk{chunk(1, "n", {a}, {-0.25f})},
                 release_engines{},
                 send_end{{id, stream_id, engine::finish_reason::stop, drawn_seed, 2, 2, 0, 1000, 1500, {500}, 0, 0,
                           0, 2}},
                 stop{});
}

// An embedding asks for no tokens, is computed whole on the decode engine (its hidden states are
// in no KV a prefill engine could send) and ends with its vector.
TEST(RequestPolicyRun, AnEmbeddingAsksForNoTokensAndEndsWithItsVector) {
  request_policy_options o = options(false);
  o.params.pooling = engine::pooling_mode::mean;
  request_policy h(o);
  EXPECT_EFFECTS(h, start(1000), ask_placement{id, 2, 0, {}});
  engine::request want = request_of(false);
  want.max_tokens = 0;
  want.pooling = engine::pooling_mode::mean;
  EXPECT_EFFECTS(h, placed(prefill_and_decode()), submit{want, false, {}});
  engine::token_batch b{id, {}, {}, {}, {}, engine::finish_reason::stop, 0, 5, 6, 500, {0.6f, -0.8f}};
  // Received at 3000, first scheduled at 2500.
  EXPECT_EFFECTS(h, on_batch(b, 3000),
                 send_end{{id, stream_id, engine::finish_reason::stop, drawn_seed, 2, 0, 1500, 2000, 2000, {}, 0, 5, 6,
                           0, 0, {0.6f, -0.8f}}},
                 stop{});
}

TEST(RequestPolicyTrust, AnEmbeddingWithoutAFiniteVectorOrAVectorForACompletionFailsTheRequest) {
  request_policy_options o = options(false);
  o.params.pooling = engine::pooling_mode::last;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::string why = "the engine answered an embedding request without a finite vector";
  for (const engine::token_batch& b : {engine::token_batch{id, {}, {}, {}, {}, engine::finish_reason::stop, 0, 0, 0, 0, {}},
                                       engine::token_batch{id, {}, {}, {}, {}, engine::finish_reason::stop, 0, 0, 0, 0, {nan}},
                                       engine::token_batch{id, {upon}, {-0.5f}, {{}}, {0}, engine::finish_reason::stop, 0, 0, 0, 0,
                                                           {1.0f}}}) {
    request_policy h = running(o);
    EXPECT_EFFECTS(h, on_batch(b, 2000), release_engines{}, send_error{error(errc::internal, why, 0)}, stop{});
  }
  request_policy completion = running(options(false));
  engine::token_batch b{id, {upon}, {-0.5f}, {{}}, {0}, engine::finish_reason::stop, 0, 0, 0, 0, {1.0f}};
  EXPECT_EFFECTS(completion, on_batch(b, 2000), release_engines{},
                 send_error{error(errc::internal, "the engine sent an embedding for a completion", 0)}, stop{});
}

TEST(RequestPolicyTrust, AnUnknownFinishReasonFailsTheRequest) {
  const auto unknown = static_cast<engine::finish_reason>(99);
  request_policy streamed = running(options(true));
  EXPECT_EFFECTS(streamed, on_token(token(upon, -0.5f), 0, 2000), send_chunk{chunk(0, " upon", {upon}, {-0.5f})});
  EXPECT_EFFECTS(streamed, on_token(token(a, -0.25f, unknown), 0, 2500), release_engines{},
                 send_error{error(errc::internal, "the engine sent an unknown finish reason 99", 1)}, stop{});

  request_policy batched = running(options(false));
  engine::token_batch b{id, {upon}, {-0.5f}, {{}}, {0}, unknown, 0, 0, 0, 0, {}};
  EXPECT_EFFECTS(batched, on_batch(b, 2000), release_engines{},
                 send_error{error(errc::internal, "the engine sent an unknown finish reason 99", 0)}, stop{});
}

TEST(RequestPolicyTrust, TopLogprobsBeyondTheAskOrOutsideTheVocabularyFailTheRequest) {
  request_policy_options o = options(true);
  o.params.num_top_logprobs = 1;
  request_policy too_many = running(o);
  engine::sample_event s = token(upon, -0.5f);
  s.sample.top_logprobs = {{upon, -0.5f}, {a, -1.5f}};
  EXPECT_EFFECTS(too_many, on_token(s, 0, 2000), release_engines{},
                 send_error{error(errc::internal, "the engine sent 2 top logprobs; 1 were asked for", 0)}, stop{});

  request_policy outside = running(o);
  s.sample.top_logprobs = {{512, -0.5f}};
  EXPECT_EFFECTS(outside, on_token(s, 0, 2000), release_engines{},
                 send_error{error(errc::internal,
                                  "the engine sent a top logprob of token 512, outside the vocabulary [0, 512)", 0)},
                 stop{});

  o.params.stream = false;
  request_policy infinite = running(o);
  engine::token_batch b{id, {upon}, {-0.5f}, {{{a, -std::numeric_limits<float>::infinity()}}}, {0},
                        engine::finish_reason::length, 0, 0, 0, 0, {}};
  EXPECT_EFFECTS(infinite, on_batch(b, 2000), release_engines{},
                 send_error{error(errc::internal, "the engine sent a top logprob of token " + std::to_string(a) +
                                                      " that is not finite", 0)},
                 stop{});
}

TEST(RequestPolicyTrust, ARejectionPassesItsCodeOnUnlessTheCodeIsUnknown) {
  request_policy known = running(options(true));
  EXPECT_EFFECTS(known, rejected(errc::overloaded, "the queue is full"), release_engines{},
                 send_error{error(errc::overloaded, "the queue is full", 0)}, stop{});

  request_policy unknown = running(options(true));
  EXPECT_EFFECTS(unknown, rejected(static_cast<errc>(77), "boom"), release_engines{},
                 send_error{error(errc::internal, "the engine rejected the request with an unknown error code 77: boom",
                                  0)},
                 stop{});
}

TEST(RequestPolicyPlacement, NoEngineFailsTheRequest) {
  request_policy refused(options(true));
  EXPECT_EFFECTS(refused, start(1000), ask_placement{id, 2, 3, {}});
  EXPECT_EFFECTS(refused, placed({"no engine is up", false, false, "", ""}), send_error{error(errc::unavailable, "no engine is up", 0)},
                 stop{});

  request_policy no_decode(options(true));
  EXPECT_EFFECTS(no_decode, start(1000), ask_placement{id, 2, 3, {}});
  EXPECT_EFFECTS(no_decode, placed(placed_engines{}),
                 send_error{error(errc::unavailable, "the balancer's placement names no decode engine", 0)}, stop{});
}

TEST(RequestPolicyEnd, ACancelReleasesTheEnginesAndSendsWhatIsPending) {
  request_policy streamed = running(options(true));
  EXPECT_EFFECTS(streamed, on_token(token(upon, -0.5f), 0, 2000), send_chunk{chunk(0, " upon", {upon}, {-0.5f})});
  EXPECT_EFFECTS(streamed, cancel(5000), release_engines{},
                 send_end{{id, stream_id, engine::finish_reason::cancelled, drawn_seed, 2, 1, 0, 1000, 4000, {}, 0, 0,
                           0, 1}},
                 stop{});

  // Not streamed: the tokens so far go out as the one chunk before the end.
  request_policy whole = running(options(false, {"zz"}));
  EXPECT_NO_EFFECTS(whole, on_token(token(upon, -0.5f), 0, 2000));
  EXPECT_EFFECTS(whole, cancel(3000), release_engines{}, send_chunk{chunk(0, " upon", {upon}, {-0.5f})},
                 send_end{{id, stream_id, engine::finish_reason::cancelled, drawn_seed, 2, 1, 0, 1000, 2000, {}, 0, 0,
                           0, 1}},
                 stop{});

  // Before any placement: there is nothing to release there, and nothing was generated.
  request_policy early(options(true));
  EXPECT_EFFECTS(early, start(1000), ask_placement{id, 2, 3, {}});
  EXPECT_EFFECTS(early, cancel(1500), release_engines{},
                 send_end{{id, stream_id, engine::finish_reason::cancelled, drawn_seed, 2, 0, 0, 0, 500, {}, 0, 0, 0,
                           0}},
                 stop{});
}

TEST(RequestPolicyEnd, WithoutFailoversALostEngineFailsTheRequestUnlessItIsAPrefillEngineThatHandedOver) {
  const std::string lost = " serving this request is lost: node down";
  request_policy_options o = options(true);
  o.max_failovers = 0;
  request_policy before = running(o, prefill_and_decode());
  EXPECT_EFFECTS(before, engine_lost(engine_role::prefill, "node down"), release_engines{},
                 send_error{error(errc::unavailable, "engine 'prefill0' on node 'n0'" + lost, 0)}, stop{});

  request_policy after = running(o, prefill_and_decode());
  after.prefilled();
  EXPECT_NO_EFFECTS(after, engine_lost(engine_role::prefill, "node down"));
  EXPECT_FALSE(after.done());
  EXPECT_EFFECTS(after, on_token(token(upon, -0.5f), 0, 2000), send_chunk{chunk(0, " upon", {upon}, {-0.5f})});
  EXPECT_EFFECTS(after, engine_lost(engine_role::decode, "node down"), release_engines{},
                 send_error{error(errc::unavailable, "engine 'decode0' on node 'n1'" + lost, 1)}, stop{});
}

TEST(RequestPolicyEnd, ALostEngineHasTheRequestPlacedAgainAndResumedAfterWhatTheClientHas) {
  request_policy_options o = options(true);
  o.params.max_tokens = 4;
  o.max_failovers = 2;
  request_policy h = running(o, prefill_and_decode());
  engine::request want = request_of(true);
  want.max_tokens = 4;
  // The prefill engine is lost before it handed over: placed again, from the start.
  EXPECT_EFFECTS(h, engine_lost(engine_role::prefill, "node down"), release_engines{},
                 ask_placement{id, 2, 4, {}, true, engine_role::prefill});
  EXPECT_EQ(h.num_failovers(), 1);
  EXPECT_EFFECTS(h, placed(decode_only()), submit{want, false, {}});
  EXPECT_EFFECTS(h, on_token(token(upon, -0.5f), 0, 2000), send_chunk{chunk(0, " upon", {upon}, {-0.5f})});
  // The decode engine is lost after one token: the new one recomputes it and goes on after it.
  EXPECT_EFFECTS(h, engine_lost(engine_role::decode, "node down"), release_engines{},
                 ask_placement{id, 3, 3, {}, true, engine_role::decode});
  want.prompt = {tokenizer::bos, once, upon};
  want.num_resumed_tokens = 1;
  want.max_tokens = 3;
  EXPECT_EFFECTS(h, placed(decode_only()), submit{want, false, {}});
  EXPECT_EFFECTS(h, on_token(token(a, -0.25f), 0, 2500), send_chunk{chunk(1, " a", {a}, {-0.25f})});
  // A placement that finds no engine fails it (the balancer's error names the lost ones).
  request_policy none = running(o);
  EXPECT_EFFECTS(none, engine_lost(engine_role::decode, "node down"), release_engines{},
                 ask_placement{id, 2, 4, {}, true, engine_role::decode});
  EXPECT_EFFECTS(none, placed({"no live engine can serve the request", false, false, "", ""}),
                 send_error{error(errc::unavailable, "no live engine can serve the request", 0)}, stop{});
  // Past max_failovers it fails, saying so.
  EXPECT_EFFECTS(h, engine_lost(engine_role::decode, "node down"), release_engines{},
                 send_error{error(errc::unavailable,
                                  "engine 'decode0' on node 'n0' serving this request is lost: node down (placed again 2 "
                                  "times already)",
                                  2)},
                 stop{});
}

TEST(RequestPolicyEnd, AForwardedRequestTakesTheKvItsResumedPromptNeedsToItsNextDecodeEngine) {
  request_policy_options o = options(true);
  o.params.max_tokens = 4;
  request_policy h = running(o, prefill_and_decode());
  h.prefilled();
  EXPECT_EFFECTS(h, on_token(token(upon, -0.5f), 0, 2000), send_chunk{chunk(0, " upon", {upon}, {-0.5f})});
  // The decode engine drained with 4 positions of KV (it had sampled a token the client never got).
  const engine::kv_data kv{1, 2, 4, testing::f32_bytes({0, 1, 2, 3, 4, 5, 6, 7}),
                           testing::f32_bytes({10, 11, 12, 13, 14, 15, 16, 17})};
  EXPECT_EFFECTS(h, forwarded(engine_role::decode, "drained", kv), release_engines{},
                 ask_placement{id, 3, 3, {}, true, engine_role::decode, true});
  // Placed on a prefill and a decode engine: the decode engine takes it with the KV of the
  // resumed prompt {BOS, once, upon} but its last token, and the prefill engine has no part.
  engine::request want = request_of(true);
  want.prompt = {tokenizer::bos, once, upon};
  want.num_resumed_tokens = 1;
  want.max_tokens = 3;
  const engine::kv_data two{1, 2, 2, testing::f32_bytes({0, 1, 2, 3}), testing::f32_bytes({10, 11, 12, 13})};
  EXPECT_EFFECTS(h, placed(prefill_and_decode()), submit{want, false, two});
  EXPECT_NO_EFFECTS(h, engine_lost(engine_role::prefill, "node down"));
  EXPECT_EFFECTS(h, on_token(token(a, -0.25f), 0, 2500), send_chunk{chunk(1, " a", {a}, {-0.25f})});

  // KV that does not cover the resumed prompt, or is torn, is not used: the new engine recomputes.
  for (const engine::kv_data& unusable :
       {engine::kv_data{1, 2, 1, testing::f32_bytes({0, 1}), testing::f32_bytes({10, 11})},
        engine::kv_data{1, 2, 4, testing::f32_bytes({0}), testing::f32_bytes({1})}}) {
    request_policy g = running(o, prefill_and_decode());
    g.prefilled();
    EXPECT_EFFECTS(g, on_token(token(upon, -0.5f), 0, 2000), send_chunk{chunk(0, " upon", {upon}, {-0.5f})});
    EXPECT_EFFECTS(g, forwarded(engine_role::decode, "drained", unusable), release_engines{},
                   ask_placement{id, 3, 3, {}, true, engine_role::decode, true});
    EXPECT_EFFECTS(g, placed(prefill_and_decode()), submit{want, true, std::nullopt});
  }
}

TEST(RequestPolicyEnd, ALostClientReleasesTheEnginesAndStopsWithoutAWord) {
  request_policy h = running(options(true));
  EXPECT_EFFECTS(h, on_token(token(upon, -0.5f), 0, 2000), send_chunk{chunk(0, " upon", {upon}, {-0.5f})});
  EXPECT_EFFECTS(h, client_lost(), release_engines{}, stop{});
  EXPECT_TRUE(h.done());
}

}  // namespace troupe::serve
