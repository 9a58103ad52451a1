// The load balancer's placement with exact expected engines: candidates (tiers, dead engines
// routed around), the least-loaded choice (the decode score, ties broken by engine index), and
// each router policy (router.hpp; power_of_two's draws computed independently from Random123's
// Philox4x32-10 definition).
#include "runtime/balance/admission.hpp"
#include "runtime/balance/placement.hpp"
#include "runtime/balance/router.hpp"

#include <gtest/gtest.h>

#include <cmath>
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

/// The default policy over the candidates, as the balancer places a request.
expected<placement> place(const std::vector<engine_load>& engines, const tiers& t, int32_t tier,
                          int32_t num_prompt_tokens) {
  const candidates c = candidates_for(engines, t, tier, num_prompt_tokens);
  if (c.decode.empty()) return fail(errc::unavailable, "no live engine can serve the request");
  return least_loaded(engines, c);
}

std::unique_ptr<router> make(const std::string& policy, uint64_t seed = 0) {
  auto r = make_router({policy, seed});
  EXPECT_TRUE(r.has_value()) << policy;
  return std::move(*r);
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

TEST(Router, AnUnknownPolicyIsAnErrorListingTheKnownOnes) {
  EXPECT_EQ(router_names(),
            (std::vector<std::string>{"auto", "least_loaded", "round_robin", "power_of_two", "prefix_affinity"}));
  auto r = make_router({"fastest", 0});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  EXPECT_EQ(r.error().message, "unknown router 'fastest'; known: auto, least_loaded, round_robin, power_of_two, prefix_affinity");
  EXPECT_EQ(router_options{}.policy, "auto");
}

TEST(Router, AutoIsPrefixAffinityWhereADirectoryCanPayElseLeastLoaded) {
  // One engine and no cache tier: nothing to choose by a prefix (no directory kept).
  const auto one = make_router({"auto", 0}, 1, false);
  ASSERT_TRUE(one.has_value());
  EXPECT_FALSE((*one)->uses_prefixes());
  for (const auto& [engines, tier] : {std::pair<size_t, bool>{2, false}, {1, true}, {4, true}}) {
    const auto r = make_router({"auto", 0}, engines, tier);
    ASSERT_TRUE(r.has_value());
    EXPECT_TRUE((*r)->uses_prefixes()) << engines << " engines, tier " << tier;
  }
  // It places as prefix_affinity does: the engine holding the prompt's prefix, load being equal.
  const std::vector<engine_load> loads(2, engine_load{});
  candidates c;
  c.decode = {0, 1};
  route_request q;
  q.num_prompt_tokens = 64;
  q.cached_tokens = {0, 48};
  auto r = make_router({"auto", 0}, 2, false);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ((*r)->choose(loads, c, q).decode, 1u);
  auto ll = make_router({"least_loaded", 0});
  ASSERT_TRUE(ll.has_value());
  EXPECT_EQ((*ll)->choose(loads, c, q).decode, 0u);
}

TEST(Router, CandidatesAreLiveEnginesPerRoleAndOneTokenPromptsRunWhole) {
  std::vector<engine_load> e = {engine(engine_kind::prefill), engine(engine_kind::decode),
                                engine(engine_kind::mixed), engine(engine_kind::prefill)};
  const tiers t = assign_tiers(2, 2);  // engine 0: tier 0, engine 3: tier 1
  candidates c = candidates_for(e, t, 1, 10);
  EXPECT_EQ(c.decode, (std::vector<size_t>{1, 2}));
  EXPECT_EQ(c.prefill, (std::vector<size_t>{3}));
  EXPECT_TRUE(candidates_for(e, t, 1, 1).prefill.empty());
  e[3].alive = false;  // tier 1 has no live engine: every live prefill engine is a candidate
  e[2].alive = false;
  c = candidates_for(e, t, 1, 10);
  EXPECT_EQ(c.decode, (std::vector<size_t>{1}));
  EXPECT_EQ(c.prefill, (std::vector<size_t>{0}));
}

TEST(Router, LeastLoadedIsTheDefaultPolicy) {
  const std::vector<engine_load> e = {engine(engine_kind::mixed, 3), engine(engine_kind::mixed, 1),
                                      engine(engine_kind::mixed, 2)};
  auto r = make("least_loaded");
  const candidates c = candidates_for(e, {}, 0, 10);
  for (uint64_t n = 0; n < 3; n++) EXPECT_EQ(r->choose(e, c, {n}).decode, 1u);
}

TEST(Router, RoundRobinTakesTheNextLiveCandidatePerRoleWhateverTheLoad) {
  std::vector<engine_load> e = {engine(engine_kind::decode, 50), engine(engine_kind::prefill, 0, 0, 900),
                                engine(engine_kind::decode), engine(engine_kind::prefill),
                                engine(engine_kind::decode)};
  const tiers one_tier = assign_tiers(2, 1);
  auto r = make("round_robin");
  std::vector<std::pair<size_t, std::optional<size_t>>> got;
  for (uint64_t n = 0; n < 4; n++) {
    const placement p = r->choose(e, candidates_for(e, one_tier, 0, 10), {n});
    got.emplace_back(p.decode, p.prefill);
  }
  using pick = std::pair<size_t, std::optional<size_t>>;
  EXPECT_EQ(got, (std::vector<pick>{{0, 1}, {2, 3}, {4, 1}, {0, 3}}));
  e[2].alive = false;  // after 0 comes 4 now; a one-token prompt leaves the prefill cursor alone
  EXPECT_EQ(r->choose(e, candidates_for(e, one_tier, 0, 1), {4}).decode, 4u);
  const placement p = r->choose(e, candidates_for(e, one_tier, 0, 10), {5});
  EXPECT_EQ(p.decode, 0u);
  EXPECT_EQ(p.prefill, std::optional<size_t>(1));
}

TEST(Router, PowerOfTwoTakesTheLighterOfTwoCandidatesDrawnFromItsSeed) {
  // Decode scores 0.3, 0, 0.2, 0.1 (engines 0-3); queued prefill tokens 300, 100, 200 (4-6).
  const std::vector<engine_load> e = {
      engine(engine_kind::decode, 30),          engine(engine_kind::decode),
      engine(engine_kind::decode, 20),          engine(engine_kind::decode, 10),
      engine(engine_kind::prefill, 0, 0, 300),  engine(engine_kind::prefill, 0, 0, 100),
      engine(engine_kind::prefill, 0, 0, 200)};
  const tiers one_tier = assign_tiers(3, 1);
  const candidates c = candidates_for(e, one_tier, 0, 10);
  // Seed 7, requests 0-5: drawn decode pairs (1,2) (0,3) (0,1) (2,3) (0,2) (0,1), prefill pairs
  // (4,6) then (4,5) five times.
  const std::vector<size_t> decode = {1, 3, 1, 3, 2, 1};
  const std::vector<size_t> prefill = {6, 5, 5, 5, 5, 5};
  auto r = make("power_of_two", 7);
  for (uint64_t n = 0; n < 6; n++) {
    const placement p = r->choose(e, c, {n});
    EXPECT_EQ(p.decode, decode[n]) << "request " << n;
    EXPECT_EQ(p.prefill, std::optional<size_t>(prefill[n])) << "request " << n;
  }
  // The same number gives the same choice (no hidden state); one candidate is taken as is.
  EXPECT_EQ(make("power_of_two", 7)->choose(e, c, {3}).decode, 3u);
  const std::vector<engine_load> one = {engine(engine_kind::mixed, 99)};
  EXPECT_EQ(r->choose(one, candidates_for(one, {}, 0, 10), {0}).decode, 0u);
}

TEST(Router, PrefixAffinityWeighsTheCachedShareOfThePromptAgainstTheDecodeScore) {
  // Decode scores 0.3, 0, 0.2; a 100-token prompt of which the engines hold 80, 0 and 100.
  const std::vector<engine_load> e = {engine(engine_kind::mixed, 30), engine(engine_kind::mixed),
                                      engine(engine_kind::mixed, 20)};
  const candidates c = candidates_for(e, {}, 0, 100);
  const route_request r{0, 100, {80, 0, 100}};
  auto with = [&](double weight) {
    auto made = make_router({"prefix_affinity", 0, weight});
    EXPECT_TRUE(made.has_value());
    EXPECT_TRUE((*made)->uses_prefixes());
    const placement p = (*made)->choose(e, c, r);
    EXPECT_FALSE(p.prefill.has_value());
    return p.decode;
  };
  EXPECT_EQ(with(0.5), 2u);   // 0.3 - 0.4, 0, 0.2 - 0.5: the whole prompt cached wins
  EXPECT_EQ(with(0.25), 2u);  // 0.1, 0, -0.05
  EXPECT_EQ(with(0.1), 1u);   // 0.22, 0, 0.1: load wins
  EXPECT_EQ(with(0), 1u);     // least_loaded
  EXPECT_EQ(with(2.5), 2u);   // -1.7, 0, -2.3
  // Nothing cached anywhere, equal loads: the lower index.
  const std::vector<engine_load> idle = {engine(engine_kind::mixed), engine(engine_kind::mixed)};
  EXPECT_EQ(make("prefix_affinity")->choose(idle, candidates_for(idle, {}, 0, 100), {0, 100, {0, 0}}).decode, 0u);
  EXPECT_FALSE(make("least_loaded")->uses_prefixes());
}

TEST(Router, PrefixAffinityCountsPrefixesOnPrefillEnginesAndDecodesLeastLoaded) {
  // Decode engines 0 (idle) and 1 (score 0.1, but holding the whole prompt: decode engines do
  // not reuse prefixes); prefill engines 2 (300 queued, holds 400 of the 500 tokens) and 3 (100).
  const std::vector<engine_load> e = {engine(engine_kind::decode), engine(engine_kind::decode, 10),
                                      engine(engine_kind::prefill, 0, 0, 300), engine(engine_kind::prefill, 0, 0, 100)};
  const candidates c = candidates_for(e, assign_tiers(2, 1), 0, 500);
  const route_request r{0, 500, {0, 500, 400, 0}};
  auto prefill_with = [&](double weight) {
    const placement p = (*make_router({"prefix_affinity", 0, weight}))->choose(e, c, r);
    EXPECT_EQ(p.decode, 0u);
    return p.prefill;
  };
  EXPECT_EQ(prefill_with(1), std::optional<size_t>(2));     // -100 vs 100
  EXPECT_EQ(prefill_with(0.5), std::optional<size_t>(2));   // 100 vs 100: the lower index
  EXPECT_EQ(prefill_with(0.25), std::optional<size_t>(3));  // 200 vs 100
}

TEST(Router, APrefixWeightOutOfRangeIsAnError) {
  for (double bad : {-1.0, 1e7, std::nan("")}) {
    auto r = make_router({"prefix_affinity", 0, bad});
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, errc::invalid_argument);
    EXPECT_EQ(r.error().message.rfind("prefix_weight must be a number in [0, 1000000], got ", 0), 0u)
        << r.error().message;
  }
  EXPECT_EQ(make_router({"prefix_affinity", 0, -1}).error().message,
            "prefix_weight must be a number in [0, 1000000], got -1");
  EXPECT_TRUE(make_router({"prefix_affinity", 0, 0}).has_value());
  EXPECT_TRUE(make_router({"prefix_affinity", 0, prefix_weight_max}).has_value());
}

TEST(TokenBucket, AdmitsABurstThenOneRequestPerInterval) {
  token_bucket b(2.0, 3);  // one per 500 ms, three at once
  EXPECT_EQ(b.interval_ns(), 500'000'000);
  constexpr int64_t ms = 1'000'000;
  std::vector<bool> got;
  for (int64_t t : {0, 0, 0, 0, 499, 500, 500, 999, 1000}) {
    got.push_back(b.take(t * ms));
    b.check_invariants();
  }
  EXPECT_EQ(got, (std::vector<bool>{true, true, true, false, false, true, false, false, true}));
  got.clear();
  for (int i = 0; i < 4; i++) got.push_back(b.take(10'000 * ms));  // quiet: a whole burst again
  EXPECT_EQ(got, (std::vector<bool>{true, true, true, false}));
  token_bucket one(1e9, 1);  // an interval of 1 ns, no burst
  EXPECT_TRUE(one.take(5));
  EXPECT_FALSE(one.take(5));
  EXPECT_TRUE(one.take(6));
}


/// Admitted, and not to be answered `overloaded`.
bool admitted(const expected<std::optional<error>>& verdict) { return verdict.has_value() && !verdict->has_value(); }

TEST(Admission, CapsEachOtherClientsRequestsInFlightButNotItsOwnProcess) {
  admission<int> door(/*own=*/0, /*max_pending_per_client=*/2, /*rate_per_s=*/0, /*burst=*/1);
  for (int i = 0; i < 2; i++) EXPECT_TRUE(admitted(door.admit(7, 0)));
  const auto refused = door.admit(7, 0);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, errc::invalid_argument);
  EXPECT_EQ(refused.error().message,
            "too many requests in flight from this client: 2 ([limits] max_pending_per_client); wait for one to finish");
  EXPECT_TRUE(door.admit(8, 0).has_value());  // another client has its own count
  for (int i = 0; i < 5; i++) EXPECT_TRUE(door.admit(0, 0).has_value());  // the balancer's own process: no cap
  EXPECT_EQ(door.in_flight(0), 0);
  door.ended(7);
  EXPECT_EQ(door.in_flight(7), 1);
  EXPECT_TRUE(door.admit(7, 0).has_value());
  door.ended(7);
  door.ended(7);
  door.ended(7);  // one more than admitted: nothing to end
  EXPECT_EQ(door.in_flight(7), 0);
}

TEST(Admission, ARequestOverTheRateIsAdmittedToBeAnsweredOverloaded) {
  admission<int> door(/*own=*/0, /*max_pending_per_client=*/1, /*rate_per_s=*/2.5, /*burst=*/2);
  EXPECT_TRUE(admitted(door.admit(0, 0)));
  EXPECT_TRUE(admitted(door.admit(0, 0)));
  const auto over = door.admit(0, 0);
  ASSERT_TRUE(over.has_value());
  ASSERT_TRUE(over->has_value());
  EXPECT_EQ((*over)->code, errc::overloaded);
  EXPECT_EQ((*over)->message,
            "the load balancer admits at most 2.5 requests/s (bursts of 2, [load_balancer] rate_limit_per_s); retry later");
  EXPECT_TRUE(admitted(door.admit(0, 400'000'000)));  // one interval later
  // A client over its cap is refused before the rate is asked: it takes no token.
  EXPECT_TRUE(admitted(door.admit(7, 800'000'000)));
  EXPECT_FALSE(door.admit(7, 800'000'000).has_value());
  EXPECT_TRUE(admitted(door.admit(0, 1'200'000'000)));  // the next token: the refusal took none
}

}  // namespace
}  // namespace troupe::balance
