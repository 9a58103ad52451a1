// The actor layer on CAF's real threaded scheduler with detached executors: many clients at
// once, from several threads, through one or two engines. Every answer must equal the
// single-sequence reference generator's (contract 1: a request's tokens do not depend on what
// else is in the batch); cancels, killed clients, executor failures and overload must all end
// (nothing hangs, nothing leaks: the engines end with no request and no KV block in use). Run it
// under ThreadSanitizer too (see tests/tsan.supp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/system/atoms.hpp"
#include "actors/executor_actor.hpp"
#include "actors/expert_shard_actor.hpp"
#include "actors/system/sync_guard.hpp"
#include "messages/control.hpp"
#include "messages/engine.hpp"
#include "messages/executor.hpp"
#include "runtime/cost/calibration.hpp"
#include "runtime/model/moe_split.hpp"
#include "tests/support/actor_harness.hpp"
#include "tests/support/failing_executor.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

/// Outcomes of many clients, written by their actors on CAF's threads, read by the test.
class tracker : public std::enable_shared_from_this<tracker> {
 public:
  struct entry {
    std::vector<int32_t> tokens;  // from the chunks
    std::string text;             // from the chunks
    std::optional<expected<actors::completion>> outcome;
    int num_done = 0;
  };

  explicit tracker(size_t n) : entries_(n) {}

  actors::client_actor spawn(caf::actor_system& sys, const actors::balancer_client_actor& lb, size_t i,
                             const msg::completion_request& r) {
    // The callbacks share ownership: a client may outlive a test that failed early.
    auto self = shared_from_this();
    return actors::spawn_client(
        sys, lb, r,
        [self, i](const msg::completion_chunk& c) {
          std::lock_guard<std::mutex> lock(self->m_);
          self->entries_[i].text += c.text;
          self->entries_[i].tokens.insert(self->entries_[i].tokens.end(), c.tokens.begin(), c.tokens.end());
          self->cv_.notify_all();
        },
        [self, i](const expected<actors::completion>& outcome) { self->done(i, outcome); });
  }

  void done(size_t i, const expected<actors::completion>& outcome) {
    std::lock_guard<std::mutex> lock(m_);
    entries_[i].outcome = outcome;
    entries_[i].num_done++;
    cv_.notify_all();
  }

  /// Waits (at most 60 s) until `pred(entries)` holds; false on timeout.
  template <class Predicate>
  bool wait_for(Predicate pred) {
    std::unique_lock<std::mutex> lock(m_);
    return cv_.wait_for(lock, 60s, [&] { return pred(entries_); });
  }

  bool wait_all_done(size_t count) {
    return wait_for([&](const std::vector<entry>& es) {
      size_t n = 0;
      for (const entry& e : es) n += e.num_done > 0 ? 1 : 0;
      return n >= count;
    });
  }

  /// The entries, once their writers are done (after a wait).
  std::vector<entry> snapshot() {
    std::lock_guard<std::mutex> lock(m_);
    return entries_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<entry> entries_;
};


class ActorsThreaded : public ::testing::Test {
 protected:
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  model::transformer oracle_{*bundled_shared().ck};
  actors::engine_list engines_;
  actors::balancer_actor lb_;
  size_t num_idle_actors_ = 0;

  /// The threaded actor system (a test that needs it before its engines calls this first).
  void start_system() {
    cfg_.set("scheduler.max-threads", 4);
    sys_ = std::make_unique<caf::actor_system>(configure(cfg_, /*deterministic=*/false));
  }

  /// `kinds` as in spawn_balancer; the system is started here unless start_system() was called.
  void start(actors::engine_options o = engine_opts(true), int num_engines = 1,
             const std::vector<balance::engine_kind>& kinds = {}) {
    if (!sys_) start_system();
    for (int i = 0; i < num_engines; i++) engines_.push_back(spawn_engine_or_die(*sys_, o));
    lb_ = spawn_balancer(*sys_, engines_, kinds);
    num_idle_actors_ = static_cast<size_t>(num_engines) * 3 + 1;  // engines, executors, grammar actors, balancer
  }

  void TearDown() override {
    if (!sys_) return;
    for (const actors::engine_actor& e : engines_) caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(lb_, caf::exit_reason::user_shutdown);
    engines_.clear();
    lb_ = nullptr;
    // Every actor must quit: a hang here is a bug (the system's destructor would wait forever).
    std::mutex m;
    std::condition_variable cv;
    bool finished = false;
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> lock(m);
      if (!cv.wait_for(lock, 30s, [&] { return finished; })) {
        std::cerr << "actor system shutdown hangs: " << sys_->registry().running() << " actor(s) alive\n";
        std::abort();
      }
    });
    sys_->await_all_actors_done();
    {
      std::lock_guard<std::mutex> lock(m);
      finished = true;
    }
    cv.notify_all();
    watchdog.join();
    sys_.reset();
  }

  msg::engine_report report(size_t engine = 0) {
    auto r = actors::query_engine(*sys_, engines_.at(engine));
    EXPECT_TRUE(r.has_value()) << r.error().message;
    return r.value_or(msg::engine_report{});
  }

  /// Waits (at most 10 s) until every engine holds no request and no block and only the
  /// long-lived actors are left; request actors quit asynchronously after their last message.
  /// No sleep: each check is a round trip through every engine, which paces the loop (CAF's
  /// registry can only wait for a count of 0 or 1).
  void expect_eventually_idle() {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      bool idle = sys_->registry().running() == num_idle_actors_;
      for (size_t e = 0; e < engines_.size(); e++) {
        const msg::engine_report r = report(e);
        idle = idle && r.num_requests == 0 && r.num_blocks_in_use == 0 && r.num_waiting == 0;
      }
      if (idle) return;
    }
    ADD_FAILURE() << "not idle after 10 s: " << sys_->registry().running() << " actors running";
  }

  /// `n` concurrent seeded requests get the reference generator's outputs on `moe` with its own
  /// in-process shard, bit for bit.
  void expect_moe_reference_outputs(const model::checkpoint& moe, size_t n) {
    model::transformer moe_oracle(moe);
    auto track = std::make_shared<tracker>(n);
    std::vector<msg::completion_request> requests;
    for (size_t i = 0; i < n; i++) {
      requests.push_back(make_completion(story_window(i), 40, 70 + i));
      track->spawn(*sys_, lb_, i, requests.back());
    }
    ASSERT_TRUE(track->wait_all_done(n));
    const std::vector<tracker::entry> entries = track->snapshot();
    for (size_t i = 0; i < n; i++) {
      ASSERT_TRUE(entries[i].outcome->has_value()) << entries[i].outcome->error().message;
      expect_matches(**entries[i].outcome, reference(moe_oracle, requests[i]), "MoE request " + std::to_string(i));
    }
  }

  /// 64 different prompts and seeds, submitted at once from 8 threads: on each, 7 event-based
  /// clients and one blocking `complete`. Checks every answer against the reference.
  void sixty_four_clients() {
    constexpr size_t n = 64;
    constexpr size_t num_threads = 8;
    std::vector<msg::completion_request> requests;
    std::set<std::string> prompts;
    for (size_t i = 0; i < n; i++) {
      requests.push_back(make_completion(story_window(i), 40 + static_cast<int32_t>(i % 21), 9000 + i, 1.0f, 0.9f));
      prompts.insert(requests.back().prompt);
    }
    ASSERT_EQ(prompts.size(), n);
    auto track = std::make_shared<tracker>(n);
    std::mutex go_m;
    std::condition_variable go_cv;
    bool go = false;
    std::vector<std::thread> threads;
    for (size_t t = 0; t < num_threads; t++) {
      threads.emplace_back([&, t] {
        {
          std::unique_lock<std::mutex> lock(go_m);
          go_cv.wait(lock, [&] { return go; });
        }
        const size_t first = t * (n / num_threads);
        const size_t last = first + n / num_threads - 1;  // this one blocks in `complete`
        for (size_t i = first; i < last; i++) track->spawn(*sys_, lb_, i, requests[i]);
        std::string streamed;
        auto out = actors::complete(*sys_, lb_, requests[last],
                                    [&](const msg::completion_chunk& c) { streamed += c.text; });
        if (out) {
          EXPECT_EQ(streamed, out->text) << "request " << last;
        }
        track->done(last, out);
      });
    }
    {
      std::lock_guard<std::mutex> lock(go_m);
      go = true;
    }
    go_cv.notify_all();
    for (std::thread& t : threads) t.join();
    ASSERT_TRUE(track->wait_all_done(n)) << "clients still waiting after 60 s";

    int64_t num_tokens = 0;
    const std::vector<tracker::entry> entries = track->snapshot();
    for (size_t i = 0; i < n; i++) {
      const tracker::entry& e = entries[i];
      const std::string what = "request " + std::to_string(i);
      ASSERT_EQ(e.num_done, 1) << what;
      ASSERT_TRUE(e.outcome->has_value()) << what << ": " << e.outcome->error().message;
      const actors::completion& c = **e.outcome;
      const generate::generation ref = reference(oracle_, requests[i]);
      expect_matches(c, ref, what);
      EXPECT_EQ(c.end.seed, 9000 + i) << what;
      if (i % (n / num_threads) != n / num_threads - 1) {  // the streamed chunks add up too
        EXPECT_EQ(e.tokens, ref.tokens) << what;
        EXPECT_EQ(e.text, ref.text) << what;
      }
      num_tokens += static_cast<int64_t>(ref.tokens.size());
    }
    expect_eventually_idle();
    int64_t num_generated = 0;
    for (size_t e = 0; e < engines_.size(); e++) num_generated += report(e).num_generated_tokens;
    EXPECT_EQ(num_generated, num_tokens);
  }
};

TEST_F(ActorsThreaded, SixtyFourConcurrentClientsGetTheReferenceOutputs) {
  start();
  sixty_four_clients();
}

TEST_F(ActorsThreaded, SixtyFourConcurrentClientsOverTwoEngines) {
  start(engine_opts(true), /*num_engines=*/2);
  sixty_four_clients();
  EXPECT_GT(report(0).num_generated_tokens, 0);
  EXPECT_GT(report(1).num_generated_tokens, 0);
}

TEST_F(ActorsThreaded, SixtyFourConcurrentClientsThroughAPrefillAndTwoDecodeEngines) {
  start(engine_opts(true), 3, {balance::engine_kind::prefill, balance::engine_kind::decode, balance::engine_kind::decode});
  sixty_four_clients();
  EXPECT_EQ(report(0).num_generated_tokens, 0);
  EXPECT_GT(report(0).num_steps, 0);
  EXPECT_GT(report(1).num_generated_tokens, 0);
  EXPECT_GT(report(2).num_generated_tokens, 0);
}

TEST_F(ActorsThreaded, SixtyFourConcurrentClientsWithAKernelThreadPool) {
  actors::engine_options o = engine_opts(true);
  o.executor_threads = 2;  // batch-invariant kernels: the same bits with a thread pool
  start(o);
  sixty_four_clients();
}

TEST_F(ActorsThreaded, AStepLogRecordsEveryStepAndChangesNoOutput) {
  // What `troupe calibrate --log` fits: one line per executed step, written by the detached
  // executor while it answers (the result is sent inside the timed span).
  const std::string path = (std::filesystem::temp_directory_path() / "troupe_threaded_step_log.csv").string();
  std::remove(path.c_str());
  actors::engine_options o = engine_opts(true);
  o.step_log = path;
  start(o);
  sixty_four_clients();
  expect_eventually_idle();
  auto samples = cost::read_step_log(path);
  ASSERT_TRUE(samples.has_value()) << samples.error().message;
  const msg::engine_report r = report();
  EXPECT_EQ(static_cast<int64_t>(samples->size()), r.num_steps);
  double num_sampled = 0;
  for (const cost::step_sample& s : *samples) num_sampled += s.first.num_sampled_rows;
  EXPECT_EQ(static_cast<int64_t>(num_sampled), r.num_generated_tokens);
  std::remove(path.c_str());
}

TEST_F(ActorsThreaded, OverloadRejectsSomeAndServesTheRest) {
  actors::engine_options o = engine_opts(true);
  o.max_waiting = 2;
  start(o);
  constexpr size_t n = 64;
  std::vector<msg::completion_request> requests;
  auto track = std::make_shared<tracker>(n);
  for (size_t i = 0; i < n; i++) {
    requests.push_back(make_completion(story_window(i), 30, 500 + i));
    track->spawn(*sys_, lb_, i, requests[i]);
  }
  ASSERT_TRUE(track->wait_all_done(n)) << "clients still waiting after 60 s";
  size_t num_overloaded = 0;
  size_t num_completed = 0;
  const std::vector<tracker::entry> entries = track->snapshot();
  for (size_t i = 0; i < n; i++) {
    const tracker::entry& e = entries[i];
    ASSERT_EQ(e.num_done, 1);
    if (e.outcome->has_value()) {
      num_completed++;
      expect_matches(**e.outcome, reference(oracle_, requests[i]), "request " + std::to_string(i));
    } else {
      num_overloaded++;
      EXPECT_EQ(e.outcome->error().code, errc::overloaded) << e.outcome->error().message;
      EXPECT_NE(e.outcome->error().message.find("waiting queue is full"), std::string::npos);
    }
  }
  EXPECT_GE(num_completed, 2u);
  EXPECT_GE(num_overloaded, 1u);  // 64 at once against 2 steps in flight and 2 waiting
  expect_eventually_idle();
}

TEST_F(ActorsThreaded, CancelledAndKilledClientsReleaseTheirRequests) {
  start(engine_opts(true), /*num_engines=*/2);
  constexpr size_t n = 16;
  std::vector<msg::completion_request> requests;
  std::vector<actors::client_actor> clients;
  auto track = std::make_shared<tracker>(n);
  for (size_t i = 0; i < n; i++) {
    msg::completion_request r = make_completion(story_window(i), 400, 70 + i);
    r.ignore_eos = true;
    requests.push_back(r);
    clients.push_back(track->spawn(*sys_, lb_, i, r));
  }
  ASSERT_TRUE(track->wait_for([](const std::vector<tracker::entry>& es) {
    for (const tracker::entry& e : es)
      if (e.tokens.size() < 2) return false;
    return true;
  }));
  for (size_t i = 0; i < n; i++) {
    if (i % 2 == 0)
      caf::anon_send(clients[i], msg::cancel_request{});
    else
      caf::anon_send_exit(clients[i], caf::exit_reason::kill);
  }
  clients.clear();
  ASSERT_TRUE(track->wait_all_done(n / 2));
  expect_eventually_idle();
  const std::vector<tracker::entry> entries = track->snapshot();
  for (size_t i = 0; i < n; i++) {
    const tracker::entry& e = entries[i];
    if (i % 2 == 1) {
      EXPECT_EQ(e.num_done, 0) << "a killed client was called back";
      continue;
    }
    ASSERT_EQ(e.num_done, 1);
    ASSERT_TRUE(e.outcome->has_value()) << e.outcome->error().message;
    EXPECT_EQ((*e.outcome)->end.finish_reason, engine::finish_reason::cancelled);
    const generate::generation ref = reference(oracle_, requests[i]);
    ASSERT_LT((*e.outcome)->tokens.size(), ref.tokens.size());
    EXPECT_EQ((*e.outcome)->tokens,
              std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + (*e.outcome)->tokens.size()));
  }
  // Both engines serve on.
  for (int i = 0; i < 2; i++) {
    const msg::completion_request r = make_completion("Tim and Sue", 30, 80 + i, 1.0f, 0.9f);
    auto out = actors::complete(*sys_, lb_, r);
    ASSERT_TRUE(out.has_value()) << out.error().message;
    expect_matches(*out, reference(oracle_, r), "after the cancels");
  }
}

/// stories260K split into 4 experts with the skewed router (top 2 of 4; docs/moe.md).
std::shared_ptr<const model::checkpoint> skewed_moe() {
  model::moe_split_options o;
  o.top_k = 2;
  o.router = model::router_init::skewed;
  o.seed = 7;
  auto bytes = model::to_moe(*bundled_shared().ck, o);
  if (!bytes) return nullptr;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("troupe_threaded_moe_" + std::to_string(::getpid()) + ".bin")).string();
  std::ofstream(path, std::ios::binary) << *bytes;
  auto ck = model::checkpoint::load(path);
  std::filesystem::remove(path);  // the mapping stays
  return ck ? std::make_shared<const model::checkpoint>(std::move(*ck)) : nullptr;
}

/// Engine options whose executors compute `moe`'s experts on `shards`, which hold them as
/// `placement` says (the actors are spawned on the engine's system).
actors::engine_options on_shard_actors(caf::actor_system& sys, const std::shared_ptr<const model::checkpoint>& moe,
                                       const moe::expert_placement& placement,
                                       std::vector<actors::expert_shard_actor> shards, caf::timespan timeout) {
  actors::engine_options o = engine_opts(true);
  o.checkpoint = moe;
  o.experts = std::make_shared<actors::expert_shards>(
      std::make_shared<actors::actor_dispatch>(sys, std::move(shards), timeout), placement);
  return o;
}

/// Round robin over four shards, the hot expert (0) on all four.
moe::expert_placement hot_on_four(int32_t n_layers) {
  moe::expert_placement p = moe::expert_placement::round_robin(n_layers, 4, 4);
  for (int32_t l = 0; l < n_layers; l++)
    for (int32_t s = 0; s < 4; s++)
      if (p.can_add_replica(l, 0, s)) p.add_replica(l, 0, s);
  return p;
}

// An MoE engine whose step executor computes the experts on four shard actors: concurrent seeded
// requests get the reference generator's outputs on the same model with its own in-process
// shard, bit for bit.
TEST_F(ActorsThreaded, AnMoeEngineOnExpertShardActorsGetsTheReferenceOutputs) {
  const std::shared_ptr<const model::checkpoint> moe = skewed_moe();
  ASSERT_NE(moe, nullptr);
  const moe::expert_placement placement = hot_on_four(moe->config().n_layers);
  start_system();
  start(on_shard_actors(*sys_, moe, placement,
                        actors::spawn_expert_shards(*sys_, *moe, placement, model::kernel_path::fast), 30s));
  num_idle_actors_ += 4;  // the shards
  expect_moe_reference_outputs(*moe, 12);
  expect_eventually_idle();
  EXPECT_EQ(report().num_executor_failures, 0);
}

actors::expert_shard_actor::behavior_type silent_shard() {
  return {[](moe::expert_request&) { return caf::delegated<moe::expert_reply>{}; },  // never answered
          [](msg::fetch_experts&) { return msg::expert_set{}; }, [](msg::expert_set&) { return int32_t{0}; },
          [](msg::drop_experts&) { return int32_t{0}; }};
}

// One of the four shards never answers: each step that needs it fails after the dispatch's bound,
// the engine restarts its executor and resumes the request as after any executor failure, and
// after the last resume the request ends with an error; nothing hangs.
TEST_F(ActorsThreaded, AnMoeEngineWithASilentShardFailsItsStepsAndEndsTheRequest) {
  const std::shared_ptr<const model::checkpoint> moe = skewed_moe();
  ASSERT_NE(moe, nullptr);
  const moe::expert_placement placement = hot_on_four(moe->config().n_layers);
  start_system();
  std::vector<actors::expert_shard_actor> shards =
      actors::spawn_expert_shards(*sys_, *moe, placement, model::kernel_path::fast);
  shards[1] = sys_->spawn(silent_shard);
  start(on_shard_actors(*sys_, moe, placement, std::move(shards), 100ms));
  num_idle_actors_ += 4;
  auto track = std::make_shared<tracker>(1);
  track->spawn(*sys_, lb_, 0, make_completion(story_window(0), 40, 5));
  ASSERT_TRUE(track->wait_all_done(1));
  const std::vector<tracker::entry> entries = track->snapshot();
  ASSERT_FALSE(entries[0].outcome->has_value());
  EXPECT_NE(entries[0].outcome->error().message.find("expert shard 1: system_error(request_timeout)"), std::string::npos)
      << entries[0].outcome->error().message;
  expect_eventually_idle();
  EXPECT_GE(report().num_executor_failures, 1);
}

/// Engine options on `moe`'s experts in four shard actors spawned on `sys`, round robin (the hot
/// expert alone on shard 0), reassigned in windows of `window_steps` steps; `wrap` may stand in
/// front of each shard.
actors::engine_options reassigning_moe(
    caf::actor_system& sys, const std::shared_ptr<const model::checkpoint>& moe, double moe_lb_max,
    const std::function<actors::expert_shard_actor(caf::actor_system&, actors::expert_shard_actor)>& wrap = {},
    int32_t window_steps = 8) {
  const moe::expert_placement from = moe::expert_placement::round_robin(moe->config().n_layers, 4, 4);
  std::vector<actors::expert_shard_actor> shards = actors::spawn_expert_shards(sys, *moe, from, model::kernel_path::fast);
  if (wrap)
    for (actors::expert_shard_actor& shard : shards) shard = wrap(sys, shard);
  actors::engine_options o = on_shard_actors(sys, moe, from, std::move(shards), 30s);
  o.expert_reassignment = moe::reassignment_options{window_steps, /*capacity=*/2, moe_lb_max};
  return o;
}

void print_moe_report(const msg::engine_report& r) {
  std::printf("windows: %lld; moe_lb of the last: %.4f; expert moves: %lld\n",
              static_cast<long long>(r.num_moe_windows), r.moe_lb_last_window,
              static_cast<long long>(r.num_expert_moves));
}

// An MoE engine on four shard actors measures its windows of steps without moving anything (the
// threshold is out of reach): the hot expert alone on shard 0 computes every row of its layer,
// so each window's moe_lb is exactly 2. The requests get the reference outputs.
TEST_F(ActorsThreaded, AnMoeEngineMeasuresEachWindowsExpertLoad) {
  const std::shared_ptr<const model::checkpoint> moe = skewed_moe();
  ASSERT_NE(moe, nullptr);
  start_system();
  start(reassigning_moe(*sys_, moe, /*moe_lb_max=*/1e9));
  num_idle_actors_ += 4 + 1;  // the shards, the placement actor
  expect_moe_reference_outputs(*moe, 12);
  expect_eventually_idle();
  const msg::engine_report r = report();
  print_moe_report(r);
  EXPECT_GE(r.num_moe_windows, 4);
  EXPECT_DOUBLE_EQ(r.moe_lb_last_window, 2.0);
  EXPECT_EQ(r.num_expert_moves, 0);
  EXPECT_EQ(r.num_executor_failures, 0);
}

// The same stream with reassignment on: the first window (moe_lb 2) proposes the rebalanced
// placement, its experts move between the shards while the steps go on, the executor switches
// between two steps, and the shards drop the rest. Every request's tokens are still the reference
// ones (the run without a move), and the later windows are better balanced (below the threshold
// of 1.5, so exactly one move).
TEST_F(ActorsThreaded, AnMoeEngineMovesItsExpertsMidStreamAndNoTokenChanges) {
  const std::shared_ptr<const model::checkpoint> moe = skewed_moe();
  ASSERT_NE(moe, nullptr);
  start_system();
  start(reassigning_moe(*sys_, moe, /*moe_lb_max=*/1.5));
  num_idle_actors_ += 4 + 1;
  expect_moe_reference_outputs(*moe, 12);
  expect_eventually_idle();
  const msg::engine_report r = report();
  print_moe_report(r);
  EXPECT_GE(r.num_moe_windows, 4);
  EXPECT_EQ(r.num_expert_moves, 1);
  EXPECT_LT(r.moe_lb_last_window, 1.5);
  EXPECT_GE(r.moe_lb_last_window, 1.0);
  EXPECT_EQ(r.num_executor_failures, 0);
}

/// A shard that serves `real`'s experts but refuses to take more (a copy fails).
actors::expert_shard_actor::behavior_type refusing_new_experts(actors::expert_shard_actor::pointer self,
                                                              actors::expert_shard_actor real) {
  return {[=](moe::expert_request& q) { return self->delegate(real, std::move(q)); },
          [=](msg::fetch_experts& f) { return self->delegate(real, std::move(f)); },
          [](msg::expert_set&) -> caf::result<int32_t> {
            return caf::make_error(caf::sec::invalid_argument, "no room for more experts");
          },
          [=](msg::drop_experts& d) { return self->delegate(real, std::move(d)); }};
}

// The shards refuse every new replica: each proposed move fails (logged), the executor stays on
// round robin (every window's moe_lb is still exactly 2) and serves every request as before.
TEST_F(ActorsThreaded, AnMoeEngineWhoseExpertsCannotMoveServesOnTheOldPlacement) {
  const std::shared_ptr<const model::checkpoint> moe = skewed_moe();
  ASSERT_NE(moe, nullptr);
  start_system();
  start(reassigning_moe(*sys_, moe, /*moe_lb_max=*/1.5,
                        [](caf::actor_system& sys, actors::expert_shard_actor real) {
                          return sys.spawn(refusing_new_experts, real);
                        }));
  num_idle_actors_ += 8 + 1;  // the shards and their fronts, the placement actor
  expect_moe_reference_outputs(*moe, 12);
  expect_eventually_idle();
  const msg::engine_report r = report();
  print_moe_report(r);
  EXPECT_GE(r.num_moe_windows, 4);
  EXPECT_DOUBLE_EQ(r.moe_lb_last_window, 2.0);
  EXPECT_EQ(r.num_expert_moves, 0);
  EXPECT_EQ(r.num_executor_failures, 0);
}

// Expert options that do not fit are refused when the engine is spawned, with what is wrong.
TEST_F(ActorsThreaded, AnEngineRefusesExpertOptionsThatDoNotFit) {
  const std::shared_ptr<const model::checkpoint> moe = skewed_moe();
  ASSERT_NE(moe, nullptr);
  start_system();
  const auto error_of = [&](const actors::engine_options& o) {
    auto engine = actors::spawn_engine(*sys_, o);
    if (engine) caf::anon_send_exit(*engine, caf::exit_reason::user_shutdown);
    return engine ? std::string("spawned") : engine.error().message;
  };
  actors::engine_options o = reassigning_moe(*sys_, moe, 1.5);
  actors::engine_options dense = o;
  dense.checkpoint = bundled_shared().ck;
  EXPECT_EQ(error_of(dense), "expert shard actors need an MoE checkpoint");
  actors::engine_options attached = o;
  attached.detached_executor = false;
  EXPECT_EQ(error_of(attached), "an executor on expert shard actors waits on them: it must be detached");
  actors::engine_options one_layer = o;
  const moe::expert_placement placement = moe::expert_placement::round_robin(1, 4, 4);
  one_layer.experts = std::make_shared<actors::expert_shards>(
      std::make_shared<actors::actor_dispatch>(*sys_, std::vector<actors::expert_shard_actor>(4, actors::expert_shard_actor{}), 1s),
      placement);
  EXPECT_EQ(error_of(one_layer), "the expert placement has 1 layers of 4 experts; the model 5 of 4");
  actors::engine_options no_shards = o;
  no_shards.experts = nullptr;
  EXPECT_EQ(error_of(no_shards), "expert reassignment needs expert shard actors");
  actors::engine_options small = o;
  small.expert_reassignment->capacity = 0;
  EXPECT_NE(error_of(small).find("reassignment: window_steps 8, capacity 0"), std::string::npos) << error_of(small);
}

/// A shard that refuses the first experts it is given (a copy fails there), then takes them.
actors::expert_shard_actor::behavior_type refusing_once(actors::expert_shard_actor::pointer self,
                                                       actors::expert_shard_actor real) {
  auto refused = std::make_shared<bool>(false);
  return {[=](moe::expert_request& q) { return self->delegate(real, std::move(q)); },
          [=](msg::fetch_experts& f) { return self->delegate(real, std::move(f)); },
          [=](msg::expert_set& e) -> caf::result<int32_t> {
            if (std::exchange(*refused, true)) return self->delegate(real, std::move(e));
            return caf::make_error(caf::sec::invalid_argument, "not yet");
          },
          [=](msg::drop_experts& d) { return self->delegate(real, std::move(d)); }};
}

// Each shard refuses the first experts it is given: a copy fails on a shard after others took
// their experts, which are dropped again, so a later proposal of the same placement can move
// (without the drop the shards would refuse those experts as held already, every time).
TEST_F(ActorsThreaded, AnMoeEngineMovesItsExpertsAfterCopiesThatFailedHalfway) {
  const std::shared_ptr<const model::checkpoint> moe = skewed_moe();
  ASSERT_NE(moe, nullptr);
  start_system();
  start(reassigning_moe(*sys_, moe, /*moe_lb_max=*/1.5,
                        [](caf::actor_system& sys, actors::expert_shard_actor real) {
                          return sys.spawn(refusing_once, real);
                        },
                        /*window_steps=*/2));
  num_idle_actors_ += 8 + 1;
  expect_moe_reference_outputs(*moe, 12);
  expect_eventually_idle();
  const msg::engine_report r = report();
  print_moe_report(r);
  EXPECT_GE(r.num_expert_moves, 1);
  EXPECT_EQ(r.num_executor_failures, 0);
}

TEST_F(ActorsThreaded, ADetachedExecutorFailureResumesEveryRequestWithItsUndisturbedOutput) {
  start(with_failing_executor(engine_opts(true)));
  num_idle_actors_ += 1;  // the failing executor wraps the real one: two actors per executor
  auto executor = actors::query_executor(*sys_, engines_[0]);
  ASSERT_TRUE(executor.has_value()) << executor.error().message;
  constexpr size_t n = 8;
  auto track = std::make_shared<tracker>(n);
  std::vector<msg::completion_request> requests;
  for (size_t i = 0; i < n; i++) {
    msg::completion_request r = make_completion(story_window(i), 400, 30 + i);
    r.ignore_eos = true;
    requests.push_back(r);
    track->spawn(*sys_, lb_, i, r);
  }
  ASSERT_TRUE(track->wait_for([](const std::vector<tracker::entry>& es) {
    for (const tracker::entry& e : es)
      if (e.tokens.empty()) return false;
    return true;
  }));
  caf::anon_send(caf::actor_cast<failing_executor_actor>(*executor), fail_next_plan_atom::value, std::string("boom"));
  ASSERT_TRUE(track->wait_all_done(n));
  const std::vector<tracker::entry> entries = track->snapshot();
  for (size_t i = 0; i < n; i++) {
    ASSERT_TRUE(entries[i].outcome->has_value()) << entries[i].outcome->error().message;
    const generate::generation ref = reference(oracle_, requests[i]);
    EXPECT_EQ(entries[i].tokens, ref.tokens) << "the stream of request " << i << " repeats or loses a token";
    expect_matches(**entries[i].outcome, ref, "resumed request " + std::to_string(i));
  }
  expect_eventually_idle();
  EXPECT_EQ(report().num_executor_failures, 1);
}

TEST_F(ActorsThreaded, TheSyncGuardFailsABlockingWaitInsideTheEnginesPath) {
  // The engine performs its effects and the executor runs each plan inside a
  // no_blocking_scope: a helper that blocks on another actor's answer there aborts, naming
  // both. Tripped deliberately with the engine's own query in such a scope; outside it the
  // same query answers.
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // CAF's threads run in this process
  start();
  EXPECT_DEATH(
      {
        const actors::no_blocking_scope guard("the engine's effects");
        (void)actors::query_engine(*sys_, engines_.at(0));
      },
      "sync guard: asking an engine \\(query_engine / query_executor\\) blocks on another actor inside the "
      "engine's effects, which must never wait");
  EXPECT_EQ(report().num_steps, 0);
}

}  // namespace
}  // namespace troupe::testing
