#include "runtime/kv/lru_ttl.hpp"

#include <string>

namespace troupe::kv {

expected<void> lru_ttl::check_ttls(int64_t chat_ttl_ns, int64_t agent_ttl_ns) {
  if (chat_ttl_ns <= 0)
    return fail(errc::invalid_argument, "chat_ttl_ns must be > 0, got " + std::to_string(chat_ttl_ns));
  if (agent_ttl_ns <= 0)
    return fail(errc::invalid_argument, "agent_ttl_ns must be > 0, got " + std::to_string(agent_ttl_ns));
  return {};
}

lru_ttl::lru_ttl(int64_t chat_ttl_ns, int64_t agent_ttl_ns) : chat_ttl_ns_(chat_ttl_ns), agent_ttl_ns_(agent_ttl_ns) {
  TROUPE_ASSERT(chat_ttl_ns > 0);
  TROUPE_ASSERT(agent_ttl_ns > 0);
}

int64_t lru_ttl::ttl_ns(cache_class cls) const { return cls == cache_class::agent ? agent_ttl_ns_ : chat_ttl_ns_; }

void lru_ttl::advance_clock(int64_t now_ns) {
  TROUPE_ASSERT_MSG(now_ns >= now_ns_, "the tier's clock went backwards");
  now_ns_ = now_ns;
}

void lru_ttl::use(uint64_t hash, cache_class cls, int64_t now_ns) {
  advance_clock(now_ns);
  const auto [it, is_new] = lives_.try_emplace(hash);
  life& l = it->second;
  if (!is_new) {
    recency_.erase(l.recency);
    expiries_.erase({l.expiry_ns, hash});
  } else {
    events_.set_max_events(2 * (lives_.size() + 8));
    events_.log(hash, true);
  }
  l.cls = cls;
  l.last_use_ns = now_ns;
  l.expiry_ns = now_ns + ttl_ns(cls);
  l.recency = next_recency_++;
  recency_.emplace(l.recency, hash);
  expiries_.emplace(l.expiry_ns, hash);
}

void lru_ttl::remove(uint64_t hash) {
  const auto it = lives_.find(hash);
  TROUPE_ASSERT_MSG(it != lives_.end(), "removing a block the tier does not hold");
  events_.set_max_events(2 * (lives_.size() + 8));  // the blocks held with this one
  events_.log(hash, false);
  recency_.erase(it->second.recency);
  expiries_.erase({it->second.expiry_ns, hash});
  lives_.erase(it);
}

std::vector<uint64_t> lru_ttl::hashes() const {
  std::vector<uint64_t> out;
  out.reserve(lives_.size());
  for (const auto& [hash, l] : lives_) out.push_back(hash);
  return out;
}

bool lru_ttl::is_alive(uint64_t hash, int64_t now_ns) const {
  const auto it = lives_.find(hash);
  return it != lives_.end() && it->second.expiry_ns > now_ns;
}

cache_class lru_ttl::class_of(uint64_t hash) const {
  const auto it = lives_.find(hash);
  TROUPE_ASSERT(it != lives_.end());
  return it->second.cls;
}

std::optional<uint64_t> lru_ttl::least_recent() const {
  if (recency_.empty()) return std::nullopt;
  return recency_.begin()->second;
}

std::optional<uint64_t> lru_ttl::first_expired(int64_t now_ns) const {
  if (expiries_.empty() || expiries_.begin()->first > now_ns) return std::nullopt;
  return expiries_.begin()->second;
}

std::vector<uint64_t> lru_ttl::lru_order() const {
  std::vector<uint64_t> order;
  order.reserve(recency_.size());
  for (const auto& [recency, hash] : recency_) order.push_back(hash);
  return order;
}

void lru_ttl::check_invariants() const {
  TROUPE_ASSERT(recency_.size() == lives_.size());
  TROUPE_ASSERT(expiries_.size() == lives_.size());
  for (const auto& [hash, l] : lives_) {
    TROUPE_ASSERT_MSG(l.expiry_ns == l.last_use_ns + ttl_ns(l.cls), "an expiry is not last use + TTL");
    TROUPE_ASSERT(l.last_use_ns <= now_ns_);
    TROUPE_ASSERT(l.recency < next_recency_);
    const auto r = recency_.find(l.recency);
    TROUPE_ASSERT_MSG(r != recency_.end() && r->second == hash, "the recency order lost a block");
    TROUPE_ASSERT_MSG(expiries_.count({l.expiry_ns, hash}) == 1, "the expiry order lost a block");
  }
  events_.check_invariants([this](uint64_t hash) { return contains(hash); });
}

}  // namespace troupe::kv
