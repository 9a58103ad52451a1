// spec::plan_budgeted / plan_fixed: the seed's worked example exactly, tie-breaks, fixed mode.
#include "runtime/spec/planner.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace troupe::spec {
namespace {

/// The seed's curve: 10 ms up to 4 rows, 13 ms up to 6, 16 ms up to 8.
double seed_curve(int32_t rows) {
  if (rows <= 4) return 10;
  if (rows <= 6) return 13;
  return 16;
}

TEST(SpecPlanner, ReproducesTheSeedsWorkedExample) {
  // A drafts with confidence 0.9 per token, B with 0.5; three drafts each.
  const std::vector<std::vector<double>> confidences{{0.9, 0.9, 0.9}, {0.5, 0.5, 0.5}};
  const verification_plan plan = plan_budgeted(confidences, seed_curve);
  EXPECT_EQ(plan.num_draft_rows, (std::vector<int32_t>{3, 1}));  // A all three, B one
  EXPECT_EQ(plan.num_rows, 6);
  // 2 ordinary + 0.9 + 0.81 + 0.729 + 0.5
  EXPECT_DOUBLE_EQ(plan.expected_tokens, 4.939);
  EXPECT_DOUBLE_EQ(plan.predicted_ms, 13);
  EXPECT_NEAR(plan.tokens_per_ms(), 0.380, 0.0005);

  const verification_plan all = plan_fixed(confidences, seed_curve);
  EXPECT_EQ(all.num_draft_rows, (std::vector<int32_t>{3, 3}));
  EXPECT_EQ(all.num_rows, 8);
  EXPECT_DOUBLE_EQ(all.expected_tokens, 5.314);  // + 0.25 + 0.125
  EXPECT_DOUBLE_EQ(all.predicted_ms, 16);
  EXPECT_NEAR(all.tokens_per_ms(), 0.332, 0.0005);
  EXPECT_GT(plan.tokens_per_ms(), all.tokens_per_ms());
}

TEST(SpecPlanner, AFlatCurveVerifiesEveryDraftWorthAnything) {
  const auto flat = [](int32_t) { return 5.0; };
  const verification_plan plan = plan_budgeted({{0.2, 0.1}, {}, {0.7}}, flat);
  EXPECT_EQ(plan.num_draft_rows, (std::vector<int32_t>{2, 0, 1}));
  EXPECT_EQ(plan.num_rows, 6);
}

TEST(SpecPlanner, ASteepCurveVerifiesNothing) {
  // Each row doubles the step: no draft pays for itself.
  const auto steep = [](int32_t rows) { return 10.0 * rows; };
  const verification_plan plan = plan_budgeted({{0.99, 0.99}, {0.99}}, steep);
  EXPECT_EQ(plan.num_draft_rows, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(plan.num_rows, 2);
  EXPECT_DOUBLE_EQ(plan.expected_tokens, 2);
}

TEST(SpecPlanner, TiesGoToTheLowerRequestThenTheEarlierDraft) {
  // One draft row is free (3 rows cost what 2 do), a fourth is ruinous: equal products
  // compete for the one free row.
  const auto one_free_row = [](int32_t rows) { return rows <= 3 ? 2.0 : 100.0; };
  const verification_plan plan = plan_budgeted({{0.6}, {0.6}}, one_free_row);
  EXPECT_EQ(plan.num_draft_rows, (std::vector<int32_t>{1, 0}));
  const verification_plan swapped = plan_budgeted({{0.6, 0.6}, {0.6}}, one_free_row);
  EXPECT_EQ(swapped.num_draft_rows, (std::vector<int32_t>{1, 0}));
}

TEST(SpecPlanner, ConfidenceOneKeepsEachRequestsDraftsAPrefix) {
  const auto flat = [](int32_t rows) { return rows <= 4 ? 1.0 : 9.0; };
  const verification_plan plan = plan_budgeted({{1.0, 1.0, 1.0}, {1.0}}, flat);
  EXPECT_EQ(plan.num_draft_rows, (std::vector<int32_t>{2, 0}));
}

TEST(SpecPlanner, NoRequestsIsAnEmptyPlan) {
  const auto curve = [](int32_t) { return 3.0; };
  const verification_plan plan = plan_budgeted({}, curve);
  EXPECT_TRUE(plan.num_draft_rows.empty());
  EXPECT_EQ(plan.num_rows, 0);
}

TEST(SpecPlanner, DecodeCurvePricesRowsWithTheCostModel) {
  cost::cost_params p;
  p.step_ns = 1e6;   // 1 ms per step
  p.token_ns = 1e5;  // 0.1 ms per row
  p.attention_token_ns = 1e3;
  const step_time_curve curve = decode_curve(p, 99);  // 100 attended positions per row
  EXPECT_DOUBLE_EQ(curve(1), 1.2);
  EXPECT_DOUBLE_EQ(curve(10), 3.0);
}

TEST(SpecPlannerDeath, BadConfidencesAndCurvesAreOurBugs) {
  const auto curve = [](int32_t) { return 1.0; };
  EXPECT_DEATH((void)plan_budgeted({{1.5}}, curve), "confidence");
  EXPECT_DEATH((void)plan_fixed({{-0.1}}, curve), "confidence");
  const auto zero = [](int32_t) { return 0.0; };
  EXPECT_DEATH((void)plan_budgeted({{0.5}}, zero), "positive");
}

}  // namespace
}  // namespace troupe::spec
