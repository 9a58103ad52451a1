#pragma once

/// Sizing a prefill chunk by time: the largest chunk whose step still fits a time budget.
///
/// A chunk of q tokens after c computed ones adds, by the linear cost model (cost_model.hpp),
///
///     token_ns*q + attention_token_ns*(q*c + q(q+1)/2) + kv_read_token_ns*(c + q)
///     (+ sampled_row_ns when it samples)
///
/// to its step: a quadratic in q whose linear coefficient grows with c, so under one budget a
/// chunk late in a long prompt gets fewer tokens than an early one. `max_chunk_tokens` solves
/// the quadratic in closed form and then settles the integer answer against `predict_ns`
/// itself, so the result is exactly the largest q that the model's own rounding admits. Pure.

#include <cstdint>

#include "runtime/cost/cost_model.hpp"

namespace troupe::cost {

/// The features of a chunk of `num_tokens` tokens starting at `first_position` that draws
/// `num_samples` samples (num_steps = 0: a part of a step, to add to one).
[[nodiscard]] step_features chunk_features(int64_t first_position, int64_t num_tokens, int32_t num_samples);

/// `sum` + `part`, feature by feature (num_steps included).
void add_features(step_features& sum, const step_features& part);

/// The largest q in [0, num_tokens_max] such that a step computing `planned` plus a chunk of q
/// tokens from `first_position` is predicted to take at most `budget_ns`. The chunk samples one
/// row exactly when it takes all `num_tokens_max` tokens and `samples_at_max` (it reaches the
/// sequence's last token). 0 when not even one token fits.
[[nodiscard]] int32_t max_chunk_tokens(const cost_params& params, const step_features& planned, int64_t budget_ns,
                                       int64_t first_position, int32_t num_tokens_max, bool samples_at_max);

}  // namespace troupe::cost
