#pragma once

/// Client <-> load balancer / request protocol: a completion request in text, the streamed
/// chunks, and its end or its error. Language-neutral fields only (strings, numbers; the enums
/// `errc` and `finish_reason` travel as their underlying integers and a receiver checks them with
/// `is_valid`), so a non-C++ protocol can carry the same structs (the msgpack protocol does:
/// messages/msgpack_rpc, docs/msgpack.md).
///
/// End of stream is decided by the protocol, not by time: chunks are numbered 0, 1, 2, … and the
/// end (or the error) says how many were sent, so a client that sees its request actor go down
/// before the last chunks arrived knows what is missing and waits for it (chunks may arrive out
/// of order across nodes; the client puts them back in order).

#include <cstdint>

#include "messages/sampling.hpp"
#include "runtime/serve/completion.hpp"

namespace troupe {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chat_message& x) {
  return f(x.role, x.content, x.extras);
}

}  // namespace troupe

// The completion structs are runtime data (runtime/serve/completion.hpp); this is their wire
// mapping, found by argument-dependent lookup in their namespace.
namespace troupe::serve {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, completion_request& x) {
  return f(x.prompt, x.prompt_tokens, x.messages, x.max_tokens, x.temperature, x.top_p, x.top_k, x.min_p, x.presence_penalty,
           x.frequency_penalty, x.repetition_penalty, x.logit_bias, x.has_seed, x.seed, x.stop, x.stop_token_ids,
           x.ignore_eos, x.priority, x.cache_class, x.num_top_logprobs, x.stream, x.grammar_kind, x.grammar,
           x.grammar_trigger_token_ids, x.grammar_trigger_strings, x.chat_template_kwargs, x.tools,
           x.add_generation_prompt, x.pooling);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tool_call& x) {
  return f(x.name, x.arguments);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, completion_chunk& x) {
  return f(x.request_id, x.stream, x.sequence, x.text, x.tokens, x.logprobs, x.top_logprobs, x.reasoning_text,
           x.tool_calls);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, completion_end& x) {
  return f(x.request_id, x.stream, x.finish_reason, x.seed, x.num_prompt_tokens, x.num_generated_tokens,
           x.queue_ns, x.ttft_ns, x.e2e_ns, x.itl_ns, x.num_cached_tokens, x.num_preemptions,
           x.num_recomputed_tokens, x.num_chunks, x.num_failovers, x.embedding);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, completion_error& x) {
  return f(x.request_id, x.stream, x.code, x.message, x.num_chunks);
}

}  // namespace troupe::serve

namespace troupe::msg {

using completion_request = serve::completion_request;
using completion_chunk = serve::completion_chunk;
using completion_end = serve::completion_end;
using completion_error = serve::completion_error;

/// Client -> request: stop generating; the stream ends with finish_reason "cancelled".
struct cancel_request {
  int64_t request_id = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cancel_request& x) {
  return f(x.request_id);
}

}  // namespace troupe::msg
