#pragma once

/// Simulation outputs: per-request CSV, summary JSON (latency percentiles, throughput, goodput
/// under SLOs, prefix-hit rate, preemptions, batch-size histogram) and plots made by gnuplot.

#include <string>
#include <utility>
#include <vector>

#include "runtime/common/error.hpp"
#include "sim/simulation.hpp"

namespace troupe::sim {

struct slo {
  double ttft_ms = 0;  ///< 0 = no bound
  double tpot_ms = 0;  ///< 0 = no bound
};

/// The summary as JSON text (fixed key order, fixed number format: byte-identical for identical
/// results).
[[nodiscard]] std::string summary_json(const sim_result& r, const slo& slos, uint64_t seed);

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
