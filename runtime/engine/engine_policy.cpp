#include "runtime/engine/engine_policy.hpp"

#include <set>
#include <tuple>

#include "runtime/kv/hit_rule.hpp"
#include <utility>

namespace troupe::engine {
namespace {

bool same_chunks(const std::vector<exec_chunk>& a, const std::vector<exec_chunk>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (std::tie(a[i].seq, a[i].first_position, a[i].tokens, a[i].first_block, a[i].block_table,
                 a[i].num_samples, a[i].seed, a[i].export_kv) !=
        std::tie(b[i].seq, b[i].first_position, b[i].tokens, b[i].first_block, b[i].block_table,
                 b[i].num_samples, b[i].seed, b[i].export_kv))
      return false;
  return true;
}

bool same_kv(const kv_data& a, const kv_data& b) {
  return std::tie(a.num_layers, a.kv_dim, a.num_tokens, a.keys, a.values, a.dtype) ==
         std::tie(b.num_layers, b.kv_dim, b.num_tokens, b.keys, b.values, b.dtype);
}

}  // namespace

// Plans compare by step and chunks (what the executor computes), requests by id and prompt.
bool operator==(const send_plan& a, const send_plan& b) {
  return a.generation == b.generation && a.plan.step == b.plan.step && same_chunks(a.plan.chunks, b.plan.chunks) &&
         a.plan.released == b.plan.released && a.plan.imports.size() == b.plan.imports.size() &&
         a.plan.copies == b.plan.copies;
}

bool operator==(const send_token& a, const send_token& b) {
  const sample_event& x = a.event;
  const sample_event& y = b.event;
  return std::tie(x.request, x.sample_index, x.sample.token, x.sample.logprob, x.sample.top_logprobs, x.finish,
                  x.num_cached_tokens, x.num_preemptions, x.num_recomputed_tokens, a.scheduled_at_ns) ==
         std::tie(y.request, y.sample_index, y.sample.token, y.sample.logprob, y.sample.top_logprobs, y.finish,
                  y.num_cached_tokens, y.num_preemptions, y.num_recomputed_tokens, b.scheduled_at_ns);
}

bool operator==(const token_batch& a, const token_batch& b) {
  return std::tie(a.request, a.tokens, a.logprobs, a.top_logprobs, a.age_ns, a.finish, a.num_cached_tokens, a.num_preemptions,
                  a.num_recomputed_tokens, a.scheduled_age_ns, a.embedding) ==
         std::tie(b.request, b.tokens, b.logprobs, b.top_logprobs, b.age_ns, b.finish, b.num_cached_tokens, b.num_preemptions,
                  b.num_recomputed_tokens, b.scheduled_age_ns, b.embedding);
}

bool operator==(const send_batch& a, const send_batch& b) { return a.batch == b.batch; }

bool operator==(const reject& a, const reject& b) {
  return std::tie(a.id, a.code, a.message, a.to_caller) == std::tie(b.id, b.code, b.message, b.to_caller);
}

bool operator==(const watch_caller& a, const watch_caller& b) { return a.id == b.id; }

bool operator==(const hand_off& a, const hand_off& b) {
  return a.prefilled.req.id == b.prefilled.req.id && a.prefilled.req.prompt == b.prefilled.req.prompt &&
         same_kv(a.prefilled.kv, b.prefilled.kv) &&
         std::tie(a.decode, a.kv_address, a.kv_port, a.ucx_tag) == std::tie(b.decode, b.kv_address, b.kv_port, b.ucx_tag);
}

bool operator==(const report_load& a, const report_load& b) {
  return std::tie(a.engine_index, a.num_received, a.num_requests, a.num_kv_tokens, a.num_queued_prefill_tokens,
                  a.draining, a.cache_seq, a.cache_snapshot, a.cached_added, a.cached_removed) ==
         std::tie(b.engine_index, b.num_received, b.num_requests, b.num_kv_tokens, b.num_queued_prefill_tokens,
                  b.draining, b.cache_seq, b.cache_snapshot, b.cached_added, b.cached_removed);
}

bool operator==(const forward& a, const forward& b) {
  return a.id == b.id && a.to_caller == b.to_caller && a.kv.has_value() == b.kv.has_value() &&
         (!a.kv || same_kv(*a.kv, *b.kv));
}

bool operator==(const arm_report_timer& a, const arm_report_timer& b) { return a.delay_ns == b.delay_ns; }

bool operator==(const restart_executor&, const restart_executor&) { return true; }

bool operator==(const fetch_blocks& a, const fetch_blocks& b) {
  return std::tie(a.id, a.tokens, a.first_block, a.num_blocks_max, a.cache_tier, a.budget_ns) ==
         std::tie(b.id, b.tokens, b.first_block, b.num_blocks_max, b.cache_tier, b.budget_ns);
}

// Demoted blocks compare by name, class and payload size.
bool operator==(const demote_blocks& a, const demote_blocks& b) {
  if (a.blocks.size() != b.blocks.size()) return false;
  for (size_t i = 0; i < a.blocks.size(); i++)
    if (a.blocks[i].block.hash != b.blocks[i].block.hash || a.blocks[i].cls != b.blocks[i].cls ||
        a.blocks[i].block.num_bytes() != b.blocks[i].block.num_bytes())
      return false;
  return true;
}

expected<std::unique_ptr<engine_policy>> engine_policy::create(engine_policy_options options, int64_t now_ns) {
  auto core = engine_core::create(options.model, options.end_ids, options.config);
  if (!core) return tl::unexpected(core.error());
  if (options.max_waiting <= 0) return fail(errc::invalid_argument, "max_waiting must be > 0");
  return std::unique_ptr<engine_policy>(new engine_policy(std::move(options), std::move(*core), now_ns));
}

engine_policy::engine_policy(engine_policy_options options, std::unique_ptr<engine_core> core, int64_t now_ns)
    : options_(std::move(options)), core_(std::move(core)), started_ns_(now_ns) {}

/// Queues `r` through `add` (one of the core's add_* calls, which moves `r`); false (with a
/// rejection to the caller) when it is refused. `samples` is false for a prefill-only request
/// (its tokens come from the decode engine).
/// `watched`: the request waited for the host tier; its caller is watched already and refusals
/// go to it (the current call is the tier's answer).
template <class Add>
bool engine_policy::admit(const request& r, bool samples, Add&& add, effects& out, int64_t now_ns, bool watched) {
  const request_id id = r.id;
  // Tokens delivered in one message at the end: room for all of them reserved now.
  const int32_t batch_tokens = samples && r.batch_tokens ? r.max_tokens : 0;
  if (!watched && num_queued() >= options_.max_waiting) {
    out.push_back(reject{id, errc::overloaded,
                         "the engine's waiting queue is full (" + std::to_string(options_.max_waiting) +
                             " requests); retry later",
                         true});
    return false;
  }
  if (!watched && tier_waits_.count(id)) {
    out.push_back(reject{id, errc::invalid_argument, "duplicate request id " + std::to_string(id), true});
    return false;
  }
  if (auto ok = add(); !ok) {
    out.push_back(reject{id, ok.error().code, ok.error().message, !watched});
    return false;
  }
  live_request& live = requests_.emplace(id, live_request{0, batch_tokens > 0, 0, {}}).first->second;
  if (live.batch) {
    token_batch& b = live.tokens;
    b.tokens.reserve(batch_tokens);
    b.logprobs.reserve(batch_tokens);
    b.top_logprobs.reserve(batch_tokens);
    b.age_ns.reserve(batch_tokens);
  }
  // A request actor that dies without releasing its request must not keep it generating.
  if (!watched) out.push_back(watch_caller{id});
  kick(out, now_ns);
  note_change(out, now_ns);
  return true;
}

/// The request waits for the tier only if the tier may add to the pool's prefix: the pool holds
/// fewer leading blocks than the hit rule lets a prompt of this length take from cache.
bool engine_policy::fetch_first(request& r, std::optional<handoff_target>& handoff, effects& out) {
  // A tier to ask: the one the request names (the balancer's, checked by the engine actor), or
  // the engine's own.
  // An embedding request takes nothing from cache (request::pooling).
  if (!options_.config.host_tier || (r.cache_tier < 0 && !options_.config.own_tier) ||
      r.pooling != pooling_mode::none)
    return false;
  const request_id id = r.id;
  std::optional<error> refused;
  if (num_queued() >= options_.max_waiting)
    refused = error{errc::overloaded, "the engine's waiting queue is full (" + std::to_string(options_.max_waiting) +
                                          " requests); retry later"};
  else if (tier_waits_.count(id))
    refused = error{errc::invalid_argument, "duplicate request id " + std::to_string(id)};
  else if (auto ok = core_->check_request(r); !ok)
    refused = ok.error();
  if (refused) {
    out.push_back(reject{id, refused->code, refused->message, true});
    return true;
  }
  std::vector<int32_t> tokens(r.prompt.begin(), r.prompt.end() - (handoff ? 1 : 0));  // what the core prefills
  const auto [num_pool_blocks, num_blocks_max] = core_->cached_prefix(tokens);
  if (num_pool_blocks >= num_blocks_max) return false;
  const fetch_plan plan = core_->plan_fetch(num_pool_blocks, num_blocks_max - num_pool_blocks);
  if (plan.num_blocks == 0) return false;  // recomputing is predicted no slower: not asked
  out.push_back(watch_caller{id});
  out.push_back(fetch_blocks{id, std::move(tokens), num_pool_blocks, plan.num_blocks, r.cache_tier, plan.budget_ns});
  tier_waits_.emplace(id, tier_wait{std::move(r), std::move(handoff), num_pool_blocks});
  return true;
}

effects engine_policy::tier_answered(request_id id, std::vector<kv::kv_block> blocks, int64_t now_ns,
                                   std::vector<uint8_t> from_lower) {
  effects out;
  auto it = tier_waits_.find(id);
  if (it == tier_waits_.end()) {  // a fetch the core asked for, or released (its caller died) meanwhile
    if (core_->swap_answered(id, std::move(blocks), std::move(from_lower))) kick(out, now_ns);
    return out;
  }
  const request& r = it->second.req;
  std::vector<int32_t> tokens(r.prompt.begin(), r.prompt.end() - (it->second.handoff ? 1 : 0));
  // If the pool evicted leading blocks of the prefix the answer extends meanwhile (a disk read
  // takes a while; the request may wait long in the queue), the core asks the tier again from
  // where the pool ends when the request's admission is tried (engine_core::stage_promotion).
  tier_wait w = std::move(it->second);
  tier_waits_.erase(it);
  const int32_t first_block = w.first_block;
  admit_waited(std::move(w), out, now_ns,
               staged_promotion{std::move(tokens), std::move(blocks), std::move(from_lower), first_block});
  return out;
}

void engine_policy::admit_waited(tier_wait w, effects& out, int64_t now_ns, staged_promotion answer) {
  request& r = w.req;
  const request_id id = r.id;
  // The tier's blocks wait in the core for the request's admission (engine_core::stage_promotion).
  auto added = [&](expected<void> ok) {
    if (ok) core_->stage_promotion(id, std::move(answer));
    return ok;
  };
  if (!w.handoff) {
    admit(r, true, [&] { return added(core_->add_request(std::move(r))); }, out, now_ns, /*watched=*/true);
    return;
  }
  if (admit(r, false, [&] { return added(core_->add_prefill(std::move(r))); }, out, now_ns, /*watched=*/true))
    handoffs_[id] = std::move(*w.handoff);
}

bool engine_policy::forwarded_at_once(request_id id, effects& out) {
  if (!forwarding_) return false;
  out.push_back(forward{id, true, std::nullopt});
  num_forwarded_++;
  return true;
}

effects engine_policy::submit(request r, int64_t now_ns) {
  num_received_++;
  return compute_whole(std::move(r), now_ns);
}

effects engine_policy::compute_whole(request r, int64_t now_ns) {
  effects out;
  if (forwarded_at_once(r.id, out)) return out;
  std::optional<handoff_target> none;
  if (fetch_first(r, none, out)) return out;
  admit(r, true, [&] { return core_->add_request(std::move(r)); }, out, now_ns);
  return out;
}

effects engine_policy::submit_prefill(request r, std::optional<peer_id> decode, std::string kv_address, uint16_t kv_port,
                                    int64_t now_ns) {
  num_received_++;
  effects out;
  const request_id id = r.id;
  if (forwarded_at_once(id, out)) return out;
  if (!decode) {
    out.push_back(reject{id, errc::invalid_argument, "a prefill request names no decode engine", true});
    return out;
  }
  std::optional<handoff_target> target = handoff_target{*decode, std::move(kv_address), kv_port};
  if (fetch_first(r, target, out)) return out;
  if (admit(r, false, [&] { return core_->add_prefill(std::move(r)); }, out, now_ns))
    handoffs_[id] = std::move(*target);
  return out;
}

effects engine_policy::import(request r, request_id payload_id, kv_data kv, int64_t now_ns) {
  effects out;
  const request_id id = r.id;
  if (forwarded_at_once(id, out)) return out;
  if (payload_id != id) {
    out.push_back(reject{id, errc::invalid_argument,
                         "a KV payload for request " + std::to_string(payload_id) + " arrived for request " +
                             std::to_string(id),
                         true});
    return out;
  }
  admit(r, true, [&] { return core_->add_prefilled(std::move(r), std::move(kv)); }, out, now_ns);
  return out;
}

effects engine_policy::recompute_handoff(request r, int64_t now_ns) {
  num_handoffs_recomputed_++;
  return compute_whole(std::move(r), now_ns);
}

void engine_policy::kick(effects& out, int64_t now_ns) {
  while (auto plan = core_->plan_step()) {
    if (core_->num_in_flight() == 1) busy_since_ns_ = now_ns;
    for (const exec_chunk& chunk : plan->chunks) {
      auto it = requests_.find(core_->request_of(chunk.seq).value_or(-1));
      if (it != requests_.end() && it->second.scheduled_at_ns == 0) it->second.scheduled_at_ns = now_ns;
    }
    grammar::grammar_table grammars = core_->grammars_of(*plan);
    out.push_back(send_plan{std::move(*plan), generation_, std::move(grammars)});
  }
  for (swap_in& s : core_->take_swap_ins())
    out.push_back(fetch_blocks{s.id, std::move(s.tokens), s.first_block, s.num_blocks_max, s.cache_tier, s.budget_ns});
}

void engine_policy::send_report(effects& out, int64_t now_ns) {
  reporting_->last_ns = now_ns;
  const engine_stats s = core_->stats();
  report_load r{reporting_->engine_index, num_received_, static_cast<int64_t>(requests_.size()),
                static_cast<int64_t>(s.num_blocks_in_use) * core_->config().block_size,
                core_->num_queued_prompt_tokens(), draining_};
  if (reporting_->cache_events) add_cache_events(r);
  out.push_back(std::move(r));
}

void engine_policy::add_cache_events(report_load& r) {
  kv::cache_events events = core_->take_cache_events();
  r.cache_seq = ++num_cache_reports_;
  r.cache_snapshot = reporting_->snapshot_due || events.overflowed;
  reporting_->snapshot_due = false;
  if (r.cache_snapshot) {
    r.cached_added = core_->blocks().cached_hashes();
    return;
  }
  r.cached_added = std::move(events.added);
  r.cached_removed = std::move(events.removed);
}

/// Something changed: report now, or once the interval since the last report has passed.
void engine_policy::note_change(effects& out, int64_t now_ns) {
  if (!reporting_ || reporting_->due) return;
  if (now_ns - reporting_->last_ns >= reporting_->interval_ns) {
    send_report(out, now_ns);
    return;
  }
  reporting_->due = true;
  out.push_back(arm_report_timer{reporting_->last_ns + reporting_->interval_ns - now_ns});
}

effects engine_policy::report_to(int32_t engine_index, int64_t interval_ns, int64_t now_ns, bool cache_events) {
  TROUPE_ASSERT(interval_ns > 0);
  if (!reporting_) reporting_.emplace();
  reporting_->engine_index = engine_index;
  reporting_->interval_ns = interval_ns;
  reporting_->cache_events = cache_events;
  reporting_->snapshot_due = cache_events;
  effects out;
  send_report(out, now_ns);
  return out;
}

effects engine_policy::report_timer(int64_t now_ns) {
  effects out;
  if (!reporting_) return out;
  reporting_->due = false;
  send_report(out, now_ns);
  return out;
}

/// One sampled token: sent now, or added to a batched request's tokens (sent with the last).
void engine_policy::on_sample(sample_event&& e, effects& out, int64_t now_ns) {
  const request_id id = e.request;
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  live_request& live = it->second;
  if (!live.batch) {
    out.push_back(send_token{std::move(e), live.scheduled_at_ns});
  } else {
    TROUPE_ASSERT_MSG(e.sample_index == 0, "batched requests have one sample");
    token_batch& b = live.tokens;
    b.request = e.request;
    b.tokens.push_back(e.sample.token);
    b.logprobs.push_back(e.sample.logprob);
    b.top_logprobs.push_back(std::move(e.sample.top_logprobs));
    b.age_ns.push_back(now_ns);
    if (e.finish != finish_reason::none) {
      for (int64_t& t : b.age_ns) t = now_ns - t;
      b.finish = e.finish;
      b.num_cached_tokens = e.num_cached_tokens;
      b.num_preemptions = e.num_preemptions;
      b.num_recomputed_tokens = e.num_recomputed_tokens;
      b.scheduled_age_ns = now_ns - live.scheduled_at_ns;
      out.push_back(send_batch{std::move(b)});
    }
  }
}

/// Ships each finished prefill's request and KV to its decode engine.
void engine_policy::hand_off_prefilled(effects& out) {
  for (prefilled_request& p : core_->take_prefilled()) {
    const request_id id = p.req.id;
    auto it = handoffs_.find(id);
    TROUPE_ASSERT_MSG(it != handoffs_.end(), "a prefill without a handoff target");
    handoff_target target = std::move(it->second);
    handoffs_.erase(it);
    requests_.erase(id);
    const uint64_t tag = options_.kv_over_ucx ? options_.ucx_tag_base + next_ucx_tag_++ : 0;
    out.push_back(hand_off{std::move(p), target.decode, std::move(target.kv_address), target.kv_port, tag});
  }
}

void engine_policy::send_embedded(effects& out, int64_t now_ns) {
  for (embedded_request& e : core_->take_embedded()) {
    auto it = requests_.find(e.id);
    TROUPE_ASSERT_MSG(it != requests_.end(), "an embedding without its request");
    token_batch b;
    b.request = e.id;
    b.finish = finish_reason::stop;
    b.num_preemptions = e.num_preemptions;
    b.num_recomputed_tokens = e.num_recomputed_tokens;
    b.scheduled_age_ns = now_ns - it->second.scheduled_at_ns;
    b.embedding = std::move(e.embedding);
    out.push_back(send_batch{std::move(b)});
    requests_.erase(it);
  }
}

effects engine_policy::on_step_result(int64_t generation, exec_result result, int64_t now_ns) {
  effects out;
  if (generation != generation_) return out;  // a failed executor's late reply
  count_expert_placement(result);
  std::vector<sample_event> events = core_->complete_step(std::move(result));
  out.reserve(events.size() + 4);  // an effect per token, and a few more: one allocation per step
  if (std::vector<demoted_block> d = core_->take_demoted(); !d.empty()) out.push_back(demote_blocks{std::move(d)});
  for (sample_event& e : events) on_sample(std::move(e), out, now_ns);
  // A request that ended in this step is dropped after all its events: one step may carry
  // several tokens of a sample (speculative decoding) or several samples' ends.
  for (const sample_event& e : events)
    if (!core_->contains(e.request)) requests_.erase(e.request);
  forward_exported(out);
  for (failed_request& f : core_->take_failed()) {
    if (!requests_.count(f.id)) continue;
    out.push_back(reject{f.id, f.reason.code, std::move(f.reason.message), false});
    handoffs_.erase(f.id);
    requests_.erase(f.id);
  }
  hand_off_prefilled(out);
  send_embedded(out, now_ns);
  note_change(out, now_ns);
  const int32_t every = options_.check_invariants_every;
  if (every > 0 && core_->stats().num_steps % every == 0) core_->check_step();
  if (core_->num_in_flight() == 0) executor_busy_ns_ += now_ns - busy_since_ns_;
  kick(out, now_ns);
  return out;
}

void engine_policy::count_expert_placement(const exec_result& result) {
  TROUPE_ASSERT_MSG(result.moe_lb == 0 || result.moe_lb >= 1, "moe_lb is at least 1 (0: no window ended)");
  TROUPE_ASSERT(result.num_expert_moves >= 0);
  if (result.moe_lb > 0) {
    experts_.num_windows++;
    experts_.moe_lb_last_window = result.moe_lb;
  }
  experts_.num_moves += result.num_expert_moves;
}

effects engine_policy::executor_failed(int64_t generation, const std::string& why, int64_t now_ns) {
  effects out;
  if (generation != generation_) return out;  // a replaced executor: handled already
  generation_++;
  num_executor_failures_++;
  std::vector<engine_core::resumable_request> resumable = core_->resumable_requests();
  auto core = engine_core::create(options_.model, options_.end_ids, options_.config);
  TROUPE_ASSERT_MSG(core.has_value(), "the options made a core before");
  core_ = std::move(*core);
  if (reporting_) reporting_->snapshot_due = true;  // the balancer knows the old pool's hashes
  out.push_back(restart_executor{});
  for (const request_id id : exporting_) out.push_back(forward{id, false, std::nullopt});  // their KV is gone
  num_forwarded_ += static_cast<int64_t>(exporting_.size());
  exporting_.clear();
  std::set<request_id> resumed;
  for (auto& [r, prefill_only] : resumable) {
    live_request& live = requests_.at(r.id);
    const request_id id = r.id;
    if (live.num_resumes >= executor_failure_resumes_max) continue;
    // It passed these checks on the first core; the same configuration admits it again.
    const bool added = (prefill_only ? core_->add_prefill(std::move(r)) : core_->add_request(std::move(r))).has_value();
    TROUPE_ASSERT_MSG(added, "a resumed request fits its new core");
    live.num_resumes++;
    num_resumed_requests_++;
    resumed.insert(id);
  }
  for (auto it = requests_.begin(); it != requests_.end();) {
    if (resumed.count(it->first)) {
      ++it;
      continue;
    }
    out.push_back(reject{it->first, errc::internal, why, false});
    handoffs_.erase(it->first);
    it = requests_.erase(it);
  }
  kick(out, now_ns);
  note_change(out, now_ns);
  return out;
}

void engine_policy::drop(request_id id, effects& out, int64_t now_ns) {
  tier_waits_.erase(id);
  exporting_.erase(id);
  (void)core_->remove_request(id);
  requests_.erase(id);
  handoffs_.erase(id);
  kick(out, now_ns);
  note_change(out, now_ns);
}

effects engine_policy::drain(int64_t now_ns) {
  effects out;
  if (draining_) return out;
  draining_ = true;
  if (reporting_) send_report(out, now_ns);  // the balancer stops placing here at once
  return out;
}

effects engine_policy::forward_all(int64_t now_ns) {
  effects out = drain(now_ns);
  forwarding_ = true;
  std::set<request_id> ids;
  for (const auto& [id, live] : requests_) ids.insert(id);
  for (const auto& [id, wait] : tier_waits_) ids.insert(id);
  for (const request_id id : ids) {
    // Its KV goes along if it has any: the forward waits for the step that reads it out.
    const engine_config& c = options_.config;
    if (c.drain_with_kv && c.kv_values && !handoffs_.count(id) && core_->export_request(id)) {
      requests_.erase(id);
      exporting_.insert(id);
      continue;
    }
    out.push_back(forward{id, false, std::nullopt});
    num_forwarded_++;
    drop(id, out, now_ns);
  }
  kick(out, now_ns);
  note_change(out, now_ns);
  return out;
}

void engine_policy::forward_exported(effects& out) {
  for (exported_request& e : core_->take_exported()) {
    if (!exporting_.erase(e.id)) continue;  // released meanwhile
    num_forwarded_++;
    num_forwarded_with_kv_++;
    num_forwarded_kv_tokens_ += e.kv.num_tokens;
    out.push_back(forward{e.id, false, std::move(e.kv)});
  }
}

effects engine_policy::release(request_id id, int64_t now_ns) {
  effects out;
  drop(id, out, now_ns);
  return out;
}

effects engine_policy::peer_down(request_id id, int64_t now_ns) {
  effects out;
  if (requests_.count(id) || tier_waits_.count(id) || exporting_.count(id)) drop(id, out, now_ns);
  return out;
}

engine_report engine_policy::report(int64_t now_ns) const {
  const engine_stats core = core_->stats();
  engine_report r;
  static_cast<engine_counters&>(r) = core;
  r.num_executor_failures = num_executor_failures_;
  r.num_resumed_requests = num_resumed_requests_;
  r.num_waiting = num_queued();
  r.num_requests = static_cast<int64_t>(requests_.size());
  r.executor_busy_ns = executor_busy_ns_;
  r.elapsed_ns = now_ns - started_ns_;
  r.num_timed_steps = core.step_time_error.num_steps;
  r.step_time_error_raw = core.step_time_error.raw_mean();
  r.step_time_error_corrected = core.step_time_error.corrected_mean();
  r.num_handoffs_recomputed = num_handoffs_recomputed();
  r.num_handoffs_timed = num_handoffs_timed_;
  r.handoff_ns = handoff_ns_;
  r.handoff_bytes = handoff_bytes_;
  r.moe_lb_last_window = experts_.moe_lb_last_window;
  r.num_moe_windows = experts_.num_windows;
  r.num_expert_moves = experts_.num_moves;
  return r;
}

}  // namespace troupe::engine
