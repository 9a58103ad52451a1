#pragma once

/// Serving metrics in the Prometheus text exposition format (version 0.0.4): vLLM's v1 engine
/// metrics (0.10) under their own names, types, buckets and labels, and troupe's own under
/// `troupe:` (docs/http.md lists both, and why not prometheus-cpp). Pure: the gateway records
/// each finished request and, at scrape time, the engines' counters; `render_metrics` is a
/// function of those values only, tested byte for byte (tests/openai_test.cpp) and by `promtool
/// check metrics` (tests/http_test.cpp).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/engine/engine_report.hpp"
#include "runtime/serve/completion.hpp"

namespace troupe::openai {

/// A cumulative histogram: `bucket_counts[i]` counts observations <= upper_bounds[i] and above
/// the bound before it; the last bucket (+Inf) counts the rest.
struct histogram {
  explicit histogram(std::vector<double> upper_bounds);  ///< strictly increasing
  void observe(double value);

  std::vector<double> upper_bounds;
  std::vector<int64_t> bucket_counts;  ///< upper_bounds.size() + 1, not cumulative
  double sum = 0.0;
  int64_t count = 0;
};

/// What the gateway counts over the requests it answered to the end (finished, not failed).
/// The token histograms' buckets are vLLM's 1-2-5 series up to the context (`max_model_len`).
struct request_metrics {
  explicit request_metrics(int32_t max_model_len = 0);
  /// Adds one choice: its TTFT, each gap between tokens, its latencies from arrival to the
  /// first scheduled step (queue), to the first token (prefill ends) and to the end, and its
  /// tokens. `max_tokens` is what the request asked for: serve::max_tokens_to_context counts as
  /// what the context left after the prompt (unknown, and not counted, without max_model_len).
  void record(const serve::completion_end& end, int32_t max_tokens);
  /// Adds one prompt's choices, all finished: its `n` and their most generated tokens.
  void record_parallel(int32_t n, int32_t max_num_generated_tokens);

  int32_t max_model_len = 0;
  histogram ttft_seconds;
  histogram time_per_output_token_seconds;  ///< every gap between tokens (vLLM 0.10's meaning)
  histogram e2e_latency_seconds;
  histogram queue_time_seconds;       ///< arrival to the first scheduled step
  histogram inference_time_seconds;   ///< the first scheduled step to the end
  histogram prefill_time_seconds;     ///< the first scheduled step to the first token
  histogram decode_time_seconds;      ///< the first token to the end
  histogram time_per_prefill_token_seconds;  ///< prefill time / prompt tokens
  histogram prompt_tokens;
  histogram generation_tokens;
  histogram params_max_tokens;
  histogram params_n;
  histogram max_num_generation_tokens;  ///< per prompt, the most tokens one of its n choices generated
  int64_t num_prompt_tokens = 0;
  int64_t num_generation_tokens = 0;
  int64_t num_failovers = 0;  ///< times an answered request was placed again after losing its engine
  std::map<std::string, int64_t> num_success_by_reason;  ///< "stop", "length", ...
  int64_t num_in_flight = 0;  ///< completions the gateway is serving now (set when scraped)
};

/// The local engines' KV cache as configured (vLLM's cache_config_info).
struct cache_config {
  int64_t num_blocks = 0;  ///< the engines' pools together
  int32_t block_size = 0;  ///< tokens per block
};

/// The engines of this node, summed when /metrics is scraped.
struct engine_gauges {
  cache_config cache;
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_kv_blocks_in_use = 0;
  int64_t num_preemptions = 0;
  int64_t num_prefix_query_tokens = 0;  ///< prompt tokens looked up in the prefix cache
  int64_t num_prefix_hit_tokens = 0;    ///< of them, those found
  int64_t num_steps = 0;
  int64_t num_scheduled_tokens = 0;
  std::vector<int64_t> num_steps_by_tokens = std::vector<int64_t>(engine::iteration_token_bounds.size() + 1, 0);
  /// Speculative decoding: decode rows that had draft slots, the draft tokens planned in
  /// them and, of those, the tokens that stood.
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  /// KV cache tiers (docs/kv-tiers.md): prompt tokens served from the pool, from blocks the
  /// host tier promoted out of its memory and out of the disk tier below it, and bytes moved
  /// pool -> host (demoted) and host -> pool (promoted).
  int64_t num_pool_hit_tokens = 0;
  int64_t num_host_hit_tokens = 0;
  int64_t num_disk_hit_tokens = 0;
  int64_t num_demoted_bytes = 0;
  int64_t num_promoted_bytes = 0;
  /// Blocks the host tier's TTLs expired. The engines of a node share its tier and each reports
  /// the tier's count, so this is the largest report, not a sum: exact for one node's engines.
  int64_t num_host_expired_blocks = 0;
  int64_t num_disk_expired_blocks = 0;  ///< the same for the disk tier below the host tier
  int64_t num_swap_in_tokens = 0;       ///< tokens readmitted victims of preemption took from the host tier
  int64_t num_tier_fetches = 0;          ///< placements that asked a tier (fetch or recompute)
  int64_t num_tier_fetches_declined = 0; ///< placements whose fetch was predicted not to pay
  /// MoE engines reassigning their experts (docs/moe.md): the largest of their latest windows'
  /// moe_lb (the most imbalanced engine), and the windows and moves summed.
  double moe_lb = 0;
  int64_t num_moe_windows = 0;
  int64_t num_expert_moves = 0;
  /// KV hand-offs received intact and timed (engine_report::num_handoffs_timed), their summed
  /// time from sending to decoding, and their bytes.
  int64_t num_handoffs = 0;
  int64_t handoff_ns = 0;
  int64_t handoff_bytes = 0;
};

/// Sums `reports` of engines configured as `cache`.
[[nodiscard]] engine_gauges sum_reports(const std::vector<engine::engine_report>& reports, const cache_config& cache);

/// The whole /metrics page: vLLM's families (`vllm:`, labelled model_name="<model_name>" and
/// engine="0": a node answers as one engine) and troupe's own (`troupe:`, labelled model_name).
[[nodiscard]] std::string render_metrics(const request_metrics& requests, const engine_gauges& engines,
                                         const std::string& model_name);

}  // namespace troupe::openai
