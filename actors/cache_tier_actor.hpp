#pragma once

/// The host-memory cache tier actor (issue 14): a kv::tier_store behind the cache_tier_actor
/// protocol, on the actor system's clock (wall time in production, virtual time under the test
/// coordinator, so days of TTL pass in a test). A dispatcher: each handler validates what came
/// in and calls the store. With a disk tier actor below it (actors/disk_tier_actor.hpp: the
/// disk tier, or the simulator's modelled device), it never touches the device itself: the
/// blocks the store evicts are sent down with the class of their last use and not waited for
/// (the disk tier actor counts what it keeps and refuses), and a fetch that lacks blocks asks
/// the disk tier actor for them (kv/split_fetch.hpp) and answers when it does — or, when it
/// fails or does not answer in time, with the blocks the store holds: a fetch with a budget
/// (msg::tier_fetch::budget_ns) passes it down and waits msg::lower_wait_ns of it, one without
/// waits `disk_timeout`. The store
/// serves lookups, puts and other fetches meanwhile. A stats query asks the disk tier actor for
/// its counters the same way (with the last ones it gave when it does not answer).
///
/// Reports (msg::tier_report_to, from the balancer): the chain hashes the store holds go to the
/// balancer's prefix directory as msg::tier_events — a snapshot first (and whenever asked
/// again, or after the store's event log overflowed), then the net change since the last
/// report, at most every interval and only when there is one (blocks past their TTL are dropped
/// first). With a disk tier below it, the disk tier actor's hashes are asked for each time and
/// relayed as a stream of their own (msg::tier_events::lower), one ask at a time.
///
/// Senders (issue 47; runtime/common/sender_policy.hpp): lookups, puts, gets and stats only
/// from actors of its own node (its engines); `tier_report_to` from its own node or, remote, from
/// one of the first four balancers that send one for themselves (a cluster's balancer nodes:
/// each kept, and monitored, its place free for the next when it goes down; every one gets the
/// same stream of reports); fetches also from actors of those balancers' nodes and of the engine
/// nodes their report_to names. Others get an invalid_argument error (a
/// report_to is dropped), the first refusal logged as a warning.

#include <chrono>

#include <caf/fwd.hpp>
#include <caf/node_id.hpp>
#include <caf/timespan.hpp>

#include "actors/system/protocols.hpp"
#include "runtime/kv/tier_store.hpp"

namespace troupe::actors {

/// Spawns a tier owning `store` over `disk`, if given (of the same block size), which a fetch
/// without a budget, or a stats query, waits for at most `disk_timeout` (a node gives 4/5 of
/// its `host_tier_fetch_timeout_ms` when set: the rest is for the answer to reach the engine).
/// `home`: the node whose actors it serves (empty: the actor system's; a test gives another so
/// that its actors count as remote).
cache_tier_actor spawn_cache_tier(caf::actor_system& sys, kv::tier_store store, disk_tier_actor disk = {},
                                  caf::timespan disk_timeout = std::chrono::milliseconds(40),
                                  const caf::node_id& home = caf::node_id{});

}  // namespace troupe::actors
