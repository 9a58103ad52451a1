#pragma once

/// The recency and expiry orders of a cache tier's blocks (issue 14), shared by the host tier's
/// store (kv/tier_store.hpp) and the disk tier (actors/edge/disk_tier.hpp) so that both evict alike.
/// It holds no blocks, only their names (chain hashes) and lifetimes; the tier owns the data.
///
/// Rule. Each block has the class (kv/cache_class.hpp) and time of its last use; it is alive
/// while now < last use + ttl(class) and expired from then on. A use moves it to the most
/// recent end and restarts its lifetime with the class of that use. A tier that needs room
/// drops `first_expired` blocks, then `least_recent` ones.
///
/// Events. Every hash it starts or stops holding is logged (kv::cache_event_log, bounded by
/// 2 × (the blocks held + 8) events, so a log nobody takes stays small): `take_events` is the
/// net change since the last take — what a tier reports to the balancer's prefix directory.
///
/// Time. Every call that needs it takes `now_ns` from the caller; it never goes backwards
/// (assert). Determinism: ordered containers only; recency is a counter, so no ties; expiry
/// ties break by hash.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/kv/cache_class.hpp"
#include "runtime/kv/cache_event_log.hpp"

namespace troupe::kv {

inline constexpr int64_t day_ns = int64_t{24} * 3600 * 1000 * 1000 * 1000;

class lru_ttl {
 public:
  /// errc::invalid_argument naming the field unless both TTLs are > 0.
  [[nodiscard]] static expected<void> check_ttls(int64_t chat_ttl_ns, int64_t agent_ttl_ns);

  /// Both TTLs > 0 (asserted: check them with check_ttls where they come in).
  lru_ttl(int64_t chat_ttl_ns, int64_t agent_ttl_ns);

  /// Asserts that time does not go backwards and remembers `now_ns` as the latest seen.
  void advance_clock(int64_t now_ns);

  /// Files `hash` — new, or held — as the most recent use, alive for ttl(cls) from `now_ns`.
  void use(uint64_t hash, cache_class cls, int64_t now_ns);
  /// Forgets `hash` (held: asserted).
  void remove(uint64_t hash);

  [[nodiscard]] bool contains(uint64_t hash) const { return lives_.count(hash) != 0; }
  /// Whether `hash` is held and not expired at `now_ns`.
  [[nodiscard]] bool is_alive(uint64_t hash, int64_t now_ns) const;
  /// The class of `hash`'s last use (held: asserted).
  [[nodiscard]] cache_class class_of(uint64_t hash) const;
  /// The least recently used block, if any.
  [[nodiscard]] std::optional<uint64_t> least_recent() const;
  /// The block that expired first, if one has expired at `now_ns`.
  [[nodiscard]] std::optional<uint64_t> first_expired(int64_t now_ns) const;
  /// The hashes it started and stopped holding since the last take.
  [[nodiscard]] cache_events take_events() { return events_.take(); }
  /// Held blocks' hashes, ascending.
  [[nodiscard]] std::vector<uint64_t> hashes() const;
  /// Held blocks, least recently used first (O(size), for tests and debugging).
  [[nodiscard]] std::vector<uint64_t> lru_order() const;
  [[nodiscard]] int64_t size() const { return static_cast<int64_t>(lives_.size()); }
  [[nodiscard]] int64_t ttl_ns(cache_class cls) const;
  /// The latest time seen.
  [[nodiscard]] int64_t now_ns() const { return now_ns_; }

  /// Aborts unless the lifetimes, the recency order and the expiry order hold the same blocks,
  /// each expiry is last use + its class's TTL and no last use is past the latest time seen.
  void check_invariants() const;

 private:
  struct life {
    cache_class cls = cache_class::chat;
    int64_t last_use_ns = 0;
    int64_t expiry_ns = 0;
    uint64_t recency = 0;  ///< key in recency_; larger = more recent
  };

  int64_t chat_ttl_ns_;
  int64_t agent_ttl_ns_;
  std::map<uint64_t, life> lives_;                   // chain hash -> its last use
  std::map<uint64_t, uint64_t> recency_;             // recency -> hash; begin() = least recent
  std::set<std::pair<int64_t, uint64_t>> expiries_;  // (expiry_ns, hash); begin() = first to expire
  uint64_t next_recency_ = 0;
  cache_event_log events_{16};  // hashes in and out since take_events
  int64_t now_ns_ = 0;  // the latest time seen
};

}  // namespace troupe::kv
