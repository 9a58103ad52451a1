// Swarm testing (sim/swarm.hpp): shuffled delivery explores other interleavings and changes no
// token; executor crashes, drains with and without grace, lost engines, disaggregation, network
// latency, delayed messages and broken KV transfers change none either; 1,000 swarm cases pass
// (in four shards, so ctest runs them side by side); a planted batch-dependence bug and a
// planted bug that only executor crashes expose are each found within 1,000 cases, and their
// cases replay.
#include "sim/swarm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>

#include <spdlog/spdlog.h>

#include "tests/support/golden.hpp"

namespace troupe::sim {
namespace {

/// Case 7's topology with 2 mixed replicas, no network, and 12 sampled requests arriving 4 at a
/// time, half a millisecond apart (a request takes a few ms).
sim_options twelve_requests_on_two_replicas() {
  auto c = make_swarm_case(7, testing::bundled_model());
  EXPECT_TRUE(c) << c.error().message;
  sim_options o = c->options;
  o.topology.replicas = 2;
  o.topology.prefill_replicas = 0;
  o.topology.network = {};
  o.workload.clear();
  for (int32_t i = 0; i < 12; i++) o.workload.push_back(trace_request{i / 4 * swarm_instant_ns, 5 + 3 * i, 20, {}});
  o.temperature = 1.0f;
  return o;
}

/// A prefill engine and two decode engines of twelve_requests_on_two_replicas' case on a network
/// of 20 us and 0.5 GB/s (the namespace tests' shape), without a workload.
sim_options prefill_and_two_decoders_on_a_network() {
  sim_options o = twelve_requests_on_two_replicas();
  o.topology.replicas = 3;
  o.topology.prefill_replicas = 1;
  o.topology.network = {20, 0.5, 0, 0};
  o.workload.clear();
  return o;
}

TEST(ShuffledDelivery, ChangesTheInterleavingButNoToken) {
  const sim_options o = twelve_requests_on_two_replicas();
  auto fifo = run_simulation(o);
  sim_options shuffled = o;
  shuffled.shuffle_delivery = true;
  auto a = run_simulation(shuffled);
  auto b = run_simulation(shuffled);
  ASSERT_TRUE(fifo && a && b);
  EXPECT_NE(fifo->event_log_sha256, a->event_log_sha256);  // another interleaving ...
  EXPECT_EQ(a->event_log_sha256, b->event_log_sha256);     // ... that replays from the seed
  for (size_t i = 0; i < fifo->requests.size(); i++) {
    EXPECT_EQ(fifo->requests[i].tokens, a->requests[i].tokens) << "request " << i;
    EXPECT_EQ(fifo->requests[i].finish, "length");
  }
}

TEST(Swarm, CasesAreDrawnFromTheirSeedAlone) {
  auto a = make_swarm_case(42, testing::bundled_model());
  auto b = make_swarm_case(42, testing::bundled_model());
  auto c = make_swarm_case(43, testing::bundled_model());
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->description, b->description);
  EXPECT_EQ(a->options.workload, b->options.workload);
  EXPECT_NE(a->description + std::to_string(a->options.workload.size()),
            c->description + std::to_string(c->options.workload.size()));
}

TEST(Swarm, AMissingModelIsAClearError) {
  auto c = make_swarm_case(1, "/nonexistent/model.bin");
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("/nonexistent/model.bin"), std::string::npos) << c.error().message;
}

/// Engines log each executor crash as an error: thousands in a swarm.
class quiet_engines {
 public:
  quiet_engines() { spdlog::set_level(spdlog::level::critical); }
  ~quiet_engines() { spdlog::set_level(spdlog::level::info); }
};

/// Every request of `faulty` ended by length with the tokens it has in `clean`.
void expect_same_tokens(const sim_result& clean, const sim_result& faulty) {
  ASSERT_EQ(clean.requests.size(), faulty.requests.size());
  for (size_t i = 0; i < clean.requests.size(); i++) {
    EXPECT_EQ(clean.requests[i].tokens, faulty.requests[i].tokens) << "request " << i;
    EXPECT_EQ(faulty.requests[i].finish, "length") << "request " << i;
  }
}

TEST(Swarm, ExecutorCrashesChangeNoTokenAndReplay) {
  const quiet_engines quiet;
  const sim_options o = twelve_requests_on_two_replicas();
  auto clean = run_simulation(o);
  sim_options faulty = o;
  faulty.executor_crashes = {{2, 9}, {5}};
  auto a = run_simulation(faulty);
  auto b = run_simulation(faulty);
  ASSERT_TRUE(clean && a && b);
  EXPECT_NE(clean->event_log_sha256, a->event_log_sha256);  // the crashes happened ...
  EXPECT_EQ(a->event_log_sha256, b->event_log_sha256);      // ... and replay from the seed
  expect_same_tokens(*clean, *a);
}

TEST(Swarm, ADrainedEngineHandsItsRequestsOnWithTheirKvAndNoTokenChanges) {
  const quiet_engines quiet;
  const sim_options o = twelve_requests_on_two_replicas();
  auto clean = run_simulation(o);
  sim_options drained = o;
  drained.drains = {engine_drain{0, 1'200'000}};
  drained.shuffle_delivery = true;
  auto a = run_simulation(drained);
  ASSERT_TRUE(clean && a) << (a ? "" : a.error().message);
  EXPECT_GT(a->num_forwarded_with_kv, 0);
  expect_same_tokens(*clean, *a);
  drained.drains = {engine_drain{2, 0}};
  auto bad = run_simulation(drained);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "a drain of replica 2 at 0 ns: the run has 2 replica(s)");
}

TEST(Swarm, ADrainWithNowhereToForwardEndsItsRequestsUnavailableInsteadOfHanging) {
  const quiet_engines quiet;
  sim_options o = twelve_requests_on_two_replicas();
  o.topology.replicas = 1;
  o.drains = {engine_drain{0, 600'000}};
  auto r = run_simulation(o);  // fails if a request never ends
  ASSERT_TRUE(r) << r.error().message;
  int32_t num_unavailable = 0;
  for (const request_record& q : r->requests) {
    EXPECT_TRUE(q.finish == "length" || q.finish == "unavailable") << q.index << ": " << q.finish;
    num_unavailable += q.finish == "unavailable";
  }
  EXPECT_GT(num_unavailable, 0);
}

TEST(Swarm, AGracePeriodLetsRequestsFinishWhereTheyRunAndNoTokenChanges) {
  const quiet_engines quiet;
  const sim_options o = twelve_requests_on_two_replicas();
  auto clean = run_simulation(o);
  sim_options drained = o;
  drained.drains = {engine_drain{0, 1'200'000, 0}};
  auto at_once = run_simulation(drained);
  drained.drains[0].grace_ms = 3;
  auto graced = run_simulation(drained);
  ASSERT_TRUE(clean && at_once && graced);
  expect_same_tokens(*clean, *at_once);
  expect_same_tokens(*clean, *graced);
  EXPECT_GT(at_once->num_forwarded, graced->num_forwarded);  // some finished within the grace period
  drained.drains[0].grace_ms = 100;  // longer than every request: none is forwarded
  auto patient = run_simulation(drained);
  ASSERT_TRUE(patient);
  expect_same_tokens(*clean, *patient);
  EXPECT_EQ(patient->num_forwarded, 0);
}

TEST(Swarm, ALostEnginesRequestsAreRecomputedElsewhereAndNoTokenChanges) {
  const quiet_engines quiet;
  const sim_options o = twelve_requests_on_two_replicas();
  auto clean = run_simulation(o);
  sim_options lossy = o;
  lossy.losses = {engine_loss{0, 1'200'000}};
  lossy.shuffle_delivery = true;
  auto a = run_simulation(lossy);
  auto b = run_simulation(lossy);
  ASSERT_TRUE(clean && a && b) << (a ? "" : a.error().message);
  expect_same_tokens(*clean, *a);
  EXPECT_EQ(a->event_log_sha256, b->event_log_sha256);
  const auto steps_of_replica_0 = [](const sim_result& r) {
    return std::count_if(r.steps.begin(), r.steps.end(), [](const step_record& s) { return s.replica == 0; });
  };
  EXPECT_LT(steps_of_replica_0(*a), steps_of_replica_0(*clean));  // it stopped, and the rest ran elsewhere
  lossy.losses = {engine_loss{0, 0}, engine_loss{1, 0}};  // nowhere left: unavailable, no hang
  auto none_left = run_simulation(lossy);
  ASSERT_TRUE(none_left) << none_left.error().message;
  for (const request_record& q : none_left->requests) EXPECT_EQ(q.finish, "unavailable") << q.index;
  lossy.losses = {engine_loss{5, 0}};
  auto bad = run_simulation(lossy);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "a loss of replica 5 at 0 ns: the run has 2 replica(s)");
}

TEST(Swarm, OneAndFivePercentLossChangeNoTokenAndOnlyDelay) {
  // The namespace test's loss scenario (tests/netns_test.cpp), replayed: a prefill and two
  // decode engines on a network, 1% and then 5% loss on every host's link (a message crosses two:
  // about 2% and 10% end to end), 32 requests of 48 tokens. Every request's tokens and finish
  // equal the lossless run's; the network resent some messages and the run took longer.
  const quiet_engines quiet;
  sim_options o = prefill_and_two_decoders_on_a_network();
  for (int32_t i = 0; i < 32; i++) o.workload.push_back(trace_request{i / 8 * swarm_instant_ns, 5 + i, 48, {}});
  auto clean = run_simulation(o);
  ASSERT_TRUE(clean) << clean.error().message;
  for (const double host_link : {1.0, 5.0}) {
    sim_options lossy = o;
    lossy.topology.network.loss_percent = 100 * (1 - (1 - host_link / 100) * (1 - host_link / 100));
    auto a = run_simulation(lossy);
    ASSERT_TRUE(a) << a.error().message;
    expect_same_tokens(*clean, *a);
    EXPECT_GT(a->network.resent, 0) << host_link;
    EXPECT_GT(a->simulated_ns, clean->simulated_ns) << host_link;
  }
}

TEST(Swarm, APartitionedEngineHasItsRequestsRecomputedElsewhereAndIsTakenBackOnceHealed) {
  // The namespace test's decode-node partition (tests/netns_test.cpp), replayed: a prefill
  // engine and two decode engines on a network; decode replica 2 is cut off from 1 ms to 5 s,
  // its process running on; the balancer's heartbeat (250 ms, silent 1.5 s: lost) moves its
  // requests to replica 1, which recomputes them; 8 requests arrive after the heal. Every
  // request's tokens and finish equal the undisturbed run's.
  const quiet_engines quiet;
  sim_options o = prefill_and_two_decoders_on_a_network();
  o.workload = twelve_requests_on_two_replicas().workload;
  for (int32_t i = 0; i < 8; i++) o.workload.push_back(trace_request{6'000'000'000 + i * swarm_instant_ns, 7 + 2 * i, 12, {}});
  auto clean = run_simulation(o);
  sim_options cut = o;
  cut.network_faults.partitions = {sim_partition{2, 1'000'000, 5'000'000'000}};
  auto a = run_simulation(cut);
  auto b = run_simulation(cut);
  ASSERT_TRUE(clean && a && b) << (a ? "" : a.error().message);
  expect_same_tokens(*clean, *a);
  for (const request_record& r : a->requests) EXPECT_EQ(r.finish, "length") << r.index;
  EXPECT_EQ(a->event_log_sha256, b->event_log_sha256);
  EXPECT_GT(a->network.cut_off, 0);
  // Some requests waited for the heartbeat to lose replica 2 (1.5 s of silence) ...
  const auto waited = std::count_if(a->requests.begin(), a->requests.begin() + 12,
                                    [](const request_record& r) { return r.finish_ns > 1'500'000'000; });
  EXPECT_GT(waited, 0);
  for (size_t i = 0; i < 12; i++)  // ... and every one finished elsewhere before the heal
    EXPECT_LT(a->requests[i].finish_ns, 5'000'000'000) << i;
  // ... and once healed, replica 2 was pinged again, taken back and given work.
  const auto after_heal = std::count_if(a->steps.begin(), a->steps.end(), [](const step_record& s) {
    return s.replica == 2 && s.start_ns > 5'000'000'000;
  });
  EXPECT_GT(after_heal, 0);
  cut.network_faults.partitions = {sim_partition{3, 0, 1}};
  auto bad = run_simulation(cut);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "a partition of replica 3 at 0 ns: the run has 3 replica(s)");
}

TEST(Swarm, ThePartitionedBalancersRequestsEndUnavailableWithinTheHeartbeatAndNewOnesSucceedOnceHealed) {
  // The namespace test's balancer partition (tests/netns_test.cpp), replayed: 8 streams of 150
  // tokens (the swarm case's context holds no more) on a prefill engine and two decode
  // engines; once every stream has its first token the balancer's node (its request actors and
  // clients with it) is cut off from the engines for 5 s, the engines running on. As in the namespace run, every stream ends `unavailable`
  // (here when the heartbeat loses the engines: 1.5 s of silence, then the next 250 ms tick), and
  // after the heal 4 new requests are served with the undisturbed run's tokens.
  const quiet_engines quiet;
  sim_options o = prefill_and_two_decoders_on_a_network();
  for (int32_t i = 0; i < 8; i++) o.workload.push_back(trace_request{0, 7 + 2 * i, 150, {}});
  for (int32_t i = 0; i < 4; i++) o.workload.push_back(trace_request{7'000'000'000 + i * swarm_instant_ns, 9 + 2 * i, 12, {}});
  auto clean = run_simulation(o);
  ASSERT_TRUE(clean) << clean.error().message;
  int64_t cut = 0, first_end = INT64_MAX;
  for (size_t i = 0; i < 8; i++) {
    EXPECT_EQ(clean->requests[i].finish, "length") << i;
    EXPECT_EQ(clean->requests[i].tokens.size(), 150u) << i;
    cut = std::max(cut, clean->requests[i].first_token_ns + 1);
    first_end = std::min(first_end, clean->requests[i].finish_ns);
  }
  ASSERT_LT(cut, first_end) << "the cut must come while every stream runs";
  sim_options cut_off = o;
  cut_off.network_faults.partitions = {sim_partition{sim_front_node, cut, cut + 5'000'000'000}};
  auto a = run_simulation(cut_off);
  auto b = run_simulation(cut_off);
  ASSERT_TRUE(a && b) << (a ? "" : a.error().message);
  EXPECT_EQ(a->event_log_sha256, b->event_log_sha256);
  for (size_t i = 0; i < 8; i++) {
    const request_record& r = a->requests[i];
    EXPECT_EQ(r.finish, "unavailable") << i;
    EXPECT_GE(r.finish_ns, cut) << i;
    EXPECT_LE(r.finish_ns, cut + 2'000'000'000) << i;  // the namespace clients' bound
    EXPECT_LT(r.tokens.size(), clean->requests[i].tokens.size()) << i;
  }
  for (size_t i = 8; i < 12; i++) {
    EXPECT_EQ(a->requests[i].finish, "length") << i;
    EXPECT_EQ(a->requests[i].tokens, clean->requests[i].tokens) << i;
  }
  EXPECT_GT(a->network.cut_off, 0);
  cut_off.network_faults.partitions = {sim_partition{sim_front_node, -1, 5}};
  auto bad = run_simulation(cut_off);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "a partition begins before the run");
}

TEST(Swarm, DrainingADecodeEngineAcrossTheNetworkForwardsItsRequestsWithTheirKvAndNoTokenChanges) {
  // The namespace test's drain (tests/netns_test.cpp), replayed: one sequence at a time per
  // engine, 16 requests of 150 tokens; decode replica 2 drains with 1 ms of grace while it holds
  // work. Its requests go to replica 1, the running ones with their KV over the network, and
  // every request's tokens equal the undisturbed run's.
  const quiet_engines quiet;
  sim_options o = prefill_and_two_decoders_on_a_network();
  o.topology.engine.scheduler.max_num_seqs = 1;
  for (int32_t i = 0; i < 16; i++) o.workload.push_back(trace_request{0, 7 + 2 * i, 150, {}});
  auto clean = run_simulation(o);
  ASSERT_TRUE(clean) << clean.error().message;
  sim_options drained = o;
  drained.drains = {engine_drain{2, clean->requests[0].first_token_ns + 1, 1}};
  auto a = run_simulation(drained);
  ASSERT_TRUE(a) << a.error().message;
  expect_same_tokens(*clean, *a);
  EXPECT_GT(a->num_forwarded, 0);
  EXPECT_GT(a->num_forwarded_with_kv, 0);
  EXPECT_GT(a->network.kv_bytes, clean->network.kv_bytes);  // the forwarded KV crossed the network
}

TEST(Swarm, DisaggregationAndANetworkChangeNoToken) {
  const quiet_engines quiet;
  const sim_options o = twelve_requests_on_two_replicas();
  auto clean = run_simulation(o);
  sim_options pd = o;
  pd.topology.replicas = 3;
  pd.topology.prefill_replicas = 1;
  pd.topology.network = {20, 0.5, 0, 0};
  pd.shuffle_delivery = true;
  auto a = run_simulation(pd);
  ASSERT_TRUE(clean && a) << (a ? "" : a.error().message);
  expect_same_tokens(*clean, *a);
  EXPECT_GT(a->network.kv_bytes, 0);  // hand-offs carried KV from the prefill engine
  EXPECT_GT(a->simulated_ns, clean->simulated_ns);  // the network costs time
  EXPECT_EQ(a->handoffs_recomputed, 0);
  // Every KV transfer breaks off: the decode engines recompute, and still no token changes.
  pd.network_faults.kv_break_probability = 1;
  pd.network_faults.delay_probability = 0.5;
  pd.network_faults.max_delay_ns = 1'000'000;
  auto broken = run_simulation(pd);
  ASSERT_TRUE(broken) << broken.error().message;
  expect_same_tokens(*clean, *broken);
  EXPECT_GT(broken->network.kv_broken, 0);
  EXPECT_EQ(broken->handoffs_recomputed, broken->network.kv_broken);
  EXPECT_GT(broken->network.delayed, 0);
  // Faults only until a time: none after it.
  pd.faults_until_ns = 0;
  auto healed = run_simulation(pd);
  ASSERT_TRUE(healed);
  EXPECT_EQ(healed->network.kv_broken, 0);
  EXPECT_EQ(healed->network.delayed, 0);
  pd.network_faults.kv_break_probability = 2;
  auto bad = run_simulation(pd);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "network fault probabilities lie in [0, 1] and delays are not negative");
}

class SwarmShard : public ::testing::TestWithParam<int> {};

TEST_P(SwarmShard, TwoHundredFiftyCasesPass) {
  const quiet_engines quiet;
  const uint64_t first = 1 + 250 * static_cast<uint64_t>(GetParam());
  swarm_totals t;
  for (uint64_t seed = first; seed < first + 250; seed++) {
    auto r = run_swarm_case(seed, testing::bundled_model(), /*replay=*/seed % 16 == 0);
    ASSERT_TRUE(r) << r.error().message;
    ASSERT_EQ(r->violation, "") << "replay: troupe sim --swarm 1 --seed " << seed;
    t.add(*r);
  }
  std::cout << "seeds " << first << "-" << first + 249 << ": " << t.summary() << "\n";
  EXPECT_GT(t.num_preemptions, 0);  // small pools do preempt
  EXPECT_GT(t.num_crashes, 50);     // half the cases draw crashes
  EXPECT_GT(t.num_drains, 20);      // a quarter or so drain an engine ...
  EXPECT_GT(t.num_forwarded_with_kv, 0);  // ... some of whose requests take their KV along
  EXPECT_GT(t.num_losses, 20);      // a fifth or so lose one
  EXPECT_GT(t.num_delayed_messages, 0);  // half the cases hold messages back ...
  EXPECT_GT(t.num_kv_broken, 0);         // ... and break KV transfers off
  EXPECT_GT(t.num_resent_messages, 0);   // a quarter lose packets: messages wait for TCP's resends
  EXPECT_GT(t.num_partitions, 10);       // a fifth or so of those with two replicas cut one off
  EXPECT_GT(t.num_handoffs_recomputed, 0);  // broken hand-offs are recomputed by their receivers
  EXPECT_LE(t.num_handoffs_recomputed, t.num_kv_broken);  // (broken forwards by their request actors)
  EXPECT_GE(t.num_liveness_requests, 250);  // the liveness phase: 1-4 requests per case
  EXPECT_GE(t.num_replayed, 15);
}

INSTANTIATE_TEST_SUITE_P(Seeds1To1000, SwarmShard, ::testing::Values(0, 1, 2, 3));

/// The first case of 1..1000 in which the swarm finds `bug`, and its violation; expects one, and
/// that the case reproduces it exactly and passes without the bug.
void expect_found_and_replayed(planted_bug bug, const std::string& violation_part) {
  const quiet_engines quiet;
  uint64_t found = 0;
  std::string violation;
  for (uint64_t seed = 1; seed <= 1000 && found == 0; seed++) {
    auto r = run_swarm_case(seed, testing::bundled_model(), false, bug);
    ASSERT_TRUE(r) << r.error().message;
    if (!r->violation.empty()) {
      found = seed;
      violation = r->violation;
    }
  }
  ASSERT_NE(found, 0u) << "the planted bug went unnoticed for 1,000 cases";
  EXPECT_NE(violation.find(violation_part), std::string::npos) << violation;
  auto again = run_swarm_case(found, testing::bundled_model(), false, bug);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->violation, violation);  // the replay reproduces it exactly
  auto clean = run_swarm_case(found, testing::bundled_model(), false);
  ASSERT_TRUE(clean);
  EXPECT_EQ(clean->violation, "");  // and without the bug the case passes
}

TEST(Swarm, FindsAPlantedBatchDependenceBugAndReplaysIt) {
  expect_found_and_replayed(planted_bug::batch_dependence, "differs with shuffled delivery");
}

TEST(Swarm, FindsAPlantedBugOnlyExecutorCrashesExposeAndReplaysIt) {
  expect_found_and_replayed(planted_bug::restart, "differs with shuffled delivery and executor crashes");
}

}  // namespace
}  // namespace troupe::sim
