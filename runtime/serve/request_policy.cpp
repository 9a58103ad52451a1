#include "runtime/serve/request_policy.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/common/bounded_json.hpp"
#include "runtime/kv/chain_hash.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/sampling/sampler.hpp"
#include "runtime/tokenizer/segments.hpp"

namespace troupe::serve {

bool operator==(const ask_placement& a, const ask_placement& b) {
  return std::tie(a.request_id, a.num_prompt_tokens, a.max_tokens, a.prefix_hashes, a.again, a.lost, a.drained) ==
         std::tie(b.request_id, b.num_prompt_tokens, b.max_tokens, b.prefix_hashes, b.again, b.lost, b.drained);
}

bool operator==(const submit& a, const submit& b) {
  const engine::request& x = a.request;
  const engine::request& y = b.request;
  return std::tie(x.id, x.prompt, x.max_tokens, x.sampling, x.seed, x.n, x.stop, x.stop_token_ids, x.ignore_eos,
                  x.priority, x.batch_tokens, x.grammar, x.num_resumed_tokens, x.pooling, a.to_prefill) ==
             std::tie(y.id, y.prompt, y.max_tokens, y.sampling, y.seed, y.n, y.stop, y.stop_token_ids, y.ignore_eos,
                      y.priority, y.batch_tokens, y.grammar, y.num_resumed_tokens, y.pooling, b.to_prefill) &&
         a.kv.has_value() == b.kv.has_value() &&
         (!a.kv || std::tie(a.kv->num_layers, a.kv->kv_dim, a.kv->num_tokens, a.kv->keys, a.kv->values) ==
                       std::tie(b.kv->num_layers, b.kv->kv_dim, b.kv->num_tokens, b.kv->keys, b.kv->values));
}

bool operator==(const send_chunk& a, const send_chunk& b) { return a.chunk == b.chunk; }
bool operator==(const send_end& a, const send_end& b) { return a.end == b.end; }
bool operator==(const send_error& a, const send_error& b) { return a.error == b.error; }
bool operator==(const release_engines&, const release_engines&) { return true; }
bool operator==(const stop&, const stop&) { return true; }

namespace {

/// The JSON text `text` (from another process: bounded in depth) as what `what` must be: an
/// object or an array.
expected<nlohmann::ordered_json> json_field(const std::string& text, const char* what, bool object) {
  auto value = parse_bounded_json(text, chat_template_kwargs_depth_max);
  if (!value) return fail(errc::invalid_argument, std::string(what) + " " + value.error().message);
  if (object ? !value->is_object() : !value->is_array())
    return fail(errc::invalid_argument, std::string(what) + (object ? " must be a JSON object" : " must be a JSON array"));
  return value;
}

/// A chat request as served_template::render reads it: its messages (with their tool-calling
/// keys), tools, kwargs (a JSON object) and add_generation_prompt.
expected<nlohmann::ordered_json> chat_request_json(const completion_request& p) {
  using json = nlohmann::ordered_json;
  json request = json::object();
  json& messages = request["messages"] = json::array();
  for (const chat_message& m : p.messages) {
    json message = {{"role", m.role}, {"content", m.content}};
    if (!m.extras.empty()) {
      auto extras = json_field(m.extras, "a message's tool-calling keys", true);
      if (!extras) return tl::unexpected(extras.error());
      for (auto& [key, value] : extras->items()) message[key] = std::move(value);
    }
    messages.push_back(std::move(message));
  }
  if (!p.tools.empty()) {
    auto tools = json_field(p.tools, "tools", false);
    if (!tools) return tl::unexpected(tools.error());
    request["tools"] = std::move(*tools);
  }
  request["add_generation_prompt"] = p.add_generation_prompt;
  if (p.chat_template_kwargs.empty()) return request;
  auto kwargs = json_field(p.chat_template_kwargs, "chat_template_kwargs", true);
  if (!kwargs) return tl::unexpected(kwargs.error());
  request["chat_template_kwargs"] = std::move(*kwargs);
  return request;
}

/// Refuses a text prompt too long in bytes to fit the context in any tokenization, before
/// tokenizing it: encoding holds several words per byte (a 64 MB prompt took over 1 GB).
expected<void> check_prompt_bytes(const tokenizer& tok, int32_t context_tokens, int64_t bytes) {
  const int32_t context = context_tokens > 0 ? context_tokens : model::header_value_max;
  const int64_t bytes_max = tok.max_text_bytes(context);
  if (bytes <= bytes_max) return {};
  return fail(errc::too_long, "the prompt is " + std::to_string(bytes) + " bytes; a " + std::to_string(context) +
                                  "-token context holds at most " + std::to_string(bytes_max) + " (" +
                                  std::to_string(tok.max_token_length()) + " bytes per token at most)");
}

}  // namespace

/// The messages are checked for size twice: as sent (before rendering them), then everything
/// the template made of them (its markup per message counts too: many empty messages make a
/// long prompt).
expected<std::vector<int32_t>> chat_prompt_tokens(const completion_request& p, const served_template& chat,
                                                  const tokenizer& tok, int32_t context_tokens) {
  int64_t bytes = 0;
  for (const chat_message& m : p.messages) bytes += static_cast<int64_t>(m.role.size() + m.content.size());
  if (auto fits = check_prompt_bytes(tok, context_tokens, bytes); !fits) return tl::unexpected(fits.error());
  auto request = chat_request_json(p);
  if (!request) return tl::unexpected(request.error());
  auto segments = chat.render(*request);
  if (!segments) return tl::unexpected(segments.error());
  int64_t rendered_bytes = 0;
  for (const segment& s : *segments) rendered_bytes += static_cast<int64_t>(s.text.size());
  if (auto fits = check_prompt_bytes(tok, context_tokens, rendered_bytes); !fits) return tl::unexpected(fits.error());
  return encode_segments(tok, *segments, tok.adds_bos(), nullptr);
}

request_policy::request_policy(request_policy_options options) : o_(std::move(options)) {}

/// The prompt in tokens: the ids given (checked against the vocabulary when it is known), or
/// the text, encoded once its size is checked. Without a tokenizer (the simulator's case) only
/// ids and no stop strings.
expected<std::vector<int32_t>> request_policy::tokenize_prompt() {
  const completion_request& p = o_.params;
  const bool token_prompt = !p.prompt_tokens.empty();
  if (token_prompt && !p.prompt.empty())
    return fail(errc::invalid_argument, "a request with prompt_tokens takes no text prompt");
  if (!text_mode_ && (!token_prompt || !p.stop.empty()))
    return fail(errc::invalid_argument, "without a tokenizer a request takes prompt_tokens and no stop strings");
  if (token_prompt) {
    if (o_.tok)
      if (auto ok = o_.tok->check_ids(p.prompt_tokens); !ok)
        return fail(ok.error().code, "prompt_tokens: " + ok.error().message);
    return std::move(o_.params.prompt_tokens);
  }
  if (!p.messages.empty()) {
    if (token_prompt || !p.prompt.empty()) return fail(errc::invalid_argument, "a chat request (messages) takes no prompt");
    return chat_prompt_tokens(p, o_.chat, *o_.tok, o_.context_tokens);
  }
  if (auto fits = check_prompt_bytes(*o_.tok, o_.context_tokens, static_cast<int64_t>(p.prompt.size())); !fits)
    return tl::unexpected(fits.error());
  return o_.tok->encode(p.prompt, o_.tok->adds_bos(), /*add_eos=*/false);
}

effects request_policy::start(int64_t now_ns) {
  TROUPE_ASSERT(!done_);
  effects out;
  arrival_ns_ = now_ns;
  const completion_request& p = o_.params;
  if (o_.refused) {
    fail_request(o_.refused->code, o_.refused->message, out);
    return out;
  }
  text_mode_ = o_.tok != nullptr;
  auto prompt = tokenize_prompt();
  if (!prompt) {
    fail_request(prompt.error().code, prompt.error().message, out);
    return out;
  }
  engine::request& r = request_;
  r.id = o_.id;
  r.prompt = std::move(*prompt);
  r.pooling = p.pooling;
  if (r.pooling != engine::pooling_mode::none) o_.params.max_tokens = 0;  // an embedding samples nothing
  if (p.max_tokens == max_tokens_to_context && o_.context_tokens > 0) {  // unknown: the engine refuses it
    const int64_t room = int64_t{o_.context_tokens} - static_cast<int64_t>(r.prompt.size());
    if (room < 1) {
      fail_request(errc::too_long,
                   "the prompt is " + std::to_string(r.prompt.size()) + " tokens: the model's context of " +
                       std::to_string(o_.context_tokens) + " tokens leaves none for an answer",
                   out);
      return out;
    }
    o_.params.max_tokens = static_cast<int32_t>(room);
  }
  r.max_tokens = p.max_tokens;
  r.sampling = {p.temperature,      p.top_p,           p.top_k,
                p.min_p,            p.num_top_logprobs, p.presence_penalty,
                p.frequency_penalty, p.repetition_penalty, p.logit_bias};
  // Checked here too, before the request crosses to an engine on another node: CAF 0.17.6
  // serializes an infinite float in an endless loop (detail::pack754), stalling this node's
  // network thread. (Without a tokenizer, the simulator's case, the engine checks them.)
  if (o_.tok)
    if (auto ok = sampling::validate(r.sampling, o_.tok->vocab_size()); !ok) {
      fail_request(ok.error().code, ok.error().message, out);
      return out;
    }
  r.seed = p.has_seed ? p.seed : o_.drawn_seed;
  r.stop = p.stop;
  r.stop_token_ids = p.stop_token_ids;
  if (!p.messages.empty())  // the template's end of turn, by id (EOS ends a sample anyway)
    for (const int32_t id : chat_stop_ids(o_.chat.stop_format(), *o_.tok))
      if (id != o_.tok->eos_id() && std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), id) == r.stop_token_ids.end())
        r.stop_token_ids.push_back(id);
  r.ignore_eos = p.ignore_eos;
  r.priority = p.priority;
  auto cls = kv::parse_cache_class(p.cache_class);
  if (!cls) {
    fail_request(cls.error().code, cls.error().message, out);
    return out;
  }
  r.cache_class = *cls;
  auto kind = grammar::parse_kind(p.grammar_kind);
  if (!kind) {
    fail_request(kind.error().code, kind.error().message, out);
    return out;
  }
  r.grammar = grammar::grammar_spec{*kind, p.grammar, p.grammar_trigger_token_ids, p.grammar_trigger_strings};
  if (o_.tok)
    if (auto ok = grammar::validate(r.grammar, o_.tok->vocab_size()); !ok) {
      fail_request(ok.error().code, ok.error().message, out);
      return out;
    }
  // Nobody sees a non-streamed completion before its end; without stop strings nothing needs
  // its tokens one by one either: one message instead of one per token.
  r.batch_tokens = !p.stream && r.stop.empty();
  end_.request_id = r.id;
  end_.stream = o_.stream;
  end_.seed = r.seed;
  end_.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
  std::vector<uint64_t> prefix_hashes;
  if (o_.prefix_block_size > 0) prefix_hashes = kv::chain_hashes(r.prompt, o_.prefix_block_size);
  out.push_back(ask_placement{r.id, end_.num_prompt_tokens, r.max_tokens, std::move(prefix_hashes)});
  return out;
}

effects request_policy::placed(const placed_engines& p) {
  TROUPE_ASSERT(!done_);
  TROUPE_ASSERT(!placed_.has_decode);  // answered once
  effects out;
  if (!p.error.empty()) {
    fail_request(errc::unavailable, p.error, out);
    return out;
  }
  if (!p.has_decode) {
    fail_request(errc::unavailable, "the balancer's placement names no decode engine", out);
    return out;
  }
  placed_ = p;
  engine::request r = request_;  // kept: a lost engine places it again
  if (!generated_.empty()) {  // resumed after the tokens the client has
    r.prompt = resumed_prompt();
    r.num_resumed_tokens = static_cast<int32_t>(generated_.size());
    r.max_tokens -= r.num_resumed_tokens;
  }
  // Forwarded with its KV: the new engine needs that of the resumed prompt but its last token.
  std::optional<engine::kv_data> kv = std::exchange(forwarded_kv_, std::nullopt);
  const int32_t num_kv_tokens = static_cast<int32_t>(r.prompt.size()) - 1;
  // An embedding is computed whole on the decode engine: its hidden states are not in any KV.
  const bool embedding = r.pooling != engine::pooling_mode::none;
  if (kv && num_kv_tokens > 0 && kv->num_tokens >= num_kv_tokens && !embedding) {
    handed_over_ = true;  // no prefill engine takes part
    out.push_back(submit{std::move(r), false, engine::kv_slice(*kv, 0, num_kv_tokens)});
    return out;
  }
  out.push_back(submit{std::move(r), p.has_prefill && !embedding, std::nullopt});
  return out;
}

/// Whether `token` can be this request's output: in the vocabulary (when a tokenizer is known),
/// within max_tokens with the `num_before` tokens before it, with a finite logprob (a sampled
/// token has a probability > 0; an infinite float would stall CAF's serializer, see start()).
expected<void> request_policy::check_token(int32_t token, float logprob, int64_t num_before) const {
  if (!std::isfinite(logprob))
    return fail(errc::internal, "the engine sent token " + std::to_string(token) + " with a logprob that is not finite");
  if (o_.tok && !o_.tok->is_valid_id(token))
    return fail(errc::internal, "the engine sent token " + std::to_string(token) + ", outside the vocabulary [0, " +
                                    std::to_string(o_.tok->vocab_size()) + ")");
  if (end_.num_generated_tokens + num_before >= o_.params.max_tokens)
    return fail(errc::internal,
                "the engine sent more than the " + std::to_string(o_.params.max_tokens) + " tokens asked for");
  return {};
}

namespace {

/// A finish reason this version knows (an out-of-range value is representable, not trusted).
expected<void> check_finish(engine::finish_reason finish) {
  if (is_valid(finish)) return {};
  return fail(errc::internal, "the engine sent an unknown finish reason " + std::to_string(static_cast<int>(finish)));
}

}  // namespace

/// The top logprobs of one token: as many as asked for at most, in the vocabulary, finite.
expected<void> request_policy::check_top(const std::vector<sampling::token_logprob>& top) const {
  if (top.size() > static_cast<size_t>(o_.params.num_top_logprobs))
    return fail(errc::internal, "the engine sent " + std::to_string(top.size()) + " top logprobs; " +
                                    std::to_string(o_.params.num_top_logprobs) + " were asked for");
  for (const sampling::token_logprob& t : top) {
    if (!std::isfinite(t.logprob))
      return fail(errc::internal, "the engine sent a top logprob of token " + std::to_string(t.token) + " that is not finite");
    if (o_.tok && !o_.tok->is_valid_id(t.token))
      return fail(errc::internal, "the engine sent a top logprob of token " + std::to_string(t.token) +
                                      ", outside the vocabulary [0, " + std::to_string(o_.tok->vocab_size()) + ")");
  }
  return {};
}

expected<void> request_policy::check_sampled(const engine::sample_event& s) const {
  if (auto ok = check_finish(s.finish); !ok) return ok;
  if (s.sample_index != 0)
    return fail(errc::internal, "the engine sent sample " + std::to_string(s.sample_index) + " of a one-sample request");
  if (auto ok = check_top(s.sample.top_logprobs); !ok) return ok;
  return check_token(s.sample.token, s.sample.logprob, 0);
}

/// A batch holds 1 or more tokens, a logprob, a top-logprob list and a non-negative age each;
/// an embedding request's, no tokens and a finite vector.
expected<void> request_policy::check_batch(const engine::token_batch& b) const {
  if (auto ok = check_finish(b.finish); !ok) return ok;
  const auto finite = [](float v) { return std::isfinite(v); };
  if (request_.pooling != engine::pooling_mode::none)
    return !b.tokens.empty() || b.embedding.empty() || b.scheduled_age_ns < 0 ||
                   !std::all_of(b.embedding.begin(), b.embedding.end(), finite)
               ? fail(errc::internal, "the engine answered an embedding request without a finite vector")
               : expected<void>{};
  if (!b.embedding.empty()) return fail(errc::internal, "the engine sent an embedding for a completion");
  const size_t n = b.tokens.size();
  if (n == 0) return fail(errc::internal, "the engine sent an empty batch of tokens");
  if (b.logprobs.size() != n || b.top_logprobs.size() != n || b.age_ns.size() != n)
    return fail(errc::internal, "the engine sent a batch of " + std::to_string(n) + " tokens with " +
                                    std::to_string(b.logprobs.size()) + " logprobs, " +
                                    std::to_string(b.top_logprobs.size()) + " top-logprob lists and " +
                                    std::to_string(b.age_ns.size()) + " ages");
  const auto negative = [](int64_t age) { return age < 0; };
  if (b.scheduled_age_ns < 0 || std::any_of(b.age_ns.begin(), b.age_ns.end(), negative))
    return fail(errc::internal, "the engine sent a batch with a negative age");
  for (size_t i = 0; i < n; i++) {
    if (auto ok = check_top(b.top_logprobs[i]); !ok) return ok;
    if (auto ok = check_token(b.tokens[i], b.logprobs[i], static_cast<int64_t>(i)); !ok) return ok;
  }
  return {};
}

bool request_policy::accept(const expected<void>& ok, effects& out) {
  if (ok) return true;
  out.emplace_back(std::in_place_type<release_engines>);
  fail_request(ok.error().code, ok.error().message, out);
  return false;
}

effects request_policy::on_token(const engine::sample_event& s, int64_t scheduled_at_ns, int64_t now_ns) {
  TROUPE_ASSERT(!done_);
  effects out;
  if (accept(check_sampled(s), out)) take_token(s, scheduled_at_ns, now_ns, now_ns, out);
  return out;
}

/// The tokens of a batched request, each at its own time: its age before `now_ns`.
effects request_policy::on_batch(const engine::token_batch& b, int64_t now_ns) {
  TROUPE_ASSERT(!done_);
  effects out;
  if (!accept(check_batch(b), out)) return out;
  if (request_.pooling != engine::pooling_mode::none) {  // no tokens: the vector ends it
    end_.ttft_ns = now_ns - arrival_ns_;
    end_.queue_ns = now_ns - b.scheduled_age_ns - arrival_ns_;
    end_.num_preemptions = b.num_preemptions;
    end_.num_recomputed_tokens = b.num_recomputed_tokens;
    end_.embedding = b.embedding;
    finish(engine::finish_reason::stop, now_ns, out);
    return out;
  }
  const size_t n = b.tokens.size();
  engine::sample_event s{b.request, 0, {0, 0.0f, {}}, engine::finish_reason::none, 0, 0, 0};
  for (size_t i = 0; i < n && !done_; i++) {
    s.sample.token = b.tokens[i];
    s.sample.logprob = b.logprobs[i];
    s.sample.top_logprobs = b.top_logprobs[i];
    if (i + 1 == n) {
      s.finish = b.finish;
      s.num_cached_tokens = b.num_cached_tokens;
      s.num_preemptions = b.num_preemptions;
      s.num_recomputed_tokens = b.num_recomputed_tokens;
    }
    take_token(s, now_ns - b.scheduled_age_ns, now_ns - b.age_ns[i], now_ns, out);
  }
  return out;
}

/// One token, sampled at `at_ns` (the arrival time, or earlier for a batch).
void request_policy::take_token(const engine::sample_event& s, int64_t scheduled_at_ns, int64_t at_ns, int64_t now_ns,
                              effects& out) {
  if (end_.num_generated_tokens++ == 0)
    end_.ttft_ns = at_ns - arrival_ns_;
  else
    end_.itl_ns.push_back(at_ns - last_token_ns_);
  last_token_ns_ = at_ns;
  if (s.finish != engine::finish_reason::none) {
    end_.num_cached_tokens = s.num_cached_tokens;
    end_.num_preemptions = s.num_preemptions;
    end_.num_recomputed_tokens = s.num_recomputed_tokens;
    end_.queue_ns = scheduled_at_ns - arrival_ns_;
  }
  if (!out_ && text_mode_) {
    const completion_request& p = o_.params;
    // Llama 3.x's bare JSON calls: a chat with tools, its output free (no grammar), on its vocabulary.
    const bool bare_json_calls = !p.messages.empty() && !p.tools.empty() && p.grammar_kind.empty() && o_.tags.python_tag >= 0;
    out_.emplace(*o_.tok, request_.prompt, request_.stop, p.messages.empty() ? output_tags{} : o_.tags, bare_json_calls);
  }
  output_channels::delta d = text_mode_ ? out_->push(s.sample.token) : output_channels::delta{};
  const bool stopped = d.stopped;
  take_text(std::move(d));
  pending_.tokens.push_back(s.sample.token);
  generated_.push_back(s.sample.token);
  pending_.logprobs.push_back(s.sample.logprob);
  pending_.top_logprobs.push_back(s.sample.top_logprobs);
  if (o_.params.stream) flush(out);
  if (stopped) {
    out.push_back(release_engines{});
    finish(engine::finish_reason::stop, now_ns, out);
  } else if (s.finish != engine::finish_reason::none) {
    finish(s.finish, now_ns, out);
  }
}

effects request_policy::rejected(errc code, const std::string& message) {
  TROUPE_ASSERT(!done_);
  effects out{release_engines{}};
  if (is_valid(code))
    fail_request(code, message, out);
  else
    fail_request(errc::internal,
         "the engine rejected the request with an unknown error code " + std::to_string(static_cast<int>(code)) +
             ": " + message,
         out);
  return out;
}

effects request_policy::engine_lost(engine_role role, const std::string& why) {
  return place_again(role, why, /*drained=*/false);
}

effects request_policy::place_again(engine_role role, const std::string& why, bool drained) {
  TROUPE_ASSERT(!done_);
  TROUPE_ASSERT(role == engine_role::prefill ? placed_.has_prefill : placed_.has_decode);
  if (role == engine_role::prefill && handed_over_) return {};  // it finished its part
  effects out{release_engines{}};
  const std::string lost = (role == engine_role::prefill ? placed_.prefill_name : placed_.decode_name) +
                           " serving this request is lost: " + why;
  if (num_failovers_ >= o_.max_failovers) {
    fail_request(errc::unavailable,
                 lost + (o_.max_failovers > 0 ? " (placed again " + std::to_string(num_failovers_) + " times already)" : ""),
                 out);
    return out;
  }
  // Placed again: the prompt plus what the client has (request_policy::placed).
  num_failovers_++;
  placed_ = {};
  handed_over_ = false;
  const std::vector<int32_t> prompt = resumed_prompt();
  std::vector<uint64_t> prefix_hashes;
  if (o_.prefix_block_size > 0) prefix_hashes = kv::chain_hashes(prompt, o_.prefix_block_size);
  ask_placement again;
  again.request_id = o_.id;
  again.num_prompt_tokens = static_cast<int32_t>(prompt.size());
  again.max_tokens = request_.max_tokens - static_cast<int32_t>(generated_.size());
  again.prefix_hashes = std::move(prefix_hashes);
  again.again = true;
  again.lost = role;
  again.drained = drained;
  out.emplace_back(std::move(again));
  return out;
}

effects request_policy::forwarded(engine_role role, const std::string& why, std::optional<engine::kv_data> kv) {
  effects out = place_again(role, why, /*drained=*/true);
  if (!done_ && kv && kv->consistent()) forwarded_kv_ = std::move(kv);
  return out;
}

effects request_policy::cancel(int64_t now_ns) {
  TROUPE_ASSERT(!done_);
  effects out{release_engines{}};
  finish(engine::finish_reason::cancelled, now_ns, out);
  return out;
}

effects request_policy::client_lost() {
  TROUPE_ASSERT(!done_);
  done_ = true;
  return {release_engines{}, stop{}};
}

std::vector<int32_t> request_policy::resumed_prompt() const {
  std::vector<int32_t> prompt = request_.prompt;
  prompt.insert(prompt.end(), generated_.begin(), generated_.end());
  return prompt;
}

void request_policy::take_text(output_channels::delta d) {
  pending_.text += d.content;
  pending_.reasoning_text += d.reasoning;
  for (tool_call& c : d.tool_calls) pending_.tool_calls.push_back(std::move(c));
}

/// Sends what is pending as one chunk, if anything is.
void request_policy::flush(effects& out) {
  if (pending_.text.empty() && pending_.tokens.empty() && pending_.reasoning_text.empty() &&
      pending_.tool_calls.empty())
    return;
  pending_.request_id = o_.id;
  pending_.stream = o_.stream;
  pending_.sequence = num_chunks_++;
  out.push_back(send_chunk{std::exchange(pending_, completion_chunk{})});
}

void request_policy::finish(engine::finish_reason reason, int64_t now_ns, effects& out) {
  if (out_) take_text(out_->finish());
  flush(out);
  end_.finish_reason = reason;
  end_.num_chunks = num_chunks_;
  end_.num_failovers = num_failovers_;
  end_.e2e_ns = now_ns - arrival_ns_;
  out.push_back(send_end{end_});
  out.push_back(stop{});
  done_ = true;
}

void request_policy::fail_request(errc code, const std::string& message, effects& out) {
  out.push_back(send_error{completion_error{o_.id, o_.stream, code, message, num_chunks_}});
  out.push_back(stop{});
  done_ = true;
}

void request_policy::check_invariants() const {
  TROUPE_ASSERT(num_chunks_ >= 0);
  TROUPE_ASSERT(pending_.tokens.size() == pending_.logprobs.size());
  TROUPE_ASSERT(pending_.tokens.size() == pending_.top_logprobs.size());
  TROUPE_ASSERT(!o_.params.stream || pending_.tokens.empty());  // streamed: each token is sent at once
  const size_t gaps = end_.num_generated_tokens > 0 ? static_cast<size_t>(end_.num_generated_tokens) - 1 : 0;
  TROUPE_ASSERT(end_.itl_ns.size() == gaps);
  TROUPE_ASSERT(generated_.size() == static_cast<size_t>(end_.num_generated_tokens));
  TROUPE_ASSERT(num_failovers_ >= 0 && num_failovers_ <= o_.max_failovers);
  TROUPE_ASSERT(!placed_.has_prefill || placed_.has_decode);
  TROUPE_ASSERT(!out_ || text_mode_);
  if (out_) out_->check_invariants();
}

}  // namespace troupe::serve
