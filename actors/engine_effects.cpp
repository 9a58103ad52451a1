#include "actors/engine_effects.hpp"

#include <algorithm>
#include <string>
#include <variant>

#include <spdlog/spdlog.h>

#include "actors/system/atoms.hpp"
#include "actors/system/clock.hpp"
#include "actors/system/network_limits.hpp"
#include "actors/system/sync_guard.hpp"
#include "messages/cache_tier.hpp"
#include "messages/kv_payload.hpp"

namespace troupe::actors {
namespace {

/// Sends a plan to the executor; its result (or failure) goes to the policy.
void send_plan(engine_actor_t* self, engine::send_plan& p) {
  const int64_t generation = p.generation;
  self->request(self->state.executor, caf::infinite, std::move(p.plan), std::move(p.grammars))
      .then([=](engine::exec_result& r) {
              perform(self, self->state.policy->on_step_result(generation, std::move(r), now_ns(self)));
            },
            [=](caf::error& err) { executor_failed(self, generation, err); });
}

/// Ships a prefilled request and its KV to its decode engine (the KV over UCX when tagged).
void hand_off(engine_actor_t* self, engine::hand_off& h) {
  const engine::request_id id = h.prefilled.req.id;
  const request_actor to = client_of(self, id);
  const engine_actor& decode = self->state.decodes.at(h.decode);
  msg::kv_handoff m{std::move(h.prefilled.req), to, msg::encode_kv_payload(id, h.prefilled.kv), h.ucx_tag,
                    now_ns(self)};
  // Over CAF to another process, a message larger than the peer accepts would close the whole
  // connection between the two nodes ([limits] max_message_mib): this request fails instead.
  if (h.ucx_tag == 0 && !fits_between(decode.node(), self->node(), m.payload.size())) {
    const uint64_t limit = current_network_limits().max_message_bytes;
    post(self, to, msg::rejected{id, errc::invalid_argument,
                                 "the prompt's KV cache is " + std::to_string(m.payload.size()) +
                                     " bytes, more than a CAF message between nodes may carry (" +
                                     std::to_string(limit) +
                                     " bytes, [limits] max_message_mib); raise it or use kv_transfer = \"ucx\""});
    return;
  }
  if (h.ucx_tag != 0)
    self->state.kv->send(h.kv_address, h.kv_port, h.ucx_tag, std::exchange(m.payload, {}), to, id,
                         caf::actor_cast<engine_actor>(self));
  kv_in_transit(self, self->state.options.network.get(), m.payload);
  const auto bytes = static_cast<int64_t>(m.payload.size());
  post(self, to, msg::prefilled{id});
  post(self, decode, std::move(m), bytes);
}

/// Sends a drained request back to its request actor, with its KV when it has some and it fits
/// in a CAF message to that actor's node (else the next engine recomputes it).
void forward(engine_actor_t* self, engine::forward& f, const request_actor& caller) {
  const request_actor to = f.to_caller ? caller : client_of(self, f.id);
  msg::forwarded m{f.id, "its engine drained (the node is shutting down): placed again", {}};
  if (f.kv) {
    m.kv_payload = msg::encode_kv_payload(f.id, *f.kv);
    if (!fits_between(to.node(), self->node(), m.kv_payload.size())) {
      spdlog::warn("engine: request {} is forwarded without its KV: {} bytes are more than a CAF message between "
                   "nodes may carry ([limits] max_message_mib)",
                   f.id, m.kv_payload.size());
      m.kv_payload.clear();
    }
  }
  kv_in_transit(self, self->state.options.network.get(), m.kv_payload);
  const auto bytes = static_cast<int64_t>(m.kv_payload.size());
  post(self, to, std::move(m), bytes);
}

/// Asks a cache tier (the request's, else the node's own) for the blocks after the pool's prefix,
/// with the fetch's budget (fetch or recompute, engine_core::plan_fetch); no answer in time (or
/// an error) is an empty answer: the request recomputes those tokens.
void fetch_from_tier(engine_actor_t* self, engine::fetch_blocks& f) {
  const engine::request_id id = f.id;
  engine_state& st = self->state;
  const cache_tier_actor tier =
      f.cache_tier >= 0 && static_cast<size_t>(f.cache_tier) < st.cache_tiers.size() ? st.cache_tiers[f.cache_tier]
                                                                                    : st.options.host_tier;
  if (!tier) return perform(self, st.policy->tier_answered(id, {}, now_ns(self)));  // none to ask: a miss
  const int64_t budget = std::min(f.budget_ns, msg::tier_fetch_budget_max_ns);
  const caf::timespan wait{budget > 0 ? msg::fetch_wait_ns(budget)
                                      : engine::unbudgeted_fetch_timeout_ns(st.options.config.tier_fetch_timeout_ns)};
  self->request(tier, wait, msg::tier_fetch{std::move(f.tokens), f.first_block, f.num_blocks_max, budget})
      .then([=](msg::tier_blocks& b) {
              if (!b.from_lower.empty() && b.from_lower.size() != b.blocks.size()) b.from_lower.clear();  // counts only
              perform(self, self->state.policy->tier_answered(id, std::move(b.blocks), now_ns(self), std::move(b.from_lower)));
            },
            [=](caf::error& err) {
              spdlog::debug("engine: the host tier did not serve request {}: {}", id, self->system().render(err));
              perform(self, self->state.policy->tier_answered(id, {}, now_ns(self)));
            });
}

/// Stores demoted blocks in the host tier; its answers (blocks it evicted) are not awaited.
void demote_to_tier(engine_actor_t* self, engine::demote_blocks& d) {
  for (engine::demoted_block& b : d.blocks)
    self->request(self->state.options.host_tier, caf::infinite, msg::tier_put{std::move(b.block), b.cls})
        .then([](int64_t) {},
              [=](caf::error& err) { spdlog::warn("engine: the host tier refused a block: {}", self->system().render(err)); });
}

/// Performs one effect of the policy; `caller` is the actor the current call came from.
struct performer {
  engine_actor_t* self;
  const request_actor& caller;
  void operator()(engine::send_plan& p) const { send_plan(self, p); }
  void operator()(engine::send_token& t) const {
    engine::sample_event& s = t.event;
    post(self, client_of(self, s.request),
               msg::sampled{s.request, s.sample_index, s.sample.token, s.sample.logprob,
                            std::move(s.sample.top_logprobs), s.finish, s.num_cached_tokens,
                            s.num_preemptions, s.num_recomputed_tokens, t.scheduled_at_ns});
  }
  void operator()(engine::send_batch& e) const {
    engine::token_batch& b = e.batch;
    post(self, client_of(self, b.request),
               msg::sampled_batch{b.request, std::move(b.tokens), std::move(b.logprobs), std::move(b.top_logprobs),
                                  std::move(b.age_ns), b.finish, b.num_cached_tokens,
                                  b.num_preemptions, b.num_recomputed_tokens, b.scheduled_age_ns,
                                  std::move(b.embedding)});
  }
  void operator()(engine::reject& r) const {
    if (!r.to_caller) spdlog::error("engine: request {} failed: {}", r.id, r.message);
    post(self, r.to_caller ? caller : client_of(self, r.id), msg::rejected{r.id, r.code, r.message});
  }
  void operator()(engine::watch_caller& w) const {
    self->state.clients[w.id] = caller;
    self->state.request_of_actor[caller.address()] = w.id;
    self->monitor(caller);
  }
  void operator()(engine::hand_off& h) const { hand_off(self, h); }
  void operator()(engine::report_load& l) const {  // the same report to every balancer
    const msg::load_report r{l.engine_index, l.num_received, l.num_requests, l.num_kv_tokens,
                             l.num_queued_prefill_tokens, l.draining, l.cache_seq, l.cache_snapshot,
                             std::move(l.cached_added), std::move(l.cached_removed)};
    for (const balancer_actor& b : self->state.balancers) post(self, b, r);
  }
  void operator()(engine::arm_report_timer& a) const {
    self->delayed_send(self, caf::timespan{a.delay_ns}, report_atom::value);
  }
  void operator()(engine::fetch_blocks& f) const { fetch_from_tier(self, f); }
  void operator()(engine::demote_blocks& d) const { demote_to_tier(self, d); }
  void operator()(engine::forward& f) const { forward(self, f, caller); }
  void operator()(engine::restart_executor&) const {
    self->demonitor(self->state.executor.address());
    self->send_exit(self->state.executor, caf::exit_reason::user_shutdown);  // its KV state is lost anyway
    start_executor(self);
  }
};

/// How long a request waits for its grammar's compilation (in this process) before it fails.
constexpr auto grammar_compile_timeout = std::chrono::seconds(30);

/// Asks the grammar actor to compile `a`'s grammar; its answer (or none) goes to the intake.
void compile_grammar(engine_actor_t* self, engine::arrival a, const request_actor& caller) {
  const engine::request_id id = a.req.id;
  const bool counted = a.counted();
  const grammar::grammar_spec spec = a.req.grammar;
  self->request(self->state.grammars, grammar_compile_timeout, compile_atom::value, spec)
      .then(
          [=, a = std::move(a)](compiled_grammar_ref& c) mutable {
            engine::intake<caf::actor_addr>& intake = *self->state.intake;
            take_in(self, intake.compiled(std::move(a), caller.address(), std::move(c.grammar), c.error), caller);
          },
          [=](caf::error& err) {
            const std::string why = self->system().render(err);
            take_in(self, self->state.intake->compile_failed(id, counted, caller.address(), why), caller);
          });
}

/// Performs the intake's step for a request from `caller`.
struct intake_performer {
  engine_actor_t* self;
  const request_actor& caller;
  void operator()(engine::enter& e) const {
    perform(self, engine::enter_policy(*self->state.policy, std::move(e.a), now_ns(self)), caller);
  }
  void operator()(engine::refuse& r) const {
    if (r.count_received) self->state.policy->note_received();
    post(self, caller, msg::rejected{r.id, r.code, r.message});
  }
  void operator()(engine::compile& c) const { compile_grammar(self, std::move(c.a), caller); }
  void operator()(engine::drop& d) const {
    if (d.count_received) self->state.policy->note_received();
    spdlog::debug("engine: request {} was released while its grammar compiled: dropped", d.id);
  }
};

}  // namespace

int64_t now_ns(engine_actor_t* self) { return ns_since_epoch(self->clock().now()); }

void start_executor(engine_actor_t* self) {
  const engine_options& o = self->state.options;
  const engine_actor engine = caf::actor_cast<engine_actor>(self);
  self->state.executor = o.make_executor ? o.make_executor(self->system(), engine)
                                         : spawn_executor(self->system(), engine, executor_settings_of(o));
  // Monitored, not linked: over a link, an executor killed with exit_reason::kill (which no exit
  // handler can intercept) would take its engine down. The executor monitors its engine in turn.
  self->monitor(self->state.executor);
}

request_actor client_of(engine_actor_t* self, engine::request_id id) {
  auto it = self->state.clients.find(id);
  return it == self->state.clients.end() ? request_actor{} : it->second;
}

void executor_failed(engine_actor_t* self, int64_t generation, const caf::error& reason) {
  if (generation != self->state.policy->generation()) return;  // a replaced executor's failure
  const std::string why = "step executor failed: " + self->system().render(reason);
  spdlog::error("engine: {}; restarting it and resuming its {} request(s) by recompute", why,
                self->state.policy->num_live());
  perform(self, self->state.policy->executor_failed(generation, why, now_ns(self)));
}

void perform(engine_actor_t* self, engine::effects fx, const request_actor& caller) {
  const no_blocking_scope guard("the engine's effects");
  for (engine::effect& e : fx) std::visit(performer{self, caller}, e);
  engine_state& st = self->state;
  if (st.drained && st.policy->drained() && st.intake->empty()) {
    st.drained->deliver(static_cast<int32_t>(st.policy->num_forwarded()),
                        static_cast<int32_t>(st.policy->num_forwarded_with_kv()));
    st.drained.reset();
  }
}

void take_in(engine_actor_t* self, engine::intake_step step, const request_actor& caller) {
  std::visit(intake_performer{self, caller}, step);
}

}  // namespace troupe::actors
