#include "actors/client.hpp"

#include <algorithm>
#include <future>
#include <optional>
#include <string>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/atoms.hpp"
#include "actors/cluster_messages.hpp"

namespace troupe::actors {
namespace {

struct client_state {
  caf::actor request;  // the request actor, once the balancer answered
  std::optional<msg::cancel_request> pending_cancel;  // a cancel that came before the request actor
  completion result;
  bool done = false;
  int64_t request_id = 0;  // from the first chunk (a cancel needs no exact id: its actor is the request)
  bool has_request_id = false;
  // The current wait: silence past `deadline` ends the client with the error `bound`.
  std::optional<caf::actor_clock::time_point> deadline;  // none: no bound
  std::string bound;
  // A pending timer fires at `timer_at` <= deadline (others, later, may be pending too).
  std::optional<caf::actor_clock::time_point> timer_at;
  static inline const char* name = "client";
};

using client_t = caf::stateful_actor<client_state>;

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

/// From now on, silence longer than `allowed` (zero: no bound) ends the client with the error `bound`.
void expect_within(client_t* self, caf::timespan allowed, std::string bound) {
  client_state& st = self->state;
  st.bound = std::move(bound);
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
  const auto whole = unbounded ? std::chrono::milliseconds::zero()
                               : t.first_token + std::max(0, request.max_tokens) * t.between_tokens;
  expect_within(self, whole, "no answer within " + ms(whole) + " (a non-streamed request: the first-token timeout + " +
                                 std::to_string(request.max_tokens) + " x the between-tokens timeout)");
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
  done(self, on_done, fail(errc::unavailable, st.bound));
}

/// Whether a message for request `id` belongs to this client: the first one names the request,
/// every later one must name the same (a misrouted message of another client's is dropped).
bool own(client_t* self, int64_t id) {
  client_state& st = self->state;
  if (!st.has_request_id) {
    st.has_request_id = true;
    st.request_id = id;
  }
  if (id == st.request_id) return true;
  spdlog::warn("client: dropped a message for request {} (this client's is {}): misrouted by CAF", id, st.request_id);
  return false;
}

caf::result<caf::message> drop_foreign(caf::scheduled_actor*, caf::message_view& m) {
  spdlog::debug("client: dropped an unexpected message {}", caf::to_string(m.copy_content_to_message()));
  return caf::message{};
}

caf::behavior client_actor(client_t* self, caf::actor load_balancer, msg::completion_request request,
                           chunk_callback on_chunk, done_callback on_done, client_timeouts timeouts) {
  expect_first(self, request, timeouts);
  const std::string idle_bound =
      "no token for " + ms(timeouts.between_tokens) + " after the last one (the between-tokens timeout)";
  // The request names this actor: the answer reaches it even when the balancer's node sees
  // the message without a sender (msg::submit_completion says when CAF 0.17.6 does that).
  msg::submit_completion submit{std::move(request), caf::actor_cast<caf::actor>(self)};
  self->request(load_balancer, caf::infinite, std::move(submit))
      .then(
          [=](caf::actor& r) {
            if (!r) return;  // nothing to watch or cancel; the stream still comes to this actor
            self->state.request = r;
            self->monitor(r);
            if (self->state.pending_cancel) self->send(r, *self->state.pending_cancel);
          },
          [=](caf::error& err) {
            done(self, on_done, fail(errc::internal, "load balancer unreachable: " + self->system().render(err)));
          });
  self->set_down_handler([=](caf::down_msg& dm) {
    // Across nodes the request actor's down message can overtake its last messages (CAF's
    // middleman delivers them through different paths): give them a moment before failing.
    const std::string why = "the request was lost: " + self->system().render(dm.reason);
    self->delayed_send(self, std::chrono::milliseconds(500), lost_atom::value, why);
  });
  // CAF 0.17.6 can misroute a message meant for an actor of another process after a connection
  // closes and its file descriptor is reused (see msg::submit_completion): such a message must
  // neither reach stdout (the default handler prints it) nor join this completion.
  self->set_default_handler(drop_foreign);
  return {
      [=](msg::completion_chunk& c) {
        if (!own(self, c.request_id)) return;
        expect_within(self, timeouts.between_tokens, idle_bound);
        completion& r = self->state.result;
        r.text += c.text;
        r.tokens.insert(r.tokens.end(), c.tokens.begin(), c.tokens.end());
        r.logprobs.insert(r.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
        if (on_chunk) on_chunk(c);
      },
      [=](msg::completion_end& e) {
        if (!own(self, e.request_id)) return;
        self->state.result.end = e;
        done(self, on_done, self->state.result);
      },
      [=](msg::completion_error& e) {
        if (own(self, e.request_id)) done(self, on_done, fail(errc_from_string(e.code), e.message));
      },
      [=](lost_atom, const std::string& why) { done(self, on_done, fail(errc::internal, why)); },
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

errc errc_from_string(const std::string& code) {
  for (errc c : {errc::invalid_argument, errc::malformed_file, errc::io_error, errc::invalid_utf8,
                 errc::too_long, errc::not_found, errc::overloaded, errc::cancelled, errc::unavailable,
                 errc::internal})
    if (code == to_string(c)) return c;
  return errc::internal;
}

caf::actor spawn_client(caf::actor_system& sys, caf::actor load_balancer, msg::completion_request request,
                        chunk_callback on_chunk, done_callback on_done, client_timeouts timeouts) {
  return sys.spawn(client_actor, std::move(load_balancer), std::move(request), std::move(on_chunk),
                   std::move(on_done), timeouts);
}

expected<completion> complete(caf::actor_system& sys, const caf::actor& load_balancer,
                              const msg::completion_request& request, const chunk_callback& on_chunk,
                              const client_timeouts& timeouts) {
  auto promise = std::make_shared<std::promise<expected<completion>>>();
  auto future = promise->get_future();
  spawn_client(sys, load_balancer, request, on_chunk,
               [promise](const expected<completion>& outcome) { promise->set_value(outcome); }, timeouts);
  return future.get();
}

}  // namespace troupe::actors
