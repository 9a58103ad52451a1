// The disk tier and its file format: the KvBlock Cap'n Proto codec (round trip, each kind of
// damage), and tiers::disk_tier — blocks served back after a restart, a corrupted or truncated
// file found by its checksum and removed (a miss), a full tier evicting the least recently used
// block files, blocks expiring by the class of their last use on a test's clock, a reopened
// tier evicting in its files' order of use, a block bigger than the tier refused, and random
// puts, gets and expiries against a naive model of the rule. Files go to a directory under the
// build tree, removed by each test (their shared parent stays).
#include "actors/edge/disk_tier.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "messages/kv_block.hpp"
#include "tests/support/kv_blocks.hpp"

namespace troupe::tiers {
namespace {

namespace fs = std::filesystem;
using testing::block_of;
using testing::same_block;
using testing::token_range;
using kv::cache_class;
using kv::day_ns;

constexpr int32_t block_size = 4;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

expected<kv::kv_block> decode(const std::vector<uint8_t>& bytes) {
  return msg::decode_kv_block(bytes.data(), bytes.size());
}

TEST(KvBlockCodec, RoundTripsEveryFieldAlignedOrNot) {
  const kv::kv_block b = block_of(token_range(8, 1), 1, block_size);
  const std::vector<uint8_t> bytes = msg::encode_kv_block(b);
  EXPECT_EQ(bytes.size() % 8, 0u);
  auto decoded = decode(bytes);
  ASSERT_TRUE(decoded) << decoded.error().message;
  EXPECT_TRUE(same_block(*decoded, b));
  std::vector<uint8_t> shifted(bytes.size() + 1);  // at an odd address: decoded from a copy
  std::copy(bytes.begin(), bytes.end(), shifted.begin() + 1);
  auto unaligned = msg::decode_kv_block(shifted.data() + 1, bytes.size());
  ASSERT_TRUE(unaligned) << unaligned.error().message;
  EXPECT_TRUE(same_block(*unaligned, b));
}

TEST(KvBlockCodec, ABlockOfAnotherKvTypeKeepsItsTypeAndItsBytes) {
  // 2 layers x 4 tokens of rows of 32 values in Q8_0: 8 rows of 34 bytes each for keys and values.
  kv::kv_block b = block_of(token_range(8, 1), 1, block_size);
  b.dtype = kv::kv_dtype::q8_0;
  b.kv_dim = 32;
  b.keys.assign(8 * 34, 7);
  b.values.assign(8 * 34, 9);
  ASSERT_TRUE(kv::is_consistent(b));
  const std::vector<uint8_t> bytes = msg::encode_kv_block(b);
  EXPECT_LT(bytes.size(), 2 * 8 * 34 + 160u);  // the rows' bytes and a header
  auto decoded = decode(bytes);
  ASSERT_TRUE(decoded) << decoded.error().message;
  EXPECT_TRUE(same_block(*decoded, b));
}

TEST(KvBlockCodec, FindsEachKindOfDamage) {
  const std::vector<uint8_t> bytes = msg::encode_kv_block(block_of(token_range(8, 1), 1, block_size));
  const auto message = [](const std::vector<uint8_t>& damaged) {
    auto d = decode(damaged);
    EXPECT_FALSE(d.has_value());
    if (d) return std::string();
    EXPECT_EQ(d.error().code, errc::malformed_file);
    return d.error().message;
  };
  EXPECT_EQ(message({}), "KV block: 0 bytes are not a Cap'n Proto message (not a whole number of words)");
  EXPECT_EQ(message(std::vector<uint8_t>(bytes.begin(), bytes.end() - 3)),
            "KV block: " + std::to_string(bytes.size() - 3) +
                " bytes are not a Cap'n Proto message (not a whole number of words)");
  const std::string truncated = message(std::vector<uint8_t>(bytes.begin(), bytes.end() - 8));
  EXPECT_EQ(truncated.rfind("KV block: not a Cap'n Proto message: ", 0), 0u) << truncated;
  std::vector<uint8_t> flipped = bytes;
  flipped.back() ^= 0x40;  // the last value's top byte
  EXPECT_EQ(message(flipped), "KV block: checksum mismatch");
  std::vector<uint8_t> longer = bytes;
  longer.resize(bytes.size() + 8, 0);
  EXPECT_EQ(message(longer), "KV block: trailing bytes after the message");
  EXPECT_FALSE(decode(std::vector<uint8_t>(64, 0xff)).has_value());
}

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::string(TROUPE_BUILD_DIR) + "/tests/tmp/disk_tier_test/" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }
  // The shared parent stays: ctest runs these tests as parallel processes, and removing it here
  // races another test's create_directories (ENOENT between creating the parent and the child).
  void TearDown() override { fs::remove_all(dir_); }

  disk_tier open(int64_t capacity_bytes = 1 << 20, int64_t now_ns = 0) {
    auto tier = disk_tier::open({dir_, capacity_bytes, block_size}, now_ns);
    // gtest reports the exception as this test's failure and runs the next test.
    if (!tier) throw std::runtime_error("cannot open the tier: " + tier.error().message);
    tier->check_invariants();
    return std::move(*tier);
  }

  /// Puts blocks 0..n-1 of `tokens_` as chat, block i at time i.
  void put_blocks(disk_tier& tier, int32_t n) {
    for (int32_t i = 0; i < n; ++i) {
      auto ok = tier.put(block_of(tokens_, i, block_size), cache_class::chat, i);
      ASSERT_TRUE(ok) << ok.error().message;
      EXPECT_EQ(*ok, 0);
      tier.check_invariants();
    }
  }

  /// Puts `b` and checks; returns how many blocks it evicted.
  static int64_t put(disk_tier& tier, const kv::kv_block& b, cache_class cls, int64_t now_ns) {
    auto evicted = tier.put(b, cls, now_ns);
    EXPECT_TRUE(evicted) << evicted.error().message;
    tier.check_invariants();
    return evicted.value_or(-1);
  }

  [[nodiscard]] kv::kv_block block(int32_t i) const { return block_of(tokens_, i, block_size); }
  /// Block i of a second chain, for a fourth block.
  [[nodiscard]] kv::kv_block other(int32_t i) const { return block_of(token_range(8, 100), i, block_size); }
  /// Every block file is the same size (the same dimensions): capacities are counted in them.
  [[nodiscard]] int64_t file_bytes() const { return static_cast<int64_t>(msg::encode_kv_block(block(0)).size()); }

  std::string dir_;
  const std::vector<int32_t> tokens_ = token_range(13, 1);  // 3 full blocks and 1 token
};

TEST_F(DiskTierTest, StoresOneFilePerBlockAndServesItBack) {
  disk_tier tier = open();
  put_blocks(tier, 3);
  EXPECT_EQ(tier.num_blocks(), 3);
  int64_t bytes = 0;
  for (int32_t i = 0; i < 3; ++i) {
    const std::vector<uint8_t> file = read_bytes(tier.path_of(block(i).hash));
    EXPECT_EQ(file, msg::encode_kv_block(block(i)));  // the file is the message, byte for byte
    bytes += static_cast<int64_t>(file.size());
    const auto got = tier.get(block(i).hash, 3);
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(same_block(*got, block(i)));
  }
  EXPECT_EQ(tier.num_bytes(), bytes);
  EXPECT_EQ(fs::path(tier.path_of(0x00ab)).filename().string(), "00000000000000ab.kvblock");
  EXPECT_EQ(tier.longest_prefix(tokens_, 3), 3);
  EXPECT_FALSE(tier.get(12345, 3).has_value());
  auto again = tier.put(block(1), cache_class::chat, 3);  // held: nothing written
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, 0);
  EXPECT_EQ(tier.num_bytes(), bytes);
  tier.check_invariants();
}

TEST_F(DiskTierTest, ReopenedAfterARestartServesTheSameBlocks) {
  int64_t bytes = 0;
  {
    disk_tier tier = open();
    put_blocks(tier, 3);
    bytes = tier.num_bytes();
  }
  write_bytes(dir_ + "/0000000000000001.kvblock.tmp", {1, 2, 3});  // a write cut short
  write_bytes(dir_ + "/notes.txt", {4, 5});                        // not the tier's
  disk_tier tier = open();
  EXPECT_EQ(tier.num_blocks(), 3);
  EXPECT_EQ(tier.num_bytes(), bytes);
  EXPECT_EQ(tier.num_corrupt_blocks(), 0);
  EXPECT_EQ(tier.longest_prefix(tokens_, 3), 3);
  for (int32_t i = 0; i < 3; ++i) {
    const auto got = tier.get(block(i).hash, 3);
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(same_block(*got, block(i)));
  }
  EXPECT_FALSE(fs::exists(dir_ + "/0000000000000001.kvblock.tmp"));
  EXPECT_TRUE(fs::exists(dir_ + "/notes.txt"));
}

TEST_F(DiskTierTest, ADamagedFileIsAMissAndIsRemoved) {
  disk_tier tier = open();
  put_blocks(tier, 3);
  const std::string flipped = tier.path_of(block(1).hash);
  std::vector<uint8_t> bytes = read_bytes(flipped);
  bytes.back() ^= 0x40;
  write_bytes(flipped, bytes);
  const std::string truncated = tier.path_of(block(2).hash);
  bytes = read_bytes(truncated);
  write_bytes(truncated, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(bytes.size() / 2)));
  // The index still lists them (damage after open is found on reading), so the prefix
  // lookup counts them until a read finds out.
  EXPECT_FALSE(tier.get(block(2).hash, 3).has_value());
  EXPECT_FALSE(tier.get(block(1).hash, 3).has_value());
  tier.check_invariants();
  EXPECT_FALSE(fs::exists(flipped));
  EXPECT_FALSE(fs::exists(truncated));
  EXPECT_EQ(tier.num_corrupt_blocks(), 2);
  EXPECT_EQ(tier.num_blocks(), 1);
  EXPECT_EQ(tier.longest_prefix(tokens_, 3), 1);  // the prefix past block 0 is recomputed
  EXPECT_TRUE(tier.get(block(0).hash, 3).has_value());
}

TEST_F(DiskTierTest, DamageFoundAtOpenDropsTheFile) {
  std::string truncated, sound;
  {
    disk_tier tier = open();
    put_blocks(tier, 3);
    truncated = tier.path_of(block(0).hash);
    sound = tier.path_of(block(1).hash);
  }
  std::vector<uint8_t> bytes = read_bytes(truncated);
  write_bytes(truncated, std::vector<uint8_t>(bytes.begin(), bytes.end() - 8));
  // A sound block under another block's name is damage too.
  const std::string misnamed = dir_ + "/00000000000000ab.kvblock";
  fs::copy_file(sound, misnamed);
  disk_tier tier = open();
  EXPECT_EQ(tier.num_corrupt_blocks(), 2);
  EXPECT_EQ(tier.num_blocks(), 2);
  EXPECT_FALSE(fs::exists(truncated));
  EXPECT_FALSE(fs::exists(misnamed));
  EXPECT_EQ(tier.longest_prefix(tokens_, 0), 0);  // block 0 is gone: no prefix
  EXPECT_TRUE(tier.contains(block(1).hash));
}

TEST_F(DiskTierTest, AFullTierEvictsTheLeastRecentlyUsedBlockFiles) {
  disk_tier tier = open(3 * file_bytes());  // room for three blocks exactly
  put_blocks(tier, 3);                      // 0, 1, 2 at times 0, 1, 2
  ASSERT_TRUE(tier.get(block(0).hash, 3).has_value());  // a use: 0 is the most recent
  EXPECT_EQ(tier.lru_order(), (std::vector<uint64_t>{block(1).hash, block(2).hash, block(0).hash}));
  EXPECT_EQ(put(tier, other(0), cache_class::chat, 4), 1);  // evicts 1
  EXPECT_FALSE(tier.contains(block(1).hash));
  EXPECT_FALSE(fs::exists(tier.path_of(block(1).hash)));
  for (const kv::kv_block& kept : {block(0), block(2), other(0)}) EXPECT_TRUE(fs::exists(tier.path_of(kept.hash)));
  EXPECT_EQ(tier.num_bytes(), 3 * file_bytes());
  EXPECT_EQ(tier.num_evictions(), 1);
  EXPECT_EQ(put(tier, block(2), cache_class::chat, 5), 0);  // held: a use, nothing evicted
  EXPECT_EQ(tier.lru_order(), (std::vector<uint64_t>{block(0).hash, other(0).hash, block(2).hash}));
  EXPECT_EQ(put(tier, block(1), cache_class::chat, 6), 1);  // evicts 0
  EXPECT_EQ(tier.lru_order(), (std::vector<uint64_t>{other(0).hash, block(2).hash, block(1).hash}));
  EXPECT_FALSE(fs::exists(tier.path_of(block(0).hash)));
  EXPECT_FALSE(tier.get(block(0).hash, 7).has_value());
  EXPECT_EQ(tier.longest_prefix(tokens_, 7), 0);  // block 0 is gone: no prefix
  EXPECT_EQ(tier.num_evictions(), 2);
  EXPECT_EQ(tier.num_expirations(), 0);
}

TEST_F(DiskTierTest, ABlockBiggerThanTheWholeTierIsRefusedAndChangesNothing) {
  disk_tier tier = open(file_bytes() - 1);
  auto refused = tier.put(block(0), cache_class::chat, 0);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, errc::overloaded);
  EXPECT_EQ(refused.error().message, "the disk tier " + dir_ + " cannot hold a block of " +
                                         std::to_string(file_bytes()) + " bytes: its capacity is " +
                                         std::to_string(file_bytes() - 1) + " bytes");
  EXPECT_FALSE(fs::exists(tier.path_of(block(0).hash)));
  EXPECT_EQ(tier.num_blocks(), 0);
  EXPECT_EQ(tier.num_bytes(), 0);
  EXPECT_EQ(tier.num_evictions(), 0);
  tier.check_invariants();
}

TEST_F(DiskTierTest, BlocksExpireByTheClassOfTheirLastUse) {
  disk_tier tier = open();
  const std::vector<int32_t> agent_tokens = token_range(8, 100);
  EXPECT_EQ(put(tier, block_of(agent_tokens, 0, block_size), cache_class::agent, 0), 0);
  EXPECT_EQ(put(tier, block_of(agent_tokens, 1, block_size), cache_class::agent, 0), 0);
  EXPECT_EQ(put(tier, block(0), cache_class::chat, 0), 0);
  EXPECT_EQ(put(tier, block(1), cache_class::agent, 0), 0);
  EXPECT_EQ(put(tier, block(1), cache_class::chat, day_ns), 0);  // used again as chat: 7 days from day 1
  const int64_t three_days = 3 * day_ns;
  EXPECT_EQ(tier.longest_prefix(agent_tokens, three_days - 1), 2);
  EXPECT_EQ(tier.longest_prefix(agent_tokens, three_days), 0);  // expired, not yet removed
  EXPECT_EQ(tier.num_blocks(), 4);
  EXPECT_EQ(tier.expire(three_days), 2);  // 3 days pass: the agent blocks go, the chat blocks stay
  EXPECT_FALSE(fs::exists(tier.path_of(block_of(agent_tokens, 0, block_size).hash)));
  EXPECT_FALSE(fs::exists(tier.path_of(block_of(agent_tokens, 1, block_size).hash)));
  EXPECT_EQ(tier.num_blocks(), 2);
  EXPECT_EQ(tier.num_bytes(), 2 * file_bytes());
  EXPECT_EQ(tier.longest_prefix(tokens_, three_days), 2);
  // A get keeps the block's own class: chat, 7 more days from each use.
  EXPECT_TRUE(tier.get(block(0).hash, 7 * day_ns - 1).has_value());
  EXPECT_EQ(tier.longest_prefix(tokens_, 8 * day_ns - 1), 2);  // block 1: alive until day 8
  EXPECT_EQ(tier.longest_prefix(tokens_, 8 * day_ns), 1);
  EXPECT_FALSE(tier.get(block(1).hash, 8 * day_ns).has_value());  // expired: removed
  EXPECT_FALSE(fs::exists(tier.path_of(block(1).hash)));
  EXPECT_TRUE(tier.get(block(0).hash, 14 * day_ns - 2).has_value());
  EXPECT_FALSE(tier.get(block(0).hash, 21 * day_ns - 2).has_value());
  EXPECT_EQ(tier.num_blocks(), 0);
  EXPECT_EQ(tier.num_expirations(), 4);
  EXPECT_EQ(tier.num_evictions(), 0);
  tier.check_invariants();
}

TEST_F(DiskTierTest, ExpiredBlocksMakeRoomBeforeTheLeastRecentlyUsed) {
  auto opened = disk_tier::open({dir_, 2 * file_bytes(), block_size, /*chat_ttl_ns=*/100, /*agent_ttl_ns=*/10}, 0);
  ASSERT_TRUE(opened) << opened.error().message;
  disk_tier& tier = *opened;
  EXPECT_EQ(put(tier, block(0), cache_class::chat, 0), 0);
  EXPECT_EQ(put(tier, block(1), cache_class::agent, 1), 0);  // expires at 11, though more recent than 0
  EXPECT_EQ(put(tier, block(2), cache_class::chat, 11), 0);  // 1 expired: no eviction
  EXPECT_EQ(tier.num_expirations(), 1);
  EXPECT_EQ(tier.num_evictions(), 0);
  EXPECT_EQ(tier.lru_order(), (std::vector<uint64_t>{block(0).hash, block(2).hash}));
  EXPECT_EQ(put(tier, block(1), cache_class::chat, 100), 0);  // 0 expired at 100: it makes the room
  EXPECT_EQ(tier.num_expirations(), 2);
  EXPECT_EQ(tier.lru_order(), (std::vector<uint64_t>{block(2).hash, block(1).hash}));
  EXPECT_EQ(put(tier, block(0), cache_class::chat, 101), 1);  // none expired: 2 is evicted
  EXPECT_EQ(tier.lru_order(), (std::vector<uint64_t>{block(1).hash, block(0).hash}));
  EXPECT_EQ(tier.num_evictions(), 1);
}

TEST_F(DiskTierTest, AReopenedTierEvictsInItsFilesOrderOfUse) {
  {
    disk_tier tier = open();
    put_blocks(tier, 3);
    // The files' stamps say: written in the order 0, 1, 2, a day ago (a test cannot wait for
    // the file system's clock to tick between writes), 1 and 2 in the same instant.
    const fs::file_time_type day_ago = fs::last_write_time(tier.path_of(block(0).hash)) - std::chrono::hours(24);
    fs::last_write_time(tier.path_of(block(0).hash), day_ago - std::chrono::hours(2));
    fs::last_write_time(tier.path_of(block(1).hash), day_ago - std::chrono::hours(1));
    fs::last_write_time(tier.path_of(block(2).hash), day_ago - std::chrono::hours(1));
    ASSERT_TRUE(tier.get(block(0).hash, 3).has_value());  // a use: touches its file
  }
  // Reopened at another clock's time 10 with room for one block: 1 and 2 (same stamp: by name,
  // which is by hash), then 0; each starts a chat lifetime at open.
  disk_tier tier = open(file_bytes(), 10);
  const uint64_t first = std::min(block(1).hash, block(2).hash);
  const uint64_t second = std::max(block(1).hash, block(2).hash);
  EXPECT_EQ(tier.lru_order(), (std::vector<uint64_t>{first, second, block(0).hash}));
  EXPECT_EQ(tier.num_bytes(), 3 * file_bytes());  // found beyond the capacity: counted
  EXPECT_EQ(tier.longest_prefix(tokens_, 10 + 7 * day_ns - 1), 3);
  EXPECT_EQ(tier.longest_prefix(tokens_, 10 + 7 * day_ns), 0);
  EXPECT_TRUE(tier.get(first, 11).has_value());  // a use (a lookup is not: the tier's time was 10)
  EXPECT_EQ(tier.lru_order(), (std::vector<uint64_t>{second, block(0).hash, first}));
  EXPECT_EQ(put(tier, other(0), cache_class::chat, 12), 3);  // down to the capacity: all three go
  EXPECT_EQ(tier.lru_order(), (std::vector<uint64_t>{other(0).hash}));
  for (int32_t i = 0; i < 3; ++i) EXPECT_FALSE(fs::exists(tier.path_of(block(i).hash)));
  EXPECT_EQ(tier.num_bytes(), file_bytes());
  EXPECT_EQ(tier.num_evictions(), 3);
}

/// A naive model of the disk tier's rule: the held blocks with their last use, class and use
/// sequence, searched linearly.
struct naive_tier {
  struct held {
    uint64_t hash;
    cache_class cls;
    int64_t last_use_ns;
    uint64_t seq;  // larger = more recent
  };
  int64_t capacity_blocks;
  int64_t chat_ttl_ns, agent_ttl_ns;
  std::vector<held> blocks;
  uint64_t next_seq = 0;

  [[nodiscard]] bool alive(const held& h, int64_t now) const {
    return now < h.last_use_ns + (h.cls == cache_class::agent ? agent_ttl_ns : chat_ttl_ns);
  }
  held* find(uint64_t hash) {
    for (held& h : blocks)
      if (h.hash == hash) return &h;
    return nullptr;
  }
  void erase(uint64_t hash) {
    blocks.erase(std::remove_if(blocks.begin(), blocks.end(), [&](const held& h) { return h.hash == hash; }),
                 blocks.end());
  }
  int64_t expire(int64_t now) {
    const auto n = static_cast<int64_t>(blocks.size());
    blocks.erase(std::remove_if(blocks.begin(), blocks.end(), [&](const held& h) { return !alive(h, now); }),
                 blocks.end());
    return n - static_cast<int64_t>(blocks.size());
  }
  int64_t put(uint64_t hash, cache_class cls, int64_t now) {
    if (held* h = find(hash); h && alive(*h, now)) {
      *h = {hash, cls, now, next_seq++};
      return 0;
    }
    (void)expire(now);
    int64_t evicted = 0;
    const auto by_seq = [](const held& a, const held& b) { return a.seq < b.seq; };
    for (; static_cast<int64_t>(blocks.size()) >= capacity_blocks; evicted++)
      erase(std::min_element(blocks.begin(), blocks.end(), by_seq)->hash);
    blocks.push_back({hash, cls, now, next_seq++});
    return evicted;
  }
  bool get(uint64_t hash, int64_t now) {
    held* h = find(hash);
    if (h == nullptr) return false;
    if (!alive(*h, now)) {
      erase(hash);
      return false;
    }
    h->last_use_ns = now;
    h->seq = next_seq++;
    return true;
  }
  [[nodiscard]] std::vector<uint64_t> lru_order() const {
    std::vector<held> sorted = blocks;
    std::sort(sorted.begin(), sorted.end(), [](const held& a, const held& b) { return a.seq < b.seq; });
    std::vector<uint64_t> order;
    for (const held& h : sorted) order.push_back(h.hash);
    return order;
  }
};

TEST_F(DiskTierTest, MatchesANaiveModelOverRandomPutsGetsAndExpiries) {
  const std::vector<int32_t> tokens = token_range(8 * block_size, 1);  // 8 blocks
  std::vector<kv::kv_block> pool;
  for (int32_t i = 0; i < 8; ++i) pool.push_back(block_of(tokens, i, block_size));
  for (const uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    fs::remove_all(dir_);
    auto opened = disk_tier::open({dir_, 3 * file_bytes(), block_size, /*chat_ttl_ns=*/50, /*agent_ttl_ns=*/20}, 0);
    ASSERT_TRUE(opened) << opened.error().message;
    disk_tier& tier = *opened;
    naive_tier model{3, 50, 20, {}, 0};
    std::mt19937_64 rng(seed);
    int64_t now = 0;
    for (int32_t step = 0; step < 300; ++step) {
      now += static_cast<int64_t>(rng() % 8);
      const kv::kv_block& b = pool[rng() % pool.size()];
      const cache_class cls = rng() % 2 == 0 ? cache_class::chat : cache_class::agent;
      switch (rng() % 3) {
        case 0: ASSERT_EQ(put(tier, b, cls, now), model.put(b.hash, cls, now)) << "step " << step; break;
        case 1: ASSERT_EQ(tier.get(b.hash, now).has_value(), model.get(b.hash, now)) << "step " << step; break;
        default: ASSERT_EQ(tier.expire(now), model.expire(now)) << "step " << step; break;
      }
      tier.check_invariants();
      ASSERT_EQ(tier.lru_order(), model.lru_order()) << "step " << step;
      ASSERT_EQ(tier.num_bytes(), tier.num_blocks() * file_bytes());
    }
    EXPECT_GT(tier.num_evictions(), 0);  // the run reached both paths
    EXPECT_GT(tier.num_expirations(), 0);
  }
}

TEST_F(DiskTierTest, OpenRejectsEachBadConfiguration) {
  const auto message = [](const disk_tier_config& c) { return disk_tier::open(c, 0).error().message; };
  EXPECT_EQ(message({"", 1, 4}), "the disk tier's directory is empty");
  EXPECT_EQ(message({dir_, 0, 4}), "capacity_bytes must be > 0, got 0");
  EXPECT_EQ(message({dir_, 1, 0}), "block_size must be > 0, got 0");
  EXPECT_EQ(message({dir_, 1, 4, 0, 1}), "chat_ttl_ns must be > 0, got 0");
  EXPECT_EQ(message({dir_, 1, 4, 1, -1}), "agent_ttl_ns must be > 0, got -1");
  const disk_tier_config defaults;
  EXPECT_EQ(defaults.chat_ttl_ns, 604'800'000'000'000);   // 7 days
  EXPECT_EQ(defaults.agent_ttl_ns, 259'200'000'000'000);  // 3 days
  fs::create_directories(dir_);
  write_bytes(dir_ + "/file", {1});
  auto under_a_file = disk_tier::open({dir_ + "/file/tier", 1, 4}, 0);
  ASSERT_FALSE(under_a_file);
  EXPECT_EQ(under_a_file.error().code, errc::io_error);
  EXPECT_EQ(under_a_file.error().message.rfind("cannot create " + dir_ + "/file/tier: ", 0), 0u);
}

TEST_F(DiskTierTest, BlocksOfAnotherSizeAreLeftAlone) {
  {
    disk_tier tier = open();
    put_blocks(tier, 1);
  }
  auto other = disk_tier::open({dir_, 1 << 20, 2 * block_size}, 0);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->num_blocks(), 0);
  EXPECT_EQ(other->num_corrupt_blocks(), 0);
  EXPECT_TRUE(fs::exists(other->path_of(block(0).hash)));
}

TEST(DiskTierDeathTest, AnInconsistentBlockIsAProgrammerError) {
  const std::string dir = std::string(TROUPE_BUILD_DIR) + "/tests/tmp/disk_tier_test/death";
  auto tier = disk_tier::open({dir, 1 << 20, block_size}, 5);
  ASSERT_TRUE(tier);
  kv::kv_block bad = block_of(token_range(4, 1), 0, block_size);
  bad.values.pop_back();
  EXPECT_DEATH((void)tier->put(bad, cache_class::chat, 5), "an inconsistent block");
  EXPECT_DEATH((void)tier->get(1, 4), "the tier's clock went backwards");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::tiers
