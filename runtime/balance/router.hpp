#pragma once

/// Routing policies: which engines a request goes to, as named plug-ins the load balancer (real
/// or simulated: the simulator runs the same balancer actor) is configured with.
///
/// Every policy chooses among the same candidates (placement.hpp): the live engines that can
/// decode, and for a prompt of two or more tokens the live prefill engines of its length tier
/// (every live prefill engine when its tier has none; no prefill candidate = the request runs
/// whole on its decode engine). What a policy decides is which candidate, per role:
///
/// - `least_loaded` (the default): the decode candidate with the lowest
///   num_requests / max_num_seqs + num_kv_tokens / kv_capacity_tokens, the prefill candidate
///   with the fewest queued prefill tokens; ties to the lowest engine index.
/// - `round_robin`: per role, the first candidate after the one it chose last, in engine order
///   (cyclic), ignoring load.
/// - `power_of_two`: per role, two distinct candidates drawn uniformly (Philox4x32-10 keyed by
///   the router's seed, counter = the request's number and the role), the lighter of the two
///   by least_loaded's measure (ties: the lower index). "The power of two choices"
///   (Mitzenmacher): near least-loaded balance from two samples, without herding onto one
///   engine when load reports are stale.
///
/// A new policy is one file implementing `router` plus one registration line in
/// routers.cpp (docs/simulation.md, "Policies"). Policies are deterministic: their only inputs
/// are the loads, the candidates, the request's number and the seed.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/balance/placement.hpp"
#include "runtime/common/error.hpp"

namespace troupe::balance {

struct router_options {
  std::string policy = "least_loaded";
  uint64_t seed = 0;  ///< for randomised policies
};

class router {
 public:
  virtual ~router() = default;
  /// Chooses for request number `number` (0, 1, 2, … in the order the balancer places them)
  /// among `c`, whose `decode` is not empty.
  [[nodiscard]] virtual placement choose(const std::vector<engine_load>& engines, const candidates& c,
                                         uint64_t number) = 0;
};

/// The router named `o.policy`; an error (invalid_argument) lists the known names.
[[nodiscard]] expected<std::unique_ptr<router>> make_router(const router_options& o);
/// The known policies' names, in registration order.
[[nodiscard]] std::vector<std::string> router_names();

}  // namespace troupe::balance
