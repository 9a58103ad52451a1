#pragma once

/// How an engine speculates (issue 17): which drafter proposes tokens and how many. Its own
/// small header: the topology and the CLI read it without the engine.

#include <cstdint>
#include <string>

#include "runtime/common/error.hpp"

namespace troupe::spec {

enum class drafter_kind {
  none,        ///< no speculation
  ngram,       ///< prompt lookup: continue the latest earlier occurrence of the last n tokens
  layer_skip,  ///< self-draft: the target's first `draft_layers` layers, final norm and classifier
  draft_model, ///< a separate llama2.c checkpoint with the target's vocabulary
};

struct speculation_config {
  drafter_kind drafter = drafter_kind::none;
  /// Drafts per decode step, at most (k). Every draft is verified (fixed-length verification:
  /// a request's tokens do not depend on its batch).
  int32_t num_speculative_tokens = 4;
  int32_t ngram_min = 1;  ///< n-gram: the shortest suffix matched
  int32_t ngram_max = 3;  ///< n-gram: the longest suffix matched (tried first)
  int32_t draft_layers = 1;  ///< layer_skip: how many of the target's layers draft
  std::string draft_model;   ///< draft_model: the checkpoint's path
  /// `budgeted` (seed §4): each step verifies only the drafts that pay, chosen across the batch
  /// by the verification planner (runtime/spec/planner.hpp) from the drafters' confidences and
  /// the engine's step-time model; a request's tokens then depend on its batch-mates. Off:
  /// fixed-length verification (every draft verified: batch-invariant).
  bool budgeted = false;
  [[nodiscard]] bool enabled() const { return drafter != drafter_kind::none; }
};

/// Most drafts per step.
inline constexpr int32_t num_speculative_tokens_max = 16;

/// "none", "ngram", "layer_skip" or "draft_model".
[[nodiscard]] const char* to_string(drafter_kind kind);
[[nodiscard]] expected<drafter_kind> parse_drafter(const std::string& name);

/// Checks the numbers against a target of `target_layers` layers (the draft model's own checks
/// happen where it is loaded).
[[nodiscard]] expected<void> validate(const speculation_config& config, int32_t target_layers);

}  // namespace troupe::spec
