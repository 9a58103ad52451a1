#pragma once

/// Request <-> engine and engine <-> step executor protocols. The engine-side payloads are the
/// runtime's own plain structs (troupe::engine::request, exec_plan, exec_result); this header
/// gives them `inspect` overloads (found by argument-dependent lookup) so they cross the
/// network unchanged, and adds the few message structs of the actor layer.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/step.hpp"

namespace troupe::sampling {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_params& x) {
  return f(x.temperature, x.top_p, x.top_k, x.min_p, x.num_top_logprobs);
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

namespace troupe::kv {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, block_copy& x) {
  return f(x.src, x.dst);
}

}  // namespace troupe::kv

namespace troupe::engine {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request& x) {
  return f(x.id, x.prompt, x.max_tokens, x.sampling, x.seed, x.n, x.stop, x.stop_token_ids,
           x.ignore_eos, x.priority);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exec_chunk& x) {
  return f(x.seq, x.first_position, x.tokens, x.block_table, x.seeds, x.sampling);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exec_plan& x) {
  return f(x.step, x.copies, x.chunks, x.released);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exec_result& x) {
  return f(x.step, x.samples);
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
  std::string code;     ///< errc name
  std::string message;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rejected& x) {
  return f(x.request_id, x.code, x.message);
}

/// Engine -> request: one new token of one sample; `finish` is "none", "stop" or "length".
struct sampled {
  int64_t request_id = 0;
  int32_t sample_index = 0;
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<sampling::token_logprob> top_logprobs;
  std::string finish;
  // On the last token only:
  int32_t num_cached_tokens = 0;  ///< prompt tokens served from the prefix cache
  int32_t num_preemptions = 0;
  int64_t scheduled_at_ns = 0;    ///< engine clock when the request was first scheduled
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampled& x) {
  return f(x.request_id, x.sample_index, x.token, x.logprob, x.top_logprobs, x.finish, x.num_cached_tokens,
           x.num_preemptions, x.scheduled_at_ns);
}

/// Request -> engine: end a request early (a stop string completed, a cancel, a lost client).
struct release {
  int64_t request_id = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, release& x) {
  return f(x.request_id);
}

/// Counters an engine reports when asked (`stats_atom`).
struct engine_report {
  int64_t num_steps = 0;
  int64_t num_generated_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_executor_failures = 0;
  int64_t num_waiting = 0;
  int64_t num_requests = 0;      ///< unfinished requests (waiting or running)
  int64_t num_blocks_in_use = 0; ///< KV blocks held by unfinished requests
  int64_t executor_busy_ns = 0;  ///< time with at least one step in flight
  int64_t elapsed_ns = 0;        ///< since the engine started
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_report& x) {
  return f(x.num_steps, x.num_generated_tokens, x.num_preemptions, x.num_executor_failures,
           x.num_waiting, x.num_requests, x.num_blocks_in_use, x.executor_busy_ns, x.elapsed_ns);
}

/// Engine -> step executor: a test hook that makes the executor fail its next plan.
struct inject_failure {
  std::string reason;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, inject_failure& x) {
  return f(x.reason);
}

}  // namespace troupe::msg
