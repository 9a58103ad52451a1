#pragma once

/// The host-memory cache tier actor (issue 14): a kv::tier_store behind the cache_tier_actor
/// protocol, on the actor system's clock (wall time in production, virtual time under the test
/// coordinator, so days of TTL pass in a test). A dispatcher: each handler validates what came
/// in and calls the store. Blocks it evicts are dropped (demotion to a lower tier is planned).

#include <cstdint>

#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/cache_tier.hpp"
#include "runtime/kv/tier_store.hpp"

namespace troupe::actors {

/// A cache tier: the longest prefix it holds, store a block (answered with the number of blocks
/// evicted), read one back. Declared here, beside its only actor, until the engine talks to it
/// (then it joins actors/protocols.hpp).
using cache_tier_actor = caf::typed_actor<caf::replies_to<msg::tier_lookup>::with<int32_t>,
                                          caf::replies_to<msg::tier_put>::with<int64_t>,
                                          caf::replies_to<msg::tier_get>::with<msg::tier_got>>;

/// Spawns a tier owning `store`.
cache_tier_actor spawn_cache_tier(caf::actor_system& sys, kv::tier_store store);

}  // namespace troupe::actors
