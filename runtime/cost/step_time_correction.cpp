#include "runtime/cost/step_time_correction.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace troupe::cost {

step_shape shape_of(const step_features& f) {
  return f.num_tokens <= f.num_sampled_rows ? step_shape::decode : step_shape::prefill;
}

void step_time_correction::ring::push(double ratio, size_t capacity) {
  if (ratios.size() < capacity) {
    ratios.push_back(ratio);
    return;
  }
  ratios[next] = ratio;
  next = (next + 1) % capacity;
}

double step_time_correction::ring::median() const {
  TROUPE_ASSERT(!ratios.empty());
  std::vector<double> sorted = ratios;
  const auto middle = sorted.begin() + static_cast<std::ptrdiff_t>((sorted.size() - 1) / 2);
  std::nth_element(sorted.begin(), middle, sorted.end());
  return *middle;
}

step_time_correction::step_time_correction(int32_t window) : window_(static_cast<size_t>(window)) {
  TROUPE_ASSERT(window >= 1 && window <= window_max);
}

void step_time_correction::observe(const step_features& f, int64_t predicted_ns, int64_t measured_ns) {
  TROUPE_ASSERT(measured_ns > 0);
  TROUPE_ASSERT(predicted_ns >= 0);
  if (predicted_ns == 0) return;
  const step_shape shape = shape_of(f);
  const auto predicted = static_cast<double>(predicted_ns);
  const auto measured = static_cast<double>(measured_ns);
  error_.num_steps++;
  error_.raw_sum += std::abs(predicted - measured) / measured;
  error_.corrected_sum += std::abs(predicted * factor(shape) - measured) / measured;
  const double ratio = measured / predicted;
  by_shape_[static_cast<size_t>(shape)].push(ratio, window_);
  all_.push(ratio, window_);
}

double step_time_correction::factor(step_shape shape) const {
  const ring& own = by_shape_[static_cast<size_t>(shape)];
  if (!own.ratios.empty()) return own.median();
  return all_.ratios.empty() ? 1.0 : all_.median();
}

void step_time_correction::check_invariants() const {
  size_t num_by_shape = 0;
  for (const ring* r : {&by_shape_[0], &by_shape_[1], &all_}) {
    TROUPE_ASSERT(r->ratios.size() <= window_);
    TROUPE_ASSERT(r->next < window_);
    TROUPE_ASSERT(r->next == 0 || r->ratios.size() == window_);
    for (double ratio : r->ratios) TROUPE_ASSERT(std::isfinite(ratio) && ratio > 0);
    if (r != &all_) num_by_shape += r->ratios.size();
  }
  // Every ratio goes into its shape's window and into all_: until some window is full, all_
  // holds exactly the shapes' ratios; from then on, a full window.
  TROUPE_ASSERT(all_.ratios.size() == std::min(num_by_shape, window_));
  TROUPE_ASSERT(static_cast<int64_t>(all_.ratios.size()) <= error_.num_steps);
  TROUPE_ASSERT(error_.raw_sum >= 0 && error_.corrected_sum >= 0);
}

}  // namespace troupe::cost
