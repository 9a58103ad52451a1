// Remote input is validated, never asserted on (issue 21, point 3). The fuzz sends every
// registered message type (and the atoms of the interfaces), with random and adversarial
// fields, to every actor kind — load balancer, request, engine, step executor, client — as a
// remote peer could (any type to any actor, with or without a sender), first under CAF's test
// coordinator (deterministic: a seed replays a run), then over a real loopback connection. The
// server must neither abort nor crash, and must then serve a request bit-identical to the
// single-sequence reference. The crash attacks of the issue are regression tests (CrashAttack.*).
//
// TROUPE_FUZZ_SEED and TROUPE_FUZZ_ROUNDS set the deterministic run (scripts/fuzz.sh runs long).
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <spdlog/spdlog.h>

#include "actors/request_actor.hpp"
#include "tests/support/actor_config.hpp"
#include "tests/support/actor_harness.hpp"
#include "tests/support/fuzz_env.hpp"
#include "tests/support/garbage.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

/// An actor that takes anything and answers nothing: a sender for forged messages, a client
/// for request actors, and a handle of every type in the pool.
caf::actor spawn_sink(caf::actor_system& sys) {
  return sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler(caf::drop);
    self->set_error_handler([](caf::error&) {});
    self->set_down_handler([](caf::down_msg&) {});
    return {[](caf::ok_atom) {}};
  });
}

/// What a request actor streamed to its client.
struct recording {
  std::vector<int32_t> tokens;
  std::optional<msg::completion_end> end;
  std::optional<msg::completion_error> error;
};

actors::stream_receiver_actor spawn_recorder(caf::actor_system& sys, std::shared_ptr<recording> rec) {
  return sys.spawn([rec](actors::stream_receiver_actor::pointer) -> actors::stream_receiver_actor::behavior_type {
    return {
        [rec](msg::completion_chunk& c) { rec->tokens.insert(rec->tokens.end(), c.tokens.begin(), c.tokens.end()); },
        [rec](msg::completion_end& e) { rec->end = e; },
        [rec](msg::completion_error& e) { rec->error = e; },
    };
  });
}

/// The messages an actor kind's interface accepts (the kinds of garbage::make): half the fuzz
/// goes there, the other half is any kind at all.
const std::vector<std::vector<int>> accepted_kinds = {
    {11, 12, 19, 29, 31},                  // load balancer
    {4, 6, 7, 8, 15, 20},                  // request
    {5, 9, 14, 16, 17, 18, 26, 27, 28, 30},  // engine
    {21},                                  // step executor
    {1, 2, 3, 4, 32},                      // client
};

class Fuzz : public ::testing::Test {
 protected:
  caf::actor_system_config cfg_;
  caf::actor_system sys_{configure(cfg_, /*deterministic=*/true)};
  caf::scheduler::test_coordinator& sched_{dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())};
  model::transformer oracle_{*bundled_shared().ck};
  actors::engine_actor engine_;
  actors::balancer_actor lb_;
  actors::executor_actor executor_;
  caf::actor sink_;
  actors::balancer_actor placer_;  // places the requests spawn_request makes on engine_
  std::vector<actors::client_actor> clients_;
  std::vector<caf::actor> recorders_;

  void SetUp() override {
    spdlog::set_level(spdlog::level::err);  // thousands of refusals, each a warning
    sched_.clock().current_time += 1h;
    engine_ = spawn_engine_or_die(sys_, engine_opts(false));
    lb_ = spawn_balancer(sys_, {engine_});
    sink_ = spawn_sink(sys_);
    // The balancer places only request actors it spawned itself: the ones the tests make with
    // chosen ids ask this stand-in instead, which places every request on the engine.
    const actors::engine_actor engine = engine_;
    placer_ = caf::actor_cast<actors::balancer_actor>(sys_.spawn([engine] {
      return caf::behavior{[engine](msg::place_request&) {
        return msg::placement{{}, engine, "", "engine 'engine0' on node 'local'", "", 0, ""};
      }};
    }));
    sched_.run();
    executor_ = ask<actors::executor_actor>(engine_, actors::executor_atom::value);
  }

  void TearDown() override {
    spdlog::set_level(spdlog::level::info);
    for (const actors::client_actor& c : clients_) caf::anon_send_exit(c, caf::exit_reason::kill);
    caf::anon_send_exit(sink_, caf::exit_reason::kill);
    caf::anon_send_exit(placer_, caf::exit_reason::kill);
    for (const caf::actor& r : recorders_) caf::anon_send_exit(r, caf::exit_reason::kill);
    caf::anon_send_exit(engine_, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(lb_, caf::exit_reason::user_shutdown);
    run_ticking();
    EXPECT_EQ(sys_.registry().running(), 0u) << "an actor outlived the server";
  }

  void run_ticking() { testing::run_ticking(sched_); }

  template <class T, class Handle, class Atom>
  T ask(const Handle& dest, Atom atom) {
    return ask_idle<T>(sys_, sched_, dest, atom);
  }

  msg::engine_report report() { return ask<msg::engine_report>(engine_, actors::stats_atom::value); }

  /// What spawn_request(id, stop, max_tokens) asks for.
  static msg::completion_request request_params(int64_t id, bool stop, int32_t max_tokens) {
    msg::completion_request r =
        make_completion(story_window(static_cast<size_t>(id)), max_tokens, static_cast<uint64_t>(id));
    if (stop) r.stop = {"the"};
    return r;
  }

  /// A request actor of request `id` streaming to `client` (none: the sink), placed on the real
  /// engine by the stand-in balancer (text mode; `stop`: with a stop string).
  actors::request_actor spawn_request(int64_t id, bool stop, int32_t max_tokens = 40,
                                      actors::stream_receiver_actor client = {}) {
    actors::request_options o;
    o.client = client ? client : caf::actor_cast<actors::stream_receiver_actor>(sink_);
    o.balancer = placer_;
    o.policy.id = id;
    o.policy.tok = bundled_shared().tok;
    o.policy.params = request_params(id, stop, max_tokens);
    o.policy.context_tokens = bundled_shared().ck->config().seq_len;
    caf::scoped_actor parent{sys_};
    return actors::spawn_request(parent.ptr(), std::move(o));
  }

  std::shared_ptr<client_log> submit(const msg::completion_request& r) {
    auto log = std::make_shared<client_log>();
    clients_.push_back(spawn_logged_client(sys_, lb_, r, log));
    return log;
  }

  /// The server still serves: a request equal to the reference, bit for bit.
  void expect_serves(const std::string& what) {
    const msg::completion_request r = make_completion("Once upon a time, there was a dog", 40, 4242, 1.0f, 0.9f);
    auto log = submit(r);
    run_ticking();
    ASSERT_EQ(log->num_done, 1) << what;
    ASSERT_TRUE(log->outcome->has_value()) << what << ": " << log->outcome->error().message;
    expect_matches(**log->outcome, reference(oracle_, r), what);
  }

  handle_pool pool(const std::vector<actors::request_actor>& requests) {
    handle_pool p;
    const auto as = [&](auto typed) { return caf::actor_cast<decltype(typed)>(sink_); };
    p.engines = {engine_, as(actors::engine_actor{})};
    p.balancers = {lb_, as(actors::balancer_actor{})};
    p.requests = requests;
    p.requests.push_back(as(actors::request_actor{}));
    p.receivers = {as(actors::stream_receiver_actor{})};
    for (const actors::client_actor& c : clients_) p.receivers.push_back(c);
    p.executors = {executor_, as(actors::executor_actor{})};
    return p;
  }
};

TEST_F(Fuzz, EveryMessageTypeToEveryActorKindLeavesTheServerServing) {
  const uint64_t seed = env_or("TROUPE_FUZZ_SEED", 1);
  const uint64_t rounds = env_or("TROUPE_FUZZ_ROUNDS", 500);
  const int messages_per_round = static_cast<int>(env_or("TROUPE_FUZZ_MESSAGES", 80));
  SCOPED_TRACE("TROUPE_FUZZ_SEED=" + std::to_string(seed) + " TROUPE_FUZZ_ROUNDS=" + std::to_string(rounds) +
               " replays this run");
  garbage g(seed, {}, {bundled_shared().ck->config().n_layers, bundled_shared().ck->config().kv_dim()});
  std::vector<int64_t> sent(garbage::num_kinds, 0);
  for (uint64_t round = 0; round < rounds; round++) {
    // Fresh targets each round: requests and clients end (some because of the fuzz).
    const std::vector<actors::request_actor> requests = {spawn_request(static_cast<int64_t>(2 * round + 1), false),
                                                         spawn_request(static_cast<int64_t>(2 * round + 2), true)};
    (void)submit(make_completion(story_window(round), 30, round));
    g.pool() = pool(requests);
    const std::vector<caf::actor> targets = {
        caf::actor_cast<caf::actor>(lb_), caf::actor_cast<caf::actor>(requests[g.below(2)]),
        caf::actor_cast<caf::actor>(engine_), caf::actor_cast<caf::actor>(executor_),
        caf::actor_cast<caf::actor>(clients_.back())};
    for (int i = 0; i < messages_per_round; i++) {
      const size_t target = g.below(targets.size());
      const std::vector<int>& own = accepted_kinds[target];
      const int kind = g.below(2) == 0 ? own[g.below(own.size())] : static_cast<int>(g.below(garbage::num_kinds));
      sent[static_cast<size_t>(kind)]++;
      const caf::strong_actor_ptr sender = g.below(2) == 0 ? nullptr : caf::actor_cast<caf::strong_actor_ptr>(sink_);
      send_raw(targets[target], sender, g.make(kind));
      if (g.below(8) == 0) run_ticking();  // some arrive mid-flow, some in bursts
    }
    run_ticking();
  }
  for (int kind = 0; kind < garbage::num_types; kind++) EXPECT_GT(sent[kind], 0) << "kind " << kind << " never sent";
  EXPECT_EQ(report().num_executor_failures, 0) << "a forged plan reached the engine's executor state";
  expect_serves("after the fuzz");
}

// ---- the crash attacks of issue 21, each now refused ------------------------------------------

/// A request's engine turned broken or impostor: what it sends comes in its name (send_as),
/// since a request actor takes word only from the engines serving it.
class CrashAttack : public Fuzz {
 protected:
  /// Request `id` (200 tokens at most), run until its first token reached its recorder.
  std::pair<actors::request_actor, std::shared_ptr<recording>> started_request(int64_t id, bool stop = false) {
    auto rec = std::make_shared<recording>();
    const actors::stream_receiver_actor client = spawn_recorder(sys_, rec);
    recorders_.push_back(caf::actor_cast<caf::actor>(client));
    const actors::request_actor r = spawn_request(id, stop, 200, client);
    while (rec->tokens.empty() && sched_.try_run_once()) sched_.advance_time(1ms);
    EXPECT_FALSE(rec->tokens.empty());
    return {r, rec};
  }

  void expect_engine_idle() {
    const msg::engine_report r = report();
    EXPECT_EQ(r.num_requests, 0);
    EXPECT_EQ(r.num_blocks_in_use, 0);
    EXPECT_EQ(r.num_executor_failures, 0);
  }

  static void expect_failed(const recording& rec, const std::string& message) {
    ASSERT_TRUE(rec.error.has_value());
    EXPECT_EQ(rec.error->code, errc::internal);
    EXPECT_EQ(rec.error->message, message);
  }
};

TEST_F(CrashAttack, AnOutOfVocabularyTokenToARequestFailsOnlyThatRequest) {
  auto [r, rec] = started_request(7);
  caf::send_as(engine_, r, msg::sampled{7, 0, 100000, -1.0f, {}, engine::finish_reason::none, 0, 0, 0, 0});
  run_ticking();
  expect_failed(*rec, "the engine sent token 100000, outside the vocabulary [0, 512)");
  expect_engine_idle();  // the request released its engine
  expect_serves("after an out-of-vocabulary token");
}

// CAF 0.17.6 serializes an infinite float in an endless loop (detail::pack754): relayed to
// another node, it would stall this node's network thread. Neither direction relays one.
TEST_F(CrashAttack, InfiniteFloatsAreRefusedBeforeTheyCrossANode) {
  auto [r, rec] = started_request(7);
  caf::send_as(engine_, r, msg::sampled{7, 0, 5, -std::numeric_limits<float>::infinity(), {}, {}, 0, 0, 0, 0});
  run_ticking();
  expect_failed(*rec, "the engine sent token 5 with a logprob that is not finite");
  msg::completion_request c = make_completion("Once upon a time", 20, 7);
  c.temperature = std::numeric_limits<float>::infinity();
  auto log = submit(c);
  run_ticking();
  ASSERT_TRUE(log->outcome.has_value() && !log->outcome->has_value());
  EXPECT_EQ(log->outcome->error().code, errc::invalid_argument);
  sampling::sampling_params same;
  same.temperature = c.temperature;
  EXPECT_EQ(log->outcome->error().message, sampling::validate(same, 512).error().message);
  expect_engine_idle();
  expect_serves("after infinite floats");
}

TEST_F(CrashAttack, AnEmptyOrRaggedBatchToARequestFailsOnlyThatRequest) {
  auto [a, empty] = started_request(7);
  caf::send_as(engine_, a, msg::sampled_batch{7, {}, {}, {}, {}, engine::finish_reason::length, 0, 0, 0, 0});
  auto [b, ragged] = started_request(8);
  caf::send_as(engine_, b, msg::sampled_batch{8, {5, 6}, {-1.0f}, {{}, {}}, {1, 1}, engine::finish_reason::length, 0, 0, 0, 0});
  run_ticking();
  expect_failed(*empty, "the engine sent an empty batch of tokens");
  expect_failed(*ragged, "the engine sent a batch of 2 tokens with 1 logprobs, 2 top-logprob lists and 2 ages");
  expect_engine_idle();
  expect_serves("after an empty and a ragged batch");
}

TEST_F(CrashAttack, ABatchPastAStopStringEndsTheRequestAtTheStop) {
  // The stop string "the" completes at the batch's first tokens; the rest must not be pushed
  // into the ended stream (that asserted).
  auto ids = bundled_shared().tok->encode(" the end the", false, false);
  ASSERT_TRUE(ids.has_value());
  const size_t n = ids->size();
  auto [r, rec] = started_request(7, /*stop=*/true);
  const size_t before = rec->tokens.size();
  caf::send_as(engine_, r, msg::sampled_batch{7, *ids, std::vector<float>(n, -1.0f),
                                       std::vector<std::vector<sampling::token_logprob>>(n),
                                       std::vector<int64_t>(n, 0), engine::finish_reason::length, 0, 0, 0, 0});
  run_ticking();
  ASSERT_TRUE(rec->end.has_value());
  EXPECT_EQ(rec->end->finish_reason, engine::finish_reason::stop);
  EXPECT_LT(rec->tokens.size(), before + n) << "tokens after the stop string were output";
  expect_engine_idle();
  expect_serves("after a batch past a stop string");
}

TEST_F(CrashAttack, ATokenForAnotherRequestIsDroppedAndTheAnswerIsUnchanged) {
  auto [r, rec] = started_request(7);
  caf::send_as(engine_, r, msg::sampled{12345, 0, 100000, 0.0f, {}, engine::finish_reason::length, 0, 0, 0, 0});
  run_ticking();
  ASSERT_TRUE(rec->end.has_value());
  EXPECT_FALSE(rec->error.has_value());
  EXPECT_EQ(rec->tokens, reference(oracle_, request_params(7, false, 200)).tokens);
  expect_engine_idle();
}

TEST_F(CrashAttack, AForgedPlanToTheExecutorGetsAnErrorAndChangesNothing) {
  auto answers = std::make_shared<std::vector<std::string>>();
  const auto forge = [&](engine::exec_plan p) {
    sys_.spawn([=](caf::event_based_actor* self) {
      self->request(executor_, caf::infinite, p, grammar::grammar_table{})
          .then([=](engine::exec_result&) { answers->push_back("ran"); },
                [=](caf::error& e) { answers->push_back(self->system().render(e)); });
    });
    sched_.run();
  };
  engine::exec_chunk c;
  c.seq = 1;
  c.tokens = {1, 300};
  c.block_table = {5000};  // beyond the pool
  forge(engine::exec_plan{0, {}, {}, {c}, {}, {}, {}});
  c.block_table = {0};
  c.tokens = {1, 99999};  // out of the vocabulary
  forge(engine::exec_plan{0, {}, {}, {c}, {}, {}, {}});
  c.tokens = {1, 300};
  forge(engine::exec_plan{7, {}, {}, {c}, {}, {}});  // not the next step
  forge(engine::exec_plan{0, {}, {}, {c, c}, {}, {}});  // one sequence twice
  ASSERT_EQ(answers->size(), 4u);
  const char* reasons[] = {"plan 0, chunk 0 (sequence 1): block 0 = 5000 is outside the pool [0, 1024)",
                           "plan 0, chunk 0 (sequence 1): token 1 = 99999 is outside the vocabulary [0, 512)",
                           "plans must arrive in step order: step 7 after step -1",
                           "plan 0 has two chunks of sequence 1"};
  for (size_t i = 0; i < 4; i++) EXPECT_NE((*answers)[i].find(reasons[i]), std::string::npos) << (*answers)[i];
  expect_serves("after forged plans");
  EXPECT_EQ(report().num_executor_failures, 0);
}

TEST_F(CrashAttack, MessagesWithoutASenderAreRefusedByEveryActor) {
  auto [r, rec] = started_request(7);
  const msg::completion_request c = make_completion("Once upon a time", 20, 7);
  engine::request q;
  q.id = 41;
  q.prompt = {tokenizer::bos, 400, 401};
  caf::anon_send(lb_, msg::submit_completion{c, actors::stream_receiver_actor{}});
  caf::anon_send(caf::actor_cast<caf::actor>(lb_), msg::place_request{3, 10, 10, {}});
  caf::anon_send(engine_, msg::submit{q});
  caf::anon_send(engine_, msg::submit_prefill{q, engine_, "", 0});
  caf::anon_send(engine_, msg::kv_handoff{q, actors::request_actor{}, {}, 0});
  caf::anon_send(r, msg::engine_lost{actors::engine_actor{}, "forged"});
  run_ticking();
  EXPECT_EQ(rec->tokens, reference(oracle_, request_params(7, false, 200)).tokens);
  expect_engine_idle();  // the started request ran to its end; nothing else was queued
  expect_serves("after messages without a sender");
}

// ---- over a real connection -------------------------------------------------------------------

TEST(FuzzLoopback, GarbageOverTheWireLeavesTheServerServing) {
  caf::actor_system_config server_cfg;
  testing::configure_real_time(server_cfg, 1);
  server_cfg.load<caf::io::middleman>();
  caf::actor_system server{server_cfg};
  // The executor on the scheduler, not detached: a detached actor whose handle went to another
  // node can keep CAF 0.17's ~actor_system waiting for its thread (a teardown race of the test,
  // seen now and then; the server served before it).
  const actors::engine_actor engine = spawn_engine_or_die(server, engine_opts(false));
  const actors::balancer_actor lb = spawn_balancer(server, {engine});
  // The whole balancer (worse than the front a node publishes) and a node actor listing the
  // engine, as a certificate holder can reach one on any node without the balancer.
  auto port = server.middleman().publish(lb, 0, "127.0.0.1", true);
  ASSERT_TRUE(port) << server.render(port.error());
  const actors::node_actor node = server.spawn([engine]() -> actors::node_actor::behavior_type {
    return {[engine](actors::engines_atom) { return actors::engine_list{engine}; },
            [](actors::expert_shards_atom) { return actors::expert_shard_list{}; },
            [](actors::host_tier_atom) { return actors::cache_tier_actor{}; },
            [](actors::drain_atom, const std::string&, int32_t) { return int32_t{0}; }};
  });
  auto node_port = server.middleman().publish(node, 0, "127.0.0.1", true);
  ASSERT_TRUE(node_port) << server.render(node_port.error());
  spdlog::set_level(spdlog::level::err);
  {
    caf::actor_system_config peer_cfg;
    testing::configure_real_time(peer_cfg, 1);
    peer_cfg.load<caf::io::middleman>();
    caf::actor_system peer{peer_cfg};
    auto remote = peer.middleman().remote_actor<actors::balancer_actor>("127.0.0.1", *port);
    ASSERT_TRUE(remote) << peer.render(remote.error());
    caf::scoped_actor self{peer};
    actors::engine_list engines;
    actors::executor_actor executor;
    auto remote_node = peer.middleman().remote_actor<actors::node_actor>("127.0.0.1", *node_port);
    ASSERT_TRUE(remote_node) << peer.render(remote_node.error());
    self->request(*remote_node, 10s, actors::engines_atom::value)
        .receive([&](actors::engine_list& l) { engines = l; }, [](caf::error&) {});
    ASSERT_EQ(engines.size(), 1u);
    self->request(engines[0], 10s, actors::executor_atom::value)
        .receive([&](actors::executor_actor& e) { executor = e; }, [](caf::error&) {});
    ASSERT_TRUE(executor);
    // Another node may not drain the engine (nor end its grace period): only its own node.
    std::string refusal;
    self->request(engines[0], 10s, actors::drain_atom::value, int32_t{0})
        .receive([&](int32_t, int32_t) { refusal = "drained"; }, [&](caf::error& e) { refusal = peer.render(e); });
    EXPECT_NE(refusal.find("an engine is drained only by its own node"), std::string::npos) << refusal;
    self->send(engines[0], actors::drain_atom::value);
    const caf::actor sink = spawn_sink(peer);
    handle_pool p;
    p.engines = engines;
    p.balancers = {*remote};
    p.receivers = {caf::actor_cast<actors::stream_receiver_actor>(sink)};
    p.executors = {executor};
    const model::model_config& mc = bundled_shared().ck->config();
    garbage g(env_or("TROUPE_FUZZ_SEED", 1), p, {mc.n_layers, mc.kv_dim()}, /*finite_only=*/true);
    const std::vector<caf::actor> targets = {caf::actor_cast<caf::actor>(*remote), caf::actor_cast<caf::actor>(engines[0]),
                                             caf::actor_cast<caf::actor>(executor)};
    const std::vector<std::vector<int>> own = {accepted_kinds[0], accepted_kinds[2], accepted_kinds[3]};
    for (int i = 0; i < 400; i++) {
      const size_t target = g.below(targets.size());
      const int kind = g.below(2) == 0 ? own[target][g.below(own[target].size())]
                                       : static_cast<int>(g.below(garbage::num_kinds));
      send_raw(targets[target], g.below(2) == 0 ? nullptr : caf::actor_cast<caf::strong_actor_ptr>(sink), g.make(kind));
    }
    // The same connection then carries a valid request; its answer must be the reference's.
    model::transformer oracle{*bundled_shared().ck};
    const msg::completion_request r = make_completion("Once upon a time, there was a dog", 40, 4242, 1.0f, 0.9f);
    auto out = actors::complete(peer, *remote, r);
    ASSERT_TRUE(out.has_value()) << out.error().message;
    expect_matches(*out, reference(oracle, r), "over the wire, after the garbage");
    caf::anon_send_exit(sink, caf::exit_reason::kill);
  }
  spdlog::set_level(spdlog::level::info);
  // The server's own client, after the peer left.
  const msg::completion_request r = make_completion("Lily wanted", 20, 5, 0.0f);
  auto out = actors::complete(server, lb, r);
  ASSERT_TRUE(out.has_value()) << out.error().message;
  model::transformer oracle{*bundled_shared().ck};
  expect_matches(*out, reference(oracle, r), "in the server, after the peer left");
  caf::anon_send_exit(engine, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(lb, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::testing
