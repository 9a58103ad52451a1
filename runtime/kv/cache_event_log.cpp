#include "runtime/kv/cache_event_log.hpp"

#include <map>
#include <utility>

#include "runtime/common/error.hpp"

namespace troupe::kv {

void cache_event_log::log(uint64_t hash, bool held) {
  if (overflowed_) return;
  if (log_.size() >= max_events_) {
    overflowed_ = true;
    log_.clear();
    return;
  }
  log_.push_back(event{hash, held});
}

cache_events cache_event_log::take() {
  cache_events out;
  out.overflowed = overflowed_;
  // Per hash its first and last event: the events of one hash alternate, so it was held before
  // the first if that one removed it, and is held after the last if that one added it.
  std::map<uint64_t, std::pair<bool, bool>> first_last;  // hash -> (first held, last held)
  for (const event& e : log_) {
    auto [it, fresh] = first_last.try_emplace(e.hash, e.held, e.held);
    if (!fresh) it->second.second = e.held;
  }
  for (const auto& [hash, events] : first_last) {
    const bool before = !events.first, after = events.second;
    if (before == after) continue;
    (after ? out.added : out.removed).push_back(hash);
  }
  log_.clear();
  overflowed_ = false;
  return out;
}

void cache_event_log::check_invariants(const std::function<bool(uint64_t)>& holds) const {
  TROUPE_ASSERT(!overflowed_ || log_.empty());
  std::map<uint64_t, bool> last;  // hash -> its last event added it
  for (const event& e : log_) {
    auto [it, fresh] = last.try_emplace(e.hash, e.held);
    if (fresh) continue;
    TROUPE_ASSERT_MSG(it->second != e.held, "a hash's cache events do not alternate");
    it->second = e.held;
  }
  for (const auto& [hash, held] : last) TROUPE_ASSERT_MSG(held == holds(hash), "the cache log disagrees with the cache");
}

}  // namespace troupe::kv
