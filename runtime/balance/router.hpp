#pragma once

/// Routing policies: which engines a request goes to, as named plug-ins the load balancer (real
/// or simulated: the simulator runs the same balancer actor) is configured with.
///
/// Every policy chooses among the same candidates (placement.hpp): the live engines that can
/// decode, and for a prompt of two or more tokens the live prefill engines of its length tier
/// (every live prefill engine when its tier has none; no prefill candidate = the request runs
/// whole on its decode engine). What a policy decides is which candidate, per role:
///
/// - `auto` (the default): `prefix_affinity` where a prefix directory can pay (more than one
///   engine, or a cache tier), else `least_loaded`. Measured on the Mooncake trace
///   (docs/simulation.md, "Policies"), prefix_affinity was never behind least_loaded: +1.5%
///   goodput with the 7B example's pools, +7.3% and twice the hit rate with 8x the cache. Its
///   load term (request count and cache length) is the guard that keeps a cached prefix from
///   drawing requests to an engine however loaded it is.
/// - `least_loaded`: the decode candidate with the lowest
///   num_requests / max_num_seqs + num_kv_tokens / kv_capacity_tokens, the prefill candidate
///   with the fewest queued prefill tokens; ties to the lowest engine index.
/// - `round_robin`: per role, the first candidate after the one it chose last, in engine order
///   (cyclic), ignoring load.
/// - `power_of_two`: per role, two distinct candidates drawn uniformly (Philox4x32-10 keyed by
///   the router's seed, counter = the request's number and the role), the lighter of the two
///   by least_loaded's measure (ties: the lower index). "The power of two choices"
///   (Mitzenmacher): near least-loaded balance from two samples, without herding onto one
///   engine when load reports are stale.
/// - `prefix_affinity`: weighs each candidate's cached prefix of the prompt (the balancer's
///   prefix directory, prefix_directory.hpp) against its load, `w` = `prefix_weight`:
///   a prompt that runs whole goes to the decode candidate with the lowest
///   decode_score - w * cached_tokens / num_prompt_tokens (a fully cached prompt is worth w of
///   load: w = 0.5 outweighs half the engine's KV memory); a disaggregated one to the prefill
///   candidate with the lowest num_prefill_tokens - w * cached_tokens (w = 1: the prefill tokens
///   queued there minus those this prompt would not compute), and to least_loaded's decode
///   candidate (decode engines do not reuse prefixes). Ties: the lower index.
///
/// A new policy is one file implementing `router` plus one registration line in
/// routers.cpp (docs/simulation.md, "Policies"). Policies are deterministic: their only inputs
/// are the loads, the candidates, what route_request says and the seed.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/balance/placement.hpp"
#include "runtime/common/error.hpp"

namespace troupe::balance {

struct router_options {
  std::string policy = "auto";
  uint64_t seed = 0;  ///< for randomised policies
  /// prefix_affinity's weight of a cached prefix against load, in [0, prefix_weight_max].
  double prefix_weight = 0.5;
};

inline constexpr double prefix_weight_max = 1e6;

/// The request a router places.
struct route_request {
  uint64_t number = 0;  ///< 0, 1, 2, … in the order the balancer places requests
  int32_t num_prompt_tokens = 0;
  /// (engine): prompt tokens in that engine's longest cached prefix, by the balancer's prefix
  /// directory; filled only for a router whose uses_prefixes() (else empty).
  std::vector<int64_t> cached_tokens;
};

class router {
 public:
  virtual ~router() = default;
  /// Chooses for request `r` among `c`, whose `decode` is not empty.
  [[nodiscard]] virtual placement choose(const std::vector<engine_load>& engines, const candidates& c,
                                         const route_request& r) = 0;
  /// Whether choose reads route_request::cached_tokens (the balancer keeps a prefix directory
  /// only for such a router).
  [[nodiscard]] virtual bool uses_prefixes() const { return false; }
};

/// The router named `o.policy` for a balancer of `num_engines` engines and cache tiers or none
/// (they resolve `auto`); an error (invalid_argument) lists the known names, or says which
/// parameter is out of range.
[[nodiscard]] expected<std::unique_ptr<router>> make_router(const router_options& o, size_t num_engines = 2,
                                                            bool any_cache_tier = false);
/// The known policies' names, in registration order.
[[nodiscard]] std::vector<std::string> router_names();

}  // namespace troupe::balance
