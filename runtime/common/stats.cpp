#include "runtime/common/stats.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/common/error.hpp"

namespace troupe::stats {

double percentile_of_sorted(const std::vector<double>& sorted, double p) {
  TROUPE_ASSERT(!sorted.empty());
  TROUPE_ASSERT(p >= 0 && p <= 100);
  const double h = p / 100 * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(h));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double a = sorted[below], b = sorted[above], t = h - static_cast<double>(below);
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1 - t) : a + diff * t;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return percentile_of_sorted(values, p);
}

summary summarize(std::vector<double> values) {
  summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  const double n = static_cast<double>(values.size());
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / n;
  double squares = 0;
  for (double v : values) squares += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(squares / n);
  s.median = percentile_of_sorted(values, 50);
  s.p90 = percentile_of_sorted(values, 90);
  s.p99 = percentile_of_sorted(values, 99);
  return s;
}

}  // namespace troupe::stats
