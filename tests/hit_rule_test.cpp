// kv::reused_tokens: the seed's worked example with and without the window state, the cap's
// rounding, the exact back-off to the longest prefix whose window state the pool holds, and
// the asserts on arguments out of range.
#include "runtime/kv/hit_rule.hpp"

#include <gtest/gtest.h>

namespace troupe::kv {
namespace {

/// The seed's deployment: 128-token blocks, a 128-token window, 6 tokens of slack.
constexpr hit_rule_config seed_rule{128, 128, 6};

/// `n` hit blocks, each holding its sliding rows unless listed in `lacking`.
std::vector<uint8_t> blocks(size_t n, std::initializer_list<size_t> lacking = {}) {
  std::vector<uint8_t> holds(n, 1);
  for (const size_t i : lacking) holds.at(i) = 0;
  return holds;
}

TEST(HitRule, TheSeedsWorkedExampleReusesTheCachedPrefixWithItsWindowStateAndBacksOffExactlyWithout) {
  // A 10,000-token prompt whose first 9,866 tokens an earlier turn left cached: 77 whole blocks.
  EXPECT_EQ(reused_tokens(seed_rule, 10000, blocks(77)), 9856);  // 144 computed
  // Its last block's sliding rows missing (promoted without them): the window state at 9,856
  // (positions 9,729-9,855) is gone, and so is the one at 9,728 (block 75 holds 9,601-9,727).
  EXPECT_EQ(reused_tokens(seed_rule, 10000, blocks(77, {76})), 9728);  // 272 computed, nothing replayed
  EXPECT_EQ(reused_tokens(seed_rule, 10000, blocks(77, {75, 76})), 9600);
  // Only the blocks of the window matter: block 10's rows lie before every window after it.
  EXPECT_EQ(reused_tokens(seed_rule, 10000, blocks(77, {10})), 9856);
  EXPECT_EQ(reused_tokens(seed_rule, 10000, blocks(0)), 0);  // nothing cached: 10,000 computed
}

TEST(HitRule, TheCapKeepsTheSlackAndTheLastTokenWithOrWithoutAWindow) {
  EXPECT_EQ(max_reused_tokens(seed_rule, 10000), 9984);  // 10,000 - 6 = 9,994 -> 78 blocks
  EXPECT_EQ(reused_tokens(seed_rule, 10000, blocks(78)), 9984);
  EXPECT_EQ(reused_tokens(seed_rule, 10000, blocks(78, {77})), 9856);
  const hit_rule_config full{16, 0, 0};
  EXPECT_EQ(max_reused_tokens(full, 1), 0);
  EXPECT_EQ(max_reused_tokens(full, 16), 0);   // 15 -> 0 blocks
  EXPECT_EQ(max_reused_tokens(full, 17), 16);
  EXPECT_EQ(max_reused_tokens(full, 32), 16);  // never all 32: the last token is computed
  EXPECT_EQ(max_reused_tokens(full, 33), 32);
  // Without a window no block's rows matter.
  EXPECT_EQ(reused_tokens(full, 33, blocks(2, {0, 1})), 32);
  const hit_rule_config slack{16, 0, 6};
  EXPECT_EQ(max_reused_tokens(slack, 38), 32);  // 32 exactly
  EXPECT_EQ(max_reused_tokens(slack, 37), 16);  // 31 -> 1 block
  EXPECT_EQ(reused_tokens(slack, 37, blocks(2)), 16);
}

TEST(HitRule, AWindowLongerThanABlockNeedsEveryBlockItCovers) {
  const hit_rule_config wide{16, 40, 0};  // the state at R: positions R-39 .. R-1, three blocks
  EXPECT_EQ(first_window_block(wide, 64), 1);  // 25 -> block 1
  EXPECT_EQ(first_window_block(wide, 32), 0);  // -7 -> 0
  EXPECT_EQ(first_window_block(wide, 0), 0);
  EXPECT_EQ(reused_tokens(wide, 100, blocks(4)), 64);
  EXPECT_EQ(reused_tokens(wide, 100, blocks(4, {0})), 64);  // block 0 is before the window at 64
  EXPECT_EQ(reused_tokens(wide, 100, blocks(4, {1})), 16);  // in the windows at 64, 48 and 32
  EXPECT_EQ(reused_tokens(wide, 100, blocks(4, {3})), 48);
  const hit_rule_config one{16, 1, 0};  // a window of 1 reads only its own position: no state
  EXPECT_EQ(first_window_block(one, 48), 3);
  EXPECT_EQ(reused_tokens(one, 100, blocks(4, {0, 1, 2, 3})), 64);
}

TEST(HitRuleDeathTest, ArgumentsOutOfRangeAreProgrammerErrors) {
  EXPECT_DEATH((void)reused_tokens(seed_rule, 100, blocks(1)), "a cache hit covers at most the prompt");
  EXPECT_DEATH((void)first_window_block(seed_rule, 100), "the window state is asked at a block's end");
  EXPECT_DEATH((void)max_reused_tokens(seed_rule, 0), "num_prompt_tokens > 0");
  EXPECT_DEATH((void)max_reused_tokens(hit_rule_config{0, 0, 0}, 10), "block_size > 0");
  EXPECT_DEATH((void)max_reused_tokens(hit_rule_config{16, -1, 0}, 10), "window_tokens >= 0");
  EXPECT_DEATH((void)max_reused_tokens(hit_rule_config{16, 0, -1}, 10), "slack_tokens >= 0");
}

}  // namespace
}  // namespace troupe::kv
