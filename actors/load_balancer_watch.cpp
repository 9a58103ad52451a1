#include "actors/load_balancer_watch.hpp"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

#include "actors/system/atoms.hpp"
#include "actors/system/clock.hpp"
#include "actors/system/connect.hpp"
#include "actors/system/network_model.hpp"
#include "actors/system/cluster_messages.hpp"

namespace troupe::actors {
namespace {

/// Schedules the next try to reach lost engines' nodes again, unless one is scheduled, none
/// is lost whose node can be reached, or rejoining is off.
void arm_rejoin(load_balancer_t* self) {
  load_balancer_state& st = self->state;
  if (st.o.rejoin_interval_ms <= 0 || st.rejoin_armed) return;
  for (size_t i = 0; i < st.o.engines.size(); i++) {
    if (st.policy->load(i).alive || (st.o.engines[i].node_port == 0 && st.silent_here.count(i) == 0)) continue;
    st.rejoin_armed = true;
    self->delayed_send(self, std::chrono::milliseconds(st.o.rejoin_interval_ms), rejoin_atom::value);
    return;
  }
}

/// The node at address:port listed `engines`: its lost engines of the topology are these now
/// (a restarted node's new actors; a frozen node that woke up lists the same ones).
void take_back(load_balancer_t* self, const std::string& address, uint16_t port, const engine_list& engines) {
  load_balancer_state& st = self->state;
  for (size_t i = 0; i < st.o.engines.size(); i++) {
    balanced_engine& e = st.o.engines[i];
    if (st.policy->load(i).alive || e.node_address != address || e.node_port != port) continue;
    if (e.index_on_node >= engines.size() || !engines[e.index_on_node]) {
      spdlog::warn("load balancer: the node of {} came back with {} engine(s), not it", where(e), engines.size());
      continue;
    }
    if (engines[e.index_on_node] == e.actor && st.policy->load(i).draining) continue;  // still shutting down
    if (engines[e.index_on_node] != e.actor) {
      e.actor = engines[e.index_on_node];
      self->monitor(e.actor);
    }
    st.policy->rejoined(i, ns_since_epoch(self->clock().now()));
    ask_reports(self, i);
    spdlog::info("load balancer: {} answers again: taken into service", where(e));
  }
}

/// Pings engine `index` of this process, lost to the heartbeat, and takes it back if it answers
/// (within rejoin_interval_ms) and is still lost; not while the network says it is cut off.
void ping_again(load_balancer_t* self, size_t index) {
  load_balancer_state& st = self->state;
  const balanced_engine& e = st.o.engines[index];
  if (st.o.network && !st.o.network->reachable(self->address(), e.actor.address(), ns_since_epoch(self->clock().now())))
    return;
  self->request(e.actor, std::chrono::milliseconds(st.o.rejoin_interval_ms), ping_atom::value)
      .then(
          [=](pong_atom) {
            load_balancer_state& now = self->state;
            if (now.policy->load(index).alive || now.silent_here.erase(index) == 0) return;
            now.policy->rejoined(index, ns_since_epoch(self->clock().now()));
            ask_reports(self, index);
            spdlog::info("load balancer: {} answers again: taken into service", where(now.o.engines[index]));
          },
          [](caf::error&) {});
}

/// Reaches the node at address:port (a try of at most rejoin_interval_ms) and takes its engines
/// back; a failed try changes nothing (the next one comes with the next rejoin_atom).
void reach_again(load_balancer_t* self, const std::string& address, uint16_t port) {
  const std::string endpoint = address + ":" + std::to_string(port);
  if (!self->state.rejoining.insert(endpoint).second) return;  // a try is under way
  const auto bound = std::chrono::milliseconds(self->state.o.rejoin_interval_ms);
  const auto done = [=] { self->state.rejoining.erase(endpoint); };
  self->request(network_actor(self->system()), bound, caf::connect_atom::value, address, port)
      .then(
          [=](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>& interface) {
            if (!ptr || !self->system().assignable(interface, self->system().message_types<node_actor>())) {
              spdlog::warn("load balancer: {} publishes no troupe node now", endpoint);
              return done();
            }
            self->request(caf::actor_cast<node_actor>(ptr), bound, engines_atom::value)
                .then(
                    [=](engine_list& engines) {
                      done();
                      take_back(self, address, port, engines);
                    },
                    [=](caf::error&) { done(); });
          },
          [=](caf::error&) { done(); });
}

}  // namespace

std::string where(const balanced_engine& e) { return "engine '" + e.name + "' on node '" + e.node + "'"; }

/// Engine `index` was just lost (`why`): every request placed on it is told.
void tell_lost(load_balancer_t* self, size_t index, const std::string& why) {
  const balanced_engine& e = self->state.o.engines[index];
  spdlog::warn("load balancer: {} is lost ({}); routing around it", where(e), why);
  for (const auto& [addr, live] : self->state.placed) {
    if (!self->state.policy->placed_on(live.key, index)) continue;
    if (auto request = caf::actor_cast<request_actor>(addr)) self->send(request, msg::engine_lost{e.actor, why});
  }
  arm_rejoin(self);
}

/// Asks engine `index` for load reports (with its pool's cache events when the policy wants them:
/// a snapshot first); none without a report interval.
void ask_reports(load_balancer_t* self, size_t index) {
  const load_balancer_state& st = self->state;
  if (st.o.report_interval_ms <= 0) return;
  self->send(st.o.engines[index].actor,
             msg::report_to{caf::actor_cast<balancer_actor>(self), static_cast<int32_t>(index), st.o.report_interval_ms,
                            st.policy->wants_cache_events(index), st.tiers});
}

/// Asks cache tier `index` for its hashes (a snapshot first), if the policy wants them.
void ask_tier_reports(load_balancer_t* self, size_t index) {
  const load_balancer_state& st = self->state;
  if (st.o.report_interval_ms <= 0 || !st.policy->wants_tier_events(index)) return;
  std::vector<std::string> engine_nodes;  // who may fetch from the tier: each node once
  for (const balanced_engine& e : st.o.engines) {
    std::string node = caf::to_string(e.actor.node());
    if (std::find(engine_nodes.begin(), engine_nodes.end(), node) == engine_nodes.end())
      engine_nodes.push_back(std::move(node));
  }
  self->send(st.tiers[index], msg::tier_report_to{caf::actor_cast<balancer_actor>(self), static_cast<int32_t>(index),
                                                  st.o.report_interval_ms, std::move(engine_nodes)});
}

/// A cache tier's hashes count only from the tier they name.
void on_tier_events(load_balancer_t* self, msg::tier_events& r) {
  const std::vector<cache_tier_actor>& tiers = self->state.tiers;
  const auto sender = caf::actor_cast<caf::actor_addr>(self->current_sender());
  if (r.tier_index < 0 || static_cast<size_t>(r.tier_index) >= tiers.size() ||
      tiers[static_cast<size_t>(r.tier_index)].address() != sender) {
    spdlog::warn("load balancer: dropped a cache tier report for tier {} that did not come from that tier", r.tier_index);
    return;
  }
  const balance::pool_events events{r.seq, r.snapshot, std::move(r.added), std::move(r.removed)};
  switch (self->state.policy->on_tier_report(r.tier_index, events, r.lower)) {
    case balance::report_outcome::ignored:
      spdlog::warn("load balancer: ignored a report of cache tier {} with a count out of range", r.tier_index);
      return;
    case balance::report_outcome::resync:
      return ask_tier_reports(self, static_cast<size_t>(r.tier_index));
    case balance::report_outcome::taken:
      return;
  }
}

/// A rejoin_atom: every lost engine's node is reached again (each node once).
void on_rejoin(load_balancer_t* self) {
  load_balancer_state& st = self->state;
  st.rejoin_armed = false;
  std::set<std::pair<std::string, uint16_t>> nodes;
  for (size_t i = 0; i < st.o.engines.size(); i++)
    if (!st.policy->load(i).alive && st.o.engines[i].node_port != 0)
      nodes.emplace(st.o.engines[i].node_address, st.o.engines[i].node_port);
  for (const auto& [address, port] : nodes) reach_again(self, address, port);
  for (const size_t i : st.silent_here)  // (their answers change the set later, not here)
    if (!st.policy->load(i).alive) ping_again(self, i);
  arm_rejoin(self);
}

/// One heartbeat: engines silent past the timeout are lost; every live one is pinged again.
void on_heartbeat(load_balancer_t* self) {
  load_balancer_state& st = self->state;
  const int64_t now = ns_since_epoch(self->clock().now());
  for (size_t i : st.policy->heartbeat(now)) {
    if (st.o.engines[i].node_port == 0) st.silent_here.insert(i);
    tell_lost(self, i, "no answer to the heartbeat for " + std::to_string(st.o.heartbeat_timeout_ms) + " ms");
  }
  const auto timeout = std::chrono::milliseconds(st.o.heartbeat_timeout_ms);
  for (size_t i = 0; i < st.o.engines.size(); i++) {
    if (!st.policy->load(i).alive) continue;
    // A ping into a partition (the simulator's network) is never answered.
    if (st.o.network && !st.o.network->reachable(self->address(), st.o.engines[i].actor.address(), now)) continue;
    self->request(st.o.engines[i].actor, timeout, ping_atom::value)
        .then([=](pong_atom) { self->state.policy->heard_from(i, ns_since_epoch(self->clock().now())); },
              [](caf::error&) {});  // one unanswered ping decides nothing: the policy judges silence
  }
  self->delayed_send(self, std::chrono::milliseconds(st.o.heartbeat_interval_ms), heartbeat_atom::value);
}

/// A load report counts only from the engine it names: a forged one could starve an engine of
/// work for good, or pile it all on one.
void on_report(load_balancer_t* self, msg::load_report& r) {
  const std::vector<balanced_engine>& engines = self->state.o.engines;
  const auto sender = caf::actor_cast<caf::actor_addr>(self->current_sender());
  if (r.engine_index < 0 || static_cast<size_t>(r.engine_index) >= engines.size() ||
      engines[static_cast<size_t>(r.engine_index)].actor.address() != sender) {
    spdlog::warn("load balancer: dropped a load report for engine {} that did not come from that engine",
                 r.engine_index);
    return;
  }
  const balance::load_report report{r.num_received, r.num_requests, r.num_kv_tokens, r.num_queued_prefill_tokens,
                                      r.draining};
  const balance::pool_events cache{r.cache_seq, r.cache_snapshot, std::move(r.cached_added),
                                   std::move(r.cached_removed)};
  switch (self->state.policy->on_report(r.engine_index, report, ns_since_epoch(self->clock().now()), cache)) {
    case balance::report_outcome::ignored:
      spdlog::warn("load balancer: ignored a load report for engine {} with a count out of range", r.engine_index);
      return;
    case balance::report_outcome::resync:
      return ask_reports(self, static_cast<size_t>(r.engine_index));
    case balance::report_outcome::taken:
      return;
  }
}

}  // namespace troupe::actors
