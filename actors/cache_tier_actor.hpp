#pragma once

/// The host-memory cache tier actor (issue 14): a kv::tier_store behind the cache_tier_actor
/// protocol, on the actor system's clock (wall time in production, virtual time under the test
/// coordinator, so days of TTL pass in a test). A dispatcher: each handler validates what came
/// in and calls the store. With a disk tier below it, the blocks the store evicts are written
/// there (a block the disk tier refuses — full, an I/O error — is dropped) and a fetch reads
/// from there the blocks the store lacks. The disk's file I/O runs in this actor, never in an
/// engine (which does not wait for a tier's answers).

#include <cstdint>
#include <optional>

#include <caf/fwd.hpp>

#include "actors/protocols.hpp"
#include "runtime/kv/tier_store.hpp"
#include "tiers/disk_tier.hpp"

namespace troupe::actors {

/// Spawns a tier owning `store` and, if given, the disk tier below it (of the same block size).
cache_tier_actor spawn_cache_tier(caf::actor_system& sys, kv::tier_store store,
                                  std::optional<tiers::disk_tier> disk = std::nullopt);

}  // namespace troupe::actors
