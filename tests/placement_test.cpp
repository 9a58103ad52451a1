// balance::place: the load balancer's policy with exact expected placements (tiers, the decode
// score, ties broken by engine index, dead engines routed around).
#include "runtime/balance/placement.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace troupe::balance {
namespace {

using tiers = std::vector<std::vector<bool>>;

engine_load engine(engine_kind kind, int64_t requests = 0, int64_t kv_tokens = 0, int64_t prefill_tokens = 0) {
  engine_load e;
  e.kind = kind;
  e.max_num_seqs = 100;
  e.kv_capacity_tokens = 1000;
  e.num_requests = requests;
  e.num_kv_tokens = kv_tokens;
  e.num_prefill_tokens = prefill_tokens;
  return e;
}

TEST(Placement, PromptLengthsFallIntoTiersByTheirBounds) {
  const std::vector<int32_t> bounds = {128, 512, 2048};
  EXPECT_EQ(tier_of(1, bounds), 0);
  EXPECT_EQ(tier_of(128, bounds), 0);
  EXPECT_EQ(tier_of(129, bounds), 1);
  EXPECT_EQ(tier_of(512, bounds), 1);
  EXPECT_EQ(tier_of(2048, bounds), 2);
  EXPECT_EQ(tier_of(2049, bounds), 3);
  EXPECT_EQ(tier_of(100000, bounds), 3);
  EXPECT_EQ(tier_of(7, {}), 0);  // no bounds: one tier
}

TEST(Placement, TiersAreSpreadOverPrefillEnginesInOrder) {
  EXPECT_EQ(assign_tiers(1, 4), (tiers{{true, true, true, true}}));
  EXPECT_EQ(assign_tiers(2, 4), (tiers{{true, true, false, false}, {false, false, true, true}}));
  EXPECT_EQ(assign_tiers(3, 4), (tiers{{true, false, false, false}, {false, true, false, false},
                                       {false, false, true, true}}));
  EXPECT_EQ(assign_tiers(4, 4), (tiers{{true, false, false, false}, {false, true, false, false},
                                       {false, false, true, false}, {false, false, false, true}}));
  EXPECT_EQ(assign_tiers(5, 4).at(4), (std::vector<bool>{true, false, false, false}));  // wraps
  EXPECT_TRUE(assign_tiers(0, 4).empty());
}

TEST(Placement, MixedEnginesBalanceRequestsAndCacheTokensTiesByIndex) {
  std::vector<engine_load> e = {engine(engine_kind::mixed), engine(engine_kind::mixed)};
  EXPECT_EQ(place(e, {}, 0, 10)->decode, 0u);  // a tie: the lower index
  EXPECT_FALSE(place(e, {}, 0, 10)->prefill.has_value());
  e[0].num_requests = 1;
  EXPECT_EQ(place(e, {}, 0, 10)->decode, 1u);
  // 10 requests (0.10 of the slots) vs 2 requests and 300 KV tokens (0.02 + 0.30): engine 0.
  e[0] = engine(engine_kind::mixed, 10, 0);
  e[1] = engine(engine_kind::mixed, 2, 300);
  EXPECT_EQ(place(e, {}, 0, 10)->decode, 0u);
  e[1].num_kv_tokens = 50;  // 0.02 + 0.05 < 0.10
  EXPECT_EQ(place(e, {}, 0, 10)->decode, 1u);
}

TEST(Placement, PrefillGoesToItsTierAndDecodeToTheLeastLoadedDecodeEngine) {
  // Engines: 0 prefill (tiers 0-1), 1 decode, 2 prefill (tiers 2-3), 3 decode.
  std::vector<engine_load> e = {engine(engine_kind::prefill), engine(engine_kind::decode, 3),
                                engine(engine_kind::prefill), engine(engine_kind::decode, 2)};
  const tiers t = assign_tiers(2, 4);
  auto p = place(e, t, tier_of(100, {128, 512, 2048}), 100);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->prefill, std::optional<size_t>(0));
  EXPECT_EQ(p->decode, 3u);
  p = place(e, t, tier_of(3000, {128, 512, 2048}), 3000);
  EXPECT_EQ(p->prefill, std::optional<size_t>(2));
  // Queued prefill tokens do not move a request out of its tier while the tier has a live engine.
  e[2].num_prefill_tokens = 100000;
  EXPECT_EQ(place(e, t, 3, 3000)->prefill, std::optional<size_t>(2));
  // A one-token prompt has nothing to prefill: it runs whole on a decode engine.
  p = place(e, t, 0, 1);
  EXPECT_FALSE(p->prefill.has_value());
  EXPECT_EQ(p->decode, 3u);
}

TEST(Placement, WithinATierTheFewestQueuedPrefillTokensWin) {
  std::vector<engine_load> e = {engine(engine_kind::prefill, 0, 0, 500), engine(engine_kind::prefill, 0, 0, 200),
                                engine(engine_kind::prefill, 0, 0, 200), engine(engine_kind::decode)};
  const tiers one_tier = assign_tiers(3, 1);  // every prefill engine serves the only tier
  EXPECT_EQ(place(e, one_tier, 0, 50)->prefill, std::optional<size_t>(1));  // 200 = 200: lower index
  e[1].alive = false;
  EXPECT_EQ(place(e, one_tier, 0, 50)->prefill, std::optional<size_t>(2));
}

TEST(Placement, DeadEnginesAreRoutedAround) {
  std::vector<engine_load> e = {engine(engine_kind::prefill), engine(engine_kind::decode),
                                engine(engine_kind::decode, 5), engine(engine_kind::prefill)};
  const tiers t = assign_tiers(2, 2);  // engine 0: tier 0, engine 3: tier 1
  e[0].alive = false;  // tier 0 has no live engine: any live prefill engine takes it
  e[1].alive = false;
  auto p = place(e, t, 0, 10);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->prefill, std::optional<size_t>(3));
  EXPECT_EQ(p->decode, 2u);
  e[3].alive = false;  // no prefill engine left: decode engines prefill themselves
  p = place(e, t, 0, 10);
  EXPECT_FALSE(p->prefill.has_value());
  EXPECT_EQ(p->decode, 2u);
  e[2].alive = false;
  p = place(e, t, 0, 10);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().code, errc::unavailable);
}

}  // namespace
}  // namespace troupe::balance
