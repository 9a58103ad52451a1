#pragma once

/// The engine actor's state and how it performs what its policy and intake decide
/// (engine_effects.cpp); the message dispatch is engine_actor.cpp. Internal to those two files.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/engine_actor.hpp"
#include "actors/grammar_actor.hpp"
#include "actors/kv_transfers.hpp"
#include "actors/system/network_model.hpp"
#include "runtime/engine/engine_policy.hpp"
#include "runtime/engine/intake.hpp"

namespace troupe::actors {

/// Actor handles only: every decision is the policy's (runtime/engine/engine_policy.hpp).
struct engine_state {
  engine_options options;
  std::unique_ptr<engine::engine_policy> policy;
  executor_actor executor;
  std::map<engine::request_id, request_actor> clients;             // request actors (watch_caller)
  std::map<caf::actor_addr, engine::request_id> request_of_actor;  // to release a dead one's work
  std::vector<engine_actor> decodes;                               // engine::peer_id -> decode engine
  std::unique_ptr<kv_transfers> kv;                                 // KV over the transport (UCX)
  /// The balancers it reports to (report_to), in order of their first report_to; at most
  /// balance::balancers_max, each monitored and dropped when it goes down.
  std::vector<balancer_actor> balancers;
  std::vector<cache_tier_actor> cache_tiers;  // the cluster's, in the balancers' order (report_to)
  grammar_actor grammars;  // compiles requests' grammars before they are admitted
  /// Work before the policy takes it: duplicates, grammars compiling (runtime/engine/intake.hpp).
  std::optional<engine::intake<caf::actor_addr>> intake;
  /// A drain's answer, given once nothing is left here: the number of requests forwarded, and of
  /// them those forwarded with their KV.
  std::optional<caf::typed_response_promise<int32_t, int32_t>> drained;
  static inline const char* name = "engine";
};

using engine_actor_t = engine_actor::stateful_base<engine_state>;

/// Sends to another node: over the simulator's network when there is one (engine_options::network).
template <class Handle, class Message>
void post(engine_actor_t* self, const Handle& to, Message&& m, int64_t bytes = 0) {
  send_over(self, self->state.options.network.get(), to, std::forward<Message>(m), bytes);
}

[[nodiscard]] int64_t now_ns(engine_actor_t* self);
/// The request actor of request `id` (watch_caller), or none.
[[nodiscard]] request_actor client_of(engine_actor_t* self, engine::request_id id);
/// Spawns (or makes, engine_options::make_executor) the executor and monitors it.
void start_executor(engine_actor_t* self);
/// The executor of `generation` failed: the policy restarts it (an older generation's is ignored).
void executor_failed(engine_actor_t* self, int64_t generation, const caf::error& reason);
/// Performs the policy's effects in order; `caller` is the actor the current call came from. A
/// drain is answered once nothing is left.
void perform(engine_actor_t* self, engine::effects fx, const request_actor& caller = {});
/// Performs the intake's step for a request from `caller`.
void take_in(engine_actor_t* self, engine::intake_step step, const request_actor& caller);

}  // namespace troupe::actors
