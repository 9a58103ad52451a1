#pragma once

/// What a request asks of the sampler and what one draw returns: plain data on the floor of
/// runtime/ (plan/), carried by step plans and results. The sampler and its bounds are
/// runtime/sampling/sampler.hpp.

#include <cstdint>
#include <vector>

namespace troupe::sampling {

/// A bias added to one token's logit.
struct token_bias {
  int32_t token = 0;
  float bias = 0.0f;
};

/// Per-request sampling parameters (the defaults sample the unfiltered distribution). The bounds
/// (`temperature_min`, `num_top_logprobs_max`, the penalties' maxima) are sampler.hpp's.
struct sampling_params {
  float temperature = 1.0f;      ///< >= 0; clamped to at least `temperature_min`
  float top_p = 1.0f;            ///< in (0, 1]; 1 = off
  int32_t top_k = 0;             ///< >= 0; 0 = off; larger than the vocabulary = off
  float min_p = 0.0f;            ///< in [0, 1]; 0 = off
  int32_t num_top_logprobs = 0;  ///< in [0, num_top_logprobs_max]
  /// OpenAI's: subtracted once from the logit of every token the sample has generated so far.
  float presence_penalty = 0.0f;  ///< in [-2, 2]; 0 = off
  /// OpenAI's: subtracted from a token's logit once per time the sample has generated it.
  float frequency_penalty = 0.0f;  ///< in [-2, 2]; 0 = off
  /// vLLM's (and Hugging Face's): a token of the prompt or generated so far has a positive logit
  /// divided by it, a negative one multiplied by it.
  float repetition_penalty = 1.0f;  ///< in (0, repetition_penalty_max]; 1 = off
  /// Added to the logits; distinct tokens, at most num_logit_bias_max, each in the vocabulary,
  /// biases in [-100, 100] (-100 in practice bans a token, 100 forces it).
  std::vector<token_bias> logit_bias;
};

bool operator==(const token_bias& a, const token_bias& b);
bool operator==(const sampling_params& a, const sampling_params& b);

/// Whether `params` read the sample's tokens so far (a penalty is on).
[[nodiscard]] bool needs_context(const sampling_params& params);

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

}  // namespace troupe::sampling
