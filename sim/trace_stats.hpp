#pragma once

/// What a trace holds, for `troupe trace stats`: its request rate over time, the percentiles of
/// its prompt and output lengths, and (Mooncake) the bound its hash ids put on prefix reuse.
/// Pure: the same trace gives the same numbers and text on every machine.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/trace.hpp"
#include "sim/workload.hpp"

namespace troupe::sim {

/// A length distribution: numpy's percentiles (runtime/common/stats.hpp).
struct length_stats {
  double min = 0, mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

struct trace_stats {
  trace_format format = trace_format::azure;
  int64_t num_requests = 0;
  int64_t num_skipped = 0;                  ///< failed rows the reader skipped (BurstGPT)
  bool timed = true;                        ///< false: a length-only dataset, no arrivals
  int64_t duration_ns = 0;                  ///< last arrival - first
  int64_t bucket_ns = 0;                    ///< width of each rate bucket
  std::vector<int64_t> arrivals_per_bucket; ///< requests arriving in [i, i + 1) * bucket_ns
  length_stats input, output;
  std::optional<prefix_reuse> reuse;        ///< when any request has hash ids
};

/// The statistics of `file`. `bucket_ns` > 0 sets the rate buckets' width; 0 picks about 20
/// buckets: duration / 20 rounded up to a whole second (1 s at least).
[[nodiscard]] trace_stats compute_trace_stats(const trace_file& file, int64_t bucket_ns);

/// The statistics as the text `troupe trace stats` prints; `name` heads it.
[[nodiscard]] std::string format_trace_stats(const trace_stats& stats, const std::string& name);

}  // namespace troupe::sim
