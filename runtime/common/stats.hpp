#pragma once

/// Summary statistics of latency samples with numpy's definitions, which are what vLLM's
/// `bench serve` reports: the one definition shared by `troupe bench serve`, the simulator's
/// summary and the benchmarks, so a simulated p99 and a measured one mean the same thing.

#include <vector>

namespace troupe::stats {

/// The p-th percentile (0 <= p <= 100) of `sorted` (ascending, non-empty), numpy's default
/// ("linear", Hyndman-Fan type 7): the rank h = (p / 100) (n - 1) between v[floor h] and
/// v[floor h + 1], interpolated as numpy's `_lerp` does (from below for a fraction < 0.5, from
/// above otherwise), so the result is numpy's bit for bit.
[[nodiscard]] double percentile_of_sorted(const std::vector<double>& sorted, double p);

/// percentile_of_sorted of a sorted copy of `values`; 0 for no values (vLLM's `np.percentile(x or 0)`).
[[nodiscard]] double percentile(std::vector<double> values, double p);

/// mean, median, population standard deviation (numpy's `std`, ddof 0), p90, p99.
struct summary {
  double mean = 0;
  double median = 0;
  double std = 0;
  double p90 = 0;
  double p99 = 0;
};

/// The summary of `values`; all zeros for no values (vLLM summarizes `x or 0`, i.e. [0]).
[[nodiscard]] summary summarize(std::vector<double> values);

}  // namespace troupe::stats
