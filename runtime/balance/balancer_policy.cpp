#include "runtime/balance/balancer_policy.hpp"

#include <algorithm>
#include <utility>

namespace troupe::balance {

balancer_policy::balancer_policy(std::vector<engine_spec> engines, std::vector<int32_t> tier_bounds,
                             int64_t heartbeat_timeout_ns, int64_t now_ns, const router_options& routing,
                             std::vector<cache_tier_spec> cache_tiers)
    : bounds_(std::move(tier_bounds)) {
  TROUPE_ASSERT(!engines.empty() && heartbeat_timeout_ns >= 0);
  auto r = make_router(routing, engines.size(), !cache_tiers.empty());
  TROUPE_ASSERT_MSG(r.has_value(), "router policies are validated where they are read");
  router_ = std::move(*r);
  int32_t num_prefill = 0;
  for (engine_spec& spec : engines) {
    engine_entry e;
    e.load.kind = spec.kind;
    e.load.max_num_seqs = spec.max_num_seqs;
    e.load.kv_capacity_tokens = spec.kv_capacity_tokens;
    if (spec.kind == engine_kind::prefill) num_prefill++;
    TROUPE_ASSERT(spec.cache_tier >= -1 && spec.cache_tier < static_cast<int64_t>(cache_tiers.size()));
    e.spec = std::move(spec);
    engines_.push_back(std::move(e));
  }
  for (const cache_tier_spec& t : cache_tiers) {
    TROUPE_ASSERT(t.capacity_blocks >= 0 && t.block_size >= 1);
    cache_tiers_.push_back(cache_tier_entry{t, true});
  }
  tiers_ = assign_tiers(num_prefill, static_cast<int32_t>(bounds_.size()) + 1);
  if (router_->uses_prefixes()) {
    prefix_block_size_ = engines_.front().spec.block_size;
    for (const engine_entry& e : engines_) prefix_block_size_ = std::min(prefix_block_size_, e.spec.block_size);
    TROUPE_ASSERT(prefix_block_size_ >= 1);
    std::vector<int64_t> capacity_blocks;
    for (const engine_entry& e : engines_) capacity_blocks.push_back(e.spec.kv_capacity_tokens / prefix_block_size_);
    std::vector<int64_t> tier_capacity_blocks, lower_capacity_blocks;  // a tier of another block size never reports: 0
    for (const cache_tier_entry& t : cache_tiers_) {
      const bool reports = t.spec.block_size == prefix_block_size_;
      tier_capacity_blocks.push_back(reports ? t.spec.capacity_blocks : 0);
      lower_capacity_blocks.push_back(reports ? t.spec.lower_capacity_blocks : 0);
    }
    prefixes_.emplace(std::move(capacity_blocks), std::move(tier_capacity_blocks), std::move(lower_capacity_blocks));
  }
  if (heartbeat_timeout_ns > 0) liveness_.emplace(engines_.size(), heartbeat_timeout_ns, now_ns);
}

/// Recomputes an engine's token estimates: the last report plus what it has not seen.
void balancer_policy::refresh(engine_entry& e) {
  while (!e.unseen.empty() && e.unseen.front().number <= e.report.num_received) {
    e.unseen_kv_tokens -= e.unseen.front().kv_tokens;
    e.unseen_prefill_tokens -= e.unseen.front().prefill_tokens;
    e.unseen.pop_front();
  }
  e.load.num_kv_tokens = e.report.num_kv_tokens + e.unseen_kv_tokens;
  e.load.num_prefill_tokens = e.report.num_queued_prefill_tokens + e.unseen_prefill_tokens;
}

void balancer_policy::charge(engine_entry& e, int64_t kv_tokens, int64_t prefill_tokens) {
  e.unseen.push_back(unseen_work{++e.num_sent, kv_tokens, prefill_tokens});
  e.unseen_kv_tokens += kv_tokens;
  e.unseen_prefill_tokens += prefill_tokens;
  refresh(e);
}

expected<placement> balancer_policy::place(request_key key, int32_t num_prompt_tokens,
                                         const std::vector<uint64_t>& prefix_hashes) {
  const size_t num_blocks = prefix_block_size_ > 0 ? static_cast<size_t>(num_prompt_tokens / prefix_block_size_) : 0;
  if (prefix_hashes.size() != num_blocks)
    return fail(errc::invalid_argument, std::to_string(prefix_hashes.size()) + " prefix hashes for a prompt of " +
                                            std::to_string(num_prompt_tokens) + " tokens (expected " +
                                            std::to_string(num_blocks) + ")");
  std::vector<engine_load> loads;
  for (const engine_entry& e : engines_) loads.push_back(e.load);
  const candidates c = candidates_for(loads, tiers_, tier_of(num_prompt_tokens, bounds_), num_prompt_tokens);
  if (c.decode.empty()) {
    std::string why = "no live engine can serve the request";
    for (const engine_entry& e : engines_)
      if (!e.load.alive)
        why += "; " + e.spec.name + " is lost";
      else if (e.load.draining)
        why += "; " + e.spec.name + " is draining";
    return fail(errc::unavailable, std::move(why));
  }
  request_ended(key);  // placed again (its engine was lost): the first placement ends
  route_request r{num_routed_++, num_prompt_tokens, {}};
  std::vector<int64_t> pool_blocks, tier_blocks;  // each engine's pool's prefix, each tier's
  std::optional<size_t> best_tier;                // the tier with the longest (ties: the lowest)
  if (prefixes_) {
    for (size_t t = 0; t < cache_tiers_.size(); t++) {
      tier_blocks.push_back(prefixes_->tier_cached_blocks(t, prefix_hashes));
      if (tier_blocks[t] > 0 && (!best_tier || tier_blocks[t] > tier_blocks[*best_tier])) best_tier = t;
    }
    const int64_t best_tier_blocks = best_tier ? tier_blocks[*best_tier] : 0;
    for (size_t i = 0; i < engines_.size(); i++) {
      pool_blocks.push_back(prefixes_->cached_blocks(i, prefix_hashes));
      r.cached_tokens.push_back(std::max(pool_blocks[i], best_tier_blocks) * prefix_block_size_);
    }
  }
  placement chosen = router_->choose(loads, c, r);
  engine_entry& d = engines_[chosen.decode];
  d.load.num_requests++;
  routed_[key] = routed_request{chosen.decode, chosen.prefill};
  const int64_t tokens = num_prompt_tokens;
  if (chosen.prefill) {
    charge(engines_[*chosen.prefill], 0, tokens - 1);
    charge(d, tokens, 0);
  } else {
    charge(d, tokens, tokens);
  }
  const size_t computes = chosen.prefill.value_or(chosen.decode);
  if (prefixes_) prefixes_->record(computes, prefix_hashes, engines_[computes].num_sent);
  if (best_tier && tier_blocks[*best_tier] > pool_blocks[computes]) {
    const int32_t own = engines_[computes].spec.cache_tier;  // asked anyway: named only if another has more
    if (own < 0 || tier_blocks[static_cast<size_t>(own)] < tier_blocks[*best_tier]) chosen.cache_tier = best_tier;
  }
  return chosen;
}

bool balancer_policy::request_ended(request_key key) {
  auto it = routed_.find(key);
  if (it == routed_.end()) return false;
  engines_[it->second.decode].load.num_requests--;
  routed_.erase(it);
  return true;
}

report_outcome balancer_policy::on_report(int32_t engine, const load_report& r, int64_t now_ns,
                                        const pool_events& cache) {
  if (engine < 0 || static_cast<size_t>(engine) >= engines_.size()) return report_outcome::ignored;
  const auto i = static_cast<size_t>(engine);
  if (r.num_received < 0 || r.num_requests < 0 || r.num_kv_tokens < 0 || r.num_queued_prefill_tokens < 0)
    return report_outcome::ignored;
  const bool has_cache = cache.seq > 0 && wants_cache_events(i);
  if (has_cache && !events_fit(prefixes_->capacity_blocks(i), cache)) return report_outcome::ignored;
  engine_entry& e = engines_[i];
  if (liveness_) liveness_->heard_from(i, now_ns);
  if (r.draining) e.load.draining = true;
  // Reordered: keep the newer (its cache events, skipped, leave a gap the next report shows).
  if (r.num_received < e.report.num_received) return report_outcome::taken;
  e.report = r;
  refresh(e);
  if (!has_cache || !e.load.alive) return report_outcome::taken;
  const pool_sync sync = prefixes_->apply(i, cache);
  prefixes_->covered(i, r.num_received);
  return sync == pool_sync::ask_snapshot ? report_outcome::resync : report_outcome::taken;
}

report_outcome balancer_policy::on_tier_report(int32_t tier, const pool_events& cache, bool lower) {
  if (tier < 0 || static_cast<size_t>(tier) >= cache_tiers_.size()) return report_outcome::ignored;
  const auto t = static_cast<size_t>(tier);
  if (!cache_tiers_[t].alive || !wants_tier_events(t) || cache.seq == 0 ||
      !events_fit(prefixes_->tier_capacity_blocks(t, lower), cache))
    return report_outcome::ignored;
  return prefixes_->apply_tier(t, cache, lower) == pool_sync::ask_snapshot ? report_outcome::resync
                                                                           : report_outcome::taken;
}

bool balancer_policy::wants_tier_events(size_t tier) const {
  return prefixes_.has_value() && cache_tiers_.at(tier).spec.block_size == prefix_block_size_;
}

bool balancer_policy::cache_tier_lost(size_t tier) {
  cache_tier_entry& t = cache_tiers_.at(tier);
  if (!t.alive) return false;
  t.alive = false;
  if (prefixes_) prefixes_->forget_tier(tier);
  return true;
}

bool balancer_policy::events_fit(int64_t capacity, const pool_events& r) {
  return static_cast<int64_t>(r.added.size()) <= capacity && static_cast<int64_t>(r.removed.size()) <= capacity &&
         (!r.snapshot || r.removed.empty());
}

bool balancer_policy::wants_cache_events(size_t engine) const {
  return prefixes_.has_value() && engines_.at(engine).spec.block_size == prefix_block_size_;
}

void balancer_policy::mark_draining(size_t engine) { engines_.at(engine).load.draining = true; }

void balancer_policy::heard_from(size_t engine, int64_t now_ns) {
  if (liveness_) liveness_->heard_from(engine, now_ns);
}

std::vector<size_t> balancer_policy::heartbeat(int64_t now_ns) {
  if (!liveness_) return {};
  std::vector<size_t> lost = liveness_->newly_lost(now_ns);
  for (size_t i : lost) {
    engines_[i].load.alive = false;
    if (prefixes_) prefixes_->forget(i);
  }
  return lost;
}

bool balancer_policy::mark_lost(size_t engine) {
  engine_entry& e = engines_.at(engine);
  if (!e.load.alive) return false;
  e.load.alive = false;
  if (liveness_) liveness_->mark_lost(engine);
  if (prefixes_) prefixes_->forget(engine);
  return true;
}

bool balancer_policy::rejoined(size_t engine, int64_t now_ns) {
  engine_entry& e = engines_.at(engine);
  if (e.load.alive) return false;
  e.load.alive = true;
  e.load.draining = false;
  e.report = load_report{};
  e.num_sent = 0;
  e.unseen.clear();
  e.unseen_kv_tokens = 0;
  e.unseen_prefill_tokens = 0;
  refresh(e);
  if (liveness_) liveness_->rejoined(engine, now_ns);
  return true;
}

bool balancer_policy::placed_on(request_key key, size_t engine) const {
  auto it = routed_.find(key);
  return it != routed_.end() && (it->second.decode == engine || it->second.prefill == engine);
}

void balancer_policy::check_invariants() const {
  std::vector<int64_t> requests(engines_.size(), 0);
  for (const auto& [key, r] : routed_) requests.at(r.decode)++;
  for (size_t i = 0; i < engines_.size(); i++) {
    const engine_entry& e = engines_[i];
    TROUPE_ASSERT(e.load.num_requests == requests[i]);
    int64_t kv = 0, prefill = 0;
    for (const unseen_work& u : e.unseen) {
      TROUPE_ASSERT(u.number > e.report.num_received && u.number <= e.num_sent);
      kv += u.kv_tokens;
      prefill += u.prefill_tokens;
    }
    TROUPE_ASSERT(kv == e.unseen_kv_tokens && prefill == e.unseen_prefill_tokens);
    if (liveness_) TROUPE_ASSERT(e.load.alive != liveness_->is_lost(i));
  }
  if (liveness_) liveness_->check_invariants();
  TROUPE_ASSERT(prefixes_.has_value() == (prefix_block_size_ > 0));
  if (prefixes_) {
    TROUPE_ASSERT(prefixes_->num_engines() == engines_.size());
    TROUPE_ASSERT(prefixes_->num_tiers() == cache_tiers_.size());
    for (size_t t = 0; t < cache_tiers_.size(); t++)
      if (!cache_tiers_[t].alive || !wants_tier_events(t))
        TROUPE_ASSERT(prefixes_->num_tier_blocks(t) == 0 && prefixes_->num_tier_blocks(t, true) == 0);
    for (size_t i = 0; i < engines_.size(); i++)
      if (!engines_[i].load.alive)
        TROUPE_ASSERT(prefixes_->num_placed_blocks(i) == 0 && prefixes_->num_pool_blocks(i) == 0);
    prefixes_->check_invariants();
  }
}

}  // namespace troupe::balance
