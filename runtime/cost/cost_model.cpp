#include "runtime/cost/cost_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string>

#include "runtime/cost/chunk_budget.hpp"

namespace troupe::cost {
namespace {

constexpr int num_params = 5;
using vec = std::array<double, num_params>;
// Sums run in long double (x86-64: 64-bit mantissa) so that the normal equations, whose
// condition number is the square of the data's, keep the precision a QR solve would.
using wide = long double;

constexpr const char* feature_names[num_params] = {"num_steps", "num_tokens", "num_sampled_rows",
                                                   "attention_tokens", "kv_read_tokens"};

// Passes of the reweighted fit at most. To a relative change of 1e-12 the shipped CPU step log
// settles in 23, the tests' samples in 2-11; a fit stopped here is within ~1e-9 of its limit.
constexpr int max_passes = 100;

// Below this pivot (1 - R² of a unit-norm feature regressed on the ones before it) the
// feature is taken to be a combination of the others: the samples do not determine its cost.
constexpr wide singular_pivot = 1e-9L;

vec as_vec(const step_features& f) {
  return {f.num_steps, f.num_tokens, f.num_sampled_rows, f.attention_tokens, f.kv_read_tokens};
}

cost_params as_params(const vec& p) { return {p[0], p[1], p[2], p[3], p[4]}; }

double dot(const vec& a, const vec& b) {
  double s = 0;
  for (int j = 0; j < num_params; j++) s += a[j] * b[j];
  return s;
}

/// The normal equations of the fit with every feature scaled to unit norm.
struct normal_equations {
  vec scale{};                                          // norm of each feature column
  std::array<std::array<wide, num_params>, num_params> gram{};  // (param, param), unit diagonal
  std::array<wide, num_params> rhs{};                   // scaled features . measured
};

expected<void> validate(const std::vector<step_sample>& samples) {
  if (samples.size() < num_params)
    return fail(errc::invalid_argument, "cannot fit " + std::to_string(num_params) +
                                            " cost parameters from " + std::to_string(samples.size()) +
                                            " samples; need at least " + std::to_string(num_params));
  for (size_t i = 0; i < samples.size(); i++) {
    const vec x = as_vec(samples[i].first);
    for (int j = 0; j < num_params; j++)
      if (!std::isfinite(x[j]) || x[j] < 0)
        return fail(errc::invalid_argument, "sample " + std::to_string(i) + ": feature " +
                                                feature_names[j] + " = " + std::to_string(x[j]) +
                                                " is not a finite non-negative number");
    const double y = samples[i].second;
    if (!std::isfinite(y) || y <= 0)
      return fail(errc::invalid_argument, "sample " + std::to_string(i) + ": measured time " +
                                              std::to_string(y) + " ns is not a finite positive number");
  }
  return {};
}

/// Each sample's variance, up to a common factor: its measured time in the first pass, its
/// predicted time in the passes after (see fit()).
using variances = std::vector<wide>;

/// Rows and targets are multiplied by 1/sqrt(variance), so the fit minimizes
/// Σ (predicted - measured)² / variance.
expected<normal_equations> build(const std::vector<step_sample>& samples, const variances& var) {
  normal_equations ne;
  std::array<wide, num_params> sum_sq{};
  for (size_t i = 0; i < samples.size(); i++) {
    const vec x = as_vec(samples[i].first);
    const wide w = 1 / std::sqrt(var[i]);
    for (int j = 0; j < num_params; j++) sum_sq[j] += (x[j] * w) * (x[j] * w);
  }
  for (int j = 0; j < num_params; j++) {
    if (sum_sq[j] == 0)
      return fail(errc::invalid_argument, std::string("feature ") + feature_names[j] +
                                              " is zero in every sample; its cost cannot be fitted");
    ne.scale[j] = static_cast<double>(std::sqrt(sum_sq[j]));
  }
  for (size_t i = 0; i < samples.size(); i++) {
    const vec x = as_vec(samples[i].first);
    const wide w = 1 / std::sqrt(var[i]);
    const wide target = static_cast<wide>(samples[i].second) * w;
    std::array<wide, num_params> u{};
    for (int j = 0; j < num_params; j++) u[j] = static_cast<wide>(x[j]) * w / ne.scale[j];
    for (int j = 0; j < num_params; j++) {
      ne.rhs[j] += u[j] * target;
      for (int k = 0; k < num_params; k++) ne.gram[j][k] += u[j] * u[k];
    }
  }
  return ne;
}

/// The Cholesky factor L (gram = L Lᵀ) of the normal equations restricted to the features
/// idx[0..n), in subset indices; or the first feature whose pivot is below `singular_pivot`.
struct cholesky {
  int idx[num_params] = {};
  int n = 0;
  wide l[num_params][num_params] = {};
  int singular = -1;

  cholesky(const normal_equations& ne, unsigned mask) {
    for (int j = 0; j < num_params; j++)
      if (mask & (1u << j)) idx[n++] = j;
    for (int r = 0; r < n && singular < 0; r++)
      for (int c = 0; c <= r; c++) {
        wide s = ne.gram[idx[r]][idx[c]];
        for (int k = 0; k < c; k++) s -= l[r][k] * l[c][k];
        if (r == c) {
          if (s < singular_pivot) {
            singular = idx[r];
            break;
          }
          l[r][r] = std::sqrt(s);
        } else {
          l[r][c] = s / l[c][c];
        }
      }
  }

  /// Solves L Lᵀ z = b in place (subset indices).
  void solve(wide* z) const {
    for (int r = 0; r < n; r++) {  // L y = b
      wide s = z[r];
      for (int k = 0; k < r; k++) s -= l[r][k] * z[k];
      z[r] = s / l[r][r];
    }
    for (int r = n - 1; r >= 0; r--) {  // Lᵀ z = y
      wide s = z[r];
      for (int k = r + 1; k < n; k++) s -= l[k][r] * z[k];
      z[r] = s / l[r][r];
    }
  }
};

/// Solves the normal equations restricted to the features in `mask` (the others' parameters
/// are 0) by Cholesky. Returns the unscaled parameters, or the first feature whose pivot is
/// below `singular_pivot` as the second member (-1: none).
std::pair<vec, int> solve_subset(const normal_equations& ne, unsigned mask) {
  const cholesky ch(ne, mask);
  if (ch.singular >= 0) return {vec{}, ch.singular};
  wide z[num_params] = {};
  for (int r = 0; r < ch.n; r++) z[r] = ne.rhs[ch.idx[r]];
  ch.solve(z);
  vec p{};
  for (int r = 0; r < ch.n; r++) p[ch.idx[r]] = static_cast<double>(z[r] / ne.scale[ch.idx[r]]);
  return {p, -1};
}

/// Σ (predicted - measured)² / variance: the objective of one pass.
wide weighted_residual_sum_of_squares(const std::vector<step_sample>& samples, const vec& p, const variances& var) {
  wide rss = 0;
  for (size_t i = 0; i < samples.size(); i++) {
    const wide r = static_cast<wide>(dot(p, as_vec(samples[i].first))) - samples[i].second;
    rss += r * r / var[i];
  }
  return rss;
}

wide residual_sum_of_squares(const std::vector<step_sample>& samples, const vec& p) {
  wide rss = 0;
  for (const step_sample& s : samples) {
    const wide r = static_cast<wide>(dot(p, as_vec(s.first))) - s.second;
    rss += r * r;
  }
  return rss;
}

/// The standard error of each parameter not in `fixed` (cost_model.hpp, fit_result::std_error):
/// the diagonal of the inverse of the scaled gram matrix over the free parameters, times σ².
vec standard_errors(const normal_equations& ne, const std::vector<step_sample>& samples, const vec& p,
                    const variances& var, const std::array<bool, num_params>& fixed) {
  unsigned mask = 0;
  for (int j = 0; j < num_params; j++)
    if (!fixed[j]) mask |= 1u << j;
  const cholesky ch(ne, mask);
  vec out{};
  const auto dof = static_cast<wide>(samples.size()) - ch.n;
  if (ch.n == 0 || dof <= 0 || ch.singular >= 0) return out;  // (singular: not reached, the fit solved it)
  const wide sigma2 = weighted_residual_sum_of_squares(samples, p, var) / dof;
  for (int c = 0; c < ch.n; c++) {  // column c of the inverse: G z = e_c
    wide z[num_params] = {};
    z[c] = 1;
    ch.solve(z);
    out[ch.idx[c]] = static_cast<double>(std::sqrt(sigma2 * z[c]) / ne.scale[ch.idx[c]]);
  }
  return out;
}

bool non_negative(const vec& p) {
  for (double v : p)
    if (v < 0) return false;
  return true;
}

/// The best non-negative solution: the constrained optimum is the unconstrained one on its
/// support, so trying every support and keeping the feasible one with the least residual is
/// exact. Principal submatrices of a positive definite matrix are positive definite, so every
/// subset solves. Ties keep the larger mask (iterated first).
vec best_non_negative(const std::vector<step_sample>& samples, const normal_equations& ne, const variances& var) {
  vec best{};  // mask 0: every parameter 0, always feasible
  wide best_rss = weighted_residual_sum_of_squares(samples, best, var);
  for (unsigned mask = (1u << num_params) - 1; mask > 0; mask--) {
    auto [p, singular] = solve_subset(ne, mask);
    TROUPE_ASSERT_MSG(singular < 0, "a principal submatrix of a nonsingular gram matrix is singular");
    if (!non_negative(p)) continue;
    const wide rss = weighted_residual_sum_of_squares(samples, p, var);
    if (rss < best_rss) {
      best = p;
      best_rss = rss;
    }
  }
  return best;
}

}  // namespace

double chunk_attention_tokens(int64_t first_position, int64_t num_tokens) {
  TROUPE_ASSERT(first_position >= 0);
  TROUPE_ASSERT(num_tokens >= 0);
  const double q = static_cast<double>(num_tokens);
  return q * static_cast<double>(first_position) + q * (q + 1) / 2;
}

step_features features_of(const engine::exec_plan& plan) {
  step_features f;
  for (const engine::exec_chunk& chunk : plan.chunks)
    add_features(f, chunk_features(chunk.first_position, static_cast<int64_t>(chunk.tokens.size()), chunk.num_samples));
  return f;
}

int64_t predict_ns(const cost_params& params, const step_features& features) {
  const double ns = params.step_ns * features.num_steps + params.token_ns * features.num_tokens +
                    params.sampled_row_ns * features.num_sampled_rows +
                    params.attention_token_ns * features.attention_tokens +
                    params.kv_read_token_ns * features.kv_read_tokens;
  TROUPE_ASSERT_MSG(std::isfinite(ns), "cost parameters and features must be finite");
  return ns > 0 ? std::llround(ns) : 0;
}

expected<fit_result> fit(const std::vector<step_sample>& samples) {
  if (auto ok = validate(samples); !ok) return tl::unexpected(ok.error());
  variances var(samples.size());
  for (size_t i = 0; i < samples.size(); i++) var[i] = samples[i].second;
  vec p{};
  std::optional<normal_equations> last;  // the settled pass's, for the standard errors
  variances last_var;
  bool constrained = false;
  for (int pass = 0; pass < max_passes; pass++) {
    auto ne = build(samples, var);
    if (!ne) return tl::unexpected(ne.error());
    last = *ne;
    last_var = var;
    auto [q, singular] = solve_subset(*ne, (1u << num_params) - 1);
    if (singular >= 0)
      return fail(errc::invalid_argument,
                  std::string("the samples do not determine the cost parameters: feature ") +
                      feature_names[singular] +
                      " is (nearly) a linear combination of the features before it; vary the "
                      "steps' tokens, samples, context and batch size independently");
    constrained = !non_negative(q);
    if (constrained) q = best_non_negative(samples, *ne, var);
    bool settled = pass > 0;
    for (int j = 0; j < num_params; j++) settled = settled && std::abs(q[j] - p[j]) <= 1e-12 * std::abs(p[j]);
    p = q;
    if (settled) break;
    // The next pass weighs each step by its predicted time (a step measured slow by chance no
    // longer counts less than one measured fast); a step predicted at 0 keeps its measured time.
    for (size_t i = 0; i < samples.size(); i++) {
      const double predicted = dot(p, as_vec(samples[i].first));
      var[i] = predicted > 0 ? predicted : samples[i].second;
    }
  }

  fit_result r;
  r.params = as_params(p);
  r.num_samples = static_cast<int64_t>(samples.size());
  double sum_rel = 0, sum_abs = 0, sum_measured = 0;
  for (const step_sample& s : samples) {
    const double error = std::abs(dot(p, as_vec(s.first)) - s.second);
    sum_rel += error / s.second;
    sum_abs += error;
    sum_measured += s.second;
  }
  const auto n = static_cast<double>(samples.size());
  r.rms_error_ns = static_cast<double>(std::sqrt(residual_sum_of_squares(samples, p) / n));
  r.mean_abs_rel_error = sum_rel / n;
  r.time_error = sum_abs / sum_measured;
  for (int j = 0; j < num_params; j++) r.at_bound[j] = constrained && p[j] == 0;
  r.std_error = standard_errors(*last, samples, p, last_var, r.at_bound);
  return r;
}

bool misfit(const fit_result& f) {
  return std::any_of(f.at_bound.begin(), f.at_bound.end(), [](bool b) { return b; });
}

expected<double> cross_validate(const std::vector<step_sample>& samples, int32_t k) {
  if (k < 2 || static_cast<size_t>(k) > samples.size())
    return fail(errc::invalid_argument, "cross-validation needs 2 to " + std::to_string(samples.size()) +
                                            " folds, got " + std::to_string(k));
  std::vector<double> errors;
  for (int32_t fold = 0; fold < k; fold++) {
    std::vector<step_sample> train, held_out;
    for (size_t i = 0; i < samples.size(); i++) (static_cast<int32_t>(i % k) == fold ? held_out : train).push_back(samples[i]);
    auto f = fit(train);
    if (!f) return fail(f.error().code, "fold " + std::to_string(fold) + " of " + std::to_string(k) + ": " + f.error().message);
    for (const step_sample& s : held_out)
      errors.push_back(std::abs(static_cast<double>(predict_ns(f->params, s.first)) - s.second) / s.second);
  }
  std::sort(errors.begin(), errors.end());
  const size_t m = errors.size();
  return m % 2 == 1 ? errors[m / 2] : (errors[m / 2 - 1] + errors[m / 2]) / 2;
}

}  // namespace troupe::cost
