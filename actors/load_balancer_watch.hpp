#pragma once

/// The load balancer actor's state and its watch over the engines and cache tiers
/// (load_balancer_watch.cpp): load reports, the heartbeat, losses and rejoins; requests and
/// their placement are load_balancer_actor.cpp. Internal to those two files.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/load_balancer_actor.hpp"
#include "runtime/balance/admission.hpp"
#include "runtime/balance/balancer_policy.hpp"

namespace troupe::actors {

/// A live request actor: its key in the policy, and the process whose client asked for it.
struct live_request {
  balance::request_key key = 0;
  caf::node_id client_node;
};

/// Actor handles only: the bookkeeping is the policy's (runtime/balance/balancer_policy.hpp).
struct load_balancer_state {
  load_balancer_options o;
  std::vector<cache_tier_actor> tiers;  // the engines' nodes' cache tiers, each once, in engine order
  std::optional<balance::balancer_policy> policy;
  std::optional<balance::admission<caf::node_id>> admission;  // per-client caps and the rate
  int64_t num_routed = 0;  // requests routed so far: the sequential id, and the seed's index
  std::map<caf::actor_addr, live_request> placed;  // live request actor -> its key and client
  balance::request_key next_key = 0;
  bool rejoin_armed = false;             // a rejoin_atom is on its way
  std::set<std::string> rejoining;       // "address:port" of nodes being reached again
  /// Engines of this process lost to the heartbeat (alive, but silent: stalled, or cut off in
  /// the simulator's network): pinged again at each rejoin and taken back once they answer.
  std::set<size_t> silent_here;
  static inline const char* name = "load_balancer";
};

using load_balancer_t = balancer_actor::stateful_base<load_balancer_state>;

/// "engine 'name' on node 'node'", for messages.
[[nodiscard]] std::string where(const balanced_engine& e);
/// Engine `index` was just lost (`why`): every request placed on it is told.
void tell_lost(load_balancer_t* self, size_t index, const std::string& why);
/// Asks engine `index` for load reports (with its pool's cache events when the policy wants them).
void ask_reports(load_balancer_t* self, size_t index);
/// Asks cache tier `index` for its hashes, if the policy wants them.
void ask_tier_reports(load_balancer_t* self, size_t index);
/// A load report, counted only from the engine it names.
void on_report(load_balancer_t* self, msg::load_report& r);
/// A cache tier's hashes, counted only from the tier they name.
void on_tier_events(load_balancer_t* self, msg::tier_events& r);
/// One heartbeat: engines silent past the timeout are lost; every live one is pinged again.
void on_heartbeat(load_balancer_t* self);
/// A rejoin_atom: every lost engine's node is reached again (each node once).
void on_rejoin(load_balancer_t* self);

}  // namespace troupe::actors
