// kv::tier_store (a cache tier's bookkeeping) and the pieces it stands on: the chain hash as a
// free function (pinned: disk files outlive the process), kv_block's checks and checksum, and
// cache_class. Exact LRU orders, TTL expiry by class on a controlled clock, capacity; the
// invariants are checked after every call. Its fetch split around a tier below that answers
// later (kv/split_fetch), against get_prefix over one that answers at once.
#include "runtime/kv/tier_store.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/kv/block_manager.hpp"
#include "runtime/kv/chain_hash.hpp"
#include "runtime/kv/split_fetch.hpp"
#include "tests/support/kv_blocks.hpp"

namespace troupe::kv {
namespace {

using hashes = std::vector<uint64_t>;

constexpr int32_t block_size = 4;

using testing::token_range;

kv_block block_of(const std::vector<int32_t>& tokens, int32_t index) {
  return testing::block_of(tokens, index, block_size);
}

tier_store make_tier(int64_t capacity, int64_t chat_ttl_ns = 7 * day_ns, int64_t agent_ttl_ns = 3 * day_ns) {
  auto tier = tier_store::create({block_size, capacity, chat_ttl_ns, agent_ttl_ns});
  EXPECT_TRUE(tier.has_value());
  tier->check_invariants();
  return std::move(*tier);
}

/// Puts and checks; returns the evicted blocks' hashes.
hashes put(tier_store& tier, const kv_block& b, cache_class cls, int64_t now_ns) {
  hashes evicted;
  for (const evicted_tier_block& e : tier.put(b, cls, now_ns)) evicted.push_back(e.block.hash);
  tier.check_invariants();
  return evicted;
}

TEST(ChainHash, IsPinnedAndChainsBlockByBlock) {
  const std::vector<int32_t> tokens = token_range(9, 1);  // 2 full blocks and 1 token
  const hashes chain = chain_hashes(tokens, block_size);
  ASSERT_EQ(chain.size(), 2u);
  // Pinned: the disk tier names files by these, so a change would orphan every stored block.
  EXPECT_EQ(chain[0], 0x50926bd005c9f7c0ULL);
  EXPECT_EQ(chain[0], chain_hash(root_hash_seed, tokens.data(), block_size));
  EXPECT_EQ(chain[1], chain_hash(chain[0], tokens.data() + block_size, block_size));
  EXPECT_EQ(chain_hashes(token_range(4, 1), block_size), hashes{chain[0]});  // a prefix's chain is a prefix
  EXPECT_NE(chain_hashes(token_range(8, 2), block_size)[0], chain[0]);
  EXPECT_TRUE(chain_hashes(token_range(3, 1), block_size).empty());
}

TEST(ChainHash, IsThePoolsBlockName) {
  // The pool finds a prompt's block by the free function's hash: a tier and the pool agree.
  auto bm = block_manager::create({4, block_size});
  ASSERT_TRUE(bm.has_value());
  const std::vector<int32_t> prompt = token_range(9, 1);
  bm->allocate(0, 9);
  bm->commit(0, prompt, 9);
  EXPECT_EQ(bm->find_prefix(prompt).blocks, (std::vector<block_id>{0, 1}));
  bm->check_invariants();
}

TEST(KvBlock, ConsistencyAndChecksum) {
  const std::vector<int32_t> tokens = token_range(8, 1);
  kv_block b = block_of(tokens, 1);
  EXPECT_TRUE(is_consistent(b));
  EXPECT_EQ(b.num_bytes(), 4 * 4 + 2 * 24 * 4);
  const uint64_t sum = checksum(b);
  EXPECT_EQ(sum, checksum(block_of(tokens, 1)));
  kv_block flipped = b;
  flipped.values[23] ^= 1;
  EXPECT_TRUE(is_consistent(flipped));  // the data is not part of the name...
  EXPECT_NE(checksum(flipped), sum);    // ...but is part of the checksum
  kv_block renamed = b;
  renamed.parent_hash = root_hash_seed;
  EXPECT_FALSE(is_consistent(renamed));
  kv_block short_keys = b;
  short_keys.keys.pop_back();
  EXPECT_FALSE(is_consistent(short_keys));
  kv_block huge = b;
  huge.num_layers = 1 << 30;
  huge.kv_dim = 1 << 30;
  EXPECT_FALSE(is_consistent(huge));
  EXPECT_FALSE(is_consistent(kv_block{}));
  // The bytes follow the type: f16 rows of 3 values take half of f32's, and the type is part
  // of the checksum; q8_0 needs rows of whole blocks of 32; a type from nowhere is refused.
  kv_block half = b;
  half.dtype = kv_dtype::f16;
  EXPECT_FALSE(is_consistent(half));
  half.keys.resize(half.keys.size() / 2);
  half.values.resize(half.values.size() / 2);
  EXPECT_TRUE(is_consistent(half));
  EXPECT_EQ(half.num_bytes(), 4 * 4 + 2 * 24 * 2);
  kv_block same_bytes = half;
  same_bytes.dtype = kv_dtype::f32;
  same_bytes.kv_dim = 3;
  same_bytes.num_layers = 1;  // 1 layer x 4 tokens x 3 float32 values: the same 48 bytes
  EXPECT_TRUE(is_consistent(same_bytes));
  EXPECT_NE(checksum(same_bytes), checksum(half));
  kv_block q8 = b;
  q8.dtype = kv_dtype::q8_0;
  EXPECT_FALSE(is_consistent(q8));
  kv_block unknown = b;
  unknown.dtype = static_cast<kv_dtype>(7);
  EXPECT_FALSE(is_consistent(unknown));
}

TEST(KvBlock, ValidateNamesWhatIsWrong) {
  const kv_block b = block_of(token_range(8, 1), 1);
  EXPECT_TRUE(validate(b, block_size));
  EXPECT_EQ(validate(b, 8).error().message, "a KV block must hold 8 tokens, got 4");
  kv_block short_values = b;
  short_values.values.pop_back();
  const auto bad = validate(short_values, block_size);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, errc::invalid_argument);
  EXPECT_EQ(bad.error().message,
            "a KV block's dimensions do not match its data, or its hash is not its tokens' chain hash");
}

TEST(KvBlock, TheGlobalLayersOfABlockGoDownAloneAndComeBackBesideZeroSlidingRows) {
  // 3 layers x 2 tokens x 1 float: layer l, token t holds 10 l + t (keys) and -(10 l + t).
  engine::kv_data kv{3, 1, 2, testing::f32_bytes({0, 1, 10, 11, 20, 21}), testing::f32_bytes({0, -1, -10, -11, -20, -21}),
                     kv_dtype::f32};
  const engine::kv_data global = kv_layers(kv, {0, 2});
  EXPECT_EQ(global.num_layers, 2);
  EXPECT_EQ(global.num_tokens, 2);
  EXPECT_EQ(testing::f32_values(global.keys), (std::vector<float>{0, 1, 20, 21}));
  EXPECT_EQ(testing::f32_values(global.values), (std::vector<float>{0, -1, -20, -21}));
  const engine::kv_data back = kv_spread(global, {0, 2}, 3);
  EXPECT_TRUE(back.consistent());
  EXPECT_EQ(testing::f32_values(back.keys), (std::vector<float>{0, 1, 0, 0, 20, 21}));
  EXPECT_EQ(testing::f32_values(back.values), (std::vector<float>{0, -1, 0, 0, -20, -21}));
  EXPECT_EQ(kv_layers(back, {0, 1, 2}).keys, back.keys);
}

TEST(KvBlockDeathTest, LayersOutOfOrderOrOfAnotherCountAreProgrammerErrors) {
  const engine::kv_data kv{3, 1, 2, testing::f32_bytes(6, 1.0f), testing::f32_bytes(6, 2.0f), kv_dtype::f32};
  EXPECT_DEATH((void)kv_layers(kv, {2, 0}), "ascending_below");
  EXPECT_DEATH((void)kv_layers(kv, {0, 3}), "ascending_below");
  EXPECT_DEATH((void)kv_spread(kv, {0, 1, 3}, 3), "ascending_below");
  EXPECT_DEATH((void)kv_spread(kv, {0}, 3), "num_layers == static_cast");
}

TEST(CacheClass, ParsesItsTwoNames) {
  EXPECT_EQ(parse_cache_class("chat").value(), cache_class::chat);
  EXPECT_EQ(parse_cache_class("agent").value(), cache_class::agent);
  EXPECT_STREQ(to_string(cache_class::agent), "agent");
  EXPECT_TRUE(is_valid(cache_class::agent));
  EXPECT_FALSE(is_valid(static_cast<cache_class>(2)));
  const auto bad = parse_cache_class("batch");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, errc::invalid_argument);
  EXPECT_EQ(bad.error().message, "cache_class must be chat or agent, got 'batch'");
}

TEST(TierStore, CreateRejectsEachBadSize) {
  const auto message = [](const tier_config& c) { return tier_store::create(c).error().message; };
  EXPECT_EQ(message({0, 8, 1, 1}), "block_size must be > 0, got 0");
  EXPECT_EQ(message({4, 0, 1, 1}), "capacity_blocks must be > 0, got 0");
  EXPECT_EQ(message({4, 8, -1, 1}), "chat_ttl_ns must be > 0, got -1");
  EXPECT_EQ(message({4, 8, 1, 0}), "agent_ttl_ns must be > 0, got 0");
  const tier_config defaults;
  EXPECT_EQ(defaults.agent_ttl_ns, 259'200'000'000'000);  // 3 days
  EXPECT_EQ(defaults.chat_ttl_ns, 604'800'000'000'000);   // 7 days
}

TEST(TierStore, EvictsTheLeastRecentlyUsedWhenFull) {
  tier_store tier = make_tier(3);
  const std::vector<int32_t> tokens = token_range(20, 1);
  const kv_block a = block_of(tokens, 0), b = block_of(tokens, 1), c = block_of(tokens, 2);
  const kv_block d = block_of(tokens, 3), e = block_of(tokens, 4);
  EXPECT_TRUE(put(tier, a, cache_class::chat, 0).empty());
  EXPECT_TRUE(put(tier, b, cache_class::chat, 1).empty());
  EXPECT_TRUE(put(tier, c, cache_class::chat, 2).empty());
  EXPECT_EQ(tier.lru_order(), (hashes{a.hash, b.hash, c.hash}));
  // A get is a use; the prefix lookup is not.
  const kv_block* got = tier.get(a.hash, 3);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->keys, a.keys);
  EXPECT_EQ(tier.longest_prefix(tokens, 3), 3);
  EXPECT_EQ(tier.lru_order(), (hashes{b.hash, c.hash, a.hash}));
  // Full: d evicts b, handed back whole for the next tier down.
  const std::vector<evicted_tier_block> evicted = tier.put(d, cache_class::chat, 4);
  tier.check_invariants();
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].block.hash, b.hash);
  EXPECT_EQ(evicted[0].block.values, b.values);
  EXPECT_EQ(evicted[0].cls, cache_class::chat);
  EXPECT_EQ(tier.lru_order(), (hashes{c.hash, a.hash, d.hash}));
  // A re-put of a held block evicts nothing and makes it the most recent.
  EXPECT_TRUE(put(tier, c, cache_class::chat, 5).empty());
  EXPECT_EQ(tier.lru_order(), (hashes{a.hash, d.hash, c.hash}));
  EXPECT_EQ(put(tier, e, cache_class::chat, 6), (hashes{a.hash}));
  EXPECT_EQ(tier.lru_order(), (hashes{d.hash, c.hash, e.hash}));
  EXPECT_EQ(tier.num_blocks(), 3);
  EXPECT_EQ(tier.num_evictions(), 2);
  EXPECT_EQ(tier.num_hits(), 1);
  EXPECT_EQ(tier.get(b.hash, 7), nullptr);  // gone
  EXPECT_EQ(tier.num_hits(), 1);
  EXPECT_EQ(tier.longest_prefix(tokens, 7), 0);  // block 0 was evicted: no prefix
}

TEST(TierStore, ABlockWithItsWindowRowsReplacesTheCopyWithoutThemAndNeverTheOtherWay) {
  tier_store tier = make_tier(2);
  const std::vector<int32_t> tokens = token_range(8, 1);
  const kv_block whole = block_of(tokens, 0), other = block_of(tokens, 1);
  kv_block global = whole;  // a sliding-window model's block outside a window state: layer 1 only
  global.num_layers = 1;
  global.keys.resize(global.keys.size() / 2);
  global.values.resize(global.values.size() / 2);
  ASSERT_TRUE(is_consistent(global));
  EXPECT_TRUE(put(tier, global, cache_class::chat, 0).empty());
  EXPECT_TRUE(put(tier, other, cache_class::chat, 1).empty());
  EXPECT_TRUE(put(tier, whole, cache_class::agent, 2).empty());  // replaced in place, used again
  EXPECT_EQ(tier.lru_order(), (hashes{other.hash, whole.hash}));
  EXPECT_EQ(tier.get(whole.hash, 3)->num_layers, 2);
  EXPECT_TRUE(put(tier, global, cache_class::chat, 4).empty());  // fewer layers: only a use
  EXPECT_EQ(tier.get(whole.hash, 5)->keys, whole.keys);
  EXPECT_EQ(tier.num_blocks(), 2);
  EXPECT_EQ(tier.num_evictions(), 0);
}

TEST(TierStore, BlocksExpireByTheirClassesTtlOnTheCallersClock) {
  tier_store tier = make_tier(8);
  const std::vector<int32_t> agent_tokens = token_range(8, 1);
  const std::vector<int32_t> chat_tokens = token_range(8, 100);
  (void)put(tier, block_of(agent_tokens, 0), cache_class::agent, 0);
  (void)put(tier, block_of(agent_tokens, 1), cache_class::agent, 0);
  (void)put(tier, block_of(chat_tokens, 0), cache_class::chat, 0);
  const int64_t three_days = 3 * day_ns;
  EXPECT_EQ(tier.longest_prefix(agent_tokens, three_days - 1), 2);
  EXPECT_EQ(tier.expire(three_days - 1), 0);
  EXPECT_EQ(tier.longest_prefix(agent_tokens, three_days), 0);  // expired, not yet dropped
  EXPECT_EQ(tier.num_blocks(), 3);
  EXPECT_EQ(tier.expire(three_days), 2);
  tier.check_invariants();
  EXPECT_EQ(tier.num_blocks(), 1);
  EXPECT_EQ(tier.longest_prefix(chat_tokens, three_days), 1);
  EXPECT_NE(tier.get(block_of(chat_tokens, 0).hash, 7 * day_ns - 1), nullptr);  // a use: 7 days more
  EXPECT_NE(tier.get(block_of(chat_tokens, 0).hash, 14 * day_ns - 2), nullptr);
  EXPECT_EQ(tier.get(block_of(chat_tokens, 0).hash, 21 * day_ns - 2), nullptr);  // expired: dropped
  tier.check_invariants();
  EXPECT_EQ(tier.num_blocks(), 0);
  EXPECT_EQ(tier.num_expirations(), 3);
  EXPECT_EQ(tier.num_hits(), 2);
}

TEST(TierStore, TtlsAreConfigurableAndARePutTakesTheNewClass) {
  tier_store tier = make_tier(8, /*chat_ttl_ns=*/100, /*agent_ttl_ns=*/10);
  const kv_block b = block_of(token_range(4, 1), 0);
  (void)put(tier, b, cache_class::agent, 0);
  EXPECT_EQ(tier.expire(9), 0);
  (void)put(tier, b, cache_class::chat, 9);  // used again as chat: alive until 109
  EXPECT_EQ(tier.expire(108), 0);
  EXPECT_EQ(tier.expire(109), 1);
  EXPECT_EQ(tier.ttl_ns(cache_class::agent), 10);
  EXPECT_EQ(tier.ttl_ns(cache_class::chat), 100);
}

TEST(TierStore, AFullTierDropsExpiredBlocksBeforeEvictingLiveOnes) {
  tier_store tier = make_tier(2, /*chat_ttl_ns=*/100, /*agent_ttl_ns=*/10);
  const std::vector<int32_t> tokens = token_range(12, 1);
  const kv_block a = block_of(tokens, 0), b = block_of(tokens, 1), c = block_of(tokens, 2);
  (void)put(tier, a, cache_class::chat, 0);
  (void)put(tier, b, cache_class::agent, 1);  // expires at 11, though more recent than a
  EXPECT_TRUE(put(tier, c, cache_class::chat, 11).empty());
  EXPECT_EQ(tier.lru_order(), (hashes{a.hash, c.hash}));
  EXPECT_EQ(tier.num_expirations(), 1);
  EXPECT_EQ(tier.num_evictions(), 0);
  // An expired copy of the block being put is replaced, not used again.
  (void)put(tier, a, cache_class::agent, 100);  // a expired at 100
  EXPECT_EQ(tier.lru_order(), (hashes{c.hash, a.hash}));
  EXPECT_EQ(tier.num_expirations(), 2);
}

TEST(TierStore, AnEvictedBlockCarriesTheClassOfItsLastUse) {
  tier_store tier = make_tier(1);
  const std::vector<int32_t> tokens = token_range(12, 1);
  const kv_block a = block_of(tokens, 0), b = block_of(tokens, 1), c = block_of(tokens, 2);
  (void)put(tier, a, cache_class::agent, 0);
  std::vector<evicted_tier_block> evicted = tier.put(b, cache_class::chat, 1);
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].block.hash, a.hash);
  EXPECT_EQ(evicted[0].cls, cache_class::agent);
  (void)put(tier, b, cache_class::agent, 2);  // used again as agent
  evicted = tier.put(c, cache_class::chat, 3);
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].block.hash, b.hash);
  EXPECT_EQ(evicted[0].cls, cache_class::agent);
  tier.check_invariants();
}

TEST(TierStore, LongestPrefixFollowsTheChainAndStopsAtAGap) {
  tier_store tier = make_tier(8);
  const std::vector<int32_t> tokens = token_range(13, 1);  // 3 full blocks and 1 token
  (void)put(tier, block_of(tokens, 0), cache_class::chat, 0);
  (void)put(tier, block_of(tokens, 2), cache_class::chat, 0);
  EXPECT_EQ(tier.longest_prefix(tokens, 0), 1);  // block 1 is missing: block 2 cannot count
  (void)put(tier, block_of(tokens, 1), cache_class::chat, 0);
  EXPECT_EQ(tier.longest_prefix(tokens, 0), 3);
  std::vector<int32_t> other = tokens;
  other[5] = 99;  // block 1 differs: so does every later hash
  EXPECT_EQ(tier.longest_prefix(other, 0), 1);
  EXPECT_EQ(tier.longest_prefix({}, 0), 0);
}

TEST(TierStore, GetPrefixCopiesTheBlocksAfterAnEnginesOwnPrefixAndUsesThem) {
  tier_store tier = make_tier(8);
  const std::vector<int32_t> tokens = token_range(17, 1);  // 4 full blocks and 1 token
  for (int32_t i = 0; i < 3; i++) (void)put(tier, block_of(tokens, i), cache_class::agent, 0);
  const kv_block b1 = block_of(tokens, 1), b2 = block_of(tokens, 2);
  EXPECT_EQ(tier.lru_order(), (hashes{block_of(tokens, 0).hash, b1.hash, b2.hash}));
  // From block 1 on, at most 3: blocks 1 and 2 (block 3 is not held), each a use.
  const std::vector<kv_block> got = tier.get_prefix(tokens, 1, 3, day_ns);
  tier.check_invariants();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(testing::same_block(got[0], b1));
  EXPECT_TRUE(testing::same_block(got[1], b2));
  EXPECT_EQ(tier.lru_order(), (hashes{block_of(tokens, 0).hash, b1.hash, b2.hash}));
  EXPECT_EQ(tier.num_hits(), 2);
  // The use restarted the agent lifetime of blocks 1 and 2 only: at 3 days block 0 is gone.
  EXPECT_EQ(tier.get_prefix(tokens, 0, 4, 3 * day_ns).size(), 0u);
  EXPECT_EQ(tier.get_prefix(tokens, 1, 4, 3 * day_ns).size(), 2u);
  EXPECT_EQ(tier.get_prefix(tokens, 1, 1, 3 * day_ns).size(), 1u);  // at most num_blocks_max
  EXPECT_EQ(tier.get_prefix(tokens, 1, 0, 3 * day_ns).size(), 0u);
  EXPECT_EQ(tier.get_prefix(tokens, 9, 4, 3 * day_ns).size(), 0u);  // past the token list
  std::vector<int32_t> other = tokens;
  other[0] = 99;  // block 0 differs: so does every later hash
  EXPECT_EQ(tier.get_prefix(other, 1, 4, 3 * day_ns).size(), 0u);
  tier.check_invariants();
}

TEST(TierStore, GetPrefixTakesTheBlocksItLacksFromTheTierBelow) {
  tier_store tier = make_tier(8);
  const std::vector<int32_t> tokens = token_range(17, 1);  // 4 full blocks and 1 token
  (void)put(tier, block_of(tokens, 0), cache_class::chat, 0);
  (void)put(tier, block_of(tokens, 2), cache_class::chat, 0);
  std::vector<uint64_t> asked;
  const tier_store::lower_tier lower = [&](uint64_t hash, int64_t now_ns) -> std::optional<kv_block> {
    EXPECT_EQ(now_ns, 1);  // the fetch's time
    asked.push_back(hash);
    if (hash == block_of(tokens, 1).hash) return block_of(tokens, 1);
    if (hash == block_of(tokens, 3).hash) return block_of(token_range(17, 50), 3);  // another chain's: refused
    return std::nullopt;
  };
  const std::vector<kv_block> got = tier.get_prefix(tokens, 0, 4, 1, lower);
  ASSERT_EQ(got.size(), 3u);  // 0 here, 1 below, 2 here; 3 below is not the query's block
  for (int32_t i = 0; i < 3; i++) EXPECT_TRUE(testing::same_block(got[static_cast<size_t>(i)], block_of(tokens, i)));
  EXPECT_EQ(asked, (hashes{block_of(tokens, 1).hash, block_of(tokens, 3).hash}));  // only for what it lacks
  EXPECT_EQ(tier.num_hits(), 2);
  EXPECT_EQ(tier.num_blocks(), 2);  // a block from below is not kept here
  tier.check_invariants();
}

TEST(TierStore, ItsEventsAreTheNetChangeOfItsHashesSinceTheLastTake) {
  tier_store tier = make_tier(2, /*chat_ttl_ns=*/100);
  const std::vector<int32_t> tokens = token_range(16, 1);
  const kv_block a = block_of(tokens, 0), b = block_of(tokens, 1), c = block_of(tokens, 2), d = block_of(tokens, 3);
  const auto sorted = [](hashes h) {
    std::sort(h.begin(), h.end());
    return h;
  };
  (void)put(tier, a, cache_class::chat, 0);
  (void)put(tier, b, cache_class::chat, 1);
  cache_events e = tier.take_events();
  EXPECT_EQ(e.added, sorted({a.hash, b.hash}));
  EXPECT_TRUE(e.removed.empty());
  EXPECT_FALSE(e.overflowed);
  // c evicts a; a re-put of c and a get are uses, not changes.
  (void)put(tier, c, cache_class::chat, 2);
  (void)put(tier, c, cache_class::chat, 3);
  ASSERT_NE(tier.get(b.hash, 4), nullptr);
  e = tier.take_events();
  EXPECT_EQ(e.added, hashes{c.hash});
  EXPECT_EQ(e.removed, hashes{a.hash});
  // c out and in again within one take: neither list (4 events: the log's bound, 2 × capacity).
  (void)put(tier, d, cache_class::chat, 5);  // evicts c, the least recently used (b was got at 4)
  EXPECT_EQ(tier.hashes(), sorted({b.hash, d.hash}));
  (void)put(tier, c, cache_class::chat, 6);  // evicts b
  e = tier.take_events();
  EXPECT_FALSE(e.overflowed);
  EXPECT_EQ(e.added, hashes{d.hash});
  EXPECT_EQ(e.removed, hashes{b.hash});
  // Both expire (TTL 100).
  EXPECT_EQ(tier.expire(200), 2);
  tier.check_invariants();
  e = tier.take_events();
  EXPECT_TRUE(e.added.empty());
  EXPECT_EQ(e.removed, sorted({c.hash, d.hash}));
  EXPECT_TRUE(tier.hashes().empty());
  // Past 2 × (the blocks held + 8) events, here 20, the log is dropped: the take says so, and
  // the hashes are the truth. 11 puts into a tier of 2 are 2 + 9 × 2 = 20 events; 12 are 24.
  const std::vector<int32_t> many = token_range(96, 100);
  for (int32_t i = 0; i < 11; i++) (void)put(tier, block_of(many, i), cache_class::chat, 300 + i);
  e = tier.take_events();
  EXPECT_FALSE(e.overflowed);
  EXPECT_EQ(e.added, sorted({block_of(many, 9).hash, block_of(many, 10).hash}));
  EXPECT_TRUE(e.removed.empty());
  for (int32_t i = 11; i < 23; i++) (void)put(tier, block_of(many, i), cache_class::chat, 300 + i);
  e = tier.take_events();
  EXPECT_TRUE(e.overflowed);
  EXPECT_TRUE(e.added.empty() && e.removed.empty());
  EXPECT_EQ(tier.hashes(), sorted({block_of(many, 21).hash, block_of(many, 22).hash}));
  EXPECT_FALSE(tier.take_events().overflowed);
}

TEST(TierStoreDeathTest, MisuseIsAProgrammerError) {
  tier_store tier = make_tier(2);
  const kv_block b = block_of(token_range(4, 1), 0);
  (void)put(tier, b, cache_class::chat, 10);
  EXPECT_DEATH((void)tier.get(b.hash, 9), "the tier's clock went backwards");
  kv_block bad = b;
  bad.keys.pop_back();
  EXPECT_DEATH((void)tier.put(bad, cache_class::chat, 10), "an inconsistent block");
  auto other = tier_store::create({8, 2, 1, 1});
  ASSERT_TRUE(other.has_value());
  EXPECT_DEATH((void)other->put(b, cache_class::chat, 0), "a block of another size");
}

}  // namespace
}  // namespace troupe::kv
