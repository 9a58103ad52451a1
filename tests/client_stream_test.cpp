// The client's end of stream, decided by the protocol (issue 12, point 4): chunks are numbered,
// the end and the error count them, so a client whose request actor went down before the last
// chunks waits for exactly what is missing (bounded by the between-tokens timeout), puts
// out-of-order chunks back in order, and checks the enums another process sent. A fake
// balancer and request actor on CAF's test coordinator play the server side, message by message.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/client.hpp"
#include "actors/system/cluster_messages.hpp"
#include "actors/system/type_ids.hpp"
#include "tests/support/actor_config.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

class ClientStream : public ::testing::Test {
 protected:
  caf::actor_system_config cfg_;
  caf::actor_system sys_{configure(cfg_, /*deterministic=*/true)};
  caf::scheduler::test_coordinator& sched_ = dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler());
  actors::request_actor request_;  // the fake request actor: ignores everything
  actors::client_actor client_;
  std::vector<std::string> chunks_;  // chunk texts in the order the client delivered them
  std::optional<expected<actors::completion>> outcome_;
  int num_done_ = 0;
  uint64_t stream_ = 0;  // the client's stream id, from its submit_completion

  /// Spawns the client against a fake balancer that answers with the fake request actor.
  void start(actors::client_timeouts t = {5000ms, 1000ms}) {
    sched_.clock().current_time += 1h;
    // Untyped fakes, cast to the interfaces they stand in for.
    request_ = caf::actor_cast<actors::request_actor>(sys_.spawn([] { return caf::behavior{[](msg::cancel_request&) {}}; }));
    const actors::request_actor request = request_;
    const auto balancer = caf::actor_cast<actors::balancer_client_actor>(
        sys_.spawn([this, request] {
          return caf::behavior{[this, request](msg::submit_completion& s) {
            stream_ = s.stream;
            return request;
          }};
        }));
    msg::completion_request r;
    r.prompt = "x";
    r.max_tokens = 8;
    client_ = actors::spawn_client(
        sys_, balancer, r, [this](const msg::completion_chunk& c) { chunks_.push_back(c.text); },
        [this](const expected<actors::completion>& o) {
          outcome_ = o;
          num_done_++;
        },
        t);
    sched_.run();
    caf::anon_send_exit(balancer, caf::exit_reason::user_shutdown);
    sched_.run();
  }

  template <class Message>
  void send(Message m) {
    caf::anon_send(client_, std::move(m));
    sched_.run();
  }

  void chunk(int32_t sequence, std::string text) { send(msg::completion_chunk{7, stream_, sequence, text, {}, {}}); }

  void end(int32_t num_chunks, engine::finish_reason reason = engine::finish_reason::length) {
    msg::completion_end e;
    e.request_id = 7;
    e.stream = stream_;
    e.finish_reason = reason;
    e.num_chunks = num_chunks;
    send(e);
  }

  void request_goes_down() {
    caf::anon_send_exit(request_, caf::exit_reason::kill);
    sched_.run();
  }

  /// Fires timers until the client ended (or none is left).
  void run_timers() {
    while (num_done_ == 0 && sched_.trigger_timeout()) sched_.run();
  }

  void TearDown() override {
    if (client_) caf::anon_send_exit(client_, caf::exit_reason::kill);
    if (request_) caf::anon_send_exit(request_, caf::exit_reason::kill);
    sched_.run();
  }
};

TEST_F(ClientStream, ChunksThatArriveAfterTheEndAndTheDownAreWaitedForAndPutInOrder) {
  start();
  chunk(1, "b");
  end(3);
  request_goes_down();
  EXPECT_EQ(num_done_, 0) << "chunks 0 and 2 are missing";
  chunk(2, "c");
  EXPECT_EQ(num_done_, 0);
  chunk(0, "a");
  ASSERT_EQ(num_done_, 1);
  ASSERT_TRUE(outcome_->has_value()) << outcome_->error().message;
  EXPECT_EQ((*outcome_)->text, "abc");
  EXPECT_EQ(chunks_, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ((*outcome_)->end.finish_reason, engine::finish_reason::length);
  EXPECT_EQ((*outcome_)->end.num_chunks, 3);
}

TEST_F(ClientStream, MessagesOfAnotherStreamAreDropped) {
  // CAF 0.17.6 can misroute another client's messages here (docs/resources.md): they carry
  // that client's stream id, or none, and must not join this completion.
  start();
  ASSERT_NE(stream_, 0u);
  send(msg::completion_chunk{9, stream_ + 1, 0, "foreign", {}, {}});
  send(msg::completion_chunk{9, 0, 0, "unstamped", {}, {}});
  msg::completion_end foreign_end;
  foreign_end.request_id = 9;
  foreign_end.stream = stream_ + 1;
  send(foreign_end);
  send(msg::completion_error{9, 0, errc::internal, "foreign", 0});
  EXPECT_EQ(num_done_, 0);
  chunk(0, "a");
  end(1);
  ASSERT_EQ(num_done_, 1);
  ASSERT_TRUE(outcome_->has_value()) << outcome_->error().message;
  EXPECT_EQ((*outcome_)->text, "a");
  EXPECT_EQ((*outcome_)->end.request_id, 7);
}

TEST_F(ClientStream, AnEndThatOvertookTheDownIsWaitedForWithoutAGracePeriod) {
  start();
  chunk(0, "a");
  request_goes_down();
  EXPECT_EQ(num_done_, 0) << "the end is not here yet";
  end(1);
  ASSERT_EQ(num_done_, 1) << "done the moment the end arrived: no timer involved";
  ASSERT_TRUE(outcome_->has_value()) << outcome_->error().message;
  EXPECT_EQ((*outcome_)->text, "a");
}

TEST_F(ClientStream, AnEndWithEveryChunkInFinishesAtOnce) {
  start();
  chunk(0, "a");
  chunk(1, "b");
  end(2, engine::finish_reason::stop);
  ASSERT_EQ(num_done_, 1);
  ASSERT_TRUE(outcome_->has_value());
  EXPECT_EQ((*outcome_)->text, "ab");
  EXPECT_EQ((*outcome_)->end.finish_reason, engine::finish_reason::stop);
}

TEST_F(ClientStream, ARequestLostBeforeItsEndFailsAfterTheBetweenTokensBound) {
  start();
  chunk(0, "a");
  const auto down_at = sched_.clock().now();
  request_goes_down();
  run_timers();
  ASSERT_EQ(num_done_, 1);
  ASSERT_FALSE(outcome_->has_value());
  EXPECT_EQ(outcome_->error().code, errc::internal);
  EXPECT_EQ(outcome_->error().message.rfind("the request was lost: ", 0), 0u) << outcome_->error().message;
  EXPECT_NE(outcome_->error().message.find("its end did not arrive within 1000 ms"), std::string::npos)
      << outcome_->error().message;
  EXPECT_EQ(sched_.clock().now() - down_at, std::chrono::milliseconds(1000));
}

TEST_F(ClientStream, ChunksAfterTheDownKeepTheLossAsTheReasonIfTheEndNeverComes) {
  start();
  request_goes_down();
  chunk(0, "a");
  run_timers();
  ASSERT_EQ(num_done_, 1);
  ASSERT_FALSE(outcome_->has_value());
  EXPECT_EQ(outcome_->error().code, errc::internal);
  EXPECT_EQ(outcome_->error().message.rfind("the request was lost: ", 0), 0u) << outcome_->error().message;
  EXPECT_EQ(chunks_, (std::vector<std::string>{"a"}));
}

TEST_F(ClientStream, MissingChunksAfterTheEndFailAfterTheBetweenTokensBound) {
  start();
  chunk(0, "a");
  end(2);
  run_timers();
  ASSERT_EQ(num_done_, 1);
  ASSERT_FALSE(outcome_->has_value());
  EXPECT_EQ(outcome_->error().code, errc::internal);
  EXPECT_EQ(outcome_->error().message,
            "the stream ended after 2 chunks but only 1 arrived in order within 1000 ms (the between-tokens timeout)");
}

TEST_F(ClientStream, DuplicateChunksAndChunksPastTheEndAreDropped) {
  start();
  chunk(0, "a");
  chunk(0, "A");
  chunk(2, "c");
  chunk(2, "C");
  end(3);
  chunk(3, "d");
  chunk(1, "b");
  ASSERT_EQ(num_done_, 1);
  ASSERT_TRUE(outcome_->has_value());
  EXPECT_EQ((*outcome_)->text, "abc");
}

TEST_F(ClientStream, AnEndCountingFewerChunksThanArrivedIsAnError) {
  start();
  chunk(0, "a");
  chunk(1, "b");
  end(1);
  ASSERT_EQ(num_done_, 1);
  ASSERT_FALSE(outcome_->has_value());
  EXPECT_EQ(outcome_->error().code, errc::internal);
  EXPECT_EQ(outcome_->error().message, "the stream's end counts 1 chunks but chunk 1 arrived");
}

TEST_F(ClientStream, AnErrorWaitsForTheChunksItCountsAndKeepsItsCode) {
  start();
  send(msg::completion_error{7, stream_, errc::too_long, "too long", 1});
  EXPECT_EQ(num_done_, 0);
  chunk(0, "a");
  ASSERT_EQ(num_done_, 1);
  ASSERT_FALSE(outcome_->has_value());
  EXPECT_EQ(outcome_->error().code, errc::too_long);
  EXPECT_EQ(outcome_->error().message, "too long");
  EXPECT_EQ(chunks_, (std::vector<std::string>{"a"}));
}

TEST_F(ClientStream, AnUnknownErrorCodeFromAnotherProcessBecomesAnInternalError) {
  start();
  send(msg::completion_error{7, stream_, static_cast<errc>(77), "from a newer server", 0});
  ASSERT_EQ(num_done_, 1);
  ASSERT_FALSE(outcome_->has_value());
  EXPECT_EQ(outcome_->error().code, errc::internal);
  EXPECT_EQ(outcome_->error().message, "the request failed with an unknown error code 77: from a newer server");
}

TEST_F(ClientStream, AnUnknownFinishReasonFromAnotherProcessBecomesAnInternalError) {
  start();
  end(0, static_cast<engine::finish_reason>(99));
  ASSERT_EQ(num_done_, 1);
  ASSERT_FALSE(outcome_->has_value());
  EXPECT_EQ(outcome_->error().code, errc::internal);
  EXPECT_EQ(outcome_->error().message, "the stream ended with an unknown finish reason 99");
}

}  // namespace
}  // namespace troupe::testing
