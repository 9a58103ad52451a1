#pragma once

/// The OpenAI-compatible HTTP API as plain functions: a request body (JSON text) becomes a
/// `serve::completion_request` or an `api_error`; a completion's chunks and end become response
/// JSON. No CAF, no sockets, no clock: the gateway (actors/edge/http_gateway) passes in the time
/// (`created`) and owns the threads. Every function here is deterministic and unit-tested
/// byte for byte (tests/openai_test.cpp).
///
/// Rules:
/// - A parameter troupe cannot honour is refused with a 400 naming it, unless it has its
///   neutral value (a penalty of 0, an empty logit_bias, ...): never silently ignored.
///   Fields this API does not know are ignored (clients send `user` and the like).
/// - Several choices (`n` > 1, several prompts) are several one-sample completion requests, each
///   seeded so that it replays alone (`choice_requests`); the gateway runs them side by side.
/// - Range checks (temperature >= 0, top_p in (0, 1], ...) stay in the engine, which answers
///   `invalid_argument` with a message naming the parameter; here only JSON types are checked,
///   and the ranges of what never reaches the engine as given (`n`, `best_of`, `logprobs`,
///   `top_logprobs`, token ids against the vocabulary).
/// - Chat: the messages travel as such (completion_request::messages); the request actor renders
///   them with the served chat template (runtime/tokenizer/served_template.hpp: the model's
///   Jinja template, else a built-in format; stories260K's is `bare`, the contents joined by
///   newlines) with the request's `chat_template_kwargs` and `add_generation_prompt` into
///   template and user segments. Only template segments become special tokens (contract 4):
///   `<s>` in a message is three ordinary characters.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <tl/expected.hpp>

#include "runtime/serve/completion.hpp"
#include "runtime/common/error.hpp"
#include "runtime/openai/tool_calls.hpp"
#include "runtime/tokenizer/served_template.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::openai {

enum class endpoint { completions, chat_completions };

/// The deepest nesting of objects and lists a request body may have: a deeper one is refused
/// while it is parsed, before any other use (every use of a JSON value recurses per level).
inline constexpr int json_depth_max = 64;

/// The most prompt bytes a request's choices may carry together (prompts x n): each choice is
/// a request of its own that copies and tokenizes its prompt.
inline constexpr int64_t choice_prompt_bytes_max = int64_t{4} << 20;

/// An error response: the HTTP status and the fields of `{"error": {...}}`.
struct api_error {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  ///< the offending parameter; "" renders as null
  std::string code;   ///< "" renders as null
};

/// What the gateway serves: checked against each request's `model`.
struct served_model {
  std::string id;                  ///< e.g. "stories260K"; the name every response reports
  std::string system_fingerprint;  ///< reported in every response
  int64_t created = 0;             ///< unix seconds, reported by /v1/models
  /// More names a request's `model` may give (`--served-model-name` after the first), each
  /// listed by /v1/models as vLLM lists its served names.
  std::vector<std::string> aliases{};

  /// Whether `name` is the id or one of the aliases.
  [[nodiscard]] bool serves(std::string_view name) const;
};

/// One prompt of a completion request: text (BOS is added when it is encoded), or token ids as
/// the model reads them (no BOS added).
struct prompt_input {
  std::string text;  ///< the prompt; a chat's: its contents concatenated (token_before_output reads it)
  std::vector<int32_t> tokens;
  bool is_tokens = false;
  bool is_chat = false;  ///< the prompt is completion_request::messages
};

/// A parsed completion or chat completion request.
struct parsed_request {
  endpoint kind = endpoint::completions;
  serve::completion_request request;  ///< every parameter the choices share; no prompt (see `prompts`)
  std::vector<prompt_input> prompts;  ///< one or more (a chat request: its template's text)
  int32_t n = 1;                      ///< choices per prompt
  bool logprobs = false;  ///< choices carry their tokens' logprobs (request.num_top_logprobs alternatives each)
  bool include_usage = false;  ///< stream_options.include_usage: a final chunk with usage
  /// A chat's tool_choice: when forced (required, named), request.grammar holds
  /// forced_call_schema's and the gateway reads each choice's text with a forced_call_reader.
  tool_choice tool_mode;
};

/// How many choices `p` answers with: n per prompt.
[[nodiscard]] int32_t num_choices(const parsed_request& p);

/// Whether the answer needs a seed from the gateway: several choices and no `seed` given (one
/// choice without a seed lets the request actor draw it, and reports it).
[[nodiscard]] bool needs_seed(const parsed_request& p);

/// The completion requests of `p`, one per choice: choice k is prompt k / n, sample i = k % n,
/// seeded `engine::child_seed(seed, i)`, so each choice replays alone as a one-choice request
/// with that seed. `seed` is the request's own when it gave one, else the gateway's draw (used
/// only when `needs_seed`).
[[nodiscard]] std::vector<serve::completion_request> choice_requests(const parsed_request& p, uint64_t seed);

/// Parses and checks `body` for `kind`. Errors: 400 malformed JSON, JSON nested deeper than
/// json_depth_max, choices' prompts over choice_prompt_bytes_max, invalid UTF-8, a wrong
/// type, a value out of its range where it is checked here (named), a missing prompt/messages,
/// an unsupported parameter (named); 404 unknown model. Token ids (`prompt`, `stop_token_ids`)
/// are checked against `tok`'s vocabulary when it is given (else the engine checks them).
[[nodiscard]] tl::expected<parsed_request, api_error> parse_request(endpoint kind, std::string_view body,
                                                                    const served_model& model,
                                                                    const tokenizer* tok = nullptr);

/// A chat request as `troupe render-chat` reads it (served_template::render's input): `messages`
/// (each an object with a string role; a content list of text parts joined as the gateway joins
/// it, other keys as given), `tools` (a list of objects), `tool_choice` (a string or an object;
/// checked, not rendered: templates do not read it), `chat_template_kwargs` (an object) and
/// `add_generation_prompt` (default true); other fields are ignored. Errors: 400 as
/// parse_request's (invalid UTF-8, malformed JSON, nesting past json_depth_max, a wrong type).
[[nodiscard]] tl::expected<nlohmann::ordered_json, api_error> parse_render_request(std::string_view body);

/// The HTTP status and OpenAI error for an engine or client error: invalid_argument and
/// invalid_utf8 400, not_found 404, too_long 413, overloaded 429, unavailable 503, else 500.
[[nodiscard]] api_error error_from(const error& e);

/// `{"error":{"message":...,"type":...,"param":...,"code":...}}`.
[[nodiscard]] std::string render_error(const api_error& e);

/// What every response of one request shares.
struct response_context {
  endpoint kind = endpoint::completions;
  int64_t request_id = 0;  ///< ids are "cmpl-<id>" / "chatcmpl-<id>", the id's 64 bits unsigned
  int64_t created = 0;     ///< unix seconds
  const served_model* model = nullptr;
  bool include_usage = false;
  bool logprobs = false;          ///< choices carry `logprobs` (else null)
  const tokenizer* tok = nullptr;  ///< spells the tokens of logprobs; needed with them
};

/// The answer's id: "cmpl-<id>" or "chatcmpl-<id>".
[[nodiscard]] std::string response_id(const response_context& c);

/// Tokens of a choice (all of them, or a streamed part) with their logprobs, and what their
/// texts depend on: a token's text is its piece after the token before it (tokenizer::piece),
/// raw bytes that may be part of a UTF-8 character.
struct token_logprobs {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<sampling::token_logprob>> top_logprobs;  ///< per token
  int32_t prev_token = tokenizer::no_token;  ///< the token before the first
  int64_t text_offset = 0;                   ///< bytes of the choice's token texts before the first
};

/// The token before a choice's first: BOS when the prompt is BOS alone (an empty text), the
/// last id of a token prompt; otherwise none (only BOS changes a piece).
[[nodiscard]] int32_t token_before_output(const prompt_input& prompt, const tokenizer& tok);

/// Where the tokens after `part` start: its last token, and its end offset.
[[nodiscard]] token_logprobs after(const tokenizer& tok, const token_logprobs& part);

/// One choice's text (all of it in a response, the new part in a streamed chunk).
struct choice_output {
  int32_t index = 0;
  std::string text;
  engine::finish_reason finish = engine::finish_reason::none;  ///< none renders null
  token_logprobs logprobs{};  ///< rendered when the context asks for logprobs
  /// A chat answer's reasoning (rendered as `reasoning_content`, as vLLM and llama.cpp do) and
  /// tool calls (`tool_calls`, ids "call_<request id>_<choice>_<index>"; a choice that called a
  /// tool and stopped finishes with "tool_calls"). A whole response's calls are whole (each one
  /// opening part); a streamed chunk's may open a call or continue its arguments.
  std::string reasoning{};
  std::vector<tool_call_part> tool_calls{};
};

/// Token counts of an answer, summed over its choices.
struct usage_counts {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

/// The usage of an answer whose choice k ended with `ends[k]`, `n` choices per prompt: a
/// prompt's tokens count once (its first choice's), every choice's generated tokens count.
[[nodiscard]] usage_counts sum_usage(const std::vector<serve::completion_end>& ends, int32_t n);

/// A whole (non-streamed) response: its choices, the seed that replays it, and the usage.
[[nodiscard]] std::string render_response(const response_context& c, const std::vector<choice_output>& choices,
                                          uint64_t seed, const usage_counts& usage);

/// The JSON of one streamed chunk carrying new text of one choice (`first`: that choice's first
/// chunk; a chat chunk then also carries the role).
[[nodiscard]] std::string render_chunk(const response_context& c, const choice_output& delta, bool first);

/// The JSON of the last streamed chunk of choice `index`: no text, its finish reason ("tool_calls"
/// for a stop after `called_tools`) and the seed. `usage` (the stream's last choice to finish,
/// without stream_options.include_usage): the whole answer's usage on it too, so that a stream
/// always says it without a chunk of no choices, which clients reading choices[0] would trip on.
[[nodiscard]] std::string render_final_chunk(const response_context& c, int32_t index,
                                             engine::finish_reason finish, uint64_t seed, bool called_tools = false,
                                             const usage_counts* usage = nullptr);

/// The JSON of the usage chunk (stream_options.include_usage): no choices.
[[nodiscard]] std::string render_usage_chunk(const response_context& c, uint64_t seed, const usage_counts& usage);

/// `data: <json>\n\n`, and the end of a stream.
[[nodiscard]] std::string sse_event(const std::string& json);
inline constexpr std::string_view sse_done = "data: [DONE]\n\n";

/// GET /v1/models: one entry per name (the id, then the aliases), each with vLLM's `root` (the
/// id) and `max_model_len` (the engines' context; null while it is not known: 0).
[[nodiscard]] std::string render_models(const served_model& model, int32_t max_model_len);

/// POST /tokenize, vLLM's TokenizeCompletionRequest (`prompt`, a string) or TokenizeChatRequest
/// (`messages`, with a chat completion's `tools`, `tool_choice`, `chat_template_kwargs` and
/// `add_generation_prompt`).
struct tokenize_request {
  bool is_chat = false;
  std::string prompt;                 ///< a text's
  serve::completion_request chat;     ///< a chat's messages and template fields
  /// Text (default true): BOS when the vocabulary asks for it, as a completion's prompt has it.
  /// Chat (default false): the chat completion's prompt as it is; true puts that BOS before it
  /// (vLLM's "on top of what the template adds").
  bool add_special_tokens = true;
  bool return_token_strs = false;  ///< the response's token_strs: each token's text in the vocabulary
};

/// Parses and checks a /tokenize body. Errors: 400 as parse_request's (invalid UTF-8, malformed
/// JSON, a wrong type, neither or both of prompt and messages, `continue_final_message` or
/// `chat_template` other than their neutral values), 404 unknown model.
[[nodiscard]] tl::expected<tokenize_request, api_error> parse_tokenize_request(std::string_view body,
                                                                               const served_model& model);

/// The tokens of `r`: the text encoded as a completion's prompt is (special tokens are never
/// parsed from text), or the messages as serve::chat_prompt_tokens renders them for a chat
/// completion with `chat`. Errors: the template's (400), a prompt past what a context can hold
/// (413).
[[nodiscard]] tl::expected<std::vector<int32_t>, api_error> tokenize(const tokenize_request& r, const tokenizer& tok,
                                                                     const served_template& chat);

/// `{"count", "max_model_len", "tokens", "token_strs"}` (vLLM's TokenizeResponse); token_strs
/// is null unless `strs`, else each token's text as the vocabulary stores it
/// (tokenizer::piece_text; bytes that are not UTF-8 read U+FFFD).
[[nodiscard]] std::string render_tokenize(const std::vector<int32_t>& tokens, int32_t max_model_len,
                                          const tokenizer& tok, bool strs);

/// The `tokens` of a /detokenize body, each in `tok`'s vocabulary. Errors: 400 as
/// parse_request's and for a missing list or an id outside the vocabulary (named), 404 unknown
/// model.
[[nodiscard]] tl::expected<std::vector<int32_t>, api_error> parse_detokenize_request(std::string_view body,
                                                                                     const served_model& model,
                                                                                     const tokenizer& tok);

/// `{"prompt": <the tokens decoded>}` (vLLM's DetokenizeResponse): tokenizer::decode's text.
[[nodiscard]] std::string render_detokenize(const std::vector<int32_t>& tokens, const tokenizer& tok);

/// The most inputs one /v1/embeddings request embeds: each is a request of its own.
inline constexpr int32_t embedding_inputs_max = 128;

/// POST /v1/embeddings (OpenAI's shape, with vLLM's `pooling` extension).
struct embeddings_request {
  /// One or more: text (encoded as a completion's prompt: BOS when the vocabulary asks for it)
  /// or token ids as the model reads them (no BOS added).
  std::vector<prompt_input> inputs;
  engine::pooling_mode pooling = engine::pooling_mode::last;  ///< the server's default unless given
  bool base64 = false;  ///< encoding_format "base64": each vector as its little-endian float32 bytes
};

/// Parses and checks a /v1/embeddings body: `input` (a string, a list of strings, a list of
/// token ids or a list of lists of token ids; 1 to embedding_inputs_max inputs, none empty,
/// choice_prompt_bytes_max bytes in all, ids in `tok`'s vocabulary), `encoding_format` ("float",
/// the default, or "base64"), `dimensions` (only absent or `dim`, the model's width: troupe does
/// not truncate), `pooling` ("mean", "last" or "cls"; `default_pooling` when absent), `user`
/// (ignored). Errors: 400 as parse_request's (invalid UTF-8, malformed JSON, a wrong type, a
/// value out of range, named), 404 unknown model.
[[nodiscard]] tl::expected<embeddings_request, api_error> parse_embeddings_request(
    std::string_view body, const served_model& model, const tokenizer& tok, int32_t dim,
    engine::pooling_mode default_pooling);

/// The requests that compute `r`'s embeddings, one per input in order: its prompt, the pooling,
/// max_tokens 0, not streamed.
[[nodiscard]] std::vector<serve::completion_request> embedding_requests(const embeddings_request& r);

/// `{"object":"list","data":[{"object":"embedding","index":i,"embedding":...}],"model":...,
/// "usage":{"prompt_tokens":...,"total_tokens":...}}` from each input's end, in input order: a
/// float as the shortest decimal that reads back as it, or (`base64`) the base64 of the
/// vector's little-endian float32 bytes.
[[nodiscard]] std::string render_embeddings(const std::vector<serve::completion_end>& ends, bool base64,
                                            const std::string& model_id);

/// Base64 (RFC 4648, with padding) of `bytes`.
[[nodiscard]] std::string base64_encode(std::string_view bytes);

/// Where a gateway is in its life: listening before the engines are up, serving, or draining
/// after a stop was asked for (requests in flight end; no new ones are taken).
enum class serving_state { starting, ready, draining };

/// GET /health: 200 `{"status":"ready"}` when ready, else 503 `{"status":"starting"}` or
/// `{"status":"draining"}`.
[[nodiscard]] int health_status(serving_state state);
[[nodiscard]] std::string render_health(serving_state state);

/// The 503 a completion gets while the gateway is starting or draining.
[[nodiscard]] api_error not_serving_error(serving_state state);

}  // namespace troupe::openai
