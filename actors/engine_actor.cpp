#include "actors/engine_actor.hpp"

#include <algorithm>
#include <map>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/atoms.hpp"
#include "actors/clock.hpp"
#include "actors/executor_actor.hpp"

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
  };
  std::map<engine::request_id, live_request> requests;
  std::map<caf::actor_addr, engine::request_id> request_of_actor;  // to release a dead one's work
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

void on_result(engine_actor_t* self, const engine::exec_result& result) {
  engine_state& st = self->state;
  for (const engine::sample_event& e : st.core->complete_step(result)) {
    auto it = st.requests.find(e.request);
    if (it == st.requests.end()) continue;
    self->send(it->second.actor, msg::sampled{e.request, e.sample_index, e.sample.token, e.sample.logprob,
                                              e.sample.top_logprobs, engine::to_string(e.finish),
                                              e.num_cached_tokens, e.num_preemptions,
                                              it->second.scheduled_at_ns});
    if (!st.core->contains(e.request)) st.requests.erase(it);
  }
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
  for (const auto& [id, request] : st.requests) self->send(request.actor, msg::rejected{id, "internal", why});
  st.requests.clear();
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

void submit(engine_actor_t* self, engine::request r) {
  engine_state& st = self->state;
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  const engine::request_id id = r.id;
  if (st.core->num_waiting() >= st.options.max_waiting) {
    self->send(sender, msg::rejected{id, "overloaded", "the engine's waiting queue is full (" +
                                                           std::to_string(st.options.max_waiting) +
                                                           " requests); retry later"});
    return;
  }
  if (auto ok = st.core->add_request(std::move(r)); !ok) {
    self->send(sender, msg::rejected{id, to_string(ok.error().code), ok.error().message});
    return;
  }
  st.requests.emplace(id, engine_state::live_request{sender, 0});
  // A request actor that dies without releasing its request (killed, its node lost) must not
  // keep generating: watch it.
  st.request_of_actor[sender.address()] = id;
  self->monitor(sender);
  kick(self);
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
    if (st.requests.count(it->second)) {
      (void)st.core->remove_request(it->second);
      st.requests.erase(it->second);
      kick(self);
    }
    st.request_of_actor.erase(it);
  });
  return {
      [=](msg::submit& s) { submit(self, std::move(s.request)); },
      [=](msg::release& r) {
        (void)self->state.core->remove_request(r.request_id);  // it may have finished already
        self->state.requests.erase(r.request_id);
        kick(self);
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
