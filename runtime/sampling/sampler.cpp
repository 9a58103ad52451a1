#include "runtime/sampling/sampler.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/cpu/ops.hpp"

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

/// Selection buckets. Bucket b holds the tokens whose temperature-scaled distance below the
/// largest logit, d = (l_max - l) / T counted in quarter octaves of relative probability
/// (e = 2^(-d/4)), lies in [b, b + 1); the last bucket holds every token with e <= 2^-44, whose
/// top-p weight and draw weight are both 0 (it is left out of top-k and top-p: it changes
/// neither the mass nor the draw). A token's bucket never decreases as its logit falls, and
/// equal logits share a bucket, so buckets 0..b always hold a prefix of the ranking.
constexpr int32_t negligible_bucket = 44 * 4;
constexpr int32_t num_buckets = negligible_bucket + 1;
constexpr float quarter_octaves_per_nat = 4.0f * 1.44269504088896341f;  // 4 / ln 2

/// Top-p's 21.43 fixed-point weight of e in [0, 1]: floor(e * 2^43). Integer sums make the mass
/// independent of summation order, so top-p needs no ranking beyond its cut; a vocabulary of at
/// most 2^20 tokens (header_value_max) sums below 2^63.
uint64_t top_p_weight(float e) {
  constexpr double two_pow_43 = 8796093022208.0;
  return static_cast<uint64_t>(static_cast<double>(e) * two_pow_43);
}

__extension__ using uint128 = unsigned __int128;

/// The smallest integer >= fraction * total, exactly: fraction = q * 2^-shift with q < 2^24.
uint64_t fraction_ceil(uint64_t total, float fraction) {
  TROUPE_ASSERT(fraction > 0.0f && fraction < 1.0f);
  int exponent = 0;
  const float mantissa = std::frexp(fraction, &exponent);  // in [0.5, 1); exponent <= 0
  const auto q = static_cast<uint64_t>(std::ldexp(mantissa, 24));
  const int shift = 24 - exponent;
  const uint128 product = static_cast<uint128>(q) * total;  // < 2^88
  if (shift >= 128) return product > 0 ? 1 : 0;
  const uint128 one = 1;
  return static_cast<uint64_t>((product + (one << shift) - 1) >> shift);
}

/// log(sum_i exp(l_i)) of the raw logits: exp(l_i - l_max) by the kernels' exp into `scratch`,
/// summed in double in eight interleaved partial sums (element i into sum i mod 8, the sums then
/// added in order): a fixed order that depends on vocab_size only.
double raw_log_normalizer(const float* logits, int32_t vocab_size, float logit_max, std::vector<float>& scratch) {
  scratch.resize(static_cast<size_t>(vocab_size));
  kernels::cpu::fast::shifted_exp(scratch.data(), logits, vocab_size, logit_max);
  constexpr int32_t num_partial = 8;
  double partial[num_partial] = {};
  int32_t i = 0;
  for (; i + num_partial <= vocab_size; i += num_partial)
    for (int32_t j = 0; j < num_partial; ++j) partial[j] += scratch[static_cast<size_t>(i + j)];
  for (int32_t j = 0; i < vocab_size; ++i, ++j) partial[j] += scratch[static_cast<size_t>(i)];
  double sum = 0.0;
  for (double p : partial) sum += p;
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
  random_stream stream(seed, position, k);
  const float adjusted_max = select(logits, vocab_size, params, context);
  const int32_t token = draw(weigh_candidates(params.min_p), stream);
  TROUPE_ASSERT(token >= 0 && token < vocab_size);
  const float logit_max = !adjusted_logits_ ? adjusted_max : *std::max_element(logits, logits + vocab_size);
  return describe(logits, vocab_size, params, token, logit_max);
}

uint64_t sampler::weigh(const float* logits, int32_t vocab_size, const sampling_params& params,
                        const token_context& context, std::vector<uint64_t>& weights) {
  select(logits, vocab_size, params, context);
  const uint64_t total = weigh_candidates(params.min_p);
  weights.assign(static_cast<size_t>(vocab_size), 0);
  for (int32_t i = 0; i < num_candidates_; ++i) {
    const auto id = static_cast<size_t>(order_[i]);
    weights[id] = weights_[id];
    weights_[id] = 0;
  }
  return total;
}

sample_result sampler::describe(const float* logits, int32_t vocab_size, const sampling_params& params,
                                int32_t token) {
  TROUPE_ASSERT(token >= 0 && token < vocab_size);
  return describe(logits, vocab_size, params, token, max_logit(logits, vocab_size));
}

sample_result sampler::describe(const float* logits, int32_t vocab_size, const sampling_params& params,
                                int32_t token, float logit_max) {
  const double log_normalizer = raw_log_normalizer(logits, vocab_size, logit_max, exps_);
  sample_result result{token, static_cast<float>(logits[token] - log_normalizer), {}};
  result.top_logprobs = top_logprobs(logits, vocab_size, params.num_top_logprobs, log_normalizer);
  return result;
}

float sampler::select(const float* logits, int32_t vocab_size, const sampling_params& params,
                      const token_context& context) {
  TROUPE_ASSERT(logits != nullptr);
  TROUPE_ASSERT(vocab_size > 0);
  TROUPE_ASSERT_MSG(validate(params, vocab_size).has_value(),
                    "sampling params must pass validate() before sampling");
  const float temperature = std::max(params.temperature, temperature_min);
  const float* adjusted = adjust(logits, vocab_size, params, context);
  adjusted_logits_ = adjusted != logits;
  const float adjusted_max = max_logit(adjusted, vocab_size);
  num_candidates_ = select_top(adjusted, vocab_size, adjusted_max, temperature, params);
  return adjusted_max;
}

const float* sampler::adjust(const float* logits, int32_t vocab_size, const sampling_params& params,
                             const token_context& context) {
  const bool penalised = needs_context(params);
  if (params.logit_bias.empty() && !penalised && context.allowed == nullptr) return logits;
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
  // A grammar's mask last: a disallowed token weighs exactly 0, whatever its bias.
  if (context.allowed != nullptr)
    for (int32_t i = 0; i < vocab_size; ++i)
      if ((context.allowed[i / 32] >> (i % 32) & 1u) == 0) adjusted_[static_cast<size_t>(i)] = -std::numeric_limits<float>::infinity();
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

float sampler::max_logit(const float* logits, int32_t vocab_size) {
  float logit_max = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < vocab_size; ++i) {
    TROUPE_ASSERT_MSG(!std::isnan(logits[i]), "a logit is NaN");
    TROUPE_ASSERT_MSG(logits[i] != std::numeric_limits<float>::infinity(), "a logit is +inf");
    logit_max = std::max(logit_max, logits[i]);
  }
  TROUPE_ASSERT_MSG(std::isfinite(logit_max), "every logit is -inf");
  return logit_max;
}

void sampler::compute_exps(const float* logits, int32_t num_candidates, float logit_max, float temperature) {
  TROUPE_ASSERT(temperature >= temperature_min);
  exps_.resize(order_.size());
  // Subtract before dividing: (l - l_max) <= 0, so a tiny temperature gives -inf at worst,
  // never inf - inf. The max itself gets exp(0) = 1 exactly.
  for (int32_t i = 0; i < num_candidates; ++i) {
    const auto id = static_cast<size_t>(order_[i]);
    exps_[id] = std::exp((logits[id] - logit_max) / temperature);
  }
}

int32_t sampler::select_top(const float* logits, int32_t vocab_size, float logit_max, float temperature,
                            const sampling_params& params) {
  order_.resize(static_cast<size_t>(vocab_size));
  const bool top_k_on = params.top_k > 0 && params.top_k < vocab_size;
  const bool top_p_on = params.top_p < 1.0f;
  if (!top_k_on && !top_p_on) {
    std::iota(order_.begin(), order_.end(), 0);
    compute_exps(logits, vocab_size, logit_max, temperature);
    return vocab_size;
  }
  int32_t num_candidates = assign_buckets(logits, vocab_size, logit_max, temperature);
  if (top_k_on && params.top_k < num_candidates) num_candidates = keep_top_k(logits, num_candidates, params.top_k);
  compute_exps(logits, num_candidates, logit_max, temperature);  // top-k ranks logits, needs no e
  if (top_p_on) num_candidates = keep_top_p(logits, num_candidates, params.top_p);
  return num_candidates;
}

int32_t sampler::assign_buckets(const float* logits, int32_t vocab_size, float logit_max, float temperature) {
  bucket_.resize(static_cast<size_t>(vocab_size));
  const float scale = quarter_octaves_per_nat / temperature;
  int32_t num = 0;
  for (int32_t i = 0; i < vocab_size; ++i) {
    const float d = (logit_max - logits[i]) * scale;  // >= 0; inf for a -inf logit
    const int32_t b = d < static_cast<float>(negligible_bucket) ? static_cast<int32_t>(d) : negligible_bucket;
    bucket_[static_cast<size_t>(i)] = static_cast<uint8_t>(b);
    order_[static_cast<size_t>(num)] = i;
    num += b != negligible_bucket ? 1 : 0;
  }
  TROUPE_ASSERT(num >= 1);  // the max is in bucket 0
  return num;
}

std::pair<int32_t*, int32_t*> sampler::split_at_bucket(int32_t num, int32_t bucket) {
  int32_t* begin = order_.data();
  int32_t* middle = std::partition(begin, begin + num, [&](int32_t id) { return bucket_[static_cast<size_t>(id)] < bucket; });
  int32_t* end = std::partition(middle, begin + num, [&](int32_t id) { return bucket_[static_cast<size_t>(id)] == bucket; });
  return {middle, end};
}

int32_t sampler::keep_top_k(const float* logits, int32_t num_candidates, int32_t top_k) {
  TROUPE_ASSERT(top_k >= 1 && top_k < num_candidates);
  std::array<int32_t, num_buckets> counts{};
  for (int32_t i = 0; i < num_candidates; ++i) counts[bucket_[static_cast<size_t>(order_[i])]]++;
  int32_t bucket = 0, num_above = 0;
  while (num_above + counts[static_cast<size_t>(bucket)] < top_k) num_above += counts[static_cast<size_t>(bucket++)];
  TROUPE_ASSERT(bucket < negligible_bucket);
  // Buckets above the cut are kept whole; the cut bucket gives its best top_k - num_above. A
  // strict total order makes that a unique set.
  const auto [middle, end] = split_at_bucket(num_candidates, bucket);
  TROUPE_ASSERT(middle - order_.data() == num_above);
  std::nth_element(middle, middle + (top_k - num_above), end, ranks_above{logits});
  return top_k;
}

int32_t sampler::keep_top_p(const float* logits, int32_t num_candidates, float top_p) {
  std::array<uint64_t, num_buckets> masses{};
  for (int32_t i = 0; i < num_candidates; ++i) {
    const auto id = static_cast<size_t>(order_[i]);
    masses[bucket_[id]] += top_p_weight(exps_[id]);
  }
  uint64_t mass = 0;
  for (uint64_t m : masses) mass += m;
  const uint64_t target = fraction_ceil(mass, top_p);  // >= 1: the max weighs 2^43
  TROUPE_ASSERT(target >= 1 && target <= mass);
  int32_t bucket = 0;
  uint64_t cumulative = 0;
  while (cumulative + masses[static_cast<size_t>(bucket)] < target) cumulative += masses[static_cast<size_t>(bucket++)];
  // Buckets above the cut are kept whole (their mass falls short of the target); the cut
  // bucket, ranked, gives the shortest prefix that reaches it.
  const auto [middle, end] = split_at_bucket(num_candidates, bucket);
  std::sort(middle, end, ranks_above{logits});
  int32_t* kept_end = middle;
  while (cumulative < target) {
    TROUPE_ASSERT(kept_end != end);
    cumulative += top_p_weight(exps_[static_cast<size_t>(*kept_end++)]);
  }
  return static_cast<int32_t>(kept_end - order_.data());
}

uint64_t sampler::weigh_candidates(float min_p) {
  TROUPE_ASSERT(num_candidates_ >= 1 && static_cast<size_t>(num_candidates_) <= order_.size());
  weights_.resize(order_.size(), 0);
  // min-p keeps p_i >= min_p * p_max; with e_i = p_i / p_max that is e_i >= min_p. Sum of at
  // most 2^31 weights of at most 2^32 each: fits in uint64, in any order.
  uint64_t total = 0;
  for (int32_t i = 0; i < num_candidates_; ++i) {
    const auto id = static_cast<size_t>(order_[i]);
    const uint64_t weight = exps_[id] < min_p ? 0 : fixed_point_weight(exps_[id]);
    weights_[id] = weight;
    total += weight;
  }
  TROUPE_ASSERT_MSG(total > 0, "the most likely token must survive every filter");
  return total;
}

int32_t sampler::draw(uint64_t total, random_stream& stream) {
  const uint64_t target = stream.uniform_below(total);
  uint64_t cumulative = 0;
  int32_t token = 0;
  for (; target >= cumulative + weights_[static_cast<size_t>(token)]; ++token) cumulative += weights_[static_cast<size_t>(token)];
  for (int32_t i = 0; i < num_candidates_; ++i) weights_[static_cast<size_t>(order_[i])] = 0;
  return token;
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
