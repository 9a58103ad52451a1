#pragma once

/// Online correction of the step-time model (issue 16, point 2): the fitted cost model
/// (cost_model.hpp) is the prior; each step the executor measured corrects it.
///
/// Per step shape — decode-only steps, and steps that compute a prefill chunk — a window of
/// the last `window` ratios measured / predicted is kept, and a prediction for that shape is
/// multiplied by the window's running median (the lower middle element: no averaging, so the
/// factor is always one of the observed ratios). A shape with no ratio yet borrows the median
/// of all recent steps; with none at all the factor is 1. A median, not a mean: one step
/// stalled by a page fault or a preempted thread moves it by one rank, not by its size.
///
/// Deterministic given the reported times (no clock is read here): the simulator's executor
/// reports virtual times and replays every correction. Scores itself online: before each
/// measured step updates the windows, the step's prediction with and without the current
/// correction is compared to the measurement (mean relative error, `error_stats`).

#include <array>
#include <cstdint>
#include <vector>

#include "runtime/cost/cost_model.hpp"

namespace troupe::cost {

enum class step_shape : uint8_t { decode, prefill };

/// decode when every token of the step is a sampled decode row, prefill otherwise.
[[nodiscard]] step_shape shape_of(const step_features& f);

/// The prediction error of the measured steps so far: Σ |predicted - measured| / measured.
struct prediction_error {
  int64_t num_steps = 0;
  double raw_sum = 0;        ///< the fitted model alone
  double corrected_sum = 0;  ///< the model times the correction in force when the step ran

  [[nodiscard]] double raw_mean() const { return num_steps == 0 ? 0 : raw_sum / static_cast<double>(num_steps); }
  [[nodiscard]] double corrected_mean() const {
    return num_steps == 0 ? 0 : corrected_sum / static_cast<double>(num_steps);
  }
};

class step_time_correction {
 public:
  /// The most ratios a window may hold.
  static constexpr int32_t window_max = 4096;

  /// `window` in [1, window_max].
  explicit step_time_correction(int32_t window);

  /// A step of features `f` that the model (`params`) priced at `predicted_ns` took
  /// `measured_ns` (> 0). Steps the model prices at 0 ns carry no ratio and are skipped.
  void observe(const step_features& f, int64_t predicted_ns, int64_t measured_ns);

  /// measured / predicted for steps of `shape`: the median of its window, else of all recent
  /// steps, else 1.
  [[nodiscard]] double factor(step_shape shape) const;

  [[nodiscard]] const prediction_error& error() const { return error_; }

  void check_invariants() const;

 private:
  /// The last `capacity` ratios, oldest overwritten first.
  struct ring {
    std::vector<double> ratios;
    size_t next = 0;  // where the next ratio goes once full
    void push(double ratio, size_t capacity);
    [[nodiscard]] double median() const;  // lower median; needs a ratio
  };

  size_t window_;
  std::array<ring, 2> by_shape_;  // indexed by step_shape
  ring all_;
  prediction_error error_;
};

}  // namespace troupe::cost
