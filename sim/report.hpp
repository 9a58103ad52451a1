#pragma once

/// Simulation outputs: per-request CSV, summary JSON (latency percentiles, throughput, goodput
/// under SLOs, prefix-hit rate, preemptions, batch-size histogram) and plots made by gnuplot.

#include <string>

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

}  // namespace troupe::sim
