#pragma once

/// Launching a topology node: load its engines' models, spawn engine + executor actors and, if
/// the load balancer is placed there, the load balancer.

#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>

#include "runtime/tokenizer/tokenizer.hpp"
#include "topology/topology.hpp"

namespace troupe::topology {

struct launch_options {
  bool detached_executors = true;  ///< false under the deterministic test scheduler
  uint64_t seed_base = 0;          ///< the load balancer's seed base (see load_balancer_options)
};

/// What a node runs.
struct launched_node {
  std::vector<caf::actor> engines;     ///< in topology order
  std::vector<std::string> engine_names;
  caf::actor load_balancer;            ///< invalid if the balancer is placed elsewhere
  std::shared_ptr<const tokenizer> tok;
  std::vector<std::string> summary;    ///< one line per spawned actor, for `troupe serve`
};

/// Spawns everything `t` places on `node_name`. Errors: unknown node, unreadable model or
/// tokenizer, a tokenizer that does not fit its model, invalid engine settings, a balancer with
/// no engine on this node (multi-node balancing arrives with the multi-node topologies).
[[nodiscard]] expected<launched_node> launch_node(caf::actor_system& sys, const topology& t,
                                                  const std::string& node_name,
                                                  const launch_options& options);

/// Sends every actor of `node` an exit and waits until the system has no actors left.
void shutdown_node(caf::actor_system& sys, const launched_node& node);

/// A one-node topology running `model_path` with defaults (`troupe generate`).
[[nodiscard]] topology single_node(const std::string& model_path, const std::string& tokenizer_path);

}  // namespace troupe::topology
