// kv::apply_hit_rule: the seed's worked example exactly, the cap's rounding, the back-off and
// replay without window state, and the asserts on arguments out of range.
#include "runtime/kv/hit_rule.hpp"

#include <gtest/gtest.h>

namespace troupe::kv {
namespace {

/// The seed's deployment: 128-token blocks, a 128-token window, 6 tokens of slack.
constexpr hit_rule_config seed_rule{128, 128, 6};

void expect_use(const cache_use& use, int32_t reused, int32_t replayed, int32_t fresh) {
  EXPECT_EQ(use.num_reused_tokens, reused);
  EXPECT_EQ(use.num_replayed_tokens, replayed);
  EXPECT_EQ(use.num_new_tokens, fresh);
}

TEST(HitRule, TheSeedsWorkedExampleWithTheWholePromptCached) {
  EXPECT_EQ(max_reused_tokens(seed_rule, 10000), 9856);  // 10,000 - 134 = 9,866 -> 77 blocks
  // 78 whole blocks (9,984 tokens) match; the rule caps the hit at 77.
  const cache_use present = apply_hit_rule(seed_rule, 10000, 9984, /*window_state_present=*/true);
  expect_use(present, 9856, 0, 144);
  EXPECT_EQ(present.num_computed_tokens(), 144);
  const cache_use evicted = apply_hit_rule(seed_rule, 10000, 9984, /*window_state_present=*/false);
  expect_use(evicted, 9728, 128, 272);
  EXPECT_EQ(evicted.num_computed_tokens(), 400);
  const cache_use nothing = apply_hit_rule(seed_rule, 10000, 0, /*window_state_present=*/false);
  expect_use(nothing, 0, 0, 10000);
  EXPECT_EQ(nothing.num_computed_tokens(), 10000);
}

TEST(HitRule, AHitShorterThanTheCapIsReusedWhole) {
  expect_use(apply_hit_rule(seed_rule, 10000, 640, true), 640, 0, 9360);
  expect_use(apply_hit_rule(seed_rule, 10000, 640, false), 512, 128, 9488);
  expect_use(apply_hit_rule(seed_rule, 10000, 9856, true), 9856, 0, 144);  // exactly the cap
}

TEST(HitRule, FullAttentionLeavesOnlyTheLastTokenAndTheSlack) {
  const hit_rule_config full{16, 0, 0};
  EXPECT_EQ(max_reused_tokens(full, 1), 0);
  EXPECT_EQ(max_reused_tokens(full, 16), 0);   // 15 -> 0 blocks
  EXPECT_EQ(max_reused_tokens(full, 17), 16);
  EXPECT_EQ(max_reused_tokens(full, 32), 16);  // never all 32: the last token is computed
  EXPECT_EQ(max_reused_tokens(full, 33), 32);
  // Without a window the state flag changes nothing.
  expect_use(apply_hit_rule(full, 33, 32, false), 32, 0, 1);
  const hit_rule_config slack{16, 0, 6};
  EXPECT_EQ(max_reused_tokens(slack, 38), 32);  // 32 exactly
  EXPECT_EQ(max_reused_tokens(slack, 37), 16);  // 31 -> 1 block
  expect_use(apply_hit_rule(slack, 37, 32, true), 16, 0, 21);
}

TEST(HitRule, APromptShorterThanWindowAndSlackComesWhollyFromCompute) {
  EXPECT_EQ(max_reused_tokens(seed_rule, 134), 0);
  EXPECT_EQ(max_reused_tokens(seed_rule, 262), 128);
  expect_use(apply_hit_rule(seed_rule, 134, 128, true), 0, 0, 134);
  // The back-off empties the hit: nothing left to replay.
  expect_use(apply_hit_rule(seed_rule, 262, 256, false), 0, 0, 262);
}

TEST(HitRule, TheReplayNeverExceedsWhatIsReused) {
  const hit_rule_config small_blocks{16, 128, 0};
  expect_use(apply_hit_rule(small_blocks, 200, 48, false), 32, 32, 168);
  expect_use(apply_hit_rule(small_blocks, 1000, 320, false), 304, 128, 696);
}

TEST(HitRuleDeathTest, ArgumentsOutOfRangeAreProgrammerErrors) {
  EXPECT_DEATH((void)apply_hit_rule(seed_rule, 10000, 100, true), "a cache hit covers whole blocks");
  EXPECT_DEATH((void)apply_hit_rule(seed_rule, 100, 128, true), "num_hit_tokens <= num_prompt_tokens");
  EXPECT_DEATH((void)max_reused_tokens(seed_rule, 0), "num_prompt_tokens > 0");
  EXPECT_DEATH((void)max_reused_tokens(hit_rule_config{0, 0, 0}, 10), "block_size > 0");
  EXPECT_DEATH((void)max_reused_tokens(hit_rule_config{16, -1, 0}, 10), "window_tokens >= 0");
  EXPECT_DEATH((void)max_reused_tokens(hit_rule_config{16, 0, -1}, 10), "slack_tokens >= 0");
}

}  // namespace
}  // namespace troupe::kv
