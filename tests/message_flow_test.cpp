// The main message flows as sequences, not only end states: under CAF's test coordinator (one
// thread, virtual clock, the executor on the scheduler) every message is delivered one at a
// time and recorded as "sender -> receiver: message", and each flow is compared with its exact
// sequence. A change in who sends what, or in what order, fails here with both sequences
// printed; docs/DESIGN.md ("Typed protocols") names every message.
// Flows: one streamed request from submission to its end; a second balancer's reports; a cancel
// mid-stream; an executor that fails mid-stream (every request fails, the engine replaces its
// executor).
#include <gtest/gtest.h>

#include <algorithm>

#include <string>
#include <typeindex>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/system/protocols.hpp"
#include "tests/support/actor_harness.hpp"
#include "tests/support/failing_executor.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

class MessageFlow : public ::testing::Test {
 protected:
  caf::actor_system_config cfg_;
  caf::actor_system sys_{configure(cfg_, /*deterministic=*/true)};
  caf::scheduler::test_coordinator& sched_{dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())};
  actors::engine_list engines_;
  actors::balancer_actor lb_;
  actors::client_actor client_;
  actors::executor_actor executor_;  // the engine's, as it started
  std::shared_ptr<client_log> log_ = std::make_shared<client_log>();

  /// One engine (`o`) behind a balancer, started and idle; then one streamed greedy request
  /// for `max_tokens` tokens.
  void start(actors::engine_options o = engine_opts(false), int32_t max_tokens = 3) {
    sched_.clock().current_time += 1h;
    engines_.push_back(spawn_engine_or_die(sys_, o));
    lb_ = spawn_balancer(sys_, engines_);
    sched_.run();  // the balancer's report_to and the engine's first load report
    sys_.spawn([this](caf::event_based_actor* self) {
      self->request(engines_[0], caf::infinite, actors::executor_atom::value)
          .then([this](actors::executor_actor& x) { executor_ = x; });
    });
    sched_.run();
    msg::completion_request r = make_completion("Once upon a time", max_tokens, 5, 0.0f);
    r.ignore_eos = true;
    client_ = spawn_logged_client(sys_, lb_, r, log_);
  }

  void TearDown() override {
    for (const actors::engine_actor& e : engines_) caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(lb_, caf::exit_reason::user_shutdown);
    sched_.run();
  }

  /// CAF's name for an actor: its state's `name` ("engine", "request", …).
  static std::string name_of(const caf::strong_actor_ptr& ptr) {
    auto* actor = ptr ? dynamic_cast<caf::local_actor*>(caf::actor_cast<caf::abstract_actor*>(ptr)) : nullptr;
    return actor ? actor->name() : "(none)";
  }

  /// A message's first element, by its registered name ("troupe::" dropped), atom or CAF type.
  std::string describe(caf::mailbox_element& e) const {
    const caf::type_erased_tuple& content = e.content();
    if (content.empty()) return "()";
    const caf::rtti_pair type = content.type(0);
    if (type.first == caf::type_nr<caf::atom_value>::value) return "'" + caf::to_string(content.get_as<caf::atom_value>(0)) + "'";
    if (type.first == caf::type_nr<caf::down_msg>::value) return "DOWN";
    if (type.first == caf::type_nr<caf::error>::value) return "error";
    if (type.second != nullptr) {
      auto it = cfg_.type_names_by_rtti.find(std::type_index(*type.second));
      if (it != cfg_.type_names_by_rtti.end()) return it->second.substr(it->second.rfind(':') + 1);
    }
    return "?";
  }

  /// Runs messages one at a time (the clock advancing 1 ms after each) until `stop()` holds or
  /// nothing is left, recording each as "sender -> receiver: message". A job without a message
  /// (an actor starting) is run unrecorded.
  template <class Stop>
  std::vector<std::string> trace_until(Stop stop) {
    std::vector<std::string> out;
    while (!stop()) {
      if (!sched_.has_job() && !sched_.trigger_timeouts()) break;
      if (!sched_.has_job()) continue;
      auto* actor = dynamic_cast<caf::scheduled_actor*>(sched_.jobs.front());
      if (caf::mailbox_element* e = actor ? actor->mailbox().peek() : nullptr)
        out.push_back(name_of(e->sender) + " -> " + actor->name() + ": " + describe(*e));
      sched_.run_once();
      sched_.advance_time(1ms);
    }
    return out;
  }

  std::vector<std::string> trace_all() {
    return trace_until([] { return false; });
  }
};

TEST_F(MessageFlow, AStreamedRequestFromSubmissionToItsEnd) {
  start();
  const std::vector<std::string> trace = trace_all();
  const std::vector<std::string> expected = {
      "client -> load_balancer: submit_completion",
      "load_balancer -> client: request_actor",
      "request -> load_balancer: place_request",
      "load_balancer -> request: placement",
      "request -> engine: submit",
      "engine -> step_executor: exec_plan",  // step 0: the prompt, sampling token 1
      "engine -> step_executor: exec_plan",  // step 1 planned while step 0 runs (two in flight)
      "step_executor -> engine: exec_result",
      "step_executor -> engine: exec_result",
      "engine -> request: sampled",
      "engine -> request: sampled",
      "engine -> step_executor: exec_plan",  // step 2, the last token
      "request -> client: completion_chunk",  // streamed: one chunk per token
      "request -> client: completion_chunk",
      "step_executor -> engine: exec_result",
      "engine -> request: sampled",            // finish: length
      "request -> client: completion_chunk",
      "request -> client: completion_end",     // counts 3 chunks
      "request -> engine: DOWN",               // the request actor quit: the engine forgets it
      "engine -> engine: 'report'",            // the load changed: one report per interval
      "request -> load_balancer: DOWN",        // the balancer counts the request as ended
      "engine -> load_balancer: load_report",
  };
  EXPECT_EQ(trace, expected);
  ASSERT_TRUE(log_->outcome.has_value() && log_->outcome->has_value());
  EXPECT_EQ(log_->tokens().size(), 3u);
}

TEST_F(MessageFlow, ASecondBalancerGetsTheSameLoadReportsUntilItGoesDown) {
  start();
  (void)trace_all();  // the request, to its end
  const actors::balancer_actor second = spawn_balancer(sys_, engines_);
  const std::vector<std::string> joined = trace_all();
  const std::vector<std::string> expected_joined = {
      "load_balancer -> engine: report_to",   // the second asks: a report at once, to both
      "engine -> load_balancer: load_report",
      "engine -> load_balancer: load_report",
  };
  EXPECT_EQ(joined, expected_joined);
  caf::anon_send_exit(second, caf::exit_reason::user_shutdown);
  const std::vector<std::string> left = trace_all();
  const std::vector<std::string> expected_left = {
      "(none) -> load_balancer: ?",     // the exit
      "load_balancer -> engine: DOWN",  // dropped from its list
  };
  EXPECT_EQ(left, expected_left);
  // A new request: its end's report goes to the first balancer alone.
  msg::completion_request r = make_completion("Once upon a time", 1, 6, 0.0f);
  r.ignore_eos = true;
  auto log = std::make_shared<client_log>();
  (void)spawn_logged_client(sys_, lb_, r, log);
  const std::vector<std::string> trace = trace_all();
  ASSERT_FALSE(trace.empty());
  EXPECT_EQ(trace.back(), "engine -> load_balancer: load_report");
  EXPECT_EQ(std::count(trace.begin(), trace.end(), "engine -> load_balancer: load_report"), 1) << ::testing::PrintToString(trace);
  ASSERT_TRUE(log->outcome.has_value() && log->outcome->has_value());
}

TEST_F(MessageFlow, ACancelMidStream) {
  start();
  (void)trace_until([&] { return !log_->chunks.empty(); });
  caf::anon_send(client_, msg::cancel_request{});
  const std::vector<std::string> trace = trace_all();
  const std::vector<std::string> expected = {
      "request -> client: completion_chunk",
      "(none) -> client: cancel_request",
      "step_executor -> engine: exec_result",  // its token reaches the request after the cancel: dropped
      "client -> request: cancel_request",
      "request -> engine: release",            // the engine frees the request's blocks
      "request -> engine: DOWN",
      "engine -> engine: 'report'",
      "request -> client: completion_end",
      "request -> load_balancer: DOWN",
      "engine -> load_balancer: load_report",
  };
  EXPECT_EQ(trace, expected);
  ASSERT_TRUE(log_->outcome.has_value() && log_->outcome->has_value());
  EXPECT_EQ((*log_->outcome)->end.finish_reason, engine::finish_reason::cancelled);
}

TEST_F(MessageFlow, AnExecutorFailureMidStreamResumesTheRequestOnTheNewExecutor) {
  start(with_failing_executor(engine_opts(false)), 8);
  (void)trace_until([&] { return !log_->chunks.empty(); });
  caf::anon_send(caf::actor_cast<failing_executor_actor>(executor_), fail_next_plan_atom::value, std::string("boom"));
  const std::vector<std::string> trace = trace_all();
  const std::vector<std::string> expected = {
      "request -> client: completion_chunk",
      "engine -> step_executor: exec_plan",
      "engine -> step_executor: exec_plan",
      "(none) -> failing_step_executor: 'failnext'",  // its next plan fails
      "step_executor -> engine: exec_result",
      "engine -> engine: 'report'",
      "step_executor -> engine: exec_result",
      "engine -> request: sampled",
      "engine -> request: sampled",
      "engine -> failing_step_executor: exec_plan",  // fails; the plan behind it is never run
      "engine -> load_balancer: load_report",
      "request -> client: completion_chunk",
      "request -> client: completion_chunk",
      "failing_step_executor -> engine: error",  // the failed plan's answer
      "(none) -> engine: error",                  // CAF's: the queued plan's receiver is down
      "failing_step_executor -> engine: DOWN",    // handled once: a new executor is spawned ...
      "engine -> failing_step_executor: exec_plan",  // ... and the request resumes on it by
      "engine -> failing_step_executor: exec_plan",  // recompute: no rejection, no error
  };
  ASSERT_GE(trace.size(), expected.size());
  EXPECT_EQ(std::vector<std::string>(trace.begin(), trace.begin() + static_cast<std::ptrdiff_t>(expected.size())),
            expected);
  EXPECT_EQ(std::count(trace.begin(), trace.end(), "engine -> request: rejected"), 0);
  ASSERT_TRUE(log_->outcome.has_value());
  ASSERT_TRUE(log_->outcome->has_value()) << log_->outcome->error().message;
  EXPECT_EQ((*log_->outcome)->end.num_generated_tokens, 8);
  EXPECT_EQ(log_->tokens().size(), 8u);  // one continuous stream
}

}  // namespace
}  // namespace troupe::testing
