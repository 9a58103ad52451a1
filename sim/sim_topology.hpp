#pragma once

/// Simulation topology files: the modelled model's shape and KV memory (so traces run at their
/// real lengths, not the bundled model's 512), the replicas and their scheduler settings, the load balancer's router, the
/// step cost model, and the token mode. The KV pool size in blocks follows from the memory:
/// kv_memory_gib * 2^30 / (block_size * kv_bytes_per_token), with kv_bytes_per_token =
/// 2 (K and V) * n_layers * kv_dim * kv_bytes_per_value. Schema: docs/simulation.md.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/cost/cost_model.hpp"
#include "runtime/cost/roofline.hpp"
#include "runtime/engine/engine_core.hpp"
#include "sim/moe_traffic.hpp"
#include "sim/network.hpp"

namespace troupe::sim {

/// synthetic: tokens are made up and every request runs exactly to its trace output length;
/// real: the bundled model computes real tokens while time stays virtual.
enum class token_mode { synthetic, real };

/// `[host_tier]`: a host-memory KV tier below each replica's pool (docs/kv-tiers.md), the
/// production cache_tier actor on virtual time. Blocks moved between it and the pool (demoted
/// after an eviction, promoted for a prefix hit) are priced into the step that moves them:
/// `latency_us` once, plus their bytes (block_size * kv_bytes_per_token each) over
/// `bandwidth_gb_s`.
struct sim_host_tier {
  int64_t blocks = 0;            ///< capacity per replica; 0 = no tier
  double bandwidth_gb_s = 25;    ///< host <-> accelerator copies, 10^9 bytes/s
  double latency_us = 0;         ///< per step that moves blocks
  // A step's moves overlap its compute as the engine's copy stream has them
  // ([engine] copy_stream_min_bytes; sim/cost_executor.hpp, tier_transfer_cost).
  /// A fixed bound on how long an engine waits for the tier's answer before it computes the
  /// prefix itself (as `[[node]] host_tier_fetch_timeout_ms`); 0 = fetch or recompute by cost
  /// (engine_core::plan_fetch), the engines pricing a copy to the pool at `bandwidth_gb_s`.
  int32_t fetch_timeout_ms = 0;
};

/// `[disk_tier]` (needs `[host_tier]`): a modelled device below each replica's host tier
/// (sim/modelled_tier.hpp), which takes the blocks the host tier evicts and, when full,
/// evicts its least recently used ones, as the disk tier does, behind the production disk tier
/// actor. A fetch that reads n blocks from it is answered `latency_us` + n blocks' bytes /
/// `bandwidth_gb_s` later (then the blocks move to the pool as host-tier blocks do); the host
/// tier reads only what fits in the fetch's budget (fetch or recompute) and waits for it
/// msg::lower_wait_ns of that budget — or, with a fixed `[host_tier] fetch_timeout_ms`, reads
/// all and waits at most 4/5 of it.
struct sim_disk_tier {
  int64_t blocks = 0;            ///< capacity per replica; 0 = no tier
  double bandwidth_gb_s = 3;     ///< device reads, 10^9 bytes/s
  double latency_us = 100;       ///< per fetch that reads from it
};

/// `[speculation]` (docs/speculative.md): the engines speculate with `drafter`
/// (engine_config::speculation, also `num_speculative_tokens` and `mode`). With synthetic tokens
/// the drafter is modelled: it proposes every draft slot, each with confidence `acceptance`, and
/// a verified draft stands with probability `acceptance` given the ones before it stood (the
/// mean a real run measures: accepted / verified in its reliability table), drawn from the
/// request's seed and the draft's position. With real tokens the real drafter runs (ngram or
/// layer_skip). Each proposed draft costs `draft_token_ns` of drafting; verification rows are
/// priced by the step-time model like any row.
struct sim_speculation {
  double acceptance = 0.7;
  double draft_token_ns = 0;
};

struct sim_topology {
  std::string model_name;
  model::model_config model;            ///< seq_len = the modelled max context
  int64_t kv_bytes_per_token = 0;
  double kv_memory_gib = 0;
  std::string checkpoint_path;          ///< real mode: the model that computes tokens
  std::string tokenizer_path;           ///< real mode
  int32_t replicas = 1;
  /// [engine] prefill_replicas: the first this many replicas are prefill engines and the rest
  /// decode engines (disaggregated, docs/cluster.md); 0 = every replica is mixed.
  int32_t prefill_replicas = 0;
  engine::engine_config engine;         ///< num_kv_blocks derived from the memory
  int32_t max_waiting = 1 << 20;
  std::string router = "auto";  ///< [load_balancer] router: one of balance::router_names()
  double prefix_weight = 0.5;           ///< [load_balancer] prefix_weight (prefix_affinity)
  double rate_limit_per_s = 0;          ///< [load_balancer] admission rate, 0 = off
  int32_t rate_limit_burst = 16;         ///< [load_balancer] admission burst
  cost::cost_params cost;
  /// [cost] model = "roofline": steps are priced by it (from the hardware and the shape) and
  /// `cost` is unused; absent: by the calibrated `cost`.
  std::optional<cost::roofline_model> roofline;
  token_mode tokens = token_mode::synthetic;
  sim_host_tier host_tier;
  sim_disk_tier disk_tier;
  sim_speculation speculation;  ///< with engine.speculation enabled
  /// [network]: every engine a node of its own (sim/network.hpp); all zero: no network (what
  /// crosses nodes arrives at once).
  sim_network_links network;
  /// [moe]: every layer's FFN is a mixture of experts priced by sim/moe_traffic.hpp on top of the
  /// [cost] model's price (which then stands for the rest of the step); absent: not enabled().
  moe_settings moe;
};

/// `TABLE.KEY=VALUE` settings applied over a topology file before it is validated (`troupe sim
/// --set`, `--sweep`): VALUE is read as an integer, else a float, else true/false, else a string.
using topology_overrides = std::vector<std::pair<std::string, std::string>>;

/// Parses and validates a simulation topology; errors name the file, the line and the key (an
/// overridden key: "(--set TABLE.KEY)" instead of the line).
[[nodiscard]] expected<sim_topology> load_sim_topology(const std::string& path, const topology_overrides& set = {});
[[nodiscard]] expected<sim_topology> parse_sim_topology(std::string_view text, const std::string& source_name,
                                                        const std::string& base_dir,
                                                        const topology_overrides& set = {});

}  // namespace troupe::sim
