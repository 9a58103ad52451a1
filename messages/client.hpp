#pragma once

/// Client <-> load balancer / request protocol: a completion request in text, the streamed
/// chunks, and its end or its error. Language-neutral fields only (strings, numbers; the enums
/// `errc` and `finish_reason` travel as their underlying integers and a receiver checks them with
/// `is_valid`), so a non-C++ protocol can carry the same structs (the msgpack protocol does:
/// wire/msgpack_rpc, docs/msgpack.md).
///
/// End of stream is decided by the protocol, not by time: chunks are numbered 0, 1, 2, … and the
/// end (or the error) says how many were sent, so a client that sees its request actor go down
/// before the last chunks arrived knows what is missing and waits for it (chunks may arrive out
/// of order across nodes; the client puts them back in order).

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/engine/finish_reason.hpp"

namespace troupe::msg {

/// What a client asks for. Defaults follow vLLM's completion API.
struct completion_request {
  std::string prompt;               ///< UTF-8 text; BOS is added, special tokens never parsed
  /// Token ids instead of text (BOS included, as given): the completion then streams token ids
  /// only, with no text, and stop strings are not allowed. Used by the simulator.
  std::vector<int32_t> prompt_tokens;
  int32_t max_tokens = 16;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  bool has_seed = false;            ///< false: the request actor draws one and reports it
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int32_t priority = 0;
  int32_t num_top_logprobs = 0;
  bool stream = true;               ///< false: one chunk with everything, just before the end
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, completion_request& x) {
  return f(x.prompt, x.prompt_tokens, x.max_tokens, x.temperature, x.top_p, x.top_k, x.min_p, x.has_seed, x.seed,
           x.stop, x.ignore_eos, x.priority, x.num_top_logprobs, x.stream);
}

/// New text of a completion, with the tokens that made it.
struct completion_chunk {
  int64_t request_id = 0;
  uint64_t stream = 0;              ///< the client's stream id (submit_completion); 0: none
  int32_t sequence = 0;             ///< 0 for the first chunk of a completion, then 1, 2, …
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, completion_chunk& x) {
  return f(x.request_id, x.stream, x.sequence, x.text, x.tokens, x.logprobs);
}

/// The last message of a completion that finished.
struct completion_end {
  int64_t request_id = 0;
  uint64_t stream = 0;              ///< the client's stream id (submit_completion); 0: none
  engine::finish_reason finish_reason = engine::finish_reason::none;  ///< stop, length or cancelled
  uint64_t seed = 0;                ///< replays this answer
  int32_t num_prompt_tokens = 0;
  int32_t num_generated_tokens = 0;
  int64_t queue_ns = 0;             ///< arrival to first scheduled
  int64_t ttft_ns = 0;              ///< arrival to first token
  int64_t e2e_ns = 0;               ///< arrival to end
  std::vector<int64_t> itl_ns;      ///< gaps between consecutive tokens
  int32_t num_cached_tokens = 0;    ///< prompt tokens served from the prefix cache at admission
  int32_t num_preemptions = 0;
  int32_t num_recomputed_tokens = 0;  ///< tokens computed again after preemptions
  int32_t num_chunks = 0;           ///< chunks sent before this message
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, completion_end& x) {
  return f(x.request_id, x.stream, x.finish_reason, x.seed, x.num_prompt_tokens, x.num_generated_tokens,
           x.queue_ns, x.ttft_ns, x.e2e_ns, x.itl_ns, x.num_cached_tokens, x.num_preemptions,
           x.num_recomputed_tokens, x.num_chunks);
}

/// The last message of a completion that failed.
struct completion_error {
  int64_t request_id = 0;
  uint64_t stream = 0;              ///< the client's stream id (submit_completion); 0: none
  errc code = errc::internal;
  std::string message;
  int32_t num_chunks = 0;           ///< chunks sent before this message
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, completion_error& x) {
  return f(x.request_id, x.stream, x.code, x.message, x.num_chunks);
}

/// Client -> request: stop generating; the stream ends with finish_reason "cancelled".
struct cancel_request {
  int64_t request_id = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cancel_request& x) {
  return f(x.request_id);
}

}  // namespace troupe::msg
