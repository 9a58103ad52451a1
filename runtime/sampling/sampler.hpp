#pragma once

/// The reproducible sampler: logit bias and penalties, then temperature, top-k, top-p and min-p
/// over one row of logits, then one draw from an integer fixed-point CDF with the row's own
/// (seed, position, k) random stream.
///
/// Contract: the sampled token, its logprob and the top logprobs are a pure function of
/// (logits, vocab_size, params, context, seed, position, k), where the context is the sample's
/// own tokens so far. Nothing depends on which other rows are sampled, in which order, or on the
/// sampler object's history.

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/plan/sampling_params.hpp"
#include "runtime/sampling/random_stream.hpp"

namespace troupe::sampling {

/// The most top logprobs a request may ask for (vLLM's default `max_logprobs`).
inline constexpr int32_t num_top_logprobs_max = 20;

/// Temperatures below this are clamped to it: temperature 0 takes the ordinary sampling path
/// (there is no argmax branch) and in practice picks the most likely token. Exact ties for the
/// largest logit are then drawn uniformly among the tied tokens, by the seed; a logit within
/// about 2.2e-4 of the max (22 * temperature_min: exp(-22) > 2^-32) keeps a tiny nonzero weight.
inline constexpr float temperature_min = 1e-5f;

/// Bounds of the penalties and the logit bias (OpenAI's for presence, frequency and bias).
inline constexpr float presence_penalty_max = 2.0f;    ///< presence_penalty in [-max, max]
inline constexpr float frequency_penalty_max = 2.0f;   ///< frequency_penalty in [-max, max]
inline constexpr float repetition_penalty_max = 10.0f;  ///< repetition_penalty in (0, max]
inline constexpr float logit_bias_max = 100.0f;         ///< each bias in [-max, max]
inline constexpr size_t num_logit_bias_max = 300;       ///< entries of a logit_bias

/// A sample's tokens before the one being drawn, for the penalties: its prompt, then what it
/// generated (ignored unless `needs_context(params)`); and the grammar mask of the draw.
struct token_context {
  const int32_t* tokens = nullptr;  ///< (num_tokens) in position order, each in the vocabulary
  int32_t num_tokens = 0;
  int32_t num_prompt_tokens = 0;    ///< the leading tokens that are prompt; <= num_tokens
  /// A grammar's token bitmask (bit t % 32 of word t / 32 set: token t may be drawn), or null.
  /// Applied after bias and penalties: a masked token's logit becomes -inf, so it weighs 0 in
  /// every filter and the CDF. The caller makes sure some allowed token has a finite logit.
  const uint32_t* allowed = nullptr;
};

/// Checks a request's parameters; the error names the parameter and the offending value.
[[nodiscard]] expected<void> validate(const sampling_params& params, int32_t vocab_size);

/// Whether a row of logits can be sampled: no NaN, no +inf, at least one finite value. Bad
/// logits come from the model (poisoned weights, a numeric blow-up), not from the request, so the
/// error is errc::internal, naming the first offending token.
[[nodiscard]] expected<void> check_logits(const float* logits, int32_t vocab_size);

/// Samples rows of logits; owns scratch buffers so repeated calls do not allocate once they have
/// grown to the vocabulary size. The buffers carry no meaning between calls.
class sampler {
 public:
  /// Samples one token from `logits` (vocab_size floats that pass `check_logits`).
  ///
  /// `seed` is the request's seed, `position` the sequence position the sampled token will
  /// occupy, `context` the sample's own tokens so far (read by the penalties only), `k` the use
  /// of randomness at that position (`stream_sample`; `stream_resample` and
  /// `stream_accept_coin` are speculative decoding's, runtime/spec/verify.hpp). `params`
  /// must pass `validate`.
  ///
  /// Pipeline: first the logits l_i are adjusted, token by token in float, in vLLM's order:
  /// l_i += bias_i (logit_bias); where i occurs in the context, l_i = l_i > 0 ? l_i / r : l_i * r
  /// (repetition_penalty r); l_i -= frequency * c_i; l_i -= presence * (c_i > 0), with c_i the
  /// times i occurs among the context's generated tokens; a finite logit the arithmetic pushed
  /// past the float range is clamped back to +-FLT_MAX.
  /// Every step below ranks and weighs the adjusted logits (the logprobs stay those of the raw
  /// ones). Then e_i = exp((l_i - l_max) / T), T = max(temperature, temperature_min) (std::exp
  /// in float, glibc's bits; computed by kernels::cpu::fast::libm_scaled_exp, which returns
  /// them). Then top-k (the k largest
  /// logits, ties by lower id); then top-p over the survivors, ranked by logit descending, ties by
  /// lower id: keep the shortest prefix whose mass is >= top_p of the survivors' mass, where a
  /// token's mass is the 21.43 fixed-point floor(e_i * 2^43) and the comparison is exact
  /// integer arithmetic (at least one token); then min-p (keep p_i >= min_p * p_max, i.e.
  /// e_i >= min_p since e_max = 1). The survivors' e_i become 32.32 fixed-point weights
  /// w_i = floor(e_i * 2^32), i.e. p_i / p_max * 2^32, summed in uint64; u = uniform_below(sum
  /// of w) and the token is the first, in ascending token order, whose cumulative weight exceeds
  /// u. A token whose weight rounds to 0 (e_i < 2^-32) is never drawn.
  ///
  /// Cost: no full sort, and every pass over the vocabulary but one vectorized. Top-k and top-p
  /// bucket the tokens by e in quarter octaves (a function of the logit, so buckets are slices
  /// of the ranking): top-k counts tokens per bucket, top-p sums masses per bucket (the scalar
  /// pass); the buckets above the cut are kept whole and only the bucket the cut falls in is
  /// ranked. Each filter keeps a prefix of the ranking, so the kept set is "ranks at or above
  /// the last kept token" and the weights are one vectorized pass. e is computed for top-k's
  /// survivors only (for every token without top-k, 8 per pass); the CDF walk skips blocks of
  /// 64 tokens by their integer sums. The returned logprob's normalizer sums the kernels'
  /// vectorized exp (kernels/cpu/exp.hpp) in double, eight interleaved partial sums.
  [[nodiscard]] sample_result sample(const float* logits, int32_t vocab_size,
                                     const sampling_params& params, uint64_t seed,
                                     int64_t position, const token_context& context = {},
                                     int k = stream_sample);

  /// The distribution `sample` draws from, without drawing: `weights` becomes (vocab_size)
  /// 32.32 fixed-point weights, 0 for every token the filters drop; returns their sum (> 0).
  /// sample(...) is the first token, in ascending order, whose cumulative weight exceeds
  /// uniform_below(sum) of its stream. Speculative verification compares these (p and q).
  uint64_t weigh(const float* logits, int32_t vocab_size, const sampling_params& params,
                 const token_context& context, std::vector<uint64_t>& weights);

  /// The sample_result `sample` returns when it draws `token`: its raw logprob and the row's
  /// top logprobs (for a token chosen by speculative verification).
  [[nodiscard]] sample_result describe(const float* logits, int32_t vocab_size, const sampling_params& params,
                                       int32_t token);

 private:
  /// describe with the row's largest raw logit known.
  [[nodiscard]] sample_result describe(const float* logits, int32_t vocab_size, const sampling_params& params,
                                       int32_t token, float logit_max);
  /// Adjusts the logits, applies top-k, top-p and min-p and sets weights_ and total_weight_.
  /// Returns the largest adjusted logit.
  float select(const float* logits, int32_t vocab_size, const sampling_params& params,
               const token_context& context);
  /// The logits the filters see: `logits` itself when no bias or penalty is on, else adjusted_.
  const float* adjust(const float* logits, int32_t vocab_size, const sampling_params& params,
                      const token_context& context);
  /// Applies the repetition, frequency and presence penalties to adjusted_.
  void apply_penalties(int32_t vocab_size, const sampling_params& params, const token_context& context);
  /// The largest logit, the first of equal ones (asserting that none is NaN or +inf and one is
  /// finite).
  static float max_logit(const float* logits, int32_t vocab_size);
  /// Sets exps_[id] = exp((l_id - l_max) / T) for the `num` tokens `ids` (as select_top does
  /// for all of them).
  void compute_exps(const float* logits, const int32_t* ids, int32_t num, float logit_max, float temperature);
  /// Applies top-k and top-p and sets exps_ of at least the tokens they keep. Every filter keeps
  /// a prefix of the ranking: returns its last token, or all_kept (sampler.cpp) for all of them.
  int32_t select_top(const float* logits, int32_t vocab_size, float logit_max, float temperature,
                     const sampling_params& params);
  /// Fills bucket_.
  void assign_buckets(const float* logits, int32_t vocab_size, float logit_max, float temperature);
  /// Appends to `ids`, ascending, the tokens whose bucket is in [first, last].
  void collect_bucket_range(int32_t vocab_size, int32_t first, int32_t last, std::vector<int32_t>& ids) const;
  /// Puts the top_k best tokens in order_[0, top_k), the last-ranked of them at top_k - 1, and
  /// returns true; returns false when top-k would drop no token of nonzero weight.
  bool keep_top_k(const float* logits, int32_t vocab_size, int32_t top_k);
  /// Top-p over the tokens ids[0, num) (every token when `ids` is null), whose exps_ are set:
  /// returns the last token of the shortest prefix of their ranking that reaches top_p of their
  /// mass.
  int32_t keep_top_p(const float* logits, const int32_t* ids, int32_t num, float top_p);
  /// Sets weights_ (0 for the tokens ranked below `last_kept` and where min-p drops them) and
  /// total_weight_.
  void weigh_kept(const float* logits, int32_t vocab_size, int32_t last_kept, float min_p);
  /// Draws a token from weights_.
  int32_t draw(random_stream& stream) const;
  /// The `num` tokens with the highest raw logits, descending, ties by lower id.
  std::vector<token_logprob> top_logprobs(const float* logits, int32_t vocab_size, int32_t num,
                                          double log_normalizer);

  std::vector<float> adjusted_;   // (vocab) logits after bias and penalties
  std::vector<int32_t> counts_;   // (vocab) times generated in the context; all 0 between calls
  std::vector<uint8_t> seen_;     // (vocab) 1 if in the context; all 0 between calls
  std::vector<float> exps_;       // (vocab) exp((l_i - l_max) / T) where select_top set it, then
                                  // the raw logits' exp
  std::vector<uint8_t> bucket_;   // (vocab) selection bucket of each token (sampler.cpp)
  std::vector<int32_t> order_;    // (<= vocab) top-k's survivors; then top_logprobs' ranking
  std::vector<float> gathered_;   // (<= vocab) top-k's survivors' logits, then their e
  std::vector<int32_t> cut_bucket_;  // (<= vocab) the bucket top-p's cut falls in
  std::vector<uint64_t> weights_; // (vocab) draw weights, 0 for every token the filters drop
  uint64_t total_weight_ = 0;     // after select: the sum of weights_
  bool adjusted_logits_ = false;  // after select: a bias or penalty changed the logits
};

/// One-off form of `sampler::sample` (allocates its scratch buffers on every call).
[[nodiscard]] sample_result sample(const float* logits, int32_t vocab_size,
                                   const sampling_params& params, uint64_t seed,
                                   int64_t position, const token_context& context = {},
                                   int k = stream_sample);

}  // namespace troupe::sampling
