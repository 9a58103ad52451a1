// The one percentile definition (numpy's "linear"), shared by the simulator's summary,
// `troupe bench serve` and the benchmarks: exact values on dyadic ranks.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/common/stats.hpp"

namespace troupe::stats {
namespace {

TEST(Percentile, InterpolatesBetweenClosestRanksFromBelowAndAbove) {
  const std::vector<double> v{0, 4, 8, 16, 32};  // ranks 0..4: p = 25 h
  EXPECT_EQ(percentile_of_sorted(v, 0), 0.0);
  EXPECT_EQ(percentile_of_sorted(v, 100), 32.0);
  EXPECT_EQ(percentile_of_sorted(v, 50), 8.0);        // h = 2
  EXPECT_EQ(percentile_of_sorted(v, 31.25), 5.0);     // h = 1.25: 4 + 4 * 0.25
  EXPECT_EQ(percentile_of_sorted(v, 62.5), 12.0);     // h = 2.5: 16 - 8 * 0.5
  EXPECT_EQ(percentile_of_sorted(v, 93.75), 28.0);    // h = 3.75: 32 - 16 * 0.25
}

TEST(Percentile, OfUnsortedValuesSortsAndOfNoneIsZero) {
  EXPECT_EQ(percentile({32, 0, 16, 8, 4}, 62.5), 12.0);
  EXPECT_EQ(percentile({}, 99), 0.0);
  EXPECT_EQ(percentile({7}, 99), 7.0);
}

TEST(Percentile, DiffersFromNearestRank) {
  // 1..100: nearest rank gives p99 = 99 and p50 = 50; numpy's linear gives 99.01 and 50.5.
  std::vector<double> v;
  for (int i = 1; i <= 100; i++) v.push_back(i);
  EXPECT_EQ(percentile_of_sorted(v, 50), 50.5);
  EXPECT_DOUBLE_EQ(percentile_of_sorted(v, 99), 99.01);
}

TEST(Summarize, MeanMedianPopulationStdAndTailPercentiles) {
  const summary s = summarize({2, 4, 4, 4, 5, 5, 7, 9});  // the textbook set: mean 5, std 2
  EXPECT_EQ(s.mean, 5.0);
  EXPECT_EQ(s.std, 2.0);
  EXPECT_EQ(s.median, 4.5);
  EXPECT_DOUBLE_EQ(s.p90, 7.6);   // h = 6.3: 7 + 2 * 0.3
  EXPECT_DOUBLE_EQ(s.p99, 8.86);  // h = 6.93: 9 - 2 * 0.07
  const summary none = summarize({});
  EXPECT_EQ(none.mean, 0.0);
  EXPECT_EQ(none.p99, 0.0);
}

}  // namespace
}  // namespace troupe::stats
