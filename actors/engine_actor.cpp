#include "actors/engine_actor.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/atoms.hpp"
#include "actors/system/boundary.hpp"
#include "actors/system/sync_guard.hpp"
#include "actors/system/clock.hpp"
#include "actors/engine_effects.hpp"
#include "messages/kv_payload.hpp"
#include "runtime/balance/placement.hpp"

namespace troupe::actors {

executor_settings executor_settings_of(const engine_options& o) {
  return executor_settings{o.checkpoint,       o.config.num_kv_blocks, o.config.block_size,  o.config.kernels,
                           o.executor_threads, o.detached_executor,    o.step_log,           o.config.speculation,
                           o.draft_checkpoint, o.vocabulary,           o.experts,            o.expert_reassignment,
                           o.config.kv_cache_dtype,    o.config.copy_stream_min_bytes};
}

namespace {

engine::engine_policy_options policy_options(const engine_options& o) {
  engine::engine_config config = o.config;
  config.host_tier = static_cast<bool>(o.host_tier) || o.cluster_tiers;
  config.own_tier = static_cast<bool>(o.host_tier);
  return {o.checkpoint ? o.checkpoint->config() : o.model, o.end_ids, config, o.max_waiting,
          o.check_invariants_every, o.kv_sender != nullptr, o.kv_tag_base};
}

/// A request's tier as the balancer named it, if this engine knows that tier; else -1 (its own).
void check_cache_tier(engine_actor_t* self, engine::request& r) {
  if (r.cache_tier < 0 || static_cast<size_t>(r.cache_tier) >= self->state.cache_tiers.size() ||
      !self->state.cache_tiers[static_cast<size_t>(r.cache_tier)])
    r.cache_tier = -1;
}

/// The node shuts down: no new work from now on; after `grace_ms` every request still here is
/// forwarded. Answered once nothing is left. Only from this node (the node process): the
/// handle travels to the balancer's node, and no other node may take this one's engines away.
caf::result<int32_t, int32_t> drain(engine_actor_t* self, int32_t grace_ms) {
  engine_state& st = self->state;
  if (!self->current_sender() || self->current_sender()->node() != self->node())
    return caf::make_error(caf::sec::invalid_argument, "an engine is drained only by its own node");
  if (st.drained) return caf::make_error(caf::sec::invalid_argument, "the engine is draining already");
  st.drained = self->make_response_promise<int32_t, int32_t>();
  auto answer = *st.drained;
  self->delayed_send(self, std::chrono::milliseconds(std::max(0, grace_ms)), drain_atom::value);
  perform(self, st.policy->drain(now_ns(self)));
  return answer;
}

/// Work nobody can receive (a remote message without its sender: see msg::submit_completion)
/// is dropped before it takes a slot; monitor() on a null handle would crash.
bool validate_caller(const request_actor& caller, engine::request_id id) {
  if (caller) return true;
  spdlog::warn("engine: dropped request {}: it names no request actor to stream to", id);
  return false;
}

/// Whether request `id` from `from` is here already (engine::intake::here_already): dropped.
bool here_already(engine_actor_t* self, engine::request_id id, const request_actor& from) {
  const bool served_for_from = self->state.policy->is_live(id) && client_of(self, id) == from;
  if (!self->state.intake->here_already(id, from.address(), served_for_from)) return false;
  spdlog::debug("engine: request {} arrived twice (a hand-off and its placement again); the second is dropped", id);
  return true;
}

void submit_prefill(engine_actor_t* self, msg::submit_prefill& s) {
  engine_state& st = self->state;
  const request_actor caller = caf::actor_cast<request_actor>(self->current_sender());
  if (s.decode && !validate_caller(caller, s.request.id)) return st.policy->note_received();
  check_cache_tier(self, s.request);
  std::optional<engine::peer_id> decode;
  if (s.decode) {  // decode engines are few: numbered in order of appearance
    auto it = std::find(st.decodes.begin(), st.decodes.end(), s.decode);
    decode = static_cast<engine::peer_id>(it - st.decodes.begin());
    if (it == st.decodes.end()) st.decodes.push_back(s.decode);
  }
  const int64_t now = now_ns(self);
  return perform(self, st.policy->submit_prefill(std::move(s.request), decode, std::move(s.kv_address), s.kv_port, now),
                 caller);
}

/// Decode engine: a request and its KV bytes, decoded and queued. KV that does not decode (the
/// transfer broke off, or the bytes are damaged) is recomputed here: the request is not lost,
/// and its tokens do not change.
void accept_handoff(engine_actor_t* self, msg::kv_handoff& h) {
  if (!validate_caller(h.request_actor, h.request.id) || here_already(self, h.request.id, h.request_actor)) return;
  check_cache_tier(self, h.request);
  engine::arrival a{std::move(h.request), engine::entry::recompute};
  if (auto payload = msg::decode_kv_payload(h.payload)) {
    if (h.sent_ns > 0)
      self->state.policy->note_handoff_time(static_cast<int64_t>(h.payload.size()), now_ns(self) - h.sent_ns);
    a.how = engine::entry::import;
    a.payload_id = payload->request_id;
    a.kv = std::move(payload->kv);
  } else {
    spdlog::warn("engine: the KV of request {} did not arrive intact ({}); recomputed instead", a.req.id,
                 payload.error().message);
  }
  take_in(self, self->state.intake->arrive(std::move(a), h.request_actor.address()), h.request_actor);
}

void on_handoff(engine_actor_t* self, msg::kv_handoff& h) {
  self->state.policy->note_received();
  if (h.ucx_tag == 0) return accept_handoff(self, h);
  if (!self->state.kv->enabled()) {
    post(self, h.request_actor, msg::rejected{h.request.id, errc::internal,
                                              "KV sent over UCX to an engine without a UCX transport"});
    return;
  }
  self->state.kv->await(std::move(h), caf::actor_cast<engine_actor>(self));
}

/// A balancer asks for load reports (report_to): one it reports to already is kept; a new one
/// joins the list (monitored), the oldest leaving it when balance::balancers_max report already. Every
/// balancer numbers the engines in the topology's order, so one report fits them all.
void add_balancer(engine_actor_t* self, balancer_actor b) {
  std::vector<balancer_actor>& list = self->state.balancers;
  if (std::find(list.begin(), list.end(), b) != list.end()) return;
  if (list.size() == balance::balancers_max) {
    self->demonitor(list.front().address());
    list.erase(list.begin());
  }
  self->monitor(b);
  list.push_back(std::move(b));
}

void on_down(engine_actor_t* self, const caf::down_msg& dm) {
  engine_state& st = self->state;
  if (dm.source == st.executor.address()) {  // a replaced executor's DOWN was handled already
    executor_failed(self, st.policy->generation(), dm.reason ? dm.reason : caf::make_error(caf::exit_reason::normal));
    return;
  }
  const auto balancer = std::find_if(st.balancers.begin(), st.balancers.end(),
                                     [&](const balancer_actor& b) { return b.address() == dm.source; });
  if (balancer != st.balancers.end()) {
    st.balancers.erase(balancer);
    return;
  }
  auto it = st.request_of_actor.find(dm.source);
  if (it == st.request_of_actor.end()) return;
  const engine::request_id id = it->second;
  st.request_of_actor.erase(it);
  perform(self, st.policy->peer_down(id, now_ns(self)));
  if (auto c = st.clients.find(id); c != st.clients.end() && c->second.address() == dm.source) st.clients.erase(c);
}

/// A release counts only from the request actor this engine serves the request for (its
/// `watch_caller`); an id it serves nobody is a no-op for the policy, as before.
bool released_by_owner(engine_actor_t* self, engine::request_id id) {
  const auto it = self->state.clients.find(id);
  if (it == self->state.clients.end() ||
      it->second.address() == caf::actor_cast<caf::actor_addr>(self->current_sender()))
    return true;
  spdlog::warn("engine: dropped a release of request {} that did not come from its request actor", id);
  return false;
}

msg::engine_report stats(engine_actor_t* self) { return self->state.policy->report(now_ns(self)); }

/// How long a report waits for the host tier's counters (which waits for its disk tier's at
/// most its own bound).
constexpr auto tier_stats_timeout = std::chrono::seconds(1);

/// The engine's report; with a host tier, completed by the tier's expirations when it answers
/// (within tier_stats_timeout; the engine does not wait meanwhile).
caf::result<msg::engine_report> report(engine_actor_t* self) {
  const msg::engine_report r = stats(self);
  if (!self->state.options.host_tier) return r;
  auto promise = self->make_response_promise<msg::engine_report>();
  self->request(self->state.options.host_tier, tier_stats_timeout, stats_atom::value)
      .then(
          [=](msg::tier_report& t) mutable {
            msg::engine_report out = r;
            out.host_tier_expired_blocks = t.num_expirations;
            out.disk_tier_expired_blocks = t.num_disk_expirations;
            promise.deliver(out);
          },
          [=](caf::error&) mutable { promise.deliver(r); });
  return promise;
}

engine_actor::behavior_type engine_behavior(engine_actor_t* self, engine_options options) {
  engine_state& st = self->state;
  st.options = std::move(options);
  auto policy = engine::engine_policy::create(policy_options(st.options), now_ns(self));
  TROUPE_ASSERT_MSG(policy.has_value(), "engine options are validated in spawn_engine");
  st.policy = std::move(*policy);
  st.kv = std::make_unique<kv_transfers>(st.options.kv_sender);
  st.intake.emplace(st.options.vocabulary);
  start_executor(self);
  if (st.options.vocabulary)  // it goes down with its engine
    st.grammars = spawn_grammar_actor(self->system(), caf::actor_cast<caf::actor>(self), st.options.config.grammar);
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  guard_boundary(self);
  return {
      [=](msg::submit& s) {
        const request_actor caller = caf::actor_cast<request_actor>(self->current_sender());
        if (!validate_caller(caller, s.request.id) || here_already(self, s.request.id, caller))
          return self->state.policy->note_received();
        check_cache_tier(self, s.request);
        take_in(self, self->state.intake->arrive(engine::arrival{std::move(s.request)}, caller.address()), caller);
      },
      [=](msg::submit_prefill& s) { submit_prefill(self, s); },
      [=](msg::kv_handoff& h) { on_handoff(self, h); },
      [=](msg::kv_arrived& a) {
        if (auto h = self->state.kv->arrived(a, caf::actor_cast<engine_actor>(self))) accept_handoff(self, *h);
      },
      [=](msg::release& r) {
        self->state.intake->release(r.request_id, caf::actor_cast<caf::actor_addr>(self->current_sender()));
        if (released_by_owner(self, r.request_id)) perform(self, self->state.policy->release(r.request_id, now_ns(self)));
      },
      [=](msg::report_to& r) {
        if (!r.balancer) return;  // reports to nobody: ignored (the balancer always names itself)
        add_balancer(self, std::move(r.balancer));
        self->state.cache_tiers = std::move(r.cache_tiers);
        const int64_t interval_ns = int64_t{std::max(1, r.interval_ms)} * 1000000;
        perform(self, self->state.policy->report_to(r.engine_index, interval_ns, now_ns(self), r.cache_events));
      },
      [=](report_atom) { perform(self, self->state.policy->report_timer(now_ns(self))); },
      [=](stats_atom) { return report(self); },
      [=](executor_atom) { return self->state.executor; },
      [=](ping_atom) { return pong_atom::value; },  // the balancer's heartbeat
      [=](drain_atom, int32_t grace_ms) { return drain(self, grace_ms); },
      [=](drain_atom) {  // the grace period ended
        if (self->current_sender() != self->ctrl()) return;  // its own timer only
        perform(self, self->state.policy->forward_all(now_ns(self)));
      },
  };
}

}  // namespace

namespace {

/// The expert shards and their reassignment fit the model and the executor (experts, reassignment).
expected<void> check_expert_options(const engine_options& o) {
  if (!o.experts) {
    if (o.expert_reassignment) return fail(errc::invalid_argument, "expert reassignment needs expert shard actors");
    return {};
  }
  const model::moe_weights* moe = o.checkpoint ? o.checkpoint->moe() : nullptr;
  if (moe == nullptr) return fail(errc::invalid_argument, "expert shard actors need an MoE checkpoint");
  if (!o.detached_executor)
    return fail(errc::invalid_argument, "an executor on expert shard actors waits on them: it must be detached");
  const moe::expert_placement placement = o.experts->current();
  if (placement.n_layers() != o.checkpoint->config().n_layers || placement.n_experts() != moe->n_experts)
    return fail(errc::invalid_argument, "the expert placement has " + std::to_string(placement.n_layers()) +
                                            " layers of " + std::to_string(placement.n_experts()) +
                                            " experts; the model " + std::to_string(o.checkpoint->config().n_layers) +
                                            " of " + std::to_string(moe->n_experts));
  if (!o.expert_reassignment) return {};
  if (auto r = moe::reassigner::create(placement, *o.expert_reassignment); !r) return tl::unexpected(r.error());
  return {};
}

}  // namespace

expected<engine_actor> spawn_engine(caf::actor_system& sys, const engine_options& options) {
  engine_options o = options;
  o.config.max_steps_in_flight = 2;
  if (!o.checkpoint && !o.make_executor)
    return fail(errc::invalid_argument, "an engine needs a checkpoint or an executor factory");
  if (auto policy = engine::engine_policy::create(policy_options(o), 0); !policy) return tl::unexpected(policy.error());
  if (o.executor_threads < 1) return fail(errc::invalid_argument, "executor_threads must be >= 1");
  if (auto ok = check_expert_options(o); !ok) return tl::unexpected(ok.error());
  if (!o.step_log.empty()) {  // the executor opens it again; fail here, where it can be reported
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> log{std::fopen(o.step_log.c_str(), "a"), &std::fclose};
    if (!log)
      return fail(errc::io_error,
                  "step_log '" + o.step_log + "' cannot be opened for appending: " + std::strerror(errno));
  }
  return sys.spawn(engine_behavior, std::move(o));
}

/// Asks `engine` with `atom` and waits for its answer of type T.
template <class T, class Atom>
expected<T> ask(caf::actor_system& sys, const engine_actor& engine, Atom atom, std::chrono::milliseconds timeout) {
  check_may_block("asking an engine (query_engine / query_executor)");
  caf::scoped_actor self{sys};
  expected<T> out = fail(errc::internal, "no answer");
  self->request(engine, timeout, atom)
      .receive([&](T& answer) { out = std::move(answer); },
               [&](caf::error& e) {
                 out = fail(errc::internal, "engine query failed (" + std::to_string(timeout.count()) +
                                                " ms at most): " + sys.render(e));
               });
  return out;
}

expected<msg::engine_report> query_engine(caf::actor_system& sys, const engine_actor& engine,
                                          std::chrono::milliseconds timeout) {
  return ask<msg::engine_report>(sys, engine, stats_atom::value, timeout);
}

expected<executor_actor> query_executor(caf::actor_system& sys, const engine_actor& engine) {
  return ask<executor_actor>(sys, engine, executor_atom::value, std::chrono::seconds(30));
}

}  // namespace troupe::actors
