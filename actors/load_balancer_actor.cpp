#include "actors/load_balancer_actor.hpp"

#include <deque>
#include <map>
#include <optional>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/atoms.hpp"
#include "actors/clock.hpp"
#include "actors/request_actor.hpp"
#include "messages/client.hpp"
#include "actors/cluster_messages.hpp"
#include "runtime/balance/liveness.hpp"
#include "runtime/engine/request.hpp"

namespace troupe::actors {
namespace {

/// Work placed on an engine that its last load report does not include yet.
struct unseen_work {
  int64_t number = 0;  // the engine's n-th received message (submit, prefill or handoff)
  int64_t kv_tokens = 0;
  int64_t prefill_tokens = 0;
};

struct engine_entry {
  balanced_engine spec;
  balance::engine_load load;
  msg::load_report report;        // the latest
  int64_t num_sent = 0;           // work items placed on it
  std::deque<unseen_work> unseen;
  int64_t unseen_kv_tokens = 0;       // Σ unseen
  int64_t unseen_prefill_tokens = 0;  // Σ unseen
};

/// The engines a live request actor was placed on.
struct routed_request {
  size_t decode = 0;
  std::optional<size_t> prefill;
};

struct load_balancer_state {
  load_balancer_options o;
  std::vector<engine_entry> engines;
  std::vector<std::vector<bool>> tiers;       // balance::assign_tiers over the prefill engines
  int64_t next_id = 0;
  std::map<caf::actor_addr, routed_request> routed;  // live request actor -> its engines
  std::optional<balance::liveness> liveness;  // with a heartbeat: who stopped answering
  static inline const char* name = "load_balancer";
};

using load_balancer_t = caf::stateful_actor<load_balancer_state>;

std::string where(const balanced_engine& e) { return "engine '" + e.name + "' on node '" + e.node + "'"; }

/// Recomputes an engine's token estimates: the last report plus what it has not seen.
void refresh(engine_entry& e) {
  while (!e.unseen.empty() && e.unseen.front().number <= e.report.num_received) {
    e.unseen_kv_tokens -= e.unseen.front().kv_tokens;
    e.unseen_prefill_tokens -= e.unseen.front().prefill_tokens;
    e.unseen.pop_front();
  }
  e.load.num_kv_tokens = e.report.num_kv_tokens + e.unseen_kv_tokens;
  e.load.num_prefill_tokens = e.report.num_queued_prefill_tokens + e.unseen_prefill_tokens;
}

void charge(engine_entry& e, int64_t kv_tokens, int64_t prefill_tokens) {
  e.unseen.push_back(unseen_work{++e.num_sent, kv_tokens, prefill_tokens});
  e.unseen_kv_tokens += kv_tokens;
  e.unseen_prefill_tokens += prefill_tokens;
  refresh(e);
}

caf::actor route(load_balancer_t* self, msg::completion_request& req, caf::actor client) {
  load_balancer_state& st = self->state;
  const int64_t id = st.next_id++;
  request_options ro;
  ro.id = id;
  ro.client = std::move(client);
  ro.balancer = caf::actor_cast<caf::actor>(self);
  ro.tok = st.o.tok;
  ro.params = std::move(req);
  ro.context_tokens = st.o.context_tokens;
  // A seed for every request, derived from the balancer's base: a whole run replays from one
  // number (the simulator), and each answer reports the seed that reproduces it.
  ro.drawn_seed = engine::child_seed(st.o.seed_base, static_cast<int32_t>(id % 2147483647) + 1);
  caf::actor request = spawn_request(self, std::move(ro));
  self->monitor(request);
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
/// A refused request leaves nothing behind: no request actor, no placement, no engine work.
caf::result<caf::actor> admit_request(load_balancer_t* self, msg::completion_request& req, caf::actor client) {
  if (!client) {
    spdlog::warn("load balancer: refused a completion request that names no client (no sender and no "
                 "reply_to): nobody could receive its answer");
    return caf::make_error(caf::sec::invalid_argument, "a completion request must name its client");
  }
  return route(self, req, std::move(client));
}

msg::placement place(load_balancer_t* self, const msg::place_request& p) {
  load_balancer_state& st = self->state;
  msg::placement out;
  // A placement nobody can receive would count a request on an engine, never to end.
  if (!self->current_sender()) {
    out.error = "a place_request without a sender";
    return out;
  }
  std::vector<balance::engine_load> loads;
  for (const engine_entry& e : st.engines) loads.push_back(e.load);
  const int32_t tier = balance::tier_of(p.num_prompt_tokens, st.o.prefill_tier_bounds);
  auto chosen = balance::place(loads, st.tiers, tier, p.num_prompt_tokens);
  if (!chosen) {
    out.error = chosen.error().message;
    for (const engine_entry& e : st.engines)
      if (!e.load.alive) out.error += "; " + where(e.spec) + " is lost";
    return out;
  }
  engine_entry& d = st.engines[chosen->decode];
  out.decode = d.spec.actor;
  out.decode_name = where(d.spec);
  out.kv_host = d.spec.kv_host;
  out.kv_port = d.spec.kv_port;
  d.load.num_requests++;
  routed_request& routed = st.routed[caf::actor_cast<caf::actor_addr>(self->current_sender())];
  routed.decode = chosen->decode;
  routed.prefill = chosen->prefill;
  const int64_t tokens = p.num_prompt_tokens;
  if (chosen->prefill) {
    engine_entry& pe = st.engines[*chosen->prefill];
    out.prefill = pe.spec.actor;
    out.prefill_name = where(pe.spec);
    charge(pe, 0, tokens - 1);
    charge(d, tokens, 0);
  } else {
    charge(d, tokens, tokens);
  }
  return out;
}

/// Engine `index` is lost (`why`): it gets no new work, and every request placed on it is told.
void mark_lost(load_balancer_t* self, size_t index, const std::string& why) {
  load_balancer_state& st = self->state;
  engine_entry& e = st.engines[index];
  if (!e.load.alive) return;
  e.load.alive = false;
  if (st.liveness) st.liveness->mark_lost(index);
  spdlog::warn("load balancer: {} is lost ({}); routing around it", where(e.spec), why);
  for (const auto& [addr, placed] : st.routed) {
    if (placed.decode != index && placed.prefill != index) continue;
    if (auto request = caf::actor_cast<caf::actor>(addr)) self->send(request, msg::engine_lost{e.spec.actor, why});
  }
}

void on_down(load_balancer_t* self, const caf::down_msg& dm) {
  load_balancer_state& st = self->state;
  if (auto it = st.routed.find(dm.source); it != st.routed.end()) {
    st.engines[it->second.decode].load.num_requests--;
    st.routed.erase(it);
    return;
  }
  for (size_t i = 0; i < st.engines.size(); i++)
    if (st.engines[i].spec.actor.address() == dm.source) mark_lost(self, i, self->system().render(dm.reason));
}

/// One heartbeat: engines silent past the timeout are lost; every live one is pinged again.
void on_heartbeat(load_balancer_t* self) {
  load_balancer_state& st = self->state;
  const int64_t now_ns = ns_since_epoch(self->clock().now());
  for (size_t i : st.liveness->newly_lost(now_ns))
    mark_lost(self, i, "no answer to the heartbeat for " + std::to_string(st.o.heartbeat_timeout_ms) + " ms");
  const auto timeout = std::chrono::milliseconds(st.o.heartbeat_timeout_ms);
  for (size_t i = 0; i < st.engines.size(); i++) {
    if (!st.engines[i].load.alive) continue;
    self->request(st.engines[i].spec.actor, timeout, ping_atom::value)
        .then([=](pong_atom) { self->state.liveness->heard_from(i, ns_since_epoch(self->clock().now())); },
              [](caf::error&) {});  // one unanswered ping decides nothing: the tracker judges silence
  }
  self->delayed_send(self, std::chrono::milliseconds(st.o.heartbeat_interval_ms), heartbeat_atom::value);
}

caf::behavior load_balancer_actor(load_balancer_t* self, load_balancer_options options) {
  TROUPE_ASSERT(!options.engines.empty());
  load_balancer_state& st = self->state;
  st.o = std::move(options);
  int32_t num_prefill = 0;
  for (size_t i = 0; i < st.o.engines.size(); i++) {
    const balanced_engine& spec = st.o.engines[i];
    engine_entry e;
    e.spec = spec;
    e.load.kind = spec.kind;
    e.load.max_num_seqs = spec.max_num_seqs;
    e.load.kv_capacity_tokens = spec.kv_capacity_tokens;
    e.report.engine_index = static_cast<int32_t>(i);
    st.engines.push_back(std::move(e));
    if (spec.kind == balance::engine_kind::prefill) num_prefill++;
    self->monitor(spec.actor);
    if (st.o.report_interval_ms > 0)
      self->send(spec.actor, msg::report_to{caf::actor_cast<caf::actor>(self), static_cast<int32_t>(i),
                                            st.o.report_interval_ms});
  }
  st.tiers = balance::assign_tiers(num_prefill, static_cast<int32_t>(st.o.prefill_tier_bounds.size()) + 1);
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  if (st.o.heartbeat_interval_ms > 0) {
    TROUPE_ASSERT(st.o.heartbeat_timeout_ms > 0);
    const int64_t timeout_ns = int64_t{st.o.heartbeat_timeout_ms} * 1000000;
    st.liveness.emplace(st.engines.size(), timeout_ns, ns_since_epoch(self->clock().now()));
    self->send(self, heartbeat_atom::value);
  }
  return {
      [=](msg::submit_completion& s) {
        caf::actor client = s.reply_to ? std::move(s.reply_to) : caf::actor_cast<caf::actor>(self->current_sender());
        return admit_request(self, s.request, std::move(client));
      },
      [=](msg::completion_request& req) {
        return admit_request(self, req, caf::actor_cast<caf::actor>(self->current_sender()));
      },
      [=](const msg::place_request& p) { return place(self, p); },
      [=](const msg::load_report& r) {
        auto& engines = self->state.engines;
        if (r.engine_index < 0 || static_cast<size_t>(r.engine_index) >= engines.size()) return;
        engine_entry& e = engines[r.engine_index];
        if (self->state.liveness)
          self->state.liveness->heard_from(static_cast<size_t>(r.engine_index), ns_since_epoch(self->clock().now()));
        if (r.num_received < e.report.num_received) return;  // reordered: keep the newer
        e.report = r;
        refresh(e);
      },
      [=](heartbeat_atom) { on_heartbeat(self); },
      [=](engines_atom) {
        std::vector<caf::actor> actors;
        for (const engine_entry& e : self->state.engines) actors.push_back(e.spec.actor);
        return actors;
      },
  };
}

}  // namespace

std::vector<balanced_engine> mixed_engines(const std::vector<caf::actor>& actors) {
  std::vector<balanced_engine> out;
  for (size_t i = 0; i < actors.size(); i++) {
    balanced_engine e;
    e.actor = actors[i];
    e.name = "engine" + std::to_string(i);
    out.push_back(std::move(e));
  }
  return out;
}

caf::actor spawn_load_balancer(caf::actor_system& sys, load_balancer_options options) {
  return sys.spawn(load_balancer_actor, std::move(options));
}

}  // namespace troupe::actors
