#include "runtime/balance/prefix_directory.hpp"

#include <limits>

#include "runtime/common/error.hpp"

namespace troupe::balance {

prefix_directory::prefix_directory(std::vector<int64_t> capacity_blocks, std::vector<int64_t> tier_capacity_blocks,
                                   std::vector<int64_t> lower_capacity_blocks) {
  TROUPE_ASSERT(lower_capacity_blocks.empty() || lower_capacity_blocks.size() == tier_capacity_blocks.size());
  lower_capacity_blocks.resize(tier_capacity_blocks.size(), 0);
  for (int64_t capacity : capacity_blocks) {
    TROUPE_ASSERT(capacity >= 0);
    engines_.emplace_back().capacity_blocks = capacity;
  }
  for (size_t t = 0; t < tier_capacity_blocks.size(); t++) {
    TROUPE_ASSERT(tier_capacity_blocks[t] >= 0 && lower_capacity_blocks[t] >= 0);
    tiers_.emplace_back().capacity_blocks = tier_capacity_blocks[t];
    lower_tiers_.emplace_back().capacity_blocks = lower_capacity_blocks[t];
  }
}

int64_t prefix_directory::cached_blocks(size_t engine, const std::vector<uint64_t>& chain) const {
  return held_prefix(engines_.at(engine), chain);
}

int64_t prefix_directory::tier_cached_blocks(size_t tier, const std::vector<uint64_t>& chain) const {
  const engine_set& host = tiers_.at(tier);
  const engine_set& lower = lower_tiers_.at(tier);
  int64_t found = 0;
  for (uint64_t hash : chain) {
    if (host.pool.count(hash) == 0 && lower.pool.count(hash) == 0) break;
    found++;
  }
  return found;
}

int64_t prefix_directory::held_prefix(const engine_set& e, const std::vector<uint64_t>& chain) {
  int64_t found = 0;
  for (uint64_t hash : chain) {
    if (e.pool.count(hash) == 0 && e.where.count(hash) == 0) break;
    found++;
  }
  return found;
}

void prefix_directory::record(size_t engine, const std::vector<uint64_t>& chain, int64_t work_item) {
  engine_set& e = engines_.at(engine);
  TROUPE_ASSERT(e.by_recency.empty() || work_item >= e.by_recency.front().work_item);
  for (auto hash = chain.rbegin(); hash != chain.rend(); ++hash) {
    if (auto it = e.where.find(*hash); it != e.where.end()) {
      e.by_recency.splice(e.by_recency.begin(), e.by_recency, it->second);
      e.by_recency.front().work_item = work_item;
    } else {
      e.by_recency.push_front(placed_block{*hash, work_item});
      e.where.emplace(*hash, e.by_recency.begin());
    }
  }
  while (static_cast<int64_t>(e.by_recency.size()) > e.capacity_blocks) drop_oldest_placed(e);
}

void prefix_directory::covered(size_t engine, int64_t num_received) {
  engine_set& e = engines_.at(engine);
  if (!e.in_sync) return;
  while (!e.by_recency.empty() && e.by_recency.back().work_item <= num_received) drop_oldest_placed(e);
}

void prefix_directory::drop_oldest_placed(engine_set& e) {
  e.where.erase(e.by_recency.back().hash);
  e.by_recency.pop_back();
}

pool_sync prefix_directory::lose_sync(engine_set& e) {
  e.pool.clear();
  e.in_sync = false;
  e.seq = 0;
  if (e.snapshot_asked) return pool_sync::awaiting_snapshot;
  e.snapshot_asked = true;
  return pool_sync::ask_snapshot;
}

pool_sync prefix_directory::apply(size_t engine, const pool_events& events) {
  return apply_to(engines_.at(engine), events);
}

pool_sync prefix_directory::apply_tier(size_t tier, const pool_events& events, bool lower) {
  return apply_to(lower ? lower_tiers_.at(tier) : tiers_.at(tier), events);
}

pool_sync prefix_directory::apply_to(engine_set& e, const pool_events& events) {
  TROUPE_ASSERT(events.seq > 0);
  TROUPE_ASSERT(static_cast<int64_t>(events.added.size()) <= e.capacity_blocks);
  TROUPE_ASSERT(static_cast<int64_t>(events.removed.size()) <= e.capacity_blocks);
  if (events.snapshot) {
    e.pool.clear();
    e.pool.insert(events.added.begin(), events.added.end());
    if (!events.removed.empty() || e.pool.size() != events.added.size()) return lose_sync(e);  // ill-formed
    e.in_sync = true;
    e.snapshot_asked = false;
    e.seq = events.seq;
    return pool_sync::in_sync;
  }
  if (!e.in_sync || events.seq != e.seq + 1) return lose_sync(e);  // a report went missing
  for (uint64_t hash : events.removed)
    if (e.pool.erase(hash) == 0) return lose_sync(e);
  for (uint64_t hash : events.added)
    if (!e.pool.insert(hash).second) return lose_sync(e);
  if (static_cast<int64_t>(e.pool.size()) > e.capacity_blocks) return lose_sync(e);
  e.seq = events.seq;
  return pool_sync::in_sync;
}

void prefix_directory::forget(size_t engine) { clear(engines_.at(engine)); }

void prefix_directory::forget_tier(size_t tier) {
  clear(tiers_.at(tier));
  clear(lower_tiers_.at(tier));
}

void prefix_directory::clear(engine_set& e) {
  e.by_recency.clear();
  e.where.clear();
  e.pool.clear();
  e.in_sync = false;
  e.snapshot_asked = false;
  e.seq = 0;
}

int64_t prefix_directory::num_placed_blocks(size_t engine) const {
  return static_cast<int64_t>(engines_.at(engine).by_recency.size());
}

int64_t prefix_directory::num_pool_blocks(size_t engine) const {
  return static_cast<int64_t>(engines_.at(engine).pool.size());
}

std::vector<uint64_t> prefix_directory::blocks_by_recency(size_t engine) const {
  std::vector<uint64_t> out;
  for (const placed_block& b : engines_.at(engine).by_recency) out.push_back(b.hash);
  return out;
}

void prefix_directory::check_invariants() const {
  for (const engine_set& e : engines_) check_set(e);
  TROUPE_ASSERT(lower_tiers_.size() == tiers_.size());
  for (const std::vector<engine_set>* levels : {&tiers_, &lower_tiers_})
    for (const engine_set& t : *levels) {
      check_set(t);
      TROUPE_ASSERT_MSG(t.by_recency.empty(), "a prompt placed on a tier");
    }
}

void prefix_directory::check_set(const engine_set& e) {
  TROUPE_ASSERT(e.capacity_blocks >= 0);
  TROUPE_ASSERT(static_cast<int64_t>(e.by_recency.size()) <= e.capacity_blocks);
  TROUPE_ASSERT(static_cast<int64_t>(e.pool.size()) <= e.capacity_blocks);
  TROUPE_ASSERT(e.in_sync || (e.pool.empty() && e.seq == 0));
  TROUPE_ASSERT(!(e.in_sync && e.snapshot_asked));
  TROUPE_ASSERT(e.where.size() == e.by_recency.size());
  int64_t newer = std::numeric_limits<int64_t>::max();  // placements' numbers never rise towards the back
  for (auto it = e.by_recency.begin(); it != e.by_recency.end(); ++it) {
    TROUPE_ASSERT(it->work_item <= newer);
    newer = it->work_item;
    auto entry = e.where.find(it->hash);
    TROUPE_ASSERT(entry != e.where.end());
    TROUPE_ASSERT(entry->second == it);
  }
}

}  // namespace troupe::balance
