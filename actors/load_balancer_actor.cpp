#include "actors/load_balancer_actor.hpp"

#include <algorithm>
#include <optional>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/atoms.hpp"
#include "actors/system/boundary.hpp"
#include "actors/system/door.hpp"
#include "actors/system/clock.hpp"
#include "actors/load_balancer_watch.hpp"
#include "actors/system/random.hpp"
#include "actors/request_actor.hpp"
#include "messages/client.hpp"
#include "runtime/engine/request.hpp"

namespace troupe::actors {
namespace {

/// Spawns the request actor of an admitted request (`refused`: the error it answers at once).
request_actor route(load_balancer_t* self, msg::completion_request& req, stream_receiver_actor client, uint64_t stream,
                    const caf::node_id& client_node, std::optional<error> refused) {
  load_balancer_state& st = self->state;
  const int64_t index = st.num_routed++;
  const int64_t id = st.o.draw_request_id ? st.o.draw_request_id() : index;
  request_options ro;
  ro.client = std::move(client);
  ro.balancer = caf::actor_cast<balancer_actor>(self);
  ro.policy.id = id;
  ro.policy.stream = stream;
  ro.policy.tok = st.o.tok;
  ro.policy.params = std::move(req);
  ro.policy.context_tokens = st.o.context_tokens;
  ro.policy.chat = st.o.chat;
  ro.policy.tags = st.o.tags;
  ro.policy.refused = std::move(refused);
  ro.policy.prefix_block_size = st.policy->prefix_block_size();
  ro.network = st.o.network;
  // A seed for every request, derived from the balancer's base: a whole run replays from one
  // number (the simulator), and each answer reports the seed that reproduces it.
  ro.policy.drawn_seed = engine::child_seed(st.o.seed_base, static_cast<int32_t>(index % 2147483647) + 1);
  request_actor request = spawn_request(self, std::move(ro));
  self->monitor(request);
  st.placed.emplace(request.address(), live_request{st.next_key++, client_node});
  return request;
}

/// Validates at the door: a request names the client that gets its answer (the handle in its
/// payload, else its sender), or it is refused before anything is spawned or placed.
///
/// A remote message can arrive without a sender: CAF 0.17.6's BASP broker cleans a closed
/// connection's routing entry up after the fact, by connection handle (the socket fd); when a
/// new client's connection reused that fd in between, the cleanup erases the new connection's
/// entry and its messages arrive with a null sender (msg::submit_completion has the details).
/// Monitoring that null handle crashed the server (caf::local_actor::monitor at address 0x40).
///
/// Then balance::admission decides, by the sender's node (else the client's): a client process
/// over its cap is refused here, leaving nothing behind (no request actor, no placement, no
/// engine work); one over the rate gets a request actor that answers `overloaded`.
caf::result<request_actor> admit_request(load_balancer_t* self, msg::completion_request& req,
                                         stream_receiver_actor client, uint64_t stream) {
  if (!client) {
    spdlog::warn("load balancer: refused a completion request that names no client (no sender and no "
                 "reply_to): nobody could receive its answer");
    return caf::make_error(caf::sec::invalid_argument, "a completion request must name its client");
  }
  const caf::node_id client_node = self->current_sender() ? self->current_sender()->node() : client.node();
  auto admitted = self->state.admission->admit(client_node, ns_since_epoch(self->clock().now()));
  if (!admitted) {
    spdlog::warn("load balancer: refused a completion request from a client process with {} requests in flight "
                 "(the limit)",
                 self->state.admission->max_pending_per_client());
    return caf::make_error(caf::sec::invalid_argument, admitted.error().message);
  }
  return route(self, req, std::move(client), stream, client_node, std::move(*admitted));
}

msg::placement place(load_balancer_t* self, const msg::place_request& p) {
  load_balancer_state& st = self->state;
  msg::placement out;
  // Only a live request actor of this balancer: its DOWN message ends what it is charged (a
  // placement for anyone else would count a request on an engine, never to end).
  auto it = st.placed.find(caf::actor_cast<caf::actor_addr>(self->current_sender()));
  if (it == st.placed.end()) {
    spdlog::warn("load balancer: dropped a place_request from an actor that is not one of its request actors");
    out.error = "a place_request from an actor that is not one of this balancer's request actors";
    return out;
  }
  if (p.num_prompt_tokens < 1) {  // would charge an engine negative work
    out.error = "a place_request for " + std::to_string(p.num_prompt_tokens) + " prompt tokens";
    return out;
  }
  // Its request actor saw it go (or drain): so here too, before anything is placed.
  for (size_t i = 0; p.lost && i < st.o.engines.size(); i++) {
    if (st.o.engines[i].actor != p.lost) continue;
    if (p.drained)
      st.policy->mark_draining(i);
    else if (st.policy->mark_lost(i))
      tell_lost(self, i, "its request actor saw it go");
  }
  auto chosen = st.policy->place(it->second.key, p.num_prompt_tokens, p.prefix_hashes);
  if (!chosen) {
    out.error = chosen.error().message;
    return out;
  }
  const balanced_engine& d = st.o.engines[chosen->decode];
  out.decode = d.actor;
  out.decode_name = where(d);
  out.kv_address = d.kv_address;
  out.kv_port = d.kv_port;
  if (chosen->prefill) {
    out.prefill = st.o.engines[*chosen->prefill].actor;
    out.prefill_name = where(st.o.engines[*chosen->prefill]);
  }
  if (chosen->cache_tier) out.cache_tier = static_cast<int32_t>(*chosen->cache_tier);
  return out;
}

void on_down(load_balancer_t* self, const caf::down_msg& dm) {
  load_balancer_state& st = self->state;
  if (auto it = st.placed.find(dm.source); it != st.placed.end()) {
    st.policy->request_ended(it->second.key);
    st.admission->ended(it->second.client_node);
    st.placed.erase(it);
    return;
  }
  for (size_t t = 0; t < st.tiers.size(); t++)
    if (st.tiers[t].address() == dm.source && st.policy->cache_tier_lost(t))
      spdlog::warn("load balancer: cache tier {} is lost ({}); its prefixes no longer count", t,
                   self->system().render(dm.reason));
  for (size_t i = 0; i < st.o.engines.size(); i++) {
    if (st.o.engines[i].actor.address() != dm.source) continue;
    st.silent_here.erase(i);  // gone, not silent: nothing to ping again
    if (st.policy->mark_lost(i)) tell_lost(self, i, self->system().render(dm.reason));
  }
}

balancer_actor::behavior_type load_balancer_behavior(load_balancer_t* self, load_balancer_options options) {
  TROUPE_ASSERT(!options.engines.empty());
  load_balancer_state& st = self->state;
  st.o = std::move(options);
  std::vector<balance::engine_spec> specs;
  std::vector<balance::cache_tier_spec> tier_specs;
  for (size_t i = 0; i < st.o.engines.size(); i++) {
    const balanced_engine& e = st.o.engines[i];
    int32_t tier = -1;
    if (e.host_tier) {
      const auto found = std::find(st.tiers.begin(), st.tiers.end(), e.host_tier);
      tier = static_cast<int32_t>(found - st.tiers.begin());
      if (found == st.tiers.end()) {
        st.tiers.push_back(e.host_tier);
        tier_specs.push_back(balance::cache_tier_spec{std::max<int64_t>(0, e.host_tier_blocks), std::max(1, e.block_size),
                                                      std::max<int64_t>(0, e.disk_tier_blocks_max)});
        self->monitor(e.host_tier);
      }
    }
    specs.push_back(balance::engine_spec{e.kind, e.max_num_seqs, e.kv_capacity_tokens, e.block_size, where(e), tier});
    self->monitor(e.actor);
  }
  TROUPE_ASSERT(st.o.heartbeat_interval_ms <= 0 || st.o.heartbeat_timeout_ms > 0);
  const int64_t timeout_ns = st.o.heartbeat_interval_ms > 0 ? int64_t{st.o.heartbeat_timeout_ms} * 1000000 : 0;
  st.admission.emplace(self->node(), st.o.max_pending_per_client, st.o.rate_limit_per_s, st.o.rate_limit_burst);
  st.policy.emplace(std::move(specs), st.o.prefill_tier_bounds, timeout_ns, ns_since_epoch(self->clock().now()),
                  balance::router_options{st.o.router, engine::child_seed(st.o.seed_base, 0), st.o.prefix_weight},
                  std::move(tier_specs));
  for (size_t i = 0; i < st.o.engines.size(); i++) ask_reports(self, i);
  for (size_t t = 0; t < st.tiers.size(); t++) ask_tier_reports(self, t);
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  guard_boundary(self);
  if (st.o.heartbeat_interval_ms > 0) self->send(self, heartbeat_atom::value);
  return {
      [=](msg::submit_completion& s) {
        stream_receiver_actor client =
            s.reply_to ? std::move(s.reply_to) : caf::actor_cast<stream_receiver_actor>(self->current_sender());
        return admit_request(self, s.request, std::move(client), s.stream);
      },
      [=](const msg::place_request& p) { return place(self, p); },
      [=](msg::load_report& r) { on_report(self, r); },
      [=](msg::tier_events& r) { on_tier_events(self, r); },
      [=](heartbeat_atom) {
        // Its own timer only: each forged one would start another heartbeat chain, forever.
        if (self->current_sender() == self->ctrl()) return on_heartbeat(self);
        spdlog::warn("load balancer: dropped a heartbeat from another actor (it runs its own)");
      },
      [=](rejoin_atom) {
        if (self->current_sender() == self->ctrl()) return on_rejoin(self);
        spdlog::warn("load balancer: dropped a rejoin tick from another actor (it runs its own)");
      },
  };
}
}  // namespace

std::vector<balanced_engine> mixed_engines(const engine_list& actors) {
  std::vector<balanced_engine> out;
  for (size_t i = 0; i < actors.size(); i++) {
    balanced_engine e;
    e.actor = actors[i];
    e.name = "engine" + std::to_string(i);
    out.push_back(std::move(e));
  }
  return out;
}

balancer_actor spawn_load_balancer(caf::actor_system& sys, load_balancer_options options) {
  return sys.spawn(load_balancer_behavior, std::move(options));
}

int64_t random_request_id() { return static_cast<int64_t>(draw_unguessable_u64()); }

balancer_client_actor spawn_balancer_front(caf::actor_system& sys, balancer_actor balancer) {
  TROUPE_ASSERT(balancer != nullptr);
  return caf::actor_cast<balancer_client_actor>(
      spawn_door(sys, caf::actor_cast<caf::strong_actor_ptr>(std::move(balancer)), sys.message_types<balancer_client_actor>(),
                 [](const caf::type_erased_tuple& m) { return m.match_elements<msg::submit_completion>(); },
                 "load balancer front"));
}

}  // namespace troupe::actors
