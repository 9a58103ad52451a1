// balance::balancer_policy without an actor system: the load estimate (report + unseen work),
// exact request counts, placement across tiers, lost engines and the heartbeat.
#include "runtime/balance/balancer_policy.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <tuple>
#include <vector>

namespace troupe::balance {
namespace {

engine_spec spec(engine_kind kind, const std::string& name) { return engine_spec{kind, 10, 1000, 16, name}; }

/// (requests, kv tokens, queued prefill tokens, alive) of engine `i`.
std::tuple<int64_t, int64_t, int64_t, bool> load_of(const balancer_policy& h, size_t i) {
  const engine_load& l = h.load(i);
  return {l.num_requests, l.num_kv_tokens, l.num_prefill_tokens, l.alive};
}

using L = std::tuple<int64_t, int64_t, int64_t, bool>;

TEST(BalancerPolicy, PlacesWithItsRouterAndNumbersRequestsInPlacementOrder) {
  balancer_policy h({spec(engine_kind::mixed, "m0"), spec(engine_kind::mixed, "m1"), spec(engine_kind::mixed, "m2")},
                  {}, 0, 0, router_options{"round_robin", 0});
  std::vector<size_t> got;
  for (request_key k = 1; k <= 4; k++) got.push_back(h.place(k, 100)->decode);
  EXPECT_EQ(got, (std::vector<size_t>{0, 1, 2, 0}));  // load would have sent the fourth to m1
  EXPECT_TRUE(h.mark_lost(1));
  EXPECT_EQ(h.place(5, 100)->decode, 2u);
  h.check_invariants();
}

TEST(BalancerPolicy, AnEngineKnownToDrainGetsNoNewWorkBeforeItsReportSaysSo) {
  balancer_policy h({spec(engine_kind::mixed, "m0"), spec(engine_kind::mixed, "m1")}, {}, 0, 0,
                  router_options{"round_robin", 0});
  EXPECT_EQ(h.place(1, 100)->decode, 0u);
  h.mark_draining(1);  // a request it forwarded says so; its report may still be on the way
  EXPECT_TRUE(h.load(1).alive);
  EXPECT_TRUE(h.load(1).draining);
  EXPECT_EQ(h.place(2, 100)->decode, 0u);
  EXPECT_EQ(h.place(3, 100)->decode, 0u);
  h.check_invariants();
}

TEST(BalancerPolicy, PrefixAffinityFindsThePromptsPlacedBeforeInItsDirectory) {
  engine_spec m0 = spec(engine_kind::mixed, "m0"), m1 = spec(engine_kind::mixed, "m1");
  m0.block_size = 8;  // the directory counts in the smallest block size: 4 tokens, 250 per engine
  m1.block_size = 4;
  balancer_policy h({m0, m1}, {}, 0, 0, router_options{"prefix_affinity", 0, 0.5});
  ASSERT_EQ(h.prefix_block_size(), 4);
  // Two prompts of two blocks at once: m0 (idle, the lower index), then m1 (m0 scores 0.108).
  EXPECT_EQ(h.place(1, 8, {11, 12})->decode, 0u);
  EXPECT_EQ(h.place(2, 8, {21, 22})->decode, 1u);
  h.check_invariants();
  EXPECT_EQ(h.prefixes().blocks_by_recency(0), (std::vector<uint64_t>{11, 12}));
  EXPECT_EQ(h.prefixes().blocks_by_recency(1), (std::vector<uint64_t>{21, 22}));
  EXPECT_TRUE(h.request_ended(1));
  EXPECT_TRUE(h.request_ended(2));
  // Both at 8/1000 now. Each prompt's continuation goes where its prefix is: 0.008 - 0.5 * 8/12.
  EXPECT_EQ(h.place(3, 12, {21, 22, 23})->decode, 1u);
  EXPECT_EQ(h.place(4, 12, {11, 12, 13})->decode, 0u);
  EXPECT_EQ(h.prefixes().blocks_by_recency(1), (std::vector<uint64_t>{21, 22, 23}));
  // A lost engine's prefixes are gone: the next continuation of 21 22 has nowhere else to go.
  EXPECT_TRUE(h.mark_lost(1));
  EXPECT_EQ(h.prefixes().num_placed_blocks(1), 0);
  EXPECT_EQ(h.place(5, 12, {21, 22, 24})->decode, 0u);
  h.check_invariants();
  // The hashes must cover the prompt's full blocks exactly (they come from the request actor).
  auto bad = h.place(6, 12, {21});
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, errc::invalid_argument);
  EXPECT_EQ(bad.error().message, "1 prefix hashes for a prompt of 12 tokens (expected 3)");
  EXPECT_FALSE(h.place(7, 11, {1, 2, 3}).has_value());  // 11 tokens: two full blocks
  EXPECT_TRUE(h.place(8, 11, {1, 2}).has_value());
  h.check_invariants();
}

TEST(BalancerPolicy, AnEnginesPoolReportsDecideWhichPrefixesItIsCreditedWith) {
  engine_spec m0 = spec(engine_kind::mixed, "m0"), m1 = spec(engine_kind::mixed, "m1");
  m0.block_size = m1.block_size = 4;  // 250 blocks each
  balancer_policy h({m0, m1}, {}, 0, 0, router_options{"prefix_affinity", 0, 0.5});
  ASSERT_TRUE(h.wants_cache_events(0) && h.wants_cache_events(1));
  EXPECT_EQ(h.place(1, 8, {11, 12})->decode, 0u);  // each engine's work item 1
  EXPECT_EQ(h.place(2, 8, {21, 22})->decode, 1u);
  EXPECT_TRUE(h.request_ended(1) && h.request_ended(2));
  // Both pools computed their prompt: their snapshots cover the placements.
  EXPECT_EQ(h.on_report(0, load_report{1, 0, 0, 0}, 5, pool_events{1, true, {11, 12}, {}}), report_outcome::taken);
  EXPECT_EQ(h.on_report(1, load_report{1, 0, 0, 0}, 5, pool_events{1, true, {21, 22}, {}}), report_outcome::taken);
  EXPECT_EQ(h.prefixes().num_placed_blocks(0), 0);
  EXPECT_EQ(h.prefixes().num_pool_blocks(1), 2);
  // m1's pool evicts 21 22: their continuation is credited nowhere and goes by load (a tie:
  // m0), not to m1 where it was placed.
  EXPECT_EQ(h.on_report(1, load_report{1, 0, 0, 0}, 6, pool_events{2, false, {}, {21, 22}}), report_outcome::taken);
  EXPECT_EQ(h.prefixes().cached_blocks(1, {21, 22, 23}), 0);
  EXPECT_EQ(h.place(3, 12, {21, 22, 23})->decode, 0u);
  // m0's pool still holds 11 12: busy as it is (0.112), it wins with them (0.112 - 0.5 * 8/12).
  EXPECT_EQ(h.prefixes().cached_blocks(0, {11, 12, 13}), 2);
  EXPECT_EQ(h.place(4, 12, {11, 12, 13})->decode, 0u);
  h.check_invariants();
  // From another process: more hashes than the pool has blocks, or a snapshot that removes.
  EXPECT_EQ(h.on_report(0, load_report{3, 2, 24, 0}, 7, pool_events{2, false, std::vector<uint64_t>(251, 1), {}}),
            report_outcome::ignored);
  EXPECT_EQ(h.on_report(0, load_report{3, 2, 24, 0}, 7, pool_events{2, true, {11}, {12}}), report_outcome::ignored);
  // A report missing (3 after 1): asked for a snapshot once, until it comes.
  EXPECT_EQ(h.on_report(0, load_report{3, 2, 24, 0}, 7, pool_events{3, false, {}, {}}), report_outcome::resync);
  EXPECT_EQ(h.prefixes().num_pool_blocks(0), 0);
  EXPECT_EQ(h.prefixes().cached_blocks(0, {11, 12, 13}), 3);  // out of sync: the placed prompts (request 4's)
  EXPECT_EQ(h.on_report(0, load_report{3, 2, 24, 0}, 8, pool_events{4, false, {}, {}}), report_outcome::taken);
  EXPECT_EQ(h.on_report(0, load_report{3, 2, 24, 0}, 9, pool_events{5, true, {11}, {}}), report_outcome::taken);
  EXPECT_EQ(h.prefixes().cached_blocks(0, {11, 12, 13}), 1);
  // A lost engine's reports change no set.
  EXPECT_TRUE(h.mark_lost(1));
  EXPECT_EQ(h.on_report(1, load_report{1, 0, 0, 0}, 10, pool_events{3, true, {21}, {}}), report_outcome::taken);
  EXPECT_EQ(h.prefixes().num_pool_blocks(1), 0);
  h.check_invariants();
}

TEST(BalancerPolicy, AnEngineOfAnotherBlockSizeIsCreditedWithItsPlacedPromptsOnly) {
  engine_spec m0 = spec(engine_kind::mixed, "m0"), m1 = spec(engine_kind::mixed, "m1");
  m0.block_size = 4;
  m1.block_size = 8;  // its chain hashes are not the directory's
  balancer_policy h({m0, m1}, {}, 0, 0, router_options{"prefix_affinity", 0, 0.5});
  EXPECT_TRUE(h.wants_cache_events(0));
  EXPECT_FALSE(h.wants_cache_events(1));
  EXPECT_EQ(h.on_report(1, load_report{0, 0, 0, 0}, 5, pool_events{1, true, {5}, {}}), report_outcome::taken);
  EXPECT_EQ(h.prefixes().num_pool_blocks(1), 0);
  EXPECT_FALSE(h.prefixes().in_sync(1));
  balancer_policy plain({m0}, {}, 0, 0);  // no prefixes at all
  EXPECT_FALSE(plain.wants_cache_events(0));
  EXPECT_EQ(plain.on_report(0, load_report{0, 0, 0, 0}, 5, pool_events{1, true, {5}, {}}), report_outcome::taken);
  h.check_invariants();
}

TEST(BalancerPolicy, ACacheTiersPrefixCountsForEveryEngineAndThePlacementNamesTheTierToFetchFrom) {
  // m0 has no tier, m1 and m2 share tier 0 (one node), m3 has tier 1; tier 2 is of another
  // block size (it reports nothing).
  engine_spec m0 = spec(engine_kind::mixed, "m0"), m1 = spec(engine_kind::mixed, "m1");
  engine_spec m2 = spec(engine_kind::mixed, "m2"), m3 = spec(engine_kind::mixed, "m3");
  m1.cache_tier = 0;
  m2.cache_tier = 0;
  m3.cache_tier = 1;
  balancer_policy h({m0, m1, m2, m3}, {}, 0, 0, router_options{"prefix_affinity", 0, 0.5},
                  {cache_tier_spec{4, 16}, cache_tier_spec{4, 16}, cache_tier_spec{4, 8}});
  ASSERT_EQ(h.num_cache_tiers(), 3u);
  EXPECT_TRUE(h.wants_tier_events(0));
  EXPECT_FALSE(h.wants_tier_events(2));
  ASSERT_EQ(h.on_tier_report(1, pool_events{1, true, {11, 12, 13}, {}}), report_outcome::taken);
  ASSERT_EQ(h.on_tier_report(0, pool_events{1, true, {11}, {}}), report_outcome::taken);
  // Every engine counts tier 1's 3 blocks: the tie goes to m0, which fetches from tier 1.
  auto p = h.place(1, 64, {11, 12, 13, 14});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->decode, 0u);
  EXPECT_EQ(p->cache_tier, std::optional<size_t>(1));
  // m0 is busier now: m1 (its own tier holds 1 block, tier 1 holds 3) is told tier 1.
  p = h.place(2, 64, {11, 12, 13, 14});
  EXPECT_EQ(p->decode, 1u);
  EXPECT_EQ(p->cache_tier, std::optional<size_t>(1));
  // m2 and m3 idle; the prefix only in m3's own tier: m2 (lower index) is told tier 1, m3 would not be.
  p = h.place(3, 64, {11, 12, 13, 14});
  EXPECT_EQ(p->decode, 2u);
  EXPECT_EQ(p->cache_tier, std::optional<size_t>(1));
  p = h.place(4, 64, {11, 12, 13, 14});
  EXPECT_EQ(p->decode, 3u);
  EXPECT_EQ(p->cache_tier, std::nullopt);  // its own tier holds the most: it asks that anyway
  // A prefix no tier holds names none.
  EXPECT_EQ(h.place(5, 64, {21, 22, 23, 24})->cache_tier, std::nullopt);
  h.check_invariants();
  // Reports that do not count: no such tier, one that does not report, over its capacity, a
  // removal in a snapshot, seq 0; a gap asks for a snapshot.
  EXPECT_EQ(h.on_tier_report(3, pool_events{2, true, {}, {}}), report_outcome::ignored);
  EXPECT_EQ(h.on_tier_report(-1, pool_events{2, true, {}, {}}), report_outcome::ignored);
  EXPECT_EQ(h.on_tier_report(2, pool_events{1, true, {1}, {}}), report_outcome::ignored);
  EXPECT_EQ(h.on_tier_report(1, pool_events{2, true, {1, 2, 3, 4, 5}, {}}), report_outcome::ignored);
  EXPECT_EQ(h.on_tier_report(1, pool_events{2, true, {1}, {2}}), report_outcome::ignored);
  EXPECT_EQ(h.on_tier_report(1, pool_events{0, true, {1}, {}}), report_outcome::ignored);
  EXPECT_EQ(h.on_tier_report(1, pool_events{3, false, {14}, {}}), report_outcome::resync);
  EXPECT_EQ(h.prefixes().tier_cached_blocks(1, {11}), 0);
  // A lost tier holds nothing and its reports are ignored.
  EXPECT_EQ(h.on_tier_report(1, pool_events{4, true, {11, 12, 13}, {}}), report_outcome::taken);
  EXPECT_TRUE(h.cache_tier_lost(1));
  EXPECT_FALSE(h.cache_tier_lost(1));
  EXPECT_EQ(h.on_tier_report(1, pool_events{5, true, {11}, {}}), report_outcome::ignored);
  EXPECT_EQ(h.prefixes().tier_cached_blocks(1, {11}), 0);
  h.check_invariants();
}

TEST(BalancerPolicy, ADiskTiersHashesCountForItsHostTierWithinTheirOwnCapacity) {
  engine_spec m0 = spec(engine_kind::mixed, "m0"), m1 = spec(engine_kind::mixed, "m1");
  m1.cache_tier = 0;
  balancer_policy h({m0, m1}, {}, 0, 0, router_options{"prefix_affinity", 0, 0.5}, {cache_tier_spec{1, 16, 3}});
  ASSERT_EQ(h.on_tier_report(0, pool_events{1, true, {11}, {}}), report_outcome::taken);
  // The disk level: within its own capacity of 3, which is not the host level's 1.
  EXPECT_EQ(h.on_tier_report(0, pool_events{1, true, {12, 13, 14, 15}, {}}, true), report_outcome::ignored);
  ASSERT_EQ(h.on_tier_report(0, pool_events{1, true, {12, 13}, {}}, true), report_outcome::taken);
  EXPECT_EQ(h.prefixes().tier_cached_blocks(0, {11, 12, 13, 14}), 3);
  const auto p = h.place(1, 64, {11, 12, 13, 14});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->decode, 0u);  // a tie: m0, which fetches from m1's node's tier (and so its disk)
  EXPECT_EQ(p->cache_tier, std::optional<size_t>(0));
  EXPECT_EQ(h.on_tier_report(0, pool_events{3, false, {}, {12}}, true), report_outcome::resync);
  EXPECT_EQ(h.prefixes().tier_cached_blocks(0, {11, 12, 13, 14}), 1);
  h.check_invariants();
}

TEST(BalancerPolicy, ARouterWithoutPrefixesTakesNoHashes) {
  balancer_policy h({spec(engine_kind::mixed, "m0")}, {}, 0, 0);
  EXPECT_EQ(h.prefix_block_size(), 0);
  auto bad = h.place(1, 32, {1, 2});
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().message, "2 prefix hashes for a prompt of 32 tokens (expected 0)");
  EXPECT_EQ(h.num_placed(), 0u);
  EXPECT_TRUE(h.place(2, 32).has_value());
  h.check_invariants();
}

TEST(BalancerPolicy, EstimatesTokensAsTheLastReportPlusWorkItHasNotSeen) {
  balancer_policy h({spec(engine_kind::mixed, "m0"), spec(engine_kind::mixed, "m1")}, {}, 0, 0, {"least_loaded"});
  auto a = h.place(1, 100);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->decode, 0u);
  EXPECT_FALSE(a->prefill.has_value());
  EXPECT_EQ(load_of(h, 0), (L{1, 100, 100, true}));
  auto b = h.place(2, 50);  // m0 scores 1/10 + 100/1000 now: m1 takes it
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->decode, 1u);
  EXPECT_EQ(load_of(h, 1), (L{1, 50, 50, true}));
  ASSERT_TRUE(h.place(3, 10).has_value());  // m1: 0.1 + 0.05 < m0: 0.1 + 0.1
  EXPECT_EQ(load_of(h, 1), (L{2, 60, 60, true}));
  // m1's report has seen its first work item only: the second stays on top of it.
  EXPECT_EQ(h.on_report(1, load_report{1, 1, 64, 0}, 5), report_outcome::taken);
  EXPECT_EQ(load_of(h, 1), (L{2, 74, 10, true}));
  // A reordered older report changes nothing; a report that has seen everything replaces all.
  EXPECT_EQ(h.on_report(1, load_report{0, 0, 0, 0}, 6), report_outcome::taken);
  EXPECT_EQ(load_of(h, 1), (L{2, 74, 10, true}));
  EXPECT_EQ(h.on_report(1, load_report{2, 2, 80, 3}, 7), report_outcome::taken);
  EXPECT_EQ(load_of(h, 1), (L{2, 80, 3, true}));
  EXPECT_EQ(h.on_report(2, load_report{}, 8), report_outcome::ignored);  // no such engine
  EXPECT_EQ(h.on_report(-1, load_report{}, 8), report_outcome::ignored);
  // A forged report with a negative count is ignored (issue 21, point 3).
  EXPECT_EQ(h.on_report(1, load_report{3, -1, 0, 0}, 9), report_outcome::ignored);
  EXPECT_EQ(h.on_report(1, load_report{3, 0, -1, 0}, 9), report_outcome::ignored);
  EXPECT_EQ(h.on_report(1, load_report{3, 0, 0, -1}, 9), report_outcome::ignored);
  EXPECT_EQ(h.on_report(1, load_report{-3, 0, 0, 0}, 9), report_outcome::ignored);
  EXPECT_EQ(load_of(h, 1), (L{2, 80, 3, true}));
  h.check_invariants();
}

TEST(BalancerPolicy, RequestCountsAreExact) {
  balancer_policy h({spec(engine_kind::mixed, "m0")}, {}, 0, 0);
  ASSERT_TRUE(h.place(7, 4).has_value());
  ASSERT_TRUE(h.place(8, 4).has_value());
  EXPECT_EQ(h.load(0).num_requests, 2);
  EXPECT_TRUE(h.request_ended(7));
  EXPECT_FALSE(h.request_ended(7));
  EXPECT_FALSE(h.request_ended(99));
  EXPECT_EQ(h.load(0).num_requests, 1);
  EXPECT_EQ(h.num_placed(), 1u);
  h.check_invariants();
}

TEST(BalancerPolicy, DisaggregatesAcrossTiersAndChargesBothEngines) {
  // Bounds {128}: two tiers; prefill p0 serves short prompts, p1 long ones.
  balancer_policy h({spec(engine_kind::prefill, "p0"), spec(engine_kind::prefill, "p1"), spec(engine_kind::decode, "d0")},
                  {128}, 0, 0, {"least_loaded"});
  auto shrt = h.place(1, 100);
  ASSERT_TRUE(shrt.has_value());
  EXPECT_EQ(shrt->prefill, std::optional<size_t>{0});
  EXPECT_EQ(shrt->decode, 2u);
  auto lng = h.place(2, 300);
  ASSERT_TRUE(lng.has_value());
  EXPECT_EQ(lng->prefill, std::optional<size_t>{1});
  EXPECT_EQ(load_of(h, 0), (L{0, 0, 99, true}));   // all but the last prompt token
  EXPECT_EQ(load_of(h, 1), (L{0, 0, 299, true}));
  EXPECT_EQ(load_of(h, 2), (L{2, 400, 0, true}));  // the decode engine holds the whole prompts
  // A one-token prompt has nothing to prefill.
  auto one = h.place(3, 1);
  ASSERT_TRUE(one.has_value());
  EXPECT_FALSE(one->prefill.has_value());
  EXPECT_EQ(load_of(h, 2), (L{3, 401, 1, true}));
  EXPECT_TRUE(h.placed_on(1, 0));
  EXPECT_TRUE(h.placed_on(1, 2));
  EXPECT_FALSE(h.placed_on(1, 1));
  h.check_invariants();
}

TEST(BalancerPolicy, ALostEngineGetsNoWorkAndTheErrorNamesIt) {
  balancer_policy h({spec(engine_kind::mixed, "engine 'm0' on node 'n0'"), spec(engine_kind::mixed, "engine 'm1'")},
                  {}, 0, 0);
  ASSERT_TRUE(h.place(1, 8).has_value());
  EXPECT_TRUE(h.mark_lost(0));
  EXPECT_FALSE(h.mark_lost(0));
  EXPECT_TRUE(h.placed_on(1, 0));  // its requests are still placed there until they end
  auto b = h.place(2, 8);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->decode, 1u);
  EXPECT_TRUE(h.mark_lost(1));
  auto none = h.place(3, 8);
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.error().code, errc::unavailable);
  EXPECT_EQ(none.error().message,
            "no live engine can serve the request; engine 'm0' on node 'n0' is lost; engine 'm1' is lost");
  EXPECT_EQ(h.num_placed(), 2u);
  h.check_invariants();
}

TEST(BalancerPolicy, ARejoinedEngineGetsWorkAgainWithItsLoadEstimateStartedAfresh) {
  balancer_policy h({spec(engine_kind::mixed, "m0"), spec(engine_kind::mixed, "m1")}, {}, /*heartbeat_timeout_ns=*/100, 0);
  ASSERT_TRUE(h.place(1, 8).has_value());  // least loaded, ties to the first: m0
  EXPECT_EQ(h.on_report(0, load_report{0, 1, 0, 0}, 10), report_outcome::taken);
  EXPECT_FALSE(h.rejoined(0, 20)) << "a live engine does not rejoin";
  EXPECT_TRUE(h.mark_lost(0));
  auto again = h.place(1, 8);  // its request placed anew, on m1
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->decode, 1u);
  EXPECT_TRUE(h.rejoined(0, 50));
  EXPECT_EQ(load_of(h, 0), (L{0, 0, 0, true}));
  auto next = h.place(2, 8);  // m1 carries one request, the new m0 none
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->decode, 0u);
  // The new incarnation counts its work from 0: its first report covers that placement.
  EXPECT_EQ(h.on_report(0, load_report{1, 1, 8, 0}, 60), report_outcome::taken);
  EXPECT_EQ(load_of(h, 0), (L{1, 8, 0, true}));
  EXPECT_EQ(h.heartbeat(101), (std::vector<size_t>{1}));  // m1 silent since the start
  EXPECT_EQ(h.heartbeat(161), (std::vector<size_t>{0}));  // the new m0 silent since its report
  h.check_invariants();
}

TEST(BalancerPolicy, ADrainingEngineGetsNoNewWorkEvenFromAReorderedReportAndTheErrorSaysSo) {
  balancer_policy h({spec(engine_kind::mixed, "m0"), spec(engine_kind::mixed, "m1")}, {}, 0, 0);
  EXPECT_EQ(h.on_report(0, load_report{5, 0, 0, 0, false}, 10), report_outcome::taken);
  EXPECT_EQ(h.on_report(0, load_report{3, 0, 0, 0, true}, 20), report_outcome::taken);  // older, but draining counts
  EXPECT_TRUE(h.load(0).draining);
  EXPECT_TRUE(h.load(0).alive);
  for (request_key k = 1; k <= 3; k++) EXPECT_EQ(h.place(k, 8)->decode, 1u);
  EXPECT_EQ(h.on_report(1, load_report{3, 3, 24, 0, true}, 30), report_outcome::taken);
  auto none = h.place(4, 8);
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.error().code, errc::unavailable);
  EXPECT_EQ(none.error().message, "no live engine can serve the request; m0 is draining; m1 is draining");
  h.check_invariants();
}

TEST(BalancerPolicy, TheHeartbeatLosesSilentEnginesOnceAndReportsCountAsAnswers) {
  balancer_policy h({spec(engine_kind::mixed, "m0"), spec(engine_kind::mixed, "m1"), spec(engine_kind::mixed, "m2")},
                  {}, /*heartbeat_timeout_ns=*/100, /*now_ns=*/0);
  h.heard_from(0, 50);
  EXPECT_EQ(h.on_report(1, load_report{}, 60), report_outcome::taken);
  EXPECT_EQ(h.heartbeat(100), std::vector<size_t>{});  // silent for exactly the timeout: not yet
  EXPECT_EQ(h.heartbeat(101), (std::vector<size_t>{2}));
  EXPECT_FALSE(h.load(2).alive);
  EXPECT_EQ(h.heartbeat(155), (std::vector<size_t>{0}));
  EXPECT_FALSE(h.mark_lost(0));  // its DOWN message after the heartbeat: nothing new
  EXPECT_TRUE(h.mark_lost(1));   // lost by DOWN: the heartbeat skips it
  EXPECT_EQ(h.heartbeat(1000), std::vector<size_t>{});
  h.check_invariants();
}

TEST(BalancerPolicy, WithoutAHeartbeatSilenceDecidesNothing) {
  balancer_policy h({spec(engine_kind::mixed, "m0")}, {}, 0, 0);
  h.heard_from(0, 5);
  EXPECT_EQ(h.heartbeat(int64_t{1} << 60), std::vector<size_t>{});
  EXPECT_TRUE(h.load(0).alive);
}

}  // namespace
}  // namespace troupe::balance
