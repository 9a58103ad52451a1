#pragma once

/// A completion as its client sees it: the request in text, the chunks of its answer, and its
/// end or its error. Plain data: the request policy (runtime/serve/request_policy) produces them,
/// messages/client.hpp maps them onto the wire (as msg::completion_*). Language-neutral fields
/// only (strings, numbers; `errc` and `finish_reason` travel as their underlying integers), so
/// a non-C++ protocol can carry the same structs.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/engine/finish_reason.hpp"
#include "runtime/plan/pooling.hpp"
#include "runtime/sampling/sampler.hpp"
#include "runtime/tokenizer/served_template.hpp"

namespace troupe::serve {

/// The max_tokens that asks for every token the context leaves after the prompt (the request
/// actor resolves it once the prompt is tokenized): a chat's default, vLLM's rule. A client
/// asking for this many gets the same.
inline constexpr int32_t max_tokens_to_context = std::numeric_limits<int32_t>::max();

/// What a client asks for. Defaults follow vLLM's completion API.
struct completion_request {
  std::string prompt;               ///< UTF-8 text; BOS is added, special tokens never parsed
  /// Token ids instead of text (BOS included, as given): the HTTP API's token prompts, and the
  /// simulator's. Without a tokenizer at the request policy (the simulator) the completion streams
  /// token ids only, with no text, and stop strings are not allowed.
  std::vector<int32_t> prompt_tokens;
  /// A chat instead of a prompt: rendered by the server's chat template (request_policy_options::
  /// chat) into template and user segments, so no message can spell a control token.
  std::vector<chat_message> messages;
  /// A chat's `chat_template_kwargs`: a JSON object's text ("" for none) whose keys the model's
  /// Jinja template gets as variables (served_template.hpp says which keys it refuses).
  std::string chat_template_kwargs;
  /// A chat's `tools` for the model's template: a JSON array's text ("" for none).
  std::string tools;
  bool add_generation_prompt = true;  ///< a chat's prompt ends with the assistant's header
  int32_t max_tokens = 16;  ///< max_tokens_to_context: as many as the context leaves
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;    ///< sampling::sampling_params documents these four
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<sampling::token_bias> logit_bias;
  bool has_seed = false;            ///< false: the request actor draws one and reports it
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  ///< tokens that end the completion (kept in its tokens)
  bool ignore_eos = false;
  int32_t priority = 0;
  /// The traffic class for the KV cache tiers' lifetimes: "chat" (the default) or "agent"
  /// (kv::parse_cache_class; anything else is refused with invalid_argument).
  std::string cache_class = "chat";
  int32_t num_top_logprobs = 0;     ///< each token comes with this many top logprobs, in [0, 20]
  bool stream = true;               ///< false: one chunk with everything, just before the end
  /// Grammar-constrained decoding (docs/grammars.md): "" (none), "json_schema", "regex" or
  /// "gbnf", with its source; trigger tokens arm it only once one of them was generated.
  std::string grammar_kind;
  std::string grammar;
  std::vector<int32_t> grammar_trigger_token_ids;
  std::vector<std::string> grammar_trigger_strings;
  /// An embedding instead of a completion (none: a completion): the prompt's final hidden
  /// states pooled so, L2-normalized, in completion_end::embedding; max_tokens is then 0 and
  /// nothing is sampled or streamed. Not in the msgpack protocol.
  engine::pooling_mode pooling = engine::pooling_mode::none;
};

/// A function call a chat answer made (OpenAI's tool_calls[].function; serve::output_channels).
struct tool_call {
  std::string name;
  std::string arguments;  ///< JSON text
};

/// New text of a completion, with the tokens that made it.
struct completion_chunk {
  int64_t request_id = 0;
  uint64_t stream = 0;              ///< the client's stream id (submit_completion); 0: none
  int32_t sequence = 0;             ///< 0 for the first chunk of a completion, then 1, 2, …
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  /// Per token, the num_top_logprobs most likely tokens (raw logprobs, descending).
  std::vector<std::vector<sampling::token_logprob>> top_logprobs = {};
  /// A chat answer's reasoning and tool calls, parsed out of its text by the tags' token ids
  /// (serve::output_channels): `text` is then the answer's content only.
  std::string reasoning_text = {};
  std::vector<tool_call> tool_calls = {};
};

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
  /// Times the request was placed again after losing its engine (request_policy::engine_lost),
  /// each time recomputed from its prompt and the tokens already sent.
  int32_t num_failovers = 0;
  /// An embedding request's vector (completion_request::pooling): model dim floats, L2 norm 1.
  std::vector<float> embedding{};
};

/// The last message of a completion that failed.
struct completion_error {
  int64_t request_id = 0;
  uint64_t stream = 0;              ///< the client's stream id (submit_completion); 0: none
  errc code = errc::internal;
  std::string message;
  int32_t num_chunks = 0;           ///< chunks sent before this message
};

bool operator==(const tool_call& a, const tool_call& b);
bool operator==(const completion_chunk& a, const completion_chunk& b);
bool operator==(const completion_end& a, const completion_end& b);
bool operator==(const completion_error& a, const completion_error& b);

}  // namespace troupe::serve
