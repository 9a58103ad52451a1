// kv::hash_index: the prefix cache's open-addressing hash -> block table, against std::map as a
// model under random inserts and erases with many colliding home slots (backward-shift deletion
// must keep every entry reachable).
#include "runtime/kv/hash_index.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace troupe::kv {
namespace {

TEST(HashIndex, InsertFindEraseExactly) {
  hash_index index(4);  // 16 slots
  EXPECT_EQ(index.find(7), hash_index::none);
  EXPECT_TRUE(index.insert(7, 0));
  EXPECT_FALSE(index.insert(7, 1));  // present: unchanged
  EXPECT_EQ(index.find(7), 0);
  EXPECT_TRUE(index.insert(7 + 16, 1));  // same home slot: probes on
  EXPECT_TRUE(index.insert(8, 2));       // home taken by 7 + 16: probes on
  EXPECT_EQ(index.size(), 3u);
  index.erase(7);  // 7 + 16 and 8 shift back
  index.check_invariants();
  EXPECT_EQ(index.find(7), hash_index::none);
  EXPECT_EQ(index.find(7 + 16), 1);
  EXPECT_EQ(index.find(8), 2);
  EXPECT_EQ(index.size(), 2u);
}

TEST(HashIndex, MatchesAMapUnderRandomChurnWithWrapAround) {
  for (uint64_t seed = 1; seed <= 50; seed++) {
    std::mt19937_64 rng(seed);
    hash_index index(32);  // 64 slots
    std::map<uint64_t, int32_t> model;
    for (int step = 0; step < 2000; step++) {
      // Few distinct homes (near the end, to wrap around) and many keys per home.
      const uint64_t key = (60 + rng() % 8) + 64 * (rng() % 6);
      if (model.count(key) && rng() % 2 == 0) {
        index.erase(key);
        model.erase(key);
      } else if (!model.count(key) && model.size() < 32) {
        const int32_t value = static_cast<int32_t>(rng() % 1000);
        EXPECT_TRUE(index.insert(key, value));
        model[key] = value;
      }
      ASSERT_EQ(index.size(), model.size());
      for (const auto& [k, v] : model) ASSERT_EQ(index.find(k), v) << "seed " << seed << " step " << step;
      index.check_invariants();
    }
    size_t seen = 0;
    index.for_each([&](uint64_t k, int32_t v) {
      EXPECT_EQ(model.at(k), v);
      seen++;
    });
    EXPECT_EQ(seen, model.size());
  }
}

}  // namespace
}  // namespace troupe::kv
