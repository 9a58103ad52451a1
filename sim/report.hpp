#pragma once

/// Simulation outputs: per-request CSV, summary JSON (latency percentiles, throughput, goodput
/// under SLOs, prefix-hit rate, preemptions, batch-size histogram) and plots made by gnuplot.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/common/stats.hpp"
#include "sim/simulation.hpp"

namespace troupe::sim {

struct slo {
  double ttft_ms = 0;  ///< 0 = no bound
  double tpot_ms = 0;  ///< 0 = no bound
};

/// What summary.json and a sweep's rows report of a run.
struct summary_metrics {
  int64_t num_requests = 0;
  int64_t num_completed = 0;  ///< finished by length or stop
  double seconds = 0;         ///< simulated
  stats::summary ttft_ms, tpot_ms, itl_ms, e2e_ms;  ///< completed requests; TPOT of those with > 1 token
  double request_throughput_per_s = 0;
  double output_token_throughput_per_s = 0;
  double goodput_requests_per_s = 0;  ///< completed within the SLOs
  double prefix_hit_rate = 0;
  /// What an infinite prefix cache could have served, as a share of the prompt tokens (the
  /// blocks of earlier prompts, chained and capped as the engine's prefix cache chains and caps
  /// them; prefix_hit_bounds): counting every request that arrived before, and counting only
  /// those that had finished before the new one arrived (the causal bound: the KV of a request
  /// still running is not whole yet). causal <= arrived; prefix_hit_rate <= arrived, and it may
  /// pass causal where a request hits the prompt of one still decoding.
  double prefix_hit_bound_arrived = 0;
  double prefix_hit_bound_causal = 0;
  int64_t preemptions = 0;
  int64_t recomputed_tokens = 0;
  double preempted_ms = 0;  ///< time lost to preemption (sim_result::preempted_ns)
  int64_t num_steps = 0;
};

[[nodiscard]] summary_metrics summarize(const sim_result& r, const slo& slos);

/// summary_metrics' prefix_hit_bound_arrived and prefix_hit_bound_causal of `r`'s requests:
/// walking them in arrival order, each request's longest prefix of full blocks (block_size
/// tokens, at most (prompt length - 1) / block_size blocks, as kv::block_manager::find_prefix)
/// held by the prompts of the requests that arrived before it, and by those of the requests
/// that finished (finish_ns <= its arrival_ns) before it arrived, over the prompt tokens.
[[nodiscard]] std::pair<double, double> prefix_hit_bounds(const sim_result& r);

/// With [moe]: what summary.json's "moe" object and the text report say of the MoE layers.
struct moe_metrics {
  int64_t num_windows = 0;
  stats::summary moe_lb;           ///< over the windows of every replica
  int64_t num_reassignments = 0;
  double migration_ms = 0;
  double step_share = 0;           ///< MoE time (compute and communication) / the steps' time
  double communication_share = 0;  ///< dispatch and combine / the steps' time
};

/// The MoE figures of a run with [moe]; nullopt without.
[[nodiscard]] std::optional<moe_metrics> summarize_moe(const sim_result& r);

/// One line for the text report: "moe: N windows, moe_lb mean M p99 P, ..." ("" without [moe]).
[[nodiscard]] std::string moe_report_line(const sim_result& r);

/// The summary as JSON text (fixed key order, fixed number format: byte-identical for identical
/// results).
[[nodiscard]] std::string summary_json(const sim_result& r, const slo& slos, uint64_t seed);

/// sweep.csv (`troupe sim --sweep`): the header for the swept `keys`, and one point's row (its
/// index, its value of each key, then summary_metrics and the event-log hash; numbers as in
/// summary.json, so identical runs give identical bytes).
[[nodiscard]] std::string sweep_csv_header(const std::vector<std::string>& keys);
[[nodiscard]] std::string sweep_csv_row(size_t point, const std::vector<std::string>& values, const sim_result& r,
                                        const slo& slos);

/// Writes DIR/requests.csv, DIR/summary.json, DIR/timeseries.csv (with samples: one row per
/// replica and interval) and, if gnuplot is installed, DIR/latency_cdf.svg, DIR/throughput.svg
/// and DIR/timeseries.svg (their data files and script stay beside them).
[[nodiscard]] expected<void> write_report(const std::string& dir, const sim_result& r, const slo& slos, uint64_t seed);

/// A CDF as gnuplot data: each value (sorted ascending) and the fraction of values up to it.
[[nodiscard]] std::string cdf_data(std::vector<double> values);

/// Writes each (file name, text) into `dir` (created if missing); then, if gnuplot is
/// installed, runs it in `dir` on `script`, one of those files.
[[nodiscard]] expected<void> write_plot_files(const std::string& dir,
                                              const std::vector<std::pair<std::string, std::string>>& files,
                                              const std::string& script);

}  // namespace troupe::sim
