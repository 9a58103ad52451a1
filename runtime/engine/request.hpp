#pragma once

/// What a client asks of an engine, and what it gets back, in tokens. Prompt encoding happens
/// before (chat templates are planned, issue 19); detokenization and stop strings are done here
/// via `output_stream`.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/engine/finish_reason.hpp"
#include "runtime/grammar/constraint.hpp"
#include "runtime/kv/cache_class.hpp"
#include "runtime/plan/pooling.hpp"
#include "runtime/sampling/sampler.hpp"

namespace troupe::engine {

using request_id = int64_t;

/// Longest stop string accepted, in bytes, and most stop strings per request.
inline constexpr size_t stop_string_bytes_max = 256;
inline constexpr size_t num_stop_strings_max = 16;
/// Most samples per request (n).
inline constexpr int32_t num_samples_max = 128;

struct request {
  request_id id = 0;
  std::vector<int32_t> prompt;            ///< token ids, starting with BOS
  int32_t max_tokens = 16;                ///< new tokens per sample, > 0 (0 for an embedding)
  sampling::sampling_params sampling;
  uint64_t seed = 0;                      ///< drawn by the caller if the user gave none
  int32_t n = 1;                          ///< samples of the same prompt (fork)
  std::vector<std::string> stop;          ///< stop strings, excluded from the output
  std::vector<int32_t> stop_token_ids;    ///< extra tokens that end a sample
  bool ignore_eos = false;                ///< keep going past end-of-sequence tokens
  int32_t priority = 0;                   ///< smaller is served first (vLLM's convention)
  /// Deliver the tokens in one message when the request ends instead of one message each (a
  /// non-streamed completion with no stop strings and n = 1: nothing needs them earlier).
  bool batch_tokens = false;
  /// The traffic class of the request's KV blocks: how long the cache tiers keep them
  /// (runtime/kv/cache_class.hpp; chat 7 days, agent 3 by default).
  kv::cache_class cache_class = kv::cache_class::chat;
  /// Grammar-constrained decoding (docs/grammars.md): the output must match it; end tokens
  /// only where it is complete. Compiled before admission into `compiled_grammar`.
  grammar::grammar_spec grammar;
  /// Engine-internal (never on the wire): `grammar` compiled (by the grammar actor, or the
  /// synchronous engine's cache); engine_core refuses a grammar request without it.
  std::shared_ptr<const grammar::compiled_grammar> compiled_grammar;
  /// The prompt's last this-many tokens are what this request generated before: before its
  /// executor failed (engine_core::resumable_requests), or on an engine that was lost (the
  /// request actor places it again: serve::request_policy::engine_lost). They count as generated
  /// for the penalties, the grammar and the sampler's counter, and max_tokens counts only what
  /// remains, so the continuation is the one the first engine would have produced.
  int32_t num_resumed_tokens = 0;
  /// The cache tier (an index of the balancer's list, msg::report_to::cache_tiers) to fetch the
  /// prompt's prefix from when the pool lacks it; -1: the engine's own node's tier, if any.
  int32_t cache_tier = -1;
  /// An embedding request (none: a completion): its whole prompt is computed, from position 0
  /// (no prefix-cache hit: the hidden states are not cached), and pooled into one vector
  /// (exec_chunk::pooling); it samples nothing, so max_tokens is 0, n 1, with no stops or grammar.
  pooling_mode pooling = pooling_mode::none;
};


/// Seed of sample `index` of a request: the request's seed for sample 0, a splitmix64-mixed
/// derivative for the others, so a request with n = 1 and seed child_seed(s, i) reproduces
/// sample i of a request with seed s exactly.
[[nodiscard]] uint64_t child_seed(uint64_t seed, int32_t index);

/// One new token of one sample, with the text it completes.
struct token_event {
  request_id request = 0;
  int32_t sample_index = 0;
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<sampling::token_logprob> top_logprobs;
  std::string text;                          ///< text delta (may be empty)
  finish_reason finish = finish_reason::none;  ///< set on the sample's last event
};

}  // namespace troupe::engine
