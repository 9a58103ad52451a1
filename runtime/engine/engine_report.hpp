#pragma once

/// What an engine reports when asked (`stats_atom` in actors/, the Prometheus page in
/// runtime/openai/metrics, the simulator's totals): plain data, so the pure OpenAI mapping and the
/// wire mapping (messages/control.hpp) share one struct.

#include <cstdint>

namespace troupe::engine {

/// Counters an engine reports when asked (`stats_atom`).
struct engine_report {
  int64_t num_steps = 0;
  int64_t num_generated_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_executor_failures = 0;
  int64_t num_waiting = 0;
  int64_t num_requests = 0;      ///< unfinished requests (waiting or running)
  int64_t num_blocks_in_use = 0; ///< KV blocks held by unfinished requests
  int64_t executor_busy_ns = 0;  ///< time with at least one step in flight
  int64_t elapsed_ns = 0;        ///< since the engine started
  /// With a time budget and its online correction: the steps measured so far, and the mean
  /// relative error of their predicted times by the cost model alone and corrected
  /// (runtime/cost/step_time_correction.hpp).
  int64_t num_timed_steps = 0;
  double step_time_error_raw = 0;
  double step_time_error_corrected = 0;
  /// KV cache tiers (docs/kv-tiers.md): prompt tokens served from cache at admission, of them
  /// those from blocks the host tier had just promoted (the rest are the pool's own), and the
  /// blocks and bytes moved each way.
  int64_t num_prefix_hit_tokens = 0;
  int64_t num_host_hit_tokens = 0;
  int64_t num_demoted_blocks = 0;  ///< pool -> host tier
  int64_t num_demoted_bytes = 0;
  int64_t num_promoted_blocks = 0;  ///< host tier -> pool
  int64_t num_promoted_bytes = 0;
  /// The engine's host tier (shared by the engines of its node): blocks its TTLs expired; 0
  /// without a tier, or if the tier did not answer in time.
  int64_t host_tier_expired_blocks = 0;
  /// Time lost to preemption so far (engine::engine_stats::preempted_ns).
  int64_t preempted_ns = 0;
  /// Speculative decoding: draft slots planned and drafts that stood (engine::engine_stats).
  int64_t num_draft_slots = 0;
  int64_t num_draft_rows = 0;
  int64_t num_accepted_drafts = 0;
  /// Hand-offs (from a prefill engine, or a drained engine's forward) whose KV did not arrive
  /// intact, recomputed here instead.
  int64_t num_handoffs_recomputed = 0;
  /// Of num_host_hit_tokens, those whose blocks the host tier read from the disk tier below it.
  int64_t num_disk_hit_tokens = 0;
  /// Tokens readmitted victims of preemption took back from the host tier (swap-ins; not in
  /// num_host_hit_tokens).
  int64_t num_swap_in_tokens = 0;
  /// Blocks the disk tier below the host tier dropped by TTL (asked of the tier with the report).
  int64_t disk_tier_expired_blocks = 0;
  /// An MoE engine reassigning its experts (docs/moe.md): the latest window's moe_lb (0 before
  /// the first), the windows measured and the placements switched to (a switch counts with the
  /// result of the step after it).
  double moe_lb_last_window = 0;
  int64_t num_moe_windows = 0;
  int64_t num_expert_moves = 0;
};

}  // namespace troupe::engine
