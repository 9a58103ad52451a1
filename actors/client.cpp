#include "actors/client.hpp"

#include <algorithm>
#include <future>
#include <map>
#include <optional>
#include <string>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/atoms.hpp"
#include "actors/system/boundary.hpp"
#include "actors/system/cluster_messages.hpp"
#include "actors/system/random.hpp"

namespace troupe::actors {
namespace {

struct client_state {
  request_actor request;  // the request actor, once the balancer answered
  std::optional<msg::cancel_request> pending_cancel;  // a cancel that came before the request actor
  completion result;
  bool done = false;
  uint64_t stream = 0;     // this client's stream id, drawn at start (submit_completion::stream)
  int64_t request_id = 0;  // from its messages (a cancel needs no exact id: its actor is the request)
  // Chunks are delivered in sequence order: `next_chunk` is the next one due, `early` holds
  // those that overtook it (across nodes, CAF may deliver out of order).
  int32_t next_chunk = 0;
  std::map<int32_t, msg::completion_chunk> early;
  // The end or error once it arrived, and how many chunks it says were sent before it.
  std::optional<expected<msg::completion_end>> ending;
  int32_t num_chunks = 0;
  // Set when the request actor went down before its end: the bound then names the loss.
  std::optional<std::string> lost;
  // The current wait: silence past `deadline` ends the client with the error `bound`.
  std::optional<caf::actor_clock::time_point> deadline;  // none: no bound
  std::string bound;
  errc bound_code = errc::unavailable;
  // A pending timer fires at `timer_at` <= deadline (others, later, may be pending too).
  std::optional<caf::actor_clock::time_point> timer_at;
  static inline const char* name = "client";
};

using client_t = client_actor::stateful_base<client_state>;

void done(client_t* self, const done_callback& on_done, const expected<completion>& outcome) {
  if (self->state.done) return;
  self->state.done = true;
  on_done(outcome);
  self->quit();
}

std::string ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

void arm_timer(client_t* self, caf::actor_clock::time_point at) {
  self->state.timer_at = at;
  self->delayed_send(self, at - self->clock().now(), timeout_atom::value, at.time_since_epoch().count());
}

/// From now on, silence longer than `allowed` (zero: no bound) ends the client with the error
/// `bound` (of class `code`).
void expect_within(client_t* self, caf::timespan allowed, std::string bound, errc code = errc::unavailable) {
  client_state& st = self->state;
  st.bound = std::move(bound);
  st.bound_code = code;
  st.deadline.reset();
  if (allowed.count() == 0) return;
  st.deadline = self->clock().now() + allowed;
  if (!st.timer_at || *st.timer_at > *st.deadline) arm_timer(self, *st.deadline);
}

/// The first wait: for the first chunk, or for the whole answer when nothing streams.
void expect_first(client_t* self, const msg::completion_request& request, const client_timeouts& t) {
  if (request.stream) {
    expect_within(self, t.first_token, "no first token within " + ms(t.first_token) +
                                           " (the first-token timeout): the server may be frozen, overloaded or cut off");
    return;
  }
  const bool unbounded = t.first_token.count() == 0 || t.between_tokens.count() == 0;
  // At most a day (or the first-token timeout, if longer): a request without max_tokens (to the
  // end of the context) asks for ~2^31 tokens, and that many between-tokens timeouts overflowed
  // the wait's nanosecond count (in milliseconds the product fits: the timeouts are seconds).
  const std::chrono::milliseconds cap = std::max<std::chrono::milliseconds>(std::chrono::hours(24), t.first_token);
  const auto whole = unbounded ? std::chrono::milliseconds::zero()
                               : std::min(t.first_token + int64_t{std::max(0, request.max_tokens)} * t.between_tokens, cap);
  expect_within(self, whole, "no answer within " + ms(whole) + " (a non-streamed request: the first-token timeout + " +
                                 std::to_string(request.max_tokens) + " x the between-tokens timeout, at most " +
                                 ms(cap) + ")");
}

/// A timer set for `at` fired: give up (cancelling the request) if the deadline passed, else
/// keep a timer pending for it.
void on_timeout(client_t* self, int64_t at, const done_callback& on_done) {
  client_state& st = self->state;
  if (!st.timer_at || st.timer_at->time_since_epoch().count() != at) return;  // a later, stale one
  st.timer_at.reset();
  if (!st.deadline) return;
  if (self->clock().now() < *st.deadline) {
    arm_timer(self, *st.deadline);
    return;
  }
  if (st.request) self->send(st.request, msg::cancel_request{st.request_id});
  done(self, on_done, fail(st.bound_code, st.bound));
}

/// A random, non-zero stream id: only this client's request stamps it on its messages.
uint64_t draw_stream_id() {
  const uint64_t id = draw_unguessable_u64();
  return id != 0 ? id : 1;
}

/// Whether a message of `stream` for request `id` belongs to this client: a message CAF
/// misrouted from another client's request carries another stream id (or none) and is dropped.
bool own(client_t* self, uint64_t stream, int64_t id) {
  client_state& st = self->state;
  if (stream != st.stream) {
    spdlog::warn("client: dropped a message of request {} on another client's stream: misrouted by CAF", id);
    return false;
  }
  st.request_id = id;  // the same in every message of this stream
  return true;
}

caf::result<caf::message> drop_foreign(caf::scheduled_actor*, caf::message_view& m) {
  spdlog::debug("client: dropped an unexpected message {}", caf::to_string(m.copy_content_to_message()));
  return caf::message{};
}

/// Appends a chunk (the next one in sequence) to the completion.
void deliver(client_t* self, const msg::completion_chunk& c, const chunk_callback& on_chunk) {
  completion& r = self->state.result;
  r.text += c.text;
  r.reasoning_text += c.reasoning_text;
  r.tool_calls.insert(r.tool_calls.end(), c.tool_calls.begin(), c.tool_calls.end());
  r.tokens.insert(r.tokens.end(), c.tokens.begin(), c.tokens.end());
  r.logprobs.insert(r.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
  r.top_logprobs.insert(r.top_logprobs.end(), c.top_logprobs.begin(), c.top_logprobs.end());
  if (on_chunk) on_chunk(c);
}

/// Takes chunk `c` in: delivers it and every early one it unblocks, in sequence order. A
/// duplicate, or one past the count the end announced, is dropped.
void on_chunk_arrived(client_t* self, msg::completion_chunk& c, const chunk_callback& on_chunk) {
  client_state& st = self->state;
  const bool past_end = st.ending && c.sequence >= st.num_chunks;
  if (c.sequence < st.next_chunk || past_end || st.early.count(c.sequence) != 0) {
    spdlog::warn("client: dropped chunk {} of request {} (next due {}): a duplicate or past the end", c.sequence,
                 c.request_id, st.next_chunk);
    return;
  }
  st.early.emplace(c.sequence, std::move(c));
  for (auto it = st.early.begin(); it != st.early.end() && it->first == st.next_chunk; it = st.early.erase(it)) {
    deliver(self, it->second, on_chunk);
    st.next_chunk++;
  }
}

/// Ends the client once the end (or error) arrived and every chunk it counts was delivered;
/// else keeps waiting for the missing ones, bounded by the between-tokens timeout.
void finish_when_complete(client_t* self, const done_callback& on_done, std::chrono::milliseconds between_tokens) {
  client_state& st = self->state;
  if (!st.ending) return;
  if (st.next_chunk >= st.num_chunks) {
    if (!*st.ending) {
      done(self, on_done, tl::unexpected(st.ending->error()));
      return;
    }
    st.result.end = **st.ending;
    done(self, on_done, st.result);
    return;
  }
  expect_within(self, between_tokens,
                "the stream ended after " + std::to_string(st.num_chunks) + " chunks but only " +
                    std::to_string(st.next_chunk) + " arrived in order within " + ms(between_tokens) +
                    " (the between-tokens timeout)",
                errc::internal);
}

/// The request's end or error arrived: checks what another process sent before trusting it.
void on_ending(client_t* self, expected<msg::completion_end> outcome, int32_t num_chunks) {
  client_state& st = self->state;
  const int32_t seen = st.early.empty() ? st.next_chunk : st.early.rbegin()->first + 1;
  if (num_chunks < seen)
    outcome = fail(errc::internal, "the stream's end counts " + std::to_string(num_chunks) + " chunks but chunk " +
                                       std::to_string(seen - 1) + " arrived");
  st.ending = std::move(outcome);
  st.num_chunks = std::max(num_chunks, seen);
}

expected<msg::completion_end> outcome_of(const msg::completion_end& e) {
  if (!is_valid(e.finish_reason) || e.finish_reason == engine::finish_reason::none)
    return fail(errc::internal, "the stream ended with an unknown finish reason " +
                                    std::to_string(static_cast<int>(e.finish_reason)));
  return e;
}

expected<msg::completion_end> outcome_of(const msg::completion_error& e) {
  if (!is_valid(e.code))
    return fail(errc::internal, "the request failed with an unknown error code " +
                                    std::to_string(static_cast<int>(e.code)) + ": " + e.message);
  return fail(e.code, e.message);
}

client_actor::behavior_type client_behavior(client_t* self, balancer_client_actor load_balancer, msg::completion_request request,
                           chunk_callback on_chunk, done_callback on_done, client_timeouts timeouts) {
  expect_first(self, request, timeouts);
  const std::string idle_bound =
      "no token for " + ms(timeouts.between_tokens) + " after the last one (the between-tokens timeout)";
  // The request names this actor: the answer reaches it even when the balancer's node sees
  // the message without a sender (msg::submit_completion says when CAF 0.17.6 does that).
  self->state.stream = draw_stream_id();
  msg::submit_completion submit{std::move(request), caf::actor_cast<stream_receiver_actor>(self), self->state.stream};
  self->request(load_balancer, caf::infinite, std::move(submit))
      .then(
          [=](request_actor& r) {
            if (!r) return;  // nothing to watch or cancel; the stream still comes to this actor
            self->state.request = r;
            self->monitor(r);
            if (self->state.pending_cancel) self->send(r, *self->state.pending_cancel);
          },
          [=](caf::error& err) {
            done(self, on_done, fail(errc::unavailable, "load balancer unreachable: " + self->system().render(err)));
          });
  self->set_down_handler([=](caf::down_msg& dm) {
    // Across nodes the request actor's down message can overtake its last messages (CAF's
    // middleman delivers them through different paths). Before its end arrived, the stream is
    // incomplete by protocol: wait for the end under the between-tokens bound (none: nothing
    // can overtake in one process, the simulator's case, so the request is lost now).
    if (self->state.ending) return;  // already waiting for counted chunks
    // The request actor lives on the balancer's node: unreachable means that node is gone (or
    // cut off), which the cluster cannot recover from for this client (docs/cluster.md).
    const bool node_lost = dm.reason == caf::exit_reason::remote_link_unreachable;
    const errc code = node_lost ? errc::unavailable : errc::internal;
    const std::string why = node_lost ? "the load balancer's node is unreachable (it stopped or the connection broke); "
                                        "the request is lost"
                                      : "the request was lost: " + self->system().render(dm.reason);
    if (timeouts.between_tokens.count() == 0) {
      done(self, on_done, fail(code, why));
      return;
    }
    self->state.lost = why + " (its end did not arrive within " + ms(timeouts.between_tokens) + ")";
    expect_within(self, timeouts.between_tokens, *self->state.lost, code);
  });
  // CAF 0.17.6 can misroute a message meant for an actor of another process after a connection
  // closes and its file descriptor is reused (see msg::submit_completion): such a message must
  // neither reach stdout (the default handler prints it) nor join this completion.
  guard_boundary(self);  // an error message would end it without an outcome
  self->set_default_handler(drop_foreign);
  return {
      [=](msg::completion_chunk& c) {
        if (!own(self, c.stream, c.request_id)) return;
        client_state& st = self->state;
        if (st.lost && !st.ending)
          expect_within(self, timeouts.between_tokens, *st.lost, errc::internal);
        else if (!st.ending)
          expect_within(self, timeouts.between_tokens, idle_bound);
        on_chunk_arrived(self, c, on_chunk);
        finish_when_complete(self, on_done, timeouts.between_tokens);
      },
      [=](msg::completion_end& e) {
        if (!own(self, e.stream, e.request_id) || self->state.ending) return;
        on_ending(self, outcome_of(e), e.num_chunks);
        finish_when_complete(self, on_done, timeouts.between_tokens);
      },
      [=](msg::completion_error& e) {
        if (!own(self, e.stream, e.request_id) || self->state.ending) return;
        on_ending(self, outcome_of(e), e.num_chunks);
        finish_when_complete(self, on_done, timeouts.between_tokens);
      },
      [=](timeout_atom, int64_t at) { on_timeout(self, at, on_done); },
      [=](msg::cancel_request& c) {
        if (self->state.request)
          self->send(self->state.request, c);
        else
          self->state.pending_cancel = c;
      },
  };
}

}  // namespace

client_actor spawn_client(caf::actor_system& sys, balancer_client_actor load_balancer, msg::completion_request request,
                        chunk_callback on_chunk, done_callback on_done, client_timeouts timeouts) {
  return sys.spawn(client_behavior, std::move(load_balancer), std::move(request), std::move(on_chunk),
                   std::move(on_done), timeouts);
}

expected<completion> complete(caf::actor_system& sys, const balancer_client_actor& load_balancer,
                              const msg::completion_request& request, const chunk_callback& on_chunk,
                              const client_timeouts& timeouts) {
  auto promise = std::make_shared<std::promise<expected<completion>>>();
  auto future = promise->get_future();
  spawn_client(sys, load_balancer, request, on_chunk,
               [promise](const expected<completion>& outcome) { promise->set_value(outcome); }, timeouts);
  return future.get();
}

}  // namespace troupe::actors
