// engine::engine's edges: how samples end (EOS/BOS, max_tokens, stop strings, stop token ids,
// abort), every rejected input with its error class and message, and output_stream's text
// holdback on its own.
#include "runtime/engine/engine.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/engine/output_stream.hpp"
#include "runtime/tokenizer/utf8.hpp"
#include "tests/support/engine_harness.hpp"

namespace troupe::engine {
namespace {

using testing::make_engine;
using testing::make_request;
using testing::outputs;
using testing::run_to_completion;
using testing::sample_output;
using testing::varied_prompt;

const tokenizer& tok() { return testing::model_and_tokenizer().tok; }

std::vector<int32_t> first(const std::vector<int32_t>& v, size_t n) {
  return std::vector<int32_t>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
}

/// The text `tokens` add after `prompt` (the prompt decides the leading-space rule).
std::string text_after(const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  return tok().decode(all).substr(tok().decode(prompt).size());
}

/// Runs one request alone to completion and returns its sample 0.
sample_output run_one(const request& r, const engine_config& config = {}) {
  auto e = make_engine(config);
  const auto added = e->add_request(r);
  EXPECT_TRUE(added.has_value()) << added.error().message;
  outputs out = run_to_completion(*e);
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
  EXPECT_EQ(out.size(), 1u);
  return out[{r.id, 0}];
}

/// Greedy from BOS: "Once upon a time, there was a little girl named Lily. She loved to ..."
request greedy_story(int32_t max_tokens) {
  return make_request(1, {tokenizer::bos}, max_tokens, 0.0f, 0);
}

// ---- how samples end ---------------------------------------------------------------------------

TEST(EngineStops, BosEndsASampleUnlessIgnoreEos) {
  // llama2.c's greedy story (256 tokens) as the prompt: the model ends it with BOS 90 tokens on.
  const std::vector<int32_t> prompt = testing::golden("t0_default256").token_ids;
  ASSERT_EQ(prompt.size(), 257u);
  request r = make_request(1, prompt, 150, 0.0f, 0);
  r.ignore_eos = true;
  const sample_output cont = run_one(r);
  ASSERT_EQ(cont.tokens.size(), 150u);
  EXPECT_EQ(cont.finish, finish_reason::length);
  size_t first_end = 0;
  while (first_end < cont.tokens.size() && cont.tokens[first_end] != tokenizer::bos &&
         cont.tokens[first_end] != tokenizer::eos)
    first_end++;
  EXPECT_EQ(first_end, 89u);
  EXPECT_EQ(cont.tokens[89], tokenizer::bos);

  r.ignore_eos = false;
  const sample_output stopped = run_one(r);
  EXPECT_EQ(stopped.finish, finish_reason::stop);
  EXPECT_EQ(stopped.tokens, first(cont.tokens, 90));
  EXPECT_EQ(stopped.text, text_after(prompt, first(cont.tokens, 89)));
  EXPECT_EQ(stopped.deltas.back(), "");  // BOS has no text
  EXPECT_EQ(cont.text.substr(0, stopped.text.size()), stopped.text);

  // An explicit end-of-sequence list replaces the default (EOS and BOS).
  engine_config only_eos;
  only_eos.eos_token_ids = {tokenizer::eos};
  const sample_output ignored = run_one(r, only_eos);
  EXPECT_EQ(ignored.tokens, cont.tokens);
  EXPECT_EQ(ignored.finish, finish_reason::length);
}

TEST(EngineStops, MaxTokensEndsWithLength) {
  for (int32_t max_tokens : {1, 2, 17}) {
    const sample_output out = run_one(greedy_story(max_tokens));
    EXPECT_EQ(out.tokens.size(), static_cast<size_t>(max_tokens));
    EXPECT_EQ(out.finish, finish_reason::length);
    EXPECT_EQ(out.text, text_after({tokenizer::bos}, out.tokens));
  }
  EXPECT_EQ(run_one(greedy_story(4)).text, "Once upon a time");
}

/// The stop-string run must equal the plain run cut at the first token whose text completes
/// the stop string, with the text cut before it, streamed without ever showing it.
void expect_stop_string(const std::vector<std::string>& stop, const std::string& want_text) {
  SCOPED_TRACE("stop " + stop.front());
  const sample_output plain = run_one(greedy_story(60));
  request r = greedy_story(60);
  r.stop = stop;
  const sample_output out = run_one(r);
  EXPECT_EQ(out.finish, finish_reason::stop);
  EXPECT_EQ(out.text, want_text);
  std::string streamed;
  for (const std::string& d : out.deltas) {
    for (const std::string& s : stop) EXPECT_EQ(d.find(s), std::string::npos) << d;
    streamed += d;
  }
  EXPECT_EQ(streamed, want_text);
  // The last token is the first one whose text completes a stop string.
  size_t k = 0;
  auto completes = [&](size_t n) {
    const std::string t = text_after({tokenizer::bos}, first(plain.tokens, n));
    for (const std::string& s : stop)
      if (t.find(s) != std::string::npos) return true;
    return false;
  };
  while (k < plain.tokens.size() && !completes(k + 1)) k++;
  ASSERT_LT(k, plain.tokens.size());
  EXPECT_EQ(out.tokens, first(plain.tokens, k + 1));
  EXPECT_EQ(plain.text.substr(0, want_text.size()), want_text);
}

TEST(EngineStops, StopStringsCutTheTextBeforeThem) {
  expect_stop_string({"girl named"}, "Once upon a time, there was a little ");
  expect_stop_string({"e, th"}, "Once upon a tim");  // spans " time", "," and " there"
  expect_stop_string({"park", "Lily"}, "Once upon a time, there was a little girl named ");
  expect_stop_string({"O"}, "");
}

TEST(EngineStops, AStopStringThatNeverAppearsChangesNothingButTheStreaming) {
  const sample_output plain = run_one(greedy_story(40));
  request r = greedy_story(40);
  r.stop = {"a dragon!", "xyz"};
  const sample_output out = run_one(r);
  EXPECT_EQ(out.tokens, plain.tokens);
  EXPECT_EQ(out.text, plain.text);
  EXPECT_EQ(out.finish, finish_reason::length);
  EXPECT_EQ(out.deltas.front(), "");  // "Once" is held back: it might begin a stop string
  EXPECT_EQ(plain.deltas.front(), "Once");
}

TEST(EngineStops, StopTokenIdsEndTheSample) {
  const sample_output plain = run_one(greedy_story(60));
  const int32_t stop_token = plain.tokens[9];
  size_t stop_at = 0;
  while (plain.tokens[stop_at] != stop_token) stop_at++;
  request r = greedy_story(60);
  r.stop_token_ids = {500, stop_token};
  const sample_output out = run_one(r);
  EXPECT_EQ(out.finish, finish_reason::stop);
  EXPECT_EQ(out.tokens, first(plain.tokens, stop_at + 1));
  EXPECT_EQ(out.text, text_after({tokenizer::bos}, out.tokens));
}

TEST(EngineStops, AbortEndsEverySampleAndFreesItsBlocks) {
  auto e = make_engine();
  request r = make_request(5, varied_prompt(7), 100, 1.0f, 3);
  r.n = 3;
  r.ignore_eos = true;
  r.stop = {"zzzz"};  // text is held back: abort must flush it
  ASSERT_TRUE(e->add_request(r).has_value());
  request other = make_request(6, varied_prompt(8), 30, 0.0f, 0);
  other.ignore_eos = true;
  ASSERT_TRUE(e->add_request(other).has_value());
  outputs out;
  for (int32_t i = 0; i < 10; i++) testing::step_once(*e, out);
  ASSERT_EQ(out.size(), 4u);

  const auto aborted = e->abort(5);
  ASSERT_TRUE(aborted.has_value()) << aborted.error().message;
  ASSERT_EQ(aborted->size(), 3u);
  for (int32_t i = 0; i < 3; i++) {
    EXPECT_EQ((*aborted)[static_cast<size_t>(i)].request, 5);
    EXPECT_EQ((*aborted)[static_cast<size_t>(i)].sample_index, i);
    EXPECT_EQ((*aborted)[static_cast<size_t>(i)].token, -1);
    EXPECT_EQ((*aborted)[static_cast<size_t>(i)].finish, finish_reason::aborted);
  }
  testing::collect(out, *aborted);
  e->check_invariants();
  for (int32_t i = 0; i < 3; i++) {
    const sample_output& s = out.at({5, i});
    EXPECT_EQ(s.tokens.size(), 10u);
    EXPECT_EQ(s.finish, finish_reason::aborted);
    EXPECT_EQ(s.text, text_after(r.prompt, s.tokens)) << i;  // held-back text was flushed
  }
  EXPECT_FALSE(e->core().sequence_of(5, 0).has_value());
  EXPECT_TRUE(e->has_unfinished());  // 6 goes on
  const auto again = e->abort(5);
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code, errc::not_found);

  // A request still waiting (never scheduled) aborts with an empty event.
  ASSERT_TRUE(e->add_request(make_request(7, varied_prompt(9), 5, 0.0f, 0)).has_value());
  const auto waiting = e->abort(7);
  ASSERT_TRUE(waiting.has_value());
  ASSERT_EQ(waiting->size(), 1u);
  EXPECT_EQ(waiting->front().finish, finish_reason::aborted);
  EXPECT_EQ(waiting->front().text, "");
  e->check_invariants();

  testing::run_until_done(*e, out);
  EXPECT_EQ(out.at({6, 0}).tokens.size(), 30u);
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
  EXPECT_EQ(e->blocks().num_sequences(), 0);

  const auto unknown = e->abort(12345);
  ASSERT_FALSE(unknown.has_value());
  EXPECT_EQ(unknown.error().code, errc::not_found);
  EXPECT_NE(unknown.error().message.find("12345"), std::string::npos) << unknown.error().message;
}

TEST(EngineStops, ForkedSamplesThatEndAtOnceLeaveNothingBehind) {
  // n = 3 with max_tokens = 1: the children are forked (each with a copy of the partial prompt
  // block pending for the next step) and end in the same step. The idle engine then steps.
  auto e = make_engine();
  request r = make_request(1, varied_prompt(3), 1, 1.0f, 8);  // 23 tokens
  r.n = 3;
  ASSERT_NE(r.prompt.size() % 16, 0u);
  ASSERT_TRUE(e->add_request(r).has_value());
  outputs out;
  testing::step_once(*e, out);
  ASSERT_EQ(out.size(), 3u);
  for (const auto& [key, s] : out) EXPECT_EQ(s.finish, finish_reason::length) << key.second;
  EXPECT_FALSE(e->has_unfinished());
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
  EXPECT_TRUE(e->step().empty());
  e->check_invariants();

  // Same with an abort right after the fork step.
  request longer = r;
  longer.id = 2;
  longer.max_tokens = 20;
  longer.ignore_eos = true;
  ASSERT_TRUE(e->add_request(longer).has_value());
  testing::step_once(*e, out);
  ASSERT_TRUE(e->abort(2).has_value());
  EXPECT_TRUE(e->step().empty());
  e->check_invariants();
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);

  // The engine still works afterwards.
  ASSERT_TRUE(e->add_request(longer).has_value());
  const outputs again = run_to_completion(*e);
  EXPECT_EQ(again.size(), 3u);
  for (const auto& [key, s] : again) EXPECT_EQ(s.tokens.size(), 20u) << key.second;
}

// ---- bad input ---------------------------------------------------------------------------------

/// Expects `add_request(r)` to fail with `code` and a message containing `words`, and to leave
/// no trace (the same id is accepted afterwards once fixed).
void expect_rejected(request r, errc code, const std::string& words,
                     const engine_config& config = {}) {
  SCOPED_TRACE("expecting '" + words + "'");
  auto e = make_engine(config);
  const auto added = e->add_request(r);
  ASSERT_FALSE(added.has_value());
  EXPECT_EQ(added.error().code, code) << to_string(added.error().code) << ": " << added.error().message;
  EXPECT_NE(added.error().message.find(words), std::string::npos) << added.error().message;
  EXPECT_FALSE(e->has_unfinished());
  e->check_invariants();
  EXPECT_TRUE(e->step().empty());
  EXPECT_EQ(e->stats().num_steps, 0);
}

request valid_request() { return make_request(1, {tokenizer::bos, 403}, 8, 1.0f, 1); }

TEST(EngineInput, TooLongForTheContextOrThePool) {
  request r = valid_request();
  r.prompt.assign(500, 403);
  r.max_tokens = 13;  // 513 > 512
  expect_rejected(r, errc::too_long, "exceeds the model's context of 512 tokens");

  engine_config small;
  small.num_kv_blocks = 4;  // 64 slots
  request big = valid_request();
  big.max_tokens = 63;  // 2 + 63 = 65 tokens: 5 blocks
  expect_rejected(big, errc::too_long, "needs 5 KV blocks but the pool has only 4", small);

  // The largest that fits runs to the end, even with a rival for the pool.
  auto e = make_engine(small);
  big.max_tokens = 62;
  big.ignore_eos = true;
  ASSERT_TRUE(e->add_request(big).has_value());
  request rival = big;
  rival.id = 2;
  rival.seed = 2;
  ASSERT_TRUE(e->add_request(rival).has_value());
  const outputs out = run_to_completion(*e, 1000);
  EXPECT_EQ(out.at({1, 0}).tokens.size(), 62u);
  EXPECT_EQ(out.at({2, 0}).tokens.size(), 62u);
  EXPECT_GT(e->stats().num_preemptions, 0);
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
}

TEST(EngineInput, MalformedRequestsNameTheProblem) {
  request r = valid_request();
  r.prompt.clear();
  expect_rejected(r, errc::invalid_argument, "prompt is empty");

  r = valid_request();
  r.prompt = {tokenizer::bos, 403, 512};
  expect_rejected(r, errc::invalid_argument, "prompt token 2 = 512 is outside the vocabulary");
  r.prompt = {-1};
  expect_rejected(r, errc::invalid_argument, "prompt token 0 = -1 is outside the vocabulary");

  for (int32_t bad : {0, -1}) {
    r = valid_request();
    r.max_tokens = bad;
    expect_rejected(r, errc::invalid_argument, "max_tokens must be > 0, got " + std::to_string(bad));
  }
  r = valid_request();
  r.cache_class = static_cast<kv::cache_class>(2);  // from another process
  expect_rejected(r, errc::invalid_argument, "cache_class 2 is not a class (chat = 0, agent = 1)");
  for (int32_t bad : {0, 129}) {
    r = valid_request();
    r.n = bad;
    expect_rejected(r, errc::invalid_argument, "n must be in [1, 128], got " + std::to_string(bad));
  }

  r = valid_request();
  r.sampling.temperature = -0.5f;
  expect_rejected(r, errc::invalid_argument, "temperature");
  r = valid_request();
  r.sampling.top_p = 0.0f;
  expect_rejected(r, errc::invalid_argument, "top_p must be in (0, 1], got 0");
  r.sampling.top_p = 1.5f;
  expect_rejected(r, errc::invalid_argument, "top_p must be in (0, 1], got 1.5");
  r = valid_request();
  r.sampling.top_k = -1;
  expect_rejected(r, errc::invalid_argument, "top_k must be >= 0");
  r = valid_request();
  r.sampling.presence_penalty = 2.5f;
  expect_rejected(r, errc::invalid_argument, "presence_penalty must be in [-2, 2], got 2.5");
  r = valid_request();
  r.sampling.frequency_penalty = -3.0f;
  expect_rejected(r, errc::invalid_argument, "frequency_penalty must be in [-2, 2], got -3");
  r = valid_request();
  r.sampling.repetition_penalty = 0.0f;
  expect_rejected(r, errc::invalid_argument, "repetition_penalty must be in (0, 10] (1 disables it), got 0");
  r = valid_request();
  r.sampling.logit_bias = {{512, 1.0f}};  // the bundled model's vocabulary: ids 0..511
  expect_rejected(r, errc::invalid_argument, "logit_bias names token 512, outside the vocabulary [0, 512)");
  r.sampling.logit_bias = {{3, 150.0f}};
  expect_rejected(r, errc::invalid_argument, "logit_bias of token 3 must be in [-100, 100], got 150");
  r.sampling.logit_bias = {{3, 1.0f}, {3, 2.0f}};
  expect_rejected(r, errc::invalid_argument, "logit_bias names token 3 twice");
  r.sampling.logit_bias.assign(301, {3, 1.0f});
  expect_rejected(r, errc::invalid_argument, "logit_bias may hold at most 300 tokens, got 301");

  r = valid_request();
  r.stop = {"ok", ""};
  expect_rejected(r, errc::invalid_argument, "stop string must have 1 to 256 bytes");
  r.stop = {std::string("\xff" "a")};
  expect_rejected(r, errc::invalid_utf8, "stop string");
  r.stop = {std::string("\xe2\x82")};  // a truncated character
  expect_rejected(r, errc::invalid_utf8, "stop string");
  r.stop.assign(17, "x");
  expect_rejected(r, errc::invalid_argument, "at most 16 stop strings");
  r = valid_request();
  r.stop_token_ids = {600};
  expect_rejected(r, errc::invalid_argument, "stop token id 600 is outside the vocabulary");
}

TEST(EngineInput, DuplicateRequestIdsAreRejectedWhileLive) {
  auto e = make_engine();
  ASSERT_TRUE(e->add_request(valid_request()).has_value());
  const auto dup = e->add_request(valid_request());
  ASSERT_FALSE(dup.has_value());
  EXPECT_EQ(dup.error().code, errc::invalid_argument);
  EXPECT_NE(dup.error().message.find("duplicate request id 1"), std::string::npos) << dup.error().message;
  const outputs out = run_to_completion(*e);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_TRUE(e->add_request(valid_request()).has_value());  // finished: the id is free again
}

TEST(EngineInput, CreateRejectsBadConfigurations) {
  const testing::bundled& b = testing::model_and_tokenizer();
  auto expect_bad = [&](const engine_config& c, const tokenizer& t, const std::string& words) {
    SCOPED_TRACE(words);
    const auto e = engine::create(b.ck, t, c);
    ASSERT_FALSE(e.has_value());
    EXPECT_EQ(e.error().code, errc::invalid_argument);
    EXPECT_NE(e.error().message.find(words), std::string::npos) << e.error().message;
  };
  engine_config c;
  c.num_kv_blocks = 0;
  expect_bad(c, b.tok, "num_kv_blocks must be > 0, got 0");
  c = {};
  c.block_size = 0;
  expect_bad(c, b.tok, "block_size must be > 0, got 0");
  c = {};
  c.scheduler.max_num_batched_tokens = 0;
  expect_bad(c, b.tok, "max_num_batched_tokens must be > 0, got 0");
  c = {};
  c.scheduler.max_num_seqs = 0;
  expect_bad(c, b.tok, "max_num_seqs must be > 0, got 0");
  for (const double budget : {-1.0, 1e-9, 2e6, std::nan("")}) {
    c = {};
    c.scheduler.step_time_budget_ms = budget;
    expect_bad(c, b.tok, "step_time_budget_ms must be 0 (off) or in [0.000001, 1000000], got ");
  }
  c = {};
  c.scheduler.step_time_budget_ms = 2;
  c.scheduler.step_cost.token_ns = -3;
  expect_bad(c, b.tok, "the step cost model's parameters must be finite and >= 0, got -3");
  c = {};
  c.scheduler.kv_watermark = 1;
  expect_bad(c, b.tok, "kv_watermark must be in [0, 1), got 1");
  for (const int32_t window : {-1, 4097}) {
    c = {};
    c.scheduler.step_time_correction_window = window;
    expect_bad(c, b.tok, "step_time_correction_window must be in [0, 4096] (0: off), got " + std::to_string(window));
  }
  for (const int32_t slack : {-1, (1 << 20) + 1}) {
    c = {};
    c.scheduler.prefix_cache_slack_tokens = slack;
    expect_bad(c, b.tok, "prefix_cache_slack_tokens must be in [0, 1048576], got " + std::to_string(slack));
  }

  // The first 300 tokens of tok512.bin: a valid tokenizer for a different vocabulary.
  const std::string bytes = testing::read_file(testing::bundled_tokenizer());
  size_t at = 4;  // max_token_length
  for (int32_t i = 0; i < 300; i++) {
    int32_t length = 0;
    std::memcpy(&length, bytes.data() + at + 4, 4);
    at += 8 + static_cast<size_t>(length);
  }
  auto small = tokenizer::from_bytes(std::string_view(bytes).substr(0, at), 300, "tok300");
  ASSERT_TRUE(small.has_value()) << small.error().message;
  expect_bad({}, *small, "the tokenizer has 300 tokens but the model's vocabulary has 512");
}

// ---- output_stream -----------------------------------------------------------------------------

std::vector<int32_t> once_upon_a_time() {
  auto ids = tok().encode("Once upon a time", true, false);
  EXPECT_TRUE(ids.has_value());
  EXPECT_EQ(*ids, (std::vector<int32_t>{tokenizer::bos, 403, 407, 261, 378}));
  return std::vector<int32_t>(ids->begin() + 1, ids->end());
}

/// Pushes `tokens` and returns each delta, then finish()'s as the last entry.
std::vector<std::string> deltas(output_stream& out, const std::vector<int32_t>& tokens) {
  std::vector<std::string> all;
  for (int32_t t : tokens) {
    all.push_back(out.push(t).text);
    out.check_invariants();
  }
  all.push_back(out.finish().text);
  out.check_invariants();
  return all;
}

TEST(OutputStream, HoldsBackWhatCouldStartAStopString) {
  output_stream plain(tok(), {tokenizer::bos}, {});
  EXPECT_EQ(deltas(plain, once_upon_a_time()),
            (std::vector<std::string>{"Once", " upon", " a", " time", ""}));

  // "xyz" never matches, but the last 2 bytes are held back until the next token or the end.
  output_stream held(tok(), {tokenizer::bos}, {"xyz"});
  EXPECT_EQ(deltas(held, once_upon_a_time()),
            (std::vector<std::string>{"On", "ce up", "on", " a ti", "me"}));
  EXPECT_EQ(held.text(), "Once upon a time");
}

TEST(OutputStream, AStopStringSpanningTwoTokensEndsTheStream) {
  output_stream out(tok(), {tokenizer::bos}, {"e up", "time"});
  const std::vector<int32_t> ids = once_upon_a_time();
  const output_stream::delta first = out.push(ids[0]);  // "Once": "nce" could begin "e up"
  EXPECT_EQ(first.text, "O");
  EXPECT_FALSE(first.stopped);
  const output_stream::delta second = out.push(ids[1]);  // " upon" completes "e up"
  EXPECT_EQ(second.text, "nc");
  EXPECT_TRUE(second.stopped);
  EXPECT_EQ(out.text(), "Onc");
  EXPECT_EQ(out.finish().text, "");
  out.check_invariants();

  // Of two stop strings completed by the same token, the one that starts first wins.
  output_stream both(tok(), {tokenizer::bos}, {"upon a", "on a"});
  std::string streamed;
  bool stopped = false;
  for (int32_t t : ids) {
    const output_stream::delta d = both.push(t);
    streamed += d.text;
    if ((stopped = d.stopped)) break;
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(streamed, "Once ");
}

TEST(OutputStream, NeverSplitsAMultiByteCharacter) {
  auto byte = [](unsigned char b) { return tokenizer::first_byte_id + b; };
  // "é" = C3 A9, "日" = E6 97 A5, "本" = E6 9C AC, as byte tokens.
  const std::vector<int32_t> e_acute = {byte(0xC3), byte(0xA9)};
  const std::vector<int32_t> nichi = {byte(0xE6), byte(0x97), byte(0xA5)};
  const std::vector<int32_t> hon = {byte(0xE6), byte(0x9C), byte(0xAC)};

  output_stream out(tok(), {tokenizer::bos}, {"zz"});  // holds back 1 byte
  std::vector<int32_t> ids = e_acute;
  ids.insert(ids.end(), nichi.begin(), nichi.end());
  ids.push_back(byte('a'));
  // Byte tokens complete characters only at their last byte; the held-back byte then moves
  // back to the character's start.
  EXPECT_EQ(deltas(out, ids), (std::vector<std::string>{"", "", "", "", "\xc3\xa9", "\xe6\x97\xa5", "a"}));

  // A stop string made of multi-byte characters: every delta is whole UTF-8.
  output_stream stop(tok(), {tokenizer::bos}, {"\xe6\x97\xa5\xe6\x9c\xac"});  // "日本"
  std::vector<int32_t> text = e_acute;
  text.push_back(byte('b'));
  text.insert(text.end(), nichi.begin(), nichi.end());
  text.insert(text.end(), hon.begin(), hon.end());
  text.push_back(byte('c'));
  std::string streamed;
  bool stopped = false;
  for (int32_t t : text) {
    const output_stream::delta d = stop.push(t);
    stop.check_invariants();
    EXPECT_TRUE(utf8::validate(d.text).has_value());
    streamed += d.text;
    if ((stopped = d.stopped)) break;
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(streamed, "\xc3\xa9" "b");
  EXPECT_EQ(stop.text(), "\xc3\xa9" "b");

  // An incomplete character at the end becomes U+FFFD.
  output_stream tail(tok(), {tokenizer::bos}, {});
  EXPECT_EQ(deltas(tail, {byte('a'), byte(0xE6), byte(0x97)}),
            (std::vector<std::string>{"a", "", "", "\xef\xbf\xbd"}));
}

}  // namespace
}  // namespace troupe::engine
