#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/moe/placement.hpp"
#include "runtime/moe/routing.hpp"

namespace troupe::moe {
namespace {

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
}

}  // namespace
}  // namespace troupe::moe
