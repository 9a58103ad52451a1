#pragma once

/// The verification planner: how many of each request's draft tokens one step verifies.
///
/// Every request in the step gets its ordinary row (the token it samples anyway: one expected
/// token). Draft j of a request is worth the probability that it and every draft before it are
/// accepted — the running product of the drafter's confidences c_1 * ... * c_j — because a
/// draft counts only if all before it were accepted. `fixed` verifies up to k drafts of every
/// request, whatever its batch-mates: a request's path is then independent of its batch, which
/// deterministic sampling needs. `budgeted` (seed §4) pools the (request, draft) pairs of the
/// whole step, sorts them by running product (ties: lower request index, then earlier draft),
/// adds them one by one after the ordinary rows, and keeps the prefix whose expected tokens per
/// predicted millisecond is highest — rows are spent where they pay, so how many drafts a
/// request verifies (and hence its sampled path) depends on its batch-mates. Sorting by running
/// product keeps each request's chosen drafts a prefix (products never grow along a request).
///
/// Pure: the step-time curve (rows -> predicted ms) comes in as an argument.

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/cost/cost_model.hpp"
#include "runtime/plan/step.hpp"

namespace troupe::spec {

/// Predicted step time in milliseconds of a step of `rows` forward rows (> 0, non-decreasing).
using step_time_curve = std::function<double(int32_t rows)>;

/// What the planner chose.
struct verification_plan {
  std::vector<int32_t> num_draft_rows;  ///< per request, a prefix of its drafts
  int32_t num_rows = 0;                 ///< ordinary rows + draft rows
  double expected_tokens = 0;           ///< ordinary rows + Σ running products of chosen drafts
  double predicted_ms = 0;              ///< the curve at num_rows
  [[nodiscard]] double tokens_per_ms() const { return expected_tokens / predicted_ms; }
};

/// Every request verifies all its drafts (`confidences[r]` holds one per draft, each in [0, 1]).
[[nodiscard]] verification_plan plan_fixed(const std::vector<std::vector<double>>& confidences,
                                           const step_time_curve& curve);

/// The budgeted plan (see the file comment). Ties in tokens per ms keep the shorter prefix.
[[nodiscard]] verification_plan plan_budgeted(const std::vector<std::vector<double>>& confidences,
                                              const step_time_curve& curve);

/// `f` plus `rows` decode rows, each attending to and reading `context_tokens` + 1 positions.
[[nodiscard]] cost::step_features with_decode_rows(cost::step_features f, int32_t rows, double context_tokens);

/// The mean position of `plan`'s speculating chunks (0 without any): where its draft rows attend.
[[nodiscard]] double mean_draft_context(const engine::exec_plan& plan);

/// The features of a step that ran `plan` and verified `num_draft_rows` drafts: the plan's own,
/// plus each draft row as a decode row at mean_draft_context.
[[nodiscard]] cost::step_features features_with_drafts(const engine::exec_plan& plan, int64_t num_draft_rows);

/// The budgeted plan of a step's speculating requests (`confidences`, plan order) on the curve
/// the engine sent with it (engine::exec_plan::draft_rows_ms: entry j is the step with j draft
/// rows beside its own rows, one ordinary row per request among them).
[[nodiscard]] verification_plan plan_budgeted(const std::vector<std::vector<double>>& confidences,
                                              const std::vector<double>& draft_rows_ms);

/// The step-time curve of the cost model for decode rows at an average context of
/// `context_tokens` positions: each row is one token that attends to and reads the context.
[[nodiscard]] step_time_curve decode_curve(const cost::cost_params& params, double context_tokens);

/// A budgeted plan's engine::exec_plan::draft_rows_ms: entry j (0 .. num_slots) the cost
/// model's time in ms of a step of `base` features plus j draft rows, each a decode row at a
/// context of `context_tokens` positions.
[[nodiscard]] std::vector<double> draft_rows_curve(const cost::cost_params& params, const cost::step_features& base,
                                                   int32_t num_slots, double context_tokens);

}  // namespace troupe::spec
