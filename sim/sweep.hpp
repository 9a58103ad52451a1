#pragma once

/// Parameter sweeps (`troupe sim --sweep KEY=V1,V2,...`): the grid of points, and the plots of
/// sweep.csv. Running the points (in parallel processes) is the command's (apps/troupe).

#include <string>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe::sim {

struct sweep_axis {
  std::string key;                  ///< a topology key TABLE.KEY, or a workload option
  std::vector<std::string> values;  ///< in the order given, distinct, non-empty
};

/// Reads `KEY=V1,V2,...`; errors (invalid_argument) say what is wrong with the text.
[[nodiscard]] expected<sweep_axis> parse_sweep_axis(const std::string& spec);

/// Every combination of the axes' values, the first axis varying slowest; one point (no values)
/// for no axes. Errors: a key swept twice, or more than `max_points` points.
[[nodiscard]] expected<std::vector<std::vector<std::string>>> sweep_grid(const std::vector<sweep_axis>& axes,
                                                                       size_t max_points);

/// A gnuplot script making sweep.svg from sweep.csv (sweep_csv_header's columns): goodput, p99
/// TTFT, p99 TPOT and the prefix hit rate against the first axis's values, one line per
/// combination of the others.
[[nodiscard]] std::string sweep_plot_script(const std::vector<sweep_axis>& axes);

}  // namespace troupe::sim
