#include "actors/client.hpp"

#include <future>
#include <optional>

#include <caf/all.hpp>

#include "actors/atoms.hpp"
#include "actors/cluster_messages.hpp"

namespace troupe::actors {
namespace {

struct client_state {
  caf::actor request;  // the request actor, once the balancer answered
  std::optional<msg::cancel_request> pending_cancel;  // a cancel that came before the request actor
  completion result;
  bool done = false;
  static inline const char* name = "client";
};

using client_t = caf::stateful_actor<client_state>;

void done(client_t* self, const done_callback& on_done, const expected<completion>& outcome) {
  if (self->state.done) return;
  self->state.done = true;
  on_done(outcome);
  self->quit();
}

caf::behavior client_actor(client_t* self, caf::actor load_balancer, msg::completion_request request,
                           chunk_callback on_chunk, done_callback on_done) {
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
  return {
      [=](msg::completion_chunk& c) {
        completion& r = self->state.result;
        r.text += c.text;
        r.tokens.insert(r.tokens.end(), c.tokens.begin(), c.tokens.end());
        r.logprobs.insert(r.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
        if (on_chunk) on_chunk(c);
      },
      [=](msg::completion_end& e) {
        self->state.result.end = e;
        done(self, on_done, self->state.result);
      },
      [=](msg::completion_error& e) { done(self, on_done, fail(errc_from_string(e.code), e.message)); },
      [=](lost_atom, const std::string& why) { done(self, on_done, fail(errc::internal, why)); },
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
                        chunk_callback on_chunk, done_callback on_done) {
  return sys.spawn(client_actor, std::move(load_balancer), std::move(request), std::move(on_chunk),
                   std::move(on_done));
}

expected<completion> complete(caf::actor_system& sys, const caf::actor& load_balancer,
                              const msg::completion_request& request, const chunk_callback& on_chunk) {
  auto promise = std::make_shared<std::promise<expected<completion>>>();
  auto future = promise->get_future();
  spawn_client(sys, load_balancer, request, on_chunk,
               [promise](const expected<completion>& outcome) { promise->set_value(outcome); });
  return future.get();
}

}  // namespace troupe::actors
