#pragma once

/// The scheduler's limits per step. Engine configurations hold it without the scheduler.

#include <cstdint>

#include "runtime/cost/cost_model.hpp"
#include "runtime/sched/policy.hpp"

namespace troupe::sched {

/// The largest scheduler_config::prefix_cache_slack_tokens a configuration may ask for.
inline constexpr int32_t prefix_cache_slack_tokens_max = 1 << 20;

struct scheduler_config {
  int32_t max_num_batched_tokens = 512;  ///< token budget of one step (prefill + decode)
  int32_t max_num_seqs = 256;            ///< running sequences at most
  /// Predicted time of one step at most, in milliseconds (0 = no time budget: tokens only).
  /// With it, prefill chunks are cut to the largest that keeps the step's predicted time —
  /// its decode rows plus its chunks, priced by `step_cost` — within the budget, and still
  /// within max_num_batched_tokens. Decode rows are never cut, and a step with no other chunk
  /// gets at least one prefill token, so a budget below one step's fixed cost slows prefill
  /// down but never stops it.
  double step_time_budget_ms = 0;
  cost::cost_params step_cost;  ///< the step-time model the budget is priced with
  /// With a time budget: the engine corrects `step_cost` online by the running median of the
  /// last this-many measured / predicted step times per step shape
  /// (cost/step_time_correction.hpp); 0 = off, the model alone prices the budget.
  int32_t step_time_correction_window = 64;
  /// Share of the KV pool that admission keeps free for the running sequences' growth (0 =
  /// off: a waiting sequence is admitted as soon as its first chunk's blocks are free). With
  /// it, while anything runs, a sequence is admitted only if the free blocks cover its whole
  /// prompt, what the running sequences still need to finish theirs, and this share of the
  /// pool: a long prompt is not admitted just to be preempted when those ahead of it grow.
  /// With a time budget as well, the free blocks must also cover the running decoders' growth
  /// over the steps the prompt's prefill is predicted to take (the predicted-time check).
  double kv_watermark = 0;
  policy_options policy;  ///< the order sequences are served in (policy.hpp)
  /// Trailing tokens of a prompt always computed, never served from the prefix cache (the hit
  /// rule's speculative slack, runtime/kv/hit_rule.hpp; the models here are full-attention, so
  /// its window is 0). The last token is computed whatever the slack: 0 = the longest cached
  /// prefix of whole blocks that leaves it.
  int32_t prefix_cache_slack_tokens = 0;
};

}  // namespace troupe::sched
