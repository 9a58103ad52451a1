#include "actors/request_actor.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/boundary.hpp"
#include "actors/clock.hpp"
#include "actors/cluster_messages.hpp"
#include "runtime/engine/output_stream.hpp"
#include "runtime/model/checkpoint.hpp"

namespace troupe::actors {
namespace {

struct request_state {
  request_options o;
  engine::request request;
  msg::placement placed;   // the engines serving it, once the balancer answered
  bool handed_over = false;  // the prefill engine is done with it
  bool text_mode = true;     // a text prompt (not prompt_tokens): detokenize the output
  std::optional<engine::output_stream> out;  // made on the first token: stops are validated then
  caf::actor_clock::time_point arrival;
  caf::actor_clock::time_point last_token;
  msg::completion_end end;
  msg::completion_chunk pending;  // what is not sent yet (everything, when not streaming)
  int32_t num_chunks = 0;         // sent so far: the next chunk's sequence number
  bool ended = false;             // quit: what is left of a message being handled is ignored
  static inline const char* name = "request";
};

using request_actor_t = request_actor::stateful_base<request_state>;

/// Tells every engine holding the request to drop it (an unknown id is a no-op there).
void release(request_actor_t* self) {
  const msg::placement& p = self->state.placed;
  if (p.prefill) self->send(p.prefill, msg::release{self->state.o.id});
  if (p.decode) self->send(p.decode, msg::release{self->state.o.id});
}

/// Ends the actor. Its monitors go first: CAF 0.17 keeps a monitor (and the weak reference in
/// it, which keeps this actor's memory allocated) in the monitored actor until that one dies,
/// so a long-lived engine would collect one per request it served (docs/resources.md).
void stop(request_actor_t* self) {
  const msg::placement& p = self->state.placed;
  if (p.prefill) self->demonitor(p.prefill.address());
  if (p.decode) self->demonitor(p.decode.address());
  if (self->state.o.client) self->demonitor(self->state.o.client.address());
  self->state.ended = true;
  self->quit();
}

void fail_request(request_actor_t* self, errc code, const std::string& message) {
  self->send(self->state.o.client,
             msg::completion_error{self->state.o.id, self->state.o.stream, code, message, self->state.num_chunks});
  stop(self);
}

/// Sends what is pending as one chunk, if anything is.
void flush(request_actor_t* self) {
  msg::completion_chunk& c = self->state.pending;
  if (c.text.empty() && c.tokens.empty()) return;
  c.request_id = self->state.o.id;
  c.stream = self->state.o.stream;
  c.sequence = self->state.num_chunks++;
  self->send(self->state.o.client, std::move(c));
  c = msg::completion_chunk{};
}

void finish(request_actor_t* self, engine::finish_reason reason) {
  request_state& st = self->state;
  if (st.out) st.pending.text += st.out->finish().text;
  flush(self);
  st.end.finish_reason = reason;
  st.end.num_chunks = st.num_chunks;
  st.end.e2e_ns = ns_between(st.arrival, self->clock().now());
  self->send(st.o.client, st.end);
  stop(self);
}

/// One token, sampled at `now` (the arrival time, or earlier for a batch).
void on_token(request_actor_t* self, const msg::sampled& s, caf::actor_clock::time_point now) {
  request_state& st = self->state;
  if (st.end.num_generated_tokens++ == 0)
    st.end.ttft_ns = ns_between(st.arrival, now);
  else
    st.end.itl_ns.push_back(ns_between(st.last_token, now));
  st.last_token = now;
  if (s.finish != engine::finish_reason::none) {
    st.end.num_cached_tokens = s.num_cached_tokens;
    st.end.num_preemptions = s.num_preemptions;
    st.end.num_recomputed_tokens = s.num_recomputed_tokens;
    st.end.queue_ns = s.scheduled_at_ns - ns_since_epoch(st.arrival);
  }
  if (!st.out && st.text_mode) st.out.emplace(*st.o.tok, st.request.prompt, st.request.stop);
  const engine::output_stream::delta d = st.text_mode ? st.out->push(s.token) : engine::output_stream::delta{};
  st.pending.text += d.text;
  st.pending.tokens.push_back(s.token);
  st.pending.logprobs.push_back(s.logprob);
  if (st.o.params.stream) flush(self);
  if (d.stopped) {
    release(self);
    finish(self, engine::finish_reason::stop);
  } else if (s.finish != engine::finish_reason::none) {
    finish(self, s.finish);
  }
}

/// The tokens of a batched request, each at its own time: its age before this message.
void on_batch(request_actor_t* self, msg::sampled_batch& b) {
  const auto now = self->clock().now();
  const auto at = [&](int64_t age_ns) {
    return now - std::chrono::duration_cast<caf::actor_clock::time_point::duration>(std::chrono::nanoseconds(age_ns));
  };
  const size_t n = b.tokens.size();
  msg::sampled s{b.request_id, 0, 0, 0.0f, {}, engine::finish_reason::none, 0, 0, 0, 0};
  for (size_t i = 0; i < n; i++) {
    s.token = b.tokens[i];
    s.logprob = b.logprobs[i];
    s.top_logprobs = std::move(b.top_logprobs[i]);
    if (i + 1 == n) {
      s.finish = b.finish;
      s.num_cached_tokens = b.num_cached_tokens;
      s.num_preemptions = b.num_preemptions;
      s.num_recomputed_tokens = b.num_recomputed_tokens;
      s.scheduled_at_ns = ns_since_epoch(at(b.scheduled_age_ns));
    }
    on_token(self, s, at(b.age_ns[i]));
    if (self->state.ended) return;  // a stop string completed: the rest is not output
  }
}

void on_placement(request_actor_t* self, msg::placement p) {
  request_state& st = self->state;
  if (!p.error.empty()) {
    fail_request(self, errc::unavailable, p.error);
    return;
  }
  if (!p.decode) {
    fail_request(self, errc::unavailable, "the balancer's placement names no decode engine");
    return;
  }
  st.placed = std::move(p);
  const msg::placement& placed = st.placed;
  self->monitor(placed.decode);
  // Only detokenization needs the prompt here afterwards: without it, the request moves out.
  engine::request r = st.text_mode ? st.request : std::move(st.request);
  if (!placed.prefill) {
    self->send(placed.decode, msg::submit{std::move(r)});
    return;
  }
  self->monitor(placed.prefill);
  self->send(placed.prefill, msg::submit_prefill{std::move(r), placed.decode, placed.kv_host, placed.kv_port});
}

/// Refuses a text prompt too long in bytes to fit the context in any tokenization, before
/// tokenizing it: encoding holds several words per byte (a 64 MB prompt took over 1 GB).
expected<void> check_prompt_bytes(const request_state& st) {
  if (!st.text_mode) return {};  // token ids are checked by the engine (and need no tokenizer)
  const int32_t context = st.o.context_tokens > 0 ? st.o.context_tokens : model::header_value_max;
  const int64_t bytes_max = st.o.tok->max_text_bytes(context);
  const int64_t bytes = static_cast<int64_t>(st.o.params.prompt.size());
  if (bytes <= bytes_max) return {};
  return fail(errc::too_long, "the prompt is " + std::to_string(bytes) + " bytes; a " + std::to_string(context) +
                                  "-token context holds at most " + std::to_string(bytes_max) + " (" +
                                  std::to_string(st.o.tok->max_token_length()) + " bytes per token at most)");
}

/// Tokenizes and asks for a placement, or tells the client why the prompt is unusable and ends.
void start(request_actor_t* self) {
  request_state& st = self->state;
  const msg::completion_request& p = st.o.params;
  if (!p.prompt_tokens.empty() && (!p.prompt.empty() || !p.stop.empty())) {
    fail_request(self, errc::invalid_argument,
                 "a request with prompt_tokens takes no text prompt and no stop strings");
    return;
  }
  st.text_mode = p.prompt_tokens.empty();
  if (auto fits = check_prompt_bytes(st); !fits) {
    fail_request(self, fits.error().code, fits.error().message);
    return;
  }
  auto prompt = st.text_mode ? st.o.tok->encode(p.prompt, /*add_bos=*/true, /*add_eos=*/false)
                             : expected<std::vector<int32_t>>(std::move(st.o.params.prompt_tokens));
  if (!prompt) {
    fail_request(self, prompt.error().code, prompt.error().message);
    return;
  }
  engine::request& r = st.request;
  r.id = st.o.id;
  r.prompt = std::move(*prompt);
  r.max_tokens = p.max_tokens;
  r.sampling = {p.temperature, p.top_p, p.top_k, p.min_p, p.num_top_logprobs};
  // Checked here too, before the request crosses to an engine on another node: CAF 0.17.6
  // serializes an infinite float in an endless loop (detail::pack754), stalling this node's
  // network thread. (Without a tokenizer, the simulator's case, the engine checks them.)
  if (st.o.tok)
    if (auto ok = sampling::validate(r.sampling, st.o.tok->vocab_size()); !ok) {
      fail_request(self, ok.error().code, ok.error().message);
      return;
    }
  r.seed = p.has_seed ? p.seed : st.o.drawn_seed;
  r.stop = p.stop;
  r.ignore_eos = p.ignore_eos;
  r.priority = p.priority;
  // Nobody sees a non-streamed completion before its end; without stop strings nothing needs
  // its tokens one by one either: one message instead of one per token.
  r.batch_tokens = !p.stream && r.stop.empty();
  st.end.request_id = r.id;
  st.end.stream = st.o.stream;
  st.end.seed = r.seed;
  st.end.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
  self->request(st.o.balancer, caf::infinite, msg::place_request{r.id, st.end.num_prompt_tokens, r.max_tokens})
      .then([=](msg::placement& p) { on_placement(self, std::move(p)); },
            [=](caf::error& e) { fail_request(self, errc::unavailable, "no placement: " + self->system().render(e)); });
}

/// `engine` is lost (`why`): if it serves this request, the request fails naming it.
void on_engine_lost(request_actor_t* self, const caf::actor_addr& engine, const std::string& why) {
  request_state& st = self->state;
  const bool prefill = st.placed.prefill && engine == st.placed.prefill.address();
  if (prefill && st.handed_over) return;  // it finished its part
  if (!prefill && !(st.placed.decode && engine == st.placed.decode.address())) return;
  release(self);
  fail_request(self, errc::unavailable,
               (prefill ? st.placed.prefill_name : st.placed.decode_name) + " serving this request is lost: " + why);
}

// ---- what engines send, checked: an engine may be another process (issue 21, point 3) ----

/// Whether `token` can be this request's output: in the vocabulary (when a tokenizer is known),
/// within max_tokens with the `num_before` tokens before it, with a finite logprob (a sampled
/// token has a probability > 0; an infinite float would stall CAF's serializer, see start()).
expected<void> check_token(const request_state& st, int32_t token, float logprob, int64_t num_before) {
  if (!std::isfinite(logprob))
    return fail(errc::internal, "the engine sent token " + std::to_string(token) + " with a logprob that is not finite");
  if (st.o.tok && !st.o.tok->is_valid_id(token))
    return fail(errc::internal, "the engine sent token " + std::to_string(token) + ", outside the vocabulary [0, " +
                                    std::to_string(st.o.tok->vocab_size()) + ")");
  if (st.end.num_generated_tokens + num_before >= st.o.params.max_tokens)
    return fail(errc::internal,
                "the engine sent more than the " + std::to_string(st.o.params.max_tokens) + " tokens asked for");
  return {};
}

/// A finish reason this version knows (an out-of-range value is representable, not trusted).
expected<void> check_finish(engine::finish_reason finish) {
  if (is_valid(finish)) return {};
  return fail(errc::internal, "the engine sent an unknown finish reason " + std::to_string(static_cast<int>(finish)));
}

expected<void> check_sampled(const request_state& st, const msg::sampled& s) {
  if (auto ok = check_finish(s.finish); !ok) return ok;
  if (s.sample_index != 0)
    return fail(errc::internal, "the engine sent sample " + std::to_string(s.sample_index) + " of a one-sample request");
  return check_token(st, s.token, s.logprob, 0);
}

/// A batch holds 1 or more tokens, a logprob, a top-logprob list and a non-negative age each.
expected<void> check_batch(const request_state& st, const msg::sampled_batch& b) {
  if (auto ok = check_finish(b.finish); !ok) return ok;
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
  for (size_t i = 0; i < n; i++)
    if (auto ok = check_token(st, b.tokens[i], b.logprobs[i], static_cast<int64_t>(i)); !ok) return ok;
  return {};
}

/// Whether a message from an engine about request `id` is for this request: one for another
/// is dropped with a warning (it cannot be this request's answer).
bool addressed_here(request_actor_t* self, int64_t id, const char* what) {
  if (id == self->state.o.id) return true;
  spdlog::warn("request {}: dropped {} for request {}", self->state.o.id, what, id);
  return false;
}

/// Whether `ok`; if not, the request fails with its message (and its engines release it): an
/// engine that sent it is broken or an impostor, and the answer can no longer be trusted.
bool accept(request_actor_t* self, const expected<void>& ok) {
  if (ok) return true;
  spdlog::warn("request {}: {}", self->state.o.id, ok.error().message);
  release(self);
  fail_request(self, ok.error().code, ok.error().message);
  return false;
}

request_actor::behavior_type handlers(request_actor_t* self) {
  return {
      [=](msg::sampled& s) {
        if (addressed_here(self, s.request_id, "a token") && accept(self, check_sampled(self->state, s)))
          on_token(self, s, self->clock().now());
      },
      [=](msg::sampled_batch& b) {
        if (addressed_here(self, b.request_id, "a batch of tokens") && accept(self, check_batch(self->state, b)))
          on_batch(self, b);
      },
      [=](msg::rejected& r) {
        release(self);
        if (is_valid(r.code))
          fail_request(self, r.code, r.message);
        else
          fail_request(self, errc::internal, "the engine rejected the request with an unknown error code " +
                                                 std::to_string(static_cast<int>(r.code)) + ": " + r.message);
      },
      [=](msg::prefilled&) { self->state.handed_over = true; },
      [=](msg::engine_lost& l) { on_engine_lost(self, l.engine.address(), l.reason); },
      [=](msg::cancel_request&) {
        release(self);
        finish(self, engine::finish_reason::cancelled);
      },
  };
}

request_actor::behavior_type request_behavior(request_actor_t* self, request_options options) {
  self->state.o = std::move(options);
  self->state.arrival = self->clock().now();
  guard_boundary(self);
  // The balancer refuses requests without a client; a null handle here would crash monitor()
  // (CAF dereferences the null control block at offset 0x40), so it ends the request instead.
  // (A typed actor returns its behavior even when it quit at once: CAF then never runs it.)
  if (!self->state.o.client) {
    spdlog::warn("request {}: no client to answer; dropped", self->state.o.id);
    self->quit();
    return handlers(self);
  }
  self->monitor(self->state.o.client);
  self->set_down_handler([=](caf::down_msg& dm) {
    request_state& st = self->state;
    if (dm.source == st.o.client.address()) {  // nobody listens: free the engines' blocks
      release(self);
      stop(self);
      return;
    }
    on_engine_lost(self, dm.source, self->system().render(dm.reason));
  });
  start(self);
  return handlers(self);
}
}  // namespace

request_actor spawn_request(caf::local_actor* parent, request_options options) {
  return parent->spawn(request_behavior, std::move(options));
}

}  // namespace troupe::actors
