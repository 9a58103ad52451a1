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
  // int64: window + slack may be large; L - 1 keeps the last token computed (its logits).
  const int64_t cap = std::min<int64_t>(int64_t{num_prompt_tokens} - config.window_tokens - config.slack_tokens,
                                        int64_t{num_prompt_tokens} - 1);
  if (cap <= 0) return 0;
  return static_cast<int32_t>(cap / config.block_size * config.block_size);
}

cache_use apply_hit_rule(const hit_rule_config& config, int32_t num_prompt_tokens, int32_t num_hit_tokens,
                         bool window_state_present) {
  TROUPE_ASSERT(num_hit_tokens >= 0 && num_hit_tokens <= num_prompt_tokens);
  TROUPE_ASSERT_MSG(num_hit_tokens % config.block_size == 0, "a cache hit covers whole blocks");
  cache_use use;
  use.num_reused_tokens = std::min(num_hit_tokens, max_reused_tokens(config, num_prompt_tokens));
  if (config.window_tokens > 0 && !window_state_present && use.num_reused_tokens > 0) {
    use.num_reused_tokens -= config.block_size;
    use.num_replayed_tokens = std::min(config.window_tokens, use.num_reused_tokens);
  }
  use.num_new_tokens = num_prompt_tokens - use.num_reused_tokens;
  TROUPE_ASSERT(use.num_reused_tokens % config.block_size == 0);
  TROUPE_ASSERT(use.num_new_tokens > 0);
  return use;
}

}  // namespace troupe::kv
