// The actor layer under CAF's test coordinator: one thread, a virtual clock, the executor on the
// scheduler (not detached), so every interleaving below is the same on every run. Each request
// goes the whole way (client -> load balancer -> request -> engine -> executor and back) and its
// answer is compared with the single-sequence reference generator, byte and bit for bit.
// Covers: one request's flow and timings, stop strings, seeds drawn and reported, cancel (also
// before the balancer answered), a client killed mid-stream, executor failures (injected and
// killed), bad requests, overload, routing over two engines, client timeouts (first token,
// between tokens, non-streamed), the balancer's heartbeat over a frozen engine, and
// serialization of every registered message type.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <regex>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/system/atoms.hpp"
#include "actors/system/cluster_messages.hpp"
#include "actors/load_balancer_actor.hpp"
#include "messages/control.hpp"
#include "messages/engine.hpp"
#include "messages/executor.hpp"
#include "runtime/cost/calibration.hpp"
#include "tests/support/actor_harness.hpp"
#include "tests/support/failing_executor.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

/// The finish reason the reference generator's output implies.
engine::finish_reason expected_finish(const generate::generation& ref, const msg::completion_request& r) {
  const int32_t last = ref.tokens.empty() ? -1 : ref.tokens.back();
  if (!r.ignore_eos && (last == tokenizer::bos || last == tokenizer::eos)) return engine::finish_reason::stop;
  return engine::finish_reason::length;
}

class ActorsDeterministic : public ::testing::Test {
 protected:
  caf::actor_system_config cfg_;
  caf::actor_system sys_{configure(cfg_, /*deterministic=*/true)};
  caf::scheduler::test_coordinator& sched_{dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())};
  model::transformer oracle_{*bundled_shared().ck};
  actors::engine_list engines_;
  actors::balancer_actor lb_;
  std::vector<actors::client_actor> clients_;
  size_t num_idle_actors_ = 0;  // engines, executors and the balancer

  /// Spawns `num_engines` engines with `o` behind one balancer and runs until idle; `kinds`
  /// as in spawn_balancer.
  void start(actors::engine_options o = engine_opts(false), int num_engines = 1,
             const std::vector<balance::engine_kind>& kinds = {}) {
    sched_.clock().current_time += 1h;  // away from 0: a zero duration would pass unnoticed
    for (int i = 0; i < num_engines; i++) engines_.push_back(spawn_engine_or_die(sys_, o));
    lb_ = spawn_balancer(sys_, engines_, kinds);
    sched_.run();
    num_idle_actors_ = sys_.registry().running();
  }

  void TearDown() override {
    for (const actors::client_actor& c : clients_) caf::anon_send_exit(c, caf::exit_reason::kill);
    for (const actors::engine_actor& e : engines_) caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
    if (lb_) caf::anon_send_exit(lb_, caf::exit_reason::user_shutdown);
    sched_.run();
    EXPECT_EQ(sys_.registry().running(), 0u) << "an actor outlived its engine and balancer";
  }

  /// A prefill engine and two decode engines behind one balancer (engines_ in that order).
  void start_disaggregated() {
    start(engine_opts(false), 3,
          {balance::engine_kind::prefill, balance::engine_kind::decode, balance::engine_kind::decode});
  }

  std::shared_ptr<client_log> submit(const msg::completion_request& r) {
    auto log = std::make_shared<client_log>();
    clients_.push_back(spawn_logged_client(sys_, lb_, r, log));
    return log;
  }

  /// Runs one message at a time, the virtual clock advancing 1 ms after each, until `done()`.
  template <class Predicate>
  void run_until(Predicate done) {
    while (!done()) {
      ASSERT_TRUE(sched_.try_run_once()) << "went idle before the condition held";
      sched_.advance_time(1ms);
    }
  }

  /// Runs every message, advancing the clock 1 ms after each, until nothing is left.
  void run_ticking() { testing::run_ticking(sched_); }

  /// Asks `dest` (idle actors only: this runs the scheduler until nothing is left).
  template <class T, class Handle, class Atom>
  T ask(const Handle& dest, Atom atom) {
    return ask_idle<T>(sys_, sched_, dest, atom);
  }

  msg::engine_report report(size_t engine = 0) { return ask<msg::engine_report>(engines_.at(engine), actors::stats_atom::value); }

  /// The engine holds no request and no KV block, and only the long-lived actors run.
  void expect_engine_idle(size_t engine = 0) {
    const msg::engine_report r = report(engine);
    EXPECT_EQ(r.num_requests, 0);
    EXPECT_EQ(r.num_waiting, 0);
    EXPECT_EQ(r.num_blocks_in_use, 0);
    EXPECT_EQ(sys_.registry().running(), num_idle_actors_) << "a request or client actor is still alive";
  }

  /// Submits `r`, cancels it once three tokens arrived, runs to the end; expects a completion
  /// that ended "cancelled" and returns it.
  actors::completion cancel_after_three_tokens(const msg::completion_request& r) {
    auto log = submit(r);
    run_until([&] { return log->tokens().size() >= 3; });
    caf::anon_send(clients_.back(), msg::cancel_request{});
    run_ticking();
    EXPECT_EQ(log->num_done, 1);
    if (!log->outcome || !log->outcome->has_value()) {
      ADD_FAILURE() << (log->outcome ? log->outcome->error().message : "no outcome");
      return {};
    }
    EXPECT_EQ((*log->outcome)->end.finish_reason, engine::finish_reason::cancelled);
    return **log->outcome;
  }

  /// Submits `r`, runs to the end and checks the completion against the reference.
  actors::completion run_and_check(const msg::completion_request& r, const std::string& what) {
    auto log = submit(r);
    run_ticking();
    EXPECT_EQ(log->num_done, 1) << what;
    if (!log->outcome || !log->outcome->has_value()) {
      ADD_FAILURE() << what << ": " << (log->outcome ? log->outcome->error().message : "no outcome");
      return {};
    }
    const actors::completion& c = **log->outcome;
    const generate::generation ref = reference(oracle_, r);
    expect_matches(c, ref, what);
    EXPECT_EQ(c.end.finish_reason, expected_finish(ref, r)) << what;
    return c;
  }
};

// ---- one request, all the way --------------------------------------------------------------

TEST_F(ActorsDeterministic, OneRequestStreamsTheReferenceOutput) {
  start();
  const msg::completion_request r = make_completion("Once upon a time, there was a dog", 60, 4242, 1.0f, 0.9f);
  auto log = submit(r);
  run_ticking();

  ASSERT_EQ(log->num_done, 1);
  ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
  const actors::completion& c = **log->outcome;
  const generate::generation ref = reference(oracle_, r);
  ASSERT_GT(ref.tokens.size(), 10u);
  // The stream, chunk by chunk, is the completion: one token per chunk, the text in between.
  EXPECT_EQ(log->tokens(), ref.tokens);
  EXPECT_EQ(log->text(), ref.text);
  EXPECT_GE(log->chunks.size(), ref.tokens.size());
  for (const msg::completion_chunk& ch : log->chunks) EXPECT_LE(ch.tokens.size(), 1u);
  expect_matches(c, ref, "one request");

  const msg::completion_end& end = c.end;
  EXPECT_EQ(end.request_id, 0);
  for (const msg::completion_chunk& ch : log->chunks) EXPECT_EQ(ch.request_id, end.request_id);
  EXPECT_EQ(end.finish_reason, expected_finish(ref, r));
  EXPECT_EQ(end.seed, 4242u);
  EXPECT_EQ(end.num_prompt_tokens, static_cast<int32_t>(bundled_shared().tok->encode(r.prompt, true, false)->size()));
  EXPECT_EQ(end.num_generated_tokens, static_cast<int32_t>(ref.tokens.size()));
  // Virtual time: 1 ms per message, so every interval is a positive whole number of ms.
  ASSERT_EQ(end.itl_ns.size(), ref.tokens.size() - 1);
  EXPECT_GT(end.ttft_ns, 0);
  for (int64_t gap : end.itl_ns) EXPECT_GT(gap, 0);
  const int64_t first_to_last = std::accumulate(end.itl_ns.begin(), end.itl_ns.end(), int64_t{0});
  EXPECT_GE(end.e2e_ns, end.ttft_ns + first_to_last);
  EXPECT_EQ(end.e2e_ns % 1000000, 0);

  expect_engine_idle();
  const msg::engine_report rep = report();
  EXPECT_EQ(rep.num_generated_tokens, static_cast<int64_t>(ref.tokens.size()));
  EXPECT_EQ(rep.num_executor_failures, 0);
  EXPECT_GT(rep.executor_busy_ns, 0);
  EXPECT_LE(rep.executor_busy_ns, rep.elapsed_ns);
}

/// The prefill chunks a step time budget cuts a prompt of `num_prompt_tokens` into, alone in
/// its engine, by a plain search over chunk sizes (the scheduler solves the quadratic instead).
std::vector<int32_t> predicted_chunks(const cost::cost_params& p, int64_t budget_ns, int32_t num_prompt_tokens) {
  std::vector<int32_t> chunks;
  for (int32_t c = 0; c < num_prompt_tokens;) {
    int32_t q = 0;
    while (c + q < num_prompt_tokens) {
      const int32_t n = q + 1;
      const cost::step_features f{1, static_cast<double>(n), c + n == num_prompt_tokens ? 1.0 : 0.0,
                              cost::chunk_attention_tokens(c, n), static_cast<double>(c + n)};
      if (cost::predict_ns(p, f) > budget_ns) break;
      q = n;
    }
    chunks.push_back(std::max(q, 1));  // alone in its step, a chunk takes at least one token
    c += chunks.back();
  }
  return chunks;
}

TEST_F(ActorsDeterministic, ATimeBudgetCutsPrefillAsPredictedAndChangesNoOutput) {
  // The fit of tests/chunk_budget_test.cpp: a chunk of q tokens from position c costs
  // q² + (11 + 2c)q ns on top of a 1 µs step; the budget is 2 µs.
  const std::string log_path = (std::filesystem::temp_directory_path() / "troupe_time_budget_steps.csv").string();
  std::remove(log_path.c_str());
  actors::engine_options o = engine_opts(false);
  o.config.scheduler.step_time_budget_ms = 0.002;
  o.config.scheduler.step_cost = {1000, 10, 50, 2, 0};
  // The model alone cuts the chunks: this CPU's measured steps would correct it (and the chunks
  // would then depend on the machine's speed; tests/engine_test.cpp tests the correction).
  o.config.scheduler.step_time_correction_window = 0;
  o.step_log = log_path;
  o.check_invariants_every = 1;  // engine_core::check_step after every step
  start(o);
  msg::completion_request r = make_completion(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine with "
      "her dog and her big red ball.", 20, 31, 1.0f, 0.9f);
  r.ignore_eos = true;
  run_and_check(r, "time budget");  // equal to the reference, as every token-budget run is
  const auto num_prompt_tokens = static_cast<int32_t>(bundled_shared().tok->encode(r.prompt, true, false)->size());
  const std::vector<int32_t> want = predicted_chunks(o.config.scheduler.step_cost, 2000, num_prompt_tokens);
  ASSERT_GE(want.size(), 3u);
  EXPECT_EQ(want[0], 26);  // 962 ns of the 1000 the step leaves
  EXPECT_LT(want[want.size() - 2], want[0]);  // later chunks attend to more: fewer tokens
  auto steps = cost::read_step_log(log_path);
  ASSERT_TRUE(steps.has_value()) << steps.error().message;
  std::vector<int32_t> got;
  for (const cost::step_sample& s : *steps) got.push_back(static_cast<int32_t>(s.first.num_tokens));
  std::vector<int32_t> want_steps = want;
  want_steps.insert(want_steps.end(), 19, 1);  // then one decode row per step
  EXPECT_EQ(got, want_steps);
  std::remove(log_path.c_str());
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, WithoutStreamingOneChunkCarriesTheWholeCompletion) {
  start();
  msg::completion_request r = make_completion("Once upon a time, there was a dog", 60, 4242, 1.0f, 0.9f);
  r.stream = false;
  auto log = submit(r);
  run_ticking();
  ASSERT_EQ(log->num_done, 1);
  ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
  const generate::generation ref = reference(oracle_, r);
  ASSERT_EQ(log->chunks.size(), 1u);
  EXPECT_EQ(log->chunks[0].tokens, ref.tokens);
  EXPECT_EQ(log->chunks[0].text, ref.text);
  expect_matches(**log->outcome, ref, "not streamed");
  EXPECT_EQ((*log->outcome)->end.itl_ns.size(), ref.tokens.size() - 1);  // timings as when streamed
}

TEST_F(ActorsDeterministic, GreedyAndLengthEndsMatchTheReference) {
  start();
  // Greedy from "Once upon a time": the model's first story, cut by max_tokens.
  const actors::completion greedy = run_and_check(make_completion("Once upon a time", 30, 7, 0.0f), "greedy");
  EXPECT_EQ(greedy.end.finish_reason, engine::finish_reason::length);
  // ignore_eos runs past the end of a story, to exactly max_tokens.
  msg::completion_request long_one = make_completion("Lily", 300, 99);
  long_one.ignore_eos = true;
  const actors::completion c = run_and_check(long_one, "ignore_eos");
  EXPECT_EQ(c.tokens.size(), 300u);
  EXPECT_EQ(c.end.finish_reason, engine::finish_reason::length);
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, ASpeculatingEngineStreamsTheReferencesGreedyOutput) {
  // n-gram drafts verified in the executor's step: several tokens a step reach each client as
  // one stream, the last one with its finish (issue 17).
  actors::engine_options o = engine_opts(false);
  o.config.speculation.drafter = spec::drafter_kind::ngram;
  o.config.speculation.num_speculative_tokens = 5;
  start(o);
  msg::completion_request long_one = make_completion("Once upon a time", 300, 7, 0.0f);
  long_one.ignore_eos = true;
  run_and_check(long_one, "long greedy");
  std::vector<std::pair<std::shared_ptr<client_log>, msg::completion_request>> logs;
  for (size_t i = 0; i < 6; i++) {
    const msg::completion_request r = make_completion(story_window(i), 60 + 10 * static_cast<int32_t>(i), 30 + i, 0.0f);
    logs.emplace_back(submit(r), r);
  }
  run_ticking();
  for (const auto& [log, r] : logs) {
    ASSERT_EQ(log->num_done, 1);
    ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
    expect_matches(**log->outcome, reference(oracle_, r), "concurrent greedy");
  }
  EXPECT_GT(report().num_accepted_drafts, 0);
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, StopStringEndsTheStreamAndReleasesTheEngine) {
  start();
  msg::completion_request r = make_completion("Once upon a time", 80, 11, 0.0f);
  const generate::generation ref = reference(oracle_, r);
  // A stop string from the middle of the reference text: the output ends just before it.
  const size_t at = ref.text.find(" named");
  ASSERT_NE(at, std::string::npos) << ref.text;
  r.stop = {" named"};
  auto log = submit(r);
  run_ticking();
  ASSERT_EQ(log->num_done, 1);
  ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
  const actors::completion& c = **log->outcome;
  EXPECT_EQ(c.text, ref.text.substr(0, at));
  EXPECT_EQ(c.end.finish_reason, engine::finish_reason::stop);
  ASSERT_LT(c.tokens.size(), ref.tokens.size());
  EXPECT_EQ(c.tokens, std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + c.tokens.size()));
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, AnUnseededRequestReportsTheSeedThatReplaysIt) {
  start();
  msg::completion_request r = make_completion("The cat sat", 40, 0);
  r.has_seed = false;
  auto a = submit(r);
  auto b = submit(r);
  run_ticking();
  ASSERT_TRUE(a->outcome && a->outcome->has_value());
  ASSERT_TRUE(b->outcome && b->outcome->has_value());
  const actors::completion& ca = **a->outcome;
  const actors::completion& cb = **b->outcome;
  EXPECT_NE(ca.end.seed, cb.end.seed) << "two requests drew the same seed";
  for (const actors::completion* c : {&ca, &cb}) {
    msg::completion_request replay = r;
    replay.has_seed = true;
    replay.seed = c->end.seed;
    expect_matches(*c, reference(oracle_, replay), "replayed seed");
  }
}

// ---- cancel and lost clients ---------------------------------------------------------------

TEST_F(ActorsDeterministic, CancelMidStreamEndsCancelledAndFreesThePool) {
  // 32 blocks of 16 = 512 tokens = the model's context: one full-length sequence fills the pool.
  start(engine_opts(false, /*num_kv_blocks=*/32));
  msg::completion_request r = make_completion("A big red ball", 200, 5);
  r.ignore_eos = true;
  const actors::completion c = cancel_after_three_tokens(r);
  const generate::generation ref = reference(oracle_, r);
  ASSERT_GE(c.tokens.size(), 3u);
  ASSERT_LT(c.tokens.size(), 10u);  // the cancel came within a step or two
  EXPECT_EQ(c.tokens, std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + c.tokens.size()));
  EXPECT_EQ(c.end.num_generated_tokens, static_cast<int32_t>(c.tokens.size()));
  expect_engine_idle();
  EXPECT_LT(report().num_generated_tokens, 12);  // the engine stopped generating for it

  // A request that needs every block of the pool runs to its end.
  msg::completion_request whole = make_completion("", 511, 6);
  whole.ignore_eos = true;
  const actors::completion w = run_and_check(whole, "whole pool");
  EXPECT_EQ(w.tokens.size(), 511u);
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, CancelBeforeTheBalancerAnswersIsNotLost) {
  start();
  msg::completion_request r = make_completion("A big red ball", 200, 5);
  r.ignore_eos = true;
  auto log = submit(r);
  caf::anon_send(clients_.back(), msg::cancel_request{});  // queued behind the client's start
  run_ticking();
  ASSERT_EQ(log->num_done, 1);
  ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
  EXPECT_EQ((*log->outcome)->end.finish_reason, engine::finish_reason::cancelled);
  EXPECT_LT((*log->outcome)->tokens.size(), 10u);
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, AKilledClientReleasesItsRequestAndTheEngineServesOn) {
  start(engine_opts(false, /*num_kv_blocks=*/32));
  msg::completion_request r = make_completion("A big red ball", 200, 5);
  r.ignore_eos = true;
  auto log = submit(r);
  run_until([&] { return log->tokens().size() >= 3; });
  caf::anon_send_exit(clients_.back(), caf::exit_reason::kill);
  run_ticking();

  EXPECT_EQ(log->num_done, 0);  // a killed client hears nothing more
  expect_engine_idle();         // its request actor quit and the engine freed the blocks
  EXPECT_LT(report().num_generated_tokens, 12);

  msg::completion_request whole = make_completion("", 511, 6);
  whole.ignore_eos = true;
  EXPECT_EQ(run_and_check(whole, "after a lost client").tokens.size(), 511u);
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, AClientKilledBeforeTheBalancerAnswersLeavesNothingBehind) {
  start();
  msg::completion_request r = make_completion("A big red ball", 200, 5);
  r.ignore_eos = true;
  auto log = submit(r);
  caf::anon_send_exit(clients_.back(), caf::exit_reason::kill);  // before its request is routed
  run_ticking();
  EXPECT_EQ(log->num_done, 0);
  expect_engine_idle();
  EXPECT_LT(report().num_generated_tokens, 10);
}

TEST_F(ActorsDeterministic, AnEngineThatDiesWithNoOtherFailsItsRequestsAndTakesItsExecutor) {
  start();
  msg::completion_request r = make_completion("The sun was shining", 100, 21);
  r.ignore_eos = true;
  auto log = submit(r);
  run_until([&] { return log->tokens().size() >= 2; });
  caf::anon_send_exit(engines_[0], caf::exit_reason::kill);
  run_ticking();
  ASSERT_EQ(log->num_done, 1);
  ASSERT_FALSE(log->outcome->has_value());
  EXPECT_EQ(log->outcome->error().code, errc::unavailable) << log->outcome->error().message;
  // Placed again, it finds no engine: the balancer's answer names the lost one.
  EXPECT_EQ(log->outcome->error().message, "no live engine can serve the request; engine 'engine0' on node 'local' is lost");
  EXPECT_EQ(sys_.registry().running(), 1u) << "only the balancer is left: the executor quit with its engine";
}

// ---- executor failures ---------------------------------------------------------------------

TEST_F(ActorsDeterministic, AnInjectedExecutorFailureMidBatchResumesItsRequestsWithTheUndisturbedOutputs) {
  start(with_failing_executor(engine_opts(false)));
  const actors::executor_actor executor = ask<actors::executor_actor>(engines_[0], actors::executor_atom::value);
  ASSERT_TRUE(executor);
  msg::completion_request r = make_completion("The sun was shining", 100, 21, 1.0f, 0.9f);
  r.ignore_eos = true;
  const msg::completion_request first = r;
  auto a = submit(r);
  r.seed = 22;
  const msg::completion_request second = r;
  auto b = submit(r);
  run_until([&] { return a->tokens().size() >= 2 && b->tokens().size() >= 2; });
  caf::anon_send(caf::actor_cast<failing_executor_actor>(executor), fail_next_plan_atom::value, std::string("boom"));
  run_ticking();

  for (const auto& [log, req] : {std::pair{a, first}, std::pair{b, second}}) {
    ASSERT_EQ(log->num_done, 1);
    ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
    const generate::generation ref = reference(oracle_, req);
    EXPECT_EQ(log->tokens(), ref.tokens);  // one continuous stream: nothing repeated or lost
    expect_matches(**log->outcome, ref, "resumed");
  }
  const msg::engine_report rep = report();
  EXPECT_EQ(rep.num_executor_failures, 1);
  const actors::executor_actor replacement = ask<actors::executor_actor>(engines_[0], actors::executor_atom::value);
  EXPECT_TRUE(replacement);
  EXPECT_NE(replacement, executor);
  expect_engine_idle();  // the failed executor is gone, its replacement counted in its place
  run_and_check(make_completion("The sun was shining", 50, 23, 1.0f, 0.9f), "after the failure");
  EXPECT_EQ(report().num_executor_failures, 1);
}

TEST_F(ActorsDeterministic, AGrammarRequestResumedAfterAnExecutorFailureStillFollowsItsGrammar) {
  start(with_failing_executor(engine_opts(false)));
  const actors::executor_actor executor = ask<actors::executor_actor>(engines_[0], actors::executor_atom::value);
  ASSERT_TRUE(executor);
  msg::completion_request r = make_completion("The sun was shining", 120, 31, 1.0f);
  r.grammar_kind = "regex";
  r.grammar = " (the|a) [a-z]{3,9}( [a-z]{2,9}){6,12}[.]";
  auto log = submit(r);
  run_until([&] { return log->tokens().size() >= 4; });
  caf::anon_send(caf::actor_cast<failing_executor_actor>(executor), fail_next_plan_atom::value, std::string("boom"));
  run_ticking();
  ASSERT_EQ(log->num_done, 1);
  ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
  // The replacement executor rebuilt the sequence's grammar state from its resumed tokens.
  EXPECT_TRUE(std::regex_match((*log->outcome)->text, std::regex(r.grammar))) << (*log->outcome)->text;
  EXPECT_EQ((*log->outcome)->end.finish_reason, engine::finish_reason::stop);
  EXPECT_EQ(report().num_executor_failures, 1);
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, AKilledExecutorIsReplacedAndItsRequestResumes) {
  start();
  const actors::executor_actor executor = ask<actors::executor_actor>(engines_[0], actors::executor_atom::value);
  msg::completion_request r = make_completion("The sun was shining", 100, 21);
  r.ignore_eos = true;
  auto a = submit(r);
  run_until([&] { return a->tokens().size() >= 2; });
  caf::anon_send_exit(executor, caf::exit_reason::kill);
  run_ticking();
  ASSERT_EQ(a->num_done, 1);
  ASSERT_TRUE(a->outcome->has_value()) << a->outcome->error().message;
  expect_matches(**a->outcome, reference(oracle_, r), "resumed after the kill");
  EXPECT_EQ(report().num_executor_failures, 1);
  expect_engine_idle();
}

// ---- bad requests --------------------------------------------------------------------------

struct bad_case {
  std::string name;
  msg::completion_request request;
  errc code;
  std::string message_part;
};

TEST_F(ActorsDeterministic, BadRequestsGetClearErrors) {
  start();
  auto with = [](auto change) {
    msg::completion_request r = make_completion("Once upon a time", 20, 1);
    change(r);
    return r;
  };
  std::string words;
  for (int i = 0; i < 600; i++) words += "cat ";
  const std::vector<bad_case> cases = {
      {"600 words", with([&](auto& r) { r.prompt = words; }), errc::too_long, "exceeds the model's context of 512"},
      {"prompt + max_tokens > seq_len", with([](auto& r) { r.max_tokens = 510; }), errc::too_long,
       "exceeds the model's context"},
      {"max_tokens 0", with([](auto& r) { r.max_tokens = 0; }), errc::invalid_argument, "max_tokens must be > 0"},
      {"max_tokens -3", with([](auto& r) { r.max_tokens = -3; }), errc::invalid_argument, "max_tokens must be > 0"},
      {"temperature < 0", with([](auto& r) { r.temperature = -0.5f; }), errc::invalid_argument, "temperature"},
      {"temperature NaN", with([](auto& r) { r.temperature = std::nanf(""); }), errc::invalid_argument,
       "temperature"},
      {"top_p 0", with([](auto& r) { r.top_p = 0.0f; }), errc::invalid_argument, "top_p must be in (0, 1]"},
      {"top_p 1.5", with([](auto& r) { r.top_p = 1.5f; }), errc::invalid_argument, "top_p must be in (0, 1]"},
      {"top_k < 0", with([](auto& r) { r.top_k = -1; }), errc::invalid_argument, "top_k must be >= 0"},
      {"empty stop string", with([](auto& r) { r.stop = {"ok", ""}; }), errc::invalid_argument,
       "stop string must have 1 to 256 bytes"},
      {"invalid UTF-8 stop string", with([](auto& r) { r.stop = {"\xC3"}; }), errc::invalid_utf8, "stop string"},
      {"invalid UTF-8 prompt", with([](auto& r) { r.prompt = "Once \xFF\xFE upon"; }), errc::invalid_utf8, "invalid UTF-8 at byte offset 5"},
      // 512 tokens of at most 7 bytes: one byte more is refused before tokenizing, ...
      {"3585-byte prompt", with([](auto& r) { r.prompt = std::string(3585, 'a'); }), errc::too_long,
       "the prompt is 3585 bytes; a 512-token context holds at most 3584 (7 bytes per token at most)"},
      {"64 MiB prompt", with([](auto& r) { r.prompt = std::string(64 << 20, 'a'); }), errc::too_long,
       "the prompt is 67108864 bytes; a 512-token context holds at most 3584"},
      // ... while 3584 bytes are tokenized and refused by the engine in tokens.
      {"3584-byte prompt", with([](auto& r) { r.prompt = std::string(3584, 'a'); }), errc::too_long,
       "exceeds the model's context of 512"},
      {"unknown grammar kind", with([](auto& r) { r.grammar_kind = "xml"; r.grammar = "<a/>"; }), errc::invalid_argument,
       "grammar kind 'xml' is not one of json_schema, regex, gbnf"},
      {"bad regex", with([](auto& r) { r.grammar_kind = "regex"; r.grammar = "a{3,1}"; }), errc::invalid_argument,
       "a repeat {3,1} needs 0 <= min <= max"},
      {"bad schema", with([](auto& r) { r.grammar_kind = "json_schema"; r.grammar = R"({"type": "object", "if": {}})"; }),
       errc::invalid_argument, "#: the JSON Schema keyword 'if' is not supported"},
      {"grammar with ignore_eos", with([](auto& r) { r.grammar_kind = "regex"; r.grammar = "a"; r.ignore_eos = true; }),
       errc::invalid_argument, "ignore_eos cannot be combined with a grammar"},
      // Issue 47: admitted before, and its first automaton state stalled the executor's step.
      {"the 33-byte regex recipe", with([](auto& r) { r.grammar_kind = "regex"; r.grammar = "a{0,1000}{0,1000}{0,1000}{0,1000}"; }),
       errc::invalid_argument, "needs more than 65536 stacks for one state (num_stacks_per_state_max)"},
  };
  std::vector<std::shared_ptr<client_log>> logs;
  for (const bad_case& c : cases) logs.push_back(submit(c.request));
  run_ticking();
  for (size_t i = 0; i < cases.size(); i++) {
    const bad_case& c = cases[i];
    ASSERT_EQ(logs[i]->num_done, 1) << c.name;
    ASSERT_FALSE(logs[i]->outcome->has_value()) << c.name << " was accepted";
    EXPECT_EQ(logs[i]->outcome->error().code, c.code) << c.name << ": " << logs[i]->outcome->error().message;
    EXPECT_NE(logs[i]->outcome->error().message.find(c.message_part), std::string::npos)
        << c.name << ": " << logs[i]->outcome->error().message;
    EXPECT_TRUE(logs[i]->chunks.empty()) << c.name;
  }
  expect_engine_idle();
  EXPECT_EQ(report().num_steps, 0);
}

TEST_F(ActorsDeterministic, AGrammarRequestIsCompiledBeforeAdmissionAndItsOutputMatches) {
  start();
  msg::completion_request r = make_completion("Once upon a time", 120, 5, 1.0f);
  r.grammar_kind = "regex";
  r.grammar = " (He|She) had [1-9] (dogs|cats)[.]";
  std::vector<std::shared_ptr<client_log>> logs;
  for (int i = 0; i < 4; i++) {  // the same grammar four times: compiled once, cached
    r.seed = 5 + static_cast<uint64_t>(i);
    logs.push_back(submit(r));
  }
  run_ticking();
  for (const auto& log : logs) {
    ASSERT_EQ(log->num_done, 1);
    ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
    const actors::completion& c = **log->outcome;
    EXPECT_TRUE(std::regex_match(c.text, std::regex(r.grammar))) << c.text;
    EXPECT_EQ(c.end.finish_reason, engine::finish_reason::stop);
  }
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, ARequestReleasedWhileItsGrammarCompilesIsNeverAdmitted) {
  start();
  engine::request r;
  r.id = 77;
  r.prompt = {tokenizer::bos, 403};
  r.max_tokens = 50;
  r.grammar.kind = grammar::grammar_kind::regex;
  r.grammar.source = " (He|She) had [1-9] (dogs|cats)[.]";
  auto num_heard = std::make_shared<int>(0);
  // A request actor that submits and releases at once: the release reaches the engine before
  // the grammar actor's answer does.
  const caf::actor fake = sys_.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler([=](caf::scheduled_actor*, caf::message_view&) -> caf::result<caf::message> {
      ++*num_heard;
      return caf::message{};
    });
    self->send(engines_[0], msg::submit{r});
    self->send(engines_[0], msg::release{r.id});
    return {[](actors::ping_atom) {}};
  });
  run_ticking();
  EXPECT_EQ(*num_heard, 0);  // no token and no rejection: the request is gone
  EXPECT_EQ(report().num_steps, 0);
  caf::anon_send_exit(fake, caf::exit_reason::user_shutdown);
  sched_.run();
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, AnEmptyPromptGeneratesFromBos) {
  // Decision: the request actor always adds BOS, so "" is the valid request "start a story from
  // BOS" (as llama2.c with no prompt), not an error.
  start();
  const actors::completion c = run_and_check(make_completion("", 40, 3, 0.0f), "empty prompt");
  EXPECT_EQ(c.end.num_prompt_tokens, 1);
  EXPECT_EQ(c.text.rfind("Once upon a time", 0), 0u) << c.text;  // greedy from BOS
  expect_engine_idle();
}

// ---- overload ------------------------------------------------------------------------------

TEST_F(ActorsDeterministic, AFullWaitingQueueRejectsWithOverloaded) {
  actors::engine_options o = engine_opts(false);
  o.max_waiting = 2;
  start(o);
  std::vector<msg::completion_request> requests;
  std::vector<std::shared_ptr<client_log>> logs;
  for (int i = 0; i < 12; i++) {
    requests.push_back(make_completion("Tom had a ball " + std::to_string(i), 20, 100 + i));
    logs.push_back(submit(requests.back()));
  }
  run_ticking();
  int num_overloaded = 0;
  int num_completed = 0;
  for (size_t i = 0; i < logs.size(); i++) {
    ASSERT_EQ(logs[i]->num_done, 1) << i;
    if (logs[i]->outcome->has_value()) {
      num_completed++;
      expect_matches(**logs[i]->outcome, reference(oracle_, requests[i]), "request " + std::to_string(i));
    } else {
      num_overloaded++;
      EXPECT_EQ(logs[i]->outcome->error().code, errc::overloaded);
      EXPECT_NE(logs[i]->outcome->error().message.find("waiting queue is full (2 requests)"), std::string::npos)
          << logs[i]->outcome->error().message;
    }
  }
  // All 12 submits reach the engine before the executor's first result: the first request fills
  // both steps in flight (its prefill, and its first decode planned ahead), the next two wait,
  // the other nine find the waiting queue full.
  EXPECT_EQ(num_completed, 3);
  EXPECT_EQ(num_overloaded, 9);
  expect_engine_idle();
}

// ---- routing -------------------------------------------------------------------------------

TEST_F(ActorsDeterministic, DisaggregatedRequestsEqualTheReference) {
  start_disaggregated();
  std::vector<msg::completion_request> requests = {
      make_completion("Once upon a time, there was a dog", 40, 11, 1.0f, 0.9f),
      make_completion("Lily and Ben", 30, 12, 0.0f),
      make_completion("", 20, 13),  // BOS only: nothing to prefill, runs whole on a decode engine
      make_completion("The sun was shining and the birds were singing in the tall green trees", 50, 14)};
  std::vector<std::shared_ptr<client_log>> logs;
  for (const auto& r : requests) logs.push_back(submit(r));
  run_ticking();
  int64_t num_tokens = 0;
  for (size_t i = 0; i < requests.size(); i++) {
    ASSERT_EQ(logs[i]->num_done, 1);
    ASSERT_TRUE(logs[i]->outcome->has_value()) << logs[i]->outcome->error().message;
    expect_matches(**logs[i]->outcome, reference(oracle_, requests[i]), "request " + std::to_string(i));
    num_tokens += static_cast<int64_t>((*logs[i]->outcome)->tokens.size());
  }
  EXPECT_GT(report(0).num_steps, 0);
  EXPECT_EQ(report(0).num_generated_tokens, 0);  // the prefill engine samples nothing
  EXPECT_GT(report(1).num_generated_tokens, 0);
  EXPECT_GT(report(2).num_generated_tokens, 0);  // both decode engines got work
  EXPECT_EQ(report(1).num_generated_tokens + report(2).num_generated_tokens, num_tokens);
  for (size_t e = 0; e < 3; e++) expect_engine_idle(e);
}

TEST_F(ActorsDeterministic, ADecodeEngineLostDuringPrefillHasItsRequestPlacedAgain) {
  start_disaggregated();
  msg::completion_request r = make_completion("Once upon a time, there was a little girl named Lily", 40, 21);
  auto log = submit(r);
  // Until the prefill engine has the request: then kill the decode engine it will hand off to
  // (both decode engines are idle: the first, by index).
  run_until([&] { return sys_.registry().running() > num_idle_actors_ + 1; });  // client + request actor
  for (int i = 0; i < 4; i++) {
    sched_.run_once();
    sched_.advance_time(1ms);
  }
  ASSERT_TRUE(log->tokens().empty()) << "the kill must land before the handoff";
  caf::anon_send_exit(engines_[1], caf::exit_reason::kill);
  run_ticking();
  ASSERT_EQ(log->num_done, 1);
  ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
  EXPECT_EQ((*log->outcome)->tokens, reference(oracle_, r).tokens);  // as if nothing happened
  num_idle_actors_ -= 3;  // engine1, its executor and its grammar actor are gone
  expect_engine_idle(0);  // the prefill engine let go of the request and its blocks
  expect_engine_idle(2);
  // A later request goes to the surviving decode engine.
  const actors::completion c = run_and_check(make_completion("Ben had a red ball", 25, 22), "after the loss");
  EXPECT_EQ(report(2).num_generated_tokens, static_cast<int64_t>((*log->outcome)->tokens.size() + c.tokens.size()));
  engines_.erase(engines_.begin() + 1);
}

TEST_F(ActorsDeterministic, AnEngineLostMidStreamHasItsRequestsResumedElsewhereWithUnchangedOutput) {
  start(engine_opts(false), /*num_engines=*/2);
  // Sampled at temperature 1: the resumed request must take up the sampler's counter where the
  // lost engine left it.
  msg::completion_request r = make_completion("A big red ball", 60, 7, 1.0f);
  r.ignore_eos = true;
  auto log = submit(r);  // alone: engine 0 takes it (ties by index)
  run_until([&] { return log->tokens().size() >= 9; });
  caf::anon_send_exit(engines_[0], caf::exit_reason::kill);
  run_ticking();
  ASSERT_EQ(log->num_done, 1);
  ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
  const actors::completion& c = **log->outcome;
  const generate::generation ref = reference(oracle_, r);
  EXPECT_EQ(c.tokens, ref.tokens);  // none missing, none repeated
  EXPECT_EQ(c.text, ref.text);
  EXPECT_GT(report(1).num_generated_tokens, 0);       // engine 1 finished it
  EXPECT_LT(report(1).num_generated_tokens, 60);      // from where engine 0 left it
  num_idle_actors_ -= 3;  // engine0, its executor and its grammar actor are gone
  expect_engine_idle(1);
  engines_.erase(engines_.begin());
}

TEST_F(ActorsDeterministic, ADecodeEngineLostMidStreamHasItsRequestPrefilledAgainAfterItsTokens) {
  start_disaggregated();
  msg::completion_request r = make_completion("A big red ball", 50, 8, 1.0f);
  r.ignore_eos = true;
  auto log = submit(r);  // prefill0, then decode engine 1 (both decode engines idle: the first)
  run_until([&] { return log->tokens().size() >= 7; });
  caf::anon_send_exit(engines_[1], caf::exit_reason::kill);
  run_ticking();
  ASSERT_EQ(log->num_done, 1);
  ASSERT_TRUE(log->outcome->has_value()) << log->outcome->error().message;
  EXPECT_EQ((*log->outcome)->tokens, reference(oracle_, r).tokens);
  EXPECT_EQ((*log->outcome)->end.num_failovers, 1);
  // The prompt and the tokens already sent were prefilled again and handed to engine 2.
  EXPECT_GT(report(2).num_generated_tokens, 0);
  EXPECT_LT(report(2).num_generated_tokens, 50);
  num_idle_actors_ -= 3;
  expect_engine_idle(0);
  expect_engine_idle(2);
  engines_.erase(engines_.begin() + 1);
}

TEST_F(ActorsDeterministic, CancellingADisaggregatedRequestFreesBothEngines) {
  start_disaggregated();
  msg::completion_request r = make_completion("A big red ball", 300, 5);
  r.ignore_eos = true;
  (void)cancel_after_three_tokens(r);
  for (size_t e = 0; e < 3; e++) expect_engine_idle(e);
}

TEST_F(ActorsDeterministic, TwoEnginesShareConcurrentRequestsAndSequentialOnesGoToTheFirst) {
  start(engine_opts(false), /*num_engines=*/2);
  // One at a time: each finds both engines idle and takes the first (ties by index).
  int64_t sequential_tokens = 0;
  for (int i = 0; i < 2; i++)
    sequential_tokens += static_cast<int64_t>(run_and_check(make_completion("Ben ran", 15, 50 + i), "sequential").tokens.size());
  EXPECT_EQ(report(0).num_generated_tokens, sequential_tokens);
  EXPECT_EQ(report(1).num_steps, 0);

  // Four at once: they alternate, ids 2 and 4 on engine 0, ids 3 and 5 on engine 1.
  std::vector<msg::completion_request> requests;
  std::vector<std::shared_ptr<client_log>> logs;
  for (int i = 0; i < 4; i++) {
    requests.push_back(make_completion("Ben ran " + std::to_string(i), 15, 60 + i));
    logs.push_back(submit(requests.back()));
  }
  run_ticking();
  int64_t tokens_per_engine[2] = {0, 0};
  for (size_t i = 0; i < logs.size(); i++) {
    ASSERT_TRUE(logs[i]->outcome && logs[i]->outcome->has_value());
    const actors::completion& c = **logs[i]->outcome;
    expect_matches(c, reference(oracle_, requests[i]), "concurrent");
    EXPECT_EQ(c.end.request_id, static_cast<int64_t>(2 + i));
    tokens_per_engine[c.end.request_id % 2] += static_cast<int64_t>(c.tokens.size());
  }
  EXPECT_EQ(report(0).num_generated_tokens, sequential_tokens + tokens_per_engine[0]);
  EXPECT_EQ(report(1).num_generated_tokens, tokens_per_engine[1]);
  expect_engine_idle(0);
  expect_engine_idle(1);
}

// ---- requests without a usable sender ------------------------------------------------------
// CAF 0.17.6's BASP can deliver a remote message with no sender (msg::submit_completion says
// when). Monitoring that null handle crashed the server; anon_send makes the same message here.

TEST_F(ActorsDeterministic, RequestThatNamesNoClientIsRefusedAndLeavesNothing) {
  start();
  const msg::completion_request r = make_completion("Once upon a time", 20, 7, 0.0f);
  caf::anon_send(lb_, msg::submit_completion{r, actors::stream_receiver_actor{}});
  run_ticking();
  expect_engine_idle();
  EXPECT_EQ(report().num_generated_tokens, 0);
  std::shared_ptr<client_log> log = submit(r);
  run_ticking();
  ASSERT_TRUE(log->outcome.has_value() && log->outcome->has_value());
  expect_matches(log->outcome->value(), reference(oracle_, r), "after a refused request");
  EXPECT_EQ(log->outcome->value().end.request_id, 0) << "a refused request took no id";
}

TEST_F(ActorsDeterministic, EngineDropsWorkThatNamesNoRequestActor) {
  start();
  engine::request q;
  q.id = 41;
  q.prompt = {tokenizer::bos, 400, 401};
  q.max_tokens = 8;
  caf::anon_send(engines_[0], msg::submit{q});
  q.id = 42;
  caf::anon_send(engines_[0], msg::submit_prefill{q, engines_[0], "", 0});
  q.id = 43;
  caf::anon_send(engines_[0], msg::kv_handoff{q, actors::request_actor{}, {}, 0});
  run_ticking();
  expect_engine_idle();
  EXPECT_EQ(report().num_generated_tokens, 0);
}

TEST_F(ActorsDeterministic, RequestForAClientAlreadyGoneLeavesNothing) {
  start();
  // No behaviour: it quits at once.
  const auto gone = caf::actor_cast<actors::stream_receiver_actor>(sys_.spawn([](caf::event_based_actor*) {}));
  sched_.run();
  caf::anon_send(lb_, msg::submit_completion{make_completion("Once upon a time", 200, 7), gone});
  run_ticking();
  expect_engine_idle();
}

// ---- owners only, and the published front (issue 21, points 2 and 4) ----------------------
// Any actor that learns a handle can send it any message its interface lists: the request
// actor's handle goes back to whoever submitted, engine and balancer handles travel between
// nodes. What each actor honours is therefore decided by who sent it.

/// What a bare stream receiver got (no client logic: it never cancels on its own).
struct stream_log {
  int64_t request_id = 0;
  std::vector<int32_t> tokens;
  std::optional<msg::completion_end> end;
  std::optional<msg::completion_error> error;
};

actors::stream_receiver_actor spawn_receiver(caf::actor_system& sys, std::shared_ptr<stream_log> log) {
  return sys.spawn([log]() -> actors::stream_receiver_actor::behavior_type {
    return {
        [log](msg::completion_chunk& c) {
          log->request_id = c.request_id;
          log->tokens.insert(log->tokens.end(), c.tokens.begin(), c.tokens.end());
        },
        [log](msg::completion_end& e) { log->end = e; },
        [log](msg::completion_error& e) { log->error = e; },
    };
  });
}

TEST_F(ActorsDeterministic, ForgedCancelsReleasesTokensAndRejectionsFromOtherActorsDoNotChangeTheStream) {
  start();
  msg::completion_request r = make_completion("A big red ball", 40, 5);
  r.ignore_eos = true;
  auto log = std::make_shared<stream_log>();
  const actors::stream_receiver_actor owner = spawn_receiver(sys_, log);
  // A stranger submits on the owner's behalf, so it holds the request actor's handle.
  auto request = std::make_shared<actors::request_actor>();
  sys_.spawn([=](caf::event_based_actor* self) {
    self->request(lb_, caf::infinite, msg::submit_completion{r, owner, 1})
        .then([=](actors::request_actor& a) { *request = a; });
  });
  run_until([&] { return log->tokens.size() >= 3; });
  ASSERT_TRUE(*request);
  // With the right id: a cancel to the request actor, a release to the engine, from the
  // stranger and with no sender at all.
  const int64_t id = log->request_id;
  // And tokens, a rejection and an end in the engine's name, from the stranger and from nobody:
  // a request actor takes them only from the engines serving it.
  const msg::sampled forged_token{id, 0, 7, -0.5f, {}, engine::finish_reason::stop, 0, 0, 0, 0};
  const msg::rejected forged_rejection{id, errc::internal, "forged"};
  // And word that its engine is lost, which only the balancer gives: it would make the request
  // recompute elsewhere (and fail after max_failovers), here with no engine left to go to.
  const msg::engine_lost forged_loss{engines_[0], "forged"};
  sys_.spawn([=](caf::event_based_actor* self) {
    self->send(*request, msg::cancel_request{id});
    self->send(engines_[0], msg::release{id});
    self->send(*request, forged_token);
    self->send(*request, forged_rejection);
    self->send(*request, forged_loss);
  });
  caf::anon_send(*request, msg::cancel_request{id});
  caf::anon_send(engines_[0], msg::release{id});
  caf::anon_send(*request, forged_token);
  caf::anon_send(*request, forged_rejection);
  caf::anon_send(*request, forged_loss);
  run_ticking();
  ASSERT_FALSE(log->error) << log->error->message;
  ASSERT_TRUE(log->end);
  EXPECT_EQ(log->end->num_failovers, 0);
  EXPECT_EQ(log->end->finish_reason, engine::finish_reason::length);
  EXPECT_EQ(log->tokens, reference(oracle_, r).tokens);
  caf::anon_send_exit(owner, caf::exit_reason::user_shutdown);
  sched_.run();
  expect_engine_idle();
}

TEST_F(ActorsDeterministic, ForgedReportsAndQueriesThroughTheFrontOrFromStrangersDoNotMovePlacement) {
  start(engine_opts(false), /*num_engines=*/2);
  const actors::balancer_client_actor front = actors::spawn_balancer_front(sys_, lb_);
  // Engine 1 claims to be full (a report "newer" than any real one): unchecked, the balancer
  // would send engine 1 nothing from now on.
  const msg::load_report full{1, 1000000, 1000000, 1000000000, 1000000000};
  auto num_refused = std::make_shared<int>(0);
  sys_.spawn([=](caf::event_based_actor* self) {
    const caf::actor as_any = caf::actor_cast<caf::actor>(front);  // what a peer can try
    self->send(as_any, full);
    self->send(as_any, actors::heartbeat_atom::value);
    for (auto refused : {self->request(as_any, caf::infinite, actors::engines_atom::value),
                         self->request(as_any, caf::infinite, msg::place_request{7, 10, 10, {}})})
      refused.then([](caf::message& m) { ADD_FAILURE() << "the front answered " << caf::to_string(m); },
                   [=](caf::error& e) {
                     EXPECT_EQ(e, caf::sec::unexpected_message);
                     ++*num_refused;
                   });
    // A stranger that knows the balancer itself (a cluster member): not the engine it names.
    self->send(lb_, full);
    self->send(lb_, actors::heartbeat_atom::value);
    self->request(lb_, caf::infinite, msg::place_request{7, 10, 10, {}}).then([=](msg::placement& p) {
      ++*num_refused;
      EXPECT_FALSE(p.decode);
      EXPECT_EQ(p.error, "a place_request from an actor that is not one of this balancer's request actors");
    });
  });
  run_ticking();
  EXPECT_EQ(*num_refused, 3);
  // Four at once through the front: they alternate, ids 0 and 2 on engine 0, 1 and 3 on engine 1.
  std::vector<msg::completion_request> requests;
  std::vector<std::shared_ptr<client_log>> logs;
  for (int i = 0; i < 4; i++) {
    requests.push_back(make_completion("Ben ran " + std::to_string(i), 15, 60 + i));
    logs.push_back(std::make_shared<client_log>());
    clients_.push_back(spawn_logged_client(sys_, front, requests.back(), logs.back()));
  }
  run_ticking();
  int64_t tokens_per_engine[2] = {0, 0};
  for (size_t i = 0; i < logs.size(); i++) {
    ASSERT_TRUE(logs[i]->outcome && logs[i]->outcome->has_value());
    const actors::completion& c = **logs[i]->outcome;
    expect_matches(c, reference(oracle_, requests[i]), "through the front");
    EXPECT_EQ(c.end.request_id, static_cast<int64_t>(i));
    tokens_per_engine[c.end.request_id % 2] += static_cast<int64_t>(c.tokens.size());
  }
  EXPECT_EQ(report(0).num_generated_tokens, tokens_per_engine[0]);
  EXPECT_EQ(report(1).num_generated_tokens, tokens_per_engine[1]);
  EXPECT_GT(tokens_per_engine[1], 0);
  caf::anon_send_exit(front, caf::exit_reason::user_shutdown);
  sched_.run();
  expect_engine_idle(0);
  expect_engine_idle(1);
}

TEST_F(ActorsDeterministic, TheConfiguredRouterPlacesRequestsOnRealEngines) {
  // round_robin over three engines, one request at a time (each finished before the next):
  // engines 0, 1, 2, 0 — least_loaded would have sent each to the idle engine 0.
  start(engine_opts(false), /*num_engines=*/3);
  caf::anon_send_exit(lb_, caf::exit_reason::user_shutdown);
  actors::load_balancer_options o;
  o.engines = actors::mixed_engines(engines_);
  o.tok = bundled_shared().tok;
  o.router = "round_robin";
  lb_ = actors::spawn_load_balancer(sys_, std::move(o));
  sched_.run();
  int64_t tokens[3] = {0, 0, 0};
  for (int i = 0; i < 4; i++) {
    const actors::completion c = run_and_check(make_completion("Tim had a ball " + std::to_string(i), 9 + i, 40 + i),
                                               "round_robin " + std::to_string(i));
    tokens[i % 3] += static_cast<int64_t>(c.tokens.size());
  }
  for (size_t e = 0; e < 3; e++) {
    EXPECT_EQ(report(e).num_generated_tokens, tokens[e]) << "engine " << e;
    expect_engine_idle(e);
  }
}

/// What engines generated (per engine) and the cached prompt tokens of two continuations.
struct prefix_run {
  std::vector<int64_t> tokens_per_engine;
  std::vector<int32_t> cached_tokens;  // of the two continuations
};

TEST_F(ActorsDeterministic, PrefixAffinitySendsAContinuationToTheEngineHoldingItsPrefix) {
  sched_.clock().current_time += 1h;
  const std::string x = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
  const std::string y = "Tom had a big red ball. He liked to kick it high into the sky and watch it fall down.";
  // Two fresh engines behind a balancer with `router`: prompts X and Y at once (3 and 5
  // tokens), then X's continuation (7 tokens), then Y's (9), each after the one before ended.
  auto run = [&](const std::string& router) {
    actors::engine_list engines;
    for (int i = 0; i < 2; i++) engines.push_back(engines_.emplace_back(spawn_engine_or_die(sys_, engine_opts(false))));
    if (lb_) caf::anon_send_exit(lb_, caf::exit_reason::user_shutdown);
    actors::load_balancer_options o;
    o.engines = actors::mixed_engines(engines);
    o.tok = bundled_shared().tok;
    o.router = router;
    lb_ = actors::spawn_load_balancer(sys_, std::move(o));
    sched_.run();
    std::vector<msg::completion_request> at_once = {make_completion(x, 3, 1), make_completion(y, 5, 2)};
    std::vector<std::shared_ptr<client_log>> logs;
    for (msg::completion_request& r : at_once) {
      r.ignore_eos = true;
      logs.push_back(submit(r));
    }
    run_ticking();
    for (size_t i = 0; i < logs.size(); i++) {
      EXPECT_TRUE(logs[i]->outcome && logs[i]->outcome->has_value()) << router;
      if (logs[i]->outcome && logs[i]->outcome->has_value())
        expect_matches(**logs[i]->outcome, reference(oracle_, at_once[i]), router);
    }
    prefix_run out;
    for (auto [prompt, max_tokens] : {std::pair{x + " One day she saw a bird.", 7}, {y + " Then his dog came.", 9}}) {
      msg::completion_request r = make_completion(prompt, max_tokens, 3);
      r.ignore_eos = true;
      out.cached_tokens.push_back(run_and_check(r, router).end.num_cached_tokens);
    }
    for (const actors::engine_actor& e : engines) {
      out.tokens_per_engine.push_back(ask<msg::engine_report>(e, actors::stats_atom::value).num_generated_tokens);
      EXPECT_EQ(ask<msg::engine_report>(e, actors::stats_atom::value).num_requests, 0);
    }
    return out;
  };
  // Both routers send X to engine 0 and Y (engine 0 being busy) to engine 1. least_loaded then
  // sends both continuations to the idle engine 0, where Y's prefix is not cached;
  // prefix_affinity sends each to the engine holding its prefix, which serves it from cache.
  const prefix_run least = run("least_loaded");
  EXPECT_EQ(least.tokens_per_engine, (std::vector<int64_t>{3 + 7 + 9, 5}));
  EXPECT_EQ(least.cached_tokens, (std::vector<int32_t>{32, 0}));  // two full 16-token blocks of X
  const prefix_run affinity = run("prefix_affinity");
  EXPECT_EQ(affinity.tokens_per_engine, (std::vector<int64_t>{3 + 7, 5 + 9}));
  EXPECT_EQ(affinity.cached_tokens, (std::vector<int32_t>{32, 32}));
}

TEST_F(ActorsDeterministic, PrefixAffinityCreditsAnEngineOnlyWithWhatItsPoolStillHolds) {
  sched_.clock().current_time += 1h;
  // Engine 1's pool has 8 blocks (128 tokens): one long generation there evicts all it held.
  actors::engine_list engines;
  engines.push_back(engines_.emplace_back(spawn_engine_or_die(sys_, engine_opts(false))));
  engines.push_back(engines_.emplace_back(spawn_engine_or_die(sys_, engine_opts(false, 8))));
  actors::load_balancer_options o;
  o.engines = actors::mixed_engines(engines);
  o.engines[1].kv_capacity_tokens = 8 * 16;
  o.tok = bundled_shared().tok;
  o.router = "prefix_affinity";
  lb_ = actors::spawn_load_balancer(sys_, std::move(o));
  sched_.run();
  // Two requests at once: the first goes to engine 0, the second (engine 0 being busy) to 1.
  auto at_once = [&](std::vector<std::pair<std::string, int32_t>> prompts) {
    std::vector<msg::completion_request> requests;
    std::vector<std::shared_ptr<client_log>> logs;
    for (auto& [prompt, max_tokens] : prompts) {
      requests.push_back(make_completion(prompt, max_tokens, 1));
      requests.back().ignore_eos = true;
      logs.push_back(submit(requests.back()));
    }
    run_ticking();
    for (size_t i = 0; i < logs.size(); i++) {
      ASSERT_TRUE(logs[i]->outcome && logs[i]->outcome->has_value()) << prompts[i].first;
      expect_matches(**logs[i]->outcome, reference(oracle_, requests[i]), prompts[i].first);
    }
    sched_.advance_time(100ms);  // the engines' last reports (on a timer) reach the balancer
    run_ticking();
  };
  auto generated = [&](size_t engine) { return report(engine).num_generated_tokens; };
  const std::string y = "Tom had a big red ball. He liked to kick it high into the sky and watch it fall down.";
  const std::string q = "The sun was hot and the grass was green, so the little cat";
  at_once({{"Once upon a time, there was a little girl named Lily.", 3}, {y, 5}});
  ASSERT_EQ(generated(1), 5);  // Y is on engine 1, whose pool keeps its blocks
  // Q's 100 generated tokens fill engine 1's pool: Y's blocks are evicted there.
  at_once({{"Lily saw a bird.", 2}, {q, 100}});
  ASSERT_EQ(generated(1), 5 + 100);
  // Y's continuation: engine 1's pool no longer holds Y's prefix, so nothing credits it there;
  // both engines idle, it goes to engine 0 (the lower index), which computes it all.
  msg::completion_request y_more = make_completion(y + " Then his dog came.", 4, 2);
  y_more.ignore_eos = true;
  EXPECT_EQ(run_and_check(y_more, "Y's continuation").end.num_cached_tokens, 0);
  EXPECT_EQ(generated(0), 3 + 2 + 4);
  // Q's continuation: engine 1's pool still holds Q's first block, which credits engine 1.
  msg::completion_request q_more = make_completion(q + " sat in the shade.", 4, 3);
  q_more.ignore_eos = true;
  EXPECT_EQ(run_and_check(q_more, "Q's continuation").end.num_cached_tokens, 16);
  EXPECT_EQ(generated(1), 5 + 100 + 4);
}

TEST_F(ActorsDeterministic, ServingDrawsUnguessableRequestIds) {
  actors::load_balancer_options o;
  EXPECT_FALSE(o.draw_request_id) << "sequential unless a caller draws ids";
  const int64_t a = actors::random_request_id();
  const int64_t b = actors::random_request_id();
  EXPECT_NE(a, b);  // 2^-64 to fail by chance
  start();
  caf::anon_send_exit(lb_, caf::exit_reason::user_shutdown);
  o.engines = actors::mixed_engines(engines_);
  o.tok = bundled_shared().tok;
  auto drawn = std::make_shared<std::vector<int64_t>>();
  o.draw_request_id = [drawn] { return drawn->emplace_back(actors::random_request_id()); };
  lb_ = actors::spawn_load_balancer(sys_, std::move(o));
  sched_.run();
  const msg::completion_request r = make_completion("Once upon a time", 12, 9);
  const actors::completion c = run_and_check(r, "a random id");
  ASSERT_EQ(drawn->size(), 1u);
  EXPECT_EQ(c.end.request_id, drawn->front());
  // The seed still comes from the request's index, not its id: unseeded runs replay.
  msg::completion_request unseeded = r;
  unseeded.has_seed = false;
  auto log = submit(unseeded);
  run_ticking();
  ASSERT_TRUE(log->outcome && log->outcome->has_value());
  EXPECT_EQ((*log->outcome)->end.seed, engine::child_seed(0, 2));
}

}  // namespace
}  // namespace troupe::testing
