// runtime/cost/chunk_budget: the largest prefill chunk that keeps a step within a time budget,
// on hand-computed fits (every expected value below is worked out in its comment), and against
// a plain linear search on many random fits.
#include "runtime/cost/chunk_budget.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

namespace troupe::cost {
namespace {

// 1 µs per step, 10 ns per token, 50 ns per sample, 2 ns per attended position: a chunk of q
// tokens from position c costs 10q + 2(qc + q(q+1)/2) = q² + (11 + 2c)q on top of the step.
constexpr cost_params k_fit{1000, 10, 50, 2, 0};
constexpr int64_t k_budget_ns = 2000;

step_features empty_step() { return {}; }  // num_steps = 1, nothing else

TEST(ChunkFeatures, AreTheChunksShareOfAPlansFeatures) {
  const step_features f = chunk_features(100, 4, 1);
  EXPECT_EQ(f.num_steps, 0);
  EXPECT_EQ(f.num_tokens, 4);
  EXPECT_EQ(f.num_sampled_rows, 1);
  EXPECT_EQ(f.attention_tokens, 4 * 100 + 4 * 5 / 2);
  EXPECT_EQ(f.kv_read_tokens, 104);
  step_features sum = empty_step();
  add_features(sum, f);
  add_features(sum, chunk_features(7, 1, 1));
  EXPECT_EQ(sum.num_steps, 1);
  EXPECT_EQ(sum.num_tokens, 5);
  EXPECT_EQ(sum.num_sampled_rows, 2);
  EXPECT_EQ(sum.attention_tokens, 410 + 8);
  EXPECT_EQ(sum.kv_read_tokens, 104 + 8);
}

TEST(MaxChunkTokens, AnEarlyChunkOfALongPromptGetsMoreTokensThanALateOne) {
  // c = 0: q² + 11q <= 1000 -> q = 26 (962; 27 would be 1026).
  EXPECT_EQ(max_chunk_tokens(k_fit, empty_step(), k_budget_ns, 0, 1000, false), 26);
  // c = 100: q² + 211q <= 1000 -> q = 4 (860; 5 would be 1080).
  EXPECT_EQ(max_chunk_tokens(k_fit, empty_step(), k_budget_ns, 100, 1000, false), 4);
  // c = 1000: q² + 2011q <= 1000 -> not even one token.
  EXPECT_EQ(max_chunk_tokens(k_fit, empty_step(), k_budget_ns, 1000, 1000, false), 0);
}

TEST(MaxChunkTokens, PaysTheKvReadOfTheCachedContextOnce) {
  // kv_read 5 ns, c = 100: 1000 + q² + 211q + 5(100 + q) <= 2000 -> q² + 216q <= 500 -> q = 2
  // (436; 3 would be 657).
  cost_params p = k_fit;
  p.kv_read_token_ns = 5;
  EXPECT_EQ(max_chunk_tokens(p, empty_step(), k_budget_ns, 100, 1000, false), 2);
}

TEST(MaxChunkTokens, CountsTheDecodeRowsAlreadyPlanned) {
  // Three decode rows at position 50: 3 tokens, 3 samples, 3 * 51 attended positions:
  // 1000 + 30 + 150 + 306 = 1486 ns, leaving 514: q² + 11q <= 514 -> q = 17 (476; 18: 522).
  step_features planned = empty_step();
  for (int i = 0; i < 3; i++) add_features(planned, chunk_features(50, 1, 1));
  EXPECT_EQ(predict_ns(k_fit, planned), 1486);
  EXPECT_EQ(max_chunk_tokens(k_fit, planned, k_budget_ns, 0, 1000, false), 17);
  // A step already over its budget has no room at all.
  add_features(planned, chunk_features(0, 100, 0));
  EXPECT_EQ(max_chunk_tokens(k_fit, planned, k_budget_ns, 0, 1000, false), 0);
}

TEST(MaxChunkTokens, AChunkThatReachesTheEndPaysItsSample) {
  // 26 tokens cost 962 ns, and 1012 with the sample the last prompt token draws: 25 (900).
  EXPECT_EQ(max_chunk_tokens(k_fit, empty_step(), k_budget_ns, 0, 26, true), 25);
  EXPECT_EQ(max_chunk_tokens(k_fit, empty_step(), k_budget_ns, 0, 26, false), 26);
  // The cap below the time limit: 20 tokens and the sample cost 620 + 50 ns.
  EXPECT_EQ(max_chunk_tokens(k_fit, empty_step(), k_budget_ns, 0, 20, true), 20);
}

TEST(MaxChunkTokens, IsCappedByTheTokenLimit) {
  EXPECT_EQ(max_chunk_tokens(k_fit, empty_step(), k_budget_ns, 0, 10, false), 10);
  EXPECT_EQ(max_chunk_tokens(k_fit, empty_step(), k_budget_ns, 0, 0, false), 0);
  // Tokens that cost nothing: only the cap bounds the chunk.
  EXPECT_EQ(max_chunk_tokens(cost_params{1000, 0, 0, 0, 0}, empty_step(), k_budget_ns, 0, 5000, true), 5000);
}

TEST(MaxChunkTokens, AdmitsExactlyWhatTheModelsRoundingAdmits) {
  // 0.4 ns per token, budget 10 ns: 26 tokens predict round(10.4) = 10, 27 round(10.8) = 11.
  const cost_params p{0, 0.4, 0, 0, 0};
  EXPECT_EQ(predict_ns(p, {1, 26, 0, 0, 0}), 10);
  EXPECT_EQ(predict_ns(p, {1, 27, 0, 0, 0}), 11);
  EXPECT_EQ(max_chunk_tokens(p, empty_step(), 10, 0, 1000, false), 26);
}

TEST(MaxChunkTokens, EqualsALinearSearchOnRandomFits) {
  std::mt19937_64 rng(16);
  std::uniform_real_distribution<double> ns(0, 50);
  std::uniform_int_distribution<int32_t> position(0, 4000), cap(0, 600), rows(0, 40);
  for (int trial = 0; trial < 2000; trial++) {
    const cost_params p{ns(rng) * 1000, ns(rng), ns(rng) * 10, ns(rng) / 10, ns(rng) / 20};
    step_features planned;
    for (int32_t r = rows(rng); r > 0; r--) add_features(planned, chunk_features(position(rng), 1, 1));
    const int64_t budget = static_cast<int64_t>(ns(rng) * 4000);
    const int32_t c = position(rng), q_max = cap(rng);
    const bool samples = trial % 2 == 0;
    int32_t want = 0;
    for (int32_t q = 1; q <= q_max; q++) {
      step_features f = planned;
      add_features(f, chunk_features(c, q, samples && q == q_max ? 1 : 0));
      if (predict_ns(p, f) <= budget) want = q;  // the largest that fits, wherever it is
    }
    ASSERT_EQ(max_chunk_tokens(p, planned, budget, c, q_max, samples), want) << "trial " << trial;
  }
}

}  // namespace
}  // namespace troupe::cost
