#pragma once

/// How long one step takes, predicted from what it computes. A plan is reduced to five
/// features and its time is a linear function of them; the parameters are fitted by least
/// squares to measured steps (`troupe calibrate`) and read back from a calibration file. Used
/// by the simulator's executor, and by the scheduler to size prefill chunks under a step time
/// budget (chunk_budget.hpp); the real executor logs each step's features for calibration.
/// The engine corrects it online from measured steps (step_time_correction.hpp). Pure: no
/// clock, no I/O.

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/plan/step.hpp"

namespace troupe::cost {

/// What one step (or a sum of steps) computes, in the units the cost is linear in.
struct step_features {
  double num_steps = 1;         ///< fixed per-step work: launch, weight streaming, bookkeeping
  double num_tokens = 0;        ///< rows of the forward pass: Σ chunk tokens
  double num_sampled_rows = 0;  ///< samples drawn: Σ seeds
  /// Σ over every token of the number of positions it attends to (its position + 1). A chunk
  /// of q tokens starting at position c contributes q*c + q*(q+1)/2: prefill's q² term, the
  /// q·c term against cached context, and decode's cost growing with context, in one feature.
  double attention_tokens = 0;
  /// Σ over chunks of the positions whose KV the chunk reads (its first position + its
  /// tokens): the KV memory traffic when each sequence's context is read once. Decode rows
  /// read as much as they attend to, so every decode position pays this on top of
  /// attention_tokens; the rows of one prefill chunk share their context, so prefill pays it
  /// once per chunk. It separates decode's memory-bound attention from prefill's compute.
  double kv_read_tokens = 0;
};

/// The features of one plan. Every chunk counts, whether or not it samples.
[[nodiscard]] step_features features_of(const engine::exec_plan& plan);

/// The attended positions of a chunk of `num_tokens` tokens starting at `first_position`.
[[nodiscard]] double chunk_attention_tokens(int64_t first_position, int64_t num_tokens);

/// Nanoseconds per unit of each feature.
struct cost_params {
  double step_ns = 0;
  double token_ns = 0;
  double sampled_row_ns = 0;
  double attention_token_ns = 0;
  double kv_read_token_ns = 0;
  /// Not fitted, and not a step feature: the price of the first write to a page of a fresh KV
  /// pool (the kernel faults it in: runtime/common/page_buffer.hpp), which `troupe calibrate`
  /// measures apart and the simulator charges for each pool block a plan writes first
  /// (sim/cost_executor.hpp). 0: not measured.
  double first_touch_page_ns = 0;
};

/// Σ param * feature, rounded to the nearest nanosecond and clamped at 0.
[[nodiscard]] int64_t predict_ns(const cost_params& params, const step_features& features);

/// The features paired with the step time measured for them, in nanoseconds.
using step_sample = std::pair<step_features, double>;

/// The parameters' names, in cost_params' order (as in a calibration file).
inline constexpr const char* param_names[5] = {"step_ns", "token_ns", "sampled_row_ns", "attention_token_ns",
                                               "kv_read_token_ns"};

struct fit_result {
  cost_params params;
  double rms_error_ns = 0;        ///< sqrt(mean (predicted - measured)²)
  double mean_abs_rel_error = 0;  ///< mean |predicted - measured| / measured
  double time_error = 0;          ///< Σ |predicted - measured| / Σ measured: error weighted by time
  int64_t num_samples = 0;
  /// Per parameter (cost_params' order): held at its bound 0 because the unconstrained fit
  /// wanted it negative. Such a fit is a misfit: the model lacks a term the steps need, and
  /// the parameters it kept absorb that term's time.
  std::array<bool, 5> at_bound{};
  /// Per parameter: its standard error, from the settled weighted fit's covariance
  /// (σ² (XᵀWX)⁻¹ over the free parameters, σ² = the weighted residual sum over n − k); 0 for
  /// one at its bound.
  std::array<double, 5> std_error{};
};

/// Whether some parameter of `f` is at its bound (fit_result::at_bound).
[[nodiscard]] bool misfit(const fit_result& f);

/// k-fold cross-validation of `fit`: sample i is held out in fold i % k, each fold's steps are
/// predicted by the fit to the other folds. Returns the median over every held-out step of
/// |predicted − measured| / measured (the per-step error a calibration reports). Errors: those
/// of fit() for a fold, or k outside [2, samples.size()].
[[nodiscard]] expected<double> cross_validate(const std::vector<step_sample>& samples, int32_t k);

/// Least-squares fit of `cost_params` to measured steps, each step's squared error divided by
/// its time: Σ (predicted - measured)² / time. A step is the sum of many small pieces of work,
/// so its variance grows with its length; this weighting lets neither the few long steps (plain
/// least squares: they set the intercept and overprice every short step) nor the many short ones
/// (relative least squares: they hold little of the total time and underprice the decode batches
/// that hold much of it) decide the fit alone. The time a step is weighed by is its measured
/// time in a first pass, then its predicted time, refitted until the parameters settle
/// (iteratively reweighted least squares, at most 100 passes): weighing by the measured time
/// counts a step measured slow by chance less than one measured fast, so with noisy steps the
/// first pass prices the total low (by 4-6% on a busy engine's log, and the simulator calibrated
/// on it ran that much fast), while at the settled fit the predicted total equals the measured
/// one.
/// Constrained to non-negative parameters (a negative cost per token is never physical and
/// would predict negative times for small steps). Each pass's unconstrained solution comes from
/// the 5x5 normal equations with each feature scaled to unit norm, solved by Cholesky; when
/// some parameter comes out negative, the exact non-negative optimum is found by refitting on
/// every subset of the features (32 subsets) and keeping the best feasible one. Deterministic:
/// same samples, same bits.
///
/// Errors (invalid_argument): fewer samples than parameters; a negative, NaN or infinite
/// feature; a measured time that is not positive and finite; samples that do not determine the
/// parameters (a feature that is zero everywhere, or one that is a linear combination of the
/// others, e.g. all samples identical).
[[nodiscard]] expected<fit_result> fit(const std::vector<step_sample>& samples);

}  // namespace troupe::cost
