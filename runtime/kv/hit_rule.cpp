#include "runtime/kv/hit_rule.hpp"

#include <algorithm>

#include "runtime/common/error.hpp"

namespace troupe::kv {
namespace {

void check_config(const hit_rule_config& config) {
  TROUPE_ASSERT(config.block_size > 0);
  TROUPE_ASSERT(config.window_tokens >= 0);
  TROUPE_ASSERT(config.slack_tokens >= 0);
}

}  // namespace

int32_t max_reused_tokens(const hit_rule_config& config, int32_t num_prompt_tokens) {
  check_config(config);
  TROUPE_ASSERT(num_prompt_tokens > 0);
  // int64: the slack may be large; L - 1 keeps the last token computed (its logits).
  const int64_t cap = std::min<int64_t>(int64_t{num_prompt_tokens} - config.slack_tokens, int64_t{num_prompt_tokens} - 1);
  if (cap <= 0) return 0;
  return static_cast<int32_t>(cap / config.block_size * config.block_size);
}

int32_t first_window_block(const hit_rule_config& config, int32_t num_tokens) {
  check_config(config);
  TROUPE_ASSERT_MSG(num_tokens >= 0 && num_tokens % config.block_size == 0, "the window state is asked at a block's end");
  if (config.window_tokens <= 1) return num_tokens / config.block_size;
  const int64_t first_position = std::max<int64_t>(0, int64_t{num_tokens} - (config.window_tokens - 1));
  return static_cast<int32_t>(first_position / config.block_size);
}

int32_t reused_tokens(const hit_rule_config& config, int32_t num_prompt_tokens, const std::vector<uint8_t>& holds_window) {
  TROUPE_ASSERT_MSG(static_cast<int64_t>(holds_window.size()) * config.block_size <= num_prompt_tokens,
                    "a cache hit covers at most the prompt");
  const size_t cap_blocks = static_cast<size_t>(max_reused_tokens(config, num_prompt_tokens) / config.block_size);
  // The longest prefix whose window state's blocks all hold their rows (without a window that
  // range is empty: the first, the capped hit).
  for (size_t k = std::min(holds_window.size(), cap_blocks); k > 0; k--) {
    const auto num_tokens = static_cast<int32_t>(k) * config.block_size;
    const auto first = holds_window.begin() + first_window_block(config, num_tokens);
    if (std::all_of(first, holds_window.begin() + static_cast<std::ptrdiff_t>(k), [](uint8_t h) { return h != 0; }))
      return num_tokens;
  }
  return 0;
}

}  // namespace troupe::kv
