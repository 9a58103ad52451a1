#pragma once

/// Control protocol: what an engine reports when asked (`stats_atom`). The struct is runtime
/// data (runtime/engine/engine_report.hpp); this is its wire mapping, found by
/// argument-dependent lookup in its namespace.

#include "runtime/engine/engine_report.hpp"

namespace troupe::engine {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_report& x) {
  return f(x.num_steps, x.num_generated_tokens, x.num_scheduled_tokens, x.num_discarded_tokens, x.num_preemptions,
           x.num_prefix_hit_tokens, x.num_recomputed_tokens, x.preempted_ns, x.num_host_hit_tokens,
           x.num_disk_hit_tokens, x.num_promoted_blocks, x.num_promoted_bytes, x.num_demoted_blocks,
           x.num_demoted_bytes, x.num_draft_slots, x.num_draft_rows, x.num_accepted_drafts, x.num_speculative_rows,
           x.num_swap_ins, x.num_tier_fetches, x.num_tier_fetches_declined, x.num_swap_in_tokens, x.num_blocks_in_use, x.num_executor_failures,
           x.num_resumed_requests, x.num_waiting, x.num_requests, x.executor_busy_ns, x.elapsed_ns,
           x.num_timed_steps, x.step_time_error_raw, x.step_time_error_corrected, x.host_tier_expired_blocks,
           x.disk_tier_expired_blocks, x.num_handoffs_recomputed, x.moe_lb_last_window, x.num_moe_windows,
           x.num_expert_moves, x.num_prefix_query_tokens, x.num_steps_by_tokens, x.num_handoffs_timed, x.handoff_ns,
           x.handoff_bytes);
}

}  // namespace troupe::engine

namespace troupe::msg {

using engine_report = engine::engine_report;

}  // namespace troupe::msg
