#pragma once

/// Atoms of the actor protocols that carry no payload.

#include <caf/atom.hpp>

namespace troupe::actors {

using stats_atom = caf::atom_constant<caf::atom("stats")>;        ///< -> msg::engine_report
using executor_atom = caf::atom_constant<caf::atom("executor")>;  ///< -> the current executor
using engines_atom = caf::atom_constant<caf::atom("engines")>;    ///< -> engine_list (actors/system/protocols.hpp)
using expert_shards_atom = caf::atom_constant<caf::atom("xshards")>;  ///< -> expert_shard_list
using host_tier_atom = caf::atom_constant<caf::atom("hosttier")>;  ///< -> a node's cache_tier_actor
using report_atom = caf::atom_constant<caf::atom("report")>;    ///< an engine's load report is due
using ping_atom = caf::atom_constant<caf::atom("ping")>;          ///< -> pong_atom: are you alive?
using pong_atom = caf::atom_constant<caf::atom("pong")>;          ///< the answer to ping_atom
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;  ///< time to ping every peer
using rejoin_atom = caf::atom_constant<caf::atom("rejoin")>;  ///< time to reach lost nodes again
using drain_atom = caf::atom_constant<caf::atom("drain")>;  ///< an engine's node is shutting down
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;    ///< a client's deadline may have passed

}  // namespace troupe::actors
