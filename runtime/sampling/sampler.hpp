#pragma once

/// The reproducible sampler: temperature, top-k, top-p and min-p over one row of logits, then one
/// draw from an integer fixed-point CDF with the row's own (seed, position, k) random stream.
///
/// Contract: the sampled token, its logprob and the top logprobs are a pure function of
/// (logits, vocab_size, params, seed, position, k). Nothing depends on which other rows are
/// sampled, in which order, or on the sampler object's history.

#include <cstdint>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/sampling/random_stream.hpp"

namespace troupe::sampling {

/// The most top logprobs a request may ask for (vLLM's default `max_logprobs`).
inline constexpr int32_t num_top_logprobs_max = 20;

/// Temperatures below this are clamped to it: temperature 0 takes the ordinary sampling path
/// (there is no argmax branch) and in practice picks the most likely token. Exact ties for the
/// largest logit are then drawn uniformly among the tied tokens, by the seed; a logit within
/// about 2.2e-4 of the max (22 * temperature_min: exp(-22) > 2^-32) keeps a tiny nonzero weight.
inline constexpr float temperature_min = 1e-5f;

/// Per-request sampling parameters (the defaults sample the unfiltered distribution).
struct sampling_params {
  float temperature = 1.0f;      ///< >= 0; clamped to at least `temperature_min`
  float top_p = 1.0f;            ///< in (0, 1]; 1 = off
  int32_t top_k = 0;             ///< >= 0; 0 = off; larger than the vocabulary = off
  float min_p = 0.0f;            ///< in [0, 1]; 0 = off
  int32_t num_top_logprobs = 0;  ///< in [0, num_top_logprobs_max]
};

/// Checks a request's parameters; the error names the parameter and the offending value.
[[nodiscard]] expected<void> validate(const sampling_params& params, int32_t vocab_size);

/// Whether a row of logits can be sampled: no NaN, no +inf, at least one finite value. Bad
/// logits come from the model (poisoned weights, a numeric blow-up), not from the request, so the
/// error is errc::internal, naming the first offending token.
[[nodiscard]] expected<void> check_logits(const float* logits, int32_t vocab_size);

/// A token and its log-probability.
struct token_logprob {
  int32_t token;
  float logprob;
};

inline bool operator==(const token_logprob& a, const token_logprob& b) {
  return a.token == b.token && a.logprob == b.logprob;
}

/// What one sampling step returns for one row.
struct sample_result {
  int32_t token;  ///< the sampled token id
  /// log-softmax of the RAW logits (temperature 1, before any filter) at `token`: what vLLM
  /// returns by default, and independent of the sampling parameters.
  float logprob;
  /// The `num_top_logprobs` tokens with the highest raw logprobs, descending, ties by lower id.
  std::vector<token_logprob> top_logprobs;
};

/// Samples rows of logits; owns scratch buffers so repeated calls do not allocate once they have
/// grown to the vocabulary size. The buffers carry no meaning between calls.
class sampler {
 public:
  /// Samples one token from `logits` (vocab_size floats that pass `check_logits`).
  ///
  /// `seed` is the request's seed, `position` the sequence position the sampled token will
  /// occupy, `k` the use of randomness at that position (`stream_sample`; `stream_resample` and
  /// `stream_accept_coin` are reserved for speculative decoding, planned in issue 17). `params`
  /// must pass `validate`.
  ///
  /// Pipeline: e_i = exp((l_i - l_max) / T), T = max(temperature, temperature_min), computed
  /// sequentially in index order; then top-k (the k largest logits, ties by lower id); then
  /// top-p (rank the survivors by logit descending, ties by lower id, keep the shortest prefix
  /// whose mass is >= top_p of the survivors' mass, at least one token); then min-p (keep
  /// p_i >= min_p * p_max, i.e. e_i >= min_p since e_max = 1). The survivors' e_i become 32.32
  /// fixed-point weights w_i = floor(e_i * 2^32), i.e. p_i / p_max * 2^32, summed in uint64 in
  /// ascending token order; u = uniform_below(sum of w) and the token is the first whose
  /// cumulative weight exceeds u. A token whose weight rounds to 0 (e_i < 2^-32) is never drawn.
  [[nodiscard]] sample_result sample(const float* logits, int32_t vocab_size,
                                     const sampling_params& params, uint64_t seed,
                                     int64_t position, int k = stream_sample);

 private:
  /// Fills exps_ with exp((l_i - l_max) / T); returns l_max.
  float compute_exps(const float* logits, int32_t vocab_size, float temperature);
  /// Applies top-k and top-p; leaves the survivors' ids in order_[0, n) and returns n.
  int32_t select_top(const float* logits, int32_t vocab_size, const sampling_params& params);
  /// Builds the fixed-point CDF over survivors that also pass min-p, and draws a token.
  int32_t draw(int32_t num_candidates, int32_t vocab_size, float min_p, random_stream& stream);
  /// The `num` tokens with the highest raw logits, descending, ties by lower id.
  std::vector<token_logprob> top_logprobs(const float* logits, int32_t vocab_size, int32_t num,
                                          double log_normalizer);

  std::vector<float> exps_;      // (vocab) exp((l_i - l_max) / T)
  std::vector<int32_t> order_;   // (vocab) token ids, a prefix ranked by logit
  std::vector<uint8_t> chosen_;  // (vocab) 1 if the token survived top-k and top-p
};

/// One-off form of `sampler::sample` (allocates its scratch buffers on every call).
[[nodiscard]] sample_result sample(const float* logits, int32_t vocab_size,
                                   const sampling_params& params, uint64_t seed,
                                   int64_t position, int k = stream_sample);

}  // namespace troupe::sampling
