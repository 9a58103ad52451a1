#pragma once

/// Speculative verification (seed §3): the target model scored a request's ordinary row and its
/// k draft rows in one forward pass; this decides which drafts stand and what comes after them.
///
/// Two rules, chosen by the request:
/// - **exact** (temperature 0, greedy): the target samples each position as it would without
///   speculation (stream k = 0 at that position) and a draft stands iff it equals that sample.
///   The output is the non-speculative output, token for token, whatever the drafter proposed.
/// - **p/q** (temperature > 0): draft d at position t stands when a uniform u (stream
///   `stream_accept_coin` at t) satisfies u * q(d) * g < p(d), with p the target's and q the
///   drafter's distribution as the sampler builds them (sampler::weigh: the request's
///   penalties, temperature, top-k, top-p and min-p) and g = `accept_guard` = exp(-5e-5), the
///   seed's numerical guard that shrinks the draft probability. At the first rejected draft the
///   token is drawn from the residual max(p - q, 0) (stream `stream_resample` at t) and the
///   step ends; when every draft stands, one more token is sampled at the next position
///   (stream k = 0), as a plain decode step would. With g = 1 the tokens are distributed exactly
///   as without speculation (Leviathan et al., 2023); g < 1 accepts a little more often: each
///   token's distribution is within total variation 1/g - 1 (about 5e-5) of p.
///
/// Deterministic: every draw is (seed, position, k)'s, so a request's tokens depend on its own
/// drafts only; with drafts that depend only on the request (a fixed-length run) they are
/// independent of the batch.

#include <cstdint>
#include <vector>

#include "runtime/sampling/sampler.hpp"

namespace troupe::spec {

/// exp(-5e-5): the draft probability is multiplied by this in the accept test.
inline constexpr double accept_guard = 0.99995000124997917;

/// A drafter's proposal for one sequence: up to k tokens, each drawn from the drafter's own
/// distribution at its position.
struct draft {
  std::vector<int32_t> tokens;
  /// Per token: the drafter's distribution it was drawn from, as (vocab) 32.32 weights
  /// (sampling::sampler::weigh), and their sum. Empty for a deterministic drafter (n-gram): q is
  /// then the point mass on the token.
  std::vector<std::vector<uint64_t>> weights;
  std::vector<uint64_t> totals;
  /// Per token, the drafter's estimate in [0, 1] that the token stands given that the ones
  /// before it did (the planner's input, runtime/spec/planner.hpp).
  std::vector<double> confidence;
};

/// Confidence calibration (the drafters' reliability): of the drafts verified with a confidence
/// in bin b = [b / 10, (b + 1) / 10) (1.0 in the last), how many were verified and how many
/// stood. A draft after a rejected one is not verified and not counted, so a bin's acceptance
/// estimates "stands given the ones before it stood", which is what a confidence predicts.
struct reliability_table {
  static constexpr int num_bins = 10;
  std::vector<int64_t> verified = std::vector<int64_t>(num_bins, 0);
  std::vector<int64_t> accepted = std::vector<int64_t>(num_bins, 0);
  /// Counts a draft of `confidence` (in [0, 1]) that stood or not.
  void add(double confidence, bool stood);
  /// Adds another table's counts (`other` has num_bins of each).
  void merge(const reliability_table& other);
  /// The fitted calibration of `confidence`: its bin's observed acceptance, (accepted + 0.5) /
  /// (verified + 1), once the bin has `min_verified` drafts; `confidence` itself before.
  [[nodiscard]] double calibrate(double confidence, int64_t min_verified = calibration_min_verified) const;
  static constexpr int64_t calibration_min_verified = 32;
  [[nodiscard]] bool empty() const;
};

/// Whether a request's drafts are verified by exact match (temperature 0) or by p/q.
[[nodiscard]] bool exact_match(const sampling::sampling_params& params);

/// Verifies `d` (k = d.tokens.size() drafts) against the target: `logits` holds k + 1 rows of
/// `vocab_size`, row j the target's logits for the token at position `position + j` (row 0 is
/// the ordinary row). `context` is the sample's tokens before `position` (the penalties read
/// it, the accepted drafts extended). Returns the tokens of the step in order: the drafts that
/// stand, then one more — at least one, at most k + 1 — with their logprobs as `sample` reports
/// them. Every row must pass sampling::check_logits and `params` sampling::validate.
[[nodiscard]] std::vector<sampling::sample_result> verify(sampling::sampler& sampler, const float* logits,
                                                          int32_t vocab_size, const sampling::sampling_params& params,
                                                          uint64_t seed, int64_t position,
                                                          const sampling::token_context& context, const draft& d,
                                                          double guard = accept_guard);

/// Draws from (vocab) weights summing to `total` (> 0) with one uniform_below of `stream`: the
/// first token, in ascending order, whose cumulative weight exceeds it (the sampler's rule).
[[nodiscard]] int32_t draw(const std::vector<uint64_t>& weights, uint64_t total, sampling::random_stream& stream);

}  // namespace troupe::spec
