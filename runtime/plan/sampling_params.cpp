#include "runtime/plan/sampling_params.hpp"

#include <tuple>

namespace troupe::sampling {

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

}  // namespace troupe::sampling
