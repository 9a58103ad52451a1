#pragma once

/// Request placement across engines: the load balancer's policy as a pure function of what it
/// believes about each engine (the seed brief's "Request load balancing": prefill requests
/// bucketed by context length into tiers, decode requests spread to balance both request count
/// and total cache length). Prefix-cache affinity is a router's (router.hpp, prefix_affinity).
///
/// Prefill. Prompt lengths fall into tiers by `bounds` (N increasing bounds make N + 1 tiers;
/// tier t holds prompts of at most bounds[t] tokens, the last tier the longer ones), so a short
/// prompt never queues behind a long one. Prefill engines are assigned tiers by their order
/// among prefill engines (`assign_tiers`). A request goes to the live prefill engine of its tier
/// with the fewest queued prefill tokens (ties: lowest index); if its tier has no live engine,
/// to the live prefill engine with the fewest queued prefill tokens.
///
/// Decode. Among live decode and mixed engines, the lowest
///   num_requests / max_num_seqs + num_kv_tokens / kv_capacity_tokens
/// (the fraction of its sequence slots plus the fraction of its KV memory in use; ties: lowest
/// index). A request is disaggregated (prefill engine, then decode engine) when a prefill
/// engine is live and its prompt has at least two tokens (one-token prompts have nothing to
/// prefill); otherwise it runs whole on the decode choice.
///
/// Staleness. `num_requests` is exact (the balancer sees every request end); the token counts
/// are the engine's last load report plus what was placed on it since that report, so they lag
/// by at most one report interval plus one network hop.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe::balance {

/// A cluster's balancers at most (topology: [load_balancer] nodes): how many an engine and a
/// cache tier report to, and how request ids are kept apart (balancer i's are i modulo this).
inline constexpr size_t balancers_max = 4;
static_assert((balancers_max & (balancers_max - 1)) == 0, "request ids keep balancers apart by their low bits");

enum class engine_kind { mixed, prefill, decode };

/// What the balancer believes about one engine.
struct engine_load {
  engine_kind kind = engine_kind::mixed;
  bool alive = true;
  bool draining = false;  ///< its node is shutting down: alive, but it takes no new work
  int32_t max_num_seqs = 256;
  int64_t kv_capacity_tokens = 16384;
  int64_t num_requests = 0;        ///< live requests decoding (or running whole) there
  int64_t num_kv_tokens = 0;       ///< KV tokens in use (report + placed since)
  int64_t num_prefill_tokens = 0;  ///< prompt tokens queued for prefill (report + placed since)
};

/// The tier of a prompt of `num_prompt_tokens` tokens: the index of the first bound >= it, or
/// bounds.size() when it exceeds them all.
[[nodiscard]] int32_t tier_of(int32_t num_prompt_tokens, const std::vector<int32_t>& bounds);

/// serves[i][t]: whether the i-th prefill engine (in engine order) serves tier t. With P >= T
/// engines, engine i serves tier i % T; with fewer, engine i serves tiers
/// [i * T / P, (i + 1) * T / P), so every tier has an engine.
[[nodiscard]] std::vector<std::vector<bool>> assign_tiers(int32_t num_prefill_engines, int32_t num_tiers);

struct placement {
  std::optional<size_t> prefill;  ///< empty: the request runs whole on `decode`
  size_t decode = 0;
  /// The cache tier the engine that computes the prompt is to fetch its prefix from (the
  /// balancer's, balancer_policy.hpp; routers leave it empty): empty = its own node's tier, if any.
  std::optional<size_t> cache_tier;
};

/// The engines a request may go to, each list in engine order: the live engines that can decode
/// (mixed and decode), and, for a prompt of at least two tokens, the live prefill engines
/// serving its tier — every live prefill engine when none serves it; empty = run whole.
struct candidates {
  std::vector<size_t> decode;
  std::vector<size_t> prefill;
};

/// `tiers` is assign_tiers' answer for the prefill engines of `engines`, in order.
[[nodiscard]] candidates candidates_for(const std::vector<engine_load>& engines,
                                        const std::vector<std::vector<bool>>& tiers, int32_t tier,
                                        int32_t num_prompt_tokens);

/// How loaded an engine is as a decode target (lower is lighter):
/// num_requests / max_num_seqs + num_kv_tokens / kv_capacity_tokens.
[[nodiscard]] double decode_score(const engine_load& e);

/// The engine of `among` (in index order) with the lowest `key(index)`, ties to the lowest
/// index; empty when `among` is.
template <class Key>
[[nodiscard]] std::optional<size_t> lowest(const std::vector<size_t>& among, Key&& key) {
  std::optional<size_t> best;
  for (size_t i : among)
    if (!best || key(i) < key(*best)) best = i;
  return best;
}

/// The least-loaded placement among `c` (the default router, router.hpp): the decode candidate
/// with the lowest decode_score, the prefill candidate with the fewest queued prefill tokens;
/// ties to the lowest index. `c.decode` must not be empty.
[[nodiscard]] placement least_loaded(const std::vector<engine_load>& engines, const candidates& c);

}  // namespace troupe::balance
