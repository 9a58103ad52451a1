#include "actors/request_actor.hpp"

#include <optional>

#include <caf/all.hpp>

#include "actors/clock.hpp"
#include "messages/engine.hpp"
#include "runtime/engine/output_stream.hpp"

namespace troupe::actors {
namespace {

struct request_state {
  request_options o;
  engine::request request;
  std::optional<engine::output_stream> out;  // made on the first token: stops are validated then
  caf::actor_clock::time_point arrival;
  caf::actor_clock::time_point last_token;
  msg::completion_end end;
  msg::completion_chunk pending;  // what is not sent yet (everything, when not streaming)
  static inline const char* name = "request";
};

using request_actor_t = caf::stateful_actor<request_state>;

void fail_request(request_actor_t* self, const std::string& code, const std::string& message) {
  self->send(self->state.o.client, msg::completion_error{self->state.o.id, code, message});
  self->quit();
}

/// Sends what is pending as one chunk, if anything is.
void flush(request_actor_t* self) {
  msg::completion_chunk& c = self->state.pending;
  if (c.text.empty() && c.tokens.empty()) return;
  c.request_id = self->state.o.id;
  self->send(self->state.o.client, std::move(c));
  c = msg::completion_chunk{};
}

void finish(request_actor_t* self, const std::string& reason) {
  request_state& st = self->state;
  if (st.out) st.pending.text += st.out->finish().text;
  flush(self);
  st.end.finish_reason = reason;
  st.end.e2e_ns = ns_between(st.arrival, self->clock().now());
  self->send(st.o.client, st.end);
  self->quit();
}

void on_token(request_actor_t* self, const msg::sampled& s) {
  request_state& st = self->state;
  const auto now = self->clock().now();
  if (st.end.num_generated_tokens++ == 0)
    st.end.ttft_ns = ns_between(st.arrival, now);
  else
    st.end.itl_ns.push_back(ns_between(st.last_token, now));
  st.last_token = now;
  if (s.finish != "none") {
    st.end.num_cached_tokens = s.num_cached_tokens;
    st.end.num_preemptions = s.num_preemptions;
    st.end.queue_ns = s.scheduled_at_ns - ns_since_epoch(st.arrival);
  }
  const bool text_mode = st.o.params.prompt_tokens.empty();
  if (!st.out && text_mode) st.out.emplace(*st.o.tok, st.request.prompt, st.request.stop);
  const engine::output_stream::delta d = text_mode ? st.out->push(s.token) : engine::output_stream::delta{};
  st.pending.text += d.text;
  st.pending.tokens.push_back(s.token);
  st.pending.logprobs.push_back(s.logprob);
  if (st.o.params.stream) flush(self);
  if (d.stopped) {
    self->send(st.o.engine, msg::release{st.o.id});
    finish(self, "stop");
  } else if (s.finish != "none") {
    finish(self, s.finish);
  }
}

/// Tokenizes and submits; false (after telling the client) when the prompt is unusable.
bool start(request_actor_t* self) {
  request_state& st = self->state;
  const msg::completion_request& p = st.o.params;
  if (!p.prompt_tokens.empty() && (!p.prompt.empty() || !p.stop.empty())) {
    fail_request(self, to_string(errc::invalid_argument),
                 "a request with prompt_tokens takes no text prompt and no stop strings");
    return false;
  }
  auto prompt = p.prompt_tokens.empty() ? st.o.tok->encode(p.prompt, /*add_bos=*/true, /*add_eos=*/false)
                                        : expected<std::vector<int32_t>>(p.prompt_tokens);
  if (!prompt) {
    fail_request(self, to_string(prompt.error().code), prompt.error().message);
    return false;
  }
  engine::request& r = st.request;
  r.id = st.o.id;
  r.prompt = std::move(*prompt);
  r.max_tokens = p.max_tokens;
  r.sampling = {p.temperature, p.top_p, p.top_k, p.min_p, p.num_top_logprobs};
  r.seed = p.has_seed ? p.seed : st.o.drawn_seed;
  r.stop = p.stop;
  r.ignore_eos = p.ignore_eos;
  r.priority = p.priority;
  st.end.request_id = r.id;
  st.end.seed = r.seed;
  st.end.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
  self->send(st.o.engine, msg::submit{r});
  return true;
}

caf::behavior request_actor(request_actor_t* self, request_options options) {
  self->state.o = std::move(options);
  self->state.arrival = self->clock().now();
  self->monitor(self->state.o.client);
  self->monitor(self->state.o.engine);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == self->state.o.client.address()) {  // nobody listens: free the engine's blocks
      self->send(self->state.o.engine, msg::release{self->state.o.id});
      self->quit();
    } else {
      fail_request(self, "internal", "the engine serving this request is gone: " + self->system().render(dm.reason));
    }
  });
  if (!start(self)) return {};
  return {
      [=](msg::sampled& s) { on_token(self, s); },
      [=](msg::rejected& r) { fail_request(self, r.code, r.message); },
      [=](msg::cancel_request&) {
        self->send(self->state.o.engine, msg::release{self->state.o.id});
        finish(self, "cancelled");
      },
  };
}

}  // namespace

caf::actor spawn_request(caf::local_actor* parent, request_options options) {
  return parent->spawn(request_actor, std::move(options));
}

}  // namespace troupe::actors
