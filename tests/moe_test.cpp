#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/system/connect.hpp"
#include "actors/expert_shard_actor.hpp"
#include "actors/system/tls.hpp"
#include "topology/expert_shard_hosts.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/expert_shard.hpp"
#include "runtime/model/moe_split.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/moe/placement.hpp"
#include "runtime/moe/reassignment.hpp"
#include "runtime/moe/rebalance.hpp"
#include "runtime/moe/routing.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "tests/support/actor_config.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/other_node.hpp"
#include "tests/support/process.hpp"
#include "tests/support/random_llama.hpp"

namespace troupe::moe {
namespace {

namespace fs = std::filesystem;
using model::checkpoint;
using model::kernel_path;
using model::transformer;
using actors::expert_shard_actor;

// ---- routing ----------------------------------------------------------------------------------

TEST(Route, TopKRenormalizesTheKeptProbabilities) {
  // Row 0: logits 0, ln 2, ln 4, ln 8 -> probabilities 1/15, 2/15, 4/15, 8/15; top 2 = {2, 3}.
  // Row 1: a tie between experts 1 and 3 for second place goes to the lower id.
  const float ln2 = std::log(2.0f);
  const float logits[] = {0.0f, ln2, 2 * ln2, 3 * ln2, /**/ 5.0f, 1.0f, 0.0f, 1.0f};
  const routing r = route(logits, 2, 4, 2, router_kind::top_k, kernels::cpu::exp_source::kernels);
  ASSERT_EQ(r.choices.size(), 4u);
  EXPECT_EQ(r.row(0)[0].expert, 2);
  EXPECT_EQ(r.row(0)[1].expert, 3);
  EXPECT_NEAR(r.row(0)[0].gate, 1.0f / 3.0f, 1e-6f);
  EXPECT_NEAR(r.row(0)[1].gate, 2.0f / 3.0f, 1e-6f);
  EXPECT_EQ(r.row(1)[0].expert, 0);
  EXPECT_EQ(r.row(1)[1].expert, 1);
  EXPECT_NEAR(r.row(1)[0].gate + r.row(1)[1].gate, 1.0f, 1e-6f);
}

TEST(Route, AllRouterGivesEveryExpertGateOne) {
  const routing r = route(nullptr, 3, 4, 4, router_kind::all, kernels::cpu::exp_source::kernels);
  ASSERT_EQ(r.choices.size(), 12u);
  for (int32_t row = 0; row < 3; row++)
    for (int32_t e = 0; e < 4; e++) {
      EXPECT_EQ(r.row(row)[e].expert, e);
      EXPECT_EQ(r.row(row)[e].gate, 1.0f);  // exactly: gate × output is the output
    }
}

// ---- placement, plan, combine -----------------------------------------------------------------

TEST(Placement, RoundRobinAndReplicas) {
  expert_placement p = expert_placement::round_robin(2, 5, 2);
  EXPECT_EQ(p.replicas(0, 0), std::vector<int32_t>{0});
  EXPECT_EQ(p.replicas(1, 3), std::vector<int32_t>{1});
  EXPECT_FALSE(p.can_add_replica(1, 3, 1));  // already there
  EXPECT_FALSE(p.can_add_replica(1, 3, 2));  // no shard 2
  EXPECT_FALSE(p.can_add_replica(1, 3, -1));
  ASSERT_TRUE(p.can_add_replica(1, 3, 0));
  p.add_replica(1, 3, 0);
  EXPECT_EQ(p.replicas(1, 3), (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(p.holds(0, 1, 3));
  EXPECT_FALSE(p.holds(0, 0, 3));
  p.check_invariants();
}

// ---- load, moe_lb, rebalance --------------------------------------------------------------------

/// A window's load: rows[layer][expert].
expert_load load_of(const std::vector<std::vector<int64_t>>& rows) {
  expert_load load(static_cast<int32_t>(rows.size()), static_cast<int32_t>(rows[0].size()));
  for (size_t l = 0; l < rows.size(); l++)
    for (size_t e = 0; e < rows[l].size(); e++) load.add(static_cast<int32_t>(l), static_cast<int32_t>(e), rows[l][e]);
  return load;
}

TEST(Rebalance, ReplicaRowsSplitAsPlanDispatchDoes) {
  EXPECT_EQ(replica_rows(10, 3, 0), 3);
  EXPECT_EQ(replica_rows(10, 3, 1), 3);
  EXPECT_EQ(replica_rows(10, 3, 2), 4);
  EXPECT_EQ(replica_rows(1, 2, 0), 0);
  EXPECT_EQ(replica_rows(1, 2, 1), 1);
}

TEST(Rebalance, MoeLbIsTheSumOfEachLayersBusiestShardOverTheSumOfItsMeans) {
  // Layer 0: rows 12 2 1 1 on round robin over two shards: shard 0 has 12 + 1, shard 1 has 2 + 1.
  // Layer 1: 4 4 4 4: 8 and 8.
  const expert_load load = load_of({{12, 2, 1, 1}, {4, 4, 4, 4}});
  const shard_load shards = expected_shard_load(expert_placement::round_robin(2, 4, 2), load);
  EXPECT_EQ(shards.rows(0, 0), 13);
  EXPECT_EQ(shards.rows(0, 1), 3);
  EXPECT_EQ(shards.rows(1, 0), 8);
  EXPECT_EQ(shards.rows(1, 1), 8);
  EXPECT_DOUBLE_EQ(moe_lb(shards), (13.0 + 8.0) / (8.0 + 8.0));
  EXPECT_DOUBLE_EQ(moe_lb(shard_load(2, 3)), 1.0);  // no rows
  // A replicated expert's rows split as plan_dispatch splits them: 12 as 6 + 6.
  expert_placement p = expert_placement::round_robin(2, 4, 2);
  p.add_replica(0, 0, 1);
  const shard_load replicated = expected_shard_load(p, load);
  EXPECT_EQ(replicated.rows(0, 0), 7);
  EXPECT_EQ(replicated.rows(0, 1), 9);
}

TEST(Rebalance, ReplicatesTheHotExpertAndPacksLargestFirst) {
  // Layer 0: the mean per shard is 8; expert 0's 12 rows exceed it: two replicas of 6. Packed 6
  // (shard 0), 6 (shard 1), 2 (tie: shard 0), 1 (shard 1), 1 (tie at 8: shard 0 is full at 3).
  // Layer 1: no rows; every replica is packed on the lowest shard with room.
  const expert_load load = load_of({{12, 2, 1, 1}, {0, 0, 0, 0}});
  auto p = rebalance(load, /*num_shards=*/2, /*capacity=*/3);
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(*p, expert_placement::of_replicas(2, 4, 2, {{0, 1}, {0}, {1}, {1}, {0}, {0}, {0}, {1}}));
  EXPECT_DOUBLE_EQ(moe_lb(expected_shard_load(*p, load)), 1.0);
  EXPECT_DOUBLE_EQ(moe_lb(expected_shard_load(expert_placement::round_robin(2, 4, 2), load)), 13.0 / 8.0);
  // Capacity 2: no slot for a replica; the packing keeps to two experts per shard.
  auto tight = rebalance(load, 2, 2);
  ASSERT_TRUE(tight) << tight.error().message;
  EXPECT_EQ(*tight, expert_placement::of_replicas(2, 4, 2, {{0}, {1}, {1}, {0}, {0}, {0}, {1}, {1}}));
  // The same window gives the same placement.
  EXPECT_EQ(*rebalance(load, 2, 3), *p);
}

TEST(Rebalance, RefusesShardsThatCannotHoldEveryExpert) {
  const expert_load load = load_of({{1, 1, 1, 1}});
  auto small = rebalance(load, 1, 3);
  ASSERT_FALSE(small);
  EXPECT_EQ(small.error().code, errc::invalid_argument);
  EXPECT_EQ(small.error().message, "rebalance: 1 shards of capacity 3 cannot hold 4 experts per layer");
  EXPECT_FALSE(rebalance(load, 0, 4));
  EXPECT_FALSE(rebalance(load, 4, 0));
}

/// One layer's requests on `p` for rows routed to experts 0..3: 12, 2, 1 and 1 rows (dim 1).
std::vector<expert_request> skewed_requests(const expert_placement& p, int64_t turn) {
  routing r{16, 1, {}};
  for (int32_t row = 0; row < 16; row++) r.choices.push_back({row < 12 ? 0 : row < 14 ? 1 : row - 12, 1.0f});
  const std::vector<float> input(16, 1.0f);
  return plan_dispatch(p, 0, r, input.data(), 1, turn).requests;
}

TEST(Reassignment, ProposesTheRebalancedPlacementAtTheEndOfAnImbalancedWindowOnce) {
  const expert_placement from = expert_placement::round_robin(1, 4, 2);
  auto r = reassigner::create(from, {/*window_steps=*/2, /*capacity=*/3, /*moe_lb_max=*/1.15});
  ASSERT_TRUE(r) << r.error().message;
  const auto step = [&](const expert_placement& p, int64_t turn) {
    r->add(skewed_requests(p, turn));
    return r->end_step();
  };
  EXPECT_FALSE(step(from, 0).has_value());  // one step of two
  std::optional<window_report> first = step(from, 1);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->first_step, 0);
  EXPECT_DOUBLE_EQ(first->moe_lb, 13.0 / 8.0);  // shard 0: 12 + 1 rows of 16 per step
  const expert_placement to = expert_placement::of_replicas(1, 4, 2, {{0, 1}, {0}, {1}, {1}});
  ASSERT_TRUE(first->next.has_value());
  EXPECT_EQ(*first->next, to);
  EXPECT_TRUE(r->move_pending());
  (void)step(from, 2);
  std::optional<window_report> waiting = step(from, 3);  // still imbalanced, but a move is pending
  ASSERT_TRUE(waiting.has_value());
  EXPECT_EQ(waiting->first_step, 2);
  EXPECT_FALSE(waiting->next.has_value());
  r->switch_to(to);
  EXPECT_EQ(r->current(), to);
  (void)step(to, 4);
  std::optional<window_report> after = step(to, 5);
  ASSERT_TRUE(after.has_value());
  EXPECT_DOUBLE_EQ(after->moe_lb, 1.0);  // 6 + 2 and 6 + 1 + 1 rows
  EXPECT_FALSE(after->next.has_value());
  EXPECT_FALSE(reassigner::create(from, {0, 3, 1.15}));
  EXPECT_FALSE(reassigner::create(from, {2, 1, 1.15}));  // 2 shards of 1 for 4 experts
  EXPECT_FALSE(reassigner::create(from, {2, 3, 0.5}));
  EXPECT_FALSE(reassigner::create(from, {2, 3, 1.15, 0}));
}

// A move that failed is cancelled: the placement stays, and the next imbalanced window proposes
// the same placement again (it is measured on the same load).
TEST(Reassignment, ProposesAgainAfterAFailedMove) {
  const expert_placement from = expert_placement::round_robin(1, 4, 2);
  auto r = reassigner::create(from, {/*window_steps=*/1, /*capacity=*/3, /*moe_lb_max=*/1.15, /*move_steps_max=*/1});
  ASSERT_TRUE(r) << r.error().message;
  r->add(skewed_requests(from, 0));
  std::optional<window_report> first = r->end_step();
  ASSERT_TRUE(first.has_value() && first->next.has_value());
  EXPECT_FALSE(r->move_overdue());
  r->add(skewed_requests(from, 1));
  std::optional<window_report> pending = r->end_step();
  ASSERT_TRUE(pending.has_value());
  EXPECT_FALSE(pending->next.has_value());
  EXPECT_TRUE(r->move_overdue());  // one step after the proposal: the caller waits for the move now
  r->cancel_move();
  EXPECT_FALSE(r->move_pending());
  EXPECT_FALSE(r->move_overdue());
  EXPECT_EQ(r->current(), from);
  r->add(skewed_requests(from, 2));
  std::optional<window_report> again = r->end_step();
  ASSERT_TRUE(again.has_value());
  EXPECT_DOUBLE_EQ(again->moe_lb, 13.0 / 8.0);
  ASSERT_TRUE(again->next.has_value());
  EXPECT_EQ(*again->next, *first->next);
  EXPECT_TRUE(r->move_pending());
}

TEST(Rebalance, CountedRowsSplitOverTheShardsAsPlanDispatchSplitsTheRequests) {
  // Expert 0 (12 rows) on shards 0, 1 and 2 splits 4 + 4 + 4; expert 1's 2 rows on shards 0 and 1
  // split 1 + 1; expert 2 (1 row) is on shard 2, expert 3 (1 row) on shard 0: 6, 5 and 5 rows.
  expert_placement p = expert_placement::round_robin(1, 4, 3);
  p.add_replica(0, 0, 1);
  p.add_replica(0, 0, 2);
  p.add_replica(0, 1, 0);
  EXPECT_EQ(layer_shard_rows(p, 0, {12, 2, 1, 1}, 0), (std::vector<int64_t>{6, 5, 5}));
  for (int64_t turn = 0; turn < 6; turn++) {
    shard_load listed(1, 3);
    listed.add(skewed_requests(p, turn));
    const std::vector<int64_t> counted = layer_shard_rows(p, 0, {12, 2, 1, 1}, turn);
    for (int32_t s = 0; s < 3; s++) EXPECT_EQ(counted[static_cast<size_t>(s)], listed.rows(0, s)) << turn;
  }
}

TEST(Reassignment, CountedRowsGiveTheSameWindowsAsTheRequests) {
  const expert_placement from = expert_placement::round_robin(1, 4, 2);
  auto listed = reassigner::create(from, {2, 3, 1.15});
  auto counted = reassigner::create(from, {2, 3, 1.15});
  ASSERT_TRUE(listed && counted);
  for (int64_t turn = 0; turn < 4; turn++) {
    listed->add(skewed_requests(from, turn));
    EXPECT_EQ(counted->add(0, {12, 2, 1, 1}, turn), (std::vector<int64_t>{13, 3}));  // 12 + 1 and 2 + 1
    const std::optional<window_report> a = listed->end_step(), b = counted->end_step();
    ASSERT_EQ(a.has_value(), b.has_value());
    if (!a) continue;
    EXPECT_DOUBLE_EQ(a->moe_lb, b->moe_lb);
    EXPECT_EQ(a->next, b->next);
  }
}

TEST(Plan, SplitsAReplicatedExpertsRowsByRowIndexAndCombinesByExpertThenRow) {
  // 4 rows, 3 experts, top 2. Expert 1 has replicas on shards 0 and 1.
  expert_placement p = expert_placement::round_robin(1, 3, 2);  // e0 -> s0, e1 -> s1, e2 -> s0
  p.add_replica(0, 1, 0);
  routing r{4, 2, {{0, 0.5f}, {1, 0.5f}, /**/ {1, 0.25f}, {2, 0.75f}, /**/ {0, 1.0f}, {1, 0.0f}, /**/ {1, 0.5f},
                   {2, 0.5f}}};
  const int32_t dim = 2;
  const float input[] = {0, 1, 10, 11, 20, 21, 30, 31};  // (rows, dim): row r = {10r, 10r + 1}
  const dispatch_plan plan = plan_dispatch(p, 0, r, input, dim);
  ASSERT_EQ(plan.requests.size(), 2u);
  // Expert 1's rows 0, 1, 2, 3: the first half to shard 0, the second to shard 1.
  const expert_request& s0 = plan.requests[0];
  ASSERT_EQ(s0.batches.size(), 3u);
  EXPECT_EQ(s0.batches[0].expert, 0);
  EXPECT_EQ(s0.batches[0].rows, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(s0.batches[1].expert, 1);
  EXPECT_EQ(s0.batches[1].rows, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(s0.batches[2].expert, 2);
  EXPECT_EQ(s0.batches[2].rows, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(s0.rows, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(s0.input, std::vector<float>(input, input + 8));
  const expert_request& s1 = plan.requests[1];
  ASSERT_EQ(s1.batches.size(), 1u);
  EXPECT_EQ(s1.batches[0].expert, 1);
  EXPECT_EQ(s1.batches[0].rows, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(s1.rows, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(s1.input, (std::vector<float>{20, 21, 30, 31}));
  ASSERT_EQ(plan.entries.size(), 8u);
  for (size_t i = 1; i < plan.entries.size(); i++) {  // by expert, then row
    const combine_entry &a = plan.entries[i - 1], &b = plan.entries[i];
    EXPECT_TRUE(a.expert < b.expert || (a.expert == b.expert && a.row < b.row)) << i;
  }
  // Replies: expert e's output for row r is {100e + r, 0}.
  std::vector<expert_reply> replies(2);
  for (size_t s = 0; s < 2; s++)
    for (const expert_batch& b : plan.requests[s].batches)
      for (int32_t row : b.rows) replies[s].output.insert(replies[s].output.end(), {100.0f * b.expert + row, 0.0f});
  std::vector<float> out(8, -1.0f);
  combine(plan, replies, out.data(), 4, dim);
  EXPECT_EQ(out, (std::vector<float>{0.5f * 0 + 0.5f * 100, 0,                 // row 0: e0, e1
                                     0.25f * 101 + 0.75f * 201, 0,           // row 1: e1, e2
                                     1.0f * 2 + 0.0f * 102, 0,               // row 2: e0, e1
                                     0.5f * 103 + 0.5f * 203, 0}));          // row 3: e1, e2
  // Turn 1: the halves swap replicas, rows 0, 1 to shard 1 and rows 2, 3 to shard 0.
  const dispatch_plan turned = plan_dispatch(p, 0, r, input, dim, 1);
  ASSERT_EQ(turned.requests[0].batches.size(), 3u);
  EXPECT_EQ(turned.requests[0].batches[1].rows, (std::vector<int32_t>{2, 3}));
  ASSERT_EQ(turned.requests[1].batches.size(), 1u);
  EXPECT_EQ(turned.requests[1].batches[0].rows, (std::vector<int32_t>{0, 1}));
}

/// A naive model of plan + combine: per row, Σ gate × output over its choices in expert id order.
/// Expert e's output for row r is `fake_output(e, r, d)`; a shard computes it from the request.
float fake_output(int32_t expert, int32_t row, int32_t d, const float* input, int32_t dim) {
  return input[static_cast<int64_t>(row) * dim + d] * static_cast<float>(expert + 1) + 0.1f * static_cast<float>(d);
}

TEST(Plan, RandomRoutingsAndPlacementsCombineToTheNaiveSumBitForBit) {
  std::mt19937_64 rng(20261204);  // fixed: a failure names its trial
  for (int32_t trial = 0; trial < 300; trial++) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const int32_t experts = 1 + static_cast<int32_t>(rng() % 8), top_k = 1 + static_cast<int32_t>(rng() % experts);
    const int32_t shards = 1 + static_cast<int32_t>(rng() % 5), rows = static_cast<int32_t>(rng() % 20), dim = 3;
    expert_placement p = expert_placement::round_robin(2, experts, shards);
    for (int32_t i = 0; i < 6; i++) {
      const auto l = static_cast<int32_t>(rng() % 2), e = static_cast<int32_t>(rng() % experts);
      const auto s = static_cast<int32_t>(rng() % shards);
      if (p.can_add_replica(l, e, s)) p.add_replica(l, e, s);
    }
    routing r{rows, top_k, {}};
    std::vector<float> input(static_cast<size_t>(rows) * dim);
    for (float& v : input) v = static_cast<float>(rng() % 1000) / 7.0f;
    for (int32_t row = 0; row < rows; row++) {
      std::vector<int32_t> ids(static_cast<size_t>(experts));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::sort(ids.begin(), ids.begin() + top_k);
      for (int32_t i = 0; i < top_k; i++) r.choices.push_back({ids[i], static_cast<float>(rng() % 100) / 33.0f});
    }
    const int32_t layer = static_cast<int32_t>(rng() % 2);
    const dispatch_plan plan = plan_dispatch(p, layer, r, input.data(), dim, static_cast<int64_t>(rng() % 7));
    std::vector<expert_reply> replies(static_cast<size_t>(shards));
    for (int32_t s = 0; s < shards; s++) {
      const expert_request& q = plan.requests[static_cast<size_t>(s)];
      for (const expert_batch& b : q.batches) {
        ASSERT_TRUE(p.holds(s, layer, b.expert));
        for (int32_t row : b.rows) {
          const auto at = std::lower_bound(q.rows.begin(), q.rows.end(), row) - q.rows.begin();
          ASSERT_LT(static_cast<size_t>(at), q.rows.size());
          for (int32_t d = 0; d < dim; d++)
            replies[static_cast<size_t>(s)].output.push_back(fake_output(b.expert, 0, d, &q.input[static_cast<size_t>(at) * dim], dim));
        }
      }
    }
    std::vector<float> got(input.size(), -1.0f), want(input.size(), 0.0f);
    combine(plan, replies, got.data(), rows, dim);
    for (int32_t row = 0; row < rows; row++)
      for (int32_t i = 0; i < top_k; i++)
        for (int32_t d = 0; d < dim; d++)
          want[static_cast<size_t>(row) * dim + d] += r.row(row)[i].gate * fake_output(r.row(row)[i].expert, row, d, input.data(), dim);
    ASSERT_TRUE(got.empty() || std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);  // no rows: nothing
  }
}

// ---- the MoE checkpoints of stories260K ---------------------------------------------------------

/// stories260K split four ways: with the all router, a random top-2 router and a skewed one,
/// written once per test process.
class Moe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("troupe_moe_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    auto ck = checkpoint::load(testing::bundled_model());
    ASSERT_TRUE(ck) << ck.error().message;
    dense_ = new checkpoint(std::move(*ck));
    all_ = new checkpoint(split("all.bin", {}));
    random_ = new checkpoint(split("random.bin", random_options()));
    skewed_ = new checkpoint(split("skewed.bin", skewed_options()));
    auto tok = tokenizer::load(testing::bundled_tokenizer(), dense_->config().vocab_size);
    ASSERT_TRUE(tok) << tok.error().message;
    tokenizer_ = new tokenizer(std::move(*tok));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete skewed_;
    delete random_;
    delete all_;
    delete dense_;
    fs::remove_all(dir_);
  }

  static model::moe_split_options random_options() {
    model::moe_split_options o;
    o.top_k = 2;
    o.router = model::router_init::random;
    o.seed = 7;
    return o;
  }
  static model::moe_split_options skewed_options() {
    model::moe_split_options o = random_options();
    o.router = model::router_init::skewed;
    return o;
  }

  static std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  static checkpoint split(const std::string& name, const model::moe_split_options& o) {
    auto bytes = model::to_moe(*dense_, o);
    EXPECT_TRUE(bytes) << bytes.error().message;
    auto ck = checkpoint::load(write(name, *bytes));
    EXPECT_TRUE(ck) << ck.error().message;
    return std::move(*ck);
  }

  static fs::path dir_;
  static checkpoint* dense_;
  static checkpoint* all_;
  static checkpoint* random_;
  static checkpoint* skewed_;
  static tokenizer* tokenizer_;
};

fs::path Moe::dir_;
checkpoint* Moe::dense_ = nullptr;
checkpoint* Moe::all_ = nullptr;
checkpoint* Moe::random_ = nullptr;
checkpoint* Moe::skewed_ = nullptr;
tokenizer* Moe::tokenizer_ = nullptr;

TEST_F(Moe, SplitCutsEachFfnIntoConsecutiveHiddenUnits) {
  const model::model_config& c = all_->config();
  EXPECT_EQ(c.hidden_dim, 43);  // 172 / 4
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 5);
  const model::moe_weights* m = all_->moe();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->n_experts, 4);
  EXPECT_EQ(m->top_k, 4);
  EXPECT_EQ(m->router, router_kind::all);
  EXPECT_EQ(all_->w().w1, nullptr);
  const model::weights& d = dense_->w();
  // Layer 3, expert 2, hidden unit 5 is dense hidden unit 2·43 + 5 = 91.
  const int64_t at = m->expert_offset(c, 3, 2), dense_layer = 3 * 172 * 64;
  for (int32_t j = 0; j < 64; j++) {
    EXPECT_EQ(m->w1[at + 5 * 64 + j], d.w1[dense_layer + 91 * 64 + j]);
    EXPECT_EQ(m->w3[at + 5 * 64 + j], d.w3[dense_layer + 91 * 64 + j]);
    EXPECT_EQ(m->w2[at + j * 43 + 5], d.w2[dense_layer + j * 172 + 91]);  // w2 (dim, hidden)
  }
  EXPECT_EQ(std::memcmp(all_->w().wq, d.wq, 5 * 64 * 64 * sizeof(float)), 0);
  const model::moe_weights* r = random_->moe();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->top_k, 2);
  EXPECT_EQ(r->router, router_kind::top_k);
}

/// Logits at each position of the 200-token greedy golden run (teacher-forced: the golden ids
/// are the inputs), one (vocab) vector per position.
std::vector<float> logits_along_golden(transformer& t) {
  const testing::golden_case golden = testing::golden("t0_n200");
  const model::model_config& c = t.config();
  model::kv_cache cache(c, c.seq_len / 16, 16);
  std::vector<int32_t> table(static_cast<size_t>(c.seq_len / 16));
  for (size_t i = 0; i < table.size(); i++) table[i] = static_cast<int32_t>(i);
  std::vector<float> all, logits;
  for (int32_t pos = 0; pos < 200; pos++) {
    t.forward({model::forward_row{golden.token_ids[static_cast<size_t>(pos)], pos, table.data(), true}}, cache, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// The split sums each FFN's w2 products in four runs of 43 and then adds the four, where the dense
// model sums all 172 in one run: the same terms in another order. That costs a few ulps per layer;
// at logits of up to 22 (one ulp: 1.9e-6) the largest difference over the run is 1.62e-5, about
// 8 ulps (4.8e-6 at position 0, before attention spreads it), so the bound is 2e-5, not 1e-5.
TEST_F(Moe, AllRouterSplitMatchesTheDenseLogitsAtEveryPositionOfTheGreedyRun) {
  for (auto path : {kernel_path::reference, kernel_path::fast}) {
    transformer dense(*dense_, path), moe(*all_, path);
    const std::vector<float> a = logits_along_golden(dense), b = logits_along_golden(moe);
    ASSERT_EQ(a.size(), 200u * 512u);
    ASSERT_EQ(b.size(), a.size());
    float max_difference = 0.0f, max_logit = 0.0f;
    for (size_t i = 0; i < a.size(); i++) {
      max_difference = std::max(max_difference, std::fabs(a[i] - b[i]));
      max_logit = std::max(max_logit, std::fabs(a[i]));
    }
    EXPECT_LT(max_difference, 2e-5f);
    EXPECT_LT(max_difference, 1e-6f * max_logit);  // relative to the largest logit
    std::printf("all-experts split of stories260K (%s path): max |logit difference| over 200 positions = %.3g "
                "(max |logit| %.3g)\n",
                path == kernel_path::fast ? "fast" : "reference", static_cast<double>(max_difference),
                static_cast<double>(max_logit));
  }
}

TEST_F(Moe, AllRouterSplitGreedyTextEqualsTheDenseGolden) {
  const std::pair<const char*, const char*> runs[] = {{"t0_n200", "llama2c_test_all__t0_n200.txt"},
                                                      {"t0_default256", "llama2c_doc__t0_default256.txt"}};
  for (const auto& [name, file] : runs) {
    const testing::golden_case golden = testing::golden(name);
    const std::string text = testing::read_file(testing::test_data(std::string("stories260K/golden/") + file));
    const std::vector<int32_t> ids(golden.token_ids.begin() + 1, golden.token_ids.end());
    for (auto path : {kernel_path::reference, kernel_path::fast}) {
      transformer t(*all_, path);
      generate::generate_params p;
      p.prompt = {tokenizer::bos};
      p.max_new_tokens = static_cast<int32_t>(ids.size());
      p.sampling.temperature = 0.0f;
      auto out = generate::generate(t, *tokenizer_, p);
      ASSERT_TRUE(out) << out.error().message;
      EXPECT_EQ(out->text, text) << name;
      EXPECT_EQ(out->tokens, ids) << name;
    }
  }
}

// ---- placement invariance ---------------------------------------------------------------------

/// A dispatch that counts the rows each expert and each shard computes, then hands the requests
/// on: any implementation of the interface can stand between the model and the shards.
class counting_dispatch final : public expert_dispatch {
 public:
  counting_dispatch(expert_dispatch& inner, const expert_placement& placement)
      : inner_(inner), experts_(placement.n_layers(), placement.n_experts()),
        shards_(placement.n_layers(), placement.num_shards()) {}
  [[nodiscard]] int32_t num_shards() const override { return inner_.num_shards(); }
  [[nodiscard]] expected<std::vector<expert_reply>> compute(const std::vector<expert_request>& requests) override {
    experts_.add(requests);
    shards_.add(requests);
    return inner_.compute(requests);
  }
  /// Each expert's rows over every layer.
  [[nodiscard]] std::vector<int64_t> rows() const {
    std::vector<int64_t> out(static_cast<size_t>(experts_.n_experts()), 0);
    for (int32_t l = 0; l < experts_.n_layers(); l++)
      for (int32_t e = 0; e < experts_.n_experts(); e++) out[static_cast<size_t>(e)] += experts_.rows(l, e);
    return out;
  }
  [[nodiscard]] const expert_load& experts() const { return experts_; }
  [[nodiscard]] const shard_load& shards() const { return shards_; }

 private:
  expert_dispatch& inner_;
  expert_load experts_;
  shard_load shards_;
};

/// What a model computes for a fixed workload: three sequences prefilled in one step, then 30
/// decode steps of all three at once (greedy), then three seeded sampled requests. Returns
/// every logit, then the sampled tokens as floats. `between_steps(step)` runs after each of the
/// first 30 steps but the last.
std::vector<float> workload(transformer& t, const tokenizer& tok,
                            const std::function<void(int32_t step)>& between_steps = {}) {
  const model::model_config& c = t.config();
  model::kv_cache cache(c, 3 * 8, 16);
  const int32_t tables[3][8] = {{0, 1, 2, 3, 4, 5, 6, 7}, {15, 14, 13, 12, 11, 10, 9, 8}, {16, 18, 20, 22, 17, 19, 21, 23}};
  std::vector<std::vector<int32_t>> seqs;
  for (const char* prompt : {"Once upon a time", "The little dog ran to the big red", "Lily"})
    seqs.push_back(*tok.encode(prompt, /*add_bos=*/true, /*add_eos=*/false));
  std::vector<model::forward_row> rows;
  for (size_t s = 0; s < seqs.size(); s++)
    for (size_t p = 0; p < seqs[s].size(); p++)
      rows.push_back({seqs[s][p], static_cast<int32_t>(p), tables[s], p + 1 == seqs[s].size()});
  std::vector<float> all, logits;
  for (int32_t step = 0; step < 30; step++) {
    if (step > 0 && between_steps) between_steps(step - 1);
    t.forward(rows, cache, logits);
    all.insert(all.end(), logits.begin(), logits.end());
    rows.clear();
    for (size_t s = 0; s < seqs.size(); s++) {
      const float* l = &logits[s * c.vocab_size];
      seqs[s].push_back(static_cast<int32_t>(std::max_element(l, l + c.vocab_size) - l));
      rows.push_back({seqs[s].back(), static_cast<int32_t>(seqs[s].size() - 1), tables[s], true});
    }
  }
  for (uint64_t seed : {1u, 2u, 3u}) {
    generate::generate_params p;
    p.prompt = *tok.encode("Tom and Sue", true, false);
    p.max_new_tokens = 40;
    p.sampling.temperature = 1.0f;
    p.seed = seed;
    auto out = generate::generate(t, tok, p);
    EXPECT_TRUE(out) << out.error().message;
    for (int32_t id : out->tokens) all.push_back(static_cast<float>(id));
  }
  return all;
}

/// What the workload's dispatch counted.
struct measured_load {
  std::vector<int64_t> rows;  ///< (n_experts) over every layer
  expert_load experts;
  shard_load shards;
};

/// The workload through `shards`, which hold the experts as `placement` says; `measured` gets
/// what they computed.
std::vector<float> workload_through(const checkpoint& ck, const expert_placement& placement, expert_dispatch& shards,
                                    const tokenizer& tok, std::optional<measured_load>* measured = nullptr) {
  counting_dispatch counted(shards, placement);
  transformer t(ck);
  t.set_expert_dispatch(placement, counted);
  std::vector<float> out = workload(t, tok);
  if (measured != nullptr) measured->emplace(measured_load{counted.rows(), counted.experts(), counted.shards()});
  return out;
}

/// The workload through `placement`'s shards in this process.
std::vector<float> workload_on(const checkpoint& ck, const expert_placement& placement, const tokenizer& tok,
                               std::optional<measured_load>* measured = nullptr) {
  in_process_dispatch shards(ck, placement, kernel_path::fast);
  return workload_through(ck, placement, shards, tok, measured);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(Moe, SparseMoeGivesTheSameBitsWhateverThePlacement) {
  for (const checkpoint* ck : {random_, skewed_}) {
    const int32_t layers = ck->config().n_layers, experts = ck->moe()->n_experts;
    transformer default_model(*ck);  // one shard, made by the model itself
    const std::vector<float> expected = workload(default_model, *tokenizer_);
    std::optional<measured_load> measured;
    EXPECT_TRUE(same_bits(workload_on(*ck, expert_placement::round_robin(layers, experts, 1), *tokenizer_, &measured), expected));
    EXPECT_TRUE(same_bits(workload_on(*ck, expert_placement::round_robin(layers, experts, 4), *tokenizer_), expected));
    // Replicas of the hot experts (the most-routed) on every other shard of three.
    const std::vector<int32_t> hot = model::hot_experts(skewed_options());
    expert_placement replicated = expert_placement::round_robin(layers, experts, 3);
    for (int32_t l = 0; l < layers; l++)
      for (int32_t e : hot)
        for (int32_t s = 0; s < 3; s++)
          if (replicated.can_add_replica(l, e, s)) replicated.add_replica(l, e, s);
    // And every expert everywhere: each expert's rows split three ways.
    expert_placement everywhere = expert_placement::round_robin(layers, experts, 3);
    for (int32_t l = 0; l < layers; l++)
      for (int32_t e = 0; e < experts; e++)
        for (int32_t s = 0; s < 3; s++)
          if (everywhere.can_add_replica(l, e, s)) everywhere.add_replica(l, e, s);
    EXPECT_TRUE(same_bits(workload_on(*ck, replicated, *tokenizer_), expected));
    EXPECT_TRUE(same_bits(workload_on(*ck, everywhere, *tokenizer_), expected));
    // Top-2 of 4: every row of every layer went to exactly two experts.
    int64_t total = 0;
    for (int64_t n : measured->rows) total += n;
    EXPECT_EQ(total % (2 * layers), 0);
  }
}

TEST_F(Moe, SkewedRouterSendsMostRowsToItsHotExpert) {
  const std::vector<int32_t> hot = model::hot_experts(skewed_options());
  ASSERT_EQ(hot.size(), 1u);
  const int32_t layers = skewed_->config().n_layers;
  std::optional<measured_load> skewed_load, random_load;
  workload_on(*skewed_, expert_placement::round_robin(layers, 4, 2), *tokenizer_, &skewed_load);
  workload_on(*random_, expert_placement::round_robin(layers, 4, 2), *tokenizer_, &random_load);
  const std::vector<int64_t>& skewed = skewed_load->rows;
  const std::vector<int64_t>& random = random_load->rows;
  int64_t total = 0;
  for (int64_t n : skewed) total += n;
  const int64_t rows = total / 2;  // (row, layer) pairs: each goes to two experts
  std::printf("rows per expert (hot expert %d): skewed %lld %lld %lld %lld, random %lld %lld %lld %lld\n", hot[0],
              static_cast<long long>(skewed[0]), static_cast<long long>(skewed[1]), static_cast<long long>(skewed[2]),
              static_cast<long long>(skewed[3]), static_cast<long long>(random[0]), static_cast<long long>(random[1]),
              static_cast<long long>(random[2]), static_cast<long long>(random[3]));
  EXPECT_EQ(skewed[static_cast<size_t>(hot[0])], rows);  // every row's top 2 holds the hot expert
  EXPECT_EQ(skewed, (std::vector<int64_t>{890, 158, 311, 421}));
  EXPECT_EQ(random, (std::vector<int64_t>{661, 486, 683, 610}));
}

// Four shards, two experts per layer per shard. Round robin puts one expert of each layer on
// each shard: the hot expert's shard computes every row of its layer, twice the mean (top 2 of
// 4). Rebalanced from the window's counts, the hot expert gets a second replica and the others
// are packed around them. The skewed router's window (the workload): moe_lb 2.0 before, 1.07
// after, measured from the shards' requests of a second run; the text is the same bits.
TEST_F(Moe, RebalancingTheSkewedRoutersLoadBringsMoeLbFromTwoToNearOne) {
  const int32_t layers = skewed_->config().n_layers;
  const expert_placement before = expert_placement::round_robin(layers, 4, 4);
  std::optional<measured_load> window, next;
  const std::vector<float> expected = workload_on(*skewed_, before, *tokenizer_, &window);
  auto after = rebalance(window->experts, /*num_shards=*/4, /*capacity=*/2);
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_TRUE(same_bits(workload_on(*skewed_, *after, *tokenizer_, &next), expected));
  const double lb_before = moe_lb(window->shards), lb_after = moe_lb(next->shards);
  const double lb_after_expected = moe_lb(expected_shard_load(*after, window->experts));
  std::printf("skewed router, 4 shards of capacity 2: moe_lb before %.4f (round robin), after %.4f "
              "(rebalanced; %.4f expected from the window)\n",
              lb_before, lb_after, lb_after_expected);
  EXPECT_DOUBLE_EQ(lb_before, moe_lb(expected_shard_load(before, window->experts)));  // no replicas: exact
  EXPECT_GE(lb_before, 1.5);
  EXPECT_LE(lb_after, 1.15);
  EXPECT_LE(lb_after_expected, 1.15);
  const std::vector<int32_t> hot = model::hot_experts(skewed_options());
  for (int32_t l = 0; l < layers; l++) EXPECT_EQ(after->replicas(l, hot[0]).size(), 2u) << "layer " << l;
}

// ---- the shard's door -------------------------------------------------------------------------

TEST_F(Moe, ShardRejectsMalformedRequests) {
  expert_shard shard(*random_, {{0, 1}, {2, 3}}, kernel_path::fast);
  EXPECT_TRUE(shard.holds({2, 3}));
  EXPECT_FALSE(shard.holds({2, 1}));
  expert_request good{2, 64, {4, 9}, std::vector<float>(2 * 64, 0.5f), {{3, {4, 9}}}};
  auto ok = shard.compute(good);
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->output.size(), 2u * 64u);
  const auto rejected = [&shard](expert_request q, const std::string& message) {
    auto r = shard.compute(q);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, errc::invalid_argument);
    EXPECT_NE(r.error().message.find(message), std::string::npos) << r.error().message;
  };
  expert_request q = good;
  q.layer = 5;
  rejected(q, "layer 5 is out of range (0..4)");
  q = good;
  q.batches[0].expert = 1;
  rejected(q, "does not hold expert 1 of layer 2");
  q = good;
  q.rows = {9, 4};
  rejected(q, "rows are not increasing");
  q = good;
  q.input.pop_back();
  rejected(q, "input holds 127 values for 2 rows of dim 64");
  q = good;
  q.batches[0].rows = {4, 5};
  rejected(q, "names a row the request does not carry");
  q = good;
  q.dim = 32;
  rejected(q, "dim 32, the model's is 64");
}

TEST_F(Moe, AnAddedExpertComputesTheCheckpointsBitsOnBothPathsAndDropsCleanly) {
  std::vector<float> input(3 * 64);
  for (size_t i = 0; i < input.size(); i++) input[i] = 0.02f * static_cast<float>(i % 29) - 0.3f;
  const expert_request q{4, 64, {0, 2, 5}, input, {{2, {0, 5}}}};
  for (auto path : {kernel_path::reference, kernel_path::fast}) {
    expert_shard source(*random_, {{4, 2}}, path), target(*random_, {}, path);
    expected<expert_weights> w = source.weights({4, 2});
    ASSERT_TRUE(w) << w.error().message;
    EXPECT_EQ(w->w1.size(), 43u * 64u);
    EXPECT_EQ(target.compute(q).error().message, "expert request: this shard does not hold expert 2 of layer 4");
    ASSERT_TRUE(target.add(*w));
    EXPECT_EQ(target.num_experts(), 1);
    EXPECT_EQ(target.add(*w).error().message, "expert weights (layer 4, expert 2): held already");
    const expected<expert_reply> want = source.compute(q), got = target.compute(q);
    ASSERT_TRUE(want && got);
    EXPECT_TRUE(same_bits(got->output, want->output));
    ASSERT_TRUE(target.drop({4, 2}));
    EXPECT_EQ(target.drop({4, 2}).error().code, errc::not_found);
    EXPECT_FALSE(target.compute(q));
  }
}

// ---- the MoE file format ----------------------------------------------------------------------

class BadMoeCheckpoint : public Moe {
 protected:
  /// The all-router file with int32 header field `index` (0 = magic) set to `value`.
  static std::string with_field(int32_t index, int32_t value) {
    std::string bytes = testing::read_file((dir_ / "all.bin").string());
    std::memcpy(&bytes[static_cast<size_t>(index) * 4], &value, 4);
    return bytes;
  }
  static void expect_malformed(const std::string& name, const std::string& bytes, const std::string& message) {
    auto ck = checkpoint::load(write(name, bytes));
    ASSERT_FALSE(ck) << name;
    EXPECT_EQ(ck.error().code, errc::malformed_file);
    EXPECT_NE(ck.error().message.find(name), std::string::npos) << ck.error().message;  // names the file
    EXPECT_NE(ck.error().message.find(message), std::string::npos) << ck.error().message;
  }
};

TEST_F(BadMoeCheckpoint, HeaderFieldsAndSize) {
  const std::string bytes = testing::read_file((dir_ / "all.bin").string());
  expect_malformed("truncated.bin", bytes.substr(0, bytes.size() - 4), "(truncated?)");
  expect_malformed("long.bin", bytes + "xxxx", "(trailing data?)");
  expect_malformed("short.bin", bytes.substr(0, 100), "starts with a 256-byte header");
  expect_malformed("version.bin", with_field(1, 2), "MoE checkpoint version 2 is not supported");
  expect_malformed("dim.bin", with_field(2, 0), "header field dim = 0 is out of range");
  expect_malformed("vocab.bin", with_field(7, -512), "header field vocab_size = -512 is out of range");
  expect_malformed("shared.bin", with_field(9, 2), "header field shared_classifier = 2 is out of range (0 or 1)");
  expect_malformed("experts0.bin", with_field(10, 0), "header field n_experts = 0 is out of range (1..1024)");
  expect_malformed("experts2000.bin", with_field(10, 2000), "header field n_experts = 2000 is out of range");
  expect_malformed("wide.bin", [] { std::string b = with_field(10, 1000); std::memcpy(&b[12], "\x00\x08\x00\x00", 4); return b; }(),
                   "1000 experts of hidden_dim 2048 exceed 1048576 hidden units per layer");
  expect_malformed("topk0.bin", with_field(11, 0), "header field top_k = 0 is out of range (1..n_experts)");
  expect_malformed("topk5.bin", with_field(11, 5), "header field top_k = 5 is out of range (1..n_experts)");
  expect_malformed("router.bin", with_field(12, 2), "header field router = 2 is out of range");
  expect_malformed("allk2.bin", with_field(11, 2), "router 'all' with top_k 2 of 4 experts");
  expect_malformed("pad.bin", with_field(20, 1), "header byte 80 is not zero (bytes 52..255 are reserved)");
  // A wrong n_experts that is in range: the size no longer fits.
  expect_malformed("experts2.bin", [] { std::string b = with_field(10, 2); std::memcpy(&b[44], "\x02\x00\x00\x00", 4); return b; }(),
                   "implies");
}

TEST_F(BadMoeCheckpoint, NonFiniteExpertWeightIsNamed) {
  std::string bytes = testing::read_file((dir_ / "random.bin").string());
  const model::model_config& c = random_->config();
  const model::moe_weights& m = *random_->moe();
  // Element 7 of layer 1 of w2: its offset among the weights (the token embedding comes first).
  const int64_t at = (m.w2 - random_->w().token_embedding) + m.expert_offset(c, 1, 0) + 7;
  const float nan = std::nanf("");
  std::memcpy(&bytes[static_cast<size_t>(model::moe_header_bytes + at * 4)], &nan, 4);
  auto ck = checkpoint::load(write("nan.bin", bytes));
  ASSERT_FALSE(ck);
  EXPECT_NE(ck.error().message.find("weight tensor w2 holds NaN (layer 1, element 7)"), std::string::npos)
      << ck.error().message;
}

TEST_F(Moe, SplitRefusesBadOptions) {
  const auto refused = [](const checkpoint& ck, const model::moe_split_options& o, const std::string& message) {
    auto bytes = model::to_moe(ck, o);
    ASSERT_FALSE(bytes);
    EXPECT_EQ(bytes.error().code, errc::invalid_argument);
    EXPECT_NE(bytes.error().message.find(message), std::string::npos) << bytes.error().message;
  };
  model::moe_split_options o;
  o.n_experts = 3;
  refused(*dense_, o, "n_experts 3 must be in 1..1024 and divide hidden_dim 172");
  o.n_experts = 4;
  o.top_k = 2;
  refused(*dense_, o, "the 'all' router routes to every expert: top_k 2 needs a random or skewed router");
  o = random_options();
  o.top_k = 5;
  refused(*dense_, o, "top_k 5 is out of range (1..n_experts 4)");
  o = skewed_options();
  o.num_hot_experts = 4;
  refused(*dense_, o, "hot experts 4 must be in 1..n_experts - 1");
  o = skewed_options();
  o.skew = -1.0f;
  refused(*dense_, o, "must be finite and >= 0");
  refused(*all_, {}, "is already a mixture of experts");
  auto q80 = checkpoint::load(std::string(TROUPE_MODELS_DIR) + "/stories260K_q80_g4.bin");
  ASSERT_TRUE(q80) << q80.error().message;
  refused(*q80, {}, "is Q8_0");
}

TEST_F(Moe, ReferenceAndFastPathsGiveIdenticalBits) {
  transformer ref(*random_, kernel_path::reference), fast(*random_, kernel_path::fast);
  EXPECT_TRUE(same_bits(workload(ref, *tokenizer_), workload(fast, *tokenizer_)));
}

TEST_F(Moe, CliSplitsAndGeneratesTheDenseGoldenText) {
  const std::string out = (dir_ / "cli.bin").string();
  const testing::cli_result s = testing::run_troupe({"moe-split", testing::bundled_model(), "-o", out, "--experts", "4"}, dir_);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.err.find("4 experts of 43 hidden units, router all, top-k 4, 5 layers"), std::string::npos) << s.err;
  EXPECT_EQ(testing::read_file(out), testing::read_file((dir_ / "all.bin").string()));
  const testing::cli_result r = testing::run_troupe({"generate", "-m", out, "-t", "0", "-n", "200"}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, testing::read_file(testing::test_data("stories260K/golden/llama2c_test_all__t0_n200.txt")) + "\n");
  EXPECT_NE(r.err.find("(mixture of experts: 4 experts, top-k 4)"), std::string::npos) << r.err;
  const testing::cli_result k = testing::run_troupe(
      {"moe-split", testing::bundled_model(), "-o", (dir_ / "k.bin").string(), "--top-k", "2"}, dir_);
  EXPECT_EQ(k.exit_code, 2);
  EXPECT_NE(k.err.find("needs a random or skewed router"), std::string::npos) << k.err;
  EXPECT_FALSE(fs::exists(dir_ / "k.bin"));
  const testing::cli_result q = testing::run_troupe({"quantize", out, "-o", (dir_ / "q.bin").string(), "--group-size", "4"}, dir_);
  EXPECT_EQ(q.exit_code, 2);
  EXPECT_NE(q.err.find("is a mixture of experts"), std::string::npos) << q.err;
}

// ---- expert shards as actors -------------------------------------------------------------------

/// A threaded actor system with troupe's messages: actor_dispatch blocks its caller on the shards.
class MoeActors : public Moe {
 protected:
  caf::actor_system_config cfg_;
  caf::actor_system sys_{troupe::testing::configure(cfg_, /*deterministic=*/false)};
};

constexpr caf::timespan shard_timeout = std::chrono::seconds(30);  // a bound, not a measurement

TEST_F(MoeActors, ShardActorsGiveTheSameBitsAsInProcessShards) {
  const int32_t layers = skewed_->config().n_layers;
  const std::vector<int32_t> hot = model::hot_experts(skewed_options());
  expert_placement replicated = expert_placement::round_robin(layers, 4, 4);  // the hot expert on all four
  for (int32_t l = 0; l < layers; l++)
    for (int32_t s = 0; s < 4; s++)
      if (replicated.can_add_replica(l, hot[0], s)) replicated.add_replica(l, hot[0], s);
  for (const checkpoint* ck : {random_, skewed_}) {
    transformer default_model(*ck);
    const std::vector<float> expected = workload(default_model, *tokenizer_);
    for (const expert_placement& p : {expert_placement::round_robin(layers, 4, 1),
                                      expert_placement::round_robin(layers, 4, 4), replicated}) {
      actors::actor_dispatch shards(sys_, actors::spawn_expert_shards(sys_, *ck, p, kernel_path::fast), shard_timeout);
      EXPECT_TRUE(same_bits(workload_through(*ck, p, shards, *tokenizer_), expected)) << p.num_shards() << " shards";
    }
  }
}

/// One step of 4 sequences of 2, 4, 6 and 8 tokens (every row's logits) through `t`.
std::vector<float> mixed_step(transformer& t) {
  const model::model_config& c = t.config();
  model::kv_cache cache(c, 4, 16);
  std::vector<std::vector<int32_t>> tables(4);
  std::vector<model::forward_row> rows;
  for (int32_t q = 0; q < 4; q++) {
    tables[q] = {q};
    for (int32_t p = 0; p <= 2 * q + 1; p++) rows.push_back({(37 * q + 11 * p) % 300, p, tables[q].data(), true});
  }
  std::vector<float> logits;
  t.forward(rows, cache, logits);
  return logits;
}

TEST_F(MoeActors, AGgufMixtureInItsStoredTypesGivesItsBitsOnShardActorsWhateverThePlacement) {
  // Mixtral's layout (4 experts, 2 per row) in Q8_0 and in Q4_K_M, whose K-quant rows are 256
  // wide: each expert read in place from the file by whichever shard holds it.
  for (const bool k_quant : {false, true}) {
    testing::random_llama_spec spec = testing::random_llama_families()[6].spec;
    ASSERT_EQ(spec.n_experts, 4);
    spec.type = k_quant ? model::ggml_type::q4_k : model::ggml_type::q8_0;
    if (k_quant) spec.wide_type = model::ggml_type::q6_k, spec.dim = 256, spec.hidden_dim = 512;
    const fs::path path = dir_ / "mixtral.gguf";
    std::ofstream(path, std::ios::binary) << testing::random_llama_gguf(spec);
    auto ck = checkpoint::load(path.string());
    ASSERT_TRUE(ck) << ck.error().message;
    ASSERT_NE(ck->stored(), nullptr);
    transformer own(*ck), reference(*ck, kernel_path::reference);
    const std::vector<float> expected = mixed_step(own);
    EXPECT_TRUE(same_bits(mixed_step(reference), expected));
    const int32_t layers = ck->config().n_layers;
    expert_placement everywhere = expert_placement::round_robin(layers, 4, 3);
    for (int32_t l = 0; l < layers; l++)
      for (int32_t e = 0; e < 4; e++)
        for (int32_t s = 0; s < 3; s++)
          if (everywhere.can_add_replica(l, e, s)) everywhere.add_replica(l, e, s);
    for (const expert_placement& p : {expert_placement::round_robin(layers, 4, 1),
                                      expert_placement::round_robin(layers, 4, 3), everywhere}) {
      actors::actor_dispatch shards(sys_, actors::spawn_expert_shards(sys_, *ck, p, kernel_path::fast), shard_timeout);
      transformer t(*ck);
      t.set_expert_dispatch(p, shards);
      EXPECT_TRUE(same_bits(mixed_step(t), expected)) << p.num_shards() << " shards, K-quants " << k_quant;
    }
    // Their experts stay where the file is: moving them is refused, saying so.
    expert_shard shard(*ck, {{0, 1}}, kernel_path::fast);
    const auto w = shard.weights({0, 1});
    ASSERT_FALSE(w);
    EXPECT_NE(w.error().message.find("do not move between shards"), std::string::npos) << w.error().message;
    EXPECT_FALSE(shard.add(expert_weights{1, 2, {}, {}, {}}));
  }
}

TEST_F(MoeActors, ShardActorAnswersAMalformedRequestWithAnErrorAndKeepsServing) {
  const expert_shard_actor shard = actors::spawn_expert_shard(sys_, *random_, {{0, 1}}, kernel_path::fast);
  caf::scoped_actor self{sys_};
  std::string why;
  self->request(shard, shard_timeout, expert_request{7, 64, {}, {}, {{1, {}}}})
      .receive([&](expert_reply&) { why = "answered"; }, [&](caf::error& err) { why = sys_.render(err); });
  EXPECT_NE(why.find("expert request: layer 7 is out of range (0..4)"), std::string::npos) << why;
  std::vector<float> input(2 * 64);
  for (size_t i = 0; i < input.size(); i++) input[i] = 0.01f * static_cast<float>(i % 37) - 0.2f;
  const expert_request good{0, 64, {3, 9}, input, {{1, {3, 9}}}};
  expert_shard in_process(*random_, {{0, 1}}, kernel_path::fast);
  const expected<expert_reply> want = in_process.compute(good);
  ASSERT_TRUE(want) << want.error().message;
  std::vector<float> got;
  self->request(shard, shard_timeout, good)
      .receive([&](expert_reply& r) { got = r.output; }, [&](caf::error& err) { ADD_FAILURE() << sys_.render(err); });
  EXPECT_TRUE(same_bits(got, want->output));
}

/// A faulty peer: `compute` answers expert requests; it holds no experts to move.
template <class Compute>
expert_shard_actor::behavior_type faulty_shard(Compute compute) {
  return {compute, [](msg::fetch_experts&) { return msg::expert_set{}; }, [](msg::expert_set&) { return int32_t{0}; },
          [](msg::drop_experts&) { return int32_t{0}; }};
}

/// Faulty peers: one answers every request with an empty reply, one never answers.
expert_shard_actor::behavior_type short_answers() {
  return faulty_shard([](expert_request&) { return expert_reply{}; });
}

expert_shard_actor::behavior_type silent() {
  return faulty_shard([](expert_request&) { return caf::delegated<expert_reply>{}; });  // to no one
}

TEST_F(MoeActors, AShardThatAnswersWrongOrNotAtAllFailsTheForwardPass) {
  const expert_placement p = expert_placement::round_robin(random_->config().n_layers, 4, 2);
  const std::vector<expert_shard_actor> good = actors::spawn_expert_shards(sys_, *random_, p, kernel_path::fast);
  // The short answer comes at once: its bound only has to outlast a slow (sanitizer) build.
  const std::tuple<expert_shard_actor, std::string, caf::timespan> faulty[] = {
      {sys_.spawn(short_answers), "expert shard 1: answered 0 values where layer ", std::chrono::seconds(30)},
      {sys_.spawn(silent), "request_timeout", std::chrono::milliseconds(200)}};
  for (const auto& [shard, why, timeout] : faulty) {
    actors::actor_dispatch dispatch(sys_, {good[0], shard}, timeout);
    transformer t(*random_);
    t.set_expert_dispatch(p, dispatch);
    generate::generate_params params;
    params.prompt = *tokenizer_->encode("Once upon a time", true, false);
    params.max_new_tokens = 20;
    auto out = generate::generate(t, *tokenizer_, params);
    ASSERT_FALSE(out);
    EXPECT_EQ(out.error().code, errc::unavailable);
    EXPECT_EQ(out.error().message.rfind("expert shard 1: ", 0), 0u) << out.error().message;
    EXPECT_NE(out.error().message.find(why), std::string::npos) << out.error().message;
    ASSERT_TRUE(t.expert_error().has_value());
  }
}

TEST_F(MoeActors, ShardsHandOverExpertWeightsAndCheckThem) {
  const expert_shard_actor a = actors::spawn_expert_shard(sys_, *random_, {{0, 1}, {2, 3}}, kernel_path::fast);
  const expert_shard_actor b = actors::spawn_expert_shard(sys_, *random_, {{0, 0}}, kernel_path::fast);
  caf::scoped_actor self{sys_};
  const auto error_of = [&](auto question) {
    std::string why = "answered";
    self->request(b, shard_timeout, std::move(question))
        .receive([](int32_t) {}, [&](caf::error& err) { why = sys_.render(err); });
    return why;
  };
  msg::expert_set set;
  self->request(a, shard_timeout, msg::fetch_experts{{{2, 3}}})
      .receive([&](msg::expert_set& s) { set = std::move(s); }, [&](caf::error& err) { ADD_FAILURE() << sys_.render(err); });
  ASSERT_EQ(set.experts.size(), 1u);
  msg::expert_set bad = set;
  bad.experts[0].w2.pop_back();
  EXPECT_NE(error_of(bad).find("expert weights (layer 2, expert 3): w1, w2, w3 hold 2752, 2751, 2752 values, not 2752 each"),
            std::string::npos);
  bad = set;
  bad.experts[0].w3[5] = std::nanf("");
  EXPECT_NE(error_of(bad).find("a weight is not finite"), std::string::npos);
  bad = set;
  bad.experts[0].layer = 9;
  EXPECT_NE(error_of(bad).find("no such expert in the model"), std::string::npos);
  EXPECT_NE(error_of(msg::drop_experts{{{4, 0}}}).find("does not hold expert 0 of layer 4"), std::string::npos);
  EXPECT_EQ(error_of(set), "answered");  // now b holds (2, 3): the same bits as a's
  EXPECT_NE(error_of(set).find("held already"), std::string::npos);
  const expert_request q{2, 64, {0}, std::vector<float>(64, 0.25f), {{3, {0}}}};
  std::vector<float> from_a, from_b;
  for (auto [shard, out] : {std::pair{a, &from_a}, std::pair{b, &from_b}})
    self->request(shard, shard_timeout, q)
        .receive([out = out](expert_reply& r) { *out = r.output; }, [&](caf::error& err) { ADD_FAILURE() << sys_.render(err); });
  ASSERT_EQ(from_a.size(), 64u);
  EXPECT_TRUE(same_bits(from_a, from_b));
  EXPECT_EQ(error_of(msg::drop_experts{{{2, 3}, {0, 0}}}), "answered");
}

// Issue 47: a shard took drop_experts, expert_set and fetch_experts from anyone. Now it serves
// its own node and the node of the first actor that sends it anything (its engine's). Its home
// is another node here, so the test's actors are remote: a message without a sender is refused,
// the first sender's node is served. (Refusing another node's actors: SenderPolicy.*.)
TEST_F(MoeActors, AShardServesItsOwnNodeAndTheFirstNodeToUseIt) {
  const expert_shard_actor shard =
      actors::spawn_expert_shard(sys_, *random_, {{0, 1}}, kernel_path::fast, caf::actor{}, testing::other_node());
  caf::anon_send(shard, msg::drop_experts{{{0, 1}}});  // before: dropped the expert
  caf::scoped_actor self{sys_};
  msg::expert_set held;
  self->request(shard, shard_timeout, msg::fetch_experts{{{0, 1}}})
      .receive([&](msg::expert_set& s) { held = std::move(s); }, [&](caf::error& err) { ADD_FAILURE() << sys_.render(err); });
  ASSERT_EQ(held.experts.size(), 1u);  // still there: the anonymous drop was refused
  caf::scoped_actor other{sys_};       // another actor of the first sender's node
  int32_t left = -1;
  other->request(shard, shard_timeout, msg::drop_experts{{{0, 1}}})
      .receive([&](int32_t n) { left = n; }, [&](caf::error& err) { ADD_FAILURE() << sys_.render(err); });
  EXPECT_EQ(left, 0);
}

// Requests stream across reassignments: a reassigner measures windows of 5 steps; when one
// proposes a placement, the new replicas' weights move between the shard actors on another thread
// while the steps go on, the model switches at the first step boundary after they arrived (5
// steps after the proposal at the latest), and the shards then drop what they no longer hold.
// Every logit and token is the same as without a reassignment, including the sampled requests run
// afterwards on the last placement alone. How many moves happen and the later windows' moe_lb
// depend on when the weights arrive (printed); the first window's is exactly 2.
TEST_F(MoeActors, ExpertsMoveBetweenShardsWhileRequestsStreamAndNothingChanges) {
  const int32_t layers = skewed_->config().n_layers;
  transformer default_model(*skewed_);
  const std::vector<float> without_moves = workload(default_model, *tokenizer_);
  const expert_placement from = expert_placement::round_robin(layers, 4, 4);
  auto r = reassigner::create(from, {/*window_steps=*/5, /*capacity=*/2, /*moe_lb_max=*/1.15});
  ASSERT_TRUE(r) << r.error().message;
  actors::actor_dispatch shards(sys_, actors::spawn_expert_shards(sys_, *skewed_, from, kernel_path::fast),
                                shard_timeout);
  counted_dispatch counted(shards, *r);
  transformer t(*skewed_);
  t.set_expert_dispatch(from, counted);
  std::optional<expert_placement> to;  // of the move in flight
  std::future<expected<void>> moving;
  std::vector<window_report> windows;
  std::vector<int32_t> switched_after;
  int32_t proposed_after = 0;
  const auto between_steps = [&](int32_t step) {
    if (std::optional<window_report> window = r->end_step()) {
      windows.push_back(*window);
      if (window->next) {
        proposed_after = step;
        to = window->next;
        moving = std::async(std::launch::async, [&shards, now = r->current(), next = *to] {
          return shards.add_replicas(now, next);
        });
      }
    }
    // Switch at the first boundary after the weights arrived, or wait for them 5 steps on.
    if (!moving.valid() || (step < proposed_after + 5 && moving.wait_for(std::chrono::seconds(0)) != std::future_status::ready))
      return;
    const expected<void> moved = moving.get();
    ASSERT_TRUE(moved) << moved.error().message;
    const expert_placement before = r->current();
    t.set_expert_dispatch(*to, counted);
    r->switch_to(*to);
    switched_after.push_back(step);
    const expected<void> dropped = shards.drop_replicas(before, *to);
    ASSERT_TRUE(dropped) << dropped.error().message;
  };
  EXPECT_TRUE(same_bits(workload(t, *tokenizer_, between_steps), without_moves));
  for (const window_report& w : windows)
    std::printf("window from step %lld: moe_lb %.4f%s\n", static_cast<long long>(w.first_step), w.moe_lb,
                w.next ? " -> a rebalanced placement proposed" : "");
  for (int32_t step : switched_after)
    std::printf("experts moved on another thread; the model switched placement after step %d\n", step);
  ASSERT_GE(windows.size(), 4u);
  EXPECT_DOUBLE_EQ(windows[0].moe_lb, 2.0);  // round robin: the hot expert's shard computes every row
  ASSERT_TRUE(windows[0].next.has_value());
  ASSERT_FALSE(switched_after.empty());
  EXPECT_GE(switched_after[0], 4);
  EXPECT_LE(switched_after[0], 9);
  EXPECT_LT(windows.back().moe_lb, windows[0].moe_lb);
}

// ---- expert shards in two other processes ------------------------------------------------------

// Four shards, the even ones in one forked process and the odd ones in another, reached over
// CAF's network layer: the requests, replies and moved weights cross processes as registered
// messages. The workload gives the same bits as the model's own shard on a placement with the
// hot expert on all four shards, then again after the experts moved to the rebalanced placement.
TEST_F(Moe, ShardsInTwoOtherProcessesGiveTheSameBitsBeforeAndAfterAMove) {
  const int32_t layers = skewed_->config().n_layers;
  expert_placement replicated = expert_placement::round_robin(layers, 4, 4);
  const std::vector<int32_t> hot = model::hot_experts(skewed_options());
  for (int32_t l = 0; l < layers; l++)
    for (int32_t s = 0; s < 4; s++)
      if (replicated.can_add_replica(l, hot[0], s)) replicated.add_replica(l, hot[0], s);
  const topology::shard_hosts hosts(*skewed_, replicated);  // forked before this process starts CAF's threads
  caf::actor_system_config cfg;
  troupe::testing::configure(cfg, /*deterministic=*/false);
  ASSERT_TRUE(actors::configure_network(cfg, {}));
  caf::actor_system sys{cfg};
  auto remote = hosts.reach(sys, 4);
  ASSERT_TRUE(remote) << remote.error().message;
  transformer default_model(*skewed_);
  const std::vector<float> want = workload(default_model, *tokenizer_);
  actors::actor_dispatch shards(sys, *remote, shard_timeout);
  std::optional<measured_load> measured;
  EXPECT_TRUE(same_bits(workload_through(*skewed_, replicated, shards, *tokenizer_, &measured), want));
  auto rebalanced = rebalance(measured->experts, 4, 2);
  ASSERT_TRUE(rebalanced) << rebalanced.error().message;
  const expected<void> moved = shards.add_replicas(replicated, *rebalanced);
  ASSERT_TRUE(moved) << moved.error().message;
  const expected<void> dropped = shards.drop_replicas(replicated, *rebalanced);
  ASSERT_TRUE(dropped) << dropped.error().message;
  EXPECT_TRUE(same_bits(workload_through(*skewed_, *rebalanced, shards, *tokenizer_), want));
}

}  // namespace
}  // namespace troupe::moe
