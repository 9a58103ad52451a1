// balance::prefix_directory: longest held prefix per engine, least-recently-used eviction with a
// prompt's tail before its prefix, capacity bounds and forgetting a lost engine — exact sets.
#include "runtime/balance/prefix_directory.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace troupe::balance {
namespace {

using chain = std::vector<uint64_t>;

TEST(PrefixDirectory, TheLongestPrefixEndsAtTheFirstBlockAnEngineDoesNotHold) {
  prefix_directory d({10, 10});
  d.record(0, {1, 2, 3});
  d.check_invariants();
  EXPECT_EQ(d.cached_blocks(0, {1, 2, 3, 4}), 3);
  EXPECT_EQ(d.cached_blocks(0, {1, 2, 9}), 2);
  EXPECT_EQ(d.cached_blocks(0, {9, 1, 2}), 0);  // a chain hash names its whole prefix: 1 after 9 is no hit
  EXPECT_EQ(d.cached_blocks(0, {}), 0);
  EXPECT_EQ(d.cached_blocks(1, {1, 2, 3}), 0);
  EXPECT_EQ(d.blocks_by_recency(0), (chain{1, 2, 3}));  // touched tail first: the prefix is newest
  EXPECT_EQ(d.num_blocks(1), 0);
}

TEST(PrefixDirectory, EvictsTheLeastRecentlyUsedBlocksAPromptsTailFirst) {
  prefix_directory d({4});
  d.record(0, {1, 2, 3});
  d.record(0, {1, 5, 6});  // 1 5 6 2 3: one over, 3 goes
  d.check_invariants();
  EXPECT_EQ(d.blocks_by_recency(0), (chain{1, 5, 6, 2}));
  EXPECT_EQ(d.cached_blocks(0, {1, 2, 3}), 2);
  EXPECT_EQ(d.cached_blocks(0, {1, 5, 6}), 3);
  d.record(0, {7, 8});  // 7 8 1 5 6 2: 2 and 6 go
  d.check_invariants();
  EXPECT_EQ(d.blocks_by_recency(0), (chain{7, 8, 1, 5}));
  EXPECT_EQ(d.cached_blocks(0, {1, 2}), 1);
  EXPECT_EQ(d.cached_blocks(0, {1, 5, 6}), 2);
  d.record(0, {1, 2, 3, 4, 10, 11});  // longer than the capacity: only its first four stay
  d.check_invariants();
  EXPECT_EQ(d.blocks_by_recency(0), (chain{1, 2, 3, 4}));
}

TEST(PrefixDirectory, AnEngineWithoutCapacityHoldsNothingAndALostOneForgetsAll) {
  prefix_directory d({0, 8});
  d.record(0, {1, 2});
  d.record(1, {1, 2});
  d.check_invariants();
  EXPECT_EQ(d.num_blocks(0), 0);
  EXPECT_EQ(d.cached_blocks(0, {1, 2}), 0);
  EXPECT_EQ(d.cached_blocks(1, {1, 2}), 2);
  d.forget(1);
  d.check_invariants();
  EXPECT_EQ(d.num_blocks(1), 0);
  EXPECT_EQ(d.cached_blocks(1, {1}), 0);
  d.record(1, {3});  // forgetting is not losing the capacity
  EXPECT_EQ(d.blocks_by_recency(1), (chain{3}));
  EXPECT_EQ(d.num_engines(), 2u);
}

}  // namespace
}  // namespace troupe::balance
