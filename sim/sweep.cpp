#include "sim/sweep.hpp"

#include <set>

namespace troupe::sim {

expected<sweep_axis> parse_sweep_axis(const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    return fail(errc::invalid_argument, "--sweep takes KEY=V1,V2,... (e.g. load_balancer.router=least_loaded,"
                                        "round_robin), got '" + spec + "'");
  sweep_axis axis{spec.substr(0, eq), {}};
  std::set<std::string> seen;
  size_t begin = eq + 1;
  while (true) {
    const size_t comma = spec.find(',', begin);
    std::string value = spec.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    if (value.empty()) return fail(errc::invalid_argument, "--sweep " + axis.key + ": an empty value in '" + spec + "'");
    if (value.find_first_of("\"'\\\n") != std::string::npos)
      return fail(errc::invalid_argument, "--sweep " + axis.key + ": quotes, backslashes and newlines are not allowed "
                                          "in values, got '" + value + "'");
    if (!seen.insert(value).second)
      return fail(errc::invalid_argument, "--sweep " + axis.key + ": value '" + value + "' is given twice");
    axis.values.push_back(std::move(value));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return axis;
}

expected<std::vector<std::vector<std::string>>> sweep_grid(const std::vector<sweep_axis>& axes, size_t max_points) {
  std::set<std::string> keys;
  size_t num_points = 1;
  for (const sweep_axis& a : axes) {
    if (!keys.insert(a.key).second) return fail(errc::invalid_argument, "--sweep " + a.key + " is given twice");
    num_points *= a.values.size();
    if (num_points > max_points)
      return fail(errc::invalid_argument, "the sweep has more than " + std::to_string(max_points) + " points");
  }
  std::vector<std::vector<std::string>> grid(1);
  for (const sweep_axis& a : axes) {
    std::vector<std::vector<std::string>> next;
    for (const std::vector<std::string>& prefix : grid)
      for (const std::string& v : a.values) {
        next.push_back(prefix);
        next.back().push_back(v);
      }
    grid = std::move(next);
  }
  return grid;
}

std::string sweep_plot_script(const std::vector<sweep_axis>& axes) {
  // Point p of the grid is (value p / G of the first axis, combination p % G of the others).
  size_t groups = 1;
  for (size_t i = 1; i < axes.size(); i++) groups *= axes[i].values.size();
  std::vector<std::string> titles(groups);
  for (size_t g = 0; g < groups; g++) {
    size_t rest = g;
    for (size_t i = axes.size(); i-- > 1;) {
      const std::string part = axes[i].key + "=" + axes[i].values[rest % axes[i].values.size()];
      titles[g] = titles[g].empty() ? part : part + " " + titles[g];
      rest /= axes[i].values.size();
    }
  }
  const size_t k = axes.size();
  const std::string x = axes.empty() ? "point" : axes[0].key;
  std::string s = "set terminal svg size 2000,450 dynamic\n"
                  "set output 'sweep.svg'\n"
                  "set datafile separator ','\n"
                  "set termoption noenhanced\n"
                  "set multiplot layout 1,4 title 'troupe sim --sweep'\n"
                  "set xlabel '" + x + "'\n"
                  "set key top left\n"
                  "set offsets 0.25, 0.25, 0, 0\n"
                  "G = " + std::to_string(groups) + "\n";
  // Columns (1-based): point, the k keys, then sweep_csv_header's metrics.
  const std::pair<const char*, size_t> panels[] = {
      {"goodput (requests/s)", k + 7}, {"p99 TTFT (ms)", k + 10}, {"p99 TPOT (ms)", k + 13}, {"prefix hit rate", k + 17}};
  for (const auto& [title, column] : panels) {
    s += "set title '" + std::string(title) + "'\nplot";
    for (size_t g = 0; g < groups; g++)
      s += std::string(g ? "," : "") + " 'sweep.csv' skip 1 using (floor($1 / G)):(int($1) % G == " +
           std::to_string(g) + " ? $" + std::to_string(column) + " : 1/0)" + (k ? ":xtic(2)" : "") +
           " with linespoints title '" + (titles[g].empty() ? std::string("all") : titles[g]) + "'";
    s += "\n";
  }
  return s + "unset multiplot\n";
}

}  // namespace troupe::sim
