#pragma once

/// The hit rule: how much of a prompt may come from the KV cache (issue 14, point 4; the seed's
/// §2, "the hit rule shows how the tiers interact").
///
/// For an `L`-token prompt at most `L - window_tokens - slack_tokens` tokens are served from
/// cache, rounded down to whole blocks, and never all `L` (the last token is always computed:
/// its logits give the next sample). `window_tokens` is the model's sliding-attention window
/// (0 for full-attention models, which keep no window state); `slack_tokens` the tokens kept
/// for speculative decoding. The seed's deployment: window 128 + slack 6 = 134.
///
/// With a window, reuse up to a point also needs the sliding-window state at that point. If it
/// is missing, the rule backs off one block and replays the last `window_tokens` tokens of the
/// (shortened) hit to rebuild it: those tokens' KV still comes from cache, but they are computed
/// again. Worked example (block 128, L = 10,000, window 128, slack 6, the whole prompt cached):
/// the cap 9,866 rounds down to 77 blocks = 9,856 tokens. Window state present: reuse 9,856,
/// compute 144. Missing: reuse 9,728, compute 400 = 128 replayed + 272 new. Nothing cached:
/// compute 10,000.

#include <cstdint>

namespace troupe::kv {

struct hit_rule_config {
  int32_t block_size = 16;
  int32_t window_tokens = 0;  ///< the model's sliding window; 0 = full attention
  int32_t slack_tokens = 0;   ///< always computed (speculative slack)
};

/// How a prompt splits between cache and compute.
struct cache_use {
  /// Leading tokens whose KV comes from cache: whole blocks.
  int32_t num_reused_tokens = 0;
  /// The last of the reused tokens, computed again to rebuild the window state (positions
  /// [num_reused_tokens - num_replayed_tokens, num_reused_tokens)); 0 without a window.
  int32_t num_replayed_tokens = 0;
  /// Tokens after the reused ones: positions [num_reused_tokens, L).
  int32_t num_new_tokens = 0;

  [[nodiscard]] int32_t num_computed_tokens() const { return num_replayed_tokens + num_new_tokens; }
};

/// The most tokens of an `num_prompt_tokens`-token prompt the rule lets come from cache: whole
/// blocks, at most L - window - slack and at most L - 1 (0 when that is negative).
[[nodiscard]] int32_t max_reused_tokens(const hit_rule_config& config, int32_t num_prompt_tokens);

/// Applies the rule to a cache hit of `num_hit_tokens` leading tokens (whole blocks, at most
/// the prompt). `window_state_present`: whether the window state at the capped hit's end is
/// available (ignored without a window). Arguments out of range are programmer errors (assert):
/// the engine validates the configuration.
[[nodiscard]] cache_use apply_hit_rule(const hit_rule_config& config, int32_t num_prompt_tokens,
                                       int32_t num_hit_tokens, bool window_state_present);

}  // namespace troupe::kv
