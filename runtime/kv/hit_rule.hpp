#pragma once

/// The hit rule: how much of a prompt may come from the KV cache (issue 14, point 4; issue 54,
/// point 5; the seed's §2, "the hit rule shows how the tiers interact").
///
/// For an `L`-token prompt at most `L - slack_tokens` tokens are served from cache, rounded down
/// to whole blocks, and never all `L` (the last token is always computed: its logits give the
/// next sample). `slack_tokens` are the tokens kept for speculative decoding.
///
/// Window state. A model with sliding-window layers (Gemma 2 and 3) reads, at position p, those
/// layers' KV of positions [p - window + 1, p] only. Reusing a prefix of R tokens then needs the
/// sliding layers' KV of positions [R - window + 1, R): the window state at R, which lies in
/// blocks [first_window_block, R / block_size). The global layers' KV is needed for the whole
/// prefix. A pool block that came from a tier keeping only its global layers (docs/kv-tiers.md,
/// "Window state") lacks its sliding rows; the rule reuses the longest prefix, within the cap,
/// whose window state every block holds — exact, so answers stay bit-identical (DESIGN
/// contract 1).
///
/// The seed instead caps a hit at L - window - slack and, when the window state is missing,
/// backs off one block and replays the last `window` tokens of the hit to rebuild it — an
/// approximation: the first replayed token's sliding attention reads the `window` positions
/// before the replay, whose sliding-layer KV is the missing state, and each sliding layer below
/// reaches `window` positions further back. Worked example (block 128, L = 10,000, window 128,
/// slack 6, a 9,856-token prefix cached): the seed reuses 9,856 and computes 144 with the window
/// state, and reuses 9,728 and computes 400 (128 replayed + 272 new) without it. Here: with it,
/// 9,856 and 144 too; without it, the longest prefix whose window state the pool holds (the end
/// of an earlier turn, or nothing).

#include <cstdint>
#include <vector>

namespace troupe::kv {

struct hit_rule_config {
  int32_t block_size = 16;
  int32_t window_tokens = 0;  ///< the model's sliding window; 0 = full attention (no window state)
  int32_t slack_tokens = 0;   ///< always computed (speculative slack)
};

/// The most tokens of an `num_prompt_tokens`-token prompt the rule lets come from cache: whole
/// blocks, at most L - slack and at most L - 1 (0 when that is negative).
[[nodiscard]] int32_t max_reused_tokens(const hit_rule_config& config, int32_t num_prompt_tokens);

/// The first block of the window state at `num_tokens` (whole blocks, >= 0): the blocks
/// [first_window_block, num_tokens / block_size) hold positions [num_tokens - window + 1,
/// num_tokens). Without a window (or a window of 1) that range is empty.
[[nodiscard]] int32_t first_window_block(const hit_rule_config& config, int32_t num_tokens);

/// The leading tokens of an `num_prompt_tokens`-token prompt to reuse from a cached prefix of
/// `holds_window.size()` blocks, where `holds_window[i]` says whether hit block i holds its
/// sliding layers' KV: the longest whole-block prefix within max_reused_tokens whose window
/// state every block holds (without a window: the hit, capped). Arguments out of range are
/// programmer errors (assert): the engine validates the configuration.
[[nodiscard]] int32_t reused_tokens(const hit_rule_config& config, int32_t num_prompt_tokens,
                                    const std::vector<uint8_t>& holds_window);

}  // namespace troupe::kv
