#include "runtime/sampling/sampler.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
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
/// Every ranking in this file uses it (weigh_kept's test too), so no result depends on sort
/// stability.
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
/// top-p weight and draw weight are both 0 (no cut falls in it: it changes neither the mass
/// nor the draw). A token's bucket never decreases as its logit falls, and equal logits share a
/// bucket, so buckets 0..b always hold a prefix of the ranking.
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

/// Top-p's mass per bucket of the tokens ids[0, num) (every token when `ids` is null).
std::array<uint64_t, num_buckets> bucket_masses(const uint8_t* bucket, const float* exps, const int32_t* ids,
                                                int32_t num) {
  const auto id_at = [&](int32_t k) { return ids != nullptr ? ids[k] : k; };
  // Two histograms, even and odd candidates, so that consecutive tokens of one bucket do not
  // wait on each other's store (a fifth faster here); integer sums: the split changes no bit.
  std::array<uint64_t, num_buckets> masses{}, odd_masses{};
  const auto add = [&](std::array<uint64_t, num_buckets>& to, int32_t id) {
    to[bucket[id]] += top_p_weight(exps[id]);
  };
  int32_t k = 0;
  for (; k + 2 <= num; k += 2) {
    add(masses, id_at(k));
    add(odd_masses, id_at(k + 1));
  }
  if (k < num) add(masses, id_at(k));
  for (int32_t b = 0; b < num_buckets; ++b) masses[static_cast<size_t>(b)] += odd_masses[static_cast<size_t>(b)];
  return masses;
}

/// `e` where `keep`, else +0: a mask rather than a branch, so that loops over it vectorize.
float masked(float e, bool keep) {
  uint32_t bits = 0;
  std::memcpy(&bits, &e, sizeof bits);
  bits &= -static_cast<uint32_t>(keep);
  std::memcpy(&e, &bits, sizeof e);
  return e;
}

/// select_top's answer when every token is kept.
constexpr int32_t all_kept = -1;

/// max_logit's running maxima: GCC/Clang vectors of 16 lanes (one AVX-512 register, or two or
/// four narrower ones).
constexpr int32_t num_lanes = 16;
using v16f = float __attribute__((vector_size(num_lanes * sizeof(float))));
using v16i = int32_t __attribute__((vector_size(num_lanes * sizeof(int32_t))));

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
  const int32_t token = draw(stream);
  TROUPE_ASSERT(token >= 0 && token < vocab_size);
  const float logit_max = !adjusted_logits_ ? adjusted_max : max_logit(logits, vocab_size);
  return describe(logits, vocab_size, params, token, logit_max);
}

uint64_t sampler::weigh(const float* logits, int32_t vocab_size, const sampling_params& params,
                        const token_context& context, std::vector<uint64_t>& weights) {
  select(logits, vocab_size, params, context);
  weights.assign(weights_.begin(), weights_.end());
  return total_weight_;
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
  const int32_t last_kept = select_top(adjusted, vocab_size, adjusted_max, temperature, params);
  weigh_kept(adjusted, vocab_size, last_kept, params.min_p);
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
  constexpr float infinity = std::numeric_limits<float>::infinity();
  v16f lane_max = v16f{} - infinity;
  v16i bad = {};  // lanes that saw a NaN or +inf
  int32_t i = 0;
  for (; i + num_lanes <= vocab_size; i += num_lanes) {
    v16f v;
    std::memcpy(&v, logits + i, sizeof v);
    lane_max = v > lane_max ? v : lane_max;
    bad |= (v != v) | (v == infinity);
  }
  float logit_max = -infinity;
  bool any_bad = false;
  for (int32_t lane = 0; lane < num_lanes; ++lane) {
    logit_max = std::max(logit_max, lane_max[lane]);
    any_bad |= bad[lane] != 0;
  }
  // The rest one by one; all of them again after a NaN or +inf, whose assertion names it.
  for (i = any_bad ? 0 : i; i < vocab_size; ++i) {
    TROUPE_ASSERT_MSG(!std::isnan(logits[i]), "a logit is NaN");
    TROUPE_ASSERT_MSG(logits[i] != infinity, "a logit is +inf");
    logit_max = std::max(logit_max, logits[i]);
  }
  TROUPE_ASSERT_MSG(std::isfinite(logit_max), "every logit is -inf");
  // -0 and +0 tie: the first of them, as one sequential pass finds.
  return logit_max != 0.0f ? logit_max : *std::find(logits, logits + vocab_size, 0.0f);
}

void sampler::compute_exps(const float* logits, const int32_t* ids, int32_t num, float logit_max, float temperature) {
  gathered_.resize(static_cast<size_t>(num));
  for (int32_t k = 0; k < num; ++k) gathered_[static_cast<size_t>(k)] = logits[ids[k]];
  kernels::cpu::fast::libm_scaled_exp(gathered_.data(), gathered_.data(), num, logit_max, temperature);
  for (int32_t k = 0; k < num; ++k) exps_[static_cast<size_t>(ids[k])] = gathered_[static_cast<size_t>(k)];
}

int32_t sampler::select_top(const float* logits, int32_t vocab_size, float logit_max, float temperature,
                            const sampling_params& params) {
  TROUPE_ASSERT(temperature >= temperature_min);
  exps_.resize(static_cast<size_t>(vocab_size));
  const bool top_k_on = params.top_k > 0 && params.top_k < vocab_size;
  const bool top_p_on = params.top_p < 1.0f;
  if (top_k_on || top_p_on) assign_buckets(logits, vocab_size, logit_max, temperature);
  // e_i = exp((l_i - l_max) / T) by std::exp's bits, vectorized (kernels/cpu/libm_exp.cpp).
  // Subtracting before dividing keeps the argument <= 0: a tiny temperature gives -inf at
  // worst, never inf - inf; the max itself gets exp(0) = 1 exactly.
  if (top_k_on && keep_top_k(logits, vocab_size, params.top_k)) {
    // Top-k ranks logits: e only for its survivors.
    compute_exps(logits, order_.data(), params.top_k, logit_max, temperature);
    return top_p_on ? keep_top_p(logits, order_.data(), params.top_k, params.top_p)
                    : order_[static_cast<size_t>(params.top_k - 1)];
  }
  kernels::cpu::fast::libm_scaled_exp(exps_.data(), logits, vocab_size, logit_max, temperature);
  return top_p_on ? keep_top_p(logits, nullptr, vocab_size, params.top_p) : all_kept;
}

void sampler::assign_buckets(const float* logits, int32_t vocab_size, float logit_max, float temperature) {
  bucket_.resize(static_cast<size_t>(vocab_size));
  uint8_t* bucket = bucket_.data();
  const float scale = quarter_octaves_per_nat / temperature;
  for (int32_t i = 0; i < vocab_size; ++i) {
    const float d = (logit_max - logits[i]) * scale;  // >= 0; inf for a -inf logit
    bucket[i] = static_cast<uint8_t>(d < static_cast<float>(negligible_bucket) ? static_cast<int32_t>(d) : negligible_bucket);
  }
}

void sampler::collect_bucket_range(int32_t vocab_size, int32_t first, int32_t last, std::vector<int32_t>& ids) const {
  TROUPE_ASSERT(0 <= first && first <= last && last < num_buckets);
  const uint8_t* bucket = bucket_.data();
  const auto offset = [&](int32_t i) { return static_cast<uint8_t>(bucket[i] - first); };  // in range: <= last - first
  // Most blocks hold no such token: a vectorized minimum skips them.
  constexpr int32_t block = 64;
  for (int32_t begin = 0; begin < vocab_size; begin += block) {
    const int32_t end = std::min(vocab_size, begin + block);
    uint8_t lowest = std::numeric_limits<uint8_t>::max();
    for (int32_t i = begin; i < end; ++i) lowest = std::min(lowest, offset(i));
    if (lowest > last - first) continue;
    for (int32_t i = begin; i < end; ++i)
      if (offset(i) <= last - first) ids.push_back(i);
  }
}

bool sampler::keep_top_k(const float* logits, int32_t vocab_size, int32_t top_k) {
  std::array<int32_t, num_buckets> counts{};
  for (int32_t i = 0; i < vocab_size; ++i) counts[bucket_[static_cast<size_t>(i)]]++;
  if (top_k >= vocab_size - counts[negligible_bucket]) return false;  // drops no weight
  int32_t bucket = 0, num_above = 0;
  while (num_above + counts[static_cast<size_t>(bucket)] < top_k) num_above += counts[static_cast<size_t>(bucket++)];
  TROUPE_ASSERT(bucket < negligible_bucket);
  // Buckets above the cut are kept whole; the cut bucket gives its best top_k - num_above, the
  // last of them at top_k - 1. A strict total order makes that a unique set.
  order_.clear();
  collect_bucket_range(vocab_size, 0, bucket, order_);
  const auto middle = std::partition(order_.begin(), order_.end(),
                                     [&](int32_t id) { return bucket_[static_cast<size_t>(id)] < bucket; });
  TROUPE_ASSERT(middle - order_.begin() == num_above);
  std::nth_element(middle, order_.begin() + (top_k - 1), order_.end(), ranks_above{logits});
  return true;
}

int32_t sampler::keep_top_p(const float* logits, const int32_t* ids, int32_t num, float top_p) {
  const std::array<uint64_t, num_buckets> masses = bucket_masses(bucket_.data(), exps_.data(), ids, num);
  TROUPE_ASSERT(masses[negligible_bucket] == 0);  // so no cut falls in it
  uint64_t mass = 0;
  for (uint64_t m : masses) mass += m;
  const uint64_t target = fraction_ceil(mass, top_p);  // >= 1: the max weighs 2^43
  TROUPE_ASSERT(target >= 1 && target <= mass);
  int32_t bucket = 0;
  uint64_t cumulative = 0;
  while (cumulative + masses[static_cast<size_t>(bucket)] < target) cumulative += masses[static_cast<size_t>(bucket++)];
  // Buckets above the cut are kept whole (their mass falls short of the target); the cut
  // bucket, ranked, gives the shortest prefix that reaches it.
  cut_bucket_.clear();
  if (ids == nullptr) {
    collect_bucket_range(num, bucket, bucket, cut_bucket_);
  } else {
    for (int32_t k = 0; k < num; ++k)
      if (bucket_[static_cast<size_t>(ids[k])] == bucket) cut_bucket_.push_back(ids[k]);
  }
  std::sort(cut_bucket_.begin(), cut_bucket_.end(), ranks_above{logits});
  for (const int32_t id : cut_bucket_) {
    cumulative += top_p_weight(exps_[static_cast<size_t>(id)]);
    if (cumulative >= target) return id;
  }
  TROUPE_ASSERT_MSG(false, "the cut bucket's mass reaches the target");
  return all_kept;
}

void sampler::weigh_kept(const float* logits, int32_t vocab_size, int32_t last_kept, float min_p) {
  // A token is kept iff it ranks at or above `last_kept`: every filter keeps a prefix of the
  // ranking. The e of a token below it may be stale (top-k computes its survivors' only): it
  // is masked off before any use.
  const float cut_logit = last_kept == all_kept ? -std::numeric_limits<float>::infinity() : logits[last_kept];
  const int32_t cut_id = last_kept == all_kept ? vocab_size : last_kept;
  weights_.resize(static_cast<size_t>(vocab_size));
  const float* exps = exps_.data();
  uint64_t* weights = weights_.data();
  // min-p keeps p_i >= min_p * p_max; with e_i = p_i / p_max that is e_i >= min_p. Sum of at
  // most 2^31 weights of at most 2^32 each: fits in uint64, in any order.
  uint64_t total = 0;
  for (int32_t i = 0; i < vocab_size; ++i) {
    const float l = logits[i], e = exps[i];
    const bool kept = (l > cut_logit) | ((l == cut_logit) & (i <= cut_id));
    const uint64_t weight = fixed_point_weight(masked(e, kept & (e >= min_p)));
    weights[i] = weight;
    total += weight;
  }
  TROUPE_ASSERT_MSG(total > 0, "the most likely token must survive every filter");
  total_weight_ = total;
}

int32_t sampler::draw(random_stream& stream) const {
  uint64_t target = stream.uniform_below(total_weight_);
  const auto vocab_size = static_cast<int32_t>(weights_.size());
  // Whole blocks first; integer sums, so skipping by blocks changes no result.
  constexpr int32_t block = 64;
  int32_t token = 0;
  for (; token + block <= vocab_size; token += block) {
    uint64_t block_weight = 0;
    for (int32_t j = 0; j < block; ++j) block_weight += weights_[static_cast<size_t>(token + j)];
    if (target < block_weight) break;
    target -= block_weight;
  }
  for (; target >= weights_[static_cast<size_t>(token)]; ++token) {
    target -= weights_[static_cast<size_t>(token)];
    TROUPE_ASSERT(token + 1 < vocab_size);
  }
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
