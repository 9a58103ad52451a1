// kv::block_manager: exact block ids, exact free-queue and eviction order, prefix reuse, fork.
#include "runtime/kv/block_manager.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace troupe::kv {

/// Write access to a cache event log's events, to corrupt them.
struct cache_event_log_tamper {
  cache_event_log& log;
  void flip_last() { log.log_.back().held = !log.log_.back().held; }
};

/// Write access to a block manager's private state, to corrupt it.
struct block_manager_tamper {
  block_manager& bm;
  std::vector<block_id>& next() { return bm.free_next_; }
  std::vector<block_id>& prev() { return bm.free_prev_; }
  std::vector<int32_t>& refcount() { return bm.refcount_; }
  int32_t& num_free() { return bm.num_free_blocks_; }
  std::vector<uint8_t>& window() { return bm.window_; }
  void flip_last_cache_event() { cache_event_log_tamper{bm.cache_log_}.flip_last(); }
};

namespace {

using ids = std::vector<block_id>;

block_manager make(int32_t num_blocks, int32_t block_size) {
  auto bm = block_manager::create({num_blocks, block_size});
  EXPECT_TRUE(bm.has_value());
  bm->check_invariants();
  return std::move(*bm);
}

/// `n` tokens first, first + 1, ...: distinct, so every block has its own hash.
std::vector<int32_t> token_range(int32_t n, int32_t first) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = first + i;
  return tokens;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// Allocates a fresh sequence with no prefix hit and checks invariants.
void allocate_new(block_manager& bm, seq_id seq, int32_t num_tokens) {
  ASSERT_FALSE(bm.contains(seq));
  ASSERT_TRUE(bm.can_allocate(seq, num_tokens));
  bm.allocate(seq, num_tokens);
  bm.check_invariants();
}

TEST(BlockManager, CreateRejectsBadConfig) {
  for (const block_manager_config bad :
       {block_manager_config{0, 16}, block_manager_config{-1, 16}, block_manager_config{4, 0},
        block_manager_config{4, -3},
        block_manager_config{std::numeric_limits<int32_t>::max(), 2}}) {
    auto bm = block_manager::create(bad);
    ASSERT_FALSE(bm.has_value()) << bad.num_blocks << " x " << bad.block_size;
    EXPECT_EQ(bm.error().code, errc::invalid_argument);
  }
  auto bm = make(4, 16);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  EXPECT_EQ(bm.num_used_blocks(), 0);
  EXPECT_EQ(bm.free_queue(), (ids{0, 1, 2, 3}));
}

TEST(BlockManager, AFreedSequencesWindowStateIsDemotedWithItsSlidingRowsAndAnInsertedBlockSaysWhetherItHoldsThem) {
  auto created = block_manager::create({8, 4, /*record_evictions=*/true, /*window_tokens=*/6});
  ASSERT_TRUE(created.has_value());
  block_manager& bm = *created;
  EXPECT_EQ(bm.window_tokens(), 6);
  const auto a = token_range(14, 100);  // 3 full blocks and 2 tokens
  allocate_new(bm, 1, 14);
  bm.commit(1, a, 14);
  EXPECT_EQ(bm.block_table(1), (ids{0, 1, 2, 3}));
  bm.free(1);  // the window state at 12 (positions 7-11) lies in blocks 1 and 2
  bm.check_invariants();
  allocate_new(bm, 2, 32);  // every block: evicts 2, 1 and 0 (3 was never full)
  const std::vector<evicted_block> evicted = bm.take_evictions();
  ASSERT_EQ(evicted.size(), 3u);
  EXPECT_EQ(evicted[0].block, 2);
  EXPECT_TRUE(evicted[0].with_window);
  EXPECT_EQ(evicted[1].block, 1);
  EXPECT_TRUE(evicted[1].with_window);
  EXPECT_EQ(evicted[2].block, 0);
  EXPECT_FALSE(evicted[2].with_window);  // before the window: its global layers only
  bm.free(2);                             // nothing committed: nothing marked
  bm.check_invariants();
  // Back from a tier: block 0 without its sliding rows, block 1 with them.
  const std::vector<uint64_t> hashes = chain_hashes(a, 4);
  const block_id first = bm.insert_cached(root_hash_seed, token_range(4, 100), /*with_window=*/false);
  const block_id second = bm.insert_cached(hashes[0], token_range(4, 104), /*with_window=*/true);
  EXPECT_FALSE(bm.holds_window(first));
  EXPECT_TRUE(bm.holds_window(second));
  bm.check_invariants();
  // A sequence ending on them marks only the block that holds its rows; both go down as they came.
  const prefix_hit hit = bm.find_prefix(token_range(9, 100));
  EXPECT_EQ(hit.blocks, (ids{first, second}));
  bm.allocate(3, 9, hit);
  bm.commit(3, token_range(9, 100), 9);
  bm.free(3);
  bm.check_invariants();
  allocate_new(bm, 4, 32);
  std::vector<evicted_block> again = bm.take_evictions();
  ASSERT_EQ(again.size(), 2u);
  for (const evicted_block& e : again) EXPECT_EQ(e.with_window, e.block == second) << e.block;
  EXPECT_NE(again[0].block, again[1].block);
  bm.free(4);
  bm.check_invariants();
  block_manager_tamper{bm}.window()[0] = 2;  // a mark on a block that is not cached
  EXPECT_DEATH(bm.check_invariants(), "a window mark on a block that is not cached");
  auto bad = block_manager::create({8, 4, false, -1});
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().message, "window_tokens must be >= 0, got -1");
}

TEST(BlockManager, AllocatesFromTheFrontAndReusesFreedBlocksTailFirst) {
  auto bm = make(8, 16);
  allocate_new(bm, 1, 20);
  allocate_new(bm, 2, 16);
  allocate_new(bm, 3, 33);
  EXPECT_EQ(bm.block_table(1), (ids{0, 1}));
  EXPECT_EQ(bm.block_table(2), (ids{2}));
  EXPECT_EQ(bm.block_table(3), (ids{3, 4, 5}));
  EXPECT_EQ(bm.num_free_blocks(), 2);
  EXPECT_EQ(bm.num_used_blocks(), 6);

  bm.free(1);
  bm.check_invariants();
  EXPECT_EQ(bm.free_queue(), (ids{6, 7, 1, 0}));  // freed in reverse table order, at the back
  allocate_new(bm, 4, 40);
  EXPECT_EQ(bm.block_table(4), (ids{6, 7, 1}));
  allocate_new(bm, 5, 1);
  EXPECT_EQ(bm.block_table(5), (ids{0}));
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_FALSE(bm.can_allocate(6, 1));
  EXPECT_TRUE(bm.can_allocate(6, 0));
  EXPECT_EQ(bm.num_evictions(), 0);
}

TEST(BlockManager, GrowingOnlyAppendsTheBlocksNeeded) {
  auto bm = make(4, 16);
  allocate_new(bm, 7, 16);
  EXPECT_EQ(bm.block_table(7), (ids{0}));
  for (const int32_t total : {16, 17, 32, 33}) {
    ASSERT_TRUE(bm.can_allocate(7, total));
    bm.allocate(7, total);
    bm.check_invariants();
    EXPECT_EQ(bm.num_tokens(7), total);
  }
  EXPECT_EQ(bm.block_table(7), (ids{0, 1, 2}));
  EXPECT_TRUE(bm.can_allocate(7, 64));
  EXPECT_FALSE(bm.can_allocate(7, 65));  // 5 blocks > 4 in the pool
}

TEST(BlockManager, SharedPrefixReusesExactBlocks) {
  auto bm = make(10, 16);
  const auto prompt = token_range(3 * 16 + 5, 100);
  allocate_new(bm, 1, 53);
  EXPECT_EQ(bm.block_table(1), (ids{0, 1, 2, 3}));
  bm.commit(1, prompt, 53);
  bm.check_invariants();
  EXPECT_EQ(bm.num_cached_blocks(), 3);  // the partial 4th block is never cached

  const auto other = concat(std::vector<int32_t>(prompt.begin(), prompt.begin() + 48),
                            token_range(5, 900));
  const prefix_hit hit = bm.find_prefix(other);
  EXPECT_EQ(hit.blocks, (ids{0, 1, 2}));
  EXPECT_EQ(hit.num_tokens, 48);
  ASSERT_TRUE(bm.can_allocate(2, 53, hit));
  bm.allocate(2, 53, hit);
  bm.check_invariants();
  EXPECT_EQ(bm.block_table(2), (ids{0, 1, 2, 4}));
  EXPECT_EQ(bm.refcount(0), 2);
  EXPECT_EQ(bm.refcount(1), 2);
  EXPECT_EQ(bm.refcount(2), 2);
  EXPECT_EQ(bm.refcount(3), 1);
  EXPECT_EQ(bm.refcount(4), 1);

  // Exactly 48 tokens: the last one must be computed, so only 2 blocks can come from cache.
  const auto exact = std::vector<int32_t>(prompt.begin(), prompt.begin() + 48);
  EXPECT_EQ(bm.find_prefix(exact).blocks, (ids{0, 1}));
  EXPECT_EQ(bm.find_prefix(exact).num_tokens, 32);
  const auto one_more = std::vector<int32_t>(prompt.begin(), prompt.begin() + 49);
  EXPECT_EQ(bm.find_prefix(one_more).blocks, (ids{0, 1, 2}));
  EXPECT_TRUE(bm.find_prefix({}).blocks.empty());

  // The chain hash covers the whole prefix: same block-1 tokens after a different block 0 miss.
  auto changed_first = prompt;
  changed_first[0] = -1;
  EXPECT_TRUE(bm.find_prefix(changed_first).blocks.empty());
  auto changed_second = prompt;
  changed_second[20] = -1;
  EXPECT_EQ(bm.find_prefix(changed_second).blocks, (ids{0}));
}

TEST(BlockManager, CommitRegistersOnlyCompletelyComputedBlocks) {
  auto bm = make(4, 4);
  const auto prompt = token_range(14, 0);
  allocate_new(bm, 1, 14);
  bm.commit(1, prompt, 3);
  EXPECT_EQ(bm.num_cached_blocks(), 0);
  bm.commit(1, prompt, 9);
  bm.check_invariants();
  EXPECT_EQ(bm.num_cached_blocks(), 2);
  EXPECT_EQ(bm.find_prefix(prompt).blocks, (ids{0, 1}));
  bm.commit(1, prompt, 14);
  bm.check_invariants();
  EXPECT_EQ(bm.find_prefix(prompt).blocks, (ids{0, 1, 2}));
  EXPECT_FALSE(bm.is_cached(3));
}

TEST(BlockManager, CachedFreeBlocksAreReusedAndLeaveTheQueueFromTheMiddle) {
  auto bm = make(10, 16);
  const auto prompt = token_range(53, 7);
  allocate_new(bm, 1, 53);
  bm.commit(1, prompt, 53);
  bm.free(1);
  bm.check_invariants();
  EXPECT_EQ(bm.free_queue(), (ids{4, 5, 6, 7, 8, 9, 3, 2, 1, 0}));
  EXPECT_EQ(bm.num_free_blocks(), 10);
  EXPECT_EQ(bm.num_cached_blocks(), 3);

  const prefix_hit hit = bm.find_prefix(prompt);
  EXPECT_EQ(hit.blocks, (ids{0, 1, 2}));
  ASSERT_TRUE(bm.can_allocate(2, 53, hit));
  bm.allocate(2, 53, hit);
  bm.check_invariants();
  EXPECT_EQ(bm.block_table(2), (ids{0, 1, 2, 4}));
  EXPECT_EQ(bm.free_queue(), (ids{5, 6, 7, 8, 9, 3}));
  EXPECT_EQ(bm.num_evictions(), 0);
  EXPECT_EQ(bm.num_cached_blocks(), 3);
}

TEST(BlockManager, EvictsCachedFreeBlocksInExactLruOrder) {
  auto bm = make(6, 4);
  const auto a = token_range(12, 0);    // 3 full blocks
  const auto b = token_range(8, 100);   // 2 full blocks
  const auto a_query = concat(a, {7});  // one token past each prompt, so all blocks may hit
  const auto b_query = concat(b, {7});
  allocate_new(bm, 1, 12);
  bm.commit(1, a, 12);
  allocate_new(bm, 2, 8);
  bm.commit(2, b, 8);
  EXPECT_EQ(bm.block_table(1), (ids{0, 1, 2}));
  EXPECT_EQ(bm.block_table(2), (ids{3, 4}));
  bm.free(1);
  bm.free(2);
  bm.check_invariants();
  EXPECT_EQ(bm.free_queue(), (ids{5, 2, 1, 0, 4, 3}));
  EXPECT_EQ(bm.num_cached_blocks(), 5);

  allocate_new(bm, 3, 4);  // takes uncached block 5: nothing evicted
  EXPECT_EQ(bm.block_table(3), (ids{5}));
  EXPECT_EQ(bm.num_evictions(), 0);
  allocate_new(bm, 4, 8);  // evicts a's tail blocks 2 then 1
  EXPECT_EQ(bm.block_table(4), (ids{2, 1}));
  EXPECT_EQ(bm.num_evictions(), 2);
  EXPECT_EQ(bm.find_prefix(a_query).blocks, (ids{0}));
  EXPECT_EQ(bm.find_prefix(b_query).blocks, (ids{3, 4}));
  allocate_new(bm, 5, 4);  // evicts a's head block 0
  EXPECT_EQ(bm.block_table(5), (ids{0}));
  EXPECT_TRUE(bm.find_prefix(a_query).blocks.empty());
  EXPECT_EQ(bm.find_prefix(b_query).blocks, (ids{3, 4}));
  allocate_new(bm, 6, 4);  // evicts b's tail block 4
  EXPECT_EQ(bm.block_table(6), (ids{4}));
  EXPECT_EQ(bm.find_prefix(b_query).blocks, (ids{3}));
  EXPECT_EQ(bm.num_evictions(), 4);
  EXPECT_EQ(bm.num_cached_blocks(), 1);
  EXPECT_EQ(bm.free_queue(), (ids{3}));
}

TEST(BlockManager, RecordedEvictionsNameEachEvictedBlockInOrder) {
  auto recording = block_manager::create({4, 4, /*record_evictions=*/true});
  ASSERT_TRUE(recording.has_value());
  block_manager& bm = *recording;
  const auto a = token_range(8, 0);  // 2 full blocks
  allocate_new(bm, 1, 8);
  bm.commit(1, a, 8);
  bm.free(1);
  EXPECT_EQ(bm.free_queue(), (ids{2, 3, 1, 0}));
  EXPECT_TRUE(bm.take_evictions().empty());
  allocate_new(bm, 2, 16);  // takes 2, 3, then evicts a's blocks 1 and 0
  const std::vector<evicted_block> evicted = bm.take_evictions();
  ASSERT_EQ(evicted.size(), 2u);
  const std::vector<uint64_t> hashes = chain_hashes(a, 4);
  EXPECT_EQ(evicted[0].block, 1);
  EXPECT_EQ(evicted[0].hash, hashes[1]);
  EXPECT_EQ(evicted[0].parent_hash, hashes[0]);
  EXPECT_EQ(evicted[0].tokens, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(evicted[1].block, 0);
  EXPECT_EQ(evicted[1].hash, hashes[0]);
  EXPECT_EQ(evicted[1].parent_hash, root_hash_seed);
  EXPECT_EQ(evicted[1].tokens, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_TRUE(bm.take_evictions().empty());  // taken once
  bm.check_invariants();
  // Without record_evictions nothing is kept.
  auto quiet = make(1, 4);
  allocate_new(quiet, 1, 4);
  quiet.commit(1, token_range(4, 0), 4);
  quiet.free(1);
  allocate_new(quiet, 2, 4);
  EXPECT_EQ(quiet.num_evictions(), 1);
  EXPECT_TRUE(quiet.take_evictions().empty());
}

TEST(BlockManager, AnInsertedBlockIsAFreeCachedBlockThatAPrefixHits) {
  auto recording = block_manager::create({3, 4, /*record_evictions=*/true});
  ASSERT_TRUE(recording.has_value());
  block_manager& bm = *recording;
  const auto a = token_range(8, 0);
  const auto query = concat(a, {7});
  const std::vector<uint64_t> hashes = chain_hashes(a, 4);
  EXPECT_EQ(bm.insert_cached(root_hash_seed, token_range(4, 0)), 0);
  EXPECT_EQ(bm.insert_cached(hashes[0], token_range(4, 4)), 1);
  EXPECT_TRUE(bm.has_block(hashes[0]) && bm.has_block(hashes[1]));
  EXPECT_EQ(bm.free_queue(), (ids{2, 0, 1}));  // at the back: the most recently freed
  EXPECT_EQ(bm.num_free_blocks(), 3);
  EXPECT_EQ(bm.num_cached_blocks(), 2);
  bm.check_invariants();
  const prefix_hit hit = bm.find_prefix(query);
  EXPECT_EQ(hit.blocks, (ids{0, 1}));
  bm.allocate(1, 9, hit);
  EXPECT_EQ(bm.block_table(1), (ids{0, 1, 2}));
  EXPECT_TRUE(bm.take_evictions().empty());
  bm.free(1);
  // A third insert takes the queue's front, evicting (and logging) a cached block.
  EXPECT_EQ(bm.free_queue(), (ids{2, 1, 0}));
  EXPECT_EQ(bm.insert_cached(root_hash_seed, token_range(4, 50)), 2);
  EXPECT_TRUE(bm.take_evictions().empty());  // block 2 held no hash
  EXPECT_EQ(bm.insert_cached(chain_hash(root_hash_seed, token_range(4, 50).data(), 4), token_range(4, 54)), 1);
  const std::vector<evicted_block> evicted = bm.take_evictions();
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].block, 1);
  EXPECT_EQ(evicted[0].hash, hashes[1]);
  bm.check_invariants();
}

/// `hashes` ascending (cache_events' order).
std::vector<uint64_t> sorted(std::vector<uint64_t> hashes) {
  std::sort(hashes.begin(), hashes.end());
  return hashes;
}

TEST(BlockManager, CacheEventsAreTheNetChangeOfTheCachedHashesBetweenTakes) {
  auto bm = make(4, 4);
  const auto a = token_range(8, 0), b = token_range(16, 100), c = token_range(4, 200);
  const std::vector<uint64_t> ha = chain_hashes(a, 4), hb = chain_hashes(b, 4);
  const uint64_t hc = chain_hashes(c, 4)[0];
  allocate_new(bm, 1, 8);
  bm.commit(1, a, 8);  // blocks 0 1 cached as a's
  cache_events e = bm.take_cache_events();
  EXPECT_EQ(e.added, sorted(ha));
  EXPECT_TRUE(e.removed.empty());
  EXPECT_FALSE(e.overflowed);
  EXPECT_TRUE(bm.take_cache_events().added.empty());  // taken once
  bm.free(1);
  allocate_new(bm, 2, 16);  // takes 2 3, then evicts a's blocks 1 0
  bm.commit(2, b, 16);
  bm.check_invariants();
  e = bm.take_cache_events();
  EXPECT_EQ(e.added, sorted(hb));
  EXPECT_EQ(e.removed, sorted(ha));
  // Cached and evicted between two takes: in neither list. free(2) queues 0 1 3 2.
  bm.free(2);
  allocate_new(bm, 3, 4);  // block 0: evicts b's last block
  bm.commit(3, c, 4);
  bm.free(3);  // the queue: 1 3 2 0
  allocate_new(bm, 4, 16);  // evicts b's blocks 2 1 0 and c's
  bm.check_invariants();
  e = bm.take_cache_events();
  EXPECT_TRUE(e.added.empty());
  EXPECT_EQ(e.removed, sorted(hb));
  EXPECT_TRUE(bm.cached_hashes().empty());
  // A block from a lower tier enters the cache too.
  bm.free(4);
  bm.insert_cached(root_hash_seed, c);
  e = bm.take_cache_events();
  EXPECT_EQ(e.added, (std::vector<uint64_t>{hc}));
  EXPECT_TRUE(e.removed.empty());
  EXPECT_EQ(bm.cached_hashes(), (std::vector<uint64_t>{hc}));
  bm.check_invariants();
}

TEST(BlockManager, PastTwiceThePoolInEventsTheLogIsDroppedAndTheTakeSaysOverflowed) {
  auto bm = make(2, 4);  // at most 4 events kept
  const auto a = token_range(8, 0), b = token_range(8, 100);
  allocate_new(bm, 1, 8);
  bm.commit(1, a, 8);  // 2 events
  bm.free(1);
  allocate_new(bm, 2, 8);  // 2 evictions: 4 events, the bound
  bm.check_invariants();
  bm.commit(2, b, 8);  // 2 more: over
  bm.check_invariants();
  cache_events e = bm.take_cache_events();
  EXPECT_TRUE(e.overflowed);
  EXPECT_TRUE(e.added.empty() && e.removed.empty());
  EXPECT_EQ(bm.cached_hashes(), sorted(chain_hashes(b, 4)));  // what the consumer starts over from
  // Taken: logging starts afresh.
  bm.free(2);
  allocate_new(bm, 3, 4);  // evicts b's last block (the queue's front)
  e = bm.take_cache_events();
  EXPECT_FALSE(e.overflowed);
  EXPECT_EQ(e.removed, (std::vector<uint64_t>{chain_hashes(b, 4)[1]}));
  bm.check_invariants();
}

TEST(BlockManager, RefreshMovesAHitsFreeBlocksToTheBackHeadLast) {
  auto bm = make(5, 4);
  const auto a = token_range(12, 0);  // 3 full blocks
  allocate_new(bm, 1, 12);
  bm.commit(1, a, 12);
  bm.free(1);
  EXPECT_EQ(bm.free_queue(), (ids{3, 4, 2, 1, 0}));
  allocate_new(bm, 2, 4);  // takes 3; holds nothing of a
  const prefix_hit hit = bm.find_prefix(concat(a, {7}));
  ASSERT_EQ(hit.blocks, (ids{0, 1, 2}));
  EXPECT_EQ(bm.refresh(prefix_hit{{0, 1}, 8}), 2);
  EXPECT_EQ(bm.free_queue(), (ids{4, 2, 1, 0}));  // already tail first: 1 then 0 at the back
  bm.check_invariants();
  EXPECT_EQ(bm.refresh(hit), 3);
  EXPECT_EQ(bm.free_queue(), (ids{4, 2, 1, 0}));
  bm.allocate(3, 9, prefix_hit{{0}, 4});  // holds block 0, and takes 4 and 2 from the front
  EXPECT_EQ(bm.free_queue(), (ids{1}));
  EXPECT_EQ(bm.refresh(prefix_hit{{0, 1}, 8}), 1);  // block 0 is held: only block 1 moves
  EXPECT_EQ(bm.free_queue(), (ids{1}));
  bm.check_invariants();
}

TEST(BlockManager, HitBlocksInTheFreeQueueAreNotFreshBlocks) {
  auto bm = make(4, 4);
  const auto a = token_range(12, 0);
  allocate_new(bm, 1, 12);
  bm.commit(1, a, 12);
  bm.free(1);
  EXPECT_EQ(bm.free_queue(), (ids{3, 2, 1, 0}));

  // 17 tokens = 5 blocks: 3 from the hit, 2 fresh; only block 3 is free and not in the hit.
  const auto long_prompt = concat(a, token_range(5, 50));
  const prefix_hit long_hit = bm.find_prefix(long_prompt);
  EXPECT_EQ(long_hit.blocks, (ids{0, 1, 2}));
  EXPECT_FALSE(bm.can_allocate(2, 17, long_hit));
  EXPECT_FALSE(bm.can_allocate(2, 17));  // without the hit it needs 5 > 4 blocks anyway

  const auto fitting = concat(a, token_range(4, 50));  // 16 tokens = 4 blocks, 1 fresh
  const prefix_hit hit = bm.find_prefix(fitting);
  EXPECT_EQ(hit.blocks, (ids{0, 1, 2}));
  ASSERT_TRUE(bm.can_allocate(2, 16, hit));
  bm.allocate(2, 16, hit);
  bm.check_invariants();
  EXPECT_EQ(bm.block_table(2), (ids{0, 1, 2, 3}));
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_EQ(bm.num_evictions(), 0);
}

TEST(BlockManager, HitBlocksHeldByLiveSequencesCostNothing) {
  auto bm = make(5, 4);
  const auto a = token_range(12, 0);
  allocate_new(bm, 1, 12);
  bm.commit(1, a, 12);
  const auto prompt = concat(a, token_range(5, 50));  // 5 blocks: 3 shared, 2 fresh
  const prefix_hit hit = bm.find_prefix(prompt);
  ASSERT_EQ(hit.blocks, (ids{0, 1, 2}));
  EXPECT_TRUE(bm.can_allocate(2, 17, hit));
  EXPECT_FALSE(bm.can_allocate(2, 21, hit));  // 3 fresh > 2 free
  bm.allocate(2, 17, hit);
  bm.check_invariants();
  EXPECT_EQ(bm.block_table(2), (ids{0, 1, 2, 3, 4}));
  EXPECT_EQ(bm.num_free_blocks(), 0);
}

TEST(BlockManager, ForkSharesFullBlocksAndCopiesThePartialOne) {
  auto bm = make(8, 4);
  allocate_new(bm, 1, 10);  // 2 full blocks + 2 tokens
  EXPECT_EQ(bm.block_table(1), (ids{0, 1, 2}));
  ASSERT_TRUE(bm.can_fork(1));
  EXPECT_EQ(bm.fork(1, 2), (std::vector<block_copy>{{2, 3}}));
  bm.check_invariants();
  EXPECT_EQ(bm.block_table(2), (ids{0, 1, 3}));
  EXPECT_EQ(bm.num_tokens(2), 10);
  EXPECT_EQ(bm.refcount(0), 2);
  EXPECT_EQ(bm.refcount(1), 2);
  EXPECT_EQ(bm.refcount(2), 1);
  EXPECT_EQ(bm.refcount(3), 1);

  allocate_new(bm, 3, 8);  // full blocks only: fork copies nothing
  EXPECT_EQ(bm.block_table(3), (ids{4, 5}));
  EXPECT_TRUE(bm.fork(3, 4).empty());
  bm.check_invariants();
  EXPECT_EQ(bm.block_table(4), (ids{4, 5}));
  EXPECT_EQ(bm.refcount(4), 2);

  allocate_new(bm, 5, 8);  // pool now empty
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_FALSE(bm.can_fork(1));
  EXPECT_TRUE(bm.can_fork(3));

  bm.free(1);
  bm.check_invariants();
  EXPECT_EQ(bm.free_queue(), (ids{2}));  // shared blocks 0 and 1 live on in the child
  EXPECT_EQ(bm.refcount(0), 1);
  bm.free(2);
  bm.check_invariants();
  EXPECT_EQ(bm.free_queue(), (ids{2, 3, 1, 0}));
}

TEST(BlockManager, ChildAndParentCommitSharedBlocksOnce) {
  auto bm = make(8, 4);
  const auto prompt = token_range(10, 0);
  allocate_new(bm, 1, 10);
  EXPECT_EQ(bm.fork(1, 2), (std::vector<block_copy>{{2, 3}}));
  bm.commit(2, prompt, 10);  // the child registers the shared blocks
  bm.check_invariants();
  EXPECT_EQ(bm.num_cached_blocks(), 2);
  bm.commit(1, prompt, 10);  // the parent finds them registered: no duplicates
  bm.check_invariants();
  EXPECT_EQ(bm.num_cached_blocks(), 2);
  EXPECT_EQ(bm.find_prefix(prompt).blocks, (ids{0, 1}));
}

TEST(BlockManager, DuplicateCommitLeavesTheSecondBlockUnhashed) {
  auto bm = make(6, 4);
  const auto prompt = token_range(8, 0);
  allocate_new(bm, 1, 8);
  allocate_new(bm, 2, 8);  // same tokens, allocated before either was committed
  bm.commit(1, prompt, 8);
  bm.commit(2, prompt, 8);
  bm.check_invariants();
  EXPECT_EQ(bm.num_cached_blocks(), 2);
  EXPECT_TRUE(bm.is_cached(0));
  EXPECT_TRUE(bm.is_cached(1));
  EXPECT_FALSE(bm.is_cached(2));
  EXPECT_FALSE(bm.is_cached(3));
  EXPECT_EQ(bm.find_prefix(concat(prompt, {1})).blocks, (ids{0, 1}));
  bm.free(1);
  bm.check_invariants();
  EXPECT_EQ(bm.find_prefix(concat(prompt, {1})).blocks, (ids{0, 1}));  // cached while free
}

TEST(BlockManager, TryFreeReportsUnknownIds) {
  auto bm = make(2, 4);
  auto missing = bm.try_free(42);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, errc::not_found);
  allocate_new(bm, 42, 5);
  EXPECT_TRUE(bm.try_free(42).has_value());
  bm.check_invariants();
  EXPECT_FALSE(bm.contains(42));
  EXPECT_EQ(bm.num_free_blocks(), 2);
}

TEST(BlockManagerDeathTest, ProgrammerErrorsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto bm = make(2, 4);
  EXPECT_DEATH(bm.free(9), "unknown sequence id");
  EXPECT_DEATH((void)bm.fork(9, 10), "unknown sequence id");
  EXPECT_DEATH(bm.allocate(1, 9), "allocate without can_allocate");
  allocate_new(bm, 1, 4);
  EXPECT_DEATH(bm.allocate(1, 3), "never shrinks");
  bm.commit(1, token_range(4, 0), 4);
  EXPECT_DEATH((void)bm.insert_cached(root_hash_seed, token_range(4, 0)), "cached already");
  EXPECT_DEATH((void)bm.insert_cached(root_hash_seed, token_range(3, 0)), "tokens.size");
  allocate_new(bm, 2, 4);  // the pool is full
  EXPECT_DEATH((void)bm.insert_cached(root_hash_seed, token_range(4, 9)), "KV pool exhausted");
}

TEST(BlockManagerDeathTest, StaleHitAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto bm = make(2, 4);
  const auto prompt = token_range(5, 0);
  allocate_new(bm, 1, 4);
  bm.commit(1, prompt, 4);
  bm.free(1);
  const prefix_hit hit = bm.find_prefix(prompt);
  ASSERT_EQ(hit.blocks, (ids{0}));
  allocate_new(bm, 2, 8);  // reallocates block 0: the hit is stale
  EXPECT_EQ(bm.num_evictions(), 1);
  EXPECT_DEATH((void)bm.can_allocate(3, 5, hit), "stale prefix_hit");
}

TEST(BlockManagerDeathTest, TheStructuralCheckCatchesEachCorruption) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Blocks 0-2 held by sequence 1, 3-7 free in that order (sentinel 8).
  const auto setup = [] {
    auto bm = make(8, 4);
    allocate_new(bm, 1, 12);
    EXPECT_EQ(bm.free_queue(), (ids{3, 4, 5, 6, 7}));
    bm.check_structure();
    return bm;
  };
  {
    auto bm = setup();
    block_manager_tamper{bm}.refcount()[1] = 2;
    EXPECT_DEATH(bm.check_structure(), "refcount != table references");
  }
  {
    auto bm = setup();
    block_manager_tamper{bm}.next()[4] = 6;  // skips 5: 6's prev is still 5
    EXPECT_DEATH(bm.check_structure(), "free queue link broken");
  }
  {
    auto bm = setup();
    block_manager_tamper t{bm};  // 4 <-> 1: a referenced block linked into the queue
    t.next()[4] = 1;
    t.prev()[1] = 4;
    EXPECT_DEATH(bm.check_structure(), "free queue link broken|a referenced block is linked");
  }
  {
    auto bm = setup();
    block_manager_tamper{bm}.prev()[2] = 5;  // referenced, with a stray link
    EXPECT_DEATH(bm.check_structure(), "a referenced block is linked into the free queue");
  }
  {
    auto bm = setup();
    block_manager_tamper{bm}.next()[5] = 9;  // out of range
    EXPECT_DEATH(bm.check_structure(), "next\\[b\\] >= 0");
  }
  {
    auto bm = setup();
    block_manager_tamper{bm}.num_free() = 4;
    EXPECT_DEATH(bm.check_structure(), "free block count is off");
  }
}

TEST(BlockManagerDeathTest, TheInvariantCheckCatchesACacheLogThatDisagreesWithTheIndex) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto bm = make(4, 4);
  allocate_new(bm, 1, 8);
  bm.commit(1, token_range(8, 0), 8);
  block_manager_tamper{bm}.flip_last_cache_event();  // says block 1's hash left the index
  EXPECT_DEATH(bm.check_invariants(), "the cache log disagrees with the cache");
}

TEST(BlockManagerDeathTest, TheStepCheckCatchesCorruptionOfWhatChanged) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  {
    auto bm = make(8, 4);
    allocate_new(bm, 1, 12);  // blocks 0-2 change
    block_manager_tamper{bm}.refcount()[1] = 0;  // free, but linked nowhere
    EXPECT_DEATH(bm.check_step(), "free queue link broken");
  }
  {
    auto bm = make(8, 4);
    allocate_new(bm, 1, 12);
    bm.check_step();
    bm.free(1);  // blocks 0-2 change again
    block_manager_tamper{bm}.refcount()[2] = 1;  // referenced, yet linked into the queue
    EXPECT_DEATH(bm.check_step(), "a referenced block is linked into the free queue");
  }
}

TEST(BlockManagerDeathTest, WhatTheStepCheckCannotSeeTheStructuralCheckDoes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto bm = make(8, 4);
  allocate_new(bm, 1, 12);
  bm.check_step();
  block_manager_tamper{bm}.refcount()[1] = 2;  // block 1 did not change since: unseen
  bm.check_step();
  EXPECT_DEATH(bm.check_structure(), "refcount != table references");
  // Once more changes piled up than check_step keeps, it checks everything.
  for (int i = 0; i <= (1 << 16); i++) {
    bm.allocate(2, 4);
    bm.free(2);
  }
  EXPECT_DEATH(bm.check_step(), "refcount != table references");
}

}  // namespace
}  // namespace troupe::kv
