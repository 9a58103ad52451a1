#pragma once

/// The load balancer: the routing entry point that clients talk to. For each
/// `completion_request` it assigns an id and a seed (when the client gave none), picks an
/// engine and spawns the request actor on its own node, answering the client with that actor.
/// Engine choice: fewest live requests routed to it, ties broken by engine order (with one
/// engine, always it; load reports and tiers come with multi-node topologies).

#include <memory>
#include <vector>

#include <caf/fwd.hpp>

#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::actors {

struct load_balancer_options {
  std::vector<caf::actor> engines;
  std::shared_ptr<const tokenizer> tok;
  uint64_t seed_base = 0;  ///< request i without a seed gets splitmix64(seed_base + i)
};

caf::actor spawn_load_balancer(caf::actor_system& sys, load_balancer_options options);

/// Index of the engine with the fewest live requests, ties by index. Exposed for tests.
[[nodiscard]] size_t pick_engine(const std::vector<int64_t>& num_live);

}  // namespace troupe::actors
