// The simulator's MoE pricing (issue 18, point 5): the [moe] table, the routing statistics, the
// hand-computed price of a layer and of a whole run, replay, and reassignment against none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "sim/moe_traffic.hpp"
#include "sim/report.hpp"
#include "sim/sim_topology.hpp"
#include "sim/simulation.hpp"
#include "sim/workload.hpp"
#include "tests/support/sim_fixtures.hpp"

namespace troupe::sim {
namespace {

constexpr const char* tiny_topology = troupe::testing::tiny_sim_topology;

/// Every token to every expert (top_k = n_experts): each of the 2 shards computes 2 rows per token
/// per layer, whatever the draws.
const char* every_expert_moe = R"(
[moe]
n_experts = 4
top_k = 4
num_shards = 2
capacity = 2
expert_row_ns = 10
dispatch_bytes_per_row = 100
link_bandwidth_gb_s = 1
link_latency_us = 0.5
window_steps = 2
)";

expected<sim_topology> parse(const std::string& moe, const topology_overrides& set = {}) {
  return parse_sim_topology(std::string(tiny_topology) + moe, "tiny.toml", TROUPE_SOURCE_DIR, set);
}

TEST(MoeTopology, ReadsTheTableAndDerivesItsDefaultsFromTheShape) {
  auto t = parse("\n[moe]\nn_experts = 8\ntop_k = 2\nnum_shards = 4\ncapacity = 3\nexpert_row_ns = 50\n"
                 "zipf_exponent = 1.5\ndrift_every_s = 0.25\nlink_latency_us = 2\npolicy = \"periodic\"\n"
                 "window_steps = 20\nmoe_lb_max = 1.1\n");
  ASSERT_TRUE(t) << t.error().message;
  const moe_settings& m = t->moe;
  EXPECT_TRUE(m.enabled());
  EXPECT_EQ(m.n_layers, 2);
  EXPECT_EQ(m.n_experts, 8);
  EXPECT_EQ(m.top_k, 2);
  EXPECT_EQ(m.num_shards, 4);
  EXPECT_EQ(m.capacity, 3);
  EXPECT_EQ(m.expert_row_ns, 50);
  EXPECT_EQ(m.zipf_exponent, 1.5);
  EXPECT_EQ(m.drift_every_ns, 250'000'000);
  EXPECT_EQ(m.link_latency_ns, 2000);
  EXPECT_EQ(m.link_bandwidth_gb_s, 50);
  EXPECT_EQ(m.dispatch_bytes_per_row, 2 * 64);         // bf16 activations of dim 64
  EXPECT_EQ(m.expert_bytes, 3.0 * 64 * 256 * 2);       // w1, w2, w3 of hidden 4 x dim, 2 bytes each
  EXPECT_EQ(m.policy, moe_policy::periodic);
  EXPECT_EQ(m.window_steps, 20);
  EXPECT_EQ(m.moe_lb_max, 1.1);
  EXPECT_FALSE(parse("")->moe.enabled());  // no [moe]: a dense model
  auto example = load_sim_topology(std::string(TROUPE_SOURCE_DIR) + "/examples/sim-moe.toml");
  ASSERT_TRUE(example) << example.error().message;
  EXPECT_TRUE(example->moe.enabled());
}

TEST(MoeTopology, BadKeysNameTheProblem) {
  const std::string base = "\n[moe]\nn_experts = 4\ntop_k = 2\nnum_shards = 2\ncapacity = 2\nexpert_row_ns = 1\n";
  const std::pair<std::string, std::string> cases[] = {
      {base + "bogus = 1\n", "tiny.toml:30: [moe]: unknown key 'bogus'"},
      {"\n[moe]\nn_experts = 4\ntop_k = 2\nnum_shards = 2\nexpert_row_ns = 1\n", "tiny.toml:24: [moe]: missing key 'capacity'"},
      {base + "top_k = 5\n", "tiny.toml:30: Error while parsing key-value pair: cannot redefine existing integer 'top_k'"},
      {"\n[moe]\nn_experts = 4\ntop_k = 5\nnum_shards = 2\ncapacity = 2\nexpert_row_ns = 1\n",
       "tiny.toml:24: [moe] top_k = 5 must lie in [1, n_experts = 4]"},
      {"\n[moe]\nn_experts = 8\ntop_k = 2\nnum_shards = 2\ncapacity = 3\nexpert_row_ns = 1\n",
       "tiny.toml:24: [moe] 2 shards of capacity 3 cannot hold 8 experts per layer"},
      {base + "policy = \"greedy\"\n", "tiny.toml:24: [moe] policy must be none or periodic, got 'greedy'"},
      {base + "moe_lb_max = 0.9\n", "tiny.toml:30: [moe] moe_lb_max = 0.900000 is outside [1.000000"},
      {base + "zipf_exponent = -1\n", "tiny.toml:30: [moe] zipf_exponent = -1.000000 is outside [0.000000, 16.000000]"},
      {base + "link_bandwidth_gb_s = 0\n", "tiny.toml:30: [moe] link_bandwidth_gb_s = 0.000000 is outside"},
      {base + "policy = 1\n", "tiny.toml:30: [moe] policy: expected a string"},
      {base + "window_steps = 0\n", "tiny.toml:30: [moe] window_steps = 0.000000 is outside [1.000000"},
  };
  for (const auto& [text, message] : cases) {
    auto t = parse(text);
    ASSERT_FALSE(t) << message;
    EXPECT_EQ(t.error().code, errc::malformed_file);
    EXPECT_NE(t.error().message.find(message), std::string::npos) << t.error().message;
  }
  auto set = parse(base, {{"moe.capacity", "1"}});  // --set is checked like the file
  ASSERT_FALSE(set);
  EXPECT_NE(set.error().message.find("[moe] 2 shards of capacity 1 cannot hold 4 experts per layer"), std::string::npos)
      << set.error().message;
  // moe_lb_max is read by periodic alone; kept with none, so that a sweep can switch policies.
  auto swept = parse(base + "moe_lb_max = 1.3\n", {{"moe.policy", "none"}});
  ASSERT_TRUE(swept) << swept.error().message;
  EXPECT_EQ(swept->moe.policy, moe_policy::none);
  EXPECT_EQ(swept->moe.moe_lb_max, 1.3);
}

TEST(MoeRouting, ZipfSharesByRankCappedAtOneOverTopK) {
  std::vector<double> uniform = expert_shares(4, 1, 0.0, 7);
  EXPECT_EQ(uniform, std::vector<double>(4, 0.25));
  // Weights 1, 1/2, 1/3, 1/4 (sum 25/12): 12/25, 6/25, 4/25, 3/25, in a drawn order.
  std::vector<double> zipf = expert_shares(4, 1, 1.0, 7);
  std::sort(zipf.rbegin(), zipf.rend());
  const double expected_zipf[] = {12.0 / 25, 6.0 / 25, 4.0 / 25, 3.0 / 25};
  for (size_t i = 0; i < 4; i++) EXPECT_NEAR(zipf[i], expected_zipf[i], 1e-15);
  // top_k 3 caps 12/25 at 1/3; the other 2/3 goes by weight: 4/13, 8/39, 2/13.
  std::vector<double> capped = expert_shares(4, 3, 1.0, 7);
  std::sort(capped.rbegin(), capped.rend());
  const double expected_capped[] = {1.0 / 3, 4.0 / 13, 8.0 / 39, 2.0 / 13};
  for (size_t i = 0; i < 4; i++) EXPECT_NEAR(capped[i], expected_capped[i], 1e-15);
  EXPECT_EQ(expert_shares(8, 2, 1.2, 7), expert_shares(8, 2, 1.2, 7));  // a function of the seed
  EXPECT_NE(expert_shares(8, 2, 1.2, 7), expert_shares(8, 2, 1.2, 8));
}

TEST(MoeRouting, DrawnRowsSumToTokensTimesTopKAndFollowTheShares) {
  const std::vector<double> shares = expert_shares(8, 2, 1.0, 3);
  random_source random(11);
  std::vector<int64_t> total(8, 0);
  for (int64_t tokens : {0, 1, 3, 7, 40, 500, 2048}) {
    for (int i = 0; i < 200; i++) {
      const std::vector<int64_t> rows = draw_expert_rows(shares, tokens, 2, random);
      EXPECT_EQ(std::accumulate(rows.begin(), rows.end(), int64_t{0}), 2 * tokens);
      for (int64_t r : rows) EXPECT_TRUE(r >= 0 && r <= tokens) << r << " of " << tokens;
      for (size_t e = 0; e < 8; e++) total[e] += rows[e];
    }
  }
  const double all = 2.0 * 200 * (0 + 1 + 3 + 7 + 40 + 500 + 2048);
  for (size_t e = 0; e < 8; e++) EXPECT_NEAR(static_cast<double>(total[e]) / all, shares[e], 0.01) << e;
  random_source every(5);  // top_k = n_experts: every expert gets every token
  EXPECT_EQ(draw_expert_rows(expert_shares(4, 4, 2.0, 1), 9, 4, every), (std::vector<int64_t>{9, 9, 9, 9}));
}

TEST(MoePricing, ALayerWaitsForItsBusiestShardAndItsLink) {
  // 4 experts on 2 shards (round robin: experts 0 and 2 on shard 0, 1 and 3 on shard 1); rows
  // 5, 1, 2, 0: shard 0 computes 7, shard 1 computes 1. 7 x 100 ns of compute, and each way
  // 500 ns + 7 x 1000 bytes at 1 byte/ns: 2 x 7500 ns.
  moe_settings s;
  s.n_experts = 4;
  s.top_k = 2;
  s.num_shards = 2;
  s.capacity = 2;
  s.expert_row_ns = 100;
  s.dispatch_bytes_per_row = 1000;
  s.link_bandwidth_gb_s = 1;
  s.link_latency_ns = 500;
  const std::vector<int64_t> shards =
      moe::layer_shard_rows(moe::expert_placement::round_robin(1, 4, 2), 0, {5, 1, 2, 0}, 0);
  EXPECT_EQ(shards, (std::vector<int64_t>{7, 1}));
  const moe_layer_cost c = price_moe_layer(s, shards);
  EXPECT_EQ(c.compute_ns, 700);
  EXPECT_EQ(c.communication_ns, 15000);
  EXPECT_EQ(price_moe_layer(s, {0, 0}).compute_ns + price_moe_layer(s, {0, 0}).communication_ns, 0);
  s.num_shards = 1;  // one shard: nothing crosses a link
  const moe_layer_cost local = price_moe_layer(s, {8});
  EXPECT_EQ(local.compute_ns, 800);
  EXPECT_EQ(local.communication_ns, 0);
}

TEST(MoePricing, PeriodicMovesAfterTheMigrationWhileTheOldPlacementServes) {
  moe_settings s;
  s.n_experts = 4;
  s.top_k = 1;
  s.num_shards = 2;
  s.capacity = 3;
  s.zipf_exponent = 4;  // one expert takes ~93% of the rows
  s.expert_row_ns = 1;
  s.expert_bytes = 1000;
  s.link_bandwidth_gb_s = 1;
  s.policy = moe_policy::periodic;
  s.window_steps = 2;
  s.moe_lb_max = 1.1;
  auto m = moe_traffic::create(s, 1, 2);
  ASSERT_TRUE(m) << m.error().message;
  const moe::expert_placement before = m->placement();
  EXPECT_EQ(before, moe::expert_placement::round_robin(1, 4, 2));
  (void)m->price_step(100, 0, 0);
  m->check_invariants();
  const int64_t second = m->price_step(100, 1000, 500);  // ends at 1500 + its MoE time
  m->check_invariants();
  ASSERT_EQ(m->counts().window_moe_lb.size(), 1u);
  EXPECT_GT(m->counts().window_moe_lb[0], 1.5);
  const int64_t migration = m->counts().migration_ns;
  EXPECT_TRUE(migration == 1000 || migration == 2000 || migration == 3000) << migration;  // 1-3 experts to a shard
  const int64_t ready = 1500 + second + migration;
  (void)m->price_step(100, ready - 1, 0);  // starts before the weights are there
  m->check_invariants();
  EXPECT_EQ(m->placement(), before);
  EXPECT_EQ(m->counts().num_reassignments, 0);
  (void)m->price_step(100, ready, 0);
  m->check_invariants();
  EXPECT_FALSE(m->placement() == before);
  EXPECT_EQ(m->counts().num_reassignments, 1);
  EXPECT_EQ(m->counts().num_steps, 4);
  s.capacity = 1;
  auto bad = moe_traffic::create(s, 1, 2);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "2 shards of capacity 1 cannot hold 4 experts per layer");
}

using troupe::testing::sim_run_options;

TEST(MoeSimulation, HandComputedTimesWithEveryTokenOnEveryExpert) {
  // The dense run of Simulation.HandComputedTimes: steps of 1396 (prefill of 16), 1127 and 1128
  // ns. Each of 2 layers adds its busiest shard: 2 rows per token, 10 ns each, and each way
  // 500 ns + 100 bytes per row at 1 byte/ns. Prefill: 2 x (320 + 2 x (500 + 3200)) = 15440;
  // decode: 2 x (20 + 2 x (500 + 200)) = 2840.
  auto t = parse(every_expert_moe);
  ASSERT_TRUE(t) << t.error().message;
  auto r = run_simulation(sim_run_options(*t, {trace_request{0, 16, 3, {}}}, 7));
  ASSERT_TRUE(r) << r.error().message;
  const request_record& q = r->requests.at(0);
  EXPECT_EQ(q.finish, "length");
  EXPECT_EQ(q.first_token_ns, 1396 + 15440);
  EXPECT_EQ(q.itl_ns, (std::vector<int64_t>{1127 + 2840, 1128 + 2840}));
  EXPECT_EQ(q.finish_ns, 16836 + 3967 + 3968);
  ASSERT_TRUE(r->moe.has_value());
  EXPECT_EQ(r->moe->num_steps, 3);
  EXPECT_EQ(r->moe->compute_ns, 2 * 320 + 4 * 20);
  EXPECT_EQ(r->moe->communication_ns, 2 * 7400 + 4 * 1400);
  EXPECT_EQ(r->moe->window_moe_lb, std::vector<double>{1.0});  // steps 0-1; the third starts a window
  EXPECT_EQ(r->moe->num_reassignments, 0);
  const std::optional<moe_metrics> m = summarize_moe(*r);
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(m->step_share, (720.0 + 20400.0) / 24771.0);
  EXPECT_DOUBLE_EQ(m->communication_share, 20400.0 / 24771.0);
  EXPECT_NE(summary_json(*r, {}, 7).find("\"moe\": {\"windows\": 1, \"moe_lb\": {\"mean\": 1, \"p99\": 1}, "
                                         "\"reassignments\": 0, \"migration_ms\": 0, \"step_share\": 0.85261, "),
            std::string::npos)
      << summary_json(*r, {}, 7);
  EXPECT_EQ(moe_report_line(*r), "moe: 1 windows, moe_lb mean 1 p99 1, 0 reassignments (migration 0 ms), MoE 85.261% "
                                 "of step time (communication 82.3544%)");
}

/// A skewed router whose popular experts change every 50 ms, 8 experts on 4 shards.
std::string drifting_moe(const std::string& policy) {
  return "\n[moe]\nn_experts = 8\ntop_k = 2\nnum_shards = 4\ncapacity = 3\nexpert_row_ns = 400\nzipf_exponent = 1.2\n"
         "drift_every_s = 0.05\nlink_latency_us = 5\nlink_bandwidth_gb_s = 50\nexpert_bytes = 20000000\n"
         "window_steps = 10\nmoe_lb_max = 1.1\npolicy = \"" + policy + "\"\n";
}

std::vector<trace_request> moe_workload() {
  synthetic_options s;
  s.num_requests = 400;
  s.rate_per_s = 800;
  s.input_mean = 100;
  s.output_mean = 60;
  s.seed = 3;
  return synthetic_workload(s);
}

TEST(MoeSimulation, SameSeedGivesTheSameSummaryAndAnotherSeedOtherDraws) {
  auto t = parse(drifting_moe("periodic"));
  ASSERT_TRUE(t) << t.error().message;
  auto a = run_simulation(sim_run_options(*t, moe_workload(), 5));
  auto b = run_simulation(sim_run_options(*t, moe_workload(), 5));
  auto c = run_simulation(sim_run_options(*t, moe_workload(), 6));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(summary_json(*a, {}, 5), summary_json(*b, {}, 5));
  EXPECT_EQ(a->event_log_sha256, b->event_log_sha256);
  EXPECT_EQ(a->moe->window_moe_lb, b->moe->window_moe_lb);
  EXPECT_NE(a->moe->window_moe_lb, c->moe->window_moe_lb);
  EXPECT_NE(a->event_log_sha256, c->event_log_sha256);
}

TEST(MoeSimulation, PeriodicReassignmentBeatsNoneOnASkewedDriftingRouter) {
  summary_metrics dense_metrics[2];
  moe_metrics moe[2];
  const char* policies[] = {"none", "periodic"};
  for (int i = 0; i < 2; i++) {
    auto t = parse(drifting_moe(policies[i]));
    ASSERT_TRUE(t) << t.error().message;
    auto r = run_simulation(sim_run_options(*t, moe_workload(), 1));
    ASSERT_TRUE(r) << r.error().message;
    dense_metrics[i] = summarize(*r, {});
    moe[i] = *summarize_moe(*r);
    EXPECT_EQ(dense_metrics[i].num_completed, 400);
    std::printf("policy %-8s windows %lld  moe_lb mean %.4f p99 %.4f  reassignments %lld  migration %.3f ms  "
                "MoE share %.4f  TPOT mean %.4f ms p99 %.4f ms\n",
                policies[i], static_cast<long long>(moe[i].num_windows), moe[i].moe_lb.mean, moe[i].moe_lb.p99,
                static_cast<long long>(moe[i].num_reassignments), moe[i].migration_ms, moe[i].step_share,
                dense_metrics[i].tpot_ms.mean, dense_metrics[i].tpot_ms.p99);
  }
  EXPECT_EQ(moe[0].num_reassignments, 0);
  EXPECT_GT(moe[1].num_reassignments, 0);
  EXPECT_LT(moe[1].moe_lb.mean, moe[0].moe_lb.mean);
  EXPECT_LT(dense_metrics[1].tpot_ms.mean, dense_metrics[0].tpot_ms.mean);
}

}  // namespace
}  // namespace troupe::sim
