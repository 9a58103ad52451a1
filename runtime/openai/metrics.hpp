#pragma once

/// Serving metrics in the Prometheus text exposition format (version 0.0.4), written here
/// because Debian 12 packages no prometheus-cpp. Names and meanings follow vLLM's `vllm:`
/// metrics under a `troupe:` prefix (docs/http.md lists them). Pure: the gateway records each
/// finished request and, at scrape time, the engines' counters; `render_metrics` is a function
/// of those values only, tested byte for byte (tests/openai_test.cpp) and by `promtool check
/// metrics` (tests/http_test.cpp).

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
struct request_metrics {
  request_metrics();
  /// Adds one request: its TTFT, each gap between tokens, its end-to-end latency and tokens.
  void record(const serve::completion_end& end);

  histogram ttft_seconds;
  histogram inter_token_latency_seconds;
  histogram e2e_latency_seconds;
  int64_t num_prompt_tokens = 0;
  int64_t num_generation_tokens = 0;
  int64_t num_prefix_cache_hit_tokens = 0;
  int64_t num_failovers = 0;  ///< times an answered request was placed again after losing its engine
  std::map<std::string, int64_t> num_success_by_reason;  ///< "stop", "length", ...
  int64_t num_in_flight = 0;  ///< completions the gateway is serving now (set when scraped)
};

/// The engines of this node, summed when /metrics is scraped.
struct engine_gauges {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_kv_blocks_in_use = 0;
  int64_t num_kv_blocks_total = 0;
  int64_t num_preemptions = 0;
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
  /// MoE engines reassigning their experts (docs/moe.md): the largest of their latest windows'
  /// moe_lb (the most imbalanced engine), and the windows and moves summed.
  double moe_lb = 0;
  int64_t num_moe_windows = 0;
  int64_t num_expert_moves = 0;
};

/// Sums `reports`; `num_kv_blocks_total` is the engines' configured pool size.
[[nodiscard]] engine_gauges sum_reports(const std::vector<engine::engine_report>& reports, int64_t num_kv_blocks_total);

/// The whole /metrics page; every sample carries the label model_name="<model_name>".
[[nodiscard]] std::string render_metrics(const request_metrics& requests, const engine_gauges& engines,
                                         const std::string& model_name);

}  // namespace troupe::openai
