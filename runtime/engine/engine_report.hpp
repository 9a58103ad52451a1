#pragma once

/// An engine's statistics, one struct end to end: the counters its core keeps
/// (engine::engine_stats derives from engine_counters), and the report that carries them with
/// the policy's own (`stats_atom` in actors/, the Prometheus page in runtime/openai/metrics, the
/// simulator's totals). Plain data, so the pure OpenAI mapping and the wire mapping
/// (messages/control.hpp) share it.

#include <array>
#include <cstdint>
#include <vector>

namespace troupe::engine {

/// The upper bounds of vLLM's `iteration_tokens_total` buckets: tokens run in one engine step.
inline constexpr std::array<int64_t, 13> iteration_token_bounds{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

/// Counters an engine core keeps since construction (engine::engine_core::stats).
struct engine_counters {
  int64_t num_steps = 0;
  int64_t num_generated_tokens = 0;
  int64_t num_scheduled_tokens = 0;  ///< tokens run through the model (prefill + decode)
  int64_t num_discarded_tokens = 0;  ///< sampled for a sample that had already ended
  int64_t num_preemptions = 0;
  int64_t num_prefix_hit_tokens = 0;  ///< prompt tokens served from the prefix cache at admission
  int64_t num_prefix_query_tokens = 0;  ///< prompt tokens looked up in the prefix cache at admission
  int64_t num_recomputed_tokens = 0;  ///< tokens computed again after preemptions
  /// Time lost to preemption: of each measured step, the share of its tokens that were
  /// computed again after a preemption dropped their KV (step_plan::num_recomputed_tokens).
  int64_t preempted_ns = 0;
  /// KV cache tiers (docs/kv-tiers.md). Of num_prefix_hit_tokens, those served by blocks
  /// promoted from the host tier for this use (a promoted block's first hit; later hits on it
  /// are the pool's).
  int64_t num_host_hit_tokens = 0;
  /// Of num_host_hit_tokens, those whose blocks the host tier read from the disk tier below it.
  int64_t num_disk_hit_tokens = 0;
  int64_t num_promoted_blocks = 0;  ///< host tier -> pool
  int64_t num_promoted_bytes = 0;   ///< kv::kv_block::num_bytes of them
  int64_t num_demoted_blocks = 0;   ///< pool -> host tier (read out by a completed step)
  int64_t num_demoted_bytes = 0;
  int64_t num_draft_slots = 0;      ///< speculative decoding: drafts planned (verified if proposed)
  int64_t num_draft_rows = 0;       ///< of them, drafts proposed and verified (a budgeted plan may skip some)
  int64_t num_accepted_drafts = 0;  ///< of those, drafts that stood
  int64_t num_speculative_rows = 0; ///< decode rows that had draft slots
  int64_t num_swap_ins = 0;         ///< readmitted victims of preemption that asked the host tier
  /// Fetch or recompute (engine_core::plan_fetch): placements whose prefix beyond the pool's
  /// was asked of a tier, and those whose fetch was predicted not to pay (recomputed unasked).
  int64_t num_tier_fetches = 0;
  int64_t num_tier_fetches_declined = 0;
  /// Tokens of blocks promoted from the host tier that readmitted victims of preemption took
  /// (not in num_host_hit_tokens, which counts first admissions as num_prefix_hit_tokens does).
  int64_t num_swap_in_tokens = 0;
  int64_t num_blocks_in_use = 0;  ///< KV blocks held by unfinished requests
  /// Steps by their tokens (num_scheduled_tokens' shares): [i] counts those with at most
  /// iteration_token_bounds[i] tokens and more than the bound before; the last, those above all.
  std::vector<int64_t> num_steps_by_tokens = std::vector<int64_t>(iteration_token_bounds.size() + 1, 0);
};

/// What an engine reports when asked (`stats_atom`): its core's counters and the policy's.
struct engine_report : engine_counters {
  int64_t num_executor_failures = 0;
  int64_t num_resumed_requests = 0;  ///< resumed after executor failures (a request once per failure)
  int64_t num_waiting = 0;
  int64_t num_requests = 0;      ///< unfinished requests (waiting or running)
  int64_t executor_busy_ns = 0;  ///< time with at least one step in flight
  int64_t elapsed_ns = 0;        ///< since the engine started
  /// With a time budget and its online correction: the steps measured so far, and the mean
  /// relative error of their predicted times by the cost model alone and corrected
  /// (runtime/cost/step_time_correction.hpp).
  int64_t num_timed_steps = 0;
  double step_time_error_raw = 0;
  double step_time_error_corrected = 0;
  /// The engine's host tier (shared by the engines of its node): blocks its TTLs expired; 0
  /// without a tier, or if the tier did not answer in time.
  int64_t host_tier_expired_blocks = 0;
  /// Blocks the disk tier below the host tier dropped by TTL (asked of the tier with the report).
  int64_t disk_tier_expired_blocks = 0;
  /// Hand-offs (from a prefill engine, or a drained engine's forward) whose KV did not arrive
  /// intact, recomputed here instead.
  int64_t num_handoffs_recomputed = 0;
  /// Hand-offs received with their KV intact and timed (msg::kv_handoff::sent_ns): how many, the
  /// time from their sending to their KV decoded here, summed, and their KV payload bytes.
  int64_t num_handoffs_timed = 0;
  int64_t handoff_ns = 0;
  int64_t handoff_bytes = 0;
  /// An MoE engine reassigning its experts (docs/moe.md): the latest window's moe_lb (0 before
  /// the first), the windows measured and the placements switched to (a switch counts with the
  /// result of the step after it). Executor restarts do not reset them.
  double moe_lb_last_window = 0;
  int64_t num_moe_windows = 0;
  int64_t num_expert_moves = 0;
};

}  // namespace troupe::engine
