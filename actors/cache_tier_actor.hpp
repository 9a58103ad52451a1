#pragma once

/// The host-memory cache tier actor (issue 14): a kv::tier_store behind the cache_tier_actor
/// protocol, on the actor system's clock (wall time in production, virtual time under the test
/// coordinator, so days of TTL pass in a test). A dispatcher: each handler validates what came
/// in and calls the store. Blocks it evicts are dropped (demotion to a lower tier is planned).

#include <cstdint>

#include <caf/fwd.hpp>

#include "actors/protocols.hpp"
#include "runtime/kv/tier_store.hpp"

namespace troupe::actors {

/// Spawns a tier owning `store`.
cache_tier_actor spawn_cache_tier(caf::actor_system& sys, kv::tier_store store);

}  // namespace troupe::actors
