#include "runtime/cost/chunk_budget.hpp"

#include <cmath>

namespace troupe::cost {

step_features chunk_features(int64_t first_position, int64_t num_tokens, int32_t num_samples) {
  TROUPE_ASSERT(num_samples >= 0);
  step_features f;
  f.num_steps = 0;
  f.num_tokens = static_cast<double>(num_tokens);
  f.num_sampled_rows = num_samples;
  f.attention_tokens = chunk_attention_tokens(first_position, num_tokens);
  f.kv_read_tokens = static_cast<double>(first_position + num_tokens);
  return f;
}

void add_features(step_features& sum, const step_features& part) {
  sum.num_steps += part.num_steps;
  sum.num_tokens += part.num_tokens;
  sum.num_sampled_rows += part.num_sampled_rows;
  sum.attention_tokens += part.attention_tokens;
  sum.kv_read_tokens += part.kv_read_tokens;
}

namespace {

/// The real q >= 0 where the chunk's time (without its sample) reaches the budget: the positive
/// root of A q² + B q - R with A = attention/2, B = token + attention (c + 1/2) + kv_read and
/// R = what the budget leaves after the planned step and the chunk's fixed kv read of c.
/// Written 2R / (B + sqrt(B² + 4AR)), which needs no division by A (A = 0: R / B).
double root(const cost_params& p, const step_features& planned, int64_t budget_ns, int64_t c) {
  const double fixed = predict_ns(p, planned) + p.kv_read_token_ns * static_cast<double>(c);
  // predict_ns rounds to the nearest nanosecond: a time below budget + 1/2 rounds into it.
  const double r = static_cast<double>(budget_ns) + 0.5 - fixed;
  if (r <= 0) return 0;
  const double a = p.attention_token_ns / 2;
  const double b = p.token_ns + p.attention_token_ns * (static_cast<double>(c) + 0.5) + p.kv_read_token_ns;
  const double denominator = b + std::sqrt(b * b + 4 * a * r);
  return denominator > 0 ? 2 * r / denominator : HUGE_VAL;  // free tokens: no bound but the cap
}

}  // namespace

int32_t max_chunk_tokens(const cost_params& params, const step_features& planned, int64_t budget_ns,
                         int64_t first_position, int32_t num_tokens_max, bool samples_at_max) {
  TROUPE_ASSERT(num_tokens_max >= 0);
  TROUPE_ASSERT(first_position >= 0);
  const auto fits = [&](int32_t q) {
    step_features f = planned;
    add_features(f, chunk_features(first_position, q, samples_at_max && q == num_tokens_max ? 1 : 0));
    return predict_ns(params, f) <= budget_ns;
  };
  const double guess = root(params, planned, budget_ns, first_position);
  auto q = static_cast<int32_t>(std::min(std::floor(guess), static_cast<double>(num_tokens_max)));
  // The closed form is exact up to rounding: these loops move q by a step or two at most.
  while (q > 0 && !fits(q)) q--;
  while (q < num_tokens_max && fits(q + 1)) q++;
  return q;
}

}  // namespace troupe::cost
