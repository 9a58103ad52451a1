#pragma once

/// The sampling structs' `inspect` overloads, found by argument-dependent lookup: shared by the
/// step plan (messages/executor.hpp) and the completion request (messages/client.hpp).

#include "runtime/sampling/sampler.hpp"

namespace troupe::sampling {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_bias& x) {
  return f(x.token, x.bias);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_params& x) {
  return f(x.temperature, x.top_p, x.top_k, x.min_p, x.num_top_logprobs, x.presence_penalty, x.frequency_penalty,
           x.repetition_penalty, x.logit_bias);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_logprob& x) {
  return f(x.token, x.logprob);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sample_result& x) {
  return f(x.token, x.logprob, x.top_logprobs);
}

}  // namespace troupe::sampling
