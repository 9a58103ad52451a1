// balance::prefix_directory: longest held prefix per engine, least-recently-used eviction with a
// prompt's tail before its prefix, capacity bounds and forgetting a lost engine; the pools'
// reports applied (snapshots, changes, gaps and resynchronisation) and placed prompts covered
// by them — exact sets.
#include "runtime/balance/prefix_directory.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace troupe::balance {
namespace {

using chain = std::vector<uint64_t>;

TEST(PrefixDirectory, TheLongestPrefixEndsAtTheFirstBlockAnEngineDoesNotHold) {
  prefix_directory d({10, 10});
  d.record(0, {1, 2, 3}, 0);
  d.check_invariants();
  EXPECT_EQ(d.cached_blocks(0, {1, 2, 3, 4}), 3);
  EXPECT_EQ(d.cached_blocks(0, {1, 2, 9}), 2);
  EXPECT_EQ(d.cached_blocks(0, {9, 1, 2}), 0);  // a chain hash names its whole prefix: 1 after 9 is no hit
  EXPECT_EQ(d.cached_blocks(0, {}), 0);
  EXPECT_EQ(d.cached_blocks(1, {1, 2, 3}), 0);
  EXPECT_EQ(d.blocks_by_recency(0), (chain{1, 2, 3}));  // touched tail first: the prefix is newest
  EXPECT_EQ(d.num_placed_blocks(1), 0);
}

TEST(PrefixDirectory, EvictsTheLeastRecentlyUsedBlocksAPromptsTailFirst) {
  prefix_directory d({4});
  d.record(0, {1, 2, 3}, 0);
  d.record(0, {1, 5, 6}, 0);  // 1 5 6 2 3: one over, 3 goes
  d.check_invariants();
  EXPECT_EQ(d.blocks_by_recency(0), (chain{1, 5, 6, 2}));
  EXPECT_EQ(d.cached_blocks(0, {1, 2, 3}), 2);
  EXPECT_EQ(d.cached_blocks(0, {1, 5, 6}), 3);
  d.record(0, {7, 8}, 0);  // 7 8 1 5 6 2: 2 and 6 go
  d.check_invariants();
  EXPECT_EQ(d.blocks_by_recency(0), (chain{7, 8, 1, 5}));
  EXPECT_EQ(d.cached_blocks(0, {1, 2}), 1);
  EXPECT_EQ(d.cached_blocks(0, {1, 5, 6}), 2);
  d.record(0, {1, 2, 3, 4, 10, 11}, 0);  // longer than the capacity: only its first four stay
  d.check_invariants();
  EXPECT_EQ(d.blocks_by_recency(0), (chain{1, 2, 3, 4}));
}

TEST(PrefixDirectory, AnEngineWithoutCapacityHoldsNothingAndALostOneForgetsAll) {
  prefix_directory d({0, 8});
  d.record(0, {1, 2}, 0);
  d.record(1, {1, 2}, 0);
  d.check_invariants();
  EXPECT_EQ(d.num_placed_blocks(0), 0);
  EXPECT_EQ(d.cached_blocks(0, {1, 2}), 0);
  EXPECT_EQ(d.cached_blocks(1, {1, 2}), 2);
  d.forget(1);
  d.check_invariants();
  EXPECT_EQ(d.num_placed_blocks(1), 0);
  EXPECT_EQ(d.cached_blocks(1, {1}), 0);
  d.record(1, {3}, 0);  // forgetting is not losing the capacity
  EXPECT_EQ(d.blocks_by_recency(1), (chain{3}));
  EXPECT_EQ(d.num_engines(), 2u);
}

TEST(PrefixDirectory, APoolsReportsAreItsSetAndCoverThePromptsPlacedBefore) {
  prefix_directory d({8, 8});
  d.record(0, {1, 2, 3}, 1);
  d.record(0, {7}, 2);
  EXPECT_EQ(d.cached_blocks(0, {1, 2, 3}), 3);
  // Not in sync yet: a report covers nothing.
  d.covered(0, 2);
  EXPECT_EQ(d.num_placed_blocks(0), 4);
  // The pool's snapshot: it computed 1 2 (3 was never cached there); it has received item 1.
  EXPECT_EQ(d.apply(0, pool_events{1, true, {1, 2}, {}}), pool_sync::in_sync);
  d.covered(0, 1);
  d.check_invariants();
  EXPECT_TRUE(d.in_sync(0));
  EXPECT_EQ(d.blocks_by_recency(0), (chain{7}));  // item 2 not covered yet: it still counts
  EXPECT_EQ(d.cached_blocks(0, {1, 2, 3}), 2);
  EXPECT_EQ(d.cached_blocks(0, {7}), 1);
  // The next report: 1 evicted, 7 and 8 cached; item 2 covered.
  EXPECT_EQ(d.apply(0, pool_events{2, false, {7, 8}, {1}}), pool_sync::in_sync);
  d.covered(0, 2);
  d.check_invariants();
  EXPECT_EQ(d.num_placed_blocks(0), 0);
  EXPECT_EQ(d.num_pool_blocks(0), 3);
  EXPECT_EQ(d.cached_blocks(0, {1, 2}), 0);  // the pool evicted the prefix: no credit
  EXPECT_EQ(d.cached_blocks(0, {7, 8}), 2);
  EXPECT_EQ(d.cached_blocks(1, {7, 8}), 0);
}

TEST(PrefixDirectory, AGapOrAChangeThatDoesNotFitDropsThePoolsSetUntilASnapshotComes) {
  prefix_directory d({4});
  ASSERT_EQ(d.apply(0, pool_events{1, true, {1, 2}, {}}), pool_sync::in_sync);
  // Report 3 after 1: report 2 went missing. Asked for a snapshot once; later changes wait.
  EXPECT_EQ(d.apply(0, pool_events{3, false, {5}, {}}), pool_sync::ask_snapshot);
  d.check_invariants();
  EXPECT_FALSE(d.in_sync(0));
  EXPECT_EQ(d.num_pool_blocks(0), 0);
  EXPECT_EQ(d.cached_blocks(0, {1}), 0);
  EXPECT_EQ(d.apply(0, pool_events{4, false, {6}, {}}), pool_sync::awaiting_snapshot);
  EXPECT_EQ(d.apply(0, pool_events{5, true, {1, 5, 6}, {}}), pool_sync::in_sync);
  EXPECT_EQ(d.cached_blocks(0, {1}), 1);
  // Changes that do not fit what the directory holds: removing an absent hash, adding a held one,
  // outgrowing the capacity; a snapshot that repeats a hash.
  for (const pool_events& bad : {pool_events{6, false, {}, {9}}, pool_events{6, false, {5}, {}},
                                 pool_events{6, false, {7, 8}, {}}}) {
    ASSERT_EQ(d.apply(0, pool_events{5, true, {1, 5, 6}, {}}), pool_sync::in_sync);
    EXPECT_EQ(d.apply(0, bad), pool_sync::ask_snapshot);
    EXPECT_EQ(d.num_pool_blocks(0), 0);
    d.check_invariants();
  }
  EXPECT_EQ(d.apply(0, pool_events{7, true, {1, 1}, {}}), pool_sync::awaiting_snapshot);
  EXPECT_FALSE(d.in_sync(0));
  // A lost engine forgets its pool too; its next snapshot starts it over.
  ASSERT_EQ(d.apply(0, pool_events{8, true, {1}, {}}), pool_sync::in_sync);
  d.forget(0);
  d.check_invariants();
  EXPECT_FALSE(d.in_sync(0));
  EXPECT_EQ(d.cached_blocks(0, {1}), 0);
  EXPECT_EQ(d.apply(0, pool_events{1, true, {2}, {}}), pool_sync::in_sync);
  EXPECT_EQ(d.cached_blocks(0, {2}), 1);
}

TEST(PrefixDirectory, ACacheTiersReportsAreItsSetByTheSameRulesAndNothingIsPlacedOnIt) {
  prefix_directory d({4}, {3, 0});
  EXPECT_EQ(d.num_tiers(), 2u);
  EXPECT_EQ(d.tier_cached_blocks(0, {1, 2}), 0);  // no report yet
  ASSERT_EQ(d.apply_tier(0, pool_events{1, true, {1, 2}, {}}), pool_sync::in_sync);
  ASSERT_EQ(d.apply_tier(0, pool_events{2, false, {3}, {2}}), pool_sync::in_sync);
  d.check_invariants();
  EXPECT_EQ(d.tier_cached_blocks(0, {1, 3}), 2);
  EXPECT_EQ(d.tier_cached_blocks(0, {1, 2}), 1);
  EXPECT_EQ(d.cached_blocks(0, {1, 3}), 0);  // the engine's set is its own
  EXPECT_EQ(d.num_tier_blocks(0), 2);
  // A gap, then a snapshot; a tier over its capacity; a lost tier.
  EXPECT_EQ(d.apply_tier(0, pool_events{4, false, {5}, {}}), pool_sync::ask_snapshot);
  EXPECT_FALSE(d.tier_in_sync(0));
  EXPECT_EQ(d.tier_cached_blocks(0, {1}), 0);
  EXPECT_EQ(d.apply_tier(0, pool_events{5, false, {6}, {}}), pool_sync::awaiting_snapshot);
  EXPECT_EQ(d.apply_tier(0, pool_events{6, true, {1, 2, 3}, {}}), pool_sync::in_sync);
  EXPECT_EQ(d.apply_tier(0, pool_events{7, false, {4}, {}}), pool_sync::ask_snapshot);
  EXPECT_EQ(d.apply_tier(1, pool_events{1, false, {}, {}}), pool_sync::ask_snapshot);  // a change before any snapshot
  ASSERT_EQ(d.apply_tier(0, pool_events{8, true, {1}, {}}), pool_sync::in_sync);
  d.forget_tier(0);
  d.check_invariants();
  EXPECT_EQ(d.tier_cached_blocks(0, {1}), 0);
  EXPECT_FALSE(d.tier_in_sync(0));
}

TEST(PrefixDirectory, ATiersPrefixRunsThroughItsHostAndLowerLevelsTogether) {
  prefix_directory d({4}, {2}, {8});
  EXPECT_EQ(d.tier_capacity_blocks(0, true), 8);
  // Blocks 1 and 3 in host memory, 2 and 4 on disk: a fetch reads through, so the prefix is 4.
  ASSERT_EQ(d.apply_tier(0, pool_events{1, true, {1, 3}, {}}), pool_sync::in_sync);
  ASSERT_EQ(d.apply_tier(0, pool_events{1, true, {2, 4}, {}}, /*lower=*/true), pool_sync::in_sync);
  d.check_invariants();
  EXPECT_EQ(d.tier_cached_blocks(0, {1, 2, 3, 4, 5}), 4);
  EXPECT_EQ(d.num_tier_blocks(0), 2);
  EXPECT_EQ(d.num_tier_blocks(0, true), 2);
  // Each level is numbered and resynchronised apart: a gap in the disk's drops only the disk's.
  EXPECT_EQ(d.apply_tier(0, pool_events{3, false, {5}, {}}, true), pool_sync::ask_snapshot);
  EXPECT_TRUE(d.tier_in_sync(0));
  EXPECT_FALSE(d.tier_in_sync(0, true));
  EXPECT_EQ(d.tier_cached_blocks(0, {1, 2, 3}), 1);
  ASSERT_EQ(d.apply_tier(0, pool_events{2, false, {2}, {1}}), pool_sync::in_sync);
  EXPECT_EQ(d.tier_cached_blocks(0, {1, 2, 3}), 0);
  d.forget_tier(0);
  d.check_invariants();
  EXPECT_EQ(d.num_tier_blocks(0), 0);
  EXPECT_EQ(d.num_tier_blocks(0, true), 0);
}

}  // namespace
}  // namespace troupe::balance
