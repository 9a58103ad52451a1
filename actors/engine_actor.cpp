#include "actors/engine_actor.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/atoms.hpp"
#include "actors/clock.hpp"
#include "actors/executor_actor.hpp"
#include "messages/kv_payload.hpp"

namespace troupe::actors {
namespace {

struct engine_state {
  engine_options options;
  std::unique_ptr<engine::engine_core> core;
  caf::actor executor;
  int64_t generation = 0;  // bumped when an executor fails: late replies of the old one are dropped
  struct live_request {
    caf::actor actor;              // its request actor
    int64_t scheduled_at_ns = 0;   // engine clock when first planned; 0 = not yet
    bool batch = false;            // engine::request::batch_tokens: collect into `tokens`
    msg::sampled_batch tokens;     // age_ns holds each token's engine clock until sent
  };
  std::map<engine::request_id, live_request> requests;
  std::map<caf::actor_addr, engine::request_id> request_of_actor;  // to release a dead one's work
  /// Prefill engine: where each prefill-only request goes next.
  struct handoff_target {
    caf::actor decode;
    caf::actor request_actor;
    std::string kv_host;
    uint16_t kv_port = 0;
  };
  std::map<engine::request_id, handoff_target> handoffs;
  std::map<uint64_t, msg::kv_handoff> awaiting_kv;  // decode engine: handoffs whose KV is on UCX
  uint64_t next_ucx_tag = 0;
  // Load reports.
  caf::actor balancer;
  int32_t engine_index = 0;
  caf::timespan report_interval{0};
  caf::actor_clock::time_point last_report;
  bool report_due = false;   // a delayed report_atom is pending
  int64_t num_received = 0;  // submits, prefills and handoffs
  msg::engine_report report;
  caf::actor_clock::time_point started;
  caf::actor_clock::time_point busy_since;
  static inline const char* name = "engine";
};

using engine_actor_t = caf::stateful_actor<engine_state>;

const model::model_config& model_of(const engine_options& o) {
  return o.checkpoint ? o.checkpoint->config() : o.model;
}

std::unique_ptr<engine::engine_core> make_core(const engine_options& o) {
  auto core = engine::engine_core::create(model_of(o), o.bos_id, o.eos_id, o.config);
  TROUPE_ASSERT_MSG(core.has_value(), "engine options are validated in spawn_engine");
  return std::move(*core);
}

void start_executor(engine_actor_t* self) {
  const engine_options& o = self->state.options;
  const caf::actor engine = caf::actor_cast<caf::actor>(self);
  self->state.executor = o.make_executor
                             ? o.make_executor(self->system(), engine)
                             : spawn_executor(self->system(), engine,
                                              executor_settings{o.checkpoint, o.config.num_kv_blocks,
                                                                o.config.block_size, o.config.kernels,
                                                                o.executor_threads, o.detached_executor, o.step_log});
  // Monitored, not linked: over a link, an executor killed with exit_reason::kill (which no exit
  // handler can intercept) would take its engine down. The executor monitors its engine in turn.
  self->monitor(self->state.executor);
}

void kick(engine_actor_t* self);

void send_report(engine_actor_t* self) {
  engine_state& st = self->state;
  st.last_report = self->clock().now();
  const engine::engine_stats s = st.core->stats();
  self->send(st.balancer, msg::load_report{st.engine_index, st.num_received,
                                           static_cast<int64_t>(st.requests.size()),
                                           static_cast<int64_t>(s.num_blocks_in_use) * st.core->config().block_size,
                                           st.core->num_queued_prompt_tokens()});
}

/// Something changed: report now, or once the interval since the last report has passed.
void note_change(engine_actor_t* self) {
  engine_state& st = self->state;
  if (!st.balancer || st.report_due) return;
  const auto now = self->clock().now();
  if (now - st.last_report >= st.report_interval) {
    send_report(self);
    return;
  }
  st.report_due = true;
  self->delayed_send(self, st.last_report + st.report_interval - now, report_atom::value);
}

/// Ships each finished prefill's request and KV to its decode engine.
void hand_off(engine_actor_t* self) {
  engine_state& st = self->state;
  for (engine::prefilled_request& p : st.core->take_prefilled()) {
    const engine::request_id id = p.req.id;
    auto it = st.handoffs.find(id);
    TROUPE_ASSERT_MSG(it != st.handoffs.end(), "a prefill without a handoff target");
    const engine_state::handoff_target target = std::move(it->second);
    st.handoffs.erase(it);
    st.requests.erase(id);
    msg::kv_handoff h{std::move(p.req), target.request_actor, msg::encode_kv_payload(id, p.kv), 0};
    if (st.options.kv_sender) {
      h.ucx_tag = st.options.kv_tag_base + st.next_ucx_tag++;
      const caf::actor request_actor = target.request_actor;
      const std::string to = target.kv_host + ":" + std::to_string(target.kv_port);
      st.options.kv_sender->send(target.kv_host, target.kv_port, h.ucx_tag, std::move(h.payload),
                           [request_actor, id, to](expected<void> done) {
                             // On the UCX progress thread: anon_send is thread-safe.
                             if (done) return;
                             caf::anon_send(request_actor, msg::rejected{id, errc::unavailable,
                                                                         "KV transfer to " + to + " failed: " +
                                                                             done.error().message});
                           });
      h.payload.clear();
    }
    self->send(target.request_actor, msg::prefilled{id});
    self->send(target.decode, std::move(h));
  }
}

/// Adds a token to a batched request's message; sends it with the last token.
void collect(engine_actor_t* self, engine_state::live_request& live, const engine::sample_event& e) {
  TROUPE_ASSERT_MSG(e.sample_index == 0, "batched requests have one sample");
  msg::sampled_batch& b = live.tokens;
  const int64_t now = ns_since_epoch(self->clock().now());
  b.request_id = e.request;
  b.tokens.push_back(e.sample.token);
  b.logprobs.push_back(e.sample.logprob);
  b.top_logprobs.push_back(e.sample.top_logprobs);
  b.age_ns.push_back(now);
  if (e.finish == engine::finish_reason::none) return;
  for (int64_t& t : b.age_ns) t = now - t;
  b.finish = e.finish;
  b.num_cached_tokens = e.num_cached_tokens;
  b.num_preemptions = e.num_preemptions;
  b.num_recomputed_tokens = e.num_recomputed_tokens;
  b.scheduled_age_ns = now - live.scheduled_at_ns;
  self->send(live.actor, std::move(b));
}

void on_result(engine_actor_t* self, engine::exec_result& result) {
  engine_state& st = self->state;
  for (const engine::sample_event& e : st.core->complete_step(std::move(result))) {
    auto it = st.requests.find(e.request);
    if (it == st.requests.end()) continue;
    engine_state::live_request& live = it->second;
    if (live.batch) {
      collect(self, live, e);
    } else {
      self->send(live.actor, msg::sampled{e.request, e.sample_index, e.sample.token, e.sample.logprob,
                                          e.sample.top_logprobs, e.finish, e.num_cached_tokens,
                                          e.num_preemptions, e.num_recomputed_tokens, live.scheduled_at_ns});
    }
    if (!st.core->contains(e.request)) st.requests.erase(it);
  }
  for (const engine::failed_request& f : st.core->take_failed()) {
    auto it = st.requests.find(f.id);
    if (it == st.requests.end()) continue;
    spdlog::error("engine: request {} failed: {}", f.id, f.reason.message);
    self->send(it->second.actor, msg::rejected{f.id, f.reason.code, f.reason.message});
    st.handoffs.erase(f.id);
    st.requests.erase(it);
  }
  hand_off(self);
  note_change(self);
  const int32_t every = st.options.check_invariants_every;
  if (every > 0 && st.core->stats().num_steps % every == 0) st.core->check_invariants(/*deep=*/false);
  if (st.core->num_in_flight() == 0) st.report.executor_busy_ns += ns_between(st.busy_since, self->clock().now());
  kick(self);
}

void executor_failed(engine_actor_t* self, const caf::error& reason) {
  engine_state& st = self->state;
  st.generation++;
  st.report.num_executor_failures++;
  const std::string why = "step executor failed: " + self->system().render(reason);
  spdlog::error("engine: {}; failing {} request(s)", why, st.requests.size());
  for (const auto& [id, request] : st.requests) self->send(request.actor, msg::rejected{id, errc::internal, why});
  st.requests.clear();
  st.handoffs.clear();
  st.core = make_core(st.options);
  self->demonitor(st.executor);
  self->send_exit(st.executor, caf::exit_reason::user_shutdown);  // its KV state is lost anyway
  start_executor(self);
}

void kick(engine_actor_t* self) {
  engine_state& st = self->state;
  while (auto plan = st.core->plan_step()) {
    if (st.core->num_in_flight() == 1) st.busy_since = self->clock().now();
    for (const engine::exec_chunk& chunk : plan->chunks) {
      auto it = st.requests.find(st.core->request_of(chunk.seq).value_or(-1));
      if (it != st.requests.end() && it->second.scheduled_at_ns == 0) it->second.scheduled_at_ns = ns_since_epoch(self->clock().now());
    }
    const int64_t generation = st.generation;
    self->request(st.executor, caf::infinite, std::move(*plan))
        .then(
            [=](engine::exec_result& result) {
              if (generation == self->state.generation) on_result(self, result);
            },
            [=](caf::error& err) {
              if (generation == self->state.generation) executor_failed(self, err);
            });
  }
}

/// Queues `r` for `request_actor` through `add` (one of the core's add_* calls, which moves
/// `r`); false (after telling the request actor) when it is refused.
/// `samples` is false for a prefill-only request (its tokens come from the decode engine).
template <class Add>
bool admit(engine_actor_t* self, const engine::request& r, const caf::actor& request_actor, Add&& add,
           bool samples = true) {
  engine_state& st = self->state;
  const engine::request_id id = r.id;
  // Work nobody can receive (a remote message without its sender: see msg::submit_completion)
  // is dropped before it takes a slot; monitor() on a null handle would crash.
  if (!request_actor) {
    spdlog::warn("engine: dropped request {}: it names no request actor to stream to", id);
    return false;
  }
  // Tokens delivered in one message at the end: room for all of them reserved now.
  const int32_t batch_tokens = samples && r.batch_tokens ? r.max_tokens : 0;
  if (st.core->num_waiting() >= st.options.max_waiting) {
    self->send(request_actor, msg::rejected{id, errc::overloaded, "the engine's waiting queue is full (" +
                                                                  std::to_string(st.options.max_waiting) +
                                                                  " requests); retry later"});
    return false;
  }
  if (auto ok = add(); !ok) {
    self->send(request_actor, msg::rejected{id, ok.error().code, ok.error().message});
    return false;
  }
  engine_state::live_request& live =
      st.requests.emplace(id, engine_state::live_request{request_actor, 0, batch_tokens > 0, {}}).first->second;
  if (live.batch) {
    msg::sampled_batch& b = live.tokens;
    b.tokens.reserve(batch_tokens);
    b.logprobs.reserve(batch_tokens);
    b.top_logprobs.reserve(batch_tokens);
    b.age_ns.reserve(batch_tokens);
  }
  // A request actor that dies without releasing its request (killed, its node lost) must not
  // keep generating: watch it.
  st.request_of_actor[request_actor.address()] = id;
  self->monitor(request_actor);
  kick(self);
  note_change(self);
  return true;
}

void submit(engine_actor_t* self, engine::request r) {
  self->state.num_received++;
  admit(self, r, caf::actor_cast<caf::actor>(self->current_sender()),
        [&] { return self->state.core->add_request(std::move(r)); });
}

void submit_prefill(engine_actor_t* self, msg::submit_prefill& s) {
  engine_state& st = self->state;
  st.num_received++;
  const engine::request_id id = s.request.id;
  const caf::actor request_actor = caf::actor_cast<caf::actor>(self->current_sender());
  if (!s.decode) {
    self->send(request_actor, msg::rejected{id, errc::invalid_argument, "a prefill request names no decode engine"});
    return;
  }
  if (admit(self, s.request, request_actor, [&] { return st.core->add_prefill(std::move(s.request)); },
            /*samples=*/false))
    st.handoffs[id] = engine_state::handoff_target{std::move(s.decode), request_actor, std::move(s.kv_host), s.kv_port};
}

/// Decode engine: a request and its KV bytes, decoded and queued.
void accept_handoff(engine_actor_t* self, msg::kv_handoff& h, const std::vector<uint8_t>& bytes) {
  const engine::request_id id = h.request.id;
  auto payload = msg::decode_kv_payload(bytes);
  if (payload && payload->request_id != id)
    payload = fail(errc::invalid_argument, "a KV payload for request " + std::to_string(payload->request_id) +
                                               " arrived for request " + std::to_string(id));
  if (!payload) {
    self->send(h.request_actor, msg::rejected{id, payload.error().code, payload.error().message});
    return;
  }
  admit(self, h.request, h.request_actor,
        [&] { return self->state.core->add_prefilled(std::move(h.request), std::move(payload->kv)); });
}

void on_handoff(engine_actor_t* self, msg::kv_handoff& h) {
  engine_state& st = self->state;
  st.num_received++;
  if (h.ucx_tag == 0) {
    accept_handoff(self, h, h.payload);
    return;
  }
  if (!st.options.kv_sender) {
    self->send(h.request_actor, msg::rejected{h.request.id, errc::internal,
                                              "KV sent over UCX to an engine without a UCX transport"});
    return;
  }
  const uint64_t tag = h.ucx_tag;
  st.awaiting_kv.emplace(tag, std::move(h));
  const caf::actor me = caf::actor_cast<caf::actor>(self);
  st.options.kv_sender->receive(tag, [me, tag](expected<std::vector<uint8_t>> bytes) {
    // On the UCX progress thread: anon_send is thread-safe.
    if (bytes)
      caf::anon_send(me, msg::kv_arrived{tag, std::move(*bytes), {}});
    else
      caf::anon_send(me, msg::kv_arrived{tag, {}, bytes.error().message});
  });
}

void on_kv_arrived(engine_actor_t* self, msg::kv_arrived& a) {
  engine_state& st = self->state;
  auto it = st.awaiting_kv.find(a.tag);
  if (it == st.awaiting_kv.end()) return;
  msg::kv_handoff h = std::move(it->second);
  st.awaiting_kv.erase(it);
  if (!a.error.empty()) {
    self->send(h.request_actor, msg::rejected{h.request.id, errc::unavailable, "KV transfer failed: " + a.error});
    return;
  }
  accept_handoff(self, h, a.bytes);
}

/// Ends a request early (released, or its request actor is gone); it may have finished already.
void drop(engine_actor_t* self, engine::request_id id) {
  engine_state& st = self->state;
  (void)st.core->remove_request(id);
  st.requests.erase(id);
  st.handoffs.erase(id);
  kick(self);
  note_change(self);
}

caf::behavior engine_actor(engine_actor_t* self, engine_options options) {
  engine_state& st = self->state;
  st.options = std::move(options);
  st.core = make_core(st.options);
  st.started = self->clock().now();
  start_executor(self);
  self->set_down_handler([=](caf::down_msg& dm) {
    // A replaced executor's down message may still arrive: its failure was handled already.
    engine_state& st = self->state;
    if (dm.source == st.executor.address()) {
      executor_failed(self, dm.reason ? dm.reason : caf::make_error(caf::exit_reason::normal));
      return;
    }
    auto it = st.request_of_actor.find(dm.source);
    if (it == st.request_of_actor.end()) return;
    if (st.requests.count(it->second)) drop(self, it->second);
    st.request_of_actor.erase(it);
  });
  return {
      [=](msg::submit& s) { submit(self, std::move(s.request)); },
      [=](msg::submit_prefill& s) { submit_prefill(self, s); },
      [=](msg::kv_handoff& h) { on_handoff(self, h); },
      [=](msg::kv_arrived& a) { on_kv_arrived(self, a); },
      [=](msg::release& r) { drop(self, r.request_id); },
      [=](msg::report_to& r) {
        engine_state& st = self->state;
        st.balancer = std::move(r.balancer);
        st.engine_index = r.engine_index;
        st.report_interval = std::chrono::milliseconds(std::max(1, r.interval_ms));
        send_report(self);
      },
      [=](report_atom) {
        self->state.report_due = false;
        send_report(self);
      },
      [=](stats_atom) {
        msg::engine_report report = self->state.report;
        const engine::engine_stats s = self->state.core->stats();
        report.num_steps = s.num_steps;
        report.num_generated_tokens = s.num_generated_tokens;
        report.num_preemptions = s.num_preemptions;
        report.num_waiting = self->state.core->num_waiting();
        report.num_requests = static_cast<int64_t>(self->state.requests.size());
        report.num_blocks_in_use = s.num_blocks_in_use;
        report.elapsed_ns = ns_between(self->state.started, self->clock().now());
        return report;
      },
      [=](executor_atom) { return self->state.executor; },
      [=](ping_atom) { return pong_atom::value; },  // the balancer's heartbeat
  };
}

}  // namespace

expected<caf::actor> spawn_engine(caf::actor_system& sys, const engine_options& options) {
  engine_options o = options;
  o.config.max_steps_in_flight = 2;
  if (!o.checkpoint && !o.make_executor)
    return fail(errc::invalid_argument, "an engine needs a checkpoint or an executor factory");
  auto core = engine::engine_core::create(model_of(o), o.bos_id, o.eos_id, o.config);
  if (!core) return tl::unexpected(core.error());
  if (o.max_waiting <= 0) return fail(errc::invalid_argument, "max_waiting must be > 0");
  if (o.executor_threads < 1) return fail(errc::invalid_argument, "executor_threads must be >= 1");
  if (!o.step_log.empty()) {  // the executor opens it again; fail here, where it can be reported
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> log{std::fopen(o.step_log.c_str(), "a"), &std::fclose};
    if (!log)
      return fail(errc::io_error, "step_log '" + o.step_log + "' cannot be opened for appending: " + std::strerror(errno));
  }
  return sys.spawn(engine_actor, std::move(o));
}

expected<msg::engine_report> query_engine(caf::actor_system& sys, const caf::actor& engine) {
  caf::scoped_actor self{sys};
  expected<msg::engine_report> out = fail(errc::internal, "no answer");
  self->request(engine, std::chrono::seconds(30), stats_atom::value)
      .receive([&](msg::engine_report& r) { out = r; },
               [&](caf::error& e) { out = fail(errc::internal, "engine query failed: " + sys.render(e)); });
  return out;
}

expected<caf::actor> query_executor(caf::actor_system& sys, const caf::actor& engine) {
  caf::scoped_actor self{sys};
  expected<caf::actor> out = fail(errc::internal, "no answer");
  self->request(engine, std::chrono::seconds(30), executor_atom::value)
      .receive([&](caf::actor& a) { out = a; },
               [&](caf::error& e) { out = fail(errc::internal, "engine query failed: " + sys.render(e)); });
  return out;
}

}  // namespace troupe::actors
