#include "runtime/sampling/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>

namespace troupe::sampling {

namespace {

/// `%g` of a float, so messages show "nan", "inf" and "1.5" as a user would write them.
std::string format_value(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

/// Strict total order "ranks above": larger logit first, equal logits by lower id.
/// Every ranking in this file uses it, so no result depends on sort stability.
struct ranks_above {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    if (logits[a] != logits[b]) return logits[a] > logits[b];
    return a < b;
  }
};

/// 32.32 fixed-point weight of a relative probability e in [0, 1]: floor(e * 2^32), exact
/// because a float times a power of two is exact in double.
uint64_t fixed_point_weight(float e) {
  constexpr double two_pow_32 = 4294967296.0;
  return static_cast<uint64_t>(static_cast<double>(e) * two_pow_32);
}

/// log(sum_i exp(l_i)) of the raw logits, in double, summed in index order.
double raw_log_normalizer(const float* logits, int32_t vocab_size, float logit_max) {
  double sum = 0.0;
  for (int32_t i = 0; i < vocab_size; ++i) {
    sum += std::exp(static_cast<double>(logits[i]) - static_cast<double>(logit_max));
  }
  TROUPE_ASSERT(sum >= 1.0);  // the max term alone is exp(0) = 1
  return static_cast<double>(logit_max) + std::log(sum);
}

/// `value` is a finite number in [-bound, bound]; the error names `name`.
expected<void> check_symmetric(const char* name, float value, float bound) {
  if (value >= -bound && value <= bound) return {};  // also rejects NaN
  return fail(errc::invalid_argument, std::string(name) + " must be in [" + format_value(-bound) + ", " +
                                          format_value(bound) + "], got " + format_value(value));
}

expected<void> validate_penalties(const sampling_params& params) {
  if (auto ok = check_symmetric("presence_penalty", params.presence_penalty, presence_penalty_max); !ok) return ok;
  if (auto ok = check_symmetric("frequency_penalty", params.frequency_penalty, frequency_penalty_max); !ok)
    return ok;
  if (!(params.repetition_penalty > 0.0f && params.repetition_penalty <= repetition_penalty_max))
    return fail(errc::invalid_argument, "repetition_penalty must be in (0, " + format_value(repetition_penalty_max) +
                                            "] (1 disables it), got " + format_value(params.repetition_penalty));
  return {};
}

expected<void> validate_logit_bias(const std::vector<token_bias>& logit_bias, int32_t vocab_size) {
  if (logit_bias.size() > num_logit_bias_max)
    return fail(errc::invalid_argument, "logit_bias may hold at most " + std::to_string(num_logit_bias_max) +
                                            " tokens, got " + std::to_string(logit_bias.size()));
  std::vector<int32_t> tokens;
  tokens.reserve(logit_bias.size());
  for (const token_bias& b : logit_bias) {
    if (b.token < 0 || b.token >= vocab_size)
      return fail(errc::invalid_argument, "logit_bias names token " + std::to_string(b.token) +
                                              ", outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    if (!(b.bias >= -logit_bias_max && b.bias <= logit_bias_max))
      return fail(errc::invalid_argument, "logit_bias of token " + std::to_string(b.token) + " must be in [" +
                                              format_value(-logit_bias_max) + ", " + format_value(logit_bias_max) +
                                              "], got " + format_value(b.bias));
    tokens.push_back(b.token);
  }
  std::sort(tokens.begin(), tokens.end());
  if (auto twin = std::adjacent_find(tokens.begin(), tokens.end()); twin != tokens.end())
    return fail(errc::invalid_argument, "logit_bias names token " + std::to_string(*twin) + " twice");
  return {};
}

}  // namespace

bool operator==(const token_bias& a, const token_bias& b) { return a.token == b.token && a.bias == b.bias; }

bool operator==(const sampling_params& a, const sampling_params& b) {
  return std::tie(a.temperature, a.top_p, a.top_k, a.min_p, a.num_top_logprobs, a.presence_penalty,
                  a.frequency_penalty, a.repetition_penalty, a.logit_bias) ==
         std::tie(b.temperature, b.top_p, b.top_k, b.min_p, b.num_top_logprobs, b.presence_penalty,
                  b.frequency_penalty, b.repetition_penalty, b.logit_bias);
}

bool needs_context(const sampling_params& params) {
  return params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f || params.repetition_penalty != 1.0f;
}

expected<void> validate(const sampling_params& params, int32_t vocab_size) {
  TROUPE_ASSERT(vocab_size > 0);
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    return fail(errc::invalid_argument, "temperature must be a finite number >= 0, got " +
                                            format_value(params.temperature));
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {  // also rejects NaN
    return fail(errc::invalid_argument,
                "top_p must be in (0, 1], got " + format_value(params.top_p));
  }
  if (params.top_k < 0) {
    return fail(errc::invalid_argument,
                "top_k must be >= 0 (0 disables it), got " + std::to_string(params.top_k));
  }
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) {  // also rejects NaN
    return fail(errc::invalid_argument,
                "min_p must be in [0, 1], got " + format_value(params.min_p));
  }
  if (params.num_top_logprobs < 0 || params.num_top_logprobs > num_top_logprobs_max) {
    return fail(errc::invalid_argument, "num_top_logprobs must be in [0, " +
                                            std::to_string(num_top_logprobs_max) + "], got " +
                                            std::to_string(params.num_top_logprobs));
  }
  if (auto ok = validate_penalties(params); !ok) return ok;
  return validate_logit_bias(params.logit_bias, vocab_size);
}

expected<void> check_logits(const float* logits, int32_t vocab_size) {
  TROUPE_ASSERT(logits != nullptr);
  TROUPE_ASSERT(vocab_size > 0);
  bool any_finite = false;
  for (int32_t i = 0; i < vocab_size; ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity()) {
      return fail(errc::internal, std::string("the model computed a ") + (std::isnan(logits[i]) ? "NaN" : "+inf") +
                                      " logit (token " + std::to_string(i) +
                                      "): its weights or its arithmetic are broken");
    }
    any_finite |= std::isfinite(logits[i]);
  }
  if (!any_finite) return fail(errc::internal, "the model computed -inf for every logit: nothing can be sampled");
  return {};
}

sample_result sampler::sample(const float* logits, int32_t vocab_size,
                              const sampling_params& params, uint64_t seed, int64_t position,
                              const token_context& context, int k) {
  TROUPE_ASSERT(logits != nullptr);
  TROUPE_ASSERT(vocab_size > 0);
  TROUPE_ASSERT_MSG(validate(params, vocab_size).has_value(),
                    "sampling params must pass validate() before sampling");
  random_stream stream(seed, position, k);
  const float temperature = std::max(params.temperature, temperature_min);
  const float* adjusted = adjust(logits, vocab_size, params, context);
  const float adjusted_max = compute_exps(adjusted, vocab_size, temperature);
  const int32_t num_candidates = select_top(adjusted, vocab_size, params);
  const int32_t token = draw(num_candidates, vocab_size, params.min_p, stream);
  TROUPE_ASSERT(token >= 0 && token < vocab_size);

  const float logit_max = adjusted == logits ? adjusted_max : *std::max_element(logits, logits + vocab_size);
  const double log_normalizer = raw_log_normalizer(logits, vocab_size, logit_max);
  sample_result result{token, static_cast<float>(logits[token] - log_normalizer), {}};
  result.top_logprobs =
      top_logprobs(logits, vocab_size, params.num_top_logprobs, log_normalizer);
  return result;
}

const float* sampler::adjust(const float* logits, int32_t vocab_size, const sampling_params& params,
                             const token_context& context) {
  const bool penalised = needs_context(params);
  if (params.logit_bias.empty() && !penalised) return logits;
  adjusted_.assign(logits, logits + vocab_size);
  for (const token_bias& b : params.logit_bias) adjusted_[static_cast<size_t>(b.token)] += b.bias;
  if (penalised) apply_penalties(vocab_size, params, context);
  // A huge logit divided by a tiny repetition penalty can overflow: -inf stays reserved for
  // the model's own "impossible", so at least one logit stays finite (check_logits).
  constexpr float finite_max = std::numeric_limits<float>::max();
  for (int32_t i = 0; i < vocab_size; ++i) {
    float& l = adjusted_[static_cast<size_t>(i)];
    if (std::isfinite(logits[i]) && !std::isfinite(l)) l = l > 0.0f ? finite_max : -finite_max;
  }
  return adjusted_.data();
}

void sampler::apply_penalties(int32_t vocab_size, const sampling_params& params, const token_context& context) {
  TROUPE_ASSERT(context.num_tokens == 0 || context.tokens != nullptr);
  TROUPE_ASSERT(context.num_prompt_tokens >= 0 && context.num_prompt_tokens <= context.num_tokens);
  counts_.resize(static_cast<size_t>(vocab_size), 0);
  seen_.resize(static_cast<size_t>(vocab_size), 0);
  for (int32_t p = 0; p < context.num_tokens; ++p) {
    const int32_t t = context.tokens[p];
    TROUPE_ASSERT_MSG(t >= 0 && t < vocab_size, "a context token outside the vocabulary");
    seen_[static_cast<size_t>(t)] = 1;
    if (p >= context.num_prompt_tokens) counts_[static_cast<size_t>(t)]++;
  }
  // Each distinct token once (seen_ goes back to 0 as it is adjusted); the tokens' adjustments
  // are independent, so the order of this walk changes no bit.
  const float r = params.repetition_penalty;
  for (int32_t p = 0; p < context.num_tokens; ++p) {
    const auto i = static_cast<size_t>(context.tokens[p]);
    if (seen_[i] == 0) continue;
    float& l = adjusted_[i];
    l = l > 0.0f ? l / r : l * r;
    l -= params.frequency_penalty * static_cast<float>(counts_[i]);
    l -= params.presence_penalty * (counts_[i] > 0 ? 1.0f : 0.0f);
    seen_[i] = 0;
    counts_[i] = 0;
  }
}

float sampler::compute_exps(const float* logits, int32_t vocab_size, float temperature) {
  TROUPE_ASSERT(temperature >= temperature_min);
  float logit_max = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < vocab_size; ++i) {
    TROUPE_ASSERT_MSG(!std::isnan(logits[i]), "a logit is NaN");
    TROUPE_ASSERT_MSG(logits[i] != std::numeric_limits<float>::infinity(), "a logit is +inf");
    logit_max = std::max(logit_max, logits[i]);
  }
  TROUPE_ASSERT_MSG(std::isfinite(logit_max), "every logit is -inf");
  exps_.resize(static_cast<size_t>(vocab_size));
  // Subtract before dividing: (l - l_max) <= 0, so a tiny temperature gives -inf at worst,
  // never inf - inf. The max itself gets exp(0) = 1 exactly.
  for (int32_t i = 0; i < vocab_size; ++i) {
    exps_[static_cast<size_t>(i)] = std::exp((logits[i] - logit_max) / temperature);
  }
  return logit_max;
}

int32_t sampler::select_top(const float* logits, int32_t vocab_size,
                            const sampling_params& params) {
  order_.resize(static_cast<size_t>(vocab_size));
  std::iota(order_.begin(), order_.end(), 0);
  const ranks_above ranks{logits};
  const bool top_k_on = params.top_k > 0 && params.top_k < vocab_size;
  const bool top_p_on = params.top_p < 1.0f;
  int32_t num_candidates = vocab_size;
  if (top_k_on) {
    // A strict total order makes the k-element prefix a unique set.
    std::nth_element(order_.begin(), order_.begin() + params.top_k, order_.end(), ranks);
    num_candidates = params.top_k;
  }
  if (!top_p_on) return num_candidates;

  std::sort(order_.begin(), order_.begin() + num_candidates, ranks);
  // The mass and the running sum add the same terms in the same order, so the running sum ends
  // exactly at `mass` >= top_p * mass: the loop below always stops within the candidates.
  double mass = 0.0;
  for (int32_t i = 0; i < num_candidates; ++i) mass += exps_[static_cast<size_t>(order_[i])];
  const double target = static_cast<double>(params.top_p) * mass;
  double cumulative = 0.0;
  int32_t num_kept = 0;
  while (num_kept < num_candidates) {
    cumulative += exps_[static_cast<size_t>(order_[num_kept])];
    ++num_kept;
    if (cumulative >= target) break;
  }
  TROUPE_ASSERT(num_kept >= 1);
  return num_kept;
}

int32_t sampler::draw(int32_t num_candidates, int32_t vocab_size, float min_p,
                      random_stream& stream) {
  TROUPE_ASSERT(num_candidates >= 1 && num_candidates <= vocab_size);
  chosen_.assign(static_cast<size_t>(vocab_size), 0);
  for (int32_t i = 0; i < num_candidates; ++i) chosen_[static_cast<size_t>(order_[i])] = 1;
  // min-p keeps p_i >= min_p * p_max; with e_i = p_i / p_max that is e_i >= min_p.
  const auto weight = [&](int32_t id) -> uint64_t {
    const auto i = static_cast<size_t>(id);
    if (chosen_[i] == 0 || exps_[i] < min_p) return 0;
    return fixed_point_weight(exps_[i]);
  };
  // Sum of at most 2^31 weights of at most 2^32 each: fits in uint64.
  uint64_t total = 0;
  for (int32_t id = 0; id < vocab_size; ++id) total += weight(id);
  TROUPE_ASSERT_MSG(total > 0, "the most likely token must survive every filter");

  const uint64_t target = stream.uniform_below(total);
  uint64_t cumulative = 0;
  for (int32_t id = 0; id < vocab_size; ++id) {
    cumulative += weight(id);
    if (target < cumulative) return id;
  }
  TROUPE_ASSERT_MSG(false, "target below total must fall inside the CDF");
  return -1;
}

std::vector<token_logprob> sampler::top_logprobs(const float* logits, int32_t vocab_size,
                                                 int32_t num, double log_normalizer) {
  const int32_t num_top = std::min(num, vocab_size);
  TROUPE_ASSERT(num_top >= 0);
  std::vector<token_logprob> top;
  if (num_top == 0) return top;
  order_.resize(static_cast<size_t>(vocab_size));
  std::iota(order_.begin(), order_.end(), 0);
  std::partial_sort(order_.begin(), order_.begin() + num_top, order_.end(), ranks_above{logits});
  top.reserve(static_cast<size_t>(num_top));
  for (int32_t i = 0; i < num_top; ++i) {
    const int32_t id = order_[static_cast<size_t>(i)];
    top.push_back({id, static_cast<float>(logits[id] - log_normalizer)});
  }
  return top;
}

sample_result sample(const float* logits, int32_t vocab_size, const sampling_params& params,
                     uint64_t seed, int64_t position, const token_context& context, int k) {
  sampler one_off;
  return one_off.sample(logits, vocab_size, params, seed, position, context, k);
}

}  // namespace troupe::sampling
