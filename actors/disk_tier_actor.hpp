#pragma once

/// The disk tier actor (issue 14): a kv::lower_tier — the disk tier (actors/edge/disk_tier.hpp) or the
/// simulator's modelled device (sim/modelled_tier.hpp) — behind the disk_tier_actor protocol
/// (messages/disk_tier.hpp), below a host tier actor (actors/cache_tier_actor.hpp), on the actor
/// system's clock (wall time in production, virtual time under the test coordinator). Its file
/// I/O runs here, never in the host tier's actor nor in an engine's: the host tier sends the
/// blocks it evicts without waiting, and asks for the blocks it lacks with a bounded wait.
/// A dispatcher: each handler validates what came in — a block (kv::validate, of the tier's
/// block size), a class (kv::is_valid) — answering bad input with an invalid_argument error,
/// and calls the tier.
///
/// - `disk_put{block, cls}`: kept (`disk_stored{true, evicted}`) or refused (`{false, 0}`: a
///   block bigger than the whole tier, an I/O error; the block is dropped, the first refusal
///   logged).
/// - `disk_fetch{hashes, budget_ns}`: the leading run of the named blocks it holds alive, each
///   read a use. With a `lower_read_cost` (the simulator's), a fetch that read n blocks is
///   answered read_cost(n) later on the actor system's clock; the actor handles other messages
///   meanwhile. A budget (> 0) stops the reads: modelled ones before the first that would end
///   after it, a device's once they have taken it — the answer is what arrived in time.
/// - `stats_atom`: `disk_report` (blocks held after dropping the expired, blocks kept, refused,
///   read back, expired).
///
/// Detached (production), it runs on a thread of its own, so a slow device blocks no thread of
/// CAF's scheduler either.

#include <cstdint>
#include <functional>
#include <memory>

#include <caf/fwd.hpp>
#include <caf/node_id.hpp>
#include <caf/timespan.hpp>

#include "actors/system/protocols.hpp"
#include "runtime/kv/lower_tier.hpp"

namespace troupe::actors {

/// How long reading `num_blocks` blocks from the lower tier takes (the simulator's model of a
/// device); empty: the time the reads take.
using lower_read_cost = std::function<caf::timespan(int64_t num_blocks)>;

/// Spawns the actor owning `lower` (not null: asserted); `detached`: on a thread of its own
/// (never under the test coordinator, whose virtual time it would not share). It serves actors
/// of its `home` node only (empty: the actor system's; a test gives another so that its actors
/// count as remote), answering others with an error (issue 47, runtime/common/sender_policy.hpp).
disk_tier_actor spawn_disk_tier(caf::actor_system& sys, std::shared_ptr<kv::lower_tier> lower,
                                lower_read_cost read_cost = {}, bool detached = false,
                                const caf::node_id& home = caf::node_id{});

}  // namespace troupe::actors
