#pragma once

/// The host-memory cache tier actor (issue 14): a kv::tier_store behind the cache_tier_actor
/// protocol, on the actor system's clock (wall time in production, virtual time under the test
/// coordinator, so days of TTL pass in a test). A dispatcher: each handler validates what came
/// in and calls the store. With a lower tier below it (the disk tier, or the simulator's
/// modelled device), the blocks the store evicts are written there with the class of their
/// last use, at this actor's time (a block the lower tier refuses — one it cannot hold, an I/O
/// error — is dropped) and a fetch reads from there, at its time, the blocks the store lacks.
/// The disk's file I/O runs in this actor, never in an engine (which does not wait for a
/// tier's answers). With a `lower_read_cost` (the simulator's), a fetch that read blocks from
/// the lower tier is answered that much later on the actor system's clock.
///
/// Reports (msg::tier_report_to, from the balancer): the chain hashes the store holds go to the
/// balancer's prefix directory as msg::tier_events — a snapshot first (and whenever asked
/// again, or after the store's event log overflowed), then the net change since the last
/// report, at most every interval and only when there is one (blocks past their TTL are dropped
/// first). What the disk tier below holds is not reported.

#include <cstdint>
#include <functional>
#include <memory>

#include <caf/fwd.hpp>

#include "actors/protocols.hpp"
#include "runtime/kv/tier_store.hpp"
#include "runtime/kv/lower_tier.hpp"

namespace troupe::actors {

/// How long reading `num_blocks` blocks from the lower tier takes (the simulator's model of a
/// device); empty: the time the reads take.
using lower_read_cost = std::function<caf::timespan(int64_t num_blocks)>;

/// Spawns a tier owning `store` and, if given, the lower tier below it (of the same block size).
cache_tier_actor spawn_cache_tier(caf::actor_system& sys, kv::tier_store store,
                                  std::shared_ptr<kv::lower_tier> lower = nullptr, lower_read_cost read_cost = {});

}  // namespace troupe::actors
