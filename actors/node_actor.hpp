#pragma once

/// The node actor (`node_actor` in system/protocols.hpp): what a node without the load balancer
/// publishes at its address, behind a door (system/door.hpp), so that no peer stops it with an
/// exit or a link. It lists the node's engines, the expert shards it hosts and its host tier
/// for the balancer's node and the engines' nodes, and hands `troupe drain` requests for this
/// node to the node's drain callback. A dispatcher: it keeps the lists it was spawned with.

#include <functional>
#include <string>

#include <caf/fwd.hpp>

#include "actors/system/protocols.hpp"
#include "runtime/common/error.hpp"

namespace troupe::actors {

/// What a node actor answers with.
struct node_listing {
  std::string node_name;
  engine_list engines;              ///< the node's engines, in topology order
  expert_shard_list expert_shards;  ///< the shards it hosts ([[expert_shard]] on this node), in topology order
  cache_tier_actor host_tier;       ///< none without a host tier
  /// Drains the node with a grace period (ms; -1: the topology's): the grace period it drains
  /// with, or why it does not. Called on an actor thread; empty: drain requests are refused.
  std::function<expected<int32_t>(int32_t grace_ms)> drain;
};

/// Spawns the node actor for `listing` behind a door; the handle is the door's (close_door ends
/// both).
[[nodiscard]] node_actor spawn_node_actor(caf::actor_system& sys, node_listing listing);

}  // namespace troupe::actors
