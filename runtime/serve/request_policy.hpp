#pragma once

/// One completion's policy without an actor system: from the client's text to the engine's
/// request and from the engine's tokens back to the client's chunks, driven by calls that each
/// return the list of effects the request actor performs (actors/request_actor.cpp is a
/// dispatcher over this policy: STYLE.md, "An actor is a dispatcher over a pure host").
///
/// What it decides:
/// - the prompt: prompt_tokens exclude a text prompt, and without a tokenizer stop strings
///   (invalid_argument), and are checked against the tokenizer's vocabulary when it is known; a
///   text prompt longer in bytes than any tokenization of the context is refused (too_long)
///   before it is tokenized (encoding holds several words per byte); tokenizer errors pass on;
/// - the engine request: the given seed or the drawn one, and `batch_tokens` (one message with
///   every token) for a non-streamed request without stop strings;
/// - the placement request: the prompt's length, and its chain hashes when the balancer keeps a
///   prefix directory (`prefix_block_size` > 0): hashed here, in each request, not in the
///   balancer that every request goes through;
/// - tokens: detokenization and stop strings (engine::output_stream, made on the first token),
///   a chat's reasoning and tool calls split from its content by tag token (output_channels),
///   chunks numbered 0, 1, 2, … (one per token when streaming, one before the end otherwise), a
///   batch expanded token by token at the times its ages give, TTFT, inter-token gaps, queue
///   time and end-to-end time from the `now_ns` of the calls;
/// - trust: a finish reason or error code from an engine (maybe another process) that this
///   version does not know, or top logprobs beyond those asked for, outside the vocabulary or
///   not finite, fail the request (internal) instead of being used;
/// - ends: a completed stop string, a cancel or a rejection release the request at its engines;
///   a lost client releases it and ends without a word;
/// - failover: a lost engine (its process died or froze) that still served the request (a
///   prefill engine that already handed it over no longer does) has the request placed again,
///   at most `max_failovers` times: the other engine releases it, the balancer is asked anew
///   (told which engine was lost), and the new engine recomputes the prompt plus the tokens the
///   client already has (engine::request::num_resumed_tokens), so the continuation is the one
///   the lost engine would have produced and the client's stream goes on with no token missing
///   or repeated. Past the bound, or when nothing can serve it, the request fails (unavailable).
///   A request its engine forwarded (the engine drained) is placed again the same way; when the
///   engine sent the KV it had computed, the new engine gets the part of it the resumed prompt
///   needs (engine::kv_slice) with the request and computes only the prompt's last token, on
///   the decode engine of a prefill/decode placement.
///
/// Every ending call ends with `stop`; the actor then quits and calls the policy no more.
/// Identity: the actor keeps every handle (client, balancer, engines) and tells the policy which
/// engine a call is about by its role. Pure: no CAF, no clock (calls take `now_ns`).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runtime/engine/engine_policy.hpp"
#include "runtime/engine/output_stream.hpp"
#include "runtime/serve/completion.hpp"
#include "runtime/serve/output_channels.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::serve {

/// A chat's prompt as the request actor makes it (the HTTP gateway's /tokenize gives the same):
/// `p.messages` (with their tool-calling keys), `tools`, `chat_template_kwargs` and
/// `add_generation_prompt` rendered by `chat` and encoded by provenance (segments.hpp), with
/// BOS when `tok` adds it. The messages' bytes and then the rendered text's are refused
/// (too_long) past what `context_tokens` tokens can spell (0: the largest context a checkpoint
/// may declare). Errors: invalid_argument (the template's, a malformed field), too_long,
/// invalid_utf8.
[[nodiscard]] expected<std::vector<int32_t>> chat_prompt_tokens(const completion_request& p, const served_template& chat,
                                                                const tokenizer& tok, int32_t context_tokens);

struct request_policy_options {
  int64_t id = 0;
  uint64_t stream = 0;  ///< stamped on every message to the client (submit_completion::stream)
  std::shared_ptr<const tokenizer> tok;  ///< needed for a text prompt only
  completion_request params;
  uint64_t drawn_seed = 0;  ///< used when params.has_seed is false
  /// The engines' context (their largest seq_len): a text prompt longer than
  /// tok->max_text_bytes(context_tokens) is refused (too_long) before it is tokenized. 0 = not
  /// known here: the largest context a checkpoint may declare bounds it.
  int32_t context_tokens = 0;
  /// The balancer's prefix directory's block size (balance::balancer_policy::prefix_block_size):
  /// ask_placement carries the prompt's chain hashes in blocks of it; 0 = none.
  int32_t prefix_block_size = 0;
  /// The balancer refused the request at admission (its rate limit): it fails with this at start.
  std::optional<error> refused;
  /// How a chat's messages become the prompt (completion_request::messages).
  served_template chat;
  /// Times a request is placed again after losing its engine before it fails (0: never).
  int32_t max_failovers = 3;
  /// The vocabulary's think and tool-call tags (output_tags::of, found once per tokenizer): a
  /// chat's answer is split by them (output_channels); a plain completion's never is.
  output_tags tags;
};

/// Which placed engine a call is about.
enum class engine_role { prefill, decode };

/// Ask the balancer where the request runs (msg::place_request); its answer goes to `placed`.
struct ask_placement {
  int64_t request_id = 0;
  int32_t num_prompt_tokens = 0;
  int32_t max_tokens = 0;
  std::vector<uint64_t> prefix_hashes;  ///< kv::chain_hashes(prompt, prefix_block_size)
  /// Placed again: the placed engine of role `lost` was lost (the actor names it to the balancer
  /// and forgets the old placement), or forwarded the request (`drained`: it is not named; it
  /// reports itself draining, and the balancer must not count it lost).
  bool again = false;
  engine_role lost = engine_role::decode;
  bool drained = false;
};

/// Send the request to the placed prefill engine (which hands it to the decode engine) when
/// `to_prefill`, else to the decode engine: with `kv` (the KV of the prompt's first
/// prompt.size() - 1 positions, from the engine that drained) as a hand-off (msg::kv_handoff).
struct submit {
  engine::request request;
  bool to_prefill = false;
  std::optional<engine::kv_data> kv;
};

struct send_chunk {
  completion_chunk chunk;
};

struct send_end {
  completion_end end;
};

struct send_error {
  completion_error error;
};

/// Tell every placed engine to drop the request (msg::release; an unknown id is a no-op there).
struct release_engines {};

/// The request is over: the actor ends.
struct stop {};

using effect = std::variant<ask_placement, submit, send_chunk, send_end, send_error, release_engines, stop>;
using effects = std::vector<effect>;

bool operator==(const ask_placement& a, const ask_placement& b);
bool operator==(const submit& a, const submit& b);
bool operator==(const send_chunk& a, const send_chunk& b);
bool operator==(const send_end& a, const send_end& b);
bool operator==(const send_error& a, const send_error& b);
bool operator==(const release_engines& a, const release_engines& b);
bool operator==(const stop& a, const stop& b);

/// The balancer's answer as the policy sees it (the actor keeps the engines' handles).
struct placed_engines {
  std::string error;  ///< non-empty: no engine serves the request
  bool has_prefill = false;
  bool has_decode = false;
  std::string prefill_name;  ///< "engine 'prefill0' on node 'node0'", for error messages
  std::string decode_name;
};

class request_policy {
 public:
  explicit request_policy(request_policy_options options);

  /// The request arrived: a refusal (send_error, stop) or ask_placement.
  [[nodiscard]] effects start(int64_t now_ns);
  /// The balancer answered (an error, or the engines): submit, or send_error and stop.
  [[nodiscard]] effects placed(const placed_engines& p);
  /// The prefill engine handed the request over: its loss no longer concerns the request.
  void prefilled() { handed_over_ = true; }
  /// One token (msg::sampled) received at `now_ns`; `scheduled_at_ns` is on the engine's clock.
  [[nodiscard]] effects on_token(const engine::sample_event& s, int64_t scheduled_at_ns, int64_t now_ns);
  /// Every token of a batch_tokens request (msg::sampled_batch), received at `now_ns`.
  [[nodiscard]] effects on_batch(const engine::token_batch& b, int64_t now_ns);
  /// An engine refused the request or can no longer serve it (msg::rejected).
  [[nodiscard]] effects rejected(errc code, const std::string& message);
  /// The placed engine of `role` is lost (`why`).
  [[nodiscard]] effects engine_lost(engine_role role, const std::string& why);
  /// The placed engine of `role` drained and forwarded the request (`why`), with the KV of its
  /// first kv->num_tokens positions when it has one.
  [[nodiscard]] effects forwarded(engine_role role, const std::string& why, std::optional<engine::kv_data> kv);
  [[nodiscard]] int32_t num_failovers() const { return num_failovers_; }
  /// The client cancels: the stream ends with finish_reason cancelled.
  [[nodiscard]] effects cancel(int64_t now_ns);
  /// Nobody listens any more: the engines free the request's blocks.
  [[nodiscard]] effects client_lost();

  [[nodiscard]] int64_t id() const { return o_.id; }
  [[nodiscard]] bool done() const { return done_; }
  void check_invariants() const;

 private:
  [[nodiscard]] expected<std::vector<int32_t>> tokenize_prompt();
  // What engines send, checked: an engine may be another process (issue 21, point 3).
  [[nodiscard]] expected<void> check_token(int32_t token, float logprob, int64_t num_before) const;
  [[nodiscard]] expected<void> check_top(const std::vector<sampling::token_logprob>& top) const;
  [[nodiscard]] expected<void> check_sampled(const engine::sample_event& s) const;
  [[nodiscard]] expected<void> check_batch(const engine::token_batch& b) const;
  /// Whether `ok`; if not, the engines release the request and it fails with the message: the
  /// engine that sent it is broken or an impostor, and the answer can no longer be trusted.
  [[nodiscard]] bool accept(const expected<void>& ok, effects& out);
  void take_token(const engine::sample_event& s, int64_t scheduled_at_ns, int64_t at_ns, int64_t now_ns,
                  effects& out);
  /// The prompt a new engine resumes from after a failover: the prompt and the tokens sent.
  [[nodiscard]] std::vector<int32_t> resumed_prompt() const;
  /// The placed engine of `role` can no longer serve the request (`why`): placed again, or
  /// failed past max_failovers; `drained`: it forwarded the request (not lost).
  [[nodiscard]] effects place_again(engine_role role, const std::string& why, bool drained);
  /// Adds a delta's text, reasoning and tool calls to the pending chunk.
  void take_text(output_channels::delta d);
  void flush(effects& out);
  void finish(engine::finish_reason reason, int64_t now_ns, effects& out);
  void fail_request(errc code, const std::string& message, effects& out);

  request_policy_options o_;
  engine::request request_;  // built by start; kept to place it again after a lost engine
  std::vector<int32_t> generated_;  // the tokens the client has: a new engine resumes after them
  int32_t num_failovers_ = 0;
  std::optional<engine::kv_data> forwarded_kv_;  // from a drained engine, for the next placement
  bool text_mode_ = true;    // a tokenizer is known: detokenize the output (whatever the prompt)
  std::optional<output_channels> out_;  // made on the first token: stops are validated then
  placed_engines placed_;    // once the balancer answered with engines
  bool handed_over_ = false;  // the prefill engine is done with it
  int64_t arrival_ns_ = 0;
  int64_t last_token_ns_ = 0;
  completion_end end_;
  completion_chunk pending_;  // what is not sent yet (everything, when not streaming)
  int32_t num_chunks_ = 0;    // sent so far: the next chunk's sequence number
  bool done_ = false;         // `stop` was returned
};

}  // namespace troupe::serve
