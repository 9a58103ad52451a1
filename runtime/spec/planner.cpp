#include "runtime/spec/planner.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/common/error.hpp"

namespace troupe::spec {
namespace {

/// One draft row candidate: the probability that it and the drafts before it are accepted.
struct candidate {
  double running_product = 0;
  int32_t request = 0;
  int32_t draft = 0;  ///< 0-based within its request
};

/// Larger product first; ties by lower request index, then earlier draft.
bool ranks_above(const candidate& a, const candidate& b) {
  if (a.running_product != b.running_product) return a.running_product > b.running_product;
  if (a.request != b.request) return a.request < b.request;
  return a.draft < b.draft;
}

void check_confidence(double c) { TROUPE_ASSERT_MSG(c >= 0 && c <= 1, "a draft confidence outside [0, 1]"); }

verification_plan priced(verification_plan plan, const step_time_curve& curve) {
  plan.predicted_ms = curve(plan.num_rows);
  TROUPE_ASSERT_MSG(plan.predicted_ms > 0 && std::isfinite(plan.predicted_ms),
                    "a step-time curve must predict a positive, finite time");
  return plan;
}

}  // namespace

verification_plan plan_fixed(const std::vector<std::vector<double>>& confidences, const step_time_curve& curve) {
  verification_plan plan;
  plan.num_rows = static_cast<int32_t>(confidences.size());
  plan.expected_tokens = static_cast<double>(confidences.size());
  for (const std::vector<double>& request : confidences) {
    double product = 1;
    for (const double c : request) {
      check_confidence(c);
      product *= c;
      plan.expected_tokens += product;
    }
    plan.num_draft_rows.push_back(static_cast<int32_t>(request.size()));
    plan.num_rows += static_cast<int32_t>(request.size());
  }
  return priced(std::move(plan), curve);
}

verification_plan plan_budgeted(const std::vector<std::vector<double>>& confidences, const step_time_curve& curve) {
  std::vector<candidate> pool;
  for (size_t r = 0; r < confidences.size(); r++) {
    double product = 1;
    for (size_t j = 0; j < confidences[r].size(); j++) {
      check_confidence(confidences[r][j]);
      product *= confidences[r][j];
      pool.push_back(candidate{product, static_cast<int32_t>(r), static_cast<int32_t>(j)});
    }
  }
  std::sort(pool.begin(), pool.end(), ranks_above);
  // The ordinary rows alone, then each longer prefix of the pool; keep the best.
  verification_plan best;
  best.num_draft_rows.assign(confidences.size(), 0);
  best.num_rows = static_cast<int32_t>(confidences.size());
  best.expected_tokens = static_cast<double>(confidences.size());
  best = priced(std::move(best), curve);
  const int32_t num_ordinary_rows = best.num_rows;
  size_t best_prefix = 0;
  double tokens = best.expected_tokens;
  for (size_t i = 0; i < pool.size(); i++) {
    tokens += pool[i].running_product;
    const int32_t rows = num_ordinary_rows + static_cast<int32_t>(i) + 1;
    const double ms = curve(rows);
    TROUPE_ASSERT_MSG(ms > 0 && std::isfinite(ms), "a step-time curve must predict a positive, finite time");
    if (tokens / ms > best.tokens_per_ms()) {
      best_prefix = i + 1;
      best.num_rows = rows;
      best.expected_tokens = tokens;
      best.predicted_ms = ms;
    }
  }
  for (size_t i = 0; i < best_prefix; i++) {
    int32_t& n = best.num_draft_rows[static_cast<size_t>(pool[i].request)];
    TROUPE_ASSERT_MSG(n == pool[i].draft, "the chosen drafts of a request are not a prefix");
    n++;
  }
  return best;
}

cost::step_features with_decode_rows(cost::step_features f, int32_t rows, double context_tokens) {
  TROUPE_ASSERT(rows >= 0 && context_tokens >= 0);
  f.num_tokens += rows;
  f.num_sampled_rows += rows;
  f.attention_tokens += rows * (context_tokens + 1);
  f.kv_read_tokens += rows * (context_tokens + 1);
  return f;
}

double mean_draft_context(const engine::exec_plan& plan) {
  double context = 0;
  int32_t rows = 0;
  for (const engine::exec_chunk& c : plan.chunks) {
    if (c.num_draft_slots == 0) continue;
    context += c.first_position;
    rows++;
  }
  return rows > 0 ? context / rows : 0;
}

cost::step_features features_with_drafts(const engine::exec_plan& plan, int64_t num_draft_rows) {
  return with_decode_rows(cost::features_of(plan), static_cast<int32_t>(num_draft_rows), mean_draft_context(plan));
}

verification_plan plan_budgeted(const std::vector<std::vector<double>>& confidences,
                                const std::vector<double>& draft_rows_ms) {
  const auto num_ordinary = static_cast<int32_t>(confidences.size());
  return plan_budgeted(confidences, [&](int32_t rows) { return draft_rows_ms.at(static_cast<size_t>(rows - num_ordinary)); });
}

step_time_curve decode_curve(const cost::cost_params& params, double context_tokens) {
  return [params, context_tokens](int32_t rows) {
    return static_cast<double>(cost::predict_ns(params, with_decode_rows({}, rows, context_tokens))) / 1e6;
  };
}

std::vector<double> draft_rows_curve(const cost::cost_params& params, const cost::step_features& base,
                                     int32_t num_slots, double context_tokens) {
  std::vector<double> ms;
  for (int32_t j = 0; j <= num_slots; j++)
    ms.push_back(static_cast<double>(cost::predict_ns(params, with_decode_rows(base, j, context_tokens))) / 1e6);
  return ms;
}

}  // namespace troupe::spec
