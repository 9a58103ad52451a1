#include "actors/request_actor.hpp"

#include <optional>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/boundary.hpp"
#include "actors/system/clock.hpp"
#include "actors/system/cluster_messages.hpp"
#include "actors/system/network_limits.hpp"
#include "actors/system/network_model.hpp"
#include "messages/kv_payload.hpp"

namespace troupe::actors {
namespace {

struct request_state {
  stream_receiver_actor client;
  balancer_actor balancer;
  std::shared_ptr<network_model> network;  // request_options::network
  std::optional<serve::request_policy> policy;  // the request's policy (runtime/serve/request_policy)
  msg::placement placed;  // the engines serving it, once the balancer answered
  static inline const char* name = "request";
};

using request_actor_t = request_actor::stateful_base<request_state>;

int64_t now_ns(request_actor_t* self) { return ns_since_epoch(self->clock().now()); }

/// Sends to an engine (another node): over the simulator's network when there is one.
template <class Message>
void post(request_actor_t* self, const engine_actor& to, Message&& m, int64_t bytes = 0) {
  send_over(self, self->state.network.get(), to, std::forward<Message>(m), bytes);
}

/// Ends the actor. Its monitors go first: CAF 0.17 keeps a monitor (and the weak reference in
/// it, which keeps this actor's memory allocated) in the monitored actor until that one dies,
/// so a long-lived engine would collect one per request it served (docs/resources.md).
void stop(request_actor_t* self) {
  const msg::placement& p = self->state.placed;
  if (p.prefill) self->demonitor(p.prefill.address());
  if (p.decode) self->demonitor(p.decode.address());
  if (self->state.client) self->demonitor(self->state.client.address());
  self->quit();
}

void perform(request_actor_t* self, serve::effects fx, msg::placement* offered = nullptr);

/// Forgets the placement (placed again): its engines' monitors go, and the lost one's handle
/// is returned for the balancer.
engine_actor forget_placement(request_actor_t* self, serve::engine_role lost) {
  msg::placement& p = self->state.placed;
  engine_actor gone = lost == serve::engine_role::decode ? p.decode : p.prefill;
  if (p.prefill) self->demonitor(p.prefill.address());
  if (p.decode) self->demonitor(p.decode.address());
  p = msg::placement{};
  return gone;
}

void ask_placement(request_actor_t* self, serve::ask_placement& a) {
  engine_actor lost;
  if (a.again) lost = forget_placement(self, a.lost);
  self->request(self->state.balancer, caf::infinite,
                msg::place_request{a.request_id, a.num_prompt_tokens, a.max_tokens, std::move(a.prefix_hashes),
                                   std::move(lost), a.drained})
      .then(
          [=](msg::placement& p) {
            serve::placed_engines view{p.error, static_cast<bool>(p.prefill), static_cast<bool>(p.decode),
                                       p.prefill_name, p.decode_name};
            perform(self, self->state.policy->placed(view), &p);
          },
          [=](caf::error& e) {
            const std::string why = "no placement: " + self->system().render(e);
            perform(self, self->state.policy->placed({why, false, false, "", ""}));
          });
}

/// Keeps the placement `offered` (the balancer's answer) and submits the request to it.
void submit(request_actor_t* self, serve::submit& s, msg::placement* offered) {
  TROUPE_ASSERT(offered != nullptr);
  self->state.placed = std::move(*offered);
  const msg::placement& placed = self->state.placed;
  self->monitor(placed.decode);
  s.request.cache_tier = placed.cache_tier;  // where its engine fetches the prompt's prefix from
  if (s.kv) {  // forwarded with its KV: straight to the decode engine, as a prefill engine would
    const int64_t id = s.request.id;
    std::vector<uint8_t> payload = msg::encode_kv_payload(id, *s.kv);
    if (fits_between(placed.decode.node(), self->node(), payload.size())) {
      kv_in_transit(self, self->state.network.get(), payload);
      const auto bytes = static_cast<int64_t>(payload.size());
      post(self, placed.decode,
           msg::kv_handoff{std::move(s.request), self, std::move(payload), 0, now_ns(self)},
           bytes);
      return;
    }
    spdlog::warn("request {}: its KV ({} bytes) is more than a CAF message to its new engine may carry; "
                 "that engine recomputes it",
                 id, payload.size());
  }
  if (!s.to_prefill) {
    post(self, placed.decode, msg::submit{std::move(s.request)});
    return;
  }
  self->monitor(placed.prefill);
  post(self, placed.prefill, msg::submit_prefill{std::move(s.request), placed.decode, placed.kv_address, placed.kv_port});
}

/// Performs one effect of the policy; `offered` is the placement the current call is about.
struct performer {
  request_actor_t* self;
  msg::placement* offered;
  void operator()(serve::ask_placement& a) const { ask_placement(self, a); }
  void operator()(serve::submit& s) const { submit(self, s, offered); }
  void operator()(serve::send_chunk& c) const { self->send(self->state.client, std::move(c.chunk)); }
  void operator()(serve::send_end& e) const { self->send(self->state.client, std::move(e.end)); }
  void operator()(serve::send_error& e) const { self->send(self->state.client, std::move(e.error)); }
  void operator()(serve::release_engines&) const {
    const msg::placement& p = self->state.placed;
    if (p.prefill) post(self, p.prefill, msg::release{self->state.policy->id()});
    if (p.decode) post(self, p.decode, msg::release{self->state.policy->id()});
  }
  void operator()(serve::stop&) const { stop(self); }
};

void perform(request_actor_t* self, serve::effects fx, msg::placement* offered) {
  for (serve::effect& e : fx) std::visit(performer{self, offered}, e);
}

/// `engine` is lost (`why`): the policy decides whether that concerns the request.
void on_engine_lost(request_actor_t* self, const caf::actor_addr& engine, const std::string& why) {
  const msg::placement& p = self->state.placed;
  if (p.prefill && engine == p.prefill.address())
    perform(self, self->state.policy->engine_lost(serve::engine_role::prefill, why));
  else if (p.decode && engine == p.decode.address())
    perform(self, self->state.policy->engine_lost(serve::engine_role::decode, why));
}

engine::sample_event to_event(msg::sampled& s) {
  return {s.request_id, s.sample_index, {s.token, s.logprob, std::move(s.top_logprobs)}, s.finish,
          s.num_cached_tokens, s.num_preemptions, s.num_recomputed_tokens};
}

engine::token_batch to_batch(msg::sampled_batch& b) {
  return {b.request_id, std::move(b.tokens), std::move(b.logprobs), std::move(b.top_logprobs), std::move(b.age_ns),
          b.finish, b.num_cached_tokens, b.num_preemptions, b.num_recomputed_tokens, b.scheduled_age_ns,
          std::move(b.embedding)};
}

/// Whether a message from an engine about request `id` is for this request: one for another,
/// or from an engine not serving it now (one it lost, which froze and woke: its work went to
/// another engine), is dropped with a warning (it cannot be this request's answer).
bool addressed_here(request_actor_t* self, int64_t id, const char* what) {
  const auto from = caf::actor_cast<caf::actor_addr>(self->current_sender());
  const msg::placement& p = self->state.placed;
  if (!from || (from != p.decode.address() && from != p.prefill.address())) {  // anonymous: nobody's
    spdlog::warn("request {}: dropped {} from an engine that does not serve it", self->state.policy->id(), what);
    return false;
  }
  if (id == self->state.policy->id()) return true;
  spdlog::warn("request {}: dropped {} for request {}", self->state.policy->id(), what, id);
  return false;
}

/// From an engine serving it only (addressed_here): the engine drained, and the request goes
/// elsewhere as from a lost engine, with the KV the engine sent (if it decodes as this request's;
/// else it is recomputed).
void on_forwarded(request_actor_t* self, msg::forwarded& f) {
  if (!addressed_here(self, f.request_id, "a forward")) return;
  std::optional<engine::kv_data> kv;
  if (!f.kv_payload.empty()) {
    auto payload = msg::decode_kv_payload(f.kv_payload);
    if (payload && payload->request_id == f.request_id)
      kv = std::move(payload->kv);
    else
      spdlog::warn("request {}: the KV its engine forwarded is not usable ({}); recomputed instead", f.request_id,
                   payload ? "another request's" : payload.error().message);
  }
  const msg::placement& p = self->state.placed;
  const auto from = caf::actor_cast<caf::actor_addr>(self->current_sender());
  const serve::engine_role role =
      p.prefill && from == p.prefill.address() ? serve::engine_role::prefill : serve::engine_role::decode;
  perform(self, self->state.policy->forwarded(role, f.reason, std::move(kv)));
}

request_actor::behavior_type handlers(request_actor_t* self) {
  return {
      [=](msg::sampled& s) {
        if (addressed_here(self, s.request_id, "a token"))
          perform(self, self->state.policy->on_token(to_event(s), s.scheduled_at_ns, now_ns(self)));
      },
      [=](msg::sampled_batch& b) {
        if (addressed_here(self, b.request_id, "a batch of tokens"))
          perform(self, self->state.policy->on_batch(to_batch(b), now_ns(self)));
      },
      [=](msg::rejected& r) {
        if (addressed_here(self, r.request_id, "a rejection")) perform(self, self->state.policy->rejected(r.code, r.message));
      },
      [=](msg::prefilled& p) {
        if (addressed_here(self, p.request_id, "a prefill's end")) self->state.policy->prefilled();
      },
      [=](msg::forwarded& f) { on_forwarded(self, f); },
      [=](msg::engine_lost& l) {
        // Only its balancer's word: a forged one would make it recompute elsewhere, or fail.
        if (caf::actor_cast<caf::actor_addr>(self->current_sender()) != self->state.balancer.address()) {
          spdlog::warn("request {}: dropped word of a lost engine that did not come from its balancer",
                       self->state.policy->id());
          return;
        }
        on_engine_lost(self, l.engine.address(), l.reason);
      },
      [=](msg::cancel_request&) {
        // Only its client may stop it: the request actor's handle is no capability to cancel.
        if (caf::actor_cast<caf::actor_addr>(self->current_sender()) != self->state.client.address()) {
          spdlog::warn("request {}: dropped a cancel that did not come from its client", self->state.policy->id());
          return;
        }
        perform(self, self->state.policy->cancel(now_ns(self)));
      },
  };
}

request_actor::behavior_type request_behavior(request_actor_t* self, request_options options) {
  request_state& st = self->state;
  st.client = std::move(options.client);
  st.balancer = std::move(options.balancer);
  st.network = std::move(options.network);
  st.policy.emplace(std::move(options.policy));
  guard_boundary(self);
  // The balancer refuses requests without a client; a null handle here would crash monitor()
  // (CAF dereferences the null control block at offset 0x40), so it ends the request instead.
  // (A typed actor returns its behavior even when it quit at once: CAF then never runs it.)
  if (!st.client) {
    spdlog::warn("request {}: no client to answer; dropped", st.policy->id());
    self->quit();
    return handlers(self);
  }
  self->monitor(st.client);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == self->state.client.address())  // nobody listens: free the engines' blocks
      perform(self, self->state.policy->client_lost());
    else
      on_engine_lost(self, dm.source, self->system().render(dm.reason));
  });
  perform(self, st.policy->start(now_ns(self)));
  return handlers(self);
}
}  // namespace

request_actor spawn_request(caf::local_actor* parent, request_options options) {
  return parent->spawn(request_behavior, std::move(options));
}

}  // namespace troupe::actors
