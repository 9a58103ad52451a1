#pragma once

/// A cache's membership log (issue 14, the balancer's prefix directory): every chain hash
/// entering or leaving a cache (an engine's pool, a cache tier) is logged; `take` returns the
/// net change since the last take — a hash added and removed in between appears in neither
/// list — so a consumer that applies each take to its copy of the cache's hashes holds exactly
/// what the cache holds. The log is bounded: past `max_events` events (a snapshot is no larger
/// than half of that) it is dropped and the take says `overflowed`; the consumer then starts
/// over from the cache's full list.
///
/// Deterministic: the net change is computed over an ordered map; both lists ascend.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace troupe::kv {

/// The net change since the last take: hashes held now that were not, and hashes held then that
/// are not now (disjoint, each ascending). `overflowed`: the log outgrew its bound and was
/// dropped; both lists are empty and only the cache's full list tells.
struct cache_events {
  std::vector<uint64_t> added;
  std::vector<uint64_t> removed;
  bool overflowed = false;
};

class cache_event_log {
 public:
  explicit cache_event_log(size_t max_events) : max_events_(max_events) {}

  /// `hash` entered the cache (`held`) or left it. A hash's events alternate (a cache holds a
  /// hash at most once): checked by check_invariants.
  void log(uint64_t hash, bool held);
  /// Changes the bound (a cache whose size is not fixed: kv::lru_ttl); it applies from the
  /// next event on.
  void set_max_events(size_t max_events) { max_events_ = max_events; }
  /// The net change since the last take; the log starts empty again.
  [[nodiscard]] cache_events take();

  /// Aborts unless the log is within its bound (empty once dropped), each hash's events
  /// alternate, and each hash's last event agrees with `holds(hash)`.
  void check_invariants(const std::function<bool(uint64_t)>& holds) const;

 private:
  friend struct cache_event_log_tamper;  // tests corrupt the log
  struct event {
    uint64_t hash = 0;
    bool held = false;
  };
  size_t max_events_;
  std::vector<event> log_;  // since the last take, at most max_events_
  bool overflowed_ = false;  // dropped since the last take: nothing more is logged
};

}  // namespace troupe::kv
