#pragma once

/// Request <-> engine protocol: submit a tokenized request, stream its sampled tokens back,
/// reject it, or release it early.

#include <cstdint>
#include <string>
#include <vector>

#include "messages/executor.hpp"
#include "runtime/engine/request.hpp"

namespace troupe::grammar {

/// `kind` is checked by grammar::validate where a request enters an engine.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, grammar_spec& x) {
  return f(x.kind, x.source, x.trigger_token_ids, x.trigger_strings);
}

}  // namespace troupe::grammar

namespace troupe::engine {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request& x) {
  // compiled_grammar stays behind: the receiving engine compiles the spec again.
  return f(x.id, x.prompt, x.max_tokens, x.sampling, x.seed, x.n, x.stop, x.stop_token_ids,
           x.ignore_eos, x.priority, x.batch_tokens, x.cache_class, x.grammar, x.num_resumed_tokens, x.cache_tier,
           x.pooling);
}

}  // namespace troupe::engine

namespace troupe::msg {

/// Request -> engine: queue this request (already tokenized and validated by shape).
struct submit {
  engine::request request;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, submit& x) {
  return f(x.request);
}

/// Engine -> request: the engine refused the request, or can no longer serve it.
struct rejected {
  int64_t request_id = 0;
  errc code = errc::internal;
  std::string message;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rejected& x) {
  return f(x.request_id, x.code, x.message);
}

/// Engine -> request: one new token of one sample; `finish` is none, stop or length.
struct sampled {
  int64_t request_id = 0;
  int32_t sample_index = 0;
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<sampling::token_logprob> top_logprobs;
  engine::finish_reason finish = engine::finish_reason::none;
  // On the last token only:
  int32_t num_cached_tokens = 0;  ///< prompt tokens served from the prefix cache at admission
  int32_t num_preemptions = 0;
  int32_t num_recomputed_tokens = 0;  ///< tokens computed again after preemptions
  int64_t scheduled_at_ns = 0;    ///< engine clock when the request was first scheduled
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampled& x) {
  return f(x.request_id, x.sample_index, x.token, x.logprob, x.top_logprobs, x.finish, x.num_cached_tokens,
           x.num_preemptions, x.num_recomputed_tokens, x.scheduled_at_ns);
}

/// Engine -> request: every token of a request with `batch_tokens`, sent when it ends. Each
/// token's `age_ns` is how long before this message was sent it was sampled, so the receiver
/// recovers per-token times on its own clock (engine and request may be on different nodes).
struct sampled_batch {
  int64_t request_id = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<sampling::token_logprob>> top_logprobs;
  std::vector<int64_t> age_ns;
  engine::finish_reason finish = engine::finish_reason::none;  ///< of the last token: stop or length
  int32_t num_cached_tokens = 0;
  int32_t num_preemptions = 0;
  int32_t num_recomputed_tokens = 0;
  int64_t scheduled_age_ns = 0;  ///< how long before sending the request was first scheduled
  /// An embedding request's end (engine::request::pooling): its vector, with no tokens.
  std::vector<float> embedding{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampled_batch& x) {
  return f(x.request_id, x.tokens, x.logprobs, x.top_logprobs, x.age_ns, x.finish, x.num_cached_tokens,
           x.num_preemptions, x.num_recomputed_tokens, x.scheduled_age_ns, x.embedding);
}

/// Request -> engine: end a request early (a stop string completed, a cancel, a lost client).
struct release {
  int64_t request_id = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, release& x) {
  return f(x.request_id);
}

}  // namespace troupe::msg
